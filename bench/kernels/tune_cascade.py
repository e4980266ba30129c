"""Decode-side attention sweeps on one CUDA GPU (Qwen2.5-7B heads: 28 query, 4 KV, dim 128, page 16).

    python3 bench/kernels/tune_cascade.py [--part cascade decode1 extend] [--out FILE.json]

cascade : one group of B decoding requests sharing a 2,048-token prefix, private suffixes of
          128-192 tokens (the `shared-prefix` workload's decode; also 400-512 at B=128): the
          three-launch form (prefix, suffix splits, merge) at the launcher's defaults against the
          fused two-launch form (one suffix split that merges the prefix itself) over prefix tiles
          x prefix split counts. Times are per call, from a CUDA graph of 8 calls (as layers run).
decode1 : plain decode at B=256 over ~768 tokens (the `random` workload's late decode), one split:
          the split kernel writing the output itself against split + merge stage.
extend  : extend-attention configs over the prefill shapes of the workloads, including the mixed
          pass of `shared-prefix` (63 x 128 new tokens + 65 decoding rows over a shared 2,048-token
          prefix), with and without GQA packing of the decoding rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kernels as bk  # noqa: E402

K = bk.K
ext_mod = sys.modules["radixrt.kernels.extend_attention"]
dec_mod = sys.modules["radixrt.kernels.decode_attention"]
HQ, HKV, D, PAGE, DEV = bk.HQ, bk.HKV, bk.D, bk.PAGE, bk.DEV
INTS = {"dtype": torch.int32, "device": DEV}
PREFIX_TILES = [(128, 64, 8, 2), (128, 64, 4, 2), (128, 32, 4, 2), (128, 64, 8, 3), (128, 128, 8, 2),
                (64, 64, 4, 2), (64, 32, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2)]
PREFIX_SPLITS = [2, 3, 4, 5, 6, 8, 10, 12]
PREFIX_LEN = 2048
# (batch, suffix min, suffix max, sweep tiles x splits)
CASCADE_SHAPES = [(128, 128, 192, True), (64, 128, 192, False), (32, 128, 192, False), (256, 128, 192, False),
                  (128, 400, 512, False), (16, 128, 192, False)]
DECODE1_SHAPES = [(256, 768), (160, 640), (128, 2200)]
EXTEND_CONFIGS = [(128, 64, 8, 3), (128, 64, 8, 2), (128, 32, 4, 2), (128, 32, 4, 3), (128, 64, 4, 3),
                  (128, 128, 8, 2), (64, 64, 4, 2), (64, 32, 4, 3), (64, 64, 4, 3)]


# Cold-L2 mode (tune_pipelined.py --cold-l2): every timed call is preceded by a write of this buffer
# (larger than the H200's 50 MB L2), as in the engine, where a layer's weights stream through L2
# between two attention calls; the flush's own time is measured alone and subtracted.
L2_FLUSH: torch.Tensor | None = None


def set_cold_l2(on: bool, megabytes: int = 256) -> None:
    global L2_FLUSH
    L2_FLUSH = torch.empty(megabytes << 18, dtype=torch.float32, device=DEV) if on else None


def _flush() -> None:
    if L2_FLUSH is not None:
        L2_FLUSH.zero_()


def _graph_us(run, reps: int) -> float:
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            run()
    return bk.bench_ms(graph.replay) * 1e3 / reps


def graph_us(run, reps: int = 8) -> float:
    """Device time of one run(), from a CUDA graph of `reps` back-to-back calls (run called once
    first); in cold-L2 mode each call follows an L2 flush, whose time alone is subtracted."""
    if L2_FLUSH is None:
        return _graph_us(run, reps)
    return _graph_us(lambda: (_flush(), run()), reps) - _graph_us(_flush, reps)


def kernel_us(run, reps: int = 20) -> dict[str, float]:
    """Device time per call of each Triton kernel that run() launches (torch.profiler, eager calls;
    in cold-L2 mode each call follows an L2 flush, which is not a Triton kernel and is not counted)."""
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


class _Force:
    """Stand-in for a Triton kernel that overrides some launch keywords (bench experiments)."""

    def __init__(self, kernel, **overrides):
        self.kernel, self.overrides = kernel, overrides

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *a, **kw: launch(*a, **{**kw, **self.overrides})


def cascade_batch(batch: int, prefix: int, suffix_lo: int, suffix_hi: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    suffix = torch.randint(suffix_lo, suffix_hi + 1, (batch,), generator=gen)
    seq = (prefix + suffix).tolist()
    pool = bk.Pool(sum(triton.cdiv(s, PAGE) * PAGE for s in seq))
    table = pool.page_table(seq)
    table[:, : prefix // PAGE] = table[0, : prefix // PAGE]
    args = dict(q=torch.randn(batch, HQ, D, device=DEV, dtype=bk.BF16), k_buffer=pool.k, v_buffer=pool.v,
                page_table=table, seq_lens=torch.tensor(seq, **INTS), kv_start=torch.full((batch,), prefix, **INTS),
                group_members=torch.arange(batch, **INTS), group_starts=torch.tensor([0, batch], **INTS),
                group_prefix_lens=torch.tensor([prefix], **INTS), page_size=PAGE, scale=None)
    ref = bk.REF.cascade_decode_attention_ref(*args.values())
    return args, ref, int(suffix.max())


def cascade_part(rows: list[dict]) -> None:
    for batch, lo, hi, full in CASCADE_SHAPES:
        cascade_shape(rows, batch, lo, hi, full)


def cascade_shape(rows: list[dict], batch: int, lo: int, hi: int, full: bool) -> None:
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    args, ref, max_suffix = cascade_batch(batch, PREFIX_LEN, lo, hi)
    out = torch.empty_like(args["q"])
    shape = f"B={batch} prefix={PREFIX_LEN} suffix={lo}-{hi}"

    def measure(form: str, splits: int, tile: tuple, psplits: int) -> dict:
        t = K.CascadeTile(*tile)

        def run():
            K.cascade_decode_attention(**args, num_kv_splits=splits, num_prefix_splits=psplits,
                                       max_group_size=batch, out=out, tile=t)
        out.fill_(float("nan"))
        us = graph_us(run)
        err = bk.rel_err(out, ref)
        row = {"part": "cascade", "shape": shape, "batch": batch, "form": form, "suffix_splits": splits,
               "tile": list(tile), "prefix_splits": psplits, "us": us, "rel_err": err}
        rows.append(row)
        return row

    base_tile = sys.modules["radixrt.kernels.cascade_attention"].default_tile(D, DEV)
    base = (base_tile.block_m, base_tile.block_n, base_tile.num_warps, base_tile.num_stages)
    auto_p = K.choose_num_prefix_splits(1, batch, HQ, HKV, PREFIX_LEN, num_sms, block_m=base[0])
    three = measure("three-launch", max(2, min(16, K.choose_num_kv_splits(batch, HKV, max_suffix, num_sms))),
                    base, auto_p)
    fused = measure("fused", 1, base, auto_p)
    print(f"{shape}: three-launch {three['us']:.1f} us (splits {three['suffix_splits']}+{auto_p}), "
          f"fused {fused['us']:.1f} us; tile {base}", flush=True)
    if not full:
        return
    sweep = []
    for tile in PREFIX_TILES:
        for ps in PREFIX_SPLITS:
            try:
                sweep.append(measure("fused", 1, tile, ps))
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                print(f"  tile {tile} splits {ps}: {type(e).__name__}: {str(e)[:80]}", flush=True)
    for r in sorted(sweep, key=lambda r: r["us"])[:15]:
        print(f"  fused tile {tuple(r['tile'])} prefix splits {r['prefix_splits']:2d}: {r['us']:6.1f} us "
              f"(err {r['rel_err']:.1e})", flush=True)
    best = [tuple(r["tile"]) for r in sorted(sweep, key=lambda r: r["us"])[:2]]
    breakdown(rows, args, batch, shape, [base, *best], sorted({auto_p, 3, 4}))


def breakdown(rows: list[dict], args: dict, batch: int, shape: str, tiles: list[tuple], psplits: list[int]) -> None:
    """Per-kernel device times (profiler) of the three-launch form, the fused form, and the fused form
    without its prefix merge (PREFIX_SLOTS=0: a wrong result, to time the merge) or other suffix
    blocks/warps."""
    out = torch.empty_like(args["q"])
    split_kernel, pick = dec_mod._decode_split_kernel, dec_mod._pick_config
    variants = [("three-launch", 2, {}, None), ("fused", 1, {}, None),
                ("fused, no prefix merge (timing only)", 1, {"PREFIX_SLOTS": 0}, None),
                ("fused, suffix BN 64", 1, {}, {"BLOCK_N": 64}),
                ("fused, suffix BN 64 s3", 1, {}, {"BLOCK_N": 64, "num_stages": 3}),
                ("fused, suffix w2", 1, {}, {"num_warps": 2})]
    for tile in dict.fromkeys(tiles):
        for ps in psplits:
            for name, splits, force, cfg in variants:
                breakdown_one(rows, args, batch, shape, out, tile, ps, name, splits, force, cfg, split_kernel, pick)


def breakdown_one(rows, args, batch, shape, out, tile, ps, name, splits, force, cfg, split_kernel, pick) -> None:
    t = K.CascadeTile(*tile)

    def run():
        K.cascade_decode_attention(**args, num_kv_splits=splits, num_prefix_splits=ps, max_group_size=batch,
                                   out=out, tile=t)
    try:
        if force:
            dec_mod._decode_split_kernel = _Force(split_kernel, **force)
        if cfg:
            dec_mod._pick_config = lambda *a: {**pick(*a), **cfg}
        times = kernel_us(run)
        us = graph_us(run)
    except Exception as e:  # noqa: BLE001
        print(f"  {name} tile {tile} x{ps}: {type(e).__name__}: {str(e)[:80]}", flush=True)
        return
    finally:
        dec_mod._decode_split_kernel, dec_mod._pick_config = split_kernel, pick
    rows.append({"part": "cascade-breakdown", "shape": shape, "variant": name, "tile": list(tile),
                 "prefix_splits": ps, "graph_us": us, "kernels_us": times})
    print(f"  {name:36s} tile {tile!s:17s} x{ps}: graph {us:5.1f} us; "
          + ", ".join(f"{k} {v:.1f}" for k, v in times.items()), flush=True)


def decode1_part(rows: list[dict]) -> None:
    pool = bk.Pool(max(b * c for b, c in DECODE1_SHAPES) + 1024)
    for batch, ctx in DECODE1_SHAPES:
        decode1_shape(rows, pool, batch, ctx)


def decode1_shape(rows: list[dict], pool: bk.Pool, batch: int, ctx: int) -> None:
    seq_lens = torch.full((batch,), ctx, **INTS)
    table = pool.page_table([ctx] * batch)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=bk.BF16)
    out = torch.empty_like(q)
    mid_o = torch.empty(batch, HQ, 1, D, device=DEV, dtype=torch.float32)
    mid_lse = torch.empty(batch, HQ, 1, device=DEV, dtype=torch.float32)
    scale = D ** -0.5 * dec_mod.LOG2E

    def direct():
        K.decode_attention(q, pool.k, pool.v, table, seq_lens, PAGE, None, 1, out=out, mid_o=mid_o, mid_lse=mid_lse)

    def two_stage():
        dec_mod.run_split_stage(q, pool.k, pool.v, table, seq_lens, None, PAGE, scale, 1, mid_o, mid_lse)
        dec_mod.run_merge_stage(mid_o, mid_lse, out, 1)
    a, b = graph_us(direct), graph_us(two_stage)
    auto = K.choose_num_kv_splits(batch, HKV, ctx, torch.cuda.get_device_properties(0).multi_processor_count)
    rows.append({"part": "decode1", "batch": batch, "ctx": ctx, "direct_us": a, "split_merge_us": b,
                 "auto_splits": auto})
    print(f"decode B={batch} ctx={ctx}: one split direct {a:.1f} us, split+merge {b:.1f} us "
          f"(auto splits {auto})", flush=True)


def extend_shape(name: str, pool: bk.Pool, prefix_lens: list[int], extend_lens: list[int],
                 shared_prefix: int = 0):
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

    def run():
        K.extend_attention(q, k, v, pool.k, pool.v, table, *meta, PAGE, None, max(extend_lens), out=out,
                           max_seq_len=max(p + e for p, e in zip(prefix_lens, extend_lens, strict=True)))
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
    base_cfg = ext_mod._pick_config
    kernel = ext_mod._extend_attn_kernel
    try:
        table = {}
        for cfg in EXTEND_CONFIGS:
            ext_mod._pick_config = lambda head_dim, device, *_, c=cfg: {
                "BLOCK_M": c[0], "BLOCK_N": c[1], "BLOCK_D": 128, "num_warps": c[2], "num_stages": c[3]}
            for name, run, flops in shapes:
                try:
                    us = bk.bench_ms(run) * 1e3
                except Exception as e:  # noqa: BLE001
                    print(f"extend {cfg} {name}: {type(e).__name__}: {str(e)[:80]}", flush=True)
                    continue
                table[cfg, name] = us
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
        ext_mod._pick_config = base_cfg
        ext_mod._extend_attn_kernel = kernel
    names = [s[0] for s in shapes]
    print("extend us per config (rows) and shape (columns):", flush=True)
    print("config            " + " | ".join(n[:26] for n in names) + " | sum", flush=True)
    for cfg in EXTEND_CONFIGS:
        vals = [table.get((cfg, n)) for n in names]
        total = sum(v for v in vals if v is not None)
        print(f"{cfg!s:18s}" + " | ".join(f"{v:26.0f}" if v else f"{'-':>26s}" for v in vals) + f" | {total:.0f}",
              flush=True)


def sweep_main(doc: str, parts: dict, default_out: str) -> int:
    """CLI shared by the sweep scripts: run the `--part`s (names of `parts`, each a function filling a
    list of result rows) in order, printing a header per part, and write the rows as JSON to `--out`
    even when a part fails. `--cold-l2`: time every call after an L2 flush (set_cold_l2)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", nargs="+", default=list(parts), choices=list(parts))
    p.add_argument("--out", default=default_out)
    p.add_argument("--cold-l2", action="store_true",
                   help="flush L2 before every timed call (engine-like: K/V come from HBM); graph and profiler times")
    ns = p.parse_args()
    set_cold_l2(ns.cold_l2)
    rows: list[dict] = [{"part": "settings", "cold_l2": ns.cold_l2}]
    try:
        for part in ns.part:
            print(f"--- {part}", flush=True)
            parts[part](rows)
    finally:
        Path(ns.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


def main() -> int:
    return sweep_main(__doc__, {"cascade": cascade_part, "decode1": decode1_part, "extend": extend_part},
                      "tune_cascade.json")


if __name__ == "__main__":
    sys.exit(main())
