"""Scheduler + KV manager driven by a model-free worker that checks every KV read.

Each request's expected output is computed by running the fake model's next-token rule on the
request alone; the scheduler must reproduce it under batching, chunking, prefix sharing,
copy-on-write, eviction, retraction and aborts, and leave no page protected once idle.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from radixrt.memory.kv_manager import KVManager
from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import RadixCache
from radixrt.protocol import GenerateReq
from radixrt.scheduler.batch import build_forward_batch
from radixrt.scheduler.scheduler import Scheduler
from tests.scheduler.fake_worker import FakeWorker

VOCAB = 1000
EOS = 999
CONTEXT = 512


def make(page_size: int, num_pages: int, chunk: int, max_running: int = 16, disable: bool = False,
         policy: str = "lpm") -> tuple[Scheduler, FakeWorker]:
    alloc = PageAllocator(num_pages)
    cache = RadixCache(alloc, page_size, disable=disable)
    sched = Scheduler(KVManager(alloc, cache, page_size), page_size=page_size,
                      max_running_requests=max_running, chunk_size=chunk, context_len=CONTEXT,
                      vocab_size=VOCAB, eos_token_ids=[EOS], schedule_policy=policy)
    worker = FakeWorker(num_pages, page_size, max_running, CONTEXT // page_size + 2, VOCAB)
    return sched, worker


def reference_output(worker: FakeWorker, prompt: list[int], max_new: int) -> list[int]:
    seq, out = list(prompt), []
    while len(out) < max_new and len(seq) < CONTEXT:
        t = worker.next_token(seq)
        out.append(t)
        seq.append(t)
        if t == EOS:
            break
    return out


def run_to_idle(sched: Scheduler, worker: FakeWorker, on_step=None, max_steps: int = 20000,
                overlap: bool = False, min_steps: int = 0) -> dict:
    """Drive the scheduler like scheduler_proc does. With `overlap`, pass N+1 is scheduled and run
    before the result of pass N is processed (the worker runs passes in order). `on_step(step)` runs
    before each step (arrivals, aborts); the run does not end before `min_steps` steps."""
    outputs: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    in_flight = None
    for step in range(max_steps):
        if on_step is not None:
            on_step(step)
        sb = sched.schedule()
        done = None
        if sb is not None:
            written: dict[int, object] = {}
            for it in sb.items:  # copy-on-write: no new token may be written into a shared page,
                for j, slot in enumerate(it.slots):  # unless this request itself published it (the
                    pos, page = it.start + j, slot // sched.page_size  # pass writes what it published)
                    own = pos < it.req.kv.published_len and it.req.kv.pages[pos // sched.page_size] == page
                    assert sched.kv._allocator.refcount(page) == 1 or own  # (white box)
                    written[page] = it.req
            for req in sched.running:  # and no other request maps a page this pass writes
                for page in req.kv.pages if req.kv is not None else ():
                    assert written.get(page, req) is req, \
                        f"page {page} is written in this pass and mapped by {req.rid}"
            expected = {it.req.req_row: list(it.req.all_ids) for it in sb.items}
            fb = build_forward_batch(sb)
            if not len(fb.grammar_deferred):
                done = (sb, worker.forward(fb, expected))
        if in_flight is not None:
            sched.process_result(*in_flight)
        if sb is not None and done is None:  # deferred grammar rows: the worker samples once the
            # previous result is processed and the rows are filled (PassPipeline.step)
            done = (sb, worker.forward(fb, expected, sched.grammar.fill_deferred(sb)))
        if done is not None and not overlap:
            sched.process_result(*done)
            done = None
        in_flight = done
        out, _ = sched.take_outputs()
        if out is not None:
            for i, rid in enumerate(out.rids):
                toks = out.output_ids[out.offsets[i]:out.offsets[i + 1]].tolist()
                assert all(0 <= t < VOCAB for t in toks), "a stand-in leaked into the output"
                outputs.setdefault(rid, []).extend(toks)
                if out.finish_reasons[i] is not None:
                    reasons[rid] = out.finish_reasons[i]
                    assert out.completion_tokens[i] == len(outputs[rid])
        sched.check_invariants()
        worker.check_tree(sched.kv._cache)  # no token still in flight reached the radix tree
        if sb is None and in_flight is None and sched.is_idle and step >= min_steps:
            break
    else:
        raise AssertionError("scheduler did not become idle")
    return {"outputs": outputs, "reasons": reasons}


def gen(rid: str, prompt: list[int], max_new: int, **sp) -> GenerateReq:
    return GenerateReq(rid=rid, input_ids=np.array(prompt, np.int32),
                       sampling={"temperature": 0.0, "max_new_tokens": max_new, **sp})


def shared_prefix_prompts(rng: random.Random, n: int, prefix_len: int) -> list[list[int]]:
    system = [rng.randrange(1, EOS) for _ in range(prefix_len)]
    return [system + [rng.randrange(1, EOS) for _ in range(rng.randrange(1, 40))] for _ in range(n)]


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("disable", [False, True])
def test_outputs_match_reference_with_sharing_and_chunking(page_size: int, disable: bool) -> None:
    rng = random.Random(page_size)
    sched, worker = make(page_size, num_pages=4096 // page_size + 1, chunk=48, disable=disable)
    prompts = shared_prefix_prompts(rng, 12, prefix_len=70)
    for i, p in enumerate(prompts):
        sched.add_request(gen(f"r{i}", p, max_new=rng.randrange(1, 30)))
    res = run_to_idle(sched, worker)
    for i, p in enumerate(prompts):
        want = reference_output(worker, p, sched_max := len(res["outputs"][f"r{i}"]))
        assert res["outputs"][f"r{i}"] == want, f"r{i} diverged (len {sched_max})"
    assert sched.kv.stats()["num_protected_pages"] == 0


@pytest.mark.parametrize("page_size", [1, 16])
def test_warm_cache_reports_cached_tokens_and_same_output(page_size: int) -> None:
    rng = random.Random(7)
    sched, worker = make(page_size, num_pages=4096 // page_size + 1, chunk=1 << 20)
    prompt = [rng.randrange(1, EOS) for _ in range(203)]  # the cached prefix ends inside a page
    sched.add_request(gen("cold", prompt, 10))
    cold = run_to_idle(sched, worker)["outputs"]["cold"]
    warm_req = sched.add_request(gen("warm", prompt + [5, 6, 7], 10))
    run_to_idle(sched, worker)
    assert warm_req.cached_tokens >= (203 // page_size) * page_size
    again = sched.add_request(gen("again", prompt, 10))
    out = run_to_idle(sched, worker)["outputs"]["again"]
    assert out == cold
    assert again.cached_tokens == len(prompt) - 1  # the last prompt token is always computed


@pytest.mark.parametrize("page_size", [1, 16])
def test_memory_pressure_evicts_and_retracts_without_corruption(page_size: int) -> None:
    rng = random.Random(3)
    # Pool far smaller than the workload: eviction and retraction must both happen.
    sched, worker = make(page_size, num_pages=600 // page_size + 1, chunk=64, max_running=12)
    prompts = shared_prefix_prompts(rng, 20, prefix_len=40) + \
        [[rng.randrange(1, EOS) for _ in range(rng.randrange(20, 120))] for _ in range(10)]
    max_new = {f"r{i}": rng.randrange(20, 150) for i in range(len(prompts))}
    for i, p in enumerate(prompts):
        sched.add_request(gen(f"r{i}", p, max_new[f"r{i}"], ignore_eos=True))
    res = run_to_idle(sched, worker)
    for i, p in enumerate(prompts):
        got = res["outputs"][f"r{i}"]
        assert len(got) == max_new[f"r{i}"]
        seq = list(p)
        for t in got:  # with ignore_eos the reference rule continues past EOS
            assert t == worker.next_token(seq)
            seq.append(t)
    assert sched.num_retractions > 0
    assert sched.kv.stats()["num_protected_pages"] == 0


def test_random_aborts_leave_nothing_protected() -> None:
    rng = random.Random(11)
    sched, worker = make(16, num_pages=2048 // 16 + 1, chunk=32)
    prompts = shared_prefix_prompts(rng, 30, prefix_len=50)
    for i, p in enumerate(prompts):
        sched.add_request(gen(f"r{i}", p, 40, ignore_eos=True))

    def abort_some(step: int) -> None:
        if step % 3 == 0:
            sched.abort(f"r{rng.randrange(len(prompts))}")

    res = run_to_idle(sched, worker, on_step=abort_some)
    assert "abort" in res["reasons"].values()
    assert len(res["reasons"]) == len(prompts)  # every request finished, one way or the other
    assert sched.kv.stats()["num_protected_pages"] == 0
    assert sched.flush_cache()
    stats = sched.kv.stats()
    assert stats["num_free_pages"] == stats["num_total_pages"]


def test_bad_requests_finish_with_errors_and_others_go_on() -> None:
    sched, worker = make(16, num_pages=257, chunk=64)
    sched.add_request(gen("empty", [], 5))
    sched.add_request(gen("long", list(range(1, CONTEXT + 1)), 5))
    sched.add_request(gen("oov", [1, 2, VOCAB + 5], 5))
    sched.add_request(gen("ok", [1, 2, 3], 5, ignore_eos=True))
    res = run_to_idle(sched, worker)
    assert res["reasons"] == {"empty": "abort", "long": "abort", "oov": "abort", "ok": "length"}
    assert len(res["outputs"]["ok"]) == 5


def test_max_tokens_clamped_to_context_length() -> None:
    sched, worker = make(16, num_pages=257, chunk=1024)
    prompt = list(range(1, CONTEXT - 3))
    req = sched.add_request(gen("r", prompt, 100, ignore_eos=True))
    res = run_to_idle(sched, worker)
    assert res["reasons"]["r"] == "length"
    assert len(res["outputs"]["r"]) == CONTEXT - len(prompt)
    assert req.seq_len == CONTEXT


@pytest.mark.parametrize("page_size", [1, 16])
def test_overlap_schedule_gives_the_same_tokens(page_size: int) -> None:
    """Overlap scheduling (pass N+1 sent before N's result) under sharing, chunking, eviction,
    retraction and aborts: every request's tokens equal the synchronous run's."""
    rng = random.Random(21)
    prompts = shared_prefix_prompts(rng, 16, prefix_len=40) + \
        [[rng.randrange(1, EOS) for _ in range(rng.randrange(5, 90))] for _ in range(6)]
    max_new = [rng.randrange(1, 60) for _ in prompts]
    results = []
    for overlap in (False, True):
        sched, worker = make(page_size, num_pages=320 // page_size + 1, chunk=40, max_running=10)
        for i, p in enumerate(prompts):
            sched.add_request(gen(f"r{i}", p, max_new[i], ignore_eos=i % 2 == 0))
        sched.add_request(gen("gone", prompts[0], 50))

        def abort_late(step: int, s=sched) -> None:
            if step == 7:
                s.abort("gone")

        results.append(run_to_idle(sched, worker, on_step=abort_late, overlap=overlap))
        assert sched.kv.stats()["num_protected_pages"] == 0
        if overlap:
            assert sched.num_retractions > 0
    sync, ovl = results
    assert ovl["reasons"] == sync["reasons"]
    for i, p in enumerate(prompts):
        assert ovl["outputs"][f"r{i}"] == sync["outputs"][f"r{i}"]
        assert sync["outputs"][f"r{i}"] == reference_output(worker, p, len(sync["outputs"][f"r{i}"])) \
            or i % 2 == 0


def test_followers_of_a_shared_prefix_start_in_the_pass_queued_behind_the_leader() -> None:
    """Requests sharing an uncached prefix wait for the first one's pass, but under overlap they
    join the very next pass, scheduled while the leader's pass is still in flight: its prompt pages
    are published when the pass is scheduled. They read the leader's KV (the fake worker checks
    every read) and report the prefix as cached."""
    rng = random.Random(5)
    system = [rng.randrange(1, EOS) for _ in range(64)]
    prompts = [system + [rng.randrange(1, EOS) for _ in range(8 + i)] for i in range(6)]
    sched, worker = make(16, num_pages=64, chunk=512)
    for i, p in enumerate(prompts):
        sched.add_request(gen(f"r{i}", p, 4))
    first = sched.schedule()
    assert [it.req.rid for it in first.items] == ["r0"]  # the others share its uncached prefix
    expected = {it.req.req_row: list(it.req.all_ids) for it in first.items}
    res0 = worker.forward(build_forward_batch(first), expected)
    second = sched.schedule()  # before the first pass's result is processed (overlap)
    assert second is not None
    followers = [it for it in second.items if it.req.rid != "r0"]
    assert sorted(it.req.rid for it in followers) == [f"r{i}" for i in range(1, 6)]
    assert all(it.start == 64 and it.req.cached_tokens == 64 for it in followers)
    expected = {it.req.req_row: list(it.req.all_ids) for it in second.items}
    res1 = worker.forward(build_forward_batch(second), expected)
    sched.process_result(first, res0)
    sched.process_result(second, res1)
    res = run_to_idle(sched, worker)  # (its first take_outputs also returns the tokens above)
    for i, p in enumerate(prompts):
        assert res["outputs"][f"r{i}"] == reference_output(worker, p, 4)
    assert sched.kv.stats()["num_protected_pages"] == 0


def test_short_request_is_not_stuck_behind_a_long_prefill() -> None:
    """A long prompt in progress leaves part of each chunk to waiting requests: a short request that
    arrives mid-prefill is admitted at the next step, long before the long prompt is done."""
    sched, worker = make(16, num_pages=2048 // 16 + 1, chunk=64)
    sched.add_request(gen("long", list(range(1, 401)), 4))  # 7 chunks of 64 on its own
    sb = sched.schedule()
    sched.process_result(sb, worker.forward(build_forward_batch(sb)))
    sched.add_request(gen("short", [5, 6, 7], 4))
    sb = sched.schedule()
    rids = {it.req.rid: it.extend_len for it in sb.items}
    assert rids.get("short") == 3
    assert 0 < rids["long"] < 64  # the long prompt still advances, with a smaller share


def test_max_prefill_tokens_caps_admission_per_pass() -> None:
    """--max-prefill-tokens: unchunked, whole prompts are admitted while they fit (a longer one runs
    alone); chunked, a prompt is fed at most that many tokens per pass."""
    for chunk, lens, want in ((-1, [60, 60, 300], [[60], [60], [300]]), (1000, [250], [[100], [100], [50]])):
        alloc = PageAllocator(512)
        sched = Scheduler(KVManager(alloc, RadixCache(alloc, 16), 16), page_size=16, max_running_requests=8,
                          chunk_size=chunk, context_len=CONTEXT, vocab_size=VOCAB, eos_token_ids=[EOS],
                          max_prefill_tokens=100)
        worker = FakeWorker(512, 16, 8, CONTEXT // 16 + 2, VOCAB)
        rng = random.Random(len(lens))
        for i, n in enumerate(lens):
            sched.add_request(gen(f"r{i}", [rng.randrange(1, EOS) for _ in range(n)], max_new=1))
        prefill_sizes = []
        while (sb := sched.schedule()) is not None:
            prefill_sizes.append([it.extend_len for it in sb.items if it.is_prefill])
            sched.process_result(sb, worker.forward(build_forward_batch(sb)))
        assert prefill_sizes == want


def test_a_request_that_never_fits_is_finished_not_requeued_forever() -> None:
    """A pool no bigger than the context: a long decode sharing a cached prefix that ends inside a
    page (copy-on-write holds one more page) runs out of pages alone. It must end ("length") rather
    than wait forever for room it can never get, and the server goes on; a prompt that cannot fit
    even alone ends with an error."""
    ps, pages = 16, 17  # 256 usable tokens = the context length
    sched, worker = make(ps, num_pages=pages, chunk=512, max_running=8)
    sched.context_len = 256
    base = list(range(5, 15))
    for i in range(4):
        sched.add_request(gen(f"r{i}", base + [100 + i, 20, 21, 22, 23, 24], max_new=100))
    run_to_idle(sched, worker, overlap=True)
    long = sched.add_request(gen("long", base + [199, 20, 21, 22, 23, 24], max_new=100_000))
    res = run_to_idle(sched, worker, overlap=True, max_steps=5000)
    assert res["reasons"]["long"] == "length" and len(res["outputs"]["long"]) > 100
    assert long.num_retractions >= 1
    after = sched.add_request(gen("after", [7, 8, 9], max_new=3))
    assert run_to_idle(sched, worker)["reasons"]["after"] == "length" and after.error is None
    sched.context_len = 1000  # a prompt longer than the whole pool (bypassing the context clamp)
    big = sched.add_request(gen("big", list(range(1, 300)), max_new=1))
    run_to_idle(sched, worker)
    assert big.finish_reason == "abort" and "KV cache" in big.error
    sched.check_invariants()
    assert sched.kv.stats()["num_protected_pages"] == 0


def test_a_burst_of_running_plus_queued_arrivals_is_taken_whole() -> None:
    """4 running slots + 4 queue slots: 8 arrivals before any step all wait at first, and all 8 are
    taken (the first 4 are the running set's, not queued); the 9th is refused. Once 4 run, 4 more
    may wait (break-it, 2026-12-05: a burst of 8 got two "too many queued requests")."""
    sched, worker = make(16, num_pages=256, chunk=512, max_running=4)
    sched.max_queued = 4
    burst = [sched.add_request(gen(f"b{i}", [5, 6, 7 + i], max_new=40)) for i in range(9)]
    assert [r.error for r in burst[:8]] == [None] * 8
    assert burst[8].error == "too many queued requests"
    late = []

    def after_first_pass(step: int) -> None:
        if step == 1:  # the first pass admitted 4: 4 running, 4 queued, full
            assert len(sched.running) == 4 and len(sched.waiting) == 4
            late.append(sched.add_request(gen("late", [5, 6, 99], max_new=4)))

    res = run_to_idle(sched, worker, on_step=after_first_pass)
    assert late[0].error == "too many queued requests"
    assert all(res["reasons"][f"b{i}"] == "length" for i in range(8))
    sched.check_invariants()
