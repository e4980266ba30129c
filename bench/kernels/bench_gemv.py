"""Decode linears (skinny GEMM) at Qwen2.5-7B shapes: torch F.linear (cuBLAS) vs skinny_linear.

    python3 bench/kernels/bench_gemv.py [--quick] [--out PATH] [--mlarge-only | --no-mlarge]
                                        [--mlarge-m 64,128,256]

For each case (the 5 linears of Qwen2.5-7B at M = 1; gate_up and down also at M = 4 and 8; qkv,
o_proj, gate_up and down at M = 64, 128 and 256, the "M-large" cases), bf16:
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
M-large cases (M > 16, dot path with BM = next_pow2(M) rows of x per tile) sweep in two phases:
every tile of block_n {64, 128} x block_k {64, 128} x warps {4, 8} x stages {3, 4, 5} whose
pipeline buffers fit in SMEM_LIMIT (220 KB, kernels.gemv.shared_memory_bytes) and whose fp32
accumulator is 32..128 registers per thread, at the split_k of the launcher's rule for that tile
(kernels.gemv.large_m_split_k); then split_k in {1, 2, 4, 8} for the two fastest tiles.
Prints a table and TUNED lines to paste into kernels/gemv.py; an M-large line only where skinny_linear
beat F.linear by MIN_SPEEDUP at every measured M of its bucket (an entry routes all M of the bucket
to the kernel); JSON to $OUT/gemv.json (or --out).
Before timing, the Triton kernels of all cases' configs are compiled into Triton's on-disk cache by
--jobs worker processes (skinny_linear_compile on CPU tensors of the case shapes; best effort: a
failure there only leaves the compiles to the sweep), so the sweep loads them instead of compiling.
Runs in about 1 to 1.5 minutes on an H200 without the M-large cases (206 timed configs, ~66 Triton
compiles, measured before the parallel compile); the M-large cases add ~230 timed configs and ~150
compiles (estimated 1-1.5 minutes; --mlarge-only runs just those; --quick: fewer tiles).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import common  # noqa: E402
from bench.common import rel_err  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
from radixrt.kernels.gemv import (  # noqa: E402
    MAX_M,
    SkinnyConfig,
    SkinnyWorkspace,
    default_config,
    large_m_split_k,
    shared_memory_bytes,
    skinny_linear,
    skinny_linear_compile,
)
from radixrt.kernels.reference import skinny_linear_ref  # noqa: E402

BF16, DEV = torch.bfloat16, torch.device("cuda")
NUM_LAYERS, CALLS, ROTATE_BYTES = 28, 20, 400e6
SHAPES = {"qkv": (4608, 3584, True), "o_proj": (3584, 3584, False), "gate_up": (37888, 3584, False),
          "down": (3584, 18944, False), "lm_head": (152064, 3584, False)}
CASES = [(name, 1) for name in SHAPES] + [(n, m) for m in (4, 8) for n in ("gate_up", "down")]
# (block_n, block_k, num_warps, num_stages); split_k is swept per shape. Reduce tiles are kept to
# <= 64 fp32 accumulator registers per thread (BM * BN * BK / threads), so M = 4, 8 take the smaller
# ones; num_stages does not change the reduce path (Triton pipelines only loads that feed a dot).
REDUCE_TILES = [(16, 256, 4, 1), (16, 512, 4, 1), (32, 256, 4, 1), (8, 512, 4, 1), (16, 512, 8, 1),
                (32, 512, 8, 1),
                (16, 128, 4, 1), (8, 256, 4, 1), (16, 256, 8, 1), (8, 128, 4, 1), (16, 128, 8, 1),
                (8, 256, 8, 1)]
DOT_TILES = [(64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 8, 3), (32, 256, 4, 4)]
# M-large cases (dot path only): the tile grid, the split_k values of phase 2, and the limits
MLARGE_M = (64, 128, 256)
MLARGE_SHAPES = ("qkv", "o_proj", "gate_up", "down")
LARGE_BLOCK_N, LARGE_BLOCK_K, LARGE_WARPS, LARGE_STAGES = (64, 128), (64, 128), (4, 8), (3, 4, 5)
LARGE_SPLITS = (1, 2, 4, 8)
SMEM_LIMIT = 220 * 1024  # bytes of pipeline buffers per program (H100/H200: 227 KB per block at most)
MIN_SPEEDUP = 1.02  # an M-large TUNED line needs torch / skinny >= this (graph timings)
NUM_SMS = 132  # the H200's; main() sets the device's
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


def bench_ms(fn) -> float:
    return common.cuda_ms(fn, warmup=5, rep=25)


def graph_ms(calls) -> float:
    """Median time of a CUDA graph replaying calls() (every call already run once eagerly)."""
    return common.graph_ms(calls, timer=bench_ms)


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


def large_tiles(m: int, quick: bool) -> list[tuple[int, int, int, int]]:
    """(block_n, block_k, num_warps, num_stages) of the M-large grid at M rows (BM = next_pow2(M)):
    pipeline buffers (2-byte inputs) within SMEM_LIMIT, fp32 accumulator block_n * BM / (32 * warps)
    of 32..128 registers per thread (fewer leaves warps idle, more spills). --quick: 4 stages only."""
    bm = max(16, triton.next_power_of_2(m))
    out = []
    for bn in LARGE_BLOCK_N:
        for bk in LARGE_BLOCK_K:
            for warps in LARGE_WARPS:
                for stages in (4,) if quick else LARGE_STAGES:
                    cfg = SkinnyConfig(bn, bk, 1, warps, stages, use_dot=True)
                    if shared_memory_bytes(cfg, m) <= SMEM_LIMIT and 32 <= bn * bm // (32 * warps) <= 128:
                        out.append((bn, bk, warps, stages))
    return out


def large_candidates(m: int, n: int, k: int, quick: bool) -> list[SkinnyConfig]:
    """Phase 1 of an M-large case: the launcher default, then every large_tiles tile at the split_k
    of the launcher's rule for that tile."""
    out = [default_config(m, n, k, NUM_SMS)]
    for bn, bk, warps, stages in large_tiles(m, quick):
        cfg = SkinnyConfig(bn, bk, large_m_split_k(m, n, k, bn, bk, stages, NUM_SMS), warps, stages,
                           use_dot=True)
        if cfg not in out:
            out.append(cfg)
    return out


