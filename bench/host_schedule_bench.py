"""Host (CPU) time of the scheduler per pass, with no model: where the step loop spends its time.

Drives the real `radixrt.Engine` loop (overlap scheduling, `Scheduler.schedule` ->
`build_forward_batch` -> launch -> `process_result` -> `take_outputs`) with a fake runner that
returns one deterministic token per request at once, through the offline benchmark's workloads
as token ids (bench/offline.py `run_workload`):

  shared-prefix  128 requests = one common 2,048-token prefix + 128 unique tokens, 64 output tokens
  random         256 requests, 512 prompt tokens (random ids), 256 output tokens

with the H200 engine benchmark's settings: page size 16, chunked prefill 8,192, 256 running
requests, greedy, EOS ignored, cascade grouping on (as on the triton backend), a 2M-token KV pool.
Every `schedule()`, `build_forward_batch()`, `process_result()` and `take_outputs()` call is timed
and summed per pass kind:

  first      the first pass (batch id 0)
  admission  passes with prompt tokens (extend_len > 1: prefill, or prefill mixed with decodes)
  decode     passes where every request adds one token

`take_outputs` is charged to the pass whose result was processed last. Also reported: the
work of `Engine.generate` before the first `schedule()` (prompt checks and `add_request` of the
requests queued before the first pass), `add_request` over all requests, the overall host time
(wall time of the workload run; the fake runner costs a few us a pass) and the pauses of Python's
cyclic GC within it (they land in whichever call allocates; `--no-gc` turns the GC off to compare
code costs without them). Each figure is the median over `--repeat` runs, each on a fresh
scheduler; the per-pass table lists the first `--show-passes` passes.

    .venv/bin/python bench/host_schedule_bench.py                   # both workloads, 5 runs each
    .venv/bin/python bench/host_schedule_bench.py --workload shared-prefix --profile
    .venv/bin/python bench/host_schedule_bench.py --fingerprint     # digest of every decision

`--fingerprint` prints a digest of every pass (requests, positions, slots, copy-on-write pairs,
cascade groups), every ForwardBatch and TokenOutBatch, the final page reference counts, radix tree
(with LRU times) and hit-rate counters: the same digest before and after a change means the
scheduler took the same decisions. The pool-size, page-size, chunk and policy flags vary the run
(a small --num-pages makes it evict and retract).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import hashlib
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import radixrt.scheduler.pipeline as pipeline_mod  # noqa: E402
from bench.offline import run_workload  # noqa: E402
from bench.workloads import WorkloadSpec  # noqa: E402
from radixrt.config import ServerArgs  # noqa: E402
from radixrt.engine import Engine  # noqa: E402
from radixrt.protocol import ForwardBatch, ForwardResult  # noqa: E402
from radixrt.scheduler.batch import ScheduledBatch  # noqa: E402

VOCAB = 152064  # Qwen2.5-7B, the H200 benchmark's shape
KINDS = ("first", "admission", "decode")
PARTS = ("schedule", "build", "process", "take")


class _Pending:
    __slots__ = ("fb", "path")

    def __init__(self, fb: ForwardBatch) -> None:
        self.fb, self.path = fb, "fake"


class FakeRunner:
    """Stands in for ModelRunner: `launch` keeps the batch, `finish` samples one token per request,
    a function of the batch id and the request's index (so runs are reproducible)."""

    def __init__(self, vocab_size: int, min_token_id: int = 1000) -> None:
        self.span = vocab_size - min_token_id
        self.lo = min_token_id

    def launch(self, fb: ForwardBatch) -> _Pending:
        return _Pending(fb)

    def finish(self, pending: _Pending) -> ForwardResult:
        fb = pending.fb
        rows = np.arange(len(fb.req_rows), dtype=np.int64)
        toks = (rows * 7919 + fb.batch_id * 104729) % self.span + self.lo
        return ForwardResult(batch_id=fb.batch_id, next_token_ids=toks.astype(np.int32))


def worker_info(num_pages: int, page_size: int, max_rows: int, cascade: bool) -> dict[str, Any]:
    """What a worker's Ready message would say for the Qwen2.5-7B shape."""
    return {"num_pages": num_pages, "page_size": page_size, "max_req_rows": max_rows,
            "context_length": 32768, "vocab_size": VOCAB, "eos_token_ids": [151643, 151645],
            "attention_backend": "triton" if cascade else "torch"}


def make_engine(args: ServerArgs, info: dict[str, Any]) -> Engine:
    """An Engine whose runner is FakeRunner (no model)."""
    return Engine.from_runner(args, FakeRunner(info["vocab_size"]), info)


