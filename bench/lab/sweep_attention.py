"""Config sweep of the paged attention kernels on one CUDA GPU (Qwen2.5-7B heads: 28 query, 4 KV,
head dim 128, page 16, bf16). A lab script: rerun it when a kernel's loop or the GPU changes, then
update the constant and the comment beside it (kernels/*.py `_pick_config`, `default_tile`,
`choose_num_prefix_splits`).

    python3 bench/lab/sweep_attention.py [--part cascade decode extend] [--cold-l2] [--out FILE.json]

cascade : 128 decoding requests sharing a 2,048-token prefix with 128-192 private tokens each (the
          `shared-prefix` decode), fused form. Prefix-stage tiles x prefix splits (per-kernel
          profiler times), then suffix-stage configs with the best tile, then the best pairs and the
          previous default as whole calls in a CUDA graph, also at 32, 64 and 256 requests.
decode  : plain decode, configs (key block, warps, stages) over batch x context shapes (graph replay).
extend  : extend configs over the prefill shapes of the workloads (including the mixed pass of
          `shared-prefix`: 63 x 128 new tokens + 65 decoding rows), and GQA packing on / off.
Every timed variant reports its error against the fp32 reference where one is cheap.
--cold-l2 writes a 256 MB buffer before every timed call of the cascade part, so the prefix K/V
come from HBM as in the engine (where a layer's weights pass through L2 between two attention
calls); hot in L2 (the default) the 128-row tile measured 17.7 against 20.3 us but equal in the
engine (bench/results/engine.md). Not yet run with --cold-l2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import bench_kernels as bk  # noqa: E402

from bench.common import run_header, write_json  # noqa: E402

K = bk.K
ext_mod = sys.modules["radixrt.kernels.extend_attention"]
dec_mod = sys.modules["radixrt.kernels.decode_attention"]
HQ, HKV, D, PAGE, DEV = bk.HQ, bk.HKV, bk.D, bk.PAGE, bk.DEV
INTS = {"dtype": torch.int32, "device": DEV}
PREFIX_LEN = 2048
OLD_PREFIX_TILE = (64, 64, 4, 2)
PREFIX_TILES = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 3), (64, 32, 4, 4), (64, 64, 4, 4),
                (128, 64, 8, 3), (128, 32, 8, 3), (128, 32, 8, 4), (128, 64, 4, 3)]
PREFIX_SPLITS = [2, 3, 4, 8]
OLD_SUFFIX = (64, 4, 2)
SUFFIX_CONFIGS = [(64, 4, 2), (64, 4, 3), (32, 4, 3), (32, 4, 4), (64, 4, 4), (128, 4, 3), (32, 2, 4)]
DECODE_CONFIGS = [(128, 4, 2), (128, 4, 3), (64, 4, 3), (64, 4, 4), (32, 4, 4), (64, 8, 3), (128, 8, 3),
                  (32, 4, 6)]
DECODE_SHAPES = [(128, 2200), (256, 768), (128, 400), (64, 4096), (16, 2048), (1, 8192), (256, 2048)]
EXTEND_CONFIGS = [(64, 64, 4, 2), (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3), (64, 32, 4, 4),
                  (128, 64, 8, 4), (128, 32, 8, 3), (128, 32, 4, 3), (64, 64, 4, 4), (128, 32, 8, 4)]

# --cold-l2: written before every timed call (larger than the H200's 50 MB L2); its own time is
# measured alone and subtracted from graph timings
L2_FLUSH: list[torch.Tensor] = []


def _flush() -> None:
    for buf in L2_FLUSH:
        buf.zero_()


def graph_us(run, reps: int = 8) -> float:
    """Device time of one run(), from a CUDA graph of `reps` back-to-back calls (run called once
    first); with --cold-l2 each call follows an L2 flush, whose time alone is subtracted."""
    def replay_us(fn) -> float:
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        return bk.bench_ms(graph.replay) * 1e3 / reps

    if not L2_FLUSH:
        return replay_us(run)
    return replay_us(lambda: (_flush(), run())) - replay_us(_flush)


def kernel_us(run, reps: int = 20) -> dict[str, float]:
    """Device time per call of each Triton kernel that run() launches (torch.profiler, eager calls;
    an L2 flush before each call with --cold-l2, not counted)."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            _flush()
            run()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0 and e.key.startswith("_"):
            out[e.key] = t / reps
    return out


