"""GrammarCompilerService: the cache returns the same compiled object per (kind, text), failures
surface through the handle as GrammarError, and the vocabulary covers the model's logits width."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from radixrt.constrained import (
    GrammarCompilerService,
    GrammarError,
    GrammarKind,
    GrammarSpec,
    RequestMatcher,
    allocate_bitmask,
    build_tokenizer_info,
)


def test_cache_returns_the_same_compiled_grammar(service: GrammarCompilerService) -> None:
    text = json.dumps({"type": "object", "properties": {"cache_probe": {"type": "integer"}}})
    before = service.cache_info()
    first = service.submit(GrammarSpec(GrammarKind.JSON_SCHEMA, text))
    again = service.submit(GrammarSpec("json_schema", text))
    assert again is first
    compiled = first.result(timeout_s=None)
    assert service.compile_now(GrammarSpec(GrammarKind.JSON_SCHEMA, text)) is compiled
    after = service.cache_info()
    assert after["misses"] == before["misses"] + 1 and after["hits"] == before["hits"] + 2
    # the same text under another kind, or another text, is another entry
    other = service.compile_now(GrammarSpec(GrammarKind.JSON_SCHEMA, text + " "))
    assert other is not compiled
    assert first.done() and first.error() is None


def test_failed_compile_is_reported_through_the_handle(service: GrammarCompilerService) -> None:
    handle = service.submit(GrammarSpec(GrammarKind.JSON_SCHEMA, '{"type": "array", "uniqueItems": true}'))
    with pytest.raises(GrammarError, match="uniqueItems"):
        handle.result(timeout_s=None)
    assert handle.done() and "uniqueItems" in (handle.error() or "")
    assert service.submit(handle.spec) is handle  # failures are cached too


def test_poll_api_while_the_compile_is_pending(tokenizer: Any, model_vocab_size: int) -> None:
    import threading

    svc = GrammarCompilerService(build_tokenizer_info(tokenizer, vocab_size=model_vocab_size), num_threads=1)
    gate = threading.Event()
    try:
        svc._pool.submit(gate.wait)  # occupy the only compile thread
        handle = svc.submit(GrammarSpec(GrammarKind.REGEX, "[0-9]{2}"))
        assert not handle.done() and handle.error() is None
        with pytest.raises(TimeoutError):
            handle.result()
        gate.set()
        assert handle.result(timeout_s=None) is not None and handle.done() and handle.error() is None
    finally:
        gate.set()
        svc.shutdown()


def test_cache_evicts_oldest_finished_entries(tokenizer: Any, model_vocab_size: int) -> None:
    svc = GrammarCompilerService(build_tokenizer_info(tokenizer, vocab_size=model_vocab_size),
                                 num_threads=1, cache_entries=2)
    try:
        specs = [GrammarSpec(GrammarKind.REGEX, p) for p in ("a", "b", "c")]
        handles = [svc.submit(s) for s in specs]
        for h in handles:
            h.result(timeout_s=None)
        svc.submit(GrammarSpec(GrammarKind.REGEX, "d")).result(timeout_s=None)
        assert svc.cache_info()["entries"] <= 2
        assert svc.submit(specs[0]) is not handles[0]  # evicted, compiled anew
    finally:
        svc.shutdown()


def test_padded_lm_head_columns_are_never_allowed(tokenizer: Any, model_vocab_size: int) -> None:
    padded = model_vocab_size + 64  # an LM head padded past the tokenizer's ids
    svc = GrammarCompilerService(build_tokenizer_info(tokenizer, vocab_size=padded))
    try:
        assert svc.vocab_size == padded and svc.stop_token_ids == [tokenizer.eos_token_id]
        matcher = RequestMatcher(svc.compile_now(GrammarSpec(GrammarKind.JSON_OBJECT)))
        bitmask = allocate_bitmask(1, padded)
        assert matcher.accept_tokens(tokenizer.encode('{"k": "', add_special_tokens=False)) > 0
        matcher.fill_bitmask(bitmask, 0)
        bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")
        assert bits[:model_vocab_size].sum() > 1000 and not bits[model_vocab_size:].any()
        assert not matcher.accept_token(model_vocab_size + 1)
    finally:
        svc.shutdown()


def test_from_model_dir(model_dir: Any, model_vocab_size: int) -> None:
    svc = GrammarCompilerService.from_model_dir(model_dir, vocab_size=model_vocab_size, stop_token_ids=[2])
    try:
        assert svc.vocab_size == model_vocab_size and svc.stop_token_ids == [2]
        assert svc.compile_now(GrammarSpec(GrammarKind.REGEX, "x")) is not None
    finally:
        svc.shutdown()


def _byte_info() -> Any:
    import xgrammar as xgr

    return xgr.TokenizerInfo([bytes([i]) for i in range(256)] + [b""], stop_token_ids=[256])


def test_deferred_service_builds_its_tokenizer_info_on_the_first_compile() -> None:
    calls: list[int] = []

    def load_info() -> Any:
        calls.append(1)
        return _byte_info()

    svc = GrammarCompilerService(load_info=load_info, vocab_size=257, stop_token_ids=[256])
    try:
        assert calls == [] and svc.tokenizer_info is None  # nothing built at construction
        assert svc.vocab_size == 257 and svc.stop_token_ids == [256]
        matcher = RequestMatcher(svc.compile_now(GrammarSpec(GrammarKind.REGEX, "[0-9]{2}")))
        assert matcher.accept_tokens([ord("4"), ord("2")]) == 2
        svc.compile_now(GrammarSpec(GrammarKind.REGEX, "a+"))
        assert calls == [1] and svc.tokenizer_info is not None  # built once
    finally:
        svc.shutdown()


def test_deferred_service_whose_tokenizer_fails_fails_every_compile_with_the_reason() -> None:
    def load_info() -> Any:
        raise OSError("no tokenizer.json here")

    svc = GrammarCompilerService(load_info=load_info, vocab_size=257)
    try:
        for pattern in ("a", "b"):
            with pytest.raises(GrammarError, match="no grammar support.*no tokenizer.json here"):
                svc.compile_now(GrammarSpec(GrammarKind.REGEX, pattern))
    finally:
        svc.shutdown()
    with pytest.raises(ValueError):
        GrammarCompilerService(load_info=load_info)  # the bitmask width is needed up front
    with pytest.raises(ValueError):
        GrammarCompilerService()
