"""Tile and pipeline-depth sweep of the paged attention kernels on one CUDA GPU (Qwen2.5-7B heads).

    python3 bench/kernels/tune_pipelined.py [--part cascade decode extend] [--out FILE.json]

The paged loops load each block's page ids one step ahead (kernels/decode_attention.py,
prefetch_pages), which lets Triton's pipeliner keep num_stages - 1 K/V blocks in flight; with 2
stages nothing overlaps, so the useful configs now have 3 or 4 stages, and fewer programs fit on
an SM. This sweep picks the defaults again:

cascade : 128 decoding requests sharing a 2,048-token prefix with 128-192 private tokens each (the
          `shared-prefix` decode), fused form. Prefix-stage tiles x prefix splits (per-kernel
          profiler times), then suffix-stage configs, then the best pairs and the old default in a
          CUDA graph, also at 32, 64 and 256 requests.
decode  : plain decode, configs (key block, warps, stages) over batch x context shapes (graph replay).
extend  : extend configs over the prefill shapes of the workloads (tune_cascade.extend_shapes).
Every timed variant also reports its error against the fp32 reference where one is cheap.
--cold-l2 flushes L2 before every timed call of the cascade part: in the engine the prefix K/V come
from HBM, and with them hot in L2 (the default) the 128-row tile measured 17.7 against 20.3 us but
equal in the engine (docs/benchmarks.md, session 5). (decode and extend time through
bench_kernels, which does not flush.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kernels as bk  # noqa: E402
import tune_cascade as tc  # noqa: E402

K = bk.K
dec_mod, ext_mod = tc.dec_mod, tc.ext_mod
OLD_PREFIX_TILE = (64, 64, 4, 2)
PREFIX_TILES = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 3), (64, 32, 4, 4), (64, 64, 4, 4),
                (128, 64, 8, 3), (128, 32, 8, 3), (128, 32, 8, 4), (128, 64, 4, 3)]
PREFIX_SPLITS = [2, 3, 4, 8]
OLD_SUFFIX = (64, 4, 2)
SUFFIX_CONFIGS = [(64, 4, 2), (64, 4, 3), (32, 4, 3), (32, 4, 4), (64, 4, 4), (128, 4, 3), (32, 2, 4)]
DECODE_CONFIGS = [(128, 4, 2), (128, 4, 3), (64, 4, 3), (64, 4, 4), (32, 4, 4), (64, 8, 3), (128, 8, 3), (32, 4, 6)]
DECODE_SHAPES = [(128, 2200), (256, 768), (128, 400), (64, 4096), (16, 2048), (1, 8192), (256, 2048)]
EXTEND_CONFIGS = [(64, 64, 4, 2), (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3), (64, 32, 4, 4),
                  (128, 64, 8, 4), (128, 32, 8, 3), (128, 32, 4, 3), (64, 64, 4, 4), (128, 32, 8, 4)]


class _DecodeCfg:
    """Context manager: stage-1 decode config (BLOCK_N, num_warps, num_stages) for every call."""

    def __init__(self, cfg: tuple[int, int, int]):
        self.cfg, self.base = cfg, dec_mod._pick_config

    def __enter__(self):
        base, (bn, w, s) = self.base, self.cfg
        dec_mod._pick_config = lambda *a: {**base(*a), "BLOCK_N": bn, "num_warps": w, "num_stages": s}

    def __exit__(self, *exc):
        dec_mod._pick_config = self.base


def cascade_part(rows: list[dict]) -> None:
    args, ref, _ = tc.cascade_batch(128, tc.PREFIX_LEN, 128, 192)
    out = torch.empty_like(args["q"])
    shape = "B=128 prefix=2048 suffix=128-192"

    def run_with(tile, ps, batch=128, a=args, o=out):
        t = K.CascadeTile(*tile)
        return lambda: K.cascade_decode_attention(**a, num_kv_splits=1, num_prefix_splits=ps, max_group_size=batch,
                                                  out=o, tile=t)

    # 1) prefix tiles x splits (suffix at the old default)
    prefix_us = {}
    with _DecodeCfg(OLD_SUFFIX):
        for tile in PREFIX_TILES:
            for ps in PREFIX_SPLITS:
                try:
                    run = run_with(tile, ps)
                    times = tc.kernel_us(run)
                    out.fill_(float("nan"))
                    run()
                    err = bk.rel_err(out, ref)
                except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                    print(f"  prefix {tile} x{ps}: {type(e).__name__}: {str(e)[:80]}", flush=True)
                    continue
                p_us = times.get("_cascade_prefix_kernel", float("nan"))
                prefix_us[tile, ps] = p_us
                rows.append({"part": "cascade-prefix", "shape": shape, "tile": list(tile), "prefix_splits": ps,
                             "kernels_us": times, "rel_err": err})
                print(f"  prefix tile {tile!s:17s} x{ps}: prefix {p_us:5.1f} us, suffix "
                      f"{times.get('_decode_split_kernel', float('nan')):5.1f} us, err {err:.1e}", flush=True)
    best = sorted(prefix_us, key=prefix_us.get)[:3]
    # 2) suffix configs with the best prefix tile
    suffix_us = {}
    tile, ps = best[0]
    for cfg in SUFFIX_CONFIGS:
        try:
            with _DecodeCfg(cfg):
                run = run_with(tile, ps)
                times = tc.kernel_us(run)
                out.fill_(float("nan"))
                run()
                err = bk.rel_err(out, ref)
        except Exception as e:  # noqa: BLE001
            print(f"  suffix {cfg}: {type(e).__name__}: {str(e)[:80]}", flush=True)
            continue
        s_us = times.get("_decode_split_kernel", float("nan"))
        suffix_us[cfg] = s_us
        rows.append({"part": "cascade-suffix", "shape": shape, "suffix_cfg": list(cfg), "tile": list(tile),
                     "prefix_splits": ps, "kernels_us": times, "rel_err": err})
        print(f"  suffix (BN, warps, stages) {cfg!s:13s}: suffix {s_us:5.1f} us, err {err:.1e}", flush=True)
    best_suffix = sorted(suffix_us, key=suffix_us.get)[:2]
    # 3) whole calls in a CUDA graph: old default against the best pairs, at several batch sizes
    combos = list(dict.fromkeys([(OLD_PREFIX_TILE, 4, OLD_SUFFIX)] + [(t, s, c) for (t, s) in best for c in best_suffix]))
    for batch in (128, 32, 64, 256):
        if batch == 128:
            a, o = args, out
        else:
            a, _, _ = tc.cascade_batch(batch, tc.PREFIX_LEN, 128, 192)
            o = torch.empty_like(a["q"])
        for tile, ps, cfg in combos:
            try:
                with _DecodeCfg(cfg):
                    us = tc.graph_us(run_with(tile, ps, batch, a, o))
            except Exception as e:  # noqa: BLE001
                print(f"  graph B={batch} {tile} x{ps} {cfg}: {type(e).__name__}", flush=True)
                continue
            rows.append({"part": "cascade-graph", "batch": batch, "tile": list(tile), "prefix_splits": ps,
                         "suffix_cfg": list(cfg), "graph_us": us})
            print(f"graph B={batch:3d} prefix tile {tile!s:17s} x{ps} suffix {cfg!s:12s}: {us:6.1f} us", flush=True)


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
            print(f"decode B={batch:3d} ctx={ctx:5d} splits={r['splits']:2d} (BN, warps, stages) {cfg!s:13s}: "
                  f"{us:7.1f} us {r['bytes_per_s'] / 1e12:5.2f} TB/s"
                  + (f"  x{base / us:4.2f} vs {DECODE_CONFIGS[0]}" if base else "") + f"  err {r['rel_err']:.1e}",
                  flush=True)


def extend_part(rows: list[dict]) -> None:
    tc.EXTEND_CONFIGS = EXTEND_CONFIGS
    tc.extend_part(rows)


def main() -> int:
    return tc.sweep_main(__doc__, {"cascade": cascade_part, "decode": decode_part, "extend": extend_part},
                         "tune_pipelined.json")


if __name__ == "__main__":
    sys.exit(main())
