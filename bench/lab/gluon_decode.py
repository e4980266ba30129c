"""Lab: paged decode attention as a warp-specialized Gluon kernel, over a bf16 pool and (--fp8) an
FP8 pool, against the Triton decode kernel and cuDNN SDPA (on contiguous K/V) in the same process.

The question (issue 19): the Triton decode kernel reads a bf16 pool at 3.8-3.9 TB/s where cuDNN
reads the same shapes at ~4.0 (1.04x its time), and reads an FP8 pool in 0.64-0.65x its bf16 time
(the goal: 0.6x). Its loop issues the cp.async copies, their addresses and the page-id loads in the
same warps that compute.

Here, as in kernels/extend_attention_ws.py, a producer warp streams each (request, KV head)'s pages
by TMA into a ring of STAGES blocks of W x SUB keys (one [page_size, D] box per page). The
consumers are one partition of W warps (a warp-specialized kernel needs a multiple of 4 warps);
warp w computes sub-block w of every block, as the Triton loop `paged_attn_loop_ws` does: batched
mma.sync over [W, 16, D] x [W, D, SUB] (the GQA group's query rows padded to 16), one online-softmax
state per warp, merged across the warps after the loop. Over an FP8 pool K / V are widened to fp16
(exact, one packed cvt per two values) and both dots run in fp16. One program per (request, KV
head), no KV split.

Measured on an H200, 2026-12-04 (docs/benchmarks.md, "Decode over an FP8 pool as a Gluon kernel"):
over a bf16 pool no config beat the Triton kernel by more than 1.5% (137.4-151 against 139-141 us
at 64 x 4K); over an FP8 pool 32 x 2 with maxnreg 128 took 82.3-84.4 us against the Triton FP8
kernel's 89.8-90.2, and became kernels/decode_attention_ws.py (routed by decode_attention), whose
kernel this lab now drives at any config and over bf16 pools (dots in bf16 there). Each
config runs in its own process under `bash bench/h200_run.sh gluon-decode` (GLUON_CONFIGS), so one
that hangs costs only itself.

    python3 bench/lab/gluon_decode.py --compile [--fp8]          # CPU: lowers for sm_90
    python3 bench/lab/gluon_decode.py [--fp8] [--sequential] [--shapes 64x4096,128x2048] \
        [--configs 16x2,32x2x4x128]   # GPU; configs SUBxSTAGES[xWARPS[xMAXNREG]]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
from radixrt.kernels import decode_attention_ws as DW  # noqa: E402
from radixrt.kernels.extend_attention_ws import _as_rows, _smem_layout  # noqa: E402

LOG2E = 1.4426950408889634
W = 4  # consumer warps (one partition)


def parse_config(text: str) -> dict:
    """"SUBxSTAGES[xWARPS[xMAXNREG]][v][p]" (e.g. 16x4, 16x2x8, 32x2x4x128vp) as gluon_decode's
    keywords; suffix "v": V_WIDE (an FP8 V stage read in 16-byte rows, widened before its dot), "p":
    PREFETCH_IDS (the producer loads the next block's page ids before waiting for a stage)."""
    flags = text.lstrip("0123456789x")
    parts = [int(x) for x in text[:len(text) - len(flags)].split("x")]
    names = ("sub", "stages", "warps", "maxnreg")
    return {**dict(zip(names[:len(parts)], parts, strict=True)), "v_wide": "v" in flags,
            "prefetch_ids": "p" in flags}


def gluon_decode(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, page_table: torch.Tensor,
                 seq_lens: torch.Tensor, page_size: int, out: torch.Tensor, sub: int = 16, stages: int = 4,
                 warps: int = 4, maxnreg: int | None = None, k_scale: float = 1.0,
                 v_scale: float = 1.0, v_wide: bool = False, prefetch_ids: bool = False) -> torch.Tensor:
    """kernels/decode_attention_ws.py's kernel at any config and over a bf16 pool too (its dots then
    in bf16): q / out [B, Hq, 128] bf16, pool [slots, Hkv, 128] bf16 or float8_e4m3fn (holding
    K / k_scale, V / v_scale), page_table [B, P] int32, seq_lens [B] int32; sub a multiple of
    page_size; warps consumer warps (4 or 8). Returns out."""
    b, hq, d = q.shape
    hkv = k_buffer.shape[1]
    layout = _smem_layout(page_size, d, k_buffer.dtype)
    kp = TensorDescriptor.from_tensor(_as_rows(k_buffer), [page_size, d], layout)
    vp = TensorDescriptor.from_tensor(_as_rows(v_buffer), [page_size, d], layout)
    opts = {"maxnreg": maxnreg} if maxnreg else {}
    DW._decode_ws_kernel[(b, hkv)](q, out, q.stride(0), out.stride(0), kp, vp, page_table,
                                   page_table.stride(0), seq_lens, LOG2E / math.sqrt(d) * k_scale, v_scale,
                                   GROUP=hq // hkv, SUB_KEYS=sub, NUM_STAGES=stages, V_WIDE=v_wide,
                                   PREFETCH_IDS=prefetch_ids, num_warps=warps, **opts)
    return out


def compile_sm90(sub: int, stages: int, warps: int = 4, maxnreg: int | None = None, page: int = 16,
                 fp8: bool = False, v_wide: bool = False, prefetch_ids: bool = False) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from bench.kernels.compile_sm90 import ptxas_usage

    pool_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    pool = torch.empty(1024, 4, 128, dtype=torch.bfloat16).to(pool_dtype)
    desc = TensorDescriptor.from_tensor(_as_rows(pool), [page, 128], _smem_layout(page, 128, pool_dtype))
    fn = DW._decode_ws_kernel
    sig = {"q_ptr": "*bf16", "o_ptr": "*bf16", "stride_q_b": "i32", "stride_o_b": "i32",
           "kp_desc": mangle_type(desc), "vp_desc": mangle_type(desc), "page_table": "*i32",
           "stride_pt_b": "i32", "seq_lens": "*i32", "qk_scale": "fp32", "v_scale": "fp32"}
    const = {"GROUP": 7, "SUB_KEYS": sub, "NUM_STAGES": stages, "V_WIDE": v_wide,
             "PREFETCH_IDS": prefetch_ids}
    sig.update({n: "constexpr" for n in const})
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in ("q_ptr", "o_ptr")}
    options = {"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    t0 = time.time()
    ck = triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                        options=options)
    ptx = ck.asm["ptx"]
    return {"sub": sub, "stages": stages, "warps": warps, "maxnreg": maxnreg, "fp8": fp8, "v_wide": v_wide,
            "prefetch_ids": prefetch_ids,
            "ld_shared_b8": ptx.count("ld.shared.b8"), "ldmatrix": ptx.count("ldmatrix"),
            "seconds": round(time.time() - t0, 1), "shared": ck.metadata.shared,
            "mma_sync": ptx.count("mma.sync"), "tma": ptx.count("cp.async.bulk.tensor"), **ptxas_usage(ptx)}