class _DecodeCfg:
    """Context manager: stage-1 decode config (BLOCK_N, num_warps, num_stages) for every call."""

    def __init__(self, cfg: tuple[int, int, int]):
        self.cfg, self.base = cfg, dec_mod._pick_config

    def __enter__(self):
        base, (bn, w, s) = self.base, self.cfg
        dec_mod._pick_config = lambda *a: {**base(*a), "BLOCK_N": bn, "num_warps": w, "num_stages": s,
                                           "many_per_sm": 0}  # the warps as given (launch_warps)

    def __exit__(self, *exc):
        dec_mod._pick_config = self.base


class _Force:
    """Stand-in for a Triton kernel that overrides some launch keywords (e.g. PACK_GQA=False)."""

    def __init__(self, kernel, **overrides):
        self.kernel, self.overrides = kernel, overrides

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *a, **kw: launch(*a, **{**kw, **self.overrides})


def cascade_batch(batch: int, prefix: int, suffix_lo: int, suffix_hi: int, seed: int = 0):
    """One group of `batch` requests sharing `prefix` tokens: launcher kwargs and the fp32 reference."""
    gen = torch.Generator().manual_seed(seed)
    suffix = torch.randint(suffix_lo, suffix_hi + 1, (batch,), generator=gen)
    seq = (prefix + suffix).tolist()
    pool = bk.Pool(sum(triton.cdiv(s, PAGE) * PAGE for s in seq))
    table = pool.page_table(seq)
    table[:, : prefix // PAGE] = table[0, : prefix // PAGE]
    args = dict(q=torch.randn(batch, HQ, D, device=DEV, dtype=bk.BF16), k_buffer=pool.k, v_buffer=pool.v,
                page_table=table, seq_lens=torch.tensor(seq, **INTS),
                kv_start=torch.full((batch,), prefix, **INTS), group_members=torch.arange(batch, **INTS),
                group_starts=torch.tensor([0, batch], **INTS),
                group_prefix_lens=torch.tensor([prefix], **INTS),
                page_size=PAGE, scale=None)
    return args, bk.REF.cascade_decode_attention_ref(*args.values())


def _fused_cascade(args: dict, out: torch.Tensor, tile: tuple, prefix_splits: int, batch: int):
    t = K.CascadeTile(*tile)
    return lambda: K.cascade_decode_attention(**args, num_kv_splits=1, num_prefix_splits=prefix_splits,
                                              max_group_size=batch, out=out, tile=t)


def _time_cascade(args, ref, out, tile, ps, label: str) -> tuple[dict, float] | None:
    """Profiler times of one fused cascade call and its error, or None if it does not run."""
    try:
        run = _fused_cascade(args, out, tile, ps, 128)
        times = kernel_us(run)
        out.fill_(float("nan"))
        run()
        return times, bk.rel_err(out, ref)
    except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
        print(f"  {label}: {type(e).__name__}: {str(e)[:80]}", flush=True)
        return None


def cascade_part(rows: list[dict]) -> None:
    args, ref = cascade_batch(128, PREFIX_LEN, 128, 192)
    out = torch.empty_like(args["q"])
    shape = "B=128 prefix=2048 suffix=128-192"
    prefix_us = {}
    with _DecodeCfg(OLD_SUFFIX):  # 1) prefix tiles x splits, the suffix at the old default
        for tile in PREFIX_TILES:
            for ps in PREFIX_SPLITS:
                if (r := _time_cascade(args, ref, out, tile, ps, f"prefix {tile} x{ps}")) is None:
                    continue
                times, err = r
                prefix_us[tile, ps] = times.get("_cascade_prefix_kernel", float("nan"))
                rows.append({"part": "cascade-prefix", "shape": shape, "tile": list(tile),
                             "prefix_splits": ps, "kernels_us": times, "rel_err": err})
                print(f"  prefix tile {tile!s:17s} x{ps}: prefix {prefix_us[tile, ps]:5.1f} us, suffix "
                      f"{times.get('_decode_split_kernel', float('nan')):5.1f} us, err {err:.1e}", flush=True)
    best = sorted(prefix_us, key=prefix_us.get)[:3]
    suffix_us = {}
    for cfg in SUFFIX_CONFIGS:  # 2) suffix configs with the best prefix tile
        with _DecodeCfg(cfg):
            r = _time_cascade(args, ref, out, *best[0], f"suffix {cfg}")
        if r is None:
            continue
        times, err = r
        suffix_us[cfg] = times.get("_decode_split_kernel", float("nan"))
        rows.append({"part": "cascade-suffix", "shape": shape, "suffix_cfg": list(cfg),
                     "tile": list(best[0][0]), "prefix_splits": best[0][1], "kernels_us": times,
                     "rel_err": err})
        print(f"  suffix (BN, warps, stages) {cfg!s:13s}: suffix {suffix_us[cfg]:5.1f} us, err {err:.1e}",
              flush=True)
    combos = [(OLD_PREFIX_TILE, 4, OLD_SUFFIX)]
    combos += [(t, s, c) for (t, s) in best for c in sorted(suffix_us, key=suffix_us.get)[:2]]
    cascade_graphs(rows, list(dict.fromkeys(combos)), args)


def cascade_graphs(rows: list[dict], combos: list[tuple], args128: dict) -> None:
    """3) whole calls in a CUDA graph: the previous default against the best pairs, 4 batch sizes."""
    for batch in (128, 32, 64, 256):
        a = args128 if batch == 128 else cascade_batch(batch, PREFIX_LEN, 128, 192)[0]
        o = torch.empty_like(a["q"])
        for tile, ps, cfg in combos:
            try:
                with _DecodeCfg(cfg):
                    us = graph_us(_fused_cascade(a, o, tile, ps, batch))
            except Exception as e:  # noqa: BLE001
                print(f"  graph B={batch} {tile} x{ps} {cfg}: {type(e).__name__}", flush=True)
                continue
            rows.append({"part": "cascade-graph", "batch": batch, "tile": list(tile), "prefix_splits": ps,
                         "suffix_cfg": list(cfg), "graph_us": us})
            print(f"graph B={batch:3d} prefix tile {tile!s:17s} x{ps} suffix {cfg!s:12s}: {us:6.1f} us",
                  flush=True)


def decode_part(rows: list[dict]) -> None:
    pool = bk.Pool(max(b * c for b, c in DECODE_SHAPES) + 4096)
    for batch, ctx in DECODE_SHAPES:
        res = []
        for cfg in DECODE_CONFIGS:
            try:
                with _DecodeCfg(cfg):
                    r = bk.decode_case(pool, batch, ctx, check=True)
            except Exception as e:  # noqa: BLE001
                print(f"decode B={batch} ctx={ctx} {cfg}: {type(e).__name__}: {str(e)[:80]}", flush=True)
                continue
            res.append((r["ms"] * 1e3, cfg, r))
            rows.append({"part": "decode", "batch": batch, "ctx": ctx, "cfg": list(cfg), "us": r["ms"] * 1e3,
                         "splits": r["splits"], "tb_s": r["bytes_per_s"] / 1e12, "rel_err": r["rel_err"]})
        base = next((us for us, cfg, _ in res if cfg == DECODE_CONFIGS[0]), None)
        for us, cfg, r in sorted(res, key=lambda x: x[0]):
            vs = f"  x{base / us:4.2f} vs {DECODE_CONFIGS[0]}" if base else ""
            print(f"decode B={batch:3d} ctx={ctx:5d} splits={r['splits']:2d} (BN, warps, stages) "
                  f"{cfg!s:13s}: {us:7.1f} us {r['bytes_per_s'] / 1e12:5.2f} TB/s{vs}"
                  f"  err {r['rel_err']:.1e}", flush=True)


def extend_shape(name: str, pool: bk.Pool, prefix_lens: list[int], extend_lens: list[int],
                 shared_prefix: int = 0):
    """(name, run, causal FLOPs) of one extend launch over random data."""
    table = pool.page_table([p + e for p, e in zip(prefix_lens, extend_lens, strict=True)])
    if shared_prefix:
        table[:, : shared_prefix // PAGE] = table[0, : shared_prefix // PAGE]
    t = sum(extend_lens)
    q = torch.randn(t, HQ, D, device=DEV, dtype=bk.BF16)
    k = torch.randn(t, HKV, D, device=DEV, dtype=bk.BF16)
    v = torch.randn(t, HKV, D, device=DEV, dtype=bk.BF16)
    ext = torch.tensor(extend_lens, **INTS)
    meta = (torch.tensor(prefix_lens, **INTS), ext, torch.cumsum(ext, 0, dtype=torch.int32) - ext)
    pairs = sum(p * e + e * (e + 1) // 2 for p, e in zip(prefix_lens, extend_lens, strict=True))
    out = torch.empty_like(q)
    max_seq_len = max(p + e for p, e in zip(prefix_lens, extend_lens, strict=True))

    def run():
        K.extend_attention(q, k, v, pool.k, pool.v, table, *meta, PAGE, None, max(extend_lens), out=out,
                           max_seq_len=max_seq_len)
    return name, run, 4 * HQ * D * pairs


def extend_shapes() -> list[tuple]:
    pool = bk.Pool(400_000)
    sp = PREFIX_LEN
    return [
        extend_shape("shared-prefix pass 1: 64 x 128 over 2048 shared", pool, [sp] * 64, [128] * 64, sp),
        extend_shape("shared-prefix pass 2: 63 x 128 + 65 decode rows", pool,
                     [sp] * 63 + [sp + 128] * 65, [128] * 63 + [1] * 65, sp),
        extend_shape("prefill 1 x 8192", pool, [0], [8192]),
        extend_shape("prefill 16 x 512", pool, [0] * 16, [512] * 16),
        extend_shape("leader 1 x 2176", pool, [0], [2176]),
        extend_shape("4096 cached + 4096 new", pool, [4096], [4096]),
    ]


def extend_part(rows: list[dict]) -> None:
    shapes = extend_shapes()
    base_cfg, kernel = ext_mod._pick_config, ext_mod._extend_attn_kernel
    table = {}
    try:
        for cfg in EXTEND_CONFIGS:
            ext_mod._pick_config = lambda head_dim, device, *_, c=cfg: {
                "BLOCK_M": c[0], "BLOCK_N": c[1], "BLOCK_D": 128, "num_warps": c[2], "num_stages": c[3],
                "USE_TMA": False, "M_MAJOR": True}
            for name, run, flops in shapes:
                try:
                    table[cfg, name] = us = bk.bench_ms(run) * 1e3
                except Exception as e:  # noqa: BLE001
                    print(f"extend {cfg} {name}: {type(e).__name__}: {str(e)[:80]}", flush=True)
                    continue
                rows.append({"part": "extend", "config": list(cfg), "shape": name, "us": us,
                             "tflops": flops / us / 1e6})
        ext_mod._pick_config = base_cfg
        name, run, _ = shapes[1]
        ext_mod._extend_attn_kernel = _Force(kernel, PACK_GQA=False)
        unpacked = bk.bench_ms(run) * 1e3
        ext_mod._extend_attn_kernel = kernel
        packed = bk.bench_ms(run) * 1e3
        rows.append({"part": "extend-pack", "shape": name, "packed_us": packed, "unpacked_us": unpacked})
        print(f"{name}: GQA-packed decoding rows {packed:.0f} us, unpacked {unpacked:.0f} us", flush=True)
    finally:
        ext_mod._pick_config, ext_mod._extend_attn_kernel = base_cfg, kernel
    names = [s[0] for s in shapes]
    print("extend us per config (rows) and shape (columns):\nconfig            "
          + " | ".join(n[:26] for n in names) + " | sum", flush=True)
    for cfg in EXTEND_CONFIGS:
        vals = [table.get((cfg, n)) for n in names]
        cells = " | ".join(f"{v:26.0f}" if v else f"{'-':>26s}" for v in vals)
        print(f"{cfg!s:18s}{cells} | {sum(v for v in vals if v is not None):.0f}", flush=True)


PARTS = {"cascade": cascade_part, "decode": decode_part, "extend": extend_part}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", nargs="+", default=list(PARTS), choices=list(PARTS))
    p.add_argument("--out", default="sweep_attention.json")
    p.add_argument("--cold-l2", action="store_true",
                   help="flush L2 before every timed call (engine-like: K/V come from HBM)")
    ns = p.parse_args(argv)
    if ns.cold_l2:
        L2_FLUSH.append(torch.empty(256 << 18, dtype=torch.float32, device=DEV))
    rows: list[dict] = [{"part": "settings", "cold_l2": ns.cold_l2}]
    try:
        for part in ns.part:
            print(f"--- {part}", flush=True)
            PARTS[part](rows)
    finally:
        write_json(ns.out, {**run_header(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
