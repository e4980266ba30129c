"""One-call engine benchmark for a lent GPU: decode-step latency and offline workload throughput.

Runs, in one process and one `radixrt.Engine` (dummy weights of a real shape):
  1. ceilings: device copy bandwidth and bf16 matmul rate, measured here;
  2. batch-1 decode step (TPOT) with CUDA graphs, against the time to read the weights once, with
     the device time of a pass and the device idle time between passes (CUDA events);
  3. device idle time between decode passes at batch 128, overlap scheduling on and off;
  4. `random` (input/output lengths), `shared-prefix` and `multi-turn` workloads, the radix cache
     on and off (the same worker, a second scheduler built with the cache disabled), and on
     `shared-prefix` cascade attention off (on by default), each with its output tok/s, cache hit rate and
     fraction of the roofline (bench/roofline.py); on `random`, the KV waste (slots allocated to
     running requests but unused, summed over passes).
Results are appended to --out (JSON) after each stage, so a run cut short keeps what it finished;
the run ends with a table of the headline figures (`headline_figures`), which
`bench/compare_results.py` compares with bench/results/engine.md.

    python3 bench/gpu_engine.py --model-path bench/configs/qwen2.5-7b-instruct --out $OUT/engine.json
    python3 bench/gpu_engine.py --model-path <dir> --device cpu --small   # smoke test on a CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import measure_ceilings as common_ceilings  # noqa: E402
from bench.common import median as _median  # noqa: E402
from bench.common import run_header, write_json  # noqa: E402
from bench.offline import run_workload  # noqa: E402
from bench.roofline import Hardware, ModelShape, roofline  # noqa: E402
from bench.workloads import WorkloadSpec  # noqa: E402
from radixrt.engine import Engine  # noqa: E402
from radixrt.scheduler.batch import build_mode  # noqa: E402
from radixrt.scheduler.factory import build_scheduler  # noqa: E402


def measure_ceilings(device: str) -> Hardware:
    """Copy bandwidth (bytes read + written per s, 2 GiB) and bf16 matmul FLOP/s, medians of CUDA
    events, freed before the engine sizes its KV pool; fixed stand-ins on a CPU."""
    if device != "cuda":
        return Hardware(copy_bytes_per_s=1e10, matmul_flops_per_s=1e11)
    c = common_ceilings(copy_gib=2, warmup=50, rep=300)
    return Hardware(copy_bytes_per_s=c["copy_bytes_per_s"], matmul_flops_per_s=c["matmul_flops_per_s"])


def traced(engine: Engine, fn: Any) -> tuple[Any, list[dict[str, Any]]]:
    """fn()'s result and the Engine's per-pass trace over it (mode, tokens, device busy and idle
    time, host times per pass), recorded by a PassTrace hook on the Engine's pipeline."""
    trace = PassTrace(engine)
    try:
        result = fn()
    finally:
        rows = trace.stop()
    return result, rows


