"""Randomised stress of the scheduler under overlap scheduling: staggered arrivals, shared system
prompts, aborts (also of requests whose pass is in flight), eviction and retraction, page sizes 1 to
16, the radix cache on and off, both policies.

`run_to_idle` checks every step what schedule-time publication of prompt chunks must keep true
(scheduler.py `_publish_prompt_chunks`): no page written by a pass is mapped by another running
request, and no token still being sampled reaches the radix tree; the fake worker
checks every KV read, and at the end every request's tokens follow the reference model.
"""

from __future__ import annotations

import random

import pytest

from tests.scheduler.test_scheduler import CONTEXT, EOS, gen, make, run_to_idle


def _run(seed: int) -> int:
    rng = random.Random(seed)
    ps = rng.choice([1, 2, 4, 16])
    chunk = rng.choice([8, 16, 24, 40, 64, 1 << 20])
    sched, worker = make(ps, num_pages=rng.choice([200, 320, 600, 2000]) // ps + 1, chunk=chunk,
                         max_running=rng.choice([4, 8, 12]), disable=rng.random() < 0.2,
                         policy=rng.choice(["lpm", "fcfs"]))
    systems = [[rng.randrange(1, EOS) for _ in range(rng.randrange(20, 90))] for _ in range(3)]
    n = rng.randrange(8, 24)
    prompts = {f"r{i}": (rng.choice(systems) if rng.random() < 0.7 else [])
               + [rng.randrange(1, EOS) for _ in range(rng.randrange(1, 50))] for i in range(n)}
    max_new = {rid: rng.randrange(1, 60) for rid in prompts}
    arrivals = sorted(rng.randrange(0, 40) for _ in range(n))
    aborted: set[str] = set()

    def arrive_and_abort(step: int) -> None:
        for i, at in enumerate(arrivals):
            if at == step:
                sched.add_request(gen(f"r{i}", prompts[f"r{i}"], max_new[f"r{i}"], ignore_eos=True))
        if rng.random() < 0.04 and sched.reqs:
            rid = rng.choice(sorted(sched.reqs))
            aborted.add(rid)
            sched.abort(rid)

    res = run_to_idle(sched, worker, on_step=arrive_and_abort, overlap=rng.random() < 0.8,
                      min_steps=arrivals[-1] + 1)
    assert sched.kv.stats()["num_protected_pages"] == 0, f"seed {seed}: pages still protected when idle"
    for rid, prompt in prompts.items():
        seq = list(prompt)
        for tok in res["outputs"].get(rid, []):
            assert tok == worker.next_token(seq), f"seed {seed}: {rid} diverged (page {ps}, chunk {chunk})"
            seq.append(tok)
        if rid not in aborted:
            assert len(res["outputs"][rid]) == min(max_new[rid], CONTEXT - len(prompt)), (seed, rid)
    return sched.num_retractions


@pytest.mark.parametrize("first_seed", [0, 30])
def test_random_overlap_runs_keep_kv_and_tokens_right(first_seed: int) -> None:
    retractions = sum(_run(seed) for seed in range(first_seed, first_seed + 30))
    assert retractions > 0  # the pools are small enough that some runs retract
