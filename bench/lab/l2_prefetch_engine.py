"""The batch-1 decode step with the L2 weight prefetch (radixrt/models/llama.py L2Prefetch) off and on,
bf16 and FP8 weights, engines kept alive in one process and timed in alternated rounds (issue 19).

    python3 bench/lab/l2_prefetch_engine.py [--rounds 4] [--budgets-mb 16,24,32]   # H200, ~3 min

Each engine captures its decode graphs with the prefetch setting it was built with (L2Prefetch's
class attributes, set before each Engine), on the dummy Qwen2.5-7B, 128-token prompt; step = time
per output token after the first (bench/gpu_engine.py decode_step_ms). Greedy tokens are compared
between each "on" engine and its "off" one (the prefetch changes no arithmetic).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from l2_prefetch_lab import log, run_header  # noqa: E402  (the lab's imports and kernels set-up)

from radixrt.models.llama import L2Prefetch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--budgets-mb", default="24")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "l2_prefetch_engine.json"))
    args = ap.parse_args()
    from bench.fp8_bench import model_dir
    from bench.gpu_engine import decode_step_ms
    from radixrt.engine import Engine

    path = model_dir("qwen2.5-7b")
    budgets = [int(b) for b in args.budgets_mb.split(",") if b]
    variants = []
    for quant in ("bf16", "fp8"):
        variants.append((f"{quant} off", quant, 0))
        variants += [(f"{quant} on {mb} MB", quant, mb) for mb in budgets]
    prompt = [[1000 + i for i in range(128)]]
    engines, out = {}, {"header": run_header(), "engines": {}}
    for name, quant, mb in variants:
        L2Prefetch.enabled = mb > 0
        L2Prefetch.budget_bytes = mb << 20
        kw = {"quantization": "fp8"} if quant == "fp8" else {}
        t = time.perf_counter()
        engines[name] = Engine(model_path=str(path), load_format="dummy", device="cuda",
                               max_running_requests=16, cuda_graph_max_bs=8, max_total_tokens=8192,
                               chunked_prefill_size=8192, **kw)
        tokens = engines[name].generate(prompt, {"temperature": 0.0, "max_new_tokens": 32,
                                                 "ignore_eos": True})[0]["output_ids"]
        out["engines"][name] = {"start_s": time.perf_counter() - t, "steps_ms": [], "tokens": tokens}
        log(f"engine {name} started in {out['engines'][name]['start_s']:.0f} s")
    L2Prefetch.enabled = False
    for r in range(args.rounds):
        for name, eng in engines.items():
            out["engines"][name]["steps_ms"].append(decode_step_ms(eng, 128, 128))
        log(f"round {r}: " + ", ".join(f"{n} {out['engines'][n]['steps_ms'][-1]:.3f}" for n in engines))
    base = {q: statistics.median(out["engines"][f"{q} off"]["steps_ms"]) for q in ("bf16", "fp8")}
    print("\n| engine | rounds (ms) | median | / same weights, off | / bf16 off |")
    print("|---|---|---|---|---|")
    for name, quant, _ in variants:
        e = out["engines"][name]
        e["median_ms"] = med = statistics.median(e["steps_ms"])
        e["tokens_equal_off"] = e["tokens"] == out["engines"][f"{quant} off"]["tokens"]
        rounds = ", ".join(f"{x:.3f}" for x in e["steps_ms"])
        print(f"| {name} | {rounds} | {med:.3f} | {med / base[quant]:.3f} | {med / base['bf16']:.3f} |")
    print("greedy tokens equal to the same weights without prefetch: "
          + ", ".join(f"{n} {out['engines'][n]['tokens_equal_off']}" for n, _, mb in variants if mb))
    for e in out["engines"].values():
        e.pop("tokens")
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    del engines
    gc.collect()
    torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