class PassTrace:
    """Records the engine's passes through a pipeline hook, one dict per pass (keys as read by
    trace_summary / pass_rows / print_passes); `stop()` unregisters it and returns the rows."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.recs = engine, []
        self._remove = engine.pipeline.add_pass_hook(self._on_pass)

    def _on_pass(self, rec: Any) -> None:  # before the result is processed: KV as the pass left it
        s = self.engine.scheduler.stats()
        self.recs.append((rec, s["running_kv_slots_allocated"], s["running_kv_slots_unused"]))

    def stop(self) -> list[dict[str, Any]]:
        self._remove()
        return [{"batch_size": len(r.sb), "mode": int(build_mode(r.sb)), "busy_ms": r.busy_ms,
                 "gap_ms": r.gap_ms, "cascade": r.sb.cascade is not None,
                 "path": getattr(r.handle, "path", None),
                 "kv_slots_allocated": alloc, "kv_slots_unused": unused, "wait_ms": r.wait_ms, "t_s": r.t_s,
                 "num_tokens": r.num_tokens, "schedule_ms": r.schedule_ms, "build_ms": r.build_ms,
                 "launch_ms": r.launch_ms, "process_ms": r.process_ms} for r, alloc, unused in self.recs]


def trace_summary(trace: list[dict[str, Any]], decode_only: bool = True) -> dict[str, Any]:
    """Device busy and idle time over the traced passes (DECODE passes only by default)."""
    rows = [t for t in trace if not decode_only or t["mode"] == 2]
    busy = sum(t["busy_ms"] for t in rows)
    gap = sum(t["gap_ms"] for t in rows if t["gap_ms"] >= 0)
    alloc = sum(t["kv_slots_allocated"] for t in trace)
    return {"passes": len(rows), "busy_ms_median": _median([t["busy_ms"] for t in rows]),
            "gap_ms_median": _median([t["gap_ms"] for t in rows if t["gap_ms"] >= 0]),
            "busy_ms_total": busy, "gap_ms_total": gap,
            "idle_fraction": gap / (busy + gap) if busy + gap > 0 else None,
            "cascade_passes": sum(t["cascade"] for t in trace),
            "paths": {p: sum(t["path"] == p for t in trace) for p in sorted({t["path"] for t in trace})},
            "decode_busy_ms_median": _median([t["busy_ms"] for t in trace if t["mode"] == 2]),
            "kv_waste_fraction": sum(t["kv_slots_unused"] for t in trace) / alloc if alloc else None}


def pass_rows(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-pass trace, times rounded, `t_s` made relative to the first pass's schedule call."""
    t0 = min((t["t_s"] for t in trace if "t_s" in t), default=0.0)
    return [{k: round(v - t0 if k == "t_s" else v, 4) if isinstance(v, float) else v for k, v in t.items()}
            for t in trace]


def print_passes(rows: list[dict[str, Any]], limit: int = 12) -> None:
    """The first passes and every pass with device idle before it above 0.5 ms."""
    keys = ("t_s", "mode", "batch_size", "num_tokens", "path", "busy_ms", "gap_ms", "schedule_ms", "build_ms",
            "launch_ms", "wait_ms", "process_ms")
    print("  " + " ".join(f"{k:>11s}" for k in keys), flush=True)
    for i, r in enumerate(rows):
        if i < limit or r.get("gap_ms", 0) > 0.5:
            print(f"  {i:3d} " + " ".join(f"{r.get(k, ''):>11}" if not isinstance(r.get(k), float)
                                          else f"{r[k]:11.3f}" for k in keys), flush=True)


def kernel_rows(prof: Any, name_len: int) -> list[dict[str, Any]]:
    """A torch.profiler run's kernels with device time: name, calls, device_us_total; longest first."""
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append({"name": e.key[:name_len], "calls": e.count, "device_us_total": t})
    return sorted(rows, key=lambda r: -r["device_us_total"])


def profile_kernels(engine: Engine, spec: WorkloadSpec, cascade: bool, top: int = 18) -> list[dict[str, Any]]:
    """Device time per kernel name over one run of `spec` (cache on), under torch.profiler
    (kernels replayed inside CUDA graphs included). The run is extra: it is not a measured result."""
    from torch.profiler import ProfilerActivity, profile

    args = dataclasses.replace(engine.args, disable_radix_cache=False, disable_cascade_attention=not cascade)
    engine.scheduler = build_scheduler(args, engine.info)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_workload(engine, spec.build())
        torch.cuda.synchronize()
    rows = kernel_rows(prof, 100)
    print(f"kernels, {spec.name} cascade={'on' if cascade else 'off'}: "
          f"{sum(r['device_us_total'] for r in rows) / 1e3:.1f} ms device in all", flush=True)
    for r in rows[:top]:
        print(f"  {r['device_us_total'] / 1e3:9.3f} ms {r['calls']:7d}x "
              f"{r['device_us_total'] / r['calls']:9.1f} us"
              f"  {r['name']}", flush=True)
    return rows[:40]