def split_candidates(tile: SkinnyConfig, n: int, k: int, done: list[SkinnyConfig]) -> list[SkinnyConfig]:
    """Phase 2: `tile` at each split_k of LARGE_SPLITS not yet timed, keeping >= 2 chunks per split
    and <= 4 programs per SM."""
    out = []
    for split in LARGE_SPLITS:
        cfg = SkinnyConfig(tile.block_n, tile.block_k, split, tile.num_warps, tile.num_stages, use_dot=True)
        if (cfg not in done and cfg not in out and k // split >= 2 * tile.block_k
                and triton.cdiv(n, tile.block_n) * split <= 4 * NUM_SMS):
            out.append(cfg)
    return out


def cfg_str(c: SkinnyConfig) -> str:
    return (f"{'dot' if c.use_dot else 'red'} {c.block_n}x{c.block_k} s{c.split_k} w{c.num_warps} "
            f"st{c.num_stages}{'' if c.serial_reduce else ' 2k'}")


def case_candidates(name: str, m: int, quick: bool) -> list[SkinnyConfig]:
    """The configs a case times first (M-large: phase 1)."""
    n, k, _ = SHAPES[name]
    return large_candidates(m, n, k, quick) if m > MAX_M else candidates(m, n, k, quick)


def _compile_task(task: tuple[str, int, dict]) -> str | None:
    """Worker process: compile one config of case (name, M) into Triton's on-disk cache, on CPU tensors
    of the case's shapes (the kernel is specialised on dtypes, 16-byte alignment and sizes, not on
    the data or the device). Returns the error text, or None."""
    name, m, cfg_dict = task
    try:
        cfg = SkinnyConfig(**cfg_dict)
        n, k, has_bias = SHAPES[name]
        x, w, y = (torch.empty(*shape, dtype=BF16) for shape in ((m, k), (n, k), (m, n)))
        b = torch.empty(n, dtype=BF16) if has_bias else None
        ws = SkinnyWorkspace.allocate(cfg.split_k * m * n, n, "cpu")
        skinny_linear_compile(x, w, b, out=y, config=cfg, workspace=ws)
        return None
    except Exception as e:  # reported by the sweep when it compiles the config itself
        return f"{type(e).__name__}: {str(e)[:200]}"


