"""Adaptive chunked prefill (radixrt/scheduler/chunking.py): a long prompt takes the full chunk
alone and a latency chunk beside decodes or waiting prompts; short prompts keep the pass budget."""

from __future__ import annotations

import random

import pytest

from radixrt.config import ServerArgs
from radixrt.memory.kv_manager import KVManager
from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import RadixCache
from radixrt.scheduler.batch import build_forward_batch
from radixrt.scheduler.chunking import latency_chunk
from radixrt.scheduler.scheduler import Scheduler
from tests.scheduler.fake_worker import FakeWorker
from tests.scheduler.test_scheduler import EOS, VOCAB, gen, run_to_idle

CHUNK = 2048  # latency chunk: 512
CONTEXT = 4096
PAGE = 16


def make(adaptive: bool = True, num_pages: int = 1024) -> tuple[Scheduler, FakeWorker]:
    alloc = PageAllocator(num_pages)
    sched = Scheduler(KVManager(alloc, RadixCache(alloc, PAGE), PAGE), page_size=PAGE,
                      max_running_requests=16, chunk_size=CHUNK, context_len=CONTEXT, vocab_size=VOCAB,
                      eos_token_ids=[EOS], adaptive_chunk=adaptive)
    return sched, FakeWorker(num_pages, PAGE, 16, CONTEXT // PAGE + 2, VOCAB)


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, EOS) for _ in range(n)]


def step(sched: Scheduler, worker: FakeWorker) -> dict[str, int]:
    """One pass without overlap: {rid: extend_len}."""
    sb = sched.schedule()
    assert sb is not None
    sched.process_result(sb, worker.forward(build_forward_batch(sb)))
    return {it.req.rid: it.extend_len for it in sb.items}


def test_latency_chunk_is_a_quarter_of_the_chunk_with_a_floor() -> None:
    assert latency_chunk(8192, 16) == 2048
    assert latency_chunk(2048, 16) == 512
    assert latency_chunk(512, 16) == 512  # the CPU default is not cut
    assert latency_chunk(100, 16) == 100
    assert latency_chunk(3000, 64) == 704  # page multiple


def test_a_long_prompt_alone_takes_the_full_chunk() -> None:
    sched, worker = make()
    sched.add_request(gen("long", prompt(random.Random(1), 3000), 2))
    assert step(sched, worker) == {"long": CHUNK}
    assert step(sched, worker) == {"long": 3000 - CHUNK}


def test_a_long_prefill_beside_waiting_shorts_is_cut_and_the_shorts_join_the_next_pass() -> None:
    sched, worker = make()
    rng = random.Random(2)
    sched.add_request(gen("long", prompt(rng, 3900), 2))
    assert step(sched, worker) == {"long": CHUNK}
    for i in range(3):
        sched.add_request(gen(f"short{i}", prompt(rng, 100), 2))
    got = step(sched, worker)
    assert got == {"long": latency_chunk(CHUNK, PAGE), "short0": 100, "short1": 100, "short2": 100}
    # the shorts now decode beside it: the long prompt keeps the latency chunk
    got = step(sched, worker)
    assert got["long"] == latency_chunk(CHUNK, PAGE) and all(got[f"short{i}"] == 1 for i in range(3))


def test_a_long_prompt_arriving_beside_decodes_starts_with_the_latency_chunk() -> None:
    sched, worker = make()
    rng = random.Random(3)
    sched.add_request(gen("stream", prompt(rng, 20), 50))
    step(sched, worker)
    sched.add_request(gen("long", prompt(rng, 3000), 2))
    assert step(sched, worker) == {"stream": 1, "long": latency_chunk(CHUNK, PAGE)}


def test_short_prompts_beside_decodes_still_fill_the_pass_budget() -> None:
    """Only long prompts are cut: a burst of prompts under the latency chunk is admitted as before."""
    sched, worker = make()
    rng = random.Random(4)
    sched.add_request(gen("stream", prompt(rng, 20), 50))
    step(sched, worker)
    for i in range(4):
        sched.add_request(gen(f"p{i}", prompt(rng, 500), 2))
    got = step(sched, worker)
    assert got == {"stream": 1, "p0": 500, "p1": 500, "p2": 500, "p3": 500}


def test_long_prompts_share_one_latency_chunk_per_pass() -> None:
    sched, worker = make()
    rng = random.Random(5)
    sched.add_request(gen("stream", prompt(rng, 20), 50))
    step(sched, worker)
    for i in range(3):
        sched.add_request(gen(f"long{i}", prompt(rng, 1500), 2))
    sched.add_request(gen("short", prompt(rng, 40), 2))
    for _ in range(4):
        got = step(sched, worker)
        assert sum(n for rid, n in got.items() if rid.startswith("long")) <= latency_chunk(CHUNK, PAGE)
        if "short" in got:
            break
    assert got.get("short") == 40  # a short prompt behind the long ones is not held back by them


def test_an_explicit_chunk_keeps_the_fixed_rule() -> None:
    """adaptive off: a prompt in progress takes half the chunk while requests wait, a new one the chunk."""
    sched, worker = make(adaptive=False)
    rng = random.Random(6)
    sched.add_request(gen("long", prompt(rng, 3900), 2))
    assert step(sched, worker) == {"long": CHUNK}
    sched.add_request(gen("short", prompt(rng, 100), 2))
    assert step(sched, worker) == {"long": CHUNK // 2, "short": 100}


@pytest.mark.parametrize("overlap", [False, True])
def test_adaptive_chunks_give_the_reference_outputs(overlap: bool) -> None:
    sched, worker = make()
    rng = random.Random(7)
    prompts = {f"r{i}": prompt(rng, n) for i, n in enumerate([3000, 40, 1200, 700, 2500, 90])}
    arrivals = {0: ["r0", "r1"], 2: ["r2", "r3"], 3: ["r4"], 5: ["r5"]}

    def arrive(k: int) -> None:
        for rid in arrivals.get(k, []):
            sched.add_request(gen(rid, prompts[rid], 6))

    res = run_to_idle(sched, worker, on_step=arrive, overlap=overlap, min_steps=6)
    for rid, p in prompts.items():
        seq, want = list(p), []
        for _ in range(6):
            want.append(worker.next_token(seq))
            seq.append(want[-1])
            if want[-1] == EOS:
                break
        assert res["outputs"][rid] == want


def test_the_chunk_adapts_only_without_the_flag() -> None:
    assert ServerArgs().adaptive_chunked_prefill()
    assert not ServerArgs(chunked_prefill_size=8192).adaptive_chunked_prefill()
