"""Token-major against head-major KV pools, and the extend grid order, in one GPU run (issue 19).

    python3 bench/lab/kv_layout.py [--out kv-layout.json] [--parts decode fp8 extend]

The pool has been token-major: per layer [S, Hkv, D], so the D values of one head of one token are
followed by the other heads' values of that token, and one head's page of 16 tokens is 16 pieces of
D values (256 B at bf16, 128 B at FP8, D = 128) at a stride of Hkv * D. A head-major pool stores
[Hkv, S, D] and hands the kernels the view [S, Hkv, D] (strides D * S, D, 1 become stride_h = S * D,
stride_s = D): one head's page is then one contiguous piece (4 KB at bf16), as the contiguous K/V
that cuDNN reads. The kernels take strides, so the same compiled kernels run on both; only the
addresses they read differ.

Qwen2.5-7B heads (28 query / 4 KV, D 128), page 16, random page order, bf16 queries:
  decode  batch 64 x 4,096 and 128 x 2,048, bf16 pool: configs (BLOCK_N, warps, stages) x split
          counts, both layouts;
  fp8     the same shapes over an FP8 pool (kv_dot "f16", k_scale 0.5, v_scale 0.25), both layouts;
  extend  4,096 cached + 4,096 new (the prefix read from the pool) in both layouts, and 8,192 new
          causal with the grid launched head by head (default) or longest query blocks first over all
          heads (M_MAJOR), each at the default tile and 128 x 128.
Every variant is checked against the fp32 torch SDPA reference on the same K/V (FP8: on the
dequantized values) before it is timed; torch SDPA's cuDNN backend on contiguous K/V is timed beside
it (sdpa_peers.py). Timing: CUDA-graph replay, median of do_bench with L2 flushed. Prints one table
per part (us, TB/s of K/V read, ratio to cuDNN); JSON to --out ($OUT/kv-layout.json on a device call).
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
from sweep_fp8 import AC, BF16, DECODE_SHAPES, DEV, FP8, HKV, HQ, K_SCALE, PAGE, V_SCALE, B, D, K  # noqa: E402,F401

from bench.common import out_path, rel_err, run_header, write_json  # noqa: E402

BF16_BLOCKS = [(128, 4, 2), (128, 4, 3), (64, 4, 3), (256, 4, 2), (128, 8, 2), (256, 8, 2)]
FP8_BLOCKS = [(128, 4, 3), (128, 4, 2), (128, 4, 4), (256, 4, 2), (256, 4, 3), (256, 8, 3), (64, 4, 4)]
SPLIT_RULES = [{"policy": "per_sm", "programs_per_sm": 4}, {"policy": "waves", "occupancy": 2,
                                                            "merge_tokens": 256},
               {"policy": "per_sm", "programs_per_sm": 8}]
EXTEND_TILES = [None, (128, 128, 8, 3)]  # None: the table's default
TOL = 1e-2
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


def head_major(buf: torch.Tensor) -> torch.Tensor:
    """The same values as `buf` [S, Hkv, D], stored [Hkv, S, D] and viewed as [S, Hkv, D]."""
    return buf.permute(1, 0, 2).contiguous().permute(1, 0, 2)


def timed(run, out: torch.Tensor, ref: torch.Tensor, tol: float = TOL) -> dict:
    """{"us", "rel_err"} of run() (which writes `out`) from a CUDA graph, once it matches ref; else
    {"error"}."""
    try:
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        err = rel_err(out, ref)
        if not err <= tol:
            return {"error": f"rel err {err:.2e} > {tol}", "rel_err": err}
        ms, _ = device_ms(run)
        return {"us": ms * 1e3, "rel_err": err}
    except Exception as e:  # noqa: BLE001 - a variant that fails is recorded and skipped
        return {"error": f"{type(e).__name__}: {str(e)[:160]}"}


def _row(row: dict, r: dict, cudnn: float | None, rate_key: str, work: float) -> dict:
    """A table row: the variant's keys, its result r, and (when timed) work per second in units of
    10^12 (TB/s of K/V or TFLOP/s) and the ratio to cuDNN's time."""
    row = {**row, "cudnn_us": cudnn, **r}
    if "us" in r:
        row[rate_key] = work / (r["us"] * 1e-6) / 1e12
        row["vs_cudnn"] = r["us"] / cudnn if cudnn else None
    return row