def run_shape(shape: str, configs: list[str], fp8: bool, baseline: bool = True,
              sequential: bool = False) -> dict:
    """One batch x context shape: the fp32 reference, the Triton decode kernel (its launcher's split
    count) on the bf16 pool (and on the FP8 pool with --fp8), then each Gluon config on each pool;
    us of CUDA-graph replay, L2 flushed."""
    from bench.common import graph_ms, rel_err
    from radixrt import kernels as K
    from radixrt.kernels import reference as REF

    dev, page, hq, hkv, d = "cuda", 16, 28, 4, 128
    batch, ctx = (int(x) for x in shape.split("x"))
    pages = batch * (ctx // page) + 1
    k_buf = torch.randn(pages * page, hkv, d, device=dev, dtype=torch.bfloat16)
    v_buf = torch.randn_like(k_buf)
    order = torch.arange(pages - 1, device=dev) if sequential else torch.randperm(pages - 1, device=dev)
    table = (order + 1).to(torch.int32).view(batch, ctx // page)  # pages in order or shuffled
    seq = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(batch, hq, d, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = K.choose_num_kv_splits(batch, hkv, ctx, num_sms)
    row = {"shape": shape, "triton_splits": splits}

    def put(key, value):  # each figure printed as it comes: a config that hangs loses only itself
        row[key] = value
        print(json.dumps({"shape": shape, key: value}), flush=True)

    if baseline:
        from bench.kernels.sdpa_peers import peer_rows  # the same-run peer: cuDNN SDPA on contiguous K/V

        slots = (table.long()[:, :, None] * page + torch.arange(page, device=dev)).view(batch, ctx)
        kc, vc = (buf[slots].permute(0, 2, 1, 3).contiguous() for buf in (k_buf, v_buf))
        put("cudnn_us", peer_rows(q[:, :, None], kc, vc, False, None, ("cudnn",))["cudnn"].get("us"))
        del kc, vc
    pools = {"bf16": (k_buf, v_buf, {})}
    if fp8:
        ks, vs = (float(buf.abs().max()) / 448 for buf in (k_buf, v_buf))  # e4m3's largest finite value
        pools["fp8"] = ((k_buf / ks).to(torch.float8_e4m3fn), (v_buf / vs).to(torch.float8_e4m3fn),
                        {"k_scale": ks, "v_scale": vs})
    for pool_name, (kb, vb, kw) in pools.items():
        ref = REF.decode_attention_ref(q, kb, vb, table, seq, page, None, **kw)

        def run_triton(kb=kb, vb=vb, kw=kw):
            K.decode_attention(q, kb, vb, table, seq, page, None, splits, out=out, max_seq_len=ctx, **kw)
        if baseline:  # the split kernel (RADIXRT_DECODE_WS=0), then over an FP8 pool decode_attention's route
            for form, switch in (("triton", "0"), ("routed", "1"))[:2 if pool_name == "fp8" else 1]:
                os.environ["RADIXRT_DECODE_WS"] = switch
                run_triton()
                put(f"{form}_{pool_name}_err", rel_err(out, ref))
                put(f"{form}_{pool_name}_us", graph_ms(run_triton) * 1e3)
            os.environ.pop("RADIXRT_DECODE_WS")
        for cfg in configs:
            key = f"gluon_{pool_name}_{cfg}"

            def run(cfg=cfg, kb=kb, vb=vb, kw=kw):
                gluon_decode(q, kb, vb, table, seq, page, out, **parse_config(cfg), **kw)
            try:
                out.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                put(key + "_err", rel_err(out, ref))
                if row[key + "_err"] < 1e-2:
                    put(key + "_us", graph_ms(run) * 1e3)
            except Exception as exc:  # a config that fails is reported, the others still run
                put(key + "_error", repr(exc)[:300])
    return row


def run_gpu(args) -> list[dict]:
    rows = []
    for shape in args.shapes.split(","):
        configs = [c for c in args.configs.split(",") if c]
        rows.append(run_shape(shape, configs, args.fp8, not args.no_baseline, args.sequential))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--shapes", default="64x4096,128x2048")
    ap.add_argument("--configs", default="16x2,16x4,32x2")
    ap.add_argument("--fp8", action="store_true", help="also an FP8 (e4m3) pool, Triton and Gluon")
    ap.add_argument("--no-baseline", action="store_true", help="only the Gluon configs (no Triton / cuDNN)")
    ap.add_argument("--sequential", action="store_true", help="pages in pool order")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.compile:
        ok = True
        for cfg in args.configs.split(","):
            try:
                print(json.dumps(compile_sm90(**parse_config(cfg), fp8=args.fp8)), flush=True)
            except Exception as exc:
                ok = False
                c, msgs = exc, []
                while c is not None:
                    msgs.append(str(c)[-600:])
                    c = c.__cause__ or c.__context__
                print(f"{cfg}: {type(exc).__name__}: {msgs[-1]}", flush=True)
        return 0 if ok else 1
    rows = run_gpu(args)
    name = "gluon_decode" + ("_" + args.configs.replace(",", "_") if args.no_baseline else "")
    name += "_sequential" if args.sequential else ""
    Path(args.out, name + ".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
