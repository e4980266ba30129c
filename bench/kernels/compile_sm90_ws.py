"""Compile the warp-specialized Gluon kernels (kernels/extend_attention_ws.py, the extend attention;
kernels/cascade_prefix_ws.py, cascade's prefix stage; kernels/decode_attention_ws.py, decode over an
FP8 pool) for an H100/H200 (sm_90) on a machine without a GPU, as compile_sm90.py does for the Triton
kernels: Triton's wheel carries ptxas, so a GPUTarget lowers a kernel to PTX and a cubin without a
driver. Reports shared memory, registers and spills per variant and checks the PTX for what the
design needs: wgmma with the P V operand from registers (extend, cascade) or mma.sync with K / V
widened by packed e4m3 -> fp16 cvts (decode), the producer's register budget lowered (setmaxnreg),
TMA copies, no spills. Exit status 1 if a variant fails.

    python3 bench/kernels/compile_sm90_ws.py
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET=1 (the interpreter does not compile)")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.runtime.jit import mangle_type  # noqa: E402

from bench.kernels.compile_sm90 import ptxas_usage  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
from radixrt.kernels import cascade_prefix_ws as CA  # noqa: E402
from radixrt.kernels import decode_attention_ws as DW  # noqa: E402
from radixrt.kernels import extend_attention_ws as WS  # noqa: E402
from radixrt.kernels import gemm_ws as GW  # noqa: E402


def compile_ws(block_n: int, stages: int, page_size: int, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Lower _extend_ws_kernel for sm_90 at one config (Qwen2.5-7B heads: 28 query, 4 KV, D 128)."""
    t, hq, hkv, d = 512, 28, 4, 128
    q, kn, pool = (torch.empty(t, h, d, dtype=dtype) for h in (hq, hkv, hkv))
    gdt = WS._gl_dtype(dtype)
    lay = WS.gl.NVMMASharedLayout.get_default_for
    desc = WS.TensorDescriptor.from_tensor
    descs = {"q_desc": desc(WS._as_rows(q), [64, d], lay([64, d], gdt)),
             "kn_desc": desc(WS._as_rows(kn), [block_n, d], lay([block_n, d], gdt)),
             "kp_desc": desc(WS._as_rows(pool), [page_size, d], lay([page_size, d], gdt))}
    descs["vn_desc"], descs["vp_desc"] = descs["kn_desc"], descs["kp_desc"]
    fn = WS._extend_ws_kernel
    ptr = "*bf16" if dtype == torch.bfloat16 else "*fp16"
    sig = {n: mangle_type(v) for n, v in descs.items()}
    sig.update(o_ptr=ptr, stride_o_t="i32", stride_o_h="i32", page_table="*i32", stride_pt_b="i32",
               prefix_lens="*i32", extend_lens="*i32", extend_start_loc="*i32", qk_scale="fp32",
               num_m_blocks="i32")
    const = {"GROUP": hq // hkv, "BLOCK_N": block_n, "STAGES": stages, "PRODUCER_REGS": 40,
             "CONSUMER_REGS": 232}
    sig.update({n: "constexpr" for n in const})
    sig = {n: sig[n] for n in fn.arg_names}
    attrs = {(fn.arg_names.index("o_ptr"),): [["tt.divisibility", 16]]}  # the rest: not specialised
    return _compile(fn, sig, const, attrs)


def _compile(fn, sig: dict, const: dict, attrs: dict, **options) -> dict:
    t0 = time.time()
    ck = triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 4, **options})
    ptx = ck.asm["ptx"]
    return {"seconds": time.time() - t0, "shared": ck.metadata.shared, "ptx": ptx, **ptxas_usage(ptx)}


