"""TokenizerManager's per-rid split of TokenOutBatch, and small pure helpers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from bench.lab.inbox_pinning import token_pass
from radixrt import protocol
from radixrt.config import ServerArgs
from radixrt.ipc import IpcAddresses
from radixrt.tokenizer_proc.errors import from_scheduler_error
from radixrt.tokenizer_proc.main import served_model_name
from radixrt.tokenizer_proc.manager import TokenizerManager


def _batch(top_ids: list[int], logprobs: list[float]) -> protocol.TokenOutBatch:
    return protocol.TokenOutBatch(
        rids=["a", "gone", "b"], top_logprobs_nums=[2, 1, 0], offsets=np.array([0, 2, 3, 4], np.int32),
        output_ids=np.array([10, 11, 12, 13], np.int32), logprobs=np.array(logprobs, np.float32),
        top_logprob_ids=np.array(top_ids, np.int32), top_logprobs=np.array(top_ids, np.float32) * -1,
        finish_reasons=[None, None, "length"], matched_stop=[None, None, None], prompt_tokens=[5, 5, 6],
        completion_tokens=[2, 1, 1], cached_tokens=[0, 0, 4], errors=[None, None, None])


def _manager() -> tuple[TokenizerManager, asyncio.Queue, asyncio.Queue]:
    m = TokenizerManager(IpcAddresses(*["x"] * 6), max_inflight=8)
    qa: asyncio.Queue = asyncio.Queue()
    qb: asyncio.Queue = asyncio.Queue()
    m._queues.update(a=qa, b=qb)
    return m, qa, qb


def test_dispatch_splits_per_rid_with_top_logprobs() -> None:
    m, qa, qb = _manager()
    m._dispatch(_batch([1, 2, 3, 4, 9], [-1.0, -2.0, -3.0, -4.0]))
    a, b = qa.get_nowait(), qb.get_nowait()
    assert a.ids == [10, 11] and a.logprobs.tolist() == [-1.0, -2.0]
    assert a.top_ids.tolist() == [[1, 2], [3, 4]] and a.top_logprobs.tolist() == [[-1, -2], [-3, -4]]
    assert b.ids == [13] and b.finish_reason == "length" and b.cached_tokens == 4
    assert b.top_ids is None and b.logprobs.tolist() == [-4.0]
    assert qa.empty() and qb.empty()


def test_dispatch_mixed_batch_gives_logprobs_only_to_the_requests_that_asked() -> None:
    """top_logprobs_nums -1: "a" did not ask (no entries); "gone" asked with k = 1 (its entries are
    skipped with it); "b" asked with k = 0 (logprobs, no top rows)."""
    m, qa, qb = _manager()
    batch = _batch([7], [-2.0, -4.0])
    batch.top_logprobs_nums = [-1, 1, 0]
    batch.top_logprobs = np.array([-7.0], np.float32)
    m._dispatch(batch)
    a, b = qa.get_nowait(), qb.get_nowait()
    assert a.ids == [10, 11] and a.logprobs is None and a.top_ids is None
    assert b.ids == [13] and b.logprobs.tolist() == [-4.0] and b.top_ids is None


def test_dispatch_with_a_bad_top_layout_keeps_tokens() -> None:
    m, qa, qb = _manager()
    m._dispatch(_batch([1, 2, 3], []))
    a, b = qa.get_nowait(), qb.get_nowait()
    assert a.ids == [10, 11] and a.top_ids is None and a.logprobs is None
    assert b.ids == [13]


@pytest.mark.parametrize(("msg", "status"), [("429 busy", 429), ("too many queued requests", 429),
                                             ("503: down", 503), ("prompt too long", 400)])
def test_scheduler_error_status(msg: str, status: int) -> None:
    assert from_scheduler_error(msg).status == status


def test_served_model_name() -> None:
    d = Path("/c/SmolLM2-135M-Instruct.Q4_1-52319e789301")
    assert served_model_name(ServerArgs(), d) == "SmolLM2-135M-Instruct"
    assert served_model_name(ServerArgs(model_path=str(d)), d) == "SmolLM2-135M-Instruct"
    assert served_model_name(ServerArgs(model_path="/m/Qwen2.5-0.5B-Instruct"), d) == "Qwen2.5-0.5B-Instruct"
    assert served_model_name(ServerArgs(model_path="/m/x.Q8_0.gguf"), d) == "x"
    assert served_model_name(ServerArgs(model_path="/m/x", served_model_name="mine"), d) == "mine"


def test_a_reader_that_falls_behind_stops_pinning_whole_passes() -> None:
    """Request r0's reader never takes: after _DETACH_EVERY passes its pending chunks own their logprob
    arrays (the same values) instead of views that keep each pass's frame (all 256 requests' logprobs)
    alive; r1's reader takes every pass and its chunks stay views (no copy for a reader that keeps up)."""
    from radixrt.tokenizer_proc.manager import _DETACH_EVERY, Inbox

    m = TokenizerManager(IpcAddresses(*["x"] * 6), max_inflight=8)
    slow, fast = Inbox(), Inbox()
    m._queues.update(r0=slow, r1=fast)
    rng = np.random.default_rng(0)
    batches, taken = [], []
    for _ in range(_DETACH_EVERY + 3):
        batches.append(token_pass(256, 20, rng))
        m._dispatch(batches[-1])
        taken.extend(fast.items)
        fast.items = []
    assert len(slow.items) == _DETACH_EVERY + 3
    for p, (c, b) in enumerate(zip(slow.items, batches, strict=True)):
        assert c.top_ids.tolist() == b.top_logprob_ids[:20].reshape(1, 20).tolist()
        assert c.top_logprobs.tolist() == b.top_logprobs[:20].reshape(1, 20).tolist()
        assert c.logprobs.tolist() == b.logprobs[:1].tolist()
        owns = all(a.base is None for a in (c.top_ids, c.top_logprobs, c.logprobs))
        assert owns == (p < _DETACH_EVERY), p  # the last 3 are not yet _DETACH_EVERY behind
    assert all(c.top_ids.base is not None for c in taken)
