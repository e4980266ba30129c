"""Fixtures: the default model's tokenizer (skips when the model cannot be resolved) and front ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixrt.config import Env

from .fakes import Front, start_front

REPLY = "Hello there! 😀 世界, ok."


@pytest.fixture(scope="session")
def tok_model_dir() -> Path:
    try:
        from radixrt.models.loader import resolve_model_dir

        return resolve_model_dir(None, Env.read().cache_dir, "auto")
    except Exception as e:  # loader missing or model unavailable: these tests cannot run here
        pytest.skip(f"default model unavailable: {e}")


@pytest.fixture(scope="session")
def tokenizer(tok_model_dir: Path) -> Any:
    from radixrt.tokenizer_proc.main import load_tokenizer

    return load_tokenizer(tok_model_dir)


class Scripts:
    """Mutable script holder so one shared front end can serve different replies per test."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.reset()

    def reset(self) -> None:
        self.text = REPLY
        self.finish: str | None = "stop"
        self.ids_override: list[int] | None = None

    def ids(self) -> list[int]:
        if self.ids_override is not None:
            return self.ids_override
        return list(self.tokenizer.encode(self.text, add_special_tokens=False))

    def __call__(self, req: Any) -> tuple[list[int], str | None]:
        ids = self.ids()
        mnt = req.sampling.get("max_new_tokens")
        if mnt is not None and len(ids) > mnt:
            return ids[:mnt], "length"
        return ids, self.finish


@pytest.fixture(scope="module")
def front_scripts(tokenizer: Any) -> Scripts:
    return Scripts(tokenizer)


@pytest.fixture(scope="module")
def front(tokenizer: Any, tok_model_dir: Path, front_scripts: Scripts) -> Iterator[Front]:
    f = start_front(tokenizer, tok_model_dir, front_scripts, context_length=512,
                    max_request_body_bytes=64 * 1024)
    yield f
    f.stop()


@pytest.fixture
def fr(front: Front, front_scripts: Scripts) -> Iterator[Front]:
    """The shared front end, with the script and the fake scheduler's options reset for this test."""
    front_scripts.reset()
    front.sched.interval_s = 0.0
    front.sched.error = None
    front.sched.batch_rids = False
    front.sched.burst = False
    front.sched.received.clear()
    front.sched.aborted.clear()
    yield front