def pass_kind(sb: ScheduledBatch) -> str:
    if sb.batch_id == 0:
        return "first"
    return "admission" if any(it.extend_len > 1 for it in sb.items) else "decode"


class HostTimer:
    """Wraps the engine's scheduler calls and its build_forward_batch; records ms per pass."""

    def __init__(self, eng: Engine) -> None:
        self.passes: dict[int, dict[str, Any]] = {}
        self.empty_schedule_ms = 0.0  # schedule() calls that returned None
        self.num_empty = 0
        self.other_take_ms = 0.0  # take_outputs before any result was processed
        self.add_request_ms = 0.0
        self.t_first_schedule: float | None = None
        self.last_processed: int | None = None
        sched = eng.scheduler
        perf = time.perf_counter
        schedule, process = sched.schedule, sched.process_result
        take, add = sched.take_outputs, sched.add_request

        def timed_schedule() -> ScheduledBatch | None:
            t0 = perf()
            if self.t_first_schedule is None:
                self.t_first_schedule = t0
            sb = schedule()
            dt = (perf() - t0) * 1e3
            if sb is None:
                self.empty_schedule_ms += dt
                self.num_empty += 1
            else:
                self.passes[sb.batch_id] = {"kind": pass_kind(sb), "batch": len(sb),
                                            "tokens": sum(it.extend_len for it in sb.items),
                                            "schedule": dt, "build": 0.0, "process": 0.0, "take": 0.0}
            return sb

        def timed_process(sb: ScheduledBatch, res: ForwardResult, early: Any = None) -> None:
            t0 = perf()
            process(sb, res, early)
            self.passes[sb.batch_id]["process"] += (perf() - t0) * 1e3
            self.last_processed = sb.batch_id

        def timed_take() -> Any:
            t0 = perf()
            out = take()
            dt = (perf() - t0) * 1e3
            if self.last_processed is None:
                self.other_take_ms += dt
            else:
                self.passes[self.last_processed]["take"] += dt
            return out

        def timed_add(*a: Any, **k: Any) -> Any:
            t0 = perf()
            req = add(*a, **k)
            self.add_request_ms += (perf() - t0) * 1e3
            return req

        sched.schedule, sched.process_result, sched.take_outputs = timed_schedule, timed_process, timed_take
        sched.add_request = timed_add

    def build_wrapper(self, build: Callable[[ScheduledBatch], ForwardBatch]) -> Callable[[ScheduledBatch],
                                                                                         ForwardBatch]:
        perf = time.perf_counter

        def timed_build(sb: ScheduledBatch) -> ForwardBatch:
            t0 = perf()
            fb = build(sb)
            self.passes[sb.batch_id]["build"] += (perf() - t0) * 1e3
            return fb

        return timed_build


def workload_spec(name: str) -> WorkloadSpec:
    if name == "shared-prefix":
        return WorkloadSpec(name="shared-prefix", num_groups=1, prompts_per_group=128, system_prompt_len=2048,
                            question_len=128, output_len=64, vocab_size=VOCAB)
    return WorkloadSpec(name="random", num_prompts=256, input_len=512, output_len=256, vocab_size=VOCAB)


def server_args(ns: argparse.Namespace) -> ServerArgs:
    return ServerArgs(device="cpu", page_size=ns.page_size, max_running_requests=ns.max_running_requests,
                      chunked_prefill_size=ns.chunked_prefill_size, disable_cascade_attention=ns.no_cascade,
                      schedule_policy=getattr(ns, "schedule_policy", "lpm"),
                      disable_radix_cache=getattr(ns, "disable_radix_cache", False),
                      disable_overlap_schedule=getattr(ns, "disable_overlap_schedule", False))