def compile_cascade_prefix(page_size: int, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Lower cascade stage A's Gluon kernel for sm_90 (28 query / 4 KV heads, D 128)."""
    hkv, d = 4, 128
    pool = torch.empty(1024, hkv, d, dtype=dtype)
    layout = WS._smem_layout(page_size, d, dtype)
    desc = WS.TensorDescriptor.from_tensor(WS._as_rows(pool), [page_size, d], layout)
    fn = CA._cascade_prefix_ws_kernel
    sig = {n: "i32" for n in fn.arg_names}
    sig.update(q_ptr="*bf16" if dtype == torch.bfloat16 else "*fp16", kp_desc=mangle_type(desc),
               vp_desc=mangle_type(desc), page_table="*i32", group_members="*i32", group_starts="*i32",
               group_prefix_lens="*i32", mid_o="*fp32", mid_lse="*fp32", qk_scale="fp32")
    const = {"GROUP": 7, "HEAD": d, "BLOCK": CA.BLOCK_N, "STAGES_": CA.STAGES, "PRODUCER_REGS": 40,
             "CONSUMER_REGS": 232}
    sig.update({n: "constexpr" for n in const})
    attrs = {(fn.arg_names.index("q_ptr"),): [["tt.divisibility", 16]]}  # mid_o / mid_lse: not specialised
    return _compile(fn, sig, const, attrs)


def compile_decode(page_size: int, group: int = 7, v_wide: bool = False, prefetch_ids: bool = False) -> dict:
    """Lower the FP8-pool decode kernel for sm_90 at its launch config (bf16 q, 4 KV heads, D 128);
    v_wide / prefetch_ids: its V_WIDE and PREFETCH_IDS experiments."""
    pool = torch.empty(1024, 4, DW.HEAD_DIM, dtype=torch.bfloat16).to(DW.FP8)
    layout = WS._smem_layout(page_size, DW.HEAD_DIM, DW.FP8)
    desc = WS.TensorDescriptor.from_tensor(WS._as_rows(pool), [page_size, DW.HEAD_DIM], layout)
    fn = DW._decode_ws_kernel
    sig = {"q_ptr": "*bf16", "o_ptr": "*bf16", "stride_q_b": "i32", "stride_o_b": "i32",
           "kp_desc": mangle_type(desc), "vp_desc": mangle_type(desc), "page_table": "*i32",
           "stride_pt_b": "i32", "seq_lens": "*i32", "qk_scale": "fp32", "v_scale": "fp32"}
    const = {"GROUP": group, "SUB_KEYS": DW.SUB, "NUM_STAGES": DW.STAGES, "V_WIDE": v_wide,
             "PREFETCH_IDS": prefetch_ids}
    sig.update({n: "constexpr" for n in const})
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in ("q_ptr", "o_ptr")}
    return _compile(fn, sig, const, attrs, num_warps=DW.WARPS, maxnreg=DW.MAXNREG)


def compile_gemm(m: int, n: int, k: int, cfg, has_bias: bool = False, gated: bool = False) -> dict:
    """Lower the decode-batch GEMM for sm_90 at M rows of an [N, K] bf16 weight and config cfg
    (kernels/gemm_ws.GemmWsConfig); gated: the SwiGLU form (gemm_silu_ws) over a [gate; up] weight."""
    mp = GW.rows_padded(m)
    w, x = torch.empty(n, k, dtype=torch.bfloat16), torch.empty(m, k, dtype=torch.bfloat16)
    rows = cfg.block_n // 2 if gated else cfg.block_n
    w_desc = WS.TensorDescriptor.from_tensor(w, [rows, cfg.block_k],
                                             WS._smem_layout(rows, cfg.block_k, torch.bfloat16))
    x_desc = WS.TensorDescriptor.from_tensor(x, [mp, cfg.block_k],
                                             WS._smem_layout(mp, cfg.block_k, torch.bfloat16))
    _, _, splits = GW.split_plan(k, cfg)
    fn = GW._gemm_ws_kernel
    sig = {"w_desc": mangle_type(w_desc), "x_desc": mangle_type(x_desc), "y_ptr": "*bf16", "stride_ym": "i32",
           "bias_ptr": "*bf16", "partials": "*fp32", "counters": "*i32", "M": "i32", "N": "i32",
           "steps_per_split": "i32", "total_steps": "i32", "splits": "i32"}
    const = {"HAS_BIAS": has_bias, "SPLIT": splits > 1, "STAGES": cfg.stages, "GATED": gated}
    sig.update({n_: "constexpr" for n_ in const})
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]]
             for a in ("y_ptr", "bias_ptr", "partials", "counters")}
    return _compile(fn, sig, const, attrs, num_warps=GW.config_warps(cfg))


