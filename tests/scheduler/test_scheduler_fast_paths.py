"""The scheduler's radix-tree fast paths change no decision.

The scheduler reuses each waiting request's last match (its PrefixHandle) for its LPM probe and
admission, compares tokens as bytes (the handle's prompt bytes), passes `end` instead of copying token
lists, and publishes from the request's locked node. Here the same randomised runs as the stress
test (staggered arrivals, shared prefixes, aborts, eviction, retraction, overlap) go once through
the fast paths and once through a cache that always walks from the root over a copy of the
tokens: every pass sent to the worker, every output batch, and the final tree, LRU times and page
reference counts must be identical. Plus a direct test that the LPM order follows changes of the
tree between schedules (a stale hint would keep the old order), and one that the deferral index
(policy.AdmittedInStep) answers as a scan of the admitted requests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from radixrt.memory.kv_manager import KVManager
from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import MatchHint, MatchResult, RadixCache, TreeNode
from radixrt.sampling_params import SamplingParams
from radixrt.scheduler.policy import (
    SHARED_PREFIX_MIN_TOKENS,
    AdmittedInStep,
    defer_for_shared_prefix,
    order_waiting,
)
from radixrt.scheduler.req import Req
from radixrt.scheduler.scheduler import Scheduler
from tests.scheduler.fake_worker import FakeWorker
from tests.scheduler.test_scheduler import CONTEXT, EOS, VOCAB, gen, run_to_idle


class PlainWalkCache(RadixCache):
    """The radix cache without its fast paths: every match and insert copies the tokens and walks
    from the root; hints and token bytes are ignored."""

    def match_prefix(self, token_ids: Sequence[int], *, end: int | None = None, record_stats: bool = False,
                     hint: MatchHint | None = None, token_bytes: bytes | None = None,
                     root: TreeNode | None = None) -> MatchResult:
        return super().match_prefix(list(token_ids[:end]), record_stats=record_stats, root=root)

    def insert(self, token_ids: Sequence[int], pages: Sequence[int], start: TreeNode | None = None,
               end: int | None = None) -> int:
        return super().insert(list(token_ids[:end]), pages)

    def insert_path(self, token_ids: Sequence[int], pages: Sequence[int], start: TreeNode | None = None,
                    end: int | None = None) -> TreeNode:
        return super().insert_path(list(token_ids[:end]), pages)


def _digest_run(seed: int, cache_cls: type[RadixCache]) -> tuple[str, int]:
    """A stress-test run (test_scheduler_stress._run's scenario) hashed pass by pass."""
    rng = random.Random(seed)
    ps = rng.choice([1, 4, 16])
    chunk = rng.choice([16, 40, 1 << 20])
    num_pages = rng.choice([200, 320, 2000]) // ps + 1
    max_running = rng.choice([4, 8, 12])
    policy = rng.choice(["lpm", "fcfs"])
    alloc = PageAllocator(num_pages)
    cache = cache_cls(alloc, ps)
    sched = Scheduler(KVManager(alloc, cache, ps), page_size=ps, max_running_requests=max_running,
                      chunk_size=chunk, context_len=CONTEXT, vocab_size=VOCAB, eos_token_ids=[EOS],
                      schedule_policy=policy, cascade_min_saved_tokens=rng.choice([0, 8]))
    worker = FakeWorker(num_pages, ps, max_running, CONTEXT // ps + 2, VOCAB)
    h = hashlib.sha256()

    def digest(msg: Any) -> None:
        for f in dataclasses.fields(msg):
            v = getattr(msg, f.name)
            h.update(f.name.encode() + (v.tobytes() if isinstance(v, np.ndarray) else repr(v).encode()))

    forward, take = worker.forward, sched.take_outputs

    def recorded_forward(fb: Any, expected: Any = None) -> Any:
        digest(fb)
        return forward(fb, expected)

    def recorded_take() -> Any:
        out, internal = take()
        if out is not None:
            digest(out)
        return out, internal

    worker.forward, sched.take_outputs = recorded_forward, recorded_take  # type: ignore[method-assign]
    systems = [[rng.randrange(1, EOS) for _ in range(rng.randrange(20, 90))] for _ in range(3)]
    n = rng.randrange(8, 24)
    prompts = [(rng.choice(systems) if rng.random() < 0.7 else [])
               + [rng.randrange(1, EOS) for _ in range(rng.randrange(1, 50))] for _ in range(n)]
    max_new = [rng.randrange(1, 60) for _ in range(n)]
    arrivals = sorted(rng.randrange(0, 40) for _ in range(n))

    def arrive_and_abort(step: int) -> None:
        for i, at in enumerate(arrivals):
            if at == step:
                sched.add_request(gen(f"r{i}", prompts[i], max_new[i], ignore_eos=True))
        if rng.random() < 0.04 and sched.reqs:
            sched.abort(rng.choice(sorted(sched.reqs)))

    run_to_idle(sched, worker, on_step=arrive_and_abort, overlap=rng.random() < 0.8,
                min_steps=arrivals[-1] + 1)
    h.update(repr(sorted((nd.start, nd.key, tuple(nd.pages), nd.lock_ref, nd.last_access_time)
                         for nd in cache.iter_nodes())).encode())
    h.update(repr(([alloc.refcount(p) for p in range(1, num_pages)], alloc.free_pages(),
                   cache.total_queried_tokens, cache.total_matched_tokens,
                   cache.num_evicted_tokens)).encode())
    return h.hexdigest(), sched.num_retractions


@pytest.mark.parametrize("first_seed", [0, 20])
def test_fast_paths_take_the_same_decisions_as_plain_walks(first_seed: int) -> None:
    retractions = 0
    for seed in range(first_seed, first_seed + 20):
        fast, r = _digest_run(seed, RadixCache)
        plain, _ = _digest_run(seed, PlainWalkCache)
        assert fast == plain, f"seed {seed}: the fast paths changed a decision"
        retractions += r
    assert retractions > 0  # the runs include retractions (and so evictions and re-admissions)


def _req(rid: str, prompt: list[int], kv: KVManager | None = None) -> Req:
    return Req(rid=rid, prompt_ids=prompt, sampling=SamplingParams(), max_new_tokens=4, seed=0,
               prefix=None if kv is None else kv.prefix_handle(np.array(prompt, np.int64)))


def test_lpm_order_follows_inserts_and_evictions_between_schedules() -> None:
    """Waiting requests keep their matches as hints between schedules; the order must still follow
    the tree: a prefix published after the last probe moves its request up, an eviction down."""
    alloc = PageAllocator(64)
    cache = RadixCache(alloc, 4)
    kv = KVManager(alloc, cache, 4)
    shared = list(range(100, 140))
    early = _req("early", [7] * 30, kv)
    late = _req("late", shared + [1, 2, 3], kv)
    waiting = [early, late]
    assert [r.rid for r in order_waiting(waiting, "lpm", kv)] == ["early", "late"]  # both 0: arrival
    pages = alloc.alloc(10)
    assert pages is not None
    cache.insert(shared, pages)  # another request published the shared prefix meanwhile
    alloc.dec_ref(pages)
    assert [r.rid for r in order_waiting(waiting, "lpm", kv)] == ["late", "early"]
    assert late.prefix is not None and late.prefix.last_prefix_len == 40
    cache.evict(100)
    assert [r.rid for r in order_waiting(waiting, "lpm", kv)] == ["early", "late"]
    assert late.prefix.last_prefix_len == 0


def test_deferral_index_answers_as_a_scan_of_the_admitted_requests() -> None:
    """defer_for_shared_prefix through AdmittedInStep (indexed per cached length, appended to while
    the step admits) gives the answer of comparing the candidate with every admitted request."""
    rng = random.Random(3)
    systems = [[rng.randrange(1, 4) for _ in range(70)] for _ in range(3)]

    def prompt() -> list[int]:
        base = rng.choice(systems)[:rng.randrange(0, 71)]
        return base + [rng.randrange(1, 4) for _ in range(rng.randrange(0, 60))] + [5]

    def scan(candidate: Req, cached_len: int, admitted: list[Req]) -> bool:
        n = cached_len + SHARED_PREFIX_MIN_TOKENS
        ids = candidate.all_ids
        return len(ids) >= n and any(len(o.all_ids) >= n and o.all_ids[:n] == ids[:n] for o in admitted)

    for _ in range(40):
        admitted = [_req(f"a{i}", prompt()) for i in range(rng.randrange(0, 6))]
        index = AdmittedInStep(admitted)
        for j in range(30):
            cand = _req(f"c{j}", prompt())
            cached_len = rng.choice([0, 16, 32, rng.randrange(0, len(cand.all_ids))])
            assert defer_for_shared_prefix(cand, cached_len, index) == scan(cand, cached_len, admitted)
            if rng.random() < 0.3:
                admitted.append(cand)
                index.append(cand)