def run_once(ns: argparse.Namespace, spec: WorkloadSpec, profile: cProfile.Profile | None = None) -> dict[str,
                                                                                                          Any]:
    """One timed run of `spec` on a fresh engine; ms per pass kind and part."""
    args = server_args(ns)
    eng = make_engine(args,
                      worker_info(ns.num_pages, ns.page_size, ns.max_running_requests, not ns.no_cascade))
    timer = HostTimer(eng)
    workload = spec.build()
    orig_build, orig_generate = pipeline_mod.build_forward_batch, eng.generate
    t_gen: list[float] = []

    def generate(*a: Any, **k: Any) -> Any:
        t_gen.append(time.perf_counter())
        return orig_generate(*a, **k)

    pipeline_mod.build_forward_batch = timer.build_wrapper(orig_build)
    eng.generate = generate  # type: ignore[method-assign]
    gc_ms = [0.0, 0.0, 0.0]  # pause time of the cyclic GC, per generation collected
    gc_t0 = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        else:
            gc_ms[info["generation"]] += (time.perf_counter() - gc_t0[0]) * 1e3

    gc.callbacks.append(on_gc)
    try:
        if profile is not None:
            profile.enable()
        t0 = time.perf_counter()
        res = run_workload(eng, workload)
        wall_ms = (time.perf_counter() - t0) * 1e3
        if profile is not None:
            profile.disable()
    finally:
        pipeline_mod.build_forward_batch = orig_build
        gc.callbacks.remove(on_gc)
    assert res["token_counts_consistent"], "a request produced the wrong number of tokens"
    out: dict[str, Any] = {"wall_ms": wall_ms, "passes": len(timer.passes),
                           "empty_schedules": timer.num_empty,
                           "empty_schedule_ms": timer.empty_schedule_ms,
                           "cached_tokens": res["cached_tokens"],
                           "pre_first_pass_ms": ((timer.t_first_schedule or t_gen[0]) - t_gen[0]) * 1e3,
                           "add_request_ms": timer.add_request_ms, "gc_ms": sum(gc_ms), "first_passes": []}
    for kind in KINDS:
        rows = [p for p in timer.passes.values() if p["kind"] == kind]
        out[kind] = {"passes": len(rows), **{part: sum(p[part] for p in rows) for part in PARTS}}
        out[kind]["total"] = sum(out[kind][part] for part in PARTS)
    out["measured_ms"] = sum(out[k]["total"] for k in KINDS) + timer.empty_schedule_ms + timer.other_take_ms
    for bid in sorted(timer.passes)[:ns.show_passes]:
        p = timer.passes[bid]
        out["first_passes"].append({"batch_id": bid, **p})
    return out


