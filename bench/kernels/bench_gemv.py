"""Decode linears (skinny GEMM) at Qwen2.5-7B shapes: torch F.linear (cuBLAS) vs skinny_linear.

    python3 bench/kernels/bench_gemv.py [--quick] [--out PATH]

For each case (the 5 linears of Qwen2.5-7B at M = 1; gate_up and down also at M = 4 and 8), bf16:
  - a small grid of skinny_linear configs (block_n, block_k, split_k, warps, stages, reduce or dot
    path), each timed as a CUDA graph of 20 back-to-back calls (launch gaps removed, as the server
    runs decode), the best one also with triton.testing.do_bench on eager calls (median; includes
    Python launch cost where it exceeds the GPU time), and the serial split-K fix-up of the best
    config compared with the two-kernel reduction;
  - torch F.linear timed the same two ways;
  - bytes/s over the weight (+ x, bias, y) bytes, as % of the copy (read + write) and read-only
    (torch.sum) bandwidths measured in the same run; relative error ||y - ref|| / ||ref|| against
    the fp32 reference.
The 20 graph calls rotate over enough copies of the weight (>= 400 MB in all) that none is served
from the 50 MB L2, as in a real step where ~15 GB of other weights pass between two uses.
Then a "layer stack": one CUDA graph of 28 layers x (qkv, o_proj, gate_up, down) + lm_head at M = 1
with distinct weights (14 GB), torch vs skinny_linear (best configs, and the launcher defaults),
against the time to read those bytes at the copy and read bandwidths.
Prints a table and TUNED lines to paste into kernels/gemv.py; JSON to $OUT/gemv.json (or --out).
Runs in about 1 to 1.5 minutes on an H200 (206 timed configs, ~66 Triton compiles; --quick: 64 configs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
from radixrt.kernels.gemv import SkinnyConfig, SkinnyWorkspace, default_config, skinny_linear  # noqa: E402
from radixrt.kernels.reference import skinny_linear_ref  # noqa: E402

BF16, DEV = torch.bfloat16, torch.device("cuda")
NUM_LAYERS, CALLS, ROTATE_BYTES = 28, 20, 400e6
SHAPES = {"qkv": (4608, 3584, True), "o_proj": (3584, 3584, False), "gate_up": (37888, 3584, False),
          "down": (3584, 18944, False), "lm_head": (152064, 3584, False)}
CASES = [(name, 1) for name in SHAPES] + [(n, m) for m in (4, 8) for n in ("gate_up", "down")]
# (block_n, block_k, num_warps, num_stages); split_k is swept per shape. Reduce tiles are kept to
# <= 64 fp32 accumulator registers per thread (BM * BN * BK / threads), so M = 4, 8 take the smaller
# ones; num_stages does not change the reduce path (Triton pipelines only loads that feed a dot).
REDUCE_TILES = [(16, 256, 4, 1), (16, 512, 4, 1), (32, 256, 4, 1), (8, 512, 4, 1), (16, 512, 8, 1), (32, 512, 8, 1),
                (16, 128, 4, 1), (8, 256, 4, 1), (16, 256, 8, 1), (8, 128, 4, 1), (16, 128, 8, 1), (8, 256, 8, 1)]
DOT_TILES = [(64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 8, 3), (32, 256, 4, 4)]
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


def bench_ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def graph_ms(calls) -> float:
    """Median time per call of a CUDA graph replaying calls() (every call already run once eagerly)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    ms = bench_ms(graph.replay)
    del graph
    return ms


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    if torch.isnan(y).any():
        return float("nan")
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()


def ceilings() -> dict:
    n = (1 << 30) // 2  # 1 GiB of bf16
    src = torch.randn(n, device=DEV, dtype=BF16)
    dst = torch.empty_like(src)
    copy_ms = bench_ms(lambda: dst.copy_(src))
    read_ms = bench_ms(lambda: src.sum(dtype=torch.float32))
    return {"copy_bytes_per_s": 4 * n / (copy_ms * 1e-3), "read_bytes_per_s": 2 * n / (read_ms * 1e-3)}


