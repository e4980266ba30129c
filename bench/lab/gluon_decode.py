"""Lab: paged decode attention as a warp-specialized Gluon kernel (bf16 pool), against the Triton
decode kernel. NOT YET RUN ON A GPU: written 2026-12-04 after that session's device time ran out,
and only compiled for sm_90 on the CPU (`--compile`).

The question (issue 19): the Triton decode kernel reads a bf16 pool at 3.79-3.93 TB/s, where cuDNN
reads the same shapes at 3.95-4.02 (the Triton kernel takes 1.04x cuDNN's time). About 2% of that
gap is the pool's page order. Its loop issues the cp.async copies, their addresses and the page-id
loads in the same warps that compute.

Here, as in kernels/extend_attention_ws.py, a producer warp streams each (request, KV head)'s pages
by TMA into a ring of STAGES blocks. A block holds W sub-blocks of SUB keys; each sub-block takes
SUB / page_size page boxes, and each copy arrives on the stage's barrier, which counts W arrivals.
The consumers are one 4-warp partition, since a warp-specialized kernel needs a multiple of 4 warps.
Warp w computes sub-block w of every block, as the Triton loop `paged_attn_loop_ws` does:
batched mma.sync over [W, 16, D] x [W, D, SUB] (the GQA group's query rows padded to 16), one
online-softmax state per warp, merged across the warps after the loop. One program per
(request, KV head) and no KV split: the shapes of the goal (64 x 4K, 128 x 2K) also take one split
in the Triton kernel.

    python3 bench/lab/gluon_decode.py --compile                  # CPU: lowers for sm_90
    python3 bench/lab/gluon_decode.py [--shapes 64x4096,128x2048] [--configs 16x2,16x4,32x2]   # GPU

Compiled for sm_90 on the CPU (config SUB x STAGES): 16 x 2 98 KiB of shared memory, 16 x 4
164 KiB, 32 x 2 164 KiB. All configs use 255 registers per thread with no spills, 32-64 mma.sync
and 16-32 TMA copies per loop, so one program fits per SM by registers (4 + 1 warps). The 256
programs of 64 x 4K therefore run in two waves; a KV split that fills the second wave is the first
variant to try if the kernel is correct and near the Triton kernel's rate.
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
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, mma_v2, tma  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
from radixrt.kernels.extend_attention_ws import _as_rows, _smem_layout  # noqa: E402

LOG2E = 1.4426950408889634
W = 4  # consumer warps (one partition)


@gluon.jit
def _producer(kp_desc, vp_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, page_row, seq_len, kv_col):
    """Block j of SUB * W keys into stage j % STAGES, sub-block w at rows w * SUB."""
    WARPS: gl.constexpr = 4
    STAGES: gl.constexpr = k_smem.shape[0]
    SUB: gl.constexpr = k_smem.shape[1] // WARPS
    PAGE: gl.constexpr = kp_desc.block_type.shape[0]
    PAGES: gl.constexpr = SUB // PAGE
    n_blocks = gl.cdiv(seq_len, SUB * WARPS)
    last_page = (seq_len - 1) // PAGE
    for j in range(n_blocks):
        s = j % STAGES
        mbarrier.wait(kv_empty.index(s), ((j // STAGES) & 1) ^ 1)
        for w in gl.static_range(WARPS):
            # one arrival per sub-block (the barriers count WARPS), its bytes counted with it
            mbarrier.expect(k_ready.index(s), PAGES * kp_desc.block_type.nbytes)
            mbarrier.expect(v_ready.index(s), PAGES * vp_desc.block_type.nbytes)
            for i in gl.static_range(PAGES):
                page = gl.load(page_row + gl.minimum((j * WARPS + w) * PAGES + i, last_page))
                tma.async_copy_global_to_shared(kp_desc, [page * PAGE, kv_col], k_ready.index(s),
                                                k_smem.index(s).slice(w * SUB + i * PAGE, PAGE))
                tma.async_copy_global_to_shared(vp_desc, [page * PAGE, kv_col], v_ready.index(s),
                                                v_smem.index(s).slice(w * SUB + i * PAGE, PAGE))


@gluon.jit
def _consumers(q_ptr, o_ptr, q_row, k_smem, v_smem, k_ready, v_ready, kv_empty, seq_len, group, qk_scale):
    WARPS: gl.constexpr = 4
    STAGES: gl.constexpr = k_smem.shape[0]
    SUB: gl.constexpr = k_smem.shape[1] // WARPS
    HEAD: gl.constexpr = k_smem.shape[2]
    dtype: gl.constexpr = k_smem.dtype
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1, 1],
                                                  instr_shape=[1, 16, 8])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    ml_layout: gl.constexpr = gl.SliceLayout(2, mma)  # [W, 16]
    ld: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 4, 8], [WARPS, 1, 1], [2, 1, 0])

    # the group's query rows (padded to 16), the same in every warp
    w_ld = gl.arange(0, WARPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, ld)))
    r_ld = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, ld)))
    d_ld = gl.arange(0, HEAD, layout=gl.SliceLayout(0, gl.SliceLayout(1, ld)))
    q_off = (q_row + r_ld)[None, :, None] * HEAD + d_ld[None, None, :] + 0 * w_ld[:, None, None]
    q = gl.load(q_ptr + q_off, mask=(r_ld < group)[None, :, None] & (w_ld >= 0)[:, None, None], other=0.0)
    q = gl.convert_layout(q, a_layout)

    acc = gl.zeros([WARPS, 16, HEAD], gl.float32, layout=mma)
    m_i = gl.full([WARPS, 16], -float("inf"), gl.float32, layout=ml_layout)
    l_i = gl.zeros([WARPS, 16], gl.float32, layout=ml_layout)
    key_w = gl.arange(0, WARPS, layout=gl.SliceLayout(1, gl.SliceLayout(1, mma)))
    key_i = gl.arange(0, SUB, layout=gl.SliceLayout(0, gl.SliceLayout(1, mma)))
    n_blocks = gl.cdiv(seq_len, SUB * WARPS)
    for j in range(n_blocks):
        s = j % STAGES
        ph = (j // STAGES) & 1
        mbarrier.wait(k_ready.index(s), ph)
        k_t = k_smem.index(s).reshape([WARPS, SUB, HEAD]).permute((0, 2, 1)).load(b_layout)  # [W, D, SUB]
        sc = mma_v2(q, k_t, gl.zeros([WARPS, 16, SUB], gl.float32, layout=mma))
        if (j + 1) * SUB * WARPS > seq_len:
            keys = (j * WARPS + key_w)[:, None] * SUB + key_i[None, :]  # [W, SUB]
            sc = gl.where((keys < seq_len)[:, None, :], sc, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(sc, 2) * qk_scale)
        m_use = gl.where(m_new == -float("inf"), 0.0, m_new)  # a warp whose keys are all past the end
        p = gl.exp2(sc * qk_scale - m_use[:, :, None])
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.sum(p, 2)
        m_i = m_new
        mbarrier.wait(v_ready.index(s), ph)
        v = v_smem.index(s).reshape([WARPS, SUB, HEAD]).load(b_layout)  # [W, SUB, D]
        acc = mma_v2(gl.convert_layout(p.to(dtype), a_layout), v, acc * alpha[:, :, None])
        mbarrier.arrive(kv_empty.index(s), count=1)
    # merge the warps' states (FlashDecoding's split merge, inside the program)
    m_all = gl.max(m_i, 0)
    m_all = gl.where(m_all == -float("inf"), 0.0, m_all)
    f = gl.exp2(m_i - m_all[None, :])
    num = gl.sum(acc * f[:, :, None], 0)  # [16, D]
    den = gl.sum(l_i * f, 0)
    out = num / gl.convert_layout(gl.where(den > 0.0, den, 1.0), gl.SliceLayout(1, num.type.layout))[:, None]
    rows = gl.arange(0, 16, layout=gl.SliceLayout(1, out.type.layout))
    cols = gl.arange(0, HEAD, layout=gl.SliceLayout(0, out.type.layout))
    o_ptrs = o_ptr + (q_row + rows)[:, None] * HEAD + cols[None, :]
    gl.store(o_ptrs, out.to(dtype), mask=(rows < group)[:, None])


@gluon.jit(do_not_specialize=["stride_pt_b"])
def gluon_decode_kernel(q_ptr, o_ptr, kp_desc, vp_desc, page_table, stride_pt_b, seq_lens, qk_scale,
                        GROUP: gl.constexpr, SUB: gl.constexpr, STAGES: gl.constexpr):
    HEAD: gl.constexpr = kp_desc.block_type.shape[1]
    WARPS: gl.constexpr = 4
    req = gl.program_id(0)
    kvh = gl.program_id(1)
    seq_len = gl.load(seq_lens + req)
    if seq_len > 0:
        dtype: gl.constexpr = kp_desc.dtype
        layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WARPS * SUB, HEAD], dtype)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, WARPS * SUB, HEAD], layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, WARPS * SUB, HEAD], layout)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=WARPS)
            mbarrier.init(v_ready.index(i), count=WARPS)
            mbarrier.init(kv_empty.index(i), count=1)
        q_row = (req * gl.num_programs(1) + kvh) * GROUP  # q / o as [B * Hq, D] rows
        c_args = (q_ptr, o_ptr, q_row, k_smem, v_smem, k_ready, v_ready, kv_empty, seq_len, GROUP, qk_scale)
        p_args = (kp_desc, vp_desc, k_smem, v_smem, k_ready, v_ready, kv_empty,
                  page_table + req.to(gl.int64) * stride_pt_b, seq_len, kvh * HEAD)
        gl.warp_specialize([(_consumers, c_args), (_producer, p_args)], [1], [40])


def gluon_decode(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, page_table: torch.Tensor,
                 seq_lens: torch.Tensor, page_size: int, out: torch.Tensor, sub: int = 16,
                 stages: int = 4) -> torch.Tensor:
    """q / out [B, Hq, 128] bf16 contiguous, pool [slots, Hkv, 128] bf16, page_table [B, P] int32,
    seq_lens [B] int32 (one query token per request); sub a multiple of page_size. Returns out."""
    b, hq, d = q.shape
    hkv = k_buffer.shape[1]
    layout = _smem_layout(page_size, d, q.dtype)
    kp = TensorDescriptor.from_tensor(_as_rows(k_buffer), [page_size, d], layout)
    vp = TensorDescriptor.from_tensor(_as_rows(v_buffer), [page_size, d], layout)
    gluon_decode_kernel[(b, hkv)](q, out, kp, vp, page_table, page_table.stride(0), seq_lens,
                                  LOG2E / math.sqrt(d), GROUP=hq // hkv, SUB=sub, STAGES=stages, num_warps=4)
    return out


def compile_sm90(sub: int, stages: int, page: int = 16) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from bench.kernels.compile_sm90 import ptxas_usage

    pool = torch.empty(1024, 4, 128, dtype=torch.bfloat16)
    desc = TensorDescriptor.from_tensor(_as_rows(pool), [page, 128], _smem_layout(page, 128, torch.bfloat16))
    fn = gluon_decode_kernel
    sig = {"q_ptr": "*bf16", "o_ptr": "*bf16", "kp_desc": mangle_type(desc), "vp_desc": mangle_type(desc),
           "page_table": "*i32", "stride_pt_b": "i32", "seq_lens": "*i32", "qk_scale": "fp32"}
    const = {"GROUP": 7, "SUB": sub, "STAGES": stages}
    sig.update({n: "constexpr" for n in const})
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in ("q_ptr", "o_ptr")}
    t0 = time.time()
    ck = triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 4})
    ptx = ck.asm["ptx"]
    return {"sub": sub, "stages": stages, "seconds": round(time.time() - t0, 1), "shared": ck.metadata.shared,
            "mma_sync": ptx.count("mma.sync"), "tma": ptx.count("cp.async.bulk.tensor"), **ptxas_usage(ptx)}


def run_shape(shape: str, configs: list[tuple[int, int]]) -> dict:
    """One batch x context shape: the fp32 reference, the Triton decode kernel (its launcher's split
    count), then each Gluon config; us of CUDA-graph replay, L2 flushed."""
    from bench.common import graph_ms, rel_err
    from radixrt import kernels as K
    from radixrt.kernels import reference as REF

    dev, page, hq, hkv, d = "cuda", 16, 28, 4, 128
    batch, ctx = (int(x) for x in shape.split("x"))
    pages = batch * (ctx // page) + 1
    k_buf = torch.randn(pages * page, hkv, d, device=dev, dtype=torch.bfloat16)
    v_buf = torch.randn_like(k_buf)
    table = (torch.randperm(pages - 1, device=dev) + 1).to(torch.int32).view(batch, ctx // page)
    seq = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(batch, hq, d, device=dev, dtype=torch.bfloat16)
    ref = REF.decode_attention_ref(q, k_buf, v_buf, table, seq, page, None)
    out = torch.empty_like(q)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = K.choose_num_kv_splits(batch, hkv, ctx, num_sms)
    row = {"shape": shape, "triton_splits": splits}

    def run_triton():
        K.decode_attention(q, k_buf, v_buf, table, seq, page, None, splits, out=out, max_seq_len=ctx)
    run_triton()
    row["triton_err"] = rel_err(out, ref)
    row["triton_us"] = graph_ms(run_triton) * 1e3
    for sub, stages in configs:
        key = f"gluon_{sub}x{stages}"

        def run(sub=sub, stages=stages):
            gluon_decode(q, k_buf, v_buf, table, seq, page, out, sub, stages)
        try:
            out.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            row[key + "_err"] = rel_err(out, ref)
            if row[key + "_err"] < 1e-2:
                row[key + "_us"] = graph_ms(run) * 1e3
        except Exception as exc:  # a config that fails is reported, the others still run
            row[key + "_error"] = repr(exc)[:300]
    return row


def run_gpu(args) -> list[dict]:
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    rows = []
    for shape in args.shapes.split(","):
        rows.append(run_shape(shape, configs))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--shapes", default="64x4096,128x2048")
    ap.add_argument("--configs", default="16x2,16x4,32x2")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.compile:
        ok = True
        for cfg in args.configs.split(","):
            sub, stages = (int(x) for x in cfg.split("x"))
            try:
                print(json.dumps(compile_sm90(sub, stages)), flush=True)
            except Exception as exc:
                ok = False
                c, msgs = exc, []
                while c is not None:
                    msgs.append(str(c)[-600:])
                    c = c.__cause__ or c.__context__
                print(f"{cfg}: {type(exc).__name__}: {msgs[-1]}", flush=True)
        return 0 if ok else 1
    rows = run_gpu(args)
    Path(args.out, "gluon_decode.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
