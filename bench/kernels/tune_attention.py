"""Block-size sweep for the attention kernels on one CUDA GPU (used to pick `_pick_config`).

    python3 bench/kernels/tune_attention.py [--part extend|extend-shared|decode|splits ...]

Times extend attention (8192 new; 4096 cached + 4096 new) and decode attention (several batch x
context shapes) at Qwen2.5-7B shapes for a handful of block/warp/stage choices, by swapping each
module's `_pick_config` for the run. Prints one line per (case, config), best first per case.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kernels as bk  # noqa: E402

ext_mod = sys.modules["radixrt.kernels.extend_attention"]
dec_mod = sys.modules["radixrt.kernels.decode_attention"]

EXTEND_CONFIGS = [(bm, bn, w, s) for bm, bn, w in [(128, 64, 8), (128, 128, 8), (64, 64, 4), (128, 32, 4),
                                                    (64, 32, 4), (128, 64, 4)] for s in (2, 3)]
DECODE_CONFIGS = [(bn, w, s) for bn in (32, 64, 128) for w in (2, 4, 8) for s in (2, 3, 4)]


def main() -> None:
    parser = argparse.ArgumentParser(description="attention block-size sweep")
    parser.add_argument("--part", nargs="+", default=["extend", "decode", "splits"])
    parts = parser.parse_args().part
    pool = bk.Pool(256 * 2048 + 8192)
    if "extend" in parts:
        tune_extend(pool)
    if "extend-shared" in parts:
        tune_extend_shared(pool)
    if "decode" in parts:
        tune_decode(pool)
    if "splits" in parts:
        tune_splits(pool)
    torch.cuda.synchronize()


def tune_extend(pool: bk.Pool) -> None:
    for prefix, new in [(0, 8192), (4096, 4096)]:
        rows = []
        for bm, bn, w, s in EXTEND_CONFIGS:
            ext_mod._pick_config = lambda head_dim, device, *_, c=(bm, bn, w, s): {
                "BLOCK_M": c[0], "BLOCK_N": c[1], "BLOCK_D": 128, "num_warps": c[2], "num_stages": c[3]}
            try:
                r = bk.extend_case(pool, prefix, new, check=False)
                rows.append((r["flops_per_s"], (bm, bn, w, s)))
            except Exception as e:  # e.g. out of shared memory
                print(f"extend {prefix}+{new} {(bm, bn, w, s)} failed: {type(e).__name__}: {str(e)[:80]}")
        for flops, cfg in sorted(rows, reverse=True):
            print(f"extend prefix={prefix} new={new} BM,BN,warps,stages={cfg}: {flops / 1e12:.0f} TFLOP/s", flush=True)


def shared_prefix_extend_case(pool: bk.Pool, batch: int = 64, prefix: int = 2048, new: int = 128) -> dict:
    """The second prefill pass of the `shared-prefix` workload: `batch` requests of `new` tokens each
    over one `prefix`-token prefix (the same pages), as the engine runs it."""
    table = pool.page_table([prefix + new] * batch)
    table[:, : prefix // bk.PAGE] = table[0, : prefix // bk.PAGE]
    t = batch * new
    q = torch.randn(t, bk.HQ, bk.D, device=bk.DEV, dtype=bk.BF16)
    k = torch.randn(t, bk.HKV, bk.D, device=bk.DEV, dtype=bk.BF16)
    v = torch.randn(t, bk.HKV, bk.D, device=bk.DEV, dtype=bk.BF16)
    ints = {"dtype": torch.int32, "device": bk.DEV}
    meta = (torch.full((batch,), prefix, **ints), torch.full((batch,), new, **ints),
            torch.arange(0, t, new, **ints))
    out = torch.empty_like(q)
    ms = bk.bench_ms(lambda: bk.K.extend_attention(q, k, v, pool.k, pool.v, table, *meta, bk.PAGE, None, new,
                                                   out=out))
    pairs = batch * (prefix * new + new * (new + 1) // 2)
    return {"ms": ms, "flops_per_s": 4 * bk.HQ * bk.D * pairs / (ms * 1e-3)}


def tune_extend_shared(pool: bk.Pool) -> None:
    base = ext_mod._pick_config
    rows = []
    for bm, bn, w, s in EXTEND_CONFIGS:
        ext_mod._pick_config = lambda head_dim, device, *_, c=(bm, bn, w, s): {
            "BLOCK_M": c[0], "BLOCK_N": c[1], "BLOCK_D": 128, "num_warps": c[2], "num_stages": c[3]}
        try:
            r = shared_prefix_extend_case(pool)
            rows.append((r["flops_per_s"], r["ms"], (bm, bn, w, s)))
        except Exception as e:  # e.g. out of shared memory
            print(f"extend-shared {(bm, bn, w, s)} failed: {type(e).__name__}: {str(e)[:80]}")
    ext_mod._pick_config = base
    for flops, ms, cfg in sorted(rows, reverse=True):
        print(f"extend-shared 64 x 128 new over 2048 shared BM,BN,warps,stages={cfg}: {ms * 1e3:.0f} us "
              f"{flops / 1e12:.0f} TFLOP/s", flush=True)


def tune_decode(pool: bk.Pool) -> None:
    base = dec_mod._pick_config
    for batch, ctx in [(64, 4096), (1, 32768), (4, 8192), (16, 2048), (256, 2048)]:
        rows = []
        for bn, w, s in DECODE_CONFIGS:
            dec_mod._pick_config = lambda head_dim, group, device, *_, c=(bn, w, s): {
                **base(head_dim, group, device), "BLOCK_N": c[0], "num_warps": c[1], "num_stages": c[2]}
            try:
                r = bk.decode_case(pool, batch, ctx, check=False)
                rows.append((r["bytes_per_s"], (bn, w, s), r["splits"]))
            except Exception as e:  # e.g. out of shared memory
                print(f"decode {(bn, w, s)} failed: {type(e).__name__}: {str(e)[:80]}")
        for bw, cfg, splits in sorted(rows, reverse=True)[:8]:
            print(f"decode B={batch} ctx={ctx} splits={splits} BN,warps,stages={cfg}: {bw / 1e12:.2f} TB/s", flush=True)
    dec_mod._pick_config = base


def tune_splits(pool: bk.Pool) -> None:
    """Programs per SM targeted by choose_num_kv_splits, and its cap; each run twice to show noise."""
    orig = bk.K.choose_num_kv_splits
    for batch, ctx in [(1, 4096), (1, 32768), (4, 8192), (16, 2048), (16, 8192), (64, 4096)]:
        for per_sm, cap in [(2, 64), (4, 64), (8, 64), (8, 128), (16, 128)]:
            bk.K.choose_num_kv_splits = lambda b, h, n, sms=132, mx=32, p=per_sm, c=cap: max(1, min(
                triton.cdiv(p * sms, b * h), triton.cdiv(n, 128), c))
            runs = [bk.decode_case(pool, batch, ctx, check=False) for _ in range(2)]
            print(f"decode B={batch} ctx={ctx} programs/SM={per_sm} cap={cap} splits={runs[0]['splits']}: "
                  + " ".join(f"{r['bytes_per_s'] / 1e12:.2f}" for r in runs) + " TB/s", flush=True)
    bk.K.choose_num_kv_splits = orig


if __name__ == "__main__":
    main()