def candidates(m: int, n: int, k: int, quick: bool) -> list[SkinnyConfig]:
    """The grid: each tile with split_k in powers of two up to ~12 programs per SM (>= 2 chunks per
    split), plus the launcher default."""
    bm = triton.next_power_of_2(m)
    reduce_tiles = [t for t in REDUCE_TILES if bm * t[0] * t[1] <= 64 * 32 * t[2]][:6]
    dot_tiles = DOT_TILES
    if quick:
        reduce_tiles, dot_tiles = reduce_tiles[:2], dot_tiles[:1]
    tiles = [(*t, False) for t in reduce_tiles] + [(*t, True) for t in dot_tiles]
    out = [default_config(m, n, k)]
    for bn, bk, warps, stages, use_dot in tiles:
        row_blocks = triton.cdiv(n, bn)
        for split in (1, 2, 4, 8, 16, 32):
            if split == 1 or (row_blocks * split <= 12 * 132 and k // split >= 2 * bk):
                cfg = SkinnyConfig(bn, bk, split, warps, stages, use_dot)
                if cfg not in out:
                    out.append(cfg)
    return out


def cfg_str(c: SkinnyConfig) -> str:
    return (f"{'dot' if c.use_dot else 'red'} {c.block_n}x{c.block_k} s{c.split_k} w{c.num_warps} "
            f"st{c.num_stages}{'' if c.serial_reduce else ' 2k'}")


def run_case(name: str, m: int, quick: bool) -> dict:
    n, k, has_bias = SHAPES[name]
    cands = candidates(m, n, k, quick)
    ws = SkinnyWorkspace.allocate(max(c.split_k for c in cands) * m * n, n, DEV)
    w_bytes = n * k * 2
    copies = max(1, min(CALLS, math.ceil(ROTATE_BYTES / w_bytes)))
    weights = [torch.randn(n, k, device=DEV, dtype=BF16) / 16 for _ in range(copies)]
    x = torch.randn(m, k, device=DEV, dtype=BF16)
    b = torch.randn(n, device=DEV, dtype=BF16) if has_bias else None
    y = torch.empty(m, n, device=DEV, dtype=BF16)
    moved = w_bytes + m * k * 2 + m * n * 2 + (n * 2 if has_bias else 0)
    ref = skinny_linear_ref(x, weights[0], b)

    def torch_calls():
        for i in range(CALLS):
            F.linear(x, weights[i % copies], b)

    torch_calls()
    res = {"name": name, "m": m, "n": n, "k": k, "bias": has_bias, "bytes": moved, "weight_copies": copies,
           "torch": {"ms_graph": graph_ms(torch_calls) / CALLS, "ms_eager": bench_ms(lambda: F.linear(x, weights[0], b)),
                     "rel_err": rel_err(F.linear(x, weights[0], b), ref)}, "configs": []}
    log(f"{name} M={m}: torch {res['torch']['ms_graph'] * 1e3:.1f} us; {len(cands)} configs")
    for i, cfg in enumerate(cands):
        res["configs"].append(time_config(x, weights, b, y, cfg, ws, ref))
        if i == 0:
            res["default"] = res["configs"][0]
    ok = [c for c in res["configs"] if c.get("rel_err", 1.0) <= 1e-2]
    best = min(ok, key=lambda c: c["ms_graph"]) if ok else res["configs"][0]
    cfg = SkinnyConfig(**best["config"])
    best["ms_eager"] = bench_ms(lambda: skinny_linear(x, weights[0], b, out=y, config=cfg, workspace=ws))
    res["best"] = best
    if cfg.split_k > 1:  # same tile, split-K sums by a second kernel instead of the serial fix-up
        two = SkinnyConfig(**{**best["config"], "serial_reduce": False})
        res["two_kernel"] = time_config(x, weights, b, y, two, ws, ref)
    log(f"  best {cfg_str(cfg)}: {best['ms_graph'] * 1e3:.1f} us (default {res['default']['ms_graph'] * 1e3:.1f} us)")
    return res


def time_config(x, weights, b, y, cfg: SkinnyConfig, ws: SkinnyWorkspace, ref) -> dict:
    y.fill_(float("nan"))
    try:
        skinny_linear(x, weights[0], b, out=y, config=cfg, workspace=ws)  # compiles on first use
    except Exception as e:  # e.g. out of shared memory: record it, keep sweeping
        log(f"  {cfg_str(cfg)} failed: {type(e).__name__}: {str(e)[:160]}")
        return {"config": asdict(cfg), "label": cfg_str(cfg), "ms_graph": float("inf"), "error": str(e)[:500]}
    err = rel_err(y, ref)

    def calls():
        for i in range(CALLS):
            skinny_linear(x, weights[i % len(weights)], b, out=y, config=cfg, workspace=ws)

    calls()
    return {"config": asdict(cfg), "label": cfg_str(cfg), "ms_graph": graph_ms(calls) / CALLS, "rel_err": err}


def layer_stack(best: dict[str, SkinnyConfig], ws: SkinnyWorkspace) -> dict:
    """One graph of 28 layers x 4 linears + lm_head at M = 1 with distinct weights."""
    layers = [{name: torch.empty(SHAPES[name][0], SHAPES[name][1], device=DEV, dtype=BF16).normal_(0, 0.05)
               for name in ("qkv", "o_proj", "gate_up", "down")} for _ in range(NUM_LAYERS)]
    lm_head = torch.empty(*SHAPES["lm_head"][:2], device=DEV, dtype=BF16).normal_(0, 0.05)
    qkv_bias = torch.randn(SHAPES["qkv"][0], device=DEV, dtype=BF16)
    h = torch.randn(1, SHAPES["qkv"][1], device=DEV, dtype=BF16)
    inter = torch.randn(1, SHAPES["down"][1], device=DEV, dtype=BF16)
    inputs = {"qkv": h, "o_proj": h, "gate_up": h, "down": inter, "lm_head": h}
    outs = {name: torch.empty(1, SHAPES[name][0], device=DEV, dtype=BF16) for name in SHAPES}
    total = sum(w.numel() * 2 for layer in layers for w in layer.values()) + lm_head.numel() * 2

    def run(linear):
        for layer in layers:
            for name, w in layer.items():
                linear(name, w)
        linear("lm_head", lm_head)

    def torch_linear(name, w):
        outs[name] = F.linear(inputs[name], w, qkv_bias if name == "qkv" else None)

    def ours(configs):
        def linear(name, w):
            skinny_linear(inputs[name], w, qkv_bias if name == "qkv" else None, out=outs[name],
                          config=configs[name], workspace=ws)
        return linear

    defaults = {name: default_config(1, n, k) for name, (n, k, _) in SHAPES.items()}
    res = {"weight_bytes": total}
    for label, linear in (("torch", torch_linear), ("skinny_best", ours(best)), ("skinny_default", ours(defaults))):
        run(linear)
        res[label + "_ms"] = graph_ms(lambda linear=linear: run(linear))
        log(f"layer stack {label}: {res[label + '_ms']:.3f} ms")
    return res


def print_tables(result: dict) -> None:
    bw, rd = result["ceilings"]["copy_bytes_per_s"], result["ceilings"]["read_bytes_per_s"]
    print(f"\ncopy {bw / 1e12:.2f} TB/s (read + write), read (torch.sum) {rd / 1e12:.2f} TB/s")
    print("\n| linear | M | torch graph (eager) | best skinny graph (eager) | TB/s torch -> skinny | % copy | "
          "% read | speed-up | rel err torch / skinny | best config | default config | serial vs 2-kernel |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in result["cases"]:
        t, b, d = r["torch"], r["best"], r["default"]
        bps_t, bps_b = r["bytes"] / (t["ms_graph"] * 1e-3), r["bytes"] / (b["ms_graph"] * 1e-3)
        two = r.get("two_kernel")
        two_s = f"{b['ms_graph'] * 1e3:.1f} / {two['ms_graph'] * 1e3:.1f} us" if two else ""
        print(f"| {r['name']} {r['n']}x{r['k']} | {r['m']} | {t['ms_graph'] * 1e3:.1f} ({t['ms_eager'] * 1e3:.1f}) us | "
              f"{b['ms_graph'] * 1e3:.1f} ({b['ms_eager'] * 1e3:.1f}) us | {bps_t / 1e12:.2f} -> {bps_b / 1e12:.2f} | "
              f"{100 * bps_b / bw:.0f} | {100 * bps_b / rd:.0f} | {t['ms_graph'] / b['ms_graph']:.2f}x | "
              f"{t['rel_err']:.1e} / {b['rel_err']:.1e} | {b['label']} | {d['label']} {d['ms_graph'] * 1e3:.1f} us | "
              f"{two_s} |")
    s = result.get("layer_stack")
    if s:
        ideal_copy, ideal_read = s["weight_bytes"] / bw * 1e3, s["weight_bytes"] / rd * 1e3
        print(f"\nlayer stack ({NUM_LAYERS} x 4 linears + lm_head, M=1, {s['weight_bytes'] / 1e9:.2f} GB, one graph): "
              f"torch {s['torch_ms']:.3f} ms, skinny best {s['skinny_best_ms']:.3f} ms, "
              f"skinny default {s['skinny_default_ms']:.3f} ms; bytes at copy bw {ideal_copy:.3f} ms, "
              f"at read bw {ideal_read:.3f} ms; torch / best = {s['torch_ms'] / s['skinny_best_ms']:.2f}x")
    print("\nTUNED entries for kernels/gemv.py (m_bucket, N, K) -> best config:")
    for r in result["cases"]:
        c = r["best"]["config"]
        print(f"    ({triton.next_power_of_2(r['m'])}, {r['n']}, {r['k']}): SkinnyConfig({c['block_n']}, {c['block_k']}, "
              f"{c['split_k']}, {c['num_warps']}, {c['num_stages']}, use_dot={c['use_dot']}),")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 tiles per case, no layer stack")
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/gemv.json if OUT is set)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gemv needs a CUDA device")
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    log(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")
    result: dict = {"device": props.name, "num_sms": props.multi_processor_count, "torch": torch.__version__,
                    "triton": triton.__version__, "quick": args.quick, "calls_per_graph": CALLS}
    result["ceilings"] = ceilings()
    result["cases"] = [run_case(name, m, args.quick) for name, m in CASES]
    if not args.quick:
        best = {r["name"]: SkinnyConfig(**r["best"]["config"]) for r in result["cases"] if r["m"] == 1}
        defaults = [default_config(1, n, k) for n, k, _ in SHAPES.values()]
        split = max(c.split_k for c in [*best.values(), *defaults])
        result["layer_stack"] = layer_stack(best, SkinnyWorkspace.allocate(
            split * max(n for n, _, _ in SHAPES.values()), max(n for n, _, _ in SHAPES.values()), DEV))
    print_tables(result)
    ok = all(r["best"]["rel_err"] <= 1e-2 for r in result["cases"])
    result["correct"] = ok
    print(f"\ncorrectness (best configs, rel err <= 1e-2): {'PASS' if ok else 'FAIL'}")
    out_path = args.out or (str(Path(os.environ["OUT"]) / "gemv.json") if os.environ.get("OUT") else None)
    if out_path:
        Path(out_path).write_text(json.dumps(result, indent=2))
        print(f"wrote {out_path}")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
