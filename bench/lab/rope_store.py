"""Rotary + K/V store: one launch (kernels.rope_store_kv) against the two it replaces (apply_rotary,
then store_kv), at Qwen2.5-7B's heads (28 query, 4 KV, D 128) over a bf16 and an FP8 pool.

    python3 bench/lab/rope_store.py [--out PATH]

Each form is a CUDA graph of 28 back-to-back calls (one per layer of a decode step, each on its own
layer-sized pool), PDL as the engine launches it, median of triton.testing.do_bench over the replays;
us per call. Before timing, the forms are checked bit-equal (q, k and the pool)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench import common  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
from radixrt.kernels import apply_rotary, build_rope_cache, rope_store_kv, store_kv  # noqa: E402

HQ, HKV, D, LAYERS, SLOTS = 28, 4, 128, 28, 65536


def case(tokens: int, pool_dtype: torch.dtype) -> dict:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(tokens)
    qkv = torch.randn(tokens, (HQ + 2 * HKV) * D, device=dev, dtype=torch.bfloat16, generator=gen)
    q, k, v = (x.view(tokens, -1, D) for x in qkv.split([HQ * D, HKV * D, HKV * D], dim=-1))
    positions = torch.randint(0, 4000, (tokens,), device=dev, generator=gen)
    cache = build_rope_cache(D, 4096, 1e6).to(dev)
    loc = torch.randperm(SLOTS - 1, device=dev, generator=gen)[:tokens] + 1
    scales = {"k_scale": 0.5, "v_scale": 0.5} if pool_dtype == torch.float8_e4m3fn else {}
    pools = [(torch.zeros(SLOTS, HKV, D, device=dev).to(pool_dtype), torch.zeros(SLOTS, HKV, D, device=dev)
              .to(pool_dtype)) for _ in range(LAYERS)]

    def two():
        for kb, vb in pools:
            apply_rotary(q, k, positions, cache)
            store_kv(kb, vb, loc, k, v, **scales)

    def one():
        for kb, vb in pools:
            rope_store_kv(q, k, v, positions, cache, kb, vb, loc, **scales)

    start = qkv.clone()
    two()
    after_two, pool_two = qkv.clone(), [p[0][loc].clone() for p in pools[:1]]
    qkv.copy_(start)
    one()
    equal = torch.equal(qkv, after_two) and torch.equal(pools[0][0][loc], pool_two[0])
    res = {"tokens": tokens, "pool": str(pool_dtype).split(".")[-1], "bit_equal": equal}
    for name, fn in (("two launches", two), ("one launch", one)):
        res[name] = common.graph_ms(fn) * 1e3 / LAYERS
    print(f"T={tokens:5d} {res['pool']:14s} two launches {res['two launches']:6.2f} us, one launch "
          f"{res['one launch']:6.2f} us ({res['one launch'] / res['two launches']:.3f}x), bit-equal {equal}",
          flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = {**common.run_header(), "cases": [case(t, dt) for dt in (torch.bfloat16, torch.float8_e4m3fn)
                                            for t in (1, 128, 256)]}
    common.write_json(args.out, out)
    return 0 if all(c["bit_equal"] for c in out["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