def precompile(cases: list[tuple[str, int]], quick: bool, jobs: int) -> dict:
    """Compile the kernels of every case's first configs (and, for M-large cases, of each tile at
    split_k = 1, which phase 2 may time) in `jobs` spawned processes; kernels that differ only in
    split_k > 1 or in N, K (all multiples of 16 here) compile once. Best effort: returns a summary."""
    tasks: dict[tuple, tuple[str, int, dict]] = {}
    for name, m in cases:
        n, k, has_bias = SHAPES[name]
        cands = case_candidates(name, m, quick)
        if m > MAX_M:
            cands += [replace(c, split_k=1) for c in cands]
        for c in cands:
            k_per_split = triton.cdiv(triton.cdiv(k, c.split_k), c.block_k) * c.block_k
            key = (m, has_bias, k % c.block_k == 0, triton.cdiv(k, k_per_split) > 1,
                   replace(c, split_k=1))
            tasks.setdefault(key, (name, m, asdict(c)))
    if jobs <= 1 or not tasks:
        return {"jobs": jobs, "kernels": 0}
    t0 = time.time()
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
            errors = [e for e in ex.map(_compile_task, tasks.values()) if e]
    except Exception as e:  # e.g. a worker that could not start: the sweep compiles serially
        log(f"precompile failed ({type(e).__name__}: {str(e)[:200]}); compiling in the sweep instead")
        return {"jobs": jobs, "kernels": len(tasks), "error": str(e)[:500]}
    log(f"precompiled {len(tasks)} kernels on {jobs} processes in {time.time() - t0:.1f} s"
        f"{f' ({len(errors)} failed, e.g. {errors[0]})' if errors else ''}")
    return {"jobs": jobs, "kernels": len(tasks), "seconds": time.time() - t0, "failed": len(errors)}


def run_case(name: str, m: int, quick: bool) -> dict:
    n, k, has_bias = SHAPES[name]
    large = m > MAX_M
    cands = case_candidates(name, m, quick)
    ws = SkinnyWorkspace.allocate(max(max(c.split_k for c in cands), *LARGE_SPLITS) * m * n, n, DEV)
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
           "torch": {"ms_graph": graph_ms(torch_calls) / CALLS,
                     "ms_eager": bench_ms(lambda: F.linear(x, weights[0], b)),
                     "rel_err": rel_err(F.linear(x, weights[0], b), ref)}, "configs": []}
    log(f"{name} M={m}: torch {res['torch']['ms_graph'] * 1e3:.1f} us; {len(cands)} configs")
    for i, cfg in enumerate(cands):
        res["configs"].append(time_config(x, weights, b, y, cfg, ws, ref))
        if i == 0:
            res["default"] = res["configs"][0]

    def valid() -> list[dict]:
        return [c for c in res["configs"] if c.get("rel_err", 1.0) <= 1e-2]

    if large:  # phase 2: split_k of the two fastest tiles
        ranked = sorted(valid(), key=lambda c: c["ms_graph"])
        tiles: list[SkinnyConfig] = []
        for c in ranked:
            t = SkinnyConfig(**{**c["config"], "split_k": 1})
            if t not in tiles:
                tiles.append(t)
        more = [c for t in tiles[:1 if quick else 2] for c in split_candidates(t, n, k, cands)]
        for cfg in more:
            res["configs"].append(time_config(x, weights, b, y, cfg, ws, ref))
        log(f"  {len(more)} split_k variants of the fastest tiles")
    ok = valid()
    best = min(ok, key=lambda c: c["ms_graph"]) if ok else res["configs"][0]
    cfg = SkinnyConfig(**best["config"])
    best["ms_eager"] = bench_ms(lambda: skinny_linear(x, weights[0], b, out=y, config=cfg, workspace=ws))
    res["best"] = best
    if cfg.split_k > 1:  # same tile, split-K sums by a second kernel instead of the serial fix-up
        two = SkinnyConfig(**{**best["config"], "serial_reduce": False})
        res["two_kernel"] = time_config(x, weights, b, y, two, ws, ref)
    log(f"  best {cfg_str(cfg)}: {best['ms_graph'] * 1e3:.1f} us (default "
        f"{res['default']['ms_graph'] * 1e3:.1f} us, "
        f"torch {res['torch']['ms_graph'] * 1e3:.1f} us)")
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
    for label, linear in (("torch", torch_linear), ("skinny_best", ours(best)),
                          ("skinny_default", ours(defaults))):
        run(linear)
        res[label + "_ms"] = graph_ms(lambda linear=linear: run(linear))
        log(f"layer stack {label}: {res[label + '_ms']:.3f} ms")
    return res


