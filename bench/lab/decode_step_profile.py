"""Where the batch-1 decode step goes, kernel by kernel: bf16 against FP8 weights (issue 19).

    python3 bench/lab/decode_step_profile.py --out $OUT/step_profile.json     # H200, ~2-3 min

Engines on the dummy Qwen2.5-7B (`--load-format dummy`), built one after another and kept alive:
bf16 and `--quantization fp8`, each captured with programmatic dependent launch (kernels/pdl.py) off
and on. For each engine the same 128-token prompt runs twice under torch.profiler (CUDA activity):
once for 1 output token and once for 1 + `--steps`. The kernels of the decode steps alone are the
difference of the two traces: per kernel name, calls and summed duration, divided by `--steps`.
A kernel's duration with PDL on includes its wait for the kernel before it, so the per-kernel table
is read from the PDL-off engines; PDL-on rows give the step's total. Also per engine: the step
measured without the profiler (bench/gpu_engine.py decode_step_ms, median of `--rounds`), the sum of
its kernels' durations per step, and the device span of the decode steps (first kernel start to last
kernel end of the longer run's decode region, per step) against that sum.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def kernels_of(fn: Any) -> list[dict[str, Any]]:
    """The CUDA kernels (name, ts us, dur us) that fn() ran, from a torch.profiler chrome trace."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    evs = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and "dur" in e]
    return sorted(({"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"])} for e in evs),
                  key=lambda e: e["ts"])


def by_name(kernels: list[dict[str, Any]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for k in kernels:
        out[k["name"]][0] += 1
        out[k["name"]][1] += k["dur"]
    return out


def short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config", default="qwen2.5-7b")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--engines", default="bf16 pdl off,bf16 pdl on,fp8 pdl off,fp8 pdl on")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default="step_profile.json")
    ns = p.parse_args(argv)
    from bench.fp8_bench import model_dir
    from bench.gpu_engine import decode_step_ms
    from radixrt.engine import Engine
    from radixrt.kernels import pdl

    path = model_dir(ns.model_config)
    prompt = [[1000 + i for i in range(128)]]
    res: dict[str, Any] = {"command": " ".join(sys.argv), "steps": ns.steps, "engines": {}}
    for name in [n.strip() for n in ns.engines.split(",") if n.strip()]:
        dtype, _, mode = name.partition(" pdl ")
        pdl.enabled = mode == "on"
        flags = {"quantization": "fp8"} if dtype == "fp8" else {}
        t = time.perf_counter()
        eng = Engine(model_path=str(path), load_format="dummy", device="cuda", max_running_requests=16,
                     cuda_graph_max_bs=8, max_total_tokens=8192, chunked_prefill_size=8192, **flags)
        print(f"{name}: started in {time.perf_counter() - t:.0f} s", flush=True)

        def run(n: int, eng: Any = eng) -> None:
            eng.generate(prompt, {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True})
            eng.scheduler.flush_cache()

        run(8)
        steps_ms = [decode_step_ms(eng, 128, 128) for _ in range(ns.rounds)]
        short_run = kernels_of(lambda: run(1))
        long_run = kernels_of(lambda: run(1 + ns.steps))
        a, b = by_name(short_run), by_name(long_run)
        per_step = []
        for k, (cnt, dur) in b.items():
            c0, d0 = a.get(k, (0, 0.0))
            if cnt - c0 > 0:
                per_step.append({"kernel": k, "calls": (cnt - c0) / ns.steps, "us": (dur - d0) / ns.steps,
                                 "us_per_call": (dur - d0) / (cnt - c0)})
        per_step.sort(key=lambda r: -r["us"])
        busy = sum(r["us"] for r in per_step)
        # the decode region of the long run: every kernel after the short run's kernel count
        region = long_run[len(short_run):]
        span = (region[-1]["ts"] + region[-1]["dur"] - region[0]["ts"]) / ns.steps if region else 0.0
        res["engines"][name] = {"step_ms": statistics.median(steps_ms), "steps_ms": steps_ms,
                                "kernel_us_per_step": busy, "span_us_per_step": span,
                                "kernels_per_step": sum(r["calls"] for r in per_step), "per_step": per_step}
        print(f"\n### {name}: step {statistics.median(steps_ms) * 1e3:.1f} us (no profiler), kernels "
              f"{busy:.1f} us/step in {res['engines'][name]['kernels_per_step']:.0f} launches, traced span "
              f"{span:.1f} us/step\n\n| kernel | calls/step | us/step | us/call |\n|---|---|---|---|")
        for r in per_step[:ns.top]:
            print(f"| {short(r['kernel'])} | {r['calls']:.2f} | {r['us']:.1f} | {r['us_per_call']:.2f} |")
        sys.stdout.flush()
        del eng
        torch.cuda.empty_cache()
    e = res["engines"]
    for mode in ("off", "on"):
        if f"bf16 pdl {mode}" in e and f"fp8 pdl {mode}" in e:
            r = e[f"fp8 pdl {mode}"]["step_ms"] / e[f"bf16 pdl {mode}"]["step_ms"]
            res[f"fp8_over_bf16_pdl_{mode}"] = r
            print(f"FP8 / bf16 step, PDL {mode}: {r:.3f}")
    Path(ns.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
