"""Decode and prefill GEMMs of Qwen2.5-7B on one GPU: cuBLAS through F.linear (weights [N, K], as the
model stores them) against other formulations, to see whether a weight layout or BLAS backend
reads the weights faster at decode batch sizes. A lab script: the decode GEMMs are the largest
remaining gap of a decode pass (bench/results/engine.md); the last run is in bench/results/kernels.md.

    python3 bench/lab/gemm_layouts.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import cuda_ms, run_header, write_json  # noqa: E402

SHAPES = {"qkv": (3584, 4608), "o": (3584, 3584), "gate_up": (3584, 37888), "down": (18944, 3584),
          "lm_head": (3584, 152064)}  # (K, N)


def us(fn) -> float:
    return cuda_ms(fn, warmup=25, rep=200) * 1e3


def measure(name: str, w: torch.Tensor, wt: torch.Tensor, m: int) -> dict:
    """One (weight, batch) row: microseconds per call of each formulation."""
    n, k = w.shape
    x = torch.randn(m, k, device=w.device, dtype=w.dtype)
    out = torch.empty(m, n, device=w.device, dtype=w.dtype)
    res = {"shape": name, "m": m, "k": k, "n": n, "weight_mb": w.numel() * 2 / 1e6}
    res["linear_us"] = us(lambda: F.linear(x, w))
    res["mm_nn_us"] = us(lambda: torch.mm(x, wt, out=out))
    res["mm_out_us"] = us(lambda: torch.mm(x, w.t(), out=out))
    try:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        res["linear_cublaslt_us"] = us(lambda: F.linear(x, w))
        res["mm_nn_cublaslt_us"] = us(lambda: torch.mm(x, wt, out=out))
    finally:
        torch.backends.cuda.preferred_blas_library("cublas")
    res["best"] = min((v, key) for key, v in res.items() if key.endswith("_us"))[1]
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="gemm_layouts.json")
    ns = p.parse_args()
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    rows = []
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k, device=dev, dtype=bf16) * 0.02  # [N, K] as stored
        wt = w.t().contiguous()  # [K, N]
        for m in (1, 128, 256, 8192):
            if name == "lm_head" and m == 8192:
                continue
            res = measure(name, w, wt, m)
            rows.append(res)
            print(f"{name:8s} M={m:5d}: " + "  ".join(f"{key[:-3]} {v:8.1f}" for key, v in res.items()
                                                      if key.endswith("_us"))
                  + f"  | weights at {res['weight_mb'] / res['linear_us']:.2f} TB/s (linear)", flush=True)
    write_json(ns.out, {**run_header(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
