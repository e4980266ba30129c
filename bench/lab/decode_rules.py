"""Whole decode-attention rules (launch config + split-count policy) side by side over the batch x
context shapes the engine runs, bf16 and FP8 pools, in one GPU run (issue 19).

    python3 bench/lab/decode_rules.py [--out decode-rules.json]

bench/lab/kv_layout.py (H200, 2026-12-03) found one split faster than the per-SM rule's 3 and 2 at
64 x 4,096 and 128 x 2,048 for most blocks, and 128-key blocks with 8 warps the best mean over the
two at one split (141.9 / 142.7 us against the default's 145.3 / 149.6; cuDNN 135.8 / 137.3). A
rule is used at every shape, so each candidate is timed here also where the split count matters
most: batch 1 (the batch-1 decode step), 16, and the classes of `random` (256 x 768) and
`shared-prefix` (128 x 2,200). Rules (kind "decode" or "decode_fp8" config, "decode_splits" or
"decode_splits_fp8" policy):
  bf16: the default (since 2026-12-03: 128-key blocks, 8 warps, 2 stages, the "waves" policy with
        occupancy 2, as FP8 pools use; 4 warps above 4 programs per SM: launch_warps); the old
        default (4 warps, the per-SM rule); 8 warps + waves at every program count; 4 warps / 3
        stages + waves; 64-key blocks / 3 stages + waves; 8 warps + the per-SM rule (the named
        rules pin their warps: many_per_sm 0)
  fp8:  the default (kv_dot "f16", 4 warps, 3 stages, waves; since 2026-12-03 above 4 programs per
        SM 64-key blocks with kv_dot "f16v": launch_config; "old f16" is the rule before); kv_dot "f16v"
        (V widened before its dot, no byte loads from shared memory, kernels/paged_loop.py V_WIDEN;
        measured slower on 2026-12-03) at four blocks; "f16" with 8 and 2 warps.
Each is checked against the fp32 reference (FP8: on the dequantized values) before it is timed;
cuDNN SDPA on contiguous K/V beside it. Timing: CUDA-graph replay, median of do_bench, L2 flushed.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kv_layout as kl  # noqa: E402

from bench.common import out_path, run_header, write_json  # noqa: E402

K, AC, B, D, HQ, HKV, PAGE, DEV = kl.K, kl.AC, kl.B, kl.D, kl.HQ, kl.HKV, kl.PAGE, kl.DEV
SHAPES = [(1, 512), (1, 2048), (1, 8192), (16, 2048), (64, 4096), (128, 2048), (128, 2208), (256, 768)]
WAVES = {"policy": "waves", "occupancy": 2, "merge_tokens": 256, "program_tokens": 128}
PER_SM = {"policy": "per_sm", "programs_per_sm": 4, "min_split_tokens": 128}
# the defaults before 2026-12-03
OLD_BF16 = {"decode": {B: {"BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "many_per_sm": 0}},
            "decode_splits": {B: PER_SM}}
BF16_RULES = {
    "default": {},
    "old 128x4w2s per-SM": OLD_BF16,
    "128x8w2s waves": {"decode": {B: {"BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "many_per_sm": 0}},
                       "decode_splits": {B: WAVES}},
    "128x4w3s waves": {"decode": {B: {"BLOCK_N": 128, "num_warps": 4, "num_stages": 3, "many_per_sm": 0}},
                       "decode_splits": {B: WAVES}},
    "64x4w3s waves": {"decode": {B: {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "many_per_sm": 0}},
                      "decode_splits": {B: WAVES}},
    "128x8w2s per-SM": {"decode": {B: {"BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "many_per_sm": 0}},
                        "decode_splits": {B: PER_SM}},
    # the default with the whole key blocks unmasked and the partial last one after the loop
    # (kernels/paged_loop.py PEEL_TAIL; 1: through masked loads, 2: through selects on whole loads, as
    # bench/lab/decode_vt.py's control; H200 2026-12-03: both within 1%, 1 x 8,192 4% slower)
    "peel": {"decode": {B: {"peel_tail": 1}}},
    "peel2": {"decode": {B: {"peel_tail": 2}}},
}


def _ws(block_n: int, warps: int, stages: int, occupancy: int = 2) -> dict:
    """A warp-split rule (kernels/paged_loop.py paged_attn_loop_ws) at one config, at every program
    count, with the "waves" split rule at `occupancy` programs per SM."""
    return {"decode": {B: {"BLOCK_N": block_n, "num_warps": warps, "num_stages": stages, "many_per_sm": 0,
                           "warp_split": True}},
            "decode_splits": {B: {**WAVES, "occupancy": occupancy}}}


# keys split across the warps (cuDNN's decode tiling; bench/lab/decode_vt.py ws_bf16, 2026-12-04:
# 64 x 2 warps x 3 stages 137.1 against the default's 139.3 us at 64 x 4,096)
for _cfg in ((64, 2, 3), (64, 2, 4), (128, 2, 3), (32, 2, 3), (64, 4, 3), (128, 4, 2)):
    BF16_RULES["ws {}x{}w{}s".format(*_cfg)] = _ws(*_cfg)
BF16_RULES["ws 64x2w3s occ4"] = _ws(64, 2, 3, 4)
FP8_RULES = {
    "default": {},
    # the default before 2026-12-04: no warp-split "long" config (long_min_tokens 0)
    "no long": {"decode_fp8": {B: {"long_min_tokens": 0}}},
    "old f16": {"decode_fp8": {B: {"kv_dot": "f16"}}},
    "f16v": {"decode_fp8": {B: {"kv_dot": "f16v"}}},
    "f16v 64x4w3s": {"decode_fp8": {B: {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "kv_dot": "f16v"}}},
    "f16v 128x4w2s": {"decode_fp8": {B: {"BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "kv_dot": "f16v"}}},
    "f16v 128x8w3s": {"decode_fp8": {B: {"BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "kv_dot": "f16v"}}},
    "128x8w3s": {"decode_fp8": {B: {"BLOCK_N": 128, "num_warps": 8, "num_stages": 3}}},
    "128x2w3s": {"decode_fp8": {B: {"BLOCK_N": 128, "num_warps": 2, "num_stages": 3}}},
    # kv_dot "f16" at smaller blocks / deeper pipelines: `random`'s decode batches (256 x 512-768,
    # 1,024 programs) run the FP8 pool at ~2.2 TB/s against bf16's ~3.6 (2026-12-03)
    "64x4w3s": {"decode_fp8": {B: {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3}}},
    "64x4w4s": {"decode_fp8": {B: {"BLOCK_N": 64, "num_warps": 4, "num_stages": 4}}},
    "64x2w4s": {"decode_fp8": {B: {"BLOCK_N": 64, "num_warps": 2, "num_stages": 4}}},
    "32x4w4s": {"decode_fp8": {B: {"BLOCK_N": 32, "num_warps": 4, "num_stages": 4}}},
    "128x4w4s": {"decode_fp8": {B: {"BLOCK_N": 128, "num_warps": 4, "num_stages": 4}}},
    # kv_dot "f16v8" (V in 8-byte pieces: its fp16 stores without 2-way bank conflicts; not run yet):
    # the "many" config's blocks with it, and the default's blocks with it
    "f16v8 64x4w3s": {"decode_fp8": {B: {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "kv_dot": "f16v8"}}},
    "f16v8 128x4w3s": {"decode_fp8": {B: {"BLOCK_N": 128, "num_warps": 4, "num_stages": 3,
                                          "kv_dot": "f16v8"}}},
    # the default with PEEL_TAIL (the default's launch_config kept; H200 2026-12-03, 64 x 4,096: 1 113.6
    # against 101.1 us; 2, the lab control's instruction mix, 115.6 against 101.2)
    "peel": {"decode_fp8": {B: {"peel_tail": 1}}},
    "peel2": {"decode_fp8": {B: {"peel_tail": 2}}},
}
# warp split over the FP8 pool (kv_dot "f16"; decode_vt.py ws_f16, 2026-12-04: 64 x 2 warps x 3 stages
# 88.0 against the default's 100.8 us at 64 x 4,096, 84.4 against 103.5 at 128 x 2,048)
for _cfg in ((64, 2, 3), (64, 2, 4), (64, 2, 2), (128, 2, 3), (32, 2, 3), (32, 2, 4), (128, 4, 3)):
    FP8_RULES["ws {}x{}w{}s".format(*_cfg)] = {"decode_fp8": {B: {
        "BLOCK_N": _cfg[0], "num_warps": _cfg[1], "num_stages": _cfg[2], "kv_dot": "f16",
        "warp_split": True}}}
for _occ in (4, 8):
    FP8_RULES[f"ws 64x2w3s occ{_occ}"] = {
        "decode_fp8": {B: {"BLOCK_N": 64, "num_warps": 2, "num_stages": 3, "kv_dot": "f16",
                           "warp_split": True}},
        "decode_splits_fp8": {B: {**WAVES, "occupancy": _occ}}}


for _name, _rule in FP8_RULES.items():  # a named rule runs its blocks at every program count and length
    if _name not in ("default", "no long", "peel", "peel2"):
        _rule["decode_fp8"][B]["many_per_sm"] = 0
        _rule["decode_fp8"][B]["long_min_tokens"] = 0


def shape_rows(batch: int, ctx: int, fp8: bool) -> list[dict]:
    q = torch.randn(batch, HQ, D, device=DEV, dtype=kl.BF16)
    kc = torch.randn(batch, HKV, ctx, D, device=DEV, dtype=kl.BF16)
    vc = torch.randn_like(kc)
    scales: dict = {}
    if fp8:
        k8, v8 = (kc / kl.K_SCALE).to(kl.FP8), (vc / kl.V_SCALE).to(kl.FP8)
        kc, vc = (k8.float() * kl.K_SCALE).to(kl.BF16), (v8.float() * kl.V_SCALE).to(kl.BF16)
        scales = {"k_scale": kl.K_SCALE, "v_scale": kl.V_SCALE}
    ref = kl.reference(q[:, :, None], kc, vc, False)[:, :, 0]
    cudnn = kl.peer_rows(q[:, :, None], kc, vc, False, None, ("cudnn",))["cudnn"].get("us")
    kb, vb, table = kl._paged(k8, v8, ctx) if fp8 else kl._paged(kc, vc, ctx)
    del kc, vc
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    out = torch.empty_like(q)
    num_sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    rows = []
    for name, table_over in (FP8_RULES if fp8 else BF16_RULES).items():
        with AC.overriding(table_over):
            splits = K.choose_num_kv_splits(batch, HKV, ctx, num_sms, kv_fp8=fp8)
            mid_o = torch.empty(batch, HQ, splits, D, device=DEV)
            mid_lse = torch.empty(batch, HQ, splits, device=DEV)
            # max_seq_len as the engine passes it (launch_config's length-dependent variants)
            run = partial(K.decode_attention, q, kb, vb, table, seq_lens, PAGE, None, splits, out=out,
                          mid_o=mid_o, mid_lse=mid_lse, max_seq_len=ctx, **scales)
            r = kl.timed(run, out, ref)
        rows.append({"pool": "fp8" if fp8 else "bf16", "shape": f"{batch} x {ctx}", "rule": name,
                     "splits": splits, "cudnn_us": cudnn, **r})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--pools", default="bf16,fp8", help="pools to run: bf16, fp8")
    p.add_argument("--shapes", default=None,
                   help="batch x context shapes, e.g. 256x512,64x4096 (default: SHAPES)")
    p.add_argument("--rules", default=None, help="rule names to run (default: all of the pool's)")
    ns = p.parse_args(argv)
    global SHAPES
    if ns.shapes:
        SHAPES = [tuple(int(v) for v in sh.split("x")) for sh in ns.shapes.split(",")]
    if ns.rules:
        keep = set(ns.rules.split(",")) | {"default"}
        for table in (BF16_RULES, FP8_RULES):
            for name in list(table):
                if name not in keep:
                    del table[name]
    if not torch.cuda.is_available():
        sys.exit("decode_rules needs a CUDA device")
    torch.manual_seed(0)
    t0 = time.time()
    result: dict = {**run_header(), "rows": []}
    pools = ns.pools.split(",")
    for fp8 in [p == "fp8" for p in pools]:
        for batch, ctx in SHAPES:
            result["rows"] += shape_rows(batch, ctx, fp8)
            torch.cuda.empty_cache()
            print(f"[{time.time() - t0:5.1f}s] {'fp8' if fp8 else 'bf16'} {batch} x {ctx}", flush=True)
        write_json(out_path(ns.out, "decode-rules.json"), result)
    for pool in pools:
        rules = list(FP8_RULES if pool == "fp8" else BF16_RULES)
        print(f"\n{pool} pool, us (splits); last column cuDNN on contiguous bf16 K/V")
        print("| shape | " + " | ".join(rules) + " | cuDNN |")
        print("|---|" + "---|" * (len(rules) + 1))
        for batch, ctx in SHAPES:
            shape = f"{batch} x {ctx}"
            by = {r["rule"]: r for r in result["rows"] if r["pool"] == pool and r["shape"] == shape}
            cells = [f"{by[n]['us']:.1f} ({by[n]['splits']})" if "us" in by[n] else by[n]["error"][:30]
                     for n in rules]
            cud = next(iter(by.values()))["cudnn_us"]
            print(f"| {shape} | " + " | ".join(cells) + (f" | {cud:.1f} |" if cud else " | - |"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