def cprofile_host(engine: Engine, spec: WorkloadSpec, top: int = 30) -> list[dict[str, Any]]:
    """Host time by Python function over one extra run of `spec` (cache on), under cProfile: where
    the scheduler, the batch build and the launches spend their time (cProfile slows Python ~1.5-2x)."""
    import cProfile
    import pstats

    engine.scheduler = build_scheduler(dataclasses.replace(engine.args, disable_radix_cache=False,
                                                           disable_cascade_attention=True), engine.info)
    prof = cProfile.Profile()
    prof.enable()
    run_workload(engine, spec.build())
    prof.disable()
    st = pstats.Stats(prof)
    rows = [{"function": f"{Path(f).name}:{line}({fn})", "calls": nc, "tottime_ms": tt * 1e3,
             "cumtime_ms": ct * 1e3}
            for (f, line, fn), (_cc, nc, tt, ct, _callers) in st.stats.items()]  # type: ignore[attr-defined]
    rows.sort(key=lambda r: -r["tottime_ms"])
    print(f"host profile, {spec.name}: top functions by own time", flush=True)
    for r in rows[:top]:
        print(f"  {r['tottime_ms']:9.1f} ms own {r['cumtime_ms']:9.1f} ms cum {r['calls']:8d}x  "
              f"{r['function']}",
              flush=True)
    return rows[:60]


def idle_at_batch(engine: Engine, batch: int, small: bool) -> list[dict[str, Any]]:
    """Decode at `batch` requests, overlap scheduling on then off: device idle between passes."""
    prompts = [[1000 + 7 * i + j for j in range(32 if small else 128)] for i in range(batch)]
    params = {"temperature": 0.0, "max_new_tokens": 16 if small else 256, "ignore_eos": True}
    out = []
    for overlap in (True, False):
        engine.overlap = overlap
        engine.generate(prompts[:2], {**params, "max_new_tokens": 4})  # warm-up
        engine.scheduler.flush_cache()
        t = time.perf_counter()
        _, trace = traced(engine, lambda: engine.generate(prompts, params))
        wall = time.perf_counter() - t
        summary = trace_summary(trace)
        engine.scheduler.flush_cache()
        out.append({"overlap": overlap, "batch": batch, "wall_s": wall,
                    "output_tok_s": batch * params["max_new_tokens"] / wall, **summary})
    engine.overlap = True
    return out


def profile_decode_b1(engine: Engine, prompt_len: int = 128) -> dict[str, Any]:
    """Where a batch-1 decode pass spends device time: the CUDA-graph replay alone (events), and a
    torch.profiler table of one eager pass's kernels (graphs off), grouped by kernel name."""
    runner = engine.runner
    prompt = [1000 + i for i in range(prompt_len)]
    engine.generate([prompt], {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True})
    out: dict[str, Any] = {}
    key = None if runner.graphs is None else (1, runner.graphs.graph_key(1, prompt_len + 4))
    if key in getattr(runner.graphs, "graphs", {}):
        g = runner.graphs.graphs[key]  # the graph a batch-1 step at this length replays
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(30):
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        out["graph_replay_ms_median"] = _median(times)
    graphs, runner.graphs = runner.graphs, None
    try:
        from torch.profiler import ProfilerActivity, profile

        engine.generate([prompt], {"temperature": 0.0, "max_new_tokens": 3, "ignore_eos": True})  # warm
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.generate([prompt], {"temperature": 0.0, "max_new_tokens": 3, "ignore_eos": True})
        torch.cuda.synchronize()
        rows = kernel_rows(prof, 90)
        out["eager_kernels_top"] = rows[:30]
        out["eager_kernel_us_total"] = sum(r["device_us_total"] for r in rows)
        out["eager_kernel_calls"] = sum(r["calls"] for r in rows)
        out["note"] = "eager profile covers 1 prefill + 2 decode passes of one request"
    finally:
        runner.graphs = graphs
        engine.scheduler.flush_cache()
    return out