def median_report(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of every number over runs (pass counts must agree)."""
    def med(get: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(get(r) for r in runs)

    rep: dict[str, Any] = {k: med(lambda r, k=k: r[k]) for k in
                           ("wall_ms", "measured_ms", "empty_schedule_ms", "pre_first_pass_ms",
                            "add_request_ms",
                            "gc_ms")}
    rep.update(passes=runs[0]["passes"], empty_schedules=runs[0]["empty_schedules"],
               cached_tokens=runs[0]["cached_tokens"], runs=len(runs))
    for kind in KINDS:
        rep[kind] = {"passes": runs[0][kind]["passes"],
                     **{part: med(lambda r, kind=kind, part=part: r[kind][part])
                        for part in (*PARTS, "total")}}
    rep["first_passes"] = [
        {**p, **{part: statistics.median(r["first_passes"][i][part] for r in runs) for part in PARTS}}
        for i, p in enumerate(runs[0]["first_passes"])]
    return rep


def print_report(name: str, rep: dict[str, Any]) -> None:
    print(f"\n{name}: {rep['passes']} passes, {rep['empty_schedules']} empty schedule() calls, "
          f"cached tokens {rep['cached_tokens']}; host ms, median of {rep['runs']} runs")
    print(f"  {'kind':10s} {'passes':>6s} " + " ".join(f"{p:>9s}" for p in (*PARTS, "total")))
    for kind in KINDS:
        k = rep[kind]
        print(f"  {kind:10s} {k['passes']:6d} " + " ".join(f"{k[p]:9.2f}" for p in (*PARTS, "total")))
    print(f"  first passes:  {'id':>3s} {'batch':>5s} {'tokens':>6s} " + " ".join(f"{p:>9s}" for p in PARTS))
    for p in rep["first_passes"]:
        print(f"  {p['kind']:>13s}  {p['batch_id']:3d} {p['batch']:5d} {p['tokens']:6d} "
              + " ".join(f"{p[part]:9.2f}" for part in PARTS))
    print(f"  generate() before the first pass {rep['pre_first_pass_ms']:.2f} ms; add_request, all calls "
          f"{rep['add_request_ms']:.2f} ms; empty schedule() calls {rep['empty_schedule_ms']:.2f} ms")
    print(f"  measured (schedule+build+process+take) {rep['measured_ms']:.2f} ms; overall host "
          f"(workload wall time) {rep['wall_ms']:.2f} ms, of which cyclic GC pauses {rep['gc_ms']:.2f} ms")


# ---------------------------------------------------------------------------- fingerprint
def fingerprint(ns: argparse.Namespace, spec: WorkloadSpec) -> str:
    """sha256 over every pass's decisions and wire messages (ForwardBatch, TokenOutBatch), the final
    page refcounts and tree, and the cached tokens."""
    args = server_args(ns)
    eng = make_engine(args,
                      worker_info(ns.num_pages, ns.page_size, ns.max_running_requests, not ns.no_cascade))
    sched = eng.scheduler
    h = hashlib.sha256()
    schedule, take, build = sched.schedule, sched.take_outputs, pipeline_mod.build_forward_batch

    def digest(msg: Any) -> None:
        for f in dataclasses.fields(msg):
            v = getattr(msg, f.name)
            h.update(f.name.encode() + (v.tobytes() + str(v.dtype).encode() if isinstance(v, np.ndarray)
                                        else repr(v).encode()))

    def recorded() -> ScheduledBatch | None:
        sb = schedule()
        if sb is not None:
            h.update(repr((sb.batch_id, [(it.req.rid, it.start, it.extend_len, it.completes, it.is_prefill,
                                          it.out_pos, list(it.slots)) for it in sb.items], list(sb.cow_pairs),
                           None if sb.cascade is None else [a.tolist() for a in sb.cascade])).encode())
        return sb

    def recorded_build(sb: ScheduledBatch) -> ForwardBatch:
        fb = build(sb)
        digest(fb)
        return fb

    def recorded_take() -> Any:
        out, internal = take()
        if out is not None:
            digest(out)
        h.update(repr([r.rid for r in internal]).encode())
        return out, internal

    sched.schedule, sched.take_outputs = recorded, recorded_take
    pipeline_mod.build_forward_batch = recorded_build
    try:
        res = run_workload(eng, spec.build())
    finally:
        pipeline_mod.build_forward_batch = build
    alloc, cache = sched.kv._allocator, sched.kv._cache  # white box: the final pool and tree
    h.update(repr(([alloc.refcount(p) for p in range(1, alloc.num_pages)],
                   [alloc.reclaimable_refs(p) for p in range(1, alloc.num_pages)],
                   alloc.free_pages())).encode())
    h.update(repr(sorted((n.start, n.key, tuple(n.pages), n.lock_ref, n.last_access_time)
                         for n in cache.iter_nodes())).encode())
    h.update(repr((res["cached_tokens"], res["total_output_tokens"], cache.total_queried_tokens,
                   cache.total_matched_tokens, sched.stats())).encode())
    return (f"{h.hexdigest()[:16]} (passes {sched.next_batch_id}, retractions {sched.num_retractions}, "
            f"evicted tokens {cache.num_evicted_tokens}, cascade passes {sched.num_cascade_passes})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["shared-prefix", "random", "all"], default="all")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per workload (median reported)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--num-pages", type=int, default=1 << 17, help="KV pool pages (default: 2M tokens)")
    p.add_argument("--no-cascade", action="store_true", help="cascade grouping off (torch backend)")
    p.add_argument("--schedule-policy", choices=["lpm", "fcfs"], default="lpm")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument("--show-passes", type=int, default=4, help="print the first N passes one by one")
    p.add_argument("--profile", action="store_true", help="cProfile one extra run per workload")
    p.add_argument("--top", type=int, default=30, help="functions listed by --profile")
    p.add_argument("--fingerprint", action="store_true", help="print a digest of every decision and exit")
    p.add_argument("--json", default=None, help="write the reports here")
    p.add_argument("--no-gc", action="store_true",
                   help="Python's cyclic GC off while timing (isolates code costs from collection pauses)")
    ns = p.parse_args(argv)
    if ns.no_gc:
        gc.disable()
    names = ["shared-prefix", "random"] if ns.workload == "all" else [ns.workload]
    if ns.fingerprint:
        for name in names:
            print(f"{name}: {fingerprint(ns, workload_spec(name))}")
        return 0
    # warm-up: imports, first-call costs
    run_once(ns,
             WorkloadSpec(name="shared-prefix", prompts_per_group=8, system_prompt_len=256, question_len=16,
                              output_len=8, vocab_size=VOCAB))
    reports = {}
    for name in names:
        spec = workload_spec(name)
        reports[name] = median_report([run_once(ns, spec) for _ in range(ns.repeat)])
        print_report(name, reports[name])
        if ns.profile:
            prof = cProfile.Profile()
            run_once(ns, spec, prof)
            print(f"\ncProfile, {name}: top {ns.top} functions by own time")
            st = pstats.Stats(prof)
            rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])  # type: ignore[attr-defined]
            for (f, line, fn), (_cc, nc, tt, ct, _callers) in rows[:ns.top]:
                print(f"  {tt * 1e3:8.1f} ms own {ct * 1e3:8.1f} ms cum {nc:8d}x  "
                      f"{Path(f).name}:{line}({fn})")
    if ns.json:
        Path(ns.json).write_text(json.dumps(reports, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