def main() -> int:
    failed = 0
    variants = [(f"extend ws {n} x {s} stages, page {p}", lambda n=n, s=s, p=p: compile_ws(n, s, p))
                for n, s, p in ((128, 3, 16), (128, 2, 16), (128, 3, 64))]
    variants += [(f"cascade prefix ws, page {p}", lambda p=p: compile_cascade_prefix(p)) for p in (16, 64)]
    variants += [(f"decode ws (FP8 pool), page {p}", lambda p=p: compile_decode(p)) for p in (8, 16, 32)]
    variants += [("decode ws (FP8 pool), V widened, page 16", lambda: compile_decode(16, v_wide=True)),
                 ("decode ws (FP8 pool), page ids ahead, page 32",
                  lambda: compile_decode(32, prefetch_ids=True)),
                 ("decode ws (FP8 pool), V widened, page ids ahead, page 16",
                  lambda: compile_decode(16, v_wide=True, prefetch_ids=True))]
    variants += [(f"gemm ws M {m}, {n} x {k}, {c.block_n} x {c.block_k} x {c.stages} stages, "
                  f"{c.splits} splits",
                  lambda m=m, n=n, k=k, c=c: compile_gemm(m, n, k, c, has_bias=n == 4608))
                 for m, n, k, c in ((128, 4608, 3584, GW.GemmWsConfig(128, 64, 4, 3)),
                                    (128, 37888, 3584, GW.GemmWsConfig(128, 64, 4, 1)),
                                    (100, 3584, 18944, GW.GemmWsConfig(64, 64, 4, 4)),
                                    (32, 3584, 3584, GW.GemmWsConfig(128, 128, 4, 4)),
                                    (128, 4608, 3584, GW.GemmWsConfig(256, 64, 4, 7)))]
    variants += [(f"gemm ws M {m}, {n} x {k}, {c.block_n} x {c.block_k} x {c.stages} stages, 1 splits, "
                  "SwiGLU",
                  lambda m=m, n=n, k=k, c=c: compile_gemm(m, n, k, c, gated=True))
                 for m, n, k, c in ((128, 37888, 3584, GW.GemmWsConfig(128, 64, 4, 1)),
                                    (40, 37888, 3584, GW.GemmWsConfig(128, 128, 3, 1)),
                                    (64, 37888, 3584, GW.GemmWsConfig(64, 64, 4, 1)),  # 32 gate + 32 up rows
                                    (128, 37888, 3584, GW.GemmWsConfig(256, 64, 4, 1)))]
    for name, build in variants:
        try:
            r = build()
        except Exception as e:  # noqa: BLE001 - report every variant
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e)[:600]}", flush=True)
            continue
        ptx = r["ptx"]
        wgmma_reg_a = len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.(?:bf16|f16)"
                                     r"\.(?:bf16|f16)\s+\{[^}]*\},\s*\{", ptx))
        decode = name.startswith("decode")
        dec_regs = re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", ptx)
        widen = ptx.count("cvt.rn.f16x2.e4m3x2")
        gemm = name.startswith("gemm")
        if decode:
            first = ("e4m3 -> fp16 packed cvts, mma.sync", widen > 0 and "mma.sync" in ptx)
        elif gemm:
            first = ("wgmma", "wgmma.mma_async" in ptx)
        else:
            first = ("wgmma with A from registers", wgmma_reg_a > 0)
        checks = {first[0]: first[1],
                  # to the 40 asked for (the decode kernel's maxnreg of 128 leaves 24 for the producer)
                  "producer registers lowered": any(int(n) <= 40 for n in dec_regs),
                  "TMA copies": "cp.async.bulk.tensor.2d" in ptx,
                  "fits one CTA per SM": r["shared"] <= 232448,
                  "no spills": not r.get("spill_bytes")}
        if gemm and "1 splits" not in name:  # the per-thread split-K arrival
            checks["acq_rel arrival atomics"] = bool(re.search(r"atom\.global\.gpu\.acq_rel\.add", ptx))
        if "V widened" in name:  # V's 16-byte rows, no byte loads from shared memory left in the loop
            checks["no byte loads from shared memory"] = ptx.count("ld.shared.b8") <= 1
        bad = [k for k, ok in checks.items() if not ok]
        failed += bool(bad)
        status = "ok   " if not bad else "FAIL "
        print(f"{status} {name}: {r['seconds']:.1f} s, shared {r['shared'] / 1024:.1f} KiB, "
              f"regs {r.get('regs')}, spills {r.get('spill_bytes')} B, wgmma (A in registers) {wgmma_reg_a}, "
              f"e4m3x2 cvts {widen}"
              + (f"; failed: {', '.join(bad)}" if bad else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
