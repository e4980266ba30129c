"""Where the `shared-prefix` decode pass goes, kernel by kernel (issue 19 part 4: `shared-prefix` at
~0.76 of the bound where each decode step reads the shared prefix once; the whole gap is in the
batch-128 decode pass, 6.2-6.4 ms against ~3.7).

    python3 bench/lab/shared_prefix_pass.py --out $OUT/sp_pass.json     # H200, ~3 min

One Engine on the dummy Qwen2.5-7B (bf16), configured as bench/gpu_engine.py's (256 running requests,
chunk 8,192, graphs to batch 256). The workload's shape: 128 prompts of one 2,048-token system prompt
and 128 own tokens each. Each mode (cascade attention on, then off) runs the prompts twice under
torch.profiler (CUDA activity; kernels replayed from CUDA graphs included), for 2 and for 2 + `--steps`
output tokens, the cache flushed before each: the prefills are the same, so the kernels of `--steps`
batch-128 decode passes are the difference of the two traces (calls and summed duration per kernel
name, divided by `--steps`). Kernels are grouped (GEMM, attention, norm, rotary, SiLU, K/V store,
the rest). Prints tables; writes JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lab.decode_step_profile import by_name, kernels_of, short  # noqa: E402

GROUPS = (("attention", ("cascade", "decode", "merge", "_attn")), ("norm", ("rms",)),
          ("rotary", ("rotary", "rope")), ("silu", ("silu",)), ("kv store", ("store_kv", "_store")),
          ("gemm", ("gemm", "gemv", "sm90", "cutlass", "xmma", "cublas", "nvjet", "skinny")))


def group_of(name: str, calls: float) -> str:
    if abs(calls - round(calls)) > 0.05:
        return "prefill residue"
    low = name.lower()
    for group, keys in GROUPS:
        if any(k in low for k in keys):
            return group
    return "other"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config", default="qwen2.5-7b")
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--system-len", type=int, default=2048)
    p.add_argument("--question-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--modes", default="cascade,plain")
    p.add_argument("--top", type=int, default=24)
    p.add_argument("--out", default="sp_pass.json")
    ns = p.parse_args(argv)
    from bench.fp8_bench import model_dir
    from radixrt.engine import Engine
    from radixrt.scheduler.factory import build_scheduler

    path = model_dir(ns.model_config)
    t = time.perf_counter()
    eng = Engine(model_path=str(path), load_format="dummy", device="cuda", max_running_requests=256,
                 chunked_prefill_size=8192, cuda_graph_max_bs=256)
    print(f"engine started in {time.perf_counter() - t:.0f} s", flush=True)
    system = [1000 + i for i in range(ns.system_len)]
    gen = torch.Generator().manual_seed(0)
    prompts = [system + (torch.randint(5000, 30000, (ns.question_len,), generator=gen)).tolist()
               for _ in range(ns.prompts)]
    res: dict[str, Any] = {"command": " ".join(sys.argv), "steps": ns.steps, "prompts": ns.prompts,
                           "modes": {}}
    for mode in [m.strip() for m in ns.modes.split(",") if m.strip()]:
        args = dataclasses.replace(eng.args, disable_radix_cache=False,
                                   disable_cascade_attention=mode != "cascade")
        eng.scheduler = build_scheduler(args, eng.info)

        def run(n: int) -> float:
            eng.scheduler.flush_cache()
            t0 = time.perf_counter()
            eng.generate(prompts, {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True})
            return time.perf_counter() - t0

        run(4)  # compile / capture at these shapes
        wall = [run(2), run(2 + ns.steps)]
        short_run = kernels_of(lambda: run(2))
        long_run = kernels_of(lambda: run(2 + ns.steps))
        a, b = by_name(short_run), by_name(long_run)
        rows = []
        for k, (cnt, dur) in b.items():
            c0, d0 = a.get(k, (0, 0.0))
            if cnt - c0 > 0 and dur - d0 > 0:
                calls = (cnt - c0) / ns.steps
                rows.append({"kernel": k, "group": group_of(k, calls), "calls": calls,
                             "us": (dur - d0) / ns.steps, "us_per_call": (dur - d0) / (cnt - c0)})
        rows.sort(key=lambda r: -r["us"])
        groups: dict[str, float] = {}
        for r in rows:
            groups[r["group"]] = groups.get(r["group"], 0.0) + r["us"]
        busy = sum(us for g, us in groups.items() if g != "prefill residue")
        per_pass_wall = (wall[1] - wall[0]) / ns.steps * 1e3
        res["modes"][mode] = {"kernel_us_per_pass": busy, "groups_us": groups, "rows": rows,
                              "wall_ms_per_pass_unprofiled": per_pass_wall}
        print(f"\n### {mode}: decode kernels {busy:.0f} us per decode pass (batch {ns.prompts}); wall "
              f"without the profiler {per_pass_wall:.2f} ms per pass\n\n"
              "| group | us per pass | share |\n|---|---|---|")
        for g, us in sorted(groups.items(), key=lambda kv: -kv[1]):
            share = f"{us / busy:.1%}" if g != "prefill residue" else ""
            print(f"| {g} | {us:.1f} | {share} |")
        print("\n| kernel | group | calls/pass | us/pass | us/call |\n|---|---|---|---|---|")
        for r in rows[:ns.top]:
            print(f"| {short(r['kernel'], 70)} | {r['group']} | {r['calls']:.2f} | {r['us']:.1f} | "
                  f"{r['us_per_call']:.2f} |")
        sys.stdout.flush()
    Path(ns.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
