"""Decode attention over pools whose pages are in random order (the benchmarks' case) against pools
whose pages follow each other, and against cuDNN SDPA on contiguous K/V, in one GPU run (issue 19:
bf16 decode at 64 x 4K and 128 x 2K at or under cuDNN; FP8-KV decode at most 0.6x bf16).

    python3 bench/lab/decode_page_order.py [--out decode-page-order.json] [--rounds 3]

The question: the default decode kernel reads a paged pool at 3.79 TB/s where cuDNN reads contiguous
K/V at 3.95 (1.035-1.040x its time, docs/benchmarks.md). Is the gap the kernel, or where the pages
lie? Pools, the same values in each (Qwen2.5-7B heads: 28 / 4, D 128):
  - token-major [S, Hkv, D], page 16, random page order (bench_kernels.py's and the labs' pool);
  - token-major, page 16, each request's pages in order and requests one after another;
  - head-major [Hkv, S, D] viewed as [S, Hkv, D], pages in order: each (request, KV head)'s keys are
    one contiguous [L, D] block, the memory cuDNN reads (its K is [B, Hkv, L, D]);
  - token-major, page 64, random order.
Both pool dtypes (bf16, FP8 e4m3 with scales) at the default config and split count
(kernels/decode_attention.py), each checked against the fp32 reference first; us of CUDA-graph replay
(median, bench/kernels/sdpa_peers.device_ms), best of `--rounds` rounds in alternation.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from sdpa_peers import device_ms, peer_rows, reference  # noqa: E402

from bench.common import out_path, rel_err, run_header, write_json  # noqa: E402
from kernels.decode_attention import choose_num_kv_splits, decode_attention  # noqa: E402

HQ, HKV, D = 28, 4, 128
DEV = "cuda"
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
K_SCALE, V_SCALE = 0.05, 0.04
TOL = 1e-2
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


def pool(kc: torch.Tensor, vc: torch.Tensor, page: int, order: str, head_major: bool):
    """kc / vc [B, Hkv, L, D] (L a multiple of page) in a pool of `page`-token pages ("random" or
    "ordered" page ids; page 0 is left as the sink), token-major [S, Hkv, D] or head-major storage
    viewed as [S, Hkv, D]. Returns (k_buffer, v_buffer, page_table [B, L / page] int32)."""
    batch, _, length, _ = kc.shape
    per = length // page
    n = batch * per
    ids = torch.randperm(n, device=DEV) if order == "random" else torch.arange(n, device=DEV)
    table = (ids + 1).view(batch, per).int()
    slots = (table.long()[:, :, None] * page + torch.arange(page, device=DEV)).view(-1)
    size = (batch * per + 1) * page
    bufs = []
    for x in (kc, vc):
        if head_major:
            store = torch.zeros(HKV, size, D, device=DEV, dtype=x.dtype)
            store[:, slots] = x.permute(1, 0, 2, 3).reshape(HKV, -1, D)
            bufs.append(store.permute(1, 0, 2))
        else:
            buf = torch.zeros(size, HKV, D, device=DEV, dtype=x.dtype)
            buf[slots] = x.permute(0, 2, 1, 3).reshape(-1, HKV, D)
            bufs.append(buf)
    return bufs[0], bufs[1], table


POOLS = [("token-major, page 16, random", 16, "random", False),
         ("token-major, page 16, ordered", 16, "ordered", False),
         ("head-major, page 16, ordered (cuDNN's memory)", 16, "ordered", True),
         ("token-major, page 64, random", 64, "random", False)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--rounds", type=int, default=3)
    ns = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("decode_page_order needs a CUDA device")
    torch.manual_seed(0)
    num_sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    result: dict = {**run_header(), "rows": []}
    path = out_path(ns.out, "decode-page-order.json")
    lines = []
    for batch, ctx in [(64, 4096), (128, 2048)]:
        q = torch.randn(batch, HQ, D, device=DEV, dtype=BF16)
        kc = torch.randn(batch, HKV, ctx, D, device=DEV, dtype=BF16)
        vc = torch.randn_like(kc)
        k8, v8 = (kc / K_SCALE).to(FP8), (vc / V_SCALE).to(FP8)
        kd, vd = (k8.float() * K_SCALE).to(BF16), (v8.float() * V_SCALE).to(BF16)
        refs = {"bf16": reference(q[:, :, None], kc, vc, False)[:, :, 0],
                "fp8": reference(q[:, :, None], kd, vd, False)[:, :, 0]}
        cudnn = peer_rows(q[:, :, None], kc, vc, False, None, backends=("cudnn",)).get("cudnn", {}).get("us")
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
        out = torch.empty_like(q)
        runs = []
        for dtype, (kx, vx), scales in (("bf16", (kc, vc), {}),
                                        ("fp8", (k8, v8), {"k_scale": K_SCALE, "v_scale": V_SCALE})):
            splits = choose_num_kv_splits(batch, HKV, ctx, num_sms, kv_fp8=dtype == "fp8")
            for name, page, order, hm in POOLS:
                kb, vb, table = pool(kx, vx, page, order, hm)
                run = partial(decode_attention, q, kb, vb, table, seq_lens, page, None, splits, out=out,
                              max_seq_len=ctx, **scales)
                out.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                err = rel_err(out.float(), refs[dtype])
                runs.append({"dtype": dtype, "pool": name, "splits": splits, "run": run, "err": err,
                             "bufs": (kb, vb, table), "us": []})
        for _ in range(ns.rounds):
            for r in runs:
                if r["err"] <= TOL:
                    ms, _ = device_ms(r["run"])
                    r["us"].append(ms * 1e3)
        bf_default = min(runs[0]["us"]) if runs[0]["us"] else None
        for r in runs:
            row = {"shape": f"{batch} x {ctx}", "dtype": r["dtype"], "pool": r["pool"], "splits": r["splits"],
                   "rel_err": r["err"], "us_rounds": r["us"], "cudnn_us": cudnn}
            if r["us"]:
                us = row["us"] = min(r["us"])
                nbytes = 2 * batch * ctx * HKV * D * (1 if r["dtype"] == "fp8" else 2)
                row["tb_per_s"] = nbytes / (us * 1e-6) / 1e12
                row["vs_cudnn"] = us / cudnn if cudnn else None
                row["vs_bf16_random"] = us / bf_default if bf_default else None
                lines.append(f"| {row['shape']} | {r['dtype']} | {r['pool']} | {us:.1f} | "
                             f"{row['tb_per_s']:.2f} | {row['vs_cudnn']:.3f} | {row['vs_bf16_random']:.3f} |")
            else:
                lines.append(f"| {row['shape']} | {r['dtype']} | {r['pool']} | rel err {r['err']:.2e} "
                             "| | | |")
            log(lines[-1])
            result["rows"].append(row)
        log(f"{batch} x {ctx}: cuDNN {cudnn:.1f} us")
        result["rows"].append({"shape": f"{batch} x {ctx}", "cudnn_us": cudnn})
        write_json(path, result)
        del runs, q, kc, vc, k8, v8, kd, vd
        torch.cuda.empty_cache()
    print("\n| shape | pool dtype | pool | us | TB/s | / cuDNN | / bf16 random-order |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
