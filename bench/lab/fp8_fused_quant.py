"""RMSNorm and SiLU-and-mul with the per-token FP8 quantization fused in, against the two kernels
they replace, at Qwen2.5-7B widths (issue 19, FP8 `random`).

    python3 bench/lab/fp8_fused_quant.py [--out fp8-fused-quant.json]

Per row count M (decode batches 17-256 and prefill chunks 512-8,192): `rms_norm` (hidden 3,584, with
the residual add) then `per_token_quant_fp8`, against `rms_norm_quant_fp8`; `silu_and_mul`
(intermediate 18,944) then `per_token_quant_fp8`, against `silu_and_mul_quant_fp8`; the unfused norm
and SiLU alone beside them. Each fused result is compared with the unfused pair first (the fractions
of FP8 values and of scales that differ are printed). Timing: a CUDA graph of calls over rotating
input copies (>= 256 MB in all, or 16 copies, so the 50 MB L2 holds few of them), median of
do_bench_cudagraph, us per call; PDL as the engine runs.
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

HIDDEN, INTER = 3584, 18944
ROWS = (17, 64, 256, 512, 2048, 8192)
ROTATE_BYTES = 256 << 20


# the fused SiLU's forms (kernels/activation.py) and warps per program, each timed beside the default
SILU_FORMS = [("two_pass", 8), ("one_pass", 8), ("one_pass", 16), ("one_pass", 32)]


def graph_us(fn, calls: int) -> float:
    return fp8_random_profile.graph_us(fn, calls, rep=30)


def bench_rows(m: int) -> dict:
    from radixrt.kernels import (
        per_token_quant_fp8,
        rms_norm,
        rms_norm_quant_fp8,
        silu_and_mul,
        silu_and_mul_quant_fp8,
    )

    bf16 = torch.bfloat16
    per_copy = m * (3 * HIDDEN + 2 * INTER) * 2
    n = max(1, min(16, ROTATE_BYTES // per_copy))
    xs = [torch.randn(m, HIDDEN, device="cuda", dtype=bf16) for _ in range(n)]
    rs = [torch.randn(m, HIDDEN, device="cuda", dtype=bf16) for _ in range(n)]
    gus = [(torch.randn(m, 2 * INTER, device="cuda") * 2).to(bf16) for _ in range(n)]
    w = torch.rand(HIDDEN, device="cuda").to(bf16) + 0.5
    # correctness first: fused == unfused bit for bit
    q, s, r = rms_norm_quant_fp8(xs[0], w, 1e-6, rs[0])
    out, r2 = rms_norm(xs[0], w, 1e-6, rs[0])
    q2, s2 = per_token_quant_fp8(out)
    assert torch.equal(r, r2)
    # differing FP8 values / differing scales (the fused norm may sum a row in another order)
    norm_diff = ((q.float() != q2.float()).float().mean().item(), (s != s2).float().mean().item())
    q2, s2 = per_token_quant_fp8(silu_and_mul(gus[0]))
    silu_diff = []  # per SiLU form: (differing FP8 values, differing scales) against the unfused pair
    for form, warps in SILU_FORMS:
        q, s = silu_and_mul_quant_fp8(gus[0], form=form, num_warps=warps)
        silu_diff.append(((q.float() != q2.float()).float().mean().item(), (s != s2).float().mean().item()))
    pairs = list(zip(xs, rs, strict=True))
    forms = {
        "norm": lambda: [rms_norm(x, w, 1e-6, r) for x, r in pairs],
        "norm + quant": lambda: [per_token_quant_fp8(rms_norm(x, w, 1e-6, r)[0]) for x, r in pairs],
        "norm_quant": lambda: [rms_norm_quant_fp8(x, w, 1e-6, r) for x, r in pairs],
        "silu": lambda: [silu_and_mul(g) for g in gus],
        "silu + quant": lambda: [per_token_quant_fp8(silu_and_mul(g)) for g in gus],
        "silu_quant": lambda: [silu_and_mul_quant_fp8(g) for g in gus],
        **{f"silu_quant {form} {warps}w": (lambda form=form, warps=warps: [
            silu_and_mul_quant_fp8(g, form=form, num_warps=warps) for g in gus])
           for form, warps in SILU_FORMS},
    }
    row = {"m": m, "copies": n, "norm_values_scales_differ": norm_diff,
           "silu_values_scales_differ": silu_diff}
    for name, fn in forms.items():
        row[name] = graph_us(fn, n)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    ns = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("fp8_fused_quant needs a CUDA device")
    import_kernels()
    t0 = time.time()
    result = {**run_header(), "rows": []}
    for m in ROWS:
        result["rows"].append(bench_rows(m))
        torch.cuda.empty_cache()
        print(f"[{time.time() - t0:5.1f}s] M = {m}", flush=True)
    write_json(out_path(ns.out, "fp8-fused-quant.json"), result)
    print("\n| M | norm | norm + quant | norm_quant (fused) | fused / unfused | silu | silu + quant | "
          "silu_quant (fused) | fused / unfused | differ: norm values, scales; silu values, scales |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        print(f"| {r['m']} | {r['norm']:.2f} | {r['norm + quant']:.2f} | {r['norm_quant']:.2f} | "
              f"{r['norm_quant'] / r['norm + quant']:.3f} | {r['silu']:.2f} | {r['silu + quant']:.2f} | "
              f"{r['silu_quant']:.2f} | {r['silu_quant'] / r['silu + quant']:.3f} | "
              f"{r['norm_values_scales_differ']}; {r['silu_values_scales_differ']} |")
    print("\n| M | silu + quant | " + " | ".join(f"{f} {w}w" for f, w in SILU_FORMS) + " |\n|---|---|"
          + "---|" * len(SILU_FORMS))
    for r in result["rows"]:
        print(f"| {r['m']} | {r['silu + quant']:.2f} | "
              + " | ".join(f"{r[f'silu_quant {f} {w}w']:.2f}" for f, w in SILU_FORMS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
