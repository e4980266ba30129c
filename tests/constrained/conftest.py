"""Fixtures for the grammar engine: the default model's real tokenizer, one compiler service for
the session, a byte-level toy compiler (fast, for measuring what xgrammar enforces), and a
constrained random walk (random logits, mask applied, sample, accept) as the generator."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from radixrt.constrained import (
    GrammarCompilerService,
    GrammarSpec,
    RequestMatcher,
    allocate_bitmask,
    apply_token_bitmask,
    build_tokenizer_info,
)

MAX_WALK_STEPS = 400


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Small CPU ops on a [1, 49152] row are ~1000x slower with torch's intra-op threads on a busy
    2-core machine (thread hand-off dominates); run these tests single-threaded, then restore."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="session")
def model_vocab_size(model_dir: Path) -> int:
    import json

    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


@pytest.fixture(scope="session")
def service(tokenizer: Any, model_vocab_size: int) -> Iterator[GrammarCompilerService]:
    info = build_tokenizer_info(tokenizer, vocab_size=model_vocab_size,
                                stop_token_ids=[tokenizer.eos_token_id])
    svc = GrammarCompilerService(info, num_threads=2)
    yield svc
    svc.shutdown()


@pytest.fixture(scope="session")
def byte_compiler() -> Any:
    """An xgrammar compiler over a 257-token vocabulary (256 single bytes + a stop token)."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo([bytes([i]) for i in range(256)] + [b""], stop_token_ids=[256])
    return xgr.GrammarCompiler(info, cache_enabled=False)


@dataclass
class Walk:
    token_ids: list[int]  # accepted tokens, the stop token excluded
    text: str
    matcher: RequestMatcher


def random_walk(service: GrammarCompilerService, tokenizer: Any, spec: GrammarSpec, seed: int,
                max_steps: int = MAX_WALK_STEPS, bias: dict[int, float] | None = None) -> Walk:
    """Sample from random logits (plus `bias` on some token ids) under the grammar's mask until the
    matcher terminates."""
    compiled = service.compile_now(spec)
    matcher = RequestMatcher(compiled)
    gen = torch.Generator().manual_seed(seed)
    bitmask = allocate_bitmask(1, service.vocab_size)
    tokens: list[int] = []
    for _ in range(max_steps):
        matcher.fill_bitmask(bitmask, 0)
        logits = torch.randn(1, service.vocab_size, generator=gen) * 3.0
        for token_id, value in (bias or {}).items():
            logits[0, token_id] += value
        apply_token_bitmask(logits, bitmask)
        token = int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=gen))
        assert matcher.accept_token(token), f"masked sampling produced a rejected token {token}"
        if matcher.is_terminated:
            assert token in service.stop_token_ids
            return Walk(tokens, tokenizer.decode(tokens), matcher)
        tokens.append(token)
    raise AssertionError(f"grammar not terminated after {max_steps} steps: {tokenizer.decode(tokens)!r}")
