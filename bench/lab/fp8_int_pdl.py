"""FP8 int GEMV configs under programmatic dependent launch: the batch-1 decode step of FP8 engines whose
FP8_INT_TUNED entries for the Qwen2.5-7B linears at M = 1 take larger first chunks (loaded before the
PDL wait, kernels/pdl.py), against the committed table and a bf16 engine, alternated in one process.

    python3 bench/lab/fp8_int_pdl.py --out fp8-int-pdl.json     # ~2 min on an H200

Variants: "table" (FP8_INT_TUNED as committed), "qkv_o_1024" (qkv and o as 4 x 1024: a program's
whole K range, 896 words, is one chunk, all of it in flight before the wait), "all_big" (that, and
gate_up 8 x 512, down 4 x 1024). Each engine is built with its variant installed (its decode graphs
keep the configs); greedy tokens are compared with the "table" engine's on the same prompt.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

VARIANTS = {
    "table": {},
    "qkv_o_1024": {(1, 4608, 3584): (4, 1024), (1, 3584, 3584): (4, 1024)},
    "all_big": {(1, 4608, 3584): (4, 1024), (1, 3584, 3584): (4, 1024), (1, 37888, 3584): (8, 512),
                (1, 3584, 18944): (4, 1024)},
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default="fp8-int-pdl.json")
    ns = p.parse_args()
    from bench.fp8_bench import model_dir
    from bench.gpu_engine import decode_step_ms
    from radixrt.engine import Engine
    from radixrt.kernels import gemv_fp8_int

    path = model_dir("qwen2.5-7b")
    committed = dict(gemv_fp8_int.FP8_INT_TUNED)
    prompt = [[1000 + i for i in range(128)]]
    greedy = {"temperature": 0.0, "max_new_tokens": 32, "ignore_eos": True}
    engines, res = {}, {}
    for name, flags, variant in [("bf16", {}, {})] + [(f"fp8 {v}", {"quantization": "fp8"}, VARIANTS[v])
                                                      for v in VARIANTS]:
        gemv_fp8_int.FP8_INT_TUNED.clear()
        gemv_fp8_int.FP8_INT_TUNED.update(committed)
        gemv_fp8_int.FP8_INT_TUNED.update({k: gemv_fp8_int.Fp8IntConfig(*v) for k, v in variant.items()})
        t = time.perf_counter()
        eng = Engine(model_path=str(path), load_format="dummy", device="cuda", max_running_requests=16,
                     cuda_graph_max_bs=8, max_total_tokens=8192, chunked_prefill_size=8192, **flags)
        engines[name] = eng
        res[name] = {"start_s": time.perf_counter() - t, "steps_ms": [],
                     "tokens": eng.generate(prompt, greedy)[0]["output_ids"], "variant": repr(variant)}
        print(f"{name}: started in {res[name]['start_s']:.0f} s", flush=True)
    for r in range(ns.rounds):
        for name, eng in engines.items():
            res[name]["steps_ms"].append(decode_step_ms(eng, 128, 128))
        print(f"round {r}: " + ", ".join(f"{n} {v['steps_ms'][-1]:.3f}" for n, v in res.items()), flush=True)
    bf16 = statistics.median(res["bf16"]["steps_ms"])
    print("\n| engine | batch-1 step ms (median) | / bf16 | greedy tokens = fp8 table |")
    print("|---|---|---|---|")
    for name, v in res.items():
        v["median_ms"] = statistics.median(v["steps_ms"])
        same = v["tokens"] == res["fp8 table"]["tokens"] if name != "bf16" else ""
        print(f"| {name} | {v['median_ms']:.3f} | {v['median_ms'] / bf16:.3f} | {same} |")
    for v in res.values():
        v.pop("tokens")
    Path(ns.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
