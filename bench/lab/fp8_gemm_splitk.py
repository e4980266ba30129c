"""FP8 linears at decode batches (M = 128-512): torch._scaled_mm against K split into slices by
torch._scaled_grouped_mm and the Triton FP8 GEMM with split-K (issue 19).

    python3 bench/lab/fp8_gemm_splitk.py [--out fp8-gemm-splitk.json]

At M = 256 `_scaled_mm` (fast accumulation) ran down (3,584 x 18,944) in 49.9 us, ~700 TFLOP/s
against gate_up's ~1,100 (H200, 2026-12-03, bench/lab/fp8_fast_accum.py): 256 x 3,584 outputs make
only 56 tiles of 128 x 128 for 132 SMs. Forms, per shape and M, on the same pre-quantized operands
(per-token x, per-channel weight), bf16 out, us per call from a CUDA graph over rotating weight
copies (>= 256 MB): `smm` one _scaled_mm; `grouped G` (`grouped_k`: G K slices in one
_scaled_grouped_mm, then their sum); `triton` kernels/gemm_fp8.py at a few split-K tiles. Each
form's output is checked against smm's first (relative error of the norm < 1e-2).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.common import out_path, run_header, write_json  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_random_profile  # noqa: E402

SHAPES = {"down": (3584, 18944), "o": (3584, 3584), "qkv": (4608, 3584), "gate_up": (37888, 3584)}
ROWS = [128, 256, 512]
ROTATE_BYTES = 256 << 20
bf16 = torch.bfloat16
TRITON = [(128, 128, 2), (128, 128, 4), (64, 128, 2), (64, 128, 4), (128, 64, 2), (64, 64, 4)]


def graph_us(fn, calls: int) -> float:
    return fp8_random_profile.graph_us(fn, calls, rep=30)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def grouped_k(xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor,
              groups: int) -> torch.Tensor:
    """x [M, K] @ w^T as the sum of `groups` K-slice products: one torch._scaled_grouped_mm over
    3-D strided views (no copies; the same row-wise scales in each slice), then the slices' bf16
    products summed (in fp32) -> bf16 [M, N]."""
    n, k = w.shape
    m, kg = xq.shape[0], k // groups
    a = xq.view(m, groups, kg).transpose(0, 1)  # [G, M, K/G], row-major slices
    b = w.view(n, groups, kg).permute(1, 2, 0)  # [G, K/G, N], column-major slices
    sa = xs.view(1, m).expand(groups, m).contiguous()
    sb = ws.view(1, n).expand(groups, n).contiguous()
    return torch._scaled_grouped_mm(a, b, sa, sb, out_dtype=bf16, use_fast_accum=True).sum(0)


def bench_shape(name: str, n: int, k: int) -> list[dict]:
    from radixrt.kernels import Fp8GemmConfig, fp8_gemm, per_token_quant_fp8
    from radixrt.kernels.gemv import SkinnyWorkspace
    from radixrt.models.linear import Linear
    from radixrt.models.quant.fp8 import Fp8Linear

    copies = max(1, min(8, ROTATE_BYTES // (n * k)))
    layers = []
    for _ in range(copies):
        with torch.device("meta"):
            lin = Linear(k, n, bias=False, dtype=torch.bfloat16)
        f8 = Fp8Linear.from_linear(lin).to_empty(device="cuda")
        f8.set_weight(torch.randn(n, k, device="cuda") * 0.02)
        layers.append(f8)
    rows = []
    for m in ROWS:
        xq, xs = per_token_quant_fp8(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        ref = layers[0]._scaled_mm(xq, xs, torch.bfloat16)
        row = {"shape": name, "m": m, "tflops_per_us": 2 * m * n * k / 1e6}
        row["smm"] = graph_us(lambda xq=xq, xs=xs: [f._scaled_mm(xq, xs, bf16) for f in layers], copies)
        for g in (2, 4):
            if k % (16 * g):
                continue
            try:
                err = rel(grouped_k(xq, xs, layers[0].weight, layers[0].weight_scale, g), ref)
                run = lambda xq=xq, xs=xs, g=g: [  # noqa: E731
                    grouped_k(xq, xs, f.weight, f.weight_scale, g) for f in layers]
                row[f"grouped {g}"] = graph_us(run, copies) if err < 1e-2 else f"rel err {err:.2e}"
            except Exception as e:  # noqa: BLE001 - a form the build lacks is a finding
                row[f"grouped {g}"] = f"{type(e).__name__}: {str(e)[:80]}"
        for bm, bn, split in TRITON:
            cfg = Fp8GemmConfig(bm, bn, 128, num_warps=4, num_stages=4, split_k=split)
            partials, counters = cfg.workspace_need(m, n, k)
            ws = SkinnyWorkspace.allocate(max(partials, 1), max(counters, 1), xq.device)
            key = f"triton {bm}x{bn} k{split}"
            try:
                out = fp8_gemm(xq, xs, layers[0].weight, layers[0].weight_scale, None, out_dtype=bf16,
                               workspace=ws, config=cfg)
                err = rel(out, ref)
                row[key] = graph_us(lambda xq=xq, xs=xs, cfg=cfg, ws=ws: [
                    fp8_gemm(xq, xs, f.weight, f.weight_scale, None, out_dtype=torch.bfloat16, workspace=ws,
                             config=cfg) for f in layers], copies) if err < 1e-2 else f"rel err {err:.2e}"
            except Exception as e:  # noqa: BLE001
                row[key] = f"{type(e).__name__}: {str(e)[:80]}"
        rows.append(row)
        best = min((v, kk) for kk, v in row.items() if isinstance(v, float) and kk not in ("tflops_per_us",))
        print(f"{name} M={m}: smm {row['smm']:.1f} us; best {best[1]} {best[0]:.1f} us", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--rows", default="128,256,512")
    ns = p.parse_args(argv)
    ROWS[:] = [int(v) for v in ns.rows.split(",")]
    if not torch.cuda.is_available():
        sys.exit("fp8_gemm_splitk needs a CUDA device")
    import_kernels()
    t0 = time.time()
    result = {**run_header(), "rows": []}
    for name in ns.shapes.split(","):
        result["rows"] += bench_shape(name, *SHAPES[name])
        torch.cuda.empty_cache()
        write_json(out_path(ns.out, "fp8-gemm-splitk.json"), result)
    print(f"[{time.time() - t0:.0f}s]")
    forms = ["smm", "grouped 2", "grouped 4"] + [f"triton {bm}x{bn} k{s}" for bm, bn, s in TRITON]
    print("\n| shape | M | " + " | ".join(forms) + " |\n|---|---|" + "---|" * len(forms))
    for r in result["rows"]:
        cells = [f"{r[f]:.1f}" if isinstance(r.get(f), float) else str(r.get(f, "-"))[:24] for f in forms]
        print(f"| {r['shape']} | {r['m']} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