def _paged(kc: torch.Tensor, vc: torch.Tensor, seq_len: int):
    """Contiguous [Bt, Hkv, L, D] K/V scattered into a token-major pool of random page order."""
    batch = kc.shape[0]
    per = seq_len // PAGE
    table = (torch.randperm(batch * per, device=DEV) + 1).view(batch, per).int()
    slots = (table.long()[:, :, None] * PAGE + torch.arange(PAGE, device=DEV)).view(-1)
    kb = torch.zeros((batch * per + 1) * PAGE, HKV, D, device=DEV, dtype=kc.dtype)
    vb = torch.zeros_like(kb)
    kb[slots] = kc.permute(0, 2, 1, 3).reshape(-1, HKV, D)
    vb[slots] = vc.permute(0, 2, 1, 3).reshape(-1, HKV, D)
    return kb, vb, table


def decode_part(fp8: bool) -> list[dict]:
    rows = []
    num_sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    kind, splits_kind = ("decode_fp8", "decode_splits_fp8") if fp8 else ("decode", "decode_splits")
    blocks = FP8_BLOCKS if fp8 else BF16_BLOCKS
    for batch, ctx in DECODE_SHAPES:
        q = torch.randn(batch, HQ, D, device=DEV, dtype=BF16)
        kc = torch.randn(batch, HKV, ctx, D, device=DEV, dtype=BF16)
        vc = torch.randn_like(kc)
        scales: dict = {}
        if fp8:  # the reference and the peer see the dequantized values the FP8 pool holds
            k8, v8 = (kc / K_SCALE).to(FP8), (vc / V_SCALE).to(FP8)
            kc, vc = (k8.float() * K_SCALE).to(BF16), (v8.float() * V_SCALE).to(BF16)
            scales = {"k_scale": K_SCALE, "v_scale": V_SCALE}
        ref = reference(q[:, :, None], kc, vc, False)[:, :, 0]
        peers = peer_rows(q[:, :, None], kc, vc, False, None)
        cudnn = peers.get("cudnn", {}).get("us")
        if fp8:
            kb, vb, table = _paged(k8, v8, ctx)
            del k8, v8
        else:
            kb, vb, table = _paged(kc, vc, ctx)
        del kc, vc
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
        out = torch.empty_like(q)
        kv_bytes = 2 * batch * ctx * HKV * D * kb.element_size()
        default_splits = K.choose_num_kv_splits(batch, HKV, ctx, num_sms, kv_fp8=fp8)
        split_counts = {default_splits}
        for rule in SPLIT_RULES:
            with AC.overriding({splits_kind: {B: rule}}):
                split_counts.add(K.choose_num_kv_splits(batch, HKV, ctx, num_sms, kv_fp8=fp8))
        default_cfg = AC.attention_config(kind, D)
        layouts = {"token-major": (kb, vb), "head-major": (head_major(kb), head_major(vb))}
        for blk in blocks:
            cfg = dict(zip(("BLOCK_N", "num_warps", "num_stages"), blk, strict=True))
            is_default = all(default_cfg[k] == v for k, v in cfg.items())
            cfg["many_per_sm"] = 0  # the config as given at every program count (launch_config)
            for splits in sorted(split_counts):
                mid_o = torch.empty(batch, HQ, splits, D, device=DEV)
                mid_lse = torch.empty(batch, HQ, splits, device=DEV)
                for layout, (kbl, vbl) in layouts.items():
                    run = partial(K.decode_attention, q, kbl, vbl, table, seq_lens, PAGE, None, splits,
                                  out=out, mid_o=mid_o, mid_lse=mid_lse, **scales)
                    with AC.overriding({kind: {B: cfg}}):
                        r = timed(run, out, ref)
                    rows.append(_row({"part": "fp8" if fp8 else "decode", "shape": f"{batch} x {ctx}",
                                      "layout": layout, "cfg": list(blk), "splits": splits,
                                      "default": is_default and splits == default_splits},
                                     r, cudnn, "tb_per_s", kv_bytes))
            log(f"{'fp8' if fp8 else 'bf16'} {batch} x {ctx} {blk} done")
        del layouts, kb, vb
        torch.cuda.empty_cache()
    return rows


