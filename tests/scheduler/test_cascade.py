"""Cascade grouping of decode passes (scheduler/cascade.py): groups share prefix pages, and the
outputs stay those of each request alone. The fake worker (fake_worker.py) checks every group:
its prefix, read through the first member's page-table row, must be each member's own KV."""

from __future__ import annotations

import random

import pytest

from radixrt.memory.kv_manager import KVManager
from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import RadixCache
from radixrt.sampling_params import SamplingParams
from radixrt.scheduler.batch import ScheduledItem
from radixrt.scheduler.cascade import find_cascade_groups
from radixrt.scheduler.req import Req
from radixrt.scheduler.scheduler import Scheduler
from tests.scheduler.fake_worker import FakeWorker
from tests.scheduler.test_scheduler import CONTEXT, EOS, VOCAB, gen, reference_output, run_to_idle


def make(page_size: int, min_saved: int, num_pages: int = 2048, chunk: int = 256):
    alloc = PageAllocator(num_pages)
    sched = Scheduler(KVManager(alloc, RadixCache(alloc, page_size), page_size), page_size=page_size,
                      max_running_requests=32, chunk_size=chunk, context_len=CONTEXT, vocab_size=VOCAB,
                      eos_token_ids=[EOS], cascade_min_saved_tokens=min_saved)
    return sched, FakeWorker(num_pages, page_size, 32, CONTEXT // page_size + 2, VOCAB)


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("overlap", [False, True])
def test_groups_share_pages_and_outputs_are_unchanged(page_size: int, overlap: bool) -> None:
    rng = random.Random(page_size)
    sched, worker = make(page_size, min_saved=1)
    system_a = [rng.randrange(1, EOS) for _ in range(70)]
    system_b = [rng.randrange(1, EOS) for _ in range(40)]
    prompts = ([system_a + [rng.randrange(1, EOS) for _ in range(rng.randrange(1, 20))] for _ in range(6)]
               + [system_b + [rng.randrange(1, EOS) for _ in range(rng.randrange(1, 20))] for _ in range(4)]
               + [[rng.randrange(1, EOS) for _ in range(30)] for _ in range(2)])  # share nothing
    reqs = [sched.add_request(gen(f"r{i}", p, max_new=rng.randrange(8, 30))) for i, p in enumerate(prompts)]
    res = run_to_idle(sched, worker, overlap=overlap)
    for i, p in enumerate(prompts):
        assert res["outputs"][f"r{i}"] == reference_output(worker, p, len(res["outputs"][f"r{i}"]))
    assert worker.num_cascade_passes > 0 and sched.stats()["num_cascade_passes"] == worker.num_cascade_passes
    rows_seen = worker.cascade_grouped_rows
    assert len(rows_seen) >= 8  # most of the requests of both systems were grouped at some point
    assert sched.kv.stats()["num_protected_pages"] == 0
    assert all(r.is_finished for r in reqs)


def test_off_when_disabled_or_below_the_threshold() -> None:
    rng = random.Random(1)
    system = [rng.randrange(1, EOS) for _ in range(64)]
    for min_saved in (0, 10_000):
        sched, worker = make(16, min_saved=min_saved)
        for i in range(4):
            sched.add_request(gen(f"r{i}", system + [i + 1], max_new=5))
        run_to_idle(sched, worker)
        assert worker.num_cascade_passes == 0


class _KV:
    def __init__(self, pages: list[int]) -> None:
        self.pages = pages


def _item(pages: list[int], start: int) -> ScheduledItem:
    req = Req(rid=str(id(pages)), prompt_ids=[1], sampling=SamplingParams(), max_new_tokens=1, seed=0)
    req.kv = _KV(pages)  # type: ignore[assignment]
    return ScheduledItem(req=req, start=start, extend_len=1, slots=[0], completes=True, is_prefill=False)


def test_prefix_length_maximises_the_tokens_saved() -> None:
    ps = 4
    long_prefix = list(range(100, 120))  # 20 shared pages
    items = [_item(long_prefix + [200 + i, 300 + i], start=22 * ps - 1) for i in range(5)]
    items.append(_item([100, 999, 998], start=3 * ps - 1))  # shares only the first page
    items.append(_item([500, 501], start=2 * ps - 1))  # shares nothing
    members, starts, prefix_lens = find_cascade_groups(items, ps, min_saved_tokens=1)
    # one group of the five long sharers over 20 pages; the early divergent request is left out
    assert starts.tolist() == [0, 5] and sorted(members.tolist()) == [0, 1, 2, 3, 4]
    assert prefix_lens.tolist() == [20 * ps]
    # the prefix never reaches a member's new token: capped at the full pages before it
    short = [_item(long_prefix + [200 + i], start=10 * ps) for i in range(3)]
    _, _, lens = find_cascade_groups(short, ps, min_saved_tokens=1)
    assert lens.tolist() == [10 * ps]
    assert find_cascade_groups(items, ps, min_saved_tokens=10_000) is None
