"""The decode step of a bf16 Engine with the decode-batch Gluon GEMM routed (RADIXRT_GEMM_WS=auto, the
default: the shapes of kernels/gemm_ws.py's TUNED / TUNED_GATED tables) against cuBLAS alone (=0),
at the batch sizes whose decode graphs a table entry covers.

    python3 bench/lab/gemm_ws_step.py [--batches 48,64,128] [--rounds 4] [--out F]  # ~3 min

Two Engines on the dummy Qwen2.5-7B kept alive in one process (the switch is read while an Engine
captures its graphs), each batch's step time from two generate runs of different length (the
decode steps alone: (t(n + 1) - t(1)) / n), alternated rounds, medians. Timing only: the tokens of
both are checked equal in the first round (greedy; the kernels differ in rounding, so a mismatch is
printed, not fatal).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import out_path, run_header, write_json  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
T0 = time.time()
PROMPT_LEN, STEPS = 128, 64
FIRST_ID, ID_RANGE = 1000, 20000  # prompt token ids (inside Qwen2.5's vocabulary)


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


def step_ms(engine, batch: int) -> tuple[float, list[list[int]]]:
    """Decode time per step (ms) of `batch` requests of PROMPT_LEN tokens, and the tokens of the
    longer run (one list per request)."""
    prompts = [[FIRST_ID + (7 * b + i) % ID_RANGE for i in range(PROMPT_LEN)] for b in range(batch)]

    def run(n: int) -> tuple[float, list[list[int]]]:
        t = time.perf_counter()
        outs = engine.generate(prompts, {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True})
        errors = {o["meta_info"].get("error") for o in outs} - {None}
        if errors:
            raise RuntimeError(f"requests refused: {errors}")
        torch.cuda.synchronize()
        return time.perf_counter() - t, [o["output_ids"] for o in outs]

    run(4)  # warm-up: kernels compiled, graphs already captured
    engine.scheduler.flush_cache()
    t1, _ = run(1)
    engine.scheduler.flush_cache()
    tn, tokens = run(STEPS + 1)
    engine.scheduler.flush_cache()
    return (tn - t1) / STEPS * 1e3, tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="48,64,128")  # 48: a graph whose GEMMs pad to 64 rows
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=None)
    ns = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gemm_ws_step needs a CUDA device")
    from bench.fp8_bench import model_dir
    from radixrt.engine import Engine
    from radixrt.kernels import gemm_ws

    batches = [int(b) for b in ns.batches.split(",")]
    path = model_dir("qwen2.5-7b")
    routes = {"cuBLAS (RADIXRT_GEMM_WS=0)": "0", "routed (auto)": "auto"}
    log(f"TUNED {gemm_ws.TUNED}, TUNED_GATED {gemm_ws.TUNED_GATED}")
    engs, out = {}, {"run": run_header(), "batches": batches, "routes": {}}
    saved = os.environ.get("RADIXRT_GEMM_WS")
    for name, value in routes.items():
        os.environ["RADIXRT_GEMM_WS"] = value
        t = time.perf_counter()
        engs[name] = Engine(model_path=str(path), load_format="dummy", device="cuda",
                            max_running_requests=max(batches), cuda_graph_max_bs=max(batches),
                            max_total_tokens=max(batches) * (PROMPT_LEN + STEPS + 32) + 4096,
                            disable_radix_cache=True)
        log(f"engine {name} started in {time.perf_counter() - t:.0f} s")
        out["routes"][name] = {str(b): [] for b in batches}
    if saved is None:
        os.environ.pop("RADIXRT_GEMM_WS", None)
    else:
        os.environ["RADIXRT_GEMM_WS"] = saved
    for r in range(ns.rounds):
        for b in batches:
            tokens = {}
            for name in routes:
                ms, tokens[name] = step_ms(engs[name], b)
                out["routes"][name][str(b)].append(ms)
            if r == 0:
                a, c = tokens.values()
                same = sum(x == y for x, y in zip(a, c, strict=True))
                log(f"batch {b}: {same}/{b} requests with the same greedy tokens on both routes")
        log(f"round {r}: " + ", ".join(f"{n} b{b} {out['routes'][n][str(b)][-1]:.3f}"
                                      for n in routes for b in batches))
    print("\n| batch | cuBLAS ms (median) | routed ms (median) | routed / cuBLAS |")
    print("|---|---|---|---|")
    for b in batches:
        base, routed = (statistics.median(out["routes"][n][str(b)]) for n in routes)
        print(f"| {b} | {base:.3f} | {routed:.3f} | {routed / base:.3f} |")
    write_json(out_path(ns.out, "gemm-ws-step"), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