def extend_part() -> list[dict]:
    rows = []
    for prefix, new in [(4096, 4096), (0, 8192)]:
        total = prefix + new
        q4 = torch.randn(1, HQ, new, D, device=DEV, dtype=BF16)
        kc = torch.randn(1, HKV, total, D, device=DEV, dtype=BF16)
        vc = torch.randn_like(kc)
        ref = reference(q4, kc, vc, True)[0].transpose(0, 1)
        peers = peer_rows(q4, kc, vc, True, None)
        cudnn = peers.get("cudnn", {}).get("us")
        qkv = torch.empty(new, (HQ + 2 * HKV) * D, device=DEV, dtype=BF16)
        q, k, v = (t.view(new, -1, D) for t in qkv.split([HQ * D, HKV * D, HKV * D], dim=-1))
        q.copy_(q4[0].transpose(0, 1))
        k.copy_(kc[0, :, prefix:].transpose(0, 1))
        v.copy_(vc[0, :, prefix:].transpose(0, 1))
        kb, vb, table = _paged(kc, vc, total)
        meta = [torch.tensor([x], dtype=torch.int32, device=DEV) for x in (prefix, new, 0)]
        out = torch.empty(new, HQ, D, device=DEV, dtype=BF16)
        flops = 4 * HQ * D * (prefix * new + new * (new + 1) // 2)
        layouts = {"token-major": (kb, vb), "head-major": (head_major(kb), head_major(vb))} if prefix else \
            {"token-major": (kb, vb)}
        for tile in EXTEND_TILES:
            over = {} if tile is None else dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), tile,
                                                    strict=True))
            for m_major in (False, True):
                for layout, (kbl, vbl) in layouts.items():
                    run = partial(K.extend_attention, q, k, v, kbl, vbl, table, *meta, PAGE, None, new,
                                  out=out, max_seq_len=total)
                    with AC.overriding({"extend": {B: {**over, "M_MAJOR": m_major}}}):
                        r = timed(run, out, ref)
                    shape = f"{new} new" + (f" over {prefix} cached" if prefix else " causal")
                    rows.append(_row({"part": "extend", "shape": shape, "layout": layout, "m_major": m_major,
                                      "cfg": "default" if tile is None else list(tile)},
                                     r, cudnn, "tflop_per_s", flops))
        log(f"extend {prefix} + {new} done")
        del layouts, kb, vb
        torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict]) -> None:
    print("\n| part | shape | layout | cfg | splits / m_major | us | rate | vs cuDNN | rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        extra = r.get("splits", r.get("m_major"))
        mark = " (default)" if r.get("default") else ""
        head = f"| {r['part']} | {r['shape']} | {r['layout']} | {r['cfg']}{mark} | {extra} |"
        if "us" not in r:
            print(f"{head} {r['error']} |")
            continue
        rate = f"{r['tb_per_s']:.2f} TB/s" if "tb_per_s" in r else f"{r['tflop_per_s']:.0f} TFLOP/s"
        vs = f"{r['vs_cudnn']:.3f}" if r.get("vs_cudnn") else "-"
        print(f"{head} {r['us']:.1f} | {rate} | {vs} | {r['rel_err']:.1e} |")
    best: dict = {}
    for r in rows:
        if "us" in r:
            key = (r["part"], r["shape"], r["layout"])
            if key not in best or r["us"] < best[key]["us"]:
                best[key] = r
    print("\nbest per part, shape and layout:")
    for (part, shape, layout), r in sorted(best.items()):
        print(f"  {part:6} {shape:24} {layout:11} {r['us']:7.1f} us  cfg {r['cfg']} "
              f"{r.get('splits', r.get('m_major'))}  vs cuDNN {r.get('vs_cudnn') or 0:.3f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    parts = ["decode", "fp8", "extend"]
    p.add_argument("--parts", nargs="+", default=parts, choices=parts)
    ns = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("kv_layout needs a CUDA device")
    torch.manual_seed(0)
    result: dict = {**run_header(), "rows": []}
    path = out_path(ns.out, "kv-layout.json")
    for part in ns.parts:
        log(f"--- {part}")
        result["rows"] += extend_part() if part == "extend" else decode_part(part == "fp8")
        write_json(path, result)
    print_table(result["rows"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
