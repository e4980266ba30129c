"""The float32 CPU linears of one decoder layer: the native kernel against oneDNN packed and MKL.

    python3 bench/kernels/cpu_linear_bench.py [--threads 2] [--copies 36] [--rows 1,4,16,32,64,128,512]

The default model's layer shapes (SmolLM2-135M: qkv 960 x 576, o 576 x 576, gate_up 3072 x 576,
down 576 x 1536), `--copies` copies of the layer's weights rotated so that they stream from memory as
in a model pass (36 copies = ~500 MB, about the model's 30 layers + LM head; fewer copies fit in a
large L3 and flatter every path). Per row count: the three paths alternated twice, the best time of
each (us per layer), GFLOP/s, the native kernel's time over oneDNN's, and the native result's
largest error against a float64 product (relative to sum |x||w|).
Paths: `native` radixrt.worker.cpu_native.linear (kernels/cpu_native_gemm.h), `onednn`
torch.ops.mkldnn._linear_pointwise with a weight packed by _reorder_linear_weight (radixrt's path
before), `mkl` F.linear.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--copies", type=int, default=36)
    ap.add_argument("--rows", default="1,4,16,32,64,128,512")
    ap.add_argument("--out", help="write the results as JSON here")
    ns = ap.parse_args()
    from radixrt.worker import cpu_native

    if not cpu_native.linear_supported():
        raise SystemExit("the native CPU linear is not available here (no C compiler or no AVX-512)")
    torch.manual_seed(0)
    torch.set_num_threads(ns.threads)
    layers = []
    for _ in range(ns.copies):
        ws = [torch.randn(n, k) / k**0.5 for n, k in SHAPES]
        layers.append({"mkl": ws, "onednn": [torch.ops.mkldnn._reorder_linear_weight(w) for w in ws],
                       "native": [cpu_native.pack_linear(w) for w in ws]})

    def run(path: str, xs: list[torch.Tensor], layer: dict) -> None:
        for (n, _), x, w in zip(SHAPES, xs, layer[path], strict=True):
            if path == "native":
                cpu_native.linear(x, w, n)
            elif path == "onednn":
                torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
            else:
                F.linear(x, w)

    results = []
    print("| rows | native us | oneDNN packed us | MKL us | native GFLOP/s | native / oneDNN "
          "| max rel. error |")
    print("|---|---|---|---|---|---|---|")
    for m in (int(r) for r in ns.rows.split(",")):
        xs = [torch.randn(m, k) for _, k in SHAPES]
        err = 0.0
        for (n, _), x, w, wp in zip(SHAPES, xs, layers[0]["mkl"], layers[0]["native"], strict=True):
            y = cpu_native.linear(x, wp, n).double()
            exact = x.double() @ w.double().t()
            err = max(err, ((y - exact).abs().max() / (x.double().abs() @ w.double().abs().t()).max()).item())
        best: dict[str, float] = {}
        reps = max(ns.copies, 400 // m)
        for path in ("native", "onednn", "mkl") * 2:
            for layer in layers:  # warm: every copy touched once
                run(path, xs, layer)
            t0 = time.perf_counter()
            for r in range(reps):
                run(path, xs, layers[r % ns.copies])
            best[path] = min(best.get(path, float("inf")), (time.perf_counter() - t0) / reps * 1e6)
        flops = 2 * m * sum(n * k for n, k in SHAPES)
        row = {"rows": m, **{f"{k}_us": round(v, 1) for k, v in best.items()}, "max_rel_err": err,
               "native_gflops": round(flops / best["native"] / 1e3, 1)}
        results.append(row)
        print(f"| {m} | {best['native']:.0f} | {best['onednn']:.0f} | {best['mkl']:.0f} "
              f"| {row['native_gflops']:.0f} "
              f"| {best['native'] / best['onednn']:.2f} | {err:.1e} |")
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump({"threads": ns.threads, "copies": ns.copies, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
