"""torch._scaled_mm's row-wise FP8 GEMM with and without fast accumulation, on one GPU (issue 19).

    python3 bench/lab/fp8_fast_accum.py [--out fp8-fast-accum.json]

Fp8Linear's W8A8 path (radixrt/models/quant/fp8.py) calls `torch._scaled_mm` with the default
use_fast_accum=False: on sm_90 the FP8 MMA's partial sums are then promoted to fp32 as the K loop
goes; with fast accumulation they stay in the tensor core's reduced-precision accumulator for the
whole K loop (faster, less exact; DeepSeek-V3's report, section 3.3.2, measured ~2% relative error for
K = 4,096 without promotion). The `random` decode step runs these GEMMs at M = 256 (docs/benchmarks.md,
"FP8 `random`"), so this times the four Qwen2.5-7B decoder linears at M = 256, 512 and 8,192 both ways
(per-token quantized activations, per-channel weights, bf16 out; CUDA-graph replay over rotating
weight copies >= 256 MB, L2 flushed) and reports each form's relative error against the fp32 product
of the same quantized operands.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import cuda_ms, graph_ms, out_path, rel_err, run_header, write_json  # noqa: E402

LINEARS = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)}
ROWS = (256, 512, 8192)
ROTATE_BYTES = 256 << 20
FP8 = torch.float8_e4m3fn


def scaled_mm(xq: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
              fast: bool) -> torch.Tensor:
    return torch._scaled_mm(xq, w.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=torch.bfloat16,
                            use_fast_accum=fast)


def time_us(xq: torch.Tensor, ws: list[torch.Tensor], x_scale: torch.Tensor, w_scale: torch.Tensor,
            fast: bool) -> float:
    """us per call: one CUDA graph calls the GEMM once per weight copy in turn (no replay reads a
    weight from L2), replayed under do_bench."""
    calls = iter(range(1 << 30))

    def run():
        return scaled_mm(xq, ws[next(calls) % len(ws)], x_scale, w_scale, fast)
    run()
    return graph_ms(run, reps=len(ws), timer=lambda f: cuda_ms(f, warmup=10, rep=60)) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    ns = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("fp8_fast_accum needs a CUDA device")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows: list[dict] = []
    for name, (n, k) in LINEARS.items():
        copies = max(1, -(-ROTATE_BYTES // (n * k)))
        ws = [(torch.randn(n, k, device=dev) / 8).to(FP8) for _ in range(copies)]
        w_scale = torch.rand(1, n, device=dev) * 0.01 + 0.005
        for m in ROWS:
            xq = (torch.randn(m, k, device=dev) * 4).to(FP8)
            x_scale = torch.rand(m, 1, device=dev) * 0.01 + 0.005
            ref = (xq.float() * x_scale) @ (ws[0].float() * w_scale.view(n, 1)).t()
            got = {}
            for fast in (False, True):
                got[fast] = (time_us(xq, ws, x_scale, w_scale, fast),
                             rel_err(scaled_mm(xq, ws[0], x_scale, w_scale, fast), ref))
                us, err = got[fast]
                rows.append({"linear": name, "m": m, "fast_accum": fast, "us": us, "rel_err": err,
                             "tflop_per_s": 2 * m * n * k / (us * 1e-6) / 1e12})
            print(f"{name:8} M {m:5}: promoted {got[False][0]:8.1f} us, fast {got[True][0]:8.1f} us "
                  f"({got[True][0] / got[False][0]:.3f}x); rel err {got[False][1]:.2e} / {got[True][1]:.2e}",
                  flush=True)
        torch.cuda.empty_cache()
    for m in ROWS:
        slow = sum(r["us"] for r in rows if r["m"] == m and not r["fast_accum"])
        fast = sum(r["us"] for r in rows if r["m"] == m and r["fast_accum"])
        print(f"layer linears at M = {m}: promoted {slow:.1f} us, fast {fast:.1f} us ({fast / slow:.3f}x)")
    write_json(out_path(ns.out, "fp8-fast-accum.json"), {**run_header(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