def decode_step_ms(engine: Engine, prompt_len: int, steps: int) -> float:
    """Batch-1 time per output token after the first (ms), from two runs of different length."""
    prompt = [[1000 + i for i in range(prompt_len)]]

    def run(n: int) -> float:
        t = time.perf_counter()
        engine.generate(prompt, {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True})
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - t

    run(4)  # warm-up: kernels compiled, graphs already captured
    engine.scheduler.flush_cache()
    t1 = run(1)
    engine.scheduler.flush_cache()
    tn = run(steps + 1)
    engine.scheduler.flush_cache()
    return (tn - t1) / steps * 1e3


def workloads(small: bool, vocab: int) -> list[WorkloadSpec]:
    lo = min(1000, vocab // 2)
    if small:
        return [WorkloadSpec(name="random", num_prompts=8, input_len=64, output_len=8, vocab_size=vocab,
                             min_token_id=lo),
                WorkloadSpec(name="shared-prefix", prompts_per_group=8, system_prompt_len=128,
                             question_len=16,
                             output_len=8, vocab_size=vocab, min_token_id=lo),
                WorkloadSpec(name="multi-turn", num_clients=2, num_turns=3, input_len=64, turn_len=16,
                             output_len=8, vocab_size=vocab, min_token_id=lo)]
    return [WorkloadSpec(name="random", num_prompts=256, input_len=512, output_len=256, vocab_size=vocab),
            WorkloadSpec(name="shared-prefix", num_groups=1, prompts_per_group=128, system_prompt_len=2048,
                         question_len=128, output_len=64, vocab_size=vocab),
            WorkloadSpec(name="multi-turn", num_clients=16, num_turns=4, input_len=1024, turn_len=128,
                         output_len=64, vocab_size=vocab)]


def bench_workload(engine: Engine, spec: WorkloadSpec, cache_on: bool, shape: ModelShape,
                   hw: Hardware, cascade: bool = True) -> dict[str, Any]:
    args = dataclasses.replace(engine.args, disable_radix_cache=not cache_on,
                               disable_cascade_attention=not cascade)
    engine.scheduler = build_scheduler(args, engine.info)  # same worker, fresh tree
    res, trace = traced(engine, lambda: run_workload(engine, spec.build()))
    res["trace"] = trace_summary(trace, decode_only=False)
    res["passes"] = pass_rows(trace)
    reuse = "compute" if cache_on else "none"
    bound = roofline(shape, hw, spec.build(), reuse)
    res.update(cache_on=cache_on, cascade=cascade, roofline=bound,
               fraction_of_roofline=bound["total_s"] / res["wall_s"] if "total_s" in bound else None)
    res.pop("kv_stats", None)
    return res


def _cascade_overrides(tile: str | None, splits: int | None) -> dict[str, Any]:
    """Patch the cascade prefix tile / split count before the Engine captures its graphs (bench only)."""
    import radixrt.kernels.cascade_attention as ca
    import radixrt.worker.attention_triton as at

    out: dict[str, Any] = {}
    if tile:
        t = ca.CascadeTile(*(int(v) for v in tile.split(",")))
        ca.default_tile = at.default_tile = lambda head_dim, device, t=t: t
        out["tile"] = [t.block_m, t.block_n, t.num_warps, t.num_stages]
    if splits:
        at.choose_num_prefix_splits = lambda *a, n=splits, **k: n
        out["prefix_splits"] = splits
    return out


def bench_decode_b1(engine: Engine, hw: Hardware, small: bool) -> dict[str, Any]:
    """Batch-1 TPOT with overlap on and off, with device busy / idle per pass, against reading the
    weights (embeddings excluded) once at the copy ceiling."""
    weight_bytes = sum(p.numel() * p.element_size() for n, p in engine.runner.model.named_parameters()
                       if "embed_tokens" not in n)
    b1 = {}
    for overlap in (True, False):
        engine.overlap = overlap
        step, trace = traced(engine, lambda: decode_step_ms(engine, 128, 16 if small else 128))
        b1["overlap" if overlap else "no_overlap"] = {"ms_per_token": step, **trace_summary(trace)}
    engine.overlap = True
    out = {**b1, "ms_per_token": b1["overlap"]["ms_per_token"], "weight_bytes": weight_bytes,
           "weights_read_ms": weight_bytes / hw.copy_bytes_per_s * 1e3}
    print(f"batch-1 decode: {b1['overlap']['ms_per_token']:.2f} ms/token (overlap off "
          f"{b1['no_overlap']['ms_per_token']:.2f}); device busy per pass "
          f"{b1['overlap']['busy_ms_median']:.2f} ms, idle between passes "
          f"{b1['overlap']['gap_ms_median']:.3f} ms; weights once at copy bandwidth: "
          f"{out['weights_read_ms']:.2f} ms", flush=True)
    return out


def print_profile_b1(prof: dict[str, Any]) -> None:
    print(f"graph replay alone (batch 1): {prof.get('graph_replay_ms_median')} ms; eager kernels "
          f"{prof['eager_kernel_calls']} calls, {prof['eager_kernel_us_total'] / 1e3:.2f} ms device",
          flush=True)
    for r in prof["eager_kernels_top"][:25]:
        print(f"  {r['device_us_total'] / 1e3:8.3f} ms {r['calls']:6d}x  {r['name']}", flush=True)


def print_idle(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        print(f"batch {r['batch']} overlap={'on ' if r['overlap'] else 'off'}: {r['output_tok_s']:8.0f} "
              f"tok/s, device idle {r['idle_fraction']:.1%} (median gap {r['gap_ms_median']:.3f} ms, "
              f"busy {r['busy_ms_median']:.2f} ms)", flush=True)


def print_workload_row(spec: WorkloadSpec, r: dict[str, Any]) -> None:
    tr = r["trace"]
    print(f"{spec.name:14s} cache={'on ' if r['cache_on'] else 'off'} "
          f"cascade={'on ' if r['cascade'] else 'off'} "
          f"{r['wall_s']:7.2f} s {r['output_throughput']:9.0f} out tok/s  hit {r['cache_hit_rate']:.2f}  "
          f"roofline {r.get('fraction_of_roofline') or 0:.2f}  cascade passes {tr['cascade_passes']}  "
          f"kv waste {tr['kv_waste_fraction'] or 0:.2%}  ok={r['token_counts_consistent']}  "
          f"decode pass {tr['decode_busy_ms_median'] or 0:.2f} ms  paths {tr['paths']}", flush=True)
    if spec.name == "shared-prefix" and r["cache_on"]:
        print_passes(r["passes"])


def bench_spec(engine: Engine, spec: WorkloadSpec, repeat: int, shape: ModelShape, hw: Hardware,
               report: dict[str, Any], save: Any) -> None:
    """One workload: a warm-up at the same shapes, the default configuration (cache and cascade on)
    `repeat` times with its median, then one run with the cache off (not on `random`) and, on
    `shared-prefix`, one with cascade attention off."""
    run_workload(engine, dataclasses.replace(spec, num_prompts=min(spec.num_prompts, 4), prompts_per_group=4,
                                             num_clients=1, output_len=2).build())
    engine.scheduler.flush_cache()  # (kernels first used by this workload compiled in the warm-up)
    variants = [(True, True)] if spec.name == "random" else [(True, True), (False, True)]
    if spec.name == "shared-prefix":
        variants.append((True, False))
    for cache_on, cascade in variants:
        runs = []
        for i in range(max(1, repeat) if (cache_on and cascade) else 1):
            r = bench_workload(engine, spec, cache_on, shape, hw, cascade)
            r["repeat"] = i
            runs.append(r)
            report["results"].append(r)
            save()
            print_workload_row(spec, r)
        if len(runs) > 1:
            tput = sorted(x["output_throughput"] for x in runs)
            med = tput[len(tput) // 2]
            report.setdefault("medians", {})[f"{spec.name} cache={cache_on} cascade={cascade}"] = med
            print(f"{spec.name:14s} median of {len(runs)} runs: {med:.0f} out tok/s "
                  f"(runs: {', '.join(f'{x:.0f}' for x in tput)})", flush=True)


def headline_figures(report: dict[str, Any]) -> dict[str, float]:
    """The figures of bench/results/engine.md that this run measured, under the names used there."""
    out: dict[str, float] = {}
    b1 = report.get("decode_b1")
    if b1:
        out["batch-1 TPOT overlap on"] = b1["overlap"]["ms_per_token"]
        out["batch-1 TPOT overlap off"] = b1["no_overlap"]["ms_per_token"]
        if b1["overlap"].get("busy_ms_median") is not None:
            out["batch-1 device time per pass"] = b1["overlap"]["busy_ms_median"]
        out["weights read once at copy bandwidth"] = b1["weights_read_ms"]
    if (report.get("profile_b1") or {}).get("graph_replay_ms_median") is not None:
        out["batch-1 graph replay"] = report["profile_b1"]["graph_replay_ms_median"]
    for name in ("random", "shared-prefix", "multi-turn"):
        med = report.get("medians", {}).get(f"{name} cache=True cascade=True")
        if med is not None:
            out[f"{name} tok/s"] = med
        for r in report["results"]:
            if r["workload"]["name"] != name:
                continue
            if not r["cache_on"]:
                out[f"{name} cache off tok/s"] = r["output_throughput"]
            elif not r["cascade"]:
                out[f"{name} cascade off tok/s"] = r["output_throughput"]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default="bench/configs/qwen2.5-7b-instruct")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="tiny workloads (CPU smoke test)")
    p.add_argument("--only", default="profile,idle,random,shared-prefix,multi-turn",
                   help="stages, comma-separated; add `kernels` for a profiler table of shared-prefix")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of each workload's default configuration (cache and cascade on); each is "
                        "reported, and their median (host-side noise on the GPU machine moves single runs)")
    p.add_argument("--cascade-tile", default=None, metavar="BM,BN,WARPS,STAGES",
                   help="override the cascade prefix-stage tile (an A/B of tiles under real L2 traffic)")
    p.add_argument("--cascade-prefix-splits", type=int, default=None, help="override the prefix split count")
    p.add_argument("--out", default="engine.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    stages = ns.only.split(",")
    overrides = _cascade_overrides(ns.cascade_tile, ns.cascade_prefix_splits)
    report: dict[str, Any] = {**run_header(ns.device), "model_path": ns.model_path, "results": [],
                              "command": " ".join(sys.argv), "cascade_overrides": overrides}

    def save() -> None:
        write_json(ns.out, report)

    hw = measure_ceilings(ns.device)
    report["ceilings"] = {"copy_bytes_per_s": hw.copy_bytes_per_s,
                          "matmul_flops_per_s": hw.matmul_flops_per_s}
    t = time.perf_counter()
    engine = Engine(model_path=ns.model_path, load_format=ns.load_format, device=ns.device,
                    max_running_requests=256, chunked_prefill_size=8192, cuda_graph_max_bs=256,
                    max_total_tokens=None if ns.device == "cuda" else 65536)
    report["engine_start_s"] = time.perf_counter() - t
    report["worker_info"] = engine.info
    save()
    shape = ModelShape.from_config(Path(engine.model_dir) / "config.json")
    report["decode_b1"] = bench_decode_b1(engine, hw, ns.small)
    save()
    if "profile" in stages and ns.device == "cuda":
        report["profile_b1"] = profile_decode_b1(engine)
        print_profile_b1(report["profile_b1"])
        save()
    if "idle" in stages:
        report["idle_b128"] = idle_at_batch(engine, 8 if ns.small else 128, ns.small)
        print_idle(report["idle_b128"])
        save()
    for spec in workloads(ns.small, int(engine.info["vocab_size"])):
        if spec.name not in stages:
            continue
        bench_spec(engine, spec, ns.repeat, shape, hw, report, save)
        if spec.name == "shared-prefix" and "kernels" in stages and ns.device == "cuda":
            report[f"kernels_{spec.name}"] = {c: profile_kernels(engine, spec, c == "cascade")
                                              for c in ("plain", "cascade")}
            report[f"host_profile_{spec.name}"] = cprofile_host(engine, spec)
            save()
    report["headline"] = figures = headline_figures(report)
    save()
    print("\n| figure | value |\n|---|---|\n" + "\n".join(f"| {k} | {v:.2f} |" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