def print_tables(result: dict) -> None:
    bw, rd = result["ceilings"]["copy_bytes_per_s"], result["ceilings"]["read_bytes_per_s"]
    print(f"\ncopy {bw / 1e12:.2f} TB/s (read + write), read (torch.sum) {rd / 1e12:.2f} TB/s")
    print("\n| linear | M | torch graph (eager) | best skinny graph (eager) | TB/s torch -> skinny | % copy "
          "| % read | speed-up | rel err torch / skinny | best config | default config "
          "| serial vs 2-kernel |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in result["cases"]:
        t, b, d = r["torch"], r["best"], r["default"]
        bps_t, bps_b = r["bytes"] / (t["ms_graph"] * 1e-3), r["bytes"] / (b["ms_graph"] * 1e-3)
        two = r.get("two_kernel")
        two_s = f"{b['ms_graph'] * 1e3:.1f} / {two['ms_graph'] * 1e3:.1f} us" if two else ""
        print(f"| {r['name']} {r['n']}x{r['k']} | {r['m']} | {t['ms_graph'] * 1e3:.1f} "
              f"({t['ms_eager'] * 1e3:.1f}) us | "
              f"{b['ms_graph'] * 1e3:.1f} ({b['ms_eager'] * 1e3:.1f}) us | {bps_t / 1e12:.2f} -> "
              f"{bps_b / 1e12:.2f} | "
              f"{100 * bps_b / bw:.0f} | {100 * bps_b / rd:.0f} | {t['ms_graph'] / b['ms_graph']:.2f}x | "
              f"{t['rel_err']:.1e} / {b['rel_err']:.1e} | {b['label']} | {d['label']} "
              f"{d['ms_graph'] * 1e3:.1f} us | "
              f"{two_s} |")
    s = result.get("layer_stack")
    if s:
        ideal_copy, ideal_read = s["weight_bytes"] / bw * 1e3, s["weight_bytes"] / rd * 1e3
        print(f"\nlayer stack ({NUM_LAYERS} x 4 linears + lm_head, M=1, {s['weight_bytes'] / 1e9:.2f} GB, "
              "one "
              f"graph): torch {s['torch_ms']:.3f} ms, skinny best {s['skinny_best_ms']:.3f} ms, "
              f"skinny default {s['skinny_default_ms']:.3f} ms; bytes at copy bw {ideal_copy:.3f} ms, "
              f"at read bw {ideal_read:.3f} ms; torch / best = {s['torch_ms'] / s['skinny_best_ms']:.2f}x")
    large = [r for r in result["cases"] if r["m"] > MAX_M]
    if large:
        print("\nM-large cases (dot path, BM = next_pow2(M)): compute rate 2 M N K / time")
        print("| linear | M | torch us | skinny us | speed-up | torch TFLOP/s | skinny TFLOP/s | best config "
              "| default config |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in large:
            t, b, d = r["torch"]["ms_graph"], r["best"]["ms_graph"], r["default"]
            flops = 2 * r["m"] * r["n"] * r["k"]
            print(f"| {r['name']} {r['n']}x{r['k']} | {r['m']} | {t * 1e3:.1f} | {b * 1e3:.1f} | "
                  f"{t / b:.2f}x | "
                  f"{flops / (t * 1e-3) / 1e12:.0f} | {flops / (b * 1e-3) / 1e12:.0f} | {r['best']['label']} "
                  f"| {d['label']} {d['ms_graph'] * 1e3:.1f} us |")
    small = [r for r in result["cases"] if r["m"] <= MAX_M]
    if small:
        print("\nTUNED entries for kernels/gemv.py (m_bucket, N, K) -> best config:")
        for r in small:
            print(f"    {tuned_line(r)}")
    if large:
        print("\nM-large TUNED entries: only where skinny_linear beat F.linear (graph time, torch / skinny "
              f">= {MIN_SPEEDUP}) at every measured M of the bucket; an entry routes every M in "
              "(m_bucket / 2, m_bucket] of that shape to the kernel (models/linear.py via "
              "skinny_linear_supported), so where only M = m_bucket was measured, check the bucket's low end "
              "too (e.g. --mlarge-m 65,128).")
        for line in mlarge_tuned_lines(large):
            print(f"    {line}")


def tuned_line(r: dict) -> str:
    c = r["best"]["config"]
    return (f"({triton.next_power_of_2(r['m'])}, {r['n']}, {r['k']}): SkinnyConfig({c['block_n']}, "
            f"{c['block_k']}, "
            f"{c['split_k']}, {c['num_warps']}, {c['num_stages']}, use_dot={c['use_dot']}),")


def mlarge_tuned_lines(cases: list[dict]) -> list[str]:
    """TUNED lines for the M-large cases: per (m_bucket, N, K), the best config of the largest measured
    M, and only if skinny_linear won at every measured M of the bucket; the rest as comments."""
    buckets: dict[tuple[int, int, int], list[dict]] = {}
    for r in cases:
        buckets.setdefault((triton.next_power_of_2(r["m"]), r["n"], r["k"]), []).append(r)
    lines = []
    for key in sorted(buckets, key=lambda key: (key[1], key[2], key[0])):
        rs = sorted(buckets[key], key=lambda r: r["m"])
        speedups = [r["torch"]["ms_graph"] / r["best"]["ms_graph"] for r in rs]
        won = all(s >= MIN_SPEEDUP for s in speedups) and all(r["best"]["rel_err"] <= 1e-2 for r in rs)
        tag = ", ".join(f"M={r['m']} {r['name']} {s:.2f}x" for r, s in zip(rs, speedups, strict=True))
        line = tuned_line(rs[-1])
        lines.append(f"{line}  # {tag}" if won else f"# not routed (F.linear faster or < {MIN_SPEEDUP}x): "
                                                    f"{line}  # {tag}")
    return lines


def main(argv: list[str] | None = None) -> None:
    global NUM_SMS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 tiles per case, no layer stack")
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/gemv.json if OUT is set)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--mlarge-only", action="store_true",
                       help="only the M-large cases (qkv, o_proj, gate_up, down at --mlarge-m rows), no "
                            "layer stack")
    group.add_argument("--no-mlarge", action="store_true", help="skip the M-large cases")
    parser.add_argument("--mlarge-m", default=",".join(map(str, MLARGE_M)),
                        help=f"comma-separated row counts of the M-large cases, each in {MAX_M + 1}..256 "
                             "(default %(default)s)")
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                        help="processes that compile the kernels before the sweep (<= 1: none; default "
                             "%(default)s)")
    args = parser.parse_args(argv)
    mlarge_m = [int(v) for v in args.mlarge_m.split(",") if v.strip()]
    if any(not MAX_M < v <= 256 for v in mlarge_m):
        parser.error(f"--mlarge-m values must be in {MAX_M + 1}..256, got {args.mlarge_m}")
    if not torch.cuda.is_available():
        sys.exit("bench_gemv needs a CUDA device")
    torch.manual_seed(0)
    result: dict = {**common.run_header(), "quick": args.quick, "calls_per_graph": CALLS,
                    "mlarge_m": [] if args.no_mlarge else mlarge_m}
    NUM_SMS = result["num_sms"]
    log(f"{result['device']}, {NUM_SMS} SMs, torch {torch.__version__}, triton {triton.__version__}")
    result["ceilings"] = ceilings()
    cases = [] if args.mlarge_only else list(CASES)
    if not args.no_mlarge:
        cases += [(name, m) for m in mlarge_m for name in MLARGE_SHAPES]
    result["precompile"] = precompile(cases, args.quick, args.jobs)
    result["cases"] = [run_case(name, m, args.quick) for name, m in cases]
    if not args.quick and not args.mlarge_only:
        best = {r["name"]: SkinnyConfig(**r["best"]["config"]) for r in result["cases"] if r["m"] == 1}
        defaults = [default_config(1, n, k) for n, k, _ in SHAPES.values()]
        split = max(c.split_k for c in [*best.values(), *defaults])
        result["layer_stack"] = layer_stack(best, SkinnyWorkspace.allocate(
            split * max(n for n, _, _ in SHAPES.values()), max(n for n, _, _ in SHAPES.values()), DEV))
    print_tables(result)
    ok = all(r["best"]["rel_err"] <= 1e-2 for r in result["cases"])
    result["correct"] = ok
    print(f"\ncorrectness (best configs, rel err <= 1e-2): {'PASS' if ok else 'FAIL'}")
    common.write_json(common.out_path(args.out, "gemv.json"), result)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
