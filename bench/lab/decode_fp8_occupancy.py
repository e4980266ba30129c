"""FP8-pool decode attention at `random`'s decode batches: blocks, stages and a register cap
(`maxnreg`) for more programs per SM, in one GPU run (issue 19).

    python3 bench/lab/decode_fp8_occupancy.py [--out decode-fp8-occupancy.json]

Nsight Compute on the H200 (2026-12-03, `bench/lab/ncu_decode.py`, 256 x 512, the "many" config:
64-key blocks, 4 warps, 3 stages, kv_dot "f16v"): 58 us, DRAM at 50% of peak (2.4 TB/s), issue slots
47% busy, 0.89 eligible warps per scheduler, 4 programs per SM (116 registers per thread and 55 KB of
shared memory each: both limits at 4), shared-memory wavefronts 25% excessive. The bf16 pool at the
same shape: 73 us at 3.74 TB/s, 3 programs per SM. The kernel is latency-bound at that occupancy, so
this times configs that fit more programs per SM: 2 stages (less shared memory) with the register
count capped (Triton's `maxnreg` launch option; spills, if any, show as time).

The register cap was passed through a trial build's "maxnreg" config key (16:44 call), not kept:
the VARIANTS with a cap now report the config table's error (kv_layout.timed records it). `--splits`
times SPLIT_VARIANTS at 1-4 KV splits (not run yet). Each variant is checked against the fp32
reference on the dequantized values first. Timing:
CUDA-graph replay, median of do_bench, L2 flushed (kv_layout.timed).
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

SHAPES = [(256, 512), (256, 768), (64, 4096), (128, 2048)]
# --splits: configs that fit 4 programs per SM timed at 1-4 KV splits (more programs per launch: at
# 64 x 4,096 one split gives 256 programs, 8 warps per SM; not run yet)
SPLIT_VARIANTS = [(64, 4, 3, "f16v", 0), (64, 4, 3, "f16v8", 0), (64, 4, 3, "f16", 0), (128, 4, 3, "f16", 0)]
# (BLOCK_N, warps, stages, kv_dot, maxnreg); maxnreg 0 = no cap
VARIANTS = [(64, 4, 3, "f16v", 0), (64, 4, 2, "f16v", 0), (64, 4, 2, "f16v", 96), (64, 4, 2, "f16v", 80),
            (64, 4, 3, "f16v", 96), (64, 4, 2, "f16", 96), (32, 4, 3, "f16v", 0), (32, 4, 3, "f16v", 80),
            (32, 4, 2, "f16v", 72), (64, 2, 2, "f16v", 128), (128, 4, 3, "f16", 0), (128, 4, 2, "f16", 96),
            (128, 8, 2, "f16v", 0),
            # kv_dot "f16v8" (V in 8-byte pieces, fp16 stores without bank conflicts; added after the
            # 16:44 call, not run yet)
            (64, 4, 3, "f16v8", 0), (128, 4, 3, "f16v8", 0), (128, 8, 3, "f16v8", 0)]
T0 = time.time()


def _runner(q, kb, vb, table, seq_lens, out, ctx: int, splits: int):
    """decode_attention over the FP8 pool at `splits` KV splits, its workspaces allocated once."""
    mid_o = torch.empty(q.shape[0], kl.HQ, splits, kl.D, device=kl.DEV)
    mid_lse = torch.empty(q.shape[0], kl.HQ, splits, device=kl.DEV)
    return partial(kl.K.decode_attention, q, kb, vb, table, seq_lens, kl.PAGE, None, splits, out=out,
                   mid_o=mid_o, mid_lse=mid_lse, k_scale=kl.K_SCALE, v_scale=kl.V_SCALE, max_seq_len=ctx)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--splits", action="store_true",
                   help="time SPLIT_VARIANTS at 1-4 KV splits instead of VARIANTS at one split")
    ns = p.parse_args(argv)
    torch.manual_seed(0)
    result: dict = {**run_header(), "rows": []}
    path = out_path(ns.out, "decode-fp8-occupancy.json")
    for batch, ctx in SHAPES:
        q = torch.randn(batch, kl.HQ, kl.D, device=kl.DEV, dtype=kl.BF16)
        kc = torch.randn(batch, kl.HKV, ctx, kl.D, device=kl.DEV, dtype=kl.BF16)
        vc = torch.randn_like(kc)
        k8, v8 = (kc / kl.K_SCALE).to(kl.FP8), (vc / kl.V_SCALE).to(kl.FP8)
        kc, vc = (k8.float() * kl.K_SCALE).to(kl.BF16), (v8.float() * kl.V_SCALE).to(kl.BF16)
        ref = kl.reference(q[:, :, None], kc, vc, False)[:, :, 0]
        del kc, vc
        kb, vb, table = kl._paged(k8, v8, ctx)
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=kl.DEV)
        out = torch.empty_like(q)
        kv_bytes = 2 * batch * ctx * kl.HKV * kl.D
        runner = partial(_runner, q, kb, vb, table, seq_lens, out, ctx)

        num_sms = torch.cuda.get_device_properties(kl.DEV).multi_processor_count
        default_splits = kl.K.choose_num_kv_splits(batch, kl.HKV, ctx, num_sms, kv_fp8=True)
        r = kl.timed(runner(default_splits), out, ref)
        rows = [{"shape": f"{batch} x {ctx}", "variant": f"default ({default_splits} split)", **r}]
        grid = ([(v, sp) for v in SPLIT_VARIANTS for sp in (1, 2, 3, 4)] if ns.splits
                else [(v, 1) for v in VARIANTS])
        for (bn, warps, stages, kv_dot, maxnreg), splits in grid:
            cfg = {"BLOCK_N": bn, "num_warps": warps, "num_stages": stages, "kv_dot": kv_dot,
                   "many_per_sm": 0}
            if maxnreg:
                cfg["maxnreg"] = maxnreg  # (a key of the 16:44 trial build only; rejected by the table now)
            with kl.AC.overriding({"decode_fp8": {kl.B: cfg}}):
                r = kl.timed(runner(splits), out, ref)
            name = f"{bn}x{warps}w{stages}s {kv_dot} maxnreg {maxnreg} splits {splits}"
            rows.append({"shape": f"{batch} x {ctx}", "variant": name, **r})
        for row in rows:
            if "us" in row:
                row["tb_per_s"] = kv_bytes / (row["us"] * 1e-6) / 1e12
                print(f"[{time.time() - T0:5.1f}s] {row['shape']:12} {row['variant']:34} {row['us']:7.1f} us "
                      f"{row['tb_per_s']:.2f} TB/s", flush=True)
            else:
                print(f"[{time.time() - T0:5.1f}s] {row['shape']:12} {row['variant']:34} {row['error']}",
                      flush=True)
        result["rows"] += rows
        write_json(path, result)
        del kb, vb, k8, v8
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
