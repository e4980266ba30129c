"""Programmatic dependent launch (kernels/pdl.py) off against on: the batch-1 decode step of bf16 and
FP8 engines, side by side in one process.

Four Engines on the dummy Qwen2.5-7B (`--load-format dummy`), built one after another and kept
alive: bf16 and `--quantization fp8`, each with `kernels.pdl.enabled` False and True while it
captures its decode CUDA graphs (the graphs keep the launch mode they were captured with). Then
`--rounds` rounds, each measuring every engine's batch-1 step in turn (bench/gpu_engine.py
decode_step_ms: 128-token prompt, time per token over `--steps` tokens, from two runs of different
length), so that clock drift hits all four alike. Prints the medians, PDL on / off per dtype, FP8 /
bf16 per launch mode, and each step against reading the weights once (embeddings excluded) at the
copy bandwidth measured here first (2 GiB copies, median of CUDA events). Greedy tokens of each
PDL-on engine are checked equal to its PDL-off twin's on the same prompt.

    python3 bench/pdl_bench.py --out pdl.json      # ~2-3 min on an H200
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config", default="qwen2.5-7b")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--out", default="pdl.json")
    ns = p.parse_args(argv)
    from bench.common import measure_ceilings as common_ceilings
    from bench.fp8_bench import model_dir
    from bench.gpu_engine import decode_step_ms
    from radixrt.engine import Engine
    from radixrt.kernels import pdl

    path = model_dir(ns.model_config)
    copy = common_ceilings(copy_gib=2, warmup=50, rep=300)["copy_bytes_per_s"]
    print(f"copy bandwidth {copy / 1e12:.3f} TB/s (read + written)", flush=True)
    engines: dict[str, Any] = {}
    res: dict[str, Any] = {"command": " ".join(sys.argv), "copy_bytes_per_s": copy, "engines": {}}
    prompt = [[1000 + i for i in range(128)]]
    greedy = {"temperature": 0.0, "max_new_tokens": 32, "ignore_eos": True}
    for dtype, flags in (("bf16", {}), ("fp8", {"quantization": "fp8"})):
        for on in (False, True):
            name = f"{dtype} pdl {'on' if on else 'off'}"
            pdl.enabled = on
            t = time.perf_counter()
            eng = Engine(model_path=str(path), load_format="dummy", device="cuda", max_running_requests=16,
                         cuda_graph_max_bs=8, max_total_tokens=8192, chunked_prefill_size=8192, **flags)
            weight_bytes = sum(q.numel() * q.element_size() for n, q in eng.runner.model.named_parameters()
                               if "embed_tokens" not in n)
            engines[name] = eng
            res["engines"][name] = {"start_s": time.perf_counter() - t, "weight_bytes": weight_bytes,
                                    "weights_read_ms": weight_bytes / copy * 1e3, "steps_ms": [],
                                    "tokens": eng.generate(prompt, greedy)[0]["output_ids"]}
            print(f"{name}: started in {res['engines'][name]['start_s']:.0f} s, weights "
                  f"{weight_bytes / 1e9:.2f} GB", flush=True)
    pdl.enabled = True
    for r in range(ns.rounds):
        for name, eng in engines.items():
            res["engines"][name]["steps_ms"].append(decode_step_ms(eng, 128, ns.steps))
        print(f"round {r}: " + ", ".join(f"{n} {e['steps_ms'][-1]:.3f}" for n, e in res["engines"].items()),
              flush=True)
    e = res["engines"]
    for n, v in e.items():
        twin = e[n.split(" pdl")[0] + " pdl off"]
        v["tokens_equal_pdl_off"] = v["tokens"] == twin["tokens"]
        v["over_pdl_off"] = statistics.median(v["steps_ms"]) / statistics.median(twin["steps_ms"])
    for v in e.values():
        v["median_ms"] = statistics.median(v["steps_ms"])
        v["over_weights_read"] = v["median_ms"] / v["weights_read_ms"]
    print("\n| engine | batch-1 step ms (median of rounds) | / PDL off | / weights read once "
          "| weights read ms | greedy tokens = PDL off |")
    print("|---|---|---|---|---|---|")
    for n, v in e.items():
        print(f"| {n} | {v['median_ms']:.3f} | {v['over_pdl_off']:.3f} | {v['over_weights_read']:.3f} | "
              f"{v['weights_read_ms']:.3f} | {v['tokens_equal_pdl_off']} |")
    ratios = {f"fp8 / bf16, {m}": e[f"fp8 {m}"]["median_ms"] / e[f"bf16 {m}"]["median_ms"]
              for m in (n.split(" ", 1)[1] for n in e if n.startswith("bf16 "))}
    res["ratios"] = ratios
    print()
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    for v in e.values():
        v.pop("tokens")
    Path(ns.out).write_text(json.dumps(res, indent=1))
    del engines
    torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
