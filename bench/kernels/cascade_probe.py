"""Why is the cascade prefix stage slower inside the engine than in bench_kernels.py? (GPU only)

The engine's shared-prefix run (2026-11-30) showed `_cascade_prefix_kernel` at ~128 us per layer,
against ~30 us in the kernel benchmark for the same shape (batch 128 sharing a 2,048-token prefix,
Qwen2.5-7B heads). This probe times that kernel (torch.profiler, device time per call) while
changing one engine condition at a time: the number of (padded, empty) groups, a strided q (a view
of the fused QKV output), the page-table width, the KV pool size, the integer specialisation of
the kernel, the tile and the split count.

    python3 bench/kernels/cascade_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.kernels_import import import_kernels  # noqa: E402

K = import_kernels()
import radixrt.kernels.cascade_attention as CA  # noqa: E402

HQ, HKV, D, PAGE = 28, 4, 128, 16
DEV = torch.device("cuda")


@dataclasses.dataclass
class Case:
    name: str
    groups: int = 1  # real group first, then empty groups (as a padded graph replay)
    strided_q: bool = False
    table_cols: int = 0  # 0: just enough pages; else this many columns
    pool_tokens: int = 1 << 16
    specialized: bool = False  # a copy of the kernel without do_not_specialize
    tile: tuple[int, int, int, int] | None = None
    prefix_splits: int = 0  # 0: choose_num_prefix_splits
    data: str = "randn"  # randn | large (values like an untrained model's activations)


def run_case(c: Case, batch: int = 128, prefix: int = 2048, calls: int = 20) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0)
    suffix = torch.randint(128, 192, (batch,), generator=gen)
    seq = (prefix + suffix).tolist()
    need = [triton.cdiv(s, PAGE) for s in seq]
    num_pages = max(c.pool_tokens // PAGE, sum(need) + 2)
    k = torch.randn(num_pages * PAGE, HKV, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    if c.data == "large":
        k.mul_(30.0)
        v.mul_(30.0)
    pages = torch.randperm(num_pages - 1, device=DEV)[: sum(need)] + 1
    cols = max(c.table_cols, max(need))
    table = torch.zeros(batch, cols, dtype=torch.int32, device=DEV)
    s = 0
    for i, n in enumerate(need):
        table[i, :n] = pages[s:s + n]
        s += n
    table[:, : prefix // PAGE] = table[0, : prefix // PAGE]
    ints = {"dtype": torch.int32, "device": DEV}
    seq_lens = torch.tensor(seq, **ints)
    kv_start = torch.full((batch,), prefix, **ints)
    members = torch.arange(batch, **ints)
    starts = torch.tensor([0] + [batch] * c.groups, **ints)
    prefix_lens = torch.tensor([prefix] + [0] * (c.groups - 1), **ints)
    if c.strided_q:
        qkv = torch.randn(batch, (HQ + 2 * HKV) * D, device=DEV, dtype=torch.bfloat16)
        q = qkv[:, : HQ * D].view(batch, HQ, D)
    else:
        q = torch.randn(batch, HQ, D, device=DEV, dtype=torch.bfloat16)
    if c.data == "large":
        q.mul_(30.0)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = min(16, K.choose_num_kv_splits(batch, HKV, 32768, num_sms))
    tile = CA.CascadeTile(*c.tile) if c.tile else None
    bm = tile.block_m if tile else CA.default_tile(D, DEV).block_m
    psplits = c.prefix_splits or CA.choose_num_prefix_splits(1, batch, HQ, HKV, 32768, num_sms, block_m=bm)
    orig = CA._cascade_prefix_kernel
    if c.specialized:
        CA._cascade_prefix_kernel = triton.jit(orig.fn)
    try:
        def call():
            return K.cascade_decode_attention(q, k, v, table, seq_lens, kv_start, members, starts, prefix_lens,
                                              PAGE, None, splits, psplits, batch, tile=tile)
        call()
        torch.cuda.synchronize()
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                call()
            torch.cuda.synchronize()
        times = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if t > 0 and "kernel" in e.key:
                times[e.key] = t / e.count
    finally:
        CA._cascade_prefix_kernel = orig
    row = {**dataclasses.asdict(c), "prefix_splits_used": psplits, "suffix_splits": splits,
           "prefix_us": times.get("_cascade_prefix_kernel"), "suffix_us": times.get("_decode_split_kernel"),
           "merge_us": times.get("_decode_merge_kernel")}
    print(f"{c.name:34s} prefix {row['prefix_us'] or 0:8.1f} us  suffix {row['suffix_us'] or 0:6.1f} us  "
          f"merge {row['merge_us'] or 0:6.1f} us  (prefix splits {psplits})", flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="cascade_probe.json")
    ns = p.parse_args()
    engine_like = dict(groups=8, strided_q=True, table_cols=2048, pool_tokens=1_600_000)
    cases = [
        Case("bench-like"),
        Case("8 groups (7 empty)", groups=8),
        Case("strided q", strided_q=True),
        Case("table 2048 cols", table_cols=2048),
        Case("pool 1.6M tokens", pool_tokens=1_600_000),
        Case("large values", data="large"),
        Case("specialized ints", specialized=True),
        Case("engine-like", **engine_like),
        Case("engine-like, specialized", specialized=True, **engine_like),
        Case("engine-like, large values", data="large", **engine_like),
        Case("engine-like, tile 128x128 w8 s2", tile=(128, 128, 8, 2), **engine_like),
        Case("engine-like, tile 64x64 w4 s2", tile=(64, 64, 4, 2), **engine_like),
        Case("engine-like, tile 128x64 w4 s3", tile=(128, 64, 4, 3), **engine_like),
        Case("engine-like, 2 prefix splits", prefix_splits=2, **engine_like),
        Case("engine-like, 10 prefix splits", prefix_splits=10, **engine_like),
    ]
    rows = []
    for c in cases:
        try:
            rows.append(run_case(c))
        except Exception as e:  # noqa: BLE001 - a probe: report and go on
            print(f"{c.name}: {type(e).__name__}: {e}", flush=True)
            rows.append({**dataclasses.asdict(c), "error": f"{type(e).__name__}: {e}"})
        Path(ns.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
