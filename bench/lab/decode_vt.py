"""FP8-pool decode attention with V stored transposed within each page (issue 19: FP8-KV decode at
batch 64 x 4K <= 0.6x the bf16 kernel).

    python3 bench/lab/decode_vt.py [--out decode-vt.json] [--shapes 64x4096,128x2048] [--quick] [--forms ...]
    python3 bench/lab/decode_vt.py --compile    # no GPU: compile every form for sm_90, print counts

Why: P V contracts over positions, and the pool's V rows are positions with the head dim contiguous.
For 16-bit V, ldmatrix.trans gives the MMA its operand; for 8-bit V there is no transposing load,
so Triton 3.6 either reads e4m3 V from shared memory one byte per load ("f16"), or widens it in
registers and writes fp16 back to shared memory ("f16v"), or, for an e4m3 MMA, transposes it through
registers with one-byte stores (paged_loop_fp8.py: 2x slower). FlashAttention-3 transposes V in its
kernel for the same reason. Here the pool keeps V of each page as [D, page_size] (positions
contiguous): `vt_buf [num_pages, Hkv, D, page_size]`, so V^T [D, BLOCK_N] is a K-major operand as
loaded (16-byte pieces of one page and one head-dim row).

FORMS (one lab kernel, one program per (KV head, request), no KV split; blocks that are whole run
without masks, the tail block masked, V zeroed at masked positions: a stale e4m3 byte may be NaN):
  "v_f16"    control: V as the pool stores it now, K and V widened to fp16 (kv_dot "f16"'s math)
  "v_f16m"   the control with every block masked by selects on the loaded K / V and the scores
  "v_f16a"   the control with acc rescaled before the P V dot, which accumulates into it (as
             decode_attention's loop) instead of a dot from zero added to it
  "v_f16l"   "v_f16a" with every block through masked loads (other 0) and the score select: the
             production loop's form in this kernel
  "vt_f16"   V^T pages; O [ROWS, D] += P @ (V^T)^T on mma.sync, V^T widened in registers
  "vt_f16t"  V^T pages; transposed products S^T = K q^T and O^T += V^T P^T (keys and head dim as the
             MMA rows: wgmma with the widened K / V^T as register A operands, q^T / P^T in shared)
  "vt_fp8"   V^T pages; S^T and O^T with e4m3 operands as loaded (q and P as single e4m3 terms,
             FlashAttention-3's FP8 operands; q per-row scaled, P x 256)
  "vt_fp8x2" the same with q and P as two e4m3 terms each (paged_loop_fp8.split_e4m3)
Timed beside it, same run: decode_attention's defaults on the bf16 pool and on the FP8 pool (the
ratio of issue 19's goal). Each variant is checked against the fp32 reference on the dequantized
values first (relative norm error <= TOL_OF[form]). Timing: CUDA-graph replay, median, L2 flushed.

Also (issue 19's bf16 decode against cuDNN): "v_bf16", the control's kernel over the bf16 pool (dots
in bf16); "eng" / "eng_bf16", decode_attention's own loop (paged_attn_loop, every block masked) in
this lab's launch; "ws_bf16" / "ws_f16", keys split across the warps (_decode_ws_kernel; config
BLOCK_N x W warps: W sub-blocks of BLOCK_N / W positions); `--peers` adds cuDNN SDPA on contiguous
K/V and the bf16 default over pages in order; `--cp-async-l2 N` compiles every kernel with
cp.async's .L2::NB prefetch size (a PTX hook).
Measured (H200, 2026-12-04, docs/benchmarks.md "bf16 decode against cuDNN: Nsight Compute, the lab's
forms and L2 hints", the 00:07 call): the engine's loop in the lab launch runs as the default (eng
102.8 against 100.9 us FP8; eng_bf16 140.5 against 139.6 bf16), so the control's 4-6% is in its own
loop; on the bf16 pool the control has no lead (v_bf16 best 138.1 against 139.6); neither cp.async
hint helps (02:15 call). The warp-split forms (03:03 call, `bash bench/h200_run.sh decode-ws`): ws_f16
at 64 x 2 warps x 3 stages 88.0 / 84.4 us at 64 x 4,096 / 128 x 2,048 against the FP8 default's 100.8
/ 103.5 (bf16 default 139.3 / 140.4), now decode_attention's FP8 "long" config (kernels/paged_loop.py
paged_attn_loop_ws); ws_bf16 at best 137.1 / 138.6 against cuDNN's 132.8 / 135.2.
More warp-split FP8 forms (10:20-10:43 calls, docs/benchmarks.md "FP8-KV decode: integer widening, V^T
pages under the warp split, and time against batch"; us at 64 x 4,096, ws_f16 64 x 2w3s 88.2-88.6):
  "ws_f16v"   V widened before its dot: 97.5 (no one-byte shared loads, but V through registers)
  "ws_f16i"   V widened by integer instructions (e4m3_to_f16_x256th: prmt, shift, and/or; the
              conversion unit left to K): 99.6; "ws_f16ik" K that way 105.4; "ws_f16ii" both 108.4
  "ws_vt"     V read from the V^T pages (ldmatrix, 16-byte copies; 565 instructions in the sm_90 loop
              against ws_f16's 949): 87.6 at 64 x 4w3s, 105.2 at 64 x 2w3s; at 128 x 2,048 83.0
              (32 x 2w4s) against ws_f16's 86.7, i.e. <= 4% for a pool layout change
  "ws_f16p" / "ws_vtp"  block n + 1's scores before block n's softmax (S_AHEAD, 11:00 call): the
              worst configs 28% faster, the best 1-7% slower; best at 64 x 4,096 87.2 (ws_vtp 64x4w3s)

Measured (H200, 2026-12-03; docs/benchmarks.md, "V stored transposed per page"): at 64 x 4,096 the
V^T forms are no faster than the FP8 default (101.4 us): vt_fp8 100.0, vt_fp8x2 102.8, vt_f16 104.1,
vt_f16t 119.6 at their best configs; the control v_f16 ran 95.1 and again 95.2 us (128 x 4w3s), and
v_f16m 152.9. v_f16a and v_f16l (which of the control's differences from decode_attention's loop
gives the 6%) are not run yet: `bash bench/h200_run.sh decode-vt-forms`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from functools import partial
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels.paged_loop import paged_attn_loop, prefetch_pages  # noqa: E402
from kernels.paged_loop_fp8 import LO_WEIGHT, P_SCALE, quantize_rows_e4m3, split_e4m3  # noqa: E402

ENG_FORMS = ("eng", "eng_bf16")
# keys split across warps (_decode_ws_kernel); the "i" forms widen V ("i"), K ("ik") or both ("ii")
# with integer instructions; "ws_vt" reads V from the V^T pages. (Two sub-blocks per warp, two softmax
# states each: ptxas spills 436-808 bytes at 128 x 2 warps for sm_90, compiled on the CPU 2026-12-04;
# not run.)
WS_FORMS = ("ws_bf16", "ws_f16", "ws_f16v", "ws_f16i", "ws_f16ik", "ws_f16ii", "ws_vt", "ws_f16p",
            "ws_vtp")  # "p": the next block's scores before this block's softmax (S_AHEAD)
INT_WIDEN = {"ws_f16i": (False, True), "ws_f16ik": (True, False), "ws_f16ii": (True, True)}  # (K, V)
FORMS = ("v_f16", "vt_f16", "vt_f16t", "vt_fp8", "vt_fp8x2", "v_f16m", "v_f16a", "v_f16l",
         "v_bf16") + ENG_FORMS + WS_FORMS
BF16_FORMS = ("v_bf16", "eng_bf16", "ws_bf16")  # over the bf16 pool
# V as the pool stores it
V_POOL_FORMS = ("v_f16", "v_f16m", "v_f16a", "v_f16l", "v_bf16") + ENG_FORMS + tuple(
    f for f in WS_FORMS if not f.startswith("ws_vt"))
TOL_OF = {**dict.fromkeys(FORMS, 1e-2), "vt_fp8": 0.15}
# (BLOCK_N, num_warps, num_stages)
CONFIGS = [(128, 4, 3), (128, 4, 2), (64, 4, 3), (128, 8, 3), (64, 4, 4), (128, 4, 4), (128, 8, 2),
           (64, 8, 3)]
HQ, HKV, D, PAGE = 28, 4, 128, 16
K_SCALE, V_SCALE = 0.5, 0.25
T0 = time.time()


@triton.jit
def _vt_block(vt_head, pages, pos, offs_d, stride_vt_p, PAGE_SIZE: tl.constexpr):
    """Pointers [BLOCK_D, BLOCK_N] of V^T for positions `pos` whose page ids are `pages` [BLOCK_N]:
    page p's [D, PAGE_SIZE] tile at vt_head + p * stride_vt_p, positions contiguous in PAGE_SIZE."""
    base = tl.max_constancy(pages.to(tl.int64) * stride_vt_p, PAGE_SIZE)
    off = base[None, :] + offs_d[:, None] * PAGE_SIZE + (pos % PAGE_SIZE)[None, :]
    return vt_head + tl.max_contiguous(tl.multiple_of(off, [1, PAGE_SIZE]), [1, PAGE_SIZE])


@triton.jit
def _vt_step(q16, qt16, q_hi, q_lo, col_scale, qk_scale, m_i, l_i, l_blk, acc, k_head, v_head, cur, pos,
             seq_len, offs_d, stride_kb_s, stride_vb_s, stride_vt_p,
             PAGE_SIZE: tl.constexpr, FORM: tl.constexpr, MASKED: tl.constexpr,
             LOAD_MASK: tl.constexpr = False, ACC_IN_DOT: tl.constexpr = False):
    """One block of BLOCK_N positions `pos` (page ids `cur`); MASKED: positions past seq_len are
    zeroed in K and V and get no weight (their bytes are stale, maybe NaN). Returns the state.
    ("v_f16" only:) LOAD_MASK: K and V through masked loads (other 0) and the scores selected, as
    decode_attention's loop does; ACC_IN_DOT: acc rescaled first and the P V dot accumulating into
    it, as there, instead of the dot from zero added to the rescaled acc."""
    TRANSPOSED: tl.constexpr = FORM == "vt_f16t" or FORM == "vt_fp8" or FORM == "vt_fp8x2"
    slot = cur.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
    mask_n = pos < seq_len
    if LOAD_MASK:
        kb = tl.load(k_head + slot[:, None] * stride_kb_s + offs_d[None, :], mask=mask_n[:, None], other=0.0)
    else:
        kb = tl.load(k_head + slot[:, None] * stride_kb_s + offs_d[None, :])
    if LOAD_MASK:
        vb = tl.load(v_head + slot[:, None] * stride_vb_s + offs_d[None, :], mask=mask_n[:, None], other=0.0)
    elif FORM == "v_f16":
        vb = tl.load(v_head + slot[:, None] * stride_vb_s + offs_d[None, :])
    else:
        vb = tl.load(_vt_block(v_head, cur, pos, offs_d, stride_vt_p, PAGE_SIZE))  # [D, BLOCK_N]
    if MASKED and not LOAD_MASK:
        kb = tl.where(mask_n[:, None], kb, 0.0)
        if FORM == "v_f16":
            vb = tl.where(mask_n[:, None], vb, 0.0)
        else:
            vb = tl.where(mask_n[None, :], vb, 0.0)
    if TRANSPOSED:
        if FORM == "vt_f16t":
            s = tl.dot(kb.to(tl.float16), qt16)
        else:
            s = tl.dot(kb, q_hi)
            if FORM == "vt_fp8x2":
                s += tl.dot(kb, q_lo) * LO_WEIGHT
        s = s * col_scale[None, :]
        if MASKED:
            s = tl.where(mask_n[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        l_blk = l_blk * alpha[None, :] + p
        if FORM == "vt_f16t":
            pv = tl.dot(vb.to(tl.float16), p.to(tl.float16))
        else:
            p_hi, p_lo = split_e4m3(p * P_SCALE, FORM == "vt_fp8x2")
            pv = tl.dot(vb, p_hi)
            if FORM == "vt_fp8x2":
                pv += tl.dot(vb, p_lo) * LO_WEIGHT
            pv = pv * (1.0 / P_SCALE)
        acc = acc * alpha[None, :] + pv
    else:
        s = tl.dot(q16, tl.trans(kb.to(q16.dtype))) * qk_scale
        if MASKED or LOAD_MASK:
            s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if ACC_IN_DOT:
            acc = acc * alpha[:, None]
            acc += tl.dot(p.to(q16.dtype), vb.to(q16.dtype))
        else:
            if FORM == "v_f16":
                pv = tl.dot(p.to(q16.dtype), vb.to(q16.dtype))
            else:
                pv = tl.dot(p.to(tl.float16), tl.trans(vb.to(tl.float16)))
            acc = acc * alpha[:, None] + pv
    return m_new, l_i, l_blk, acc


@triton.jit
def _program_queries(q, seq_lens, stride_q_b, stride_q_h, GROUP: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """The (KV head, request) of this program (grid axes 0, 1), its seq_len, the group's query heads
    [BLOCK_H] and their mask, the head-dim offsets, and the group's queries [BLOCK_H, BLOCK_D] (0 in
    the padding rows)."""
    kvh = tl.program_id(0)
    b = tl.program_id(1)
    seq_len = tl.load(seq_lens + b)
    offs_g = tl.arange(0, BLOCK_H)
    heads = kvh * GROUP + offs_g
    mask_h = offs_g < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    qg = tl.load(q + b * stride_q_b + heads[:, None] * stride_q_h + offs_d[None, :], mask=mask_h[:, None],
                 other=0.0)
    return kvh, b, seq_len, heads, mask_h, offs_d, qg


@triton.jit
def _decode_vt_kernel(q, k_buf, v_buf, page_table, seq_lens, o, qk_scale, v_scale,
                      stride_q_b, stride_q_h, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
                      stride_vt_p, stride_pt_b, stride_o_b, stride_o_h,
                      GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, FORM: tl.constexpr):
    """One (KV head, request): o[b, heads] over all of the request's positions. q [B, Hq, D] bf16;
    k_buf [S, Hkv, D] e4m3; v_buf: [S, Hkv, D] e4m3 for "v_f16", else V^T pages [P, Hkv, D, PAGE]
    e4m3 (stride_vt_p per page, stride_vb_h per head); qk_scale = softmax scale x log2(e) x k_scale.
    The whole blocks run unmasked in one loop, the last partial block after it (_vt_step)."""
    kvh, b, seq_len, heads, mask_h, offs_d, qg = _program_queries(q, seq_lens, stride_q_b, stride_q_h, GROUP,
                                                                  BLOCK_H, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    pt_row = page_table + b * stride_pt_b
    k_head = k_buf + kvh.to(tl.int64) * stride_kb_h
    v_head = v_buf + kvh.to(tl.int64) * stride_vb_h
    TRANSPOSED: tl.constexpr = FORM == "vt_f16t" or FORM == "vt_fp8" or FORM == "vt_fp8x2"
    qf = tl.clamp(qg.to(tl.float32), -65504.0, 65504.0)
    q16 = qf.to(tl.float16)
    qt16 = tl.trans(qf).to(tl.float16)
    if FORM == "v_bf16":
        q16 = qg
    if FORM == "vt_fp8" or FORM == "vt_fp8x2":
        q_hi, q_lo, q_row_scale = quantize_rows_e4m3(qg, FORM == "vt_fp8x2")
        q_hi = tl.trans(q_hi)
        q_lo = tl.trans(q_lo)
        col_scale = q_row_scale * qk_scale
    else:
        q_hi = qt16
        q_lo = qt16
        col_scale = tl.full([BLOCK_H], 1.0, tl.float32) * qk_scale
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    if TRANSPOSED:
        l_blk = tl.zeros([BLOCK_N, BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_D, BLOCK_H], dtype=tl.float32)
    else:
        l_blk = tl.zeros([BLOCK_H], dtype=tl.float32)  # (unused)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    full_end = tl.minimum(seq_len // BLOCK_N * BLOCK_N, seq_len)
    STEP_FORM: tl.constexpr = ("v_f16" if FORM == "v_f16m" or FORM == "v_f16l" or FORM == "v_f16a"
                               or FORM == "v_bf16" else FORM)
    LOAD_MASK: tl.constexpr = FORM == "v_f16l"
    ACC_IN_DOT: tl.constexpr = FORM == "v_f16a" or FORM == "v_f16l"
    pages = prefetch_pages(pt_row, 0, seq_len, offs_n, PAGE_SIZE)
    for n0 in range(0, full_end, BLOCK_N):
        cur = pages
        pages = prefetch_pages(pt_row, n0 + BLOCK_N, seq_len, offs_n, PAGE_SIZE)
        m_i, l_i, l_blk, acc = _vt_step(q16, qt16, q_hi, q_lo, col_scale, qk_scale, m_i, l_i, l_blk, acc,
                                        k_head, v_head, cur, n0 + offs_n, seq_len, offs_d, stride_kb_s,
                                        stride_vb_s, stride_vt_p, PAGE_SIZE, STEP_FORM, FORM == "v_f16m",
                                        LOAD_MASK, ACC_IN_DOT)
    if full_end < seq_len:
        m_i, l_i, l_blk, acc = _vt_step(q16, qt16, q_hi, q_lo, col_scale, qk_scale, m_i, l_i, l_blk, acc,
                                        k_head, v_head, pages, full_end + offs_n, seq_len, offs_d,
                                        stride_kb_s, stride_vb_s, stride_vt_p, PAGE_SIZE, STEP_FORM, True,
                                        LOAD_MASK, ACC_IN_DOT)
    if TRANSPOSED:
        l_i = tl.sum(l_blk, 0)
        out = acc * v_scale / tl.where(l_i > 0.0, l_i, 1.0)[None, :]  # [D, ROWS]
        tl.store(o + b * stride_o_b + heads[None, :] * stride_o_h + offs_d[:, None],
                 out.to(o.dtype.element_ty), mask=mask_h[None, :])
    else:
        out = acc * v_scale / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(o + b * stride_o_b + heads[:, None] * stride_o_h + offs_d[None, :],
                 out.to(o.dtype.element_ty), mask=mask_h[:, None])


@triton.jit
def _decode_eng_kernel(q, k_buf, v_buf, page_table, seq_lens, o, qk_scale, v_scale,
                       stride_q_b, stride_q_h, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
                       stride_pt_b, stride_o_b, stride_o_h,
                       GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, FP16_DOTS: tl.constexpr):
    """Forms "eng" / "eng_bf16": decode_attention's own loop (kernels/paged_loop.py paged_attn_loop,
    every block masked) over [0, seq_len) of one (KV head, request), in this lab's launch (grid
    (KV head, request), no split arithmetic, no PDL): which side of the loop the control's lead is on.
    FP16_DOTS: q rounded to fp16 (an FP8 pool, kv_dot "f16"), else both dots in q's dtype."""
    kvh, b, seq_len, heads, mask_h, offs_d, qg = _program_queries(q, seq_lens, stride_q_b, stride_q_h, GROUP,
                                                                  BLOCK_H, BLOCK_D)
    if FP16_DOTS:
        qg = tl.clamp(qg.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    m_i, l_i, acc = paged_attn_loop(qg, k_buf, v_buf, page_table + b * stride_pt_b, kvh, 0, seq_len, qk_scale,
                                    stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h, BLOCK_H, PAGE_SIZE,
                                    BLOCK_D, BLOCK_D, BLOCK_N, "tf32")
    out = acc * v_scale / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(o + b * stride_o_b + heads[:, None] * stride_o_h + offs_d[None, :], out.to(o.dtype.element_ty),
             mask=mask_h[:, None])

@triton.jit
def e4m3_to_f16_x256th(x):
    """x (e4m3, any shape) widened to fp16 with integer instructions, as x * 2^-8 (exact: e4m3's
    exponent field moved into fp16's, whose bias is 8 more; subnormals map to subnormals).

    Four values per 32-bit register: one byte permute (prmt) puts two bytes in the high halves of two
    16-bit lanes, then sign | (magnitude >> 1) per lane: 4 integer instructions per two values, issued
    at 64 per clock per SM on Hopper, against one packed cvt.rn.f16x2.e4m3x2 per two values at 16 per
    clock: the same issue cost, on the integer pipe instead of the conversion unit, so a kernel that
    widens K one way and V the other spreads its conversions over both (the bit layout as in the FP8
    dequantization of Marlin-style GPTQ kernels; this is our own code). The caller folds 256 into
    the scale of whatever the value multiplies. Not run by the Triton interpreter (inline PTX)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 a<2>, t<2>;
        prmt.b32 a0, $2, 0, 0x1404;
        prmt.b32 a1, $2, 0, 0x3424;
        shr.b32 t0, a0, 1;
        shr.b32 t1, a1, 1;
        and.b32 t0, t0, 0x3F803F80;
        and.b32 t1, t1, 0x3F803F80;
        and.b32 a0, a0, 0x80008000;
        and.b32 a1, a1, 0x80008000;
        or.b32 $0, a0, t0;
        or.b32 $1, a1, t1;
        }""",
        constraints="=r,=r,r", args=[x.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=True,
        pack=4)


@triton.jit
def _widen(x, dtype: tl.constexpr, INT: tl.constexpr):
    """x in `dtype`; INT: e4m3 x as fp16 x * 2^-8 through e4m3_to_f16_x256th."""
    if INT:
        return e4m3_to_f16_x256th(x)
    return x.to(dtype)


@triton.jit
def _ws_load_v(v_head, pages, pos, offs_d, stride_vb_s, PAGE_SIZE: tl.constexpr, VT: tl.constexpr):
    """V of positions `pos` [W, SUB] on `pages`: [W, SUB, D] from the pool, or with VT [W, D, SUB] from
    the V^T pages (stride_vb_s their page stride; positions contiguous in 16-byte pieces)."""
    if VT:
        base = tl.max_constancy(pages.to(tl.int64) * stride_vb_s, [1, PAGE_SIZE])
        off = base[:, None, :] + offs_d[None, :, None] * PAGE_SIZE + (pos % PAGE_SIZE)[:, None, :]
        vb = tl.load(v_head + tl.max_contiguous(tl.multiple_of(off, [1, 1, PAGE_SIZE]), [1, 1, PAGE_SIZE]))
    else:  # (one return: Triton wants one return type per function)
        slot = pages.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
        vb = tl.load(v_head + slot[:, :, None] * stride_vb_s + offs_d[None, None, :])
    return vb


@triton.jit
def _ws_pv(acc, alpha, p, vb, dtype: tl.constexpr, VT: tl.constexpr, V_INT: tl.constexpr):
    """acc [W, ROWS, D] rescaled by alpha [W, ROWS] plus P [W, ROWS, SUB] V, V as _ws_load_v gave it
    (VT: [W, D, SUB], transposed for the dot; V_INT: widened by e4m3_to_f16_x256th)."""
    if VT:
        pv = tl.dot(p.to(dtype), tl.trans(vb.to(dtype), (0, 2, 1)))
    else:
        pv = tl.dot(p.to(dtype), _widen(vb, dtype, V_INT))
    return acc * alpha[:, :, None] + pv


@triton.jit
def _ws_step(q3, m_i, l_i, acc, k_head, v_head, pages, pos, seq_len, offs_d, qk_scale, stride_kb_s,
             stride_vb_s, PAGE_SIZE: tl.constexpr, MASKED: tl.constexpr, V_WIDEN: tl.constexpr = False,
             K_INT: tl.constexpr = False, V_INT: tl.constexpr = False, VT: tl.constexpr = False):
    """One block of the warp-split form: pages / pos [W, SUB] (sub-block w of SUB positions is warp w's),
    the state m_i / l_i [W, ROWS], acc [W, ROWS, D] per sub-block; returns it updated. V_WIDEN: V
    widened to q's dtype before the P V dot behind a select (kv_dot "f16v"'s way past the byte loads
    from shared memory). K_INT / V_INT: K / V widened by e4m3_to_f16_x256th (the caller's scales
    carry the 256). VT: v_head is the head's V^T pages (to_vt_pages; stride_vb_s their page stride),
    read as [W, D, SUB] tiles with the positions contiguous (ws_vt)."""
    slot = pages.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
    kb = tl.load(k_head + slot[:, :, None] * stride_kb_s + offs_d[None, None, :])  # [W, SUB, D]
    mask_n = pos < seq_len
    vb = _ws_load_v(v_head, pages, pos, offs_d, stride_vb_s, PAGE_SIZE, VT)
    if MASKED:  # stale (maybe NaN) bytes past the end: zeroed, and no weight
        kb = tl.where(mask_n[:, :, None], kb, 0.0)
        if VT:
            vb = tl.where(mask_n[:, None, :], vb, 0.0)
        else:
            vb = tl.where(mask_n[:, :, None], vb, 0.0)
    if V_WIDEN:
        vb = tl.where(mask_n[:, :, None], vb.to(q3.dtype), 0.0)
    s = tl.dot(q3, tl.trans(_widen(kb, q3.dtype, K_INT), (0, 2, 1))) * qk_scale  # [W, ROWS, SUB]
    if MASKED:
        s = tl.where(mask_n[:, None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 2))
    m_ref = m_new
    if MASKED:  # a sub-block with no position yet: exp2 against 0, not -inf - -inf; its m stays -inf
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, :, None])
    l_i = l_i * alpha + tl.sum(p, 2)
    return m_new, l_i, _ws_pv(acc, alpha, p, vb, q3.dtype, VT, V_INT)


@triton.jit
def _ws_scores(q3, k_head, pages, pos, offs_d, qk_scale, stride_kb_s, PAGE_SIZE: tl.constexpr):
    """S [W, ROWS, SUB] of one whole block (no masks): q3 against K of positions `pos` on `pages`."""
    slot = pages.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
    kb = tl.load(k_head + slot[:, :, None] * stride_kb_s + offs_d[None, None, :])  # [W, SUB, D]
    return tl.dot(q3, tl.trans(kb.to(q3.dtype), (0, 2, 1))) * qk_scale


@triton.jit
def _ws_update(s, q3, m_i, l_i, acc, v_head, pages, pos, offs_d, stride_vb_s, PAGE_SIZE: tl.constexpr,
               VT: tl.constexpr):
    """The softmax and P V of one whole block whose scores `s` were computed before (_ws_scores)."""
    vb = _ws_load_v(v_head, pages, pos, offs_d, stride_vb_s, PAGE_SIZE, VT)
    m_new = tl.maximum(m_i, tl.max(s, 2))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, :, None])
    l_i = l_i * alpha + tl.sum(p, 2)
    return m_new, l_i, _ws_pv(acc, alpha, p, vb, q3.dtype, VT, False)


@triton.jit
def _decode_ws_kernel(q, k_buf, v_buf, page_table, seq_lens, o, qk_scale, v_scale,
                      stride_q_b, stride_q_h, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
                      stride_pt_b, stride_o_b, stride_o_h,
                      GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_H: tl.constexpr, W: tl.constexpr, SUB: tl.constexpr, FP16_DOTS: tl.constexpr,
                      V_WIDEN: tl.constexpr = False, K_INT: tl.constexpr = False, V_INT: tl.constexpr = False,
                      VT: tl.constexpr = False, S_AHEAD: tl.constexpr = False):
    """Forms "ws_bf16" / "ws_f16" / "ws_f16v" / "ws_f16i*" / "ws_vt": keys split across warps inside the
    program, as cuDNN's decode kernel does (its tile 16 x 128 x 128 with warps 1 x 4 x 1: each warp takes
    its own keys). A block of W x SUB positions is [W, SUB]; the products are batched dots over W (Triton
    puts the batch axis on the warps), so each warp keeps its own running max / sum / accumulator
    [ROWS, D] and P never leaves the warp; the W partial states are combined once, after the loop.
    One program per (KV head, request), no KV split. FP16_DOTS: an FP8 pool, q rounded to fp16 and
    K/V widened to it; V_WIDEN ("ws_f16v"): V widened before its dot (_ws_step); K_INT / V_INT (the
    "ws_f16i*" forms): K / V widened with integer instructions, qk_scale / v_scale x 256 (the caller);
    VT ("ws_vt"): v_buf holds V^T pages (stride_vb_s: their page stride). S_AHEAD (the "p" forms): the
    whole blocks software-pipelined by hand, block n + 1's scores computed before block n's softmax
    and P V, so each warp has two independent MMA chains in flight (FlashAttention-3's intra-warpgroup
    overlap, here on mma.sync)."""
    kvh, b, seq_len, heads, mask_h, offs_d, qg = _program_queries(q, seq_lens, stride_q_b, stride_q_h, GROUP,
                                                                  BLOCK_H, BLOCK_D)
    if FP16_DOTS:
        qg = tl.clamp(qg.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    q3 = tl.broadcast_to(qg[None, :, :], (W, BLOCK_H, BLOCK_D))
    offs_n = tl.arange(0, W)[:, None] * SUB + tl.arange(0, SUB)[None, :]  # [W, SUB]
    pt_row = page_table + b * stride_pt_b
    k_head = k_buf + kvh.to(tl.int64) * stride_kb_h
    v_head = v_buf + kvh.to(tl.int64) * stride_vb_h
    m_i = tl.full([W, BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([W, BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([W, BLOCK_H, BLOCK_D], dtype=tl.float32)
    BLOCK_N: tl.constexpr = W * SUB
    full_end = seq_len // BLOCK_N * BLOCK_N
    pages = prefetch_pages(pt_row, 0, seq_len, offs_n, PAGE_SIZE)
    if S_AHEAD:
        if full_end > 0:
            s_cur = _ws_scores(q3, k_head, pages, offs_n, offs_d, qk_scale, stride_kb_s, PAGE_SIZE)
            # page ids one iteration ahead for both operands (K of block n + 1, V of block n): a chain
            # two iterations deep kept Triton's pipeliner from making any copy asynchronous
            pk = prefetch_pages(pt_row, BLOCK_N, seq_len, offs_n, PAGE_SIZE)
            pv = pages
            for n0 in range(0, full_end - BLOCK_N, BLOCK_N):
                ck = pk
                cv = pv
                pk = prefetch_pages(pt_row, n0 + 2 * BLOCK_N, seq_len, offs_n, PAGE_SIZE)
                pv = prefetch_pages(pt_row, n0 + BLOCK_N, seq_len, offs_n, PAGE_SIZE)
                s_next = _ws_scores(q3, k_head, ck, n0 + BLOCK_N + offs_n, offs_d, qk_scale, stride_kb_s,
                                    PAGE_SIZE)
                m_i, l_i, acc = _ws_update(s_cur, q3, m_i, l_i, acc, v_head, cv, n0 + offs_n, offs_d,
                                           stride_vb_s, PAGE_SIZE, VT)
                s_cur = s_next
            m_i, l_i, acc = _ws_update(s_cur, q3, m_i, l_i, acc, v_head, pv, full_end - BLOCK_N + offs_n,
                                       offs_d, stride_vb_s, PAGE_SIZE, VT)
            pages = pk  # the tail block's page ids
    else:
        for n0 in range(0, full_end, BLOCK_N):
            cur = pages
            pages = prefetch_pages(pt_row, n0 + BLOCK_N, seq_len, offs_n, PAGE_SIZE)
            m_i, l_i, acc = _ws_step(q3, m_i, l_i, acc, k_head, v_head, cur, n0 + offs_n, seq_len, offs_d,
                                     qk_scale, stride_kb_s, stride_vb_s, PAGE_SIZE, False, V_WIDEN, K_INT,
                                     V_INT, VT)
    if full_end < seq_len:
        m_i, l_i, acc = _ws_step(q3, m_i, l_i, acc, k_head, v_head, pages, full_end + offs_n, seq_len, offs_d,
                                 qk_scale, stride_kb_s, stride_vb_s, PAGE_SIZE, True, V_WIDEN, K_INT, V_INT,
                                 VT)
    # the W sub-blocks' states combined: weights 2^(m_w - m)
    m_all = tl.max(m_i, 0)
    wgt = tl.exp2(m_i - tl.where(m_all == float("-inf"), 0.0, m_all)[None, :])
    l_all = tl.sum(l_i * wgt, 0)
    out = tl.sum(acc * wgt[:, :, None], 0) * v_scale / tl.where(l_all > 0.0, l_all, 1.0)[:, None]
    tl.store(o + b * stride_o_b + heads[:, None] * stride_o_h + offs_d[None, :], out.to(o.dtype.element_ty),
             mask=mask_h[:, None])


def paged_pool(x, slots, n_slots: int):
    """x [B, Hkv, L, D] scattered into a pool [n_slots, Hkv, D] at `slots` [B * L] (position order);
    every other slot holds 0x7F bytes (NaN in e4m3) for FP8, zeros otherwise."""
    import torch

    _, h, _, d = x.shape
    if x.dtype == torch.float8_e4m3fn:
        buf = torch.full((n_slots, h, d), 0x7F, device=x.device, dtype=torch.uint8).view(x.dtype)
    else:
        buf = torch.zeros(n_slots, h, d, device=x.device, dtype=x.dtype)
    buf[slots] = x.permute(0, 2, 1, 3).reshape(-1, h, d)
    return buf


def to_vt_pages(vb, page_size: int):
    """V pool [S, Hkv, D] (S = pages x page_size) as V^T pages [S / page_size, Hkv, D, page_size]."""
    s, h, d = vb.shape
    return vb.view(s // page_size, page_size, h, d).permute(0, 2, 3, 1).contiguous()


def decode_vt(q, kb, v_any, table, seq_lens, out, qk_scale: float, v_scale: float, form: str,
              block_n: int, num_warps: int, num_stages: int):
    """Launch the lab kernel: q [B, Hq, D] bf16, kb [S, Hkv, D] e4m3, v_any the V pool ([S, Hkv, D],
    form "v_f16") or its V^T pages (to_vt_pages), table [B, P] int32, seq_lens [B] int32, out like q;
    qk_scale includes log2(e) and k_scale."""
    bsz, hq, d = q.shape
    hkv = kb.shape[1]
    if form in WS_FORMS:  # config (BLOCK_N, W warps, stages): W sub-blocks of BLOCK_N / W positions
        _decode_ws_kernel[(hkv, bsz)](
            q, kb, v_any, table, seq_lens, out, qk_scale, v_scale, q.stride(0), q.stride(1), kb.stride(0),
            kb.stride(1), v_any.stride(0), v_any.stride(1), table.stride(0), out.stride(0), out.stride(1),
            GROUP=hq // hkv, PAGE_SIZE=PAGE, BLOCK_D=d, BLOCK_H=max(16, triton.next_power_of_2(hq // hkv)),
            W=num_warps, SUB=block_n // num_warps, FP16_DOTS=form != "ws_bf16", V_WIDEN=form == "ws_f16v",
            K_INT=INT_WIDEN.get(form, (False, False))[0], V_INT=INT_WIDEN.get(form, (False, False))[1],
            VT=form.startswith("ws_vt"), S_AHEAD=form.endswith("p"),
            num_warps=num_warps, num_stages=num_stages)
        return out
    if form in ENG_FORMS:
        _decode_eng_kernel[(hkv, bsz)](
            q, kb, v_any, table, seq_lens, out, qk_scale, v_scale, q.stride(0), q.stride(1), kb.stride(0),
            kb.stride(1), v_any.stride(0), v_any.stride(1), table.stride(0), out.stride(0), out.stride(1),
            GROUP=hq // hkv, PAGE_SIZE=PAGE, BLOCK_D=d, BLOCK_H=max(16, triton.next_power_of_2(hq // hkv)),
            BLOCK_N=block_n, FP16_DOTS=form == "eng", num_warps=num_warps, num_stages=num_stages)
        return out
    if form in V_POOL_FORMS:
        svs, svh, svp = v_any.stride(0), v_any.stride(1), 0
    else:
        svs, svh, svp = 0, v_any.stride(1), v_any.stride(0)
    _decode_vt_kernel[(hkv, bsz)](
        q, kb, v_any, table, seq_lens, out, qk_scale, v_scale,
        q.stride(0), q.stride(1), kb.stride(0), kb.stride(1), svs, svh, svp, table.stride(0),
        out.stride(0), out.stride(1),
        GROUP=hq // hkv, PAGE_SIZE=PAGE, BLOCK_D=d, BLOCK_H=max(16, triton.next_power_of_2(hq // hkv)),
        BLOCK_N=block_n, FORM=form, num_warps=num_warps, num_stages=num_stages)
    return out


def install_cp_async_l2_hint(size: int) -> None:
    """Compile every kernel of this process with the L2 prefetch-size qualifier `.L2::<size>B` on its
    `cp.async` copies (PTX ISA 7.4+; what CUTLASS's SM80 copy atoms emit and Triton 3.6 does not): a
    hook on the PTX stage (triton.knobs.runtime.add_stages_inspection_hook). The hook is not part of
    Triton's cache key: run it in a process with its own TRITON_CACHE_DIR."""
    import triton.knobs as knobs

    pattern = re.compile(r"cp\.async\.(c[ag])\.shared\.global \[")

    def hook(backend, stages, options, language, capability):
        make_ptx = stages["ptx"]

        def ptx_with_hint(src, metadata):
            ptx = make_ptx(src, metadata)
            return pattern.sub(lambda m: f"cp.async.{m.group(1)}.shared.global.L2::{size}B [", ptx)

        stages["ptx"] = ptx_with_hint

    knobs.runtime.add_stages_inspection_hook = hook


def compile_report() -> int:
    """Compile each form x config for sm_90 on this machine; print shared memory, async waits in the
    TTGIR, wgmma / mma.sync / ld.shared.b8 / cvt counts in the PTX. Exit 1 on a compile failure."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    from bench.kernels.compile_sm90 import ptxas_usage

    fn = _decode_vt_kernel
    failed = 0
    for form in FORMS:
        if form in ENG_FORMS or form in BF16_FORMS:  # (the FP8-pool forms of _decode_vt_kernel only)
            continue
        for bn, warps, stages in CONFIGS[:3]:
            const = dict(GROUP=7, PAGE_SIZE=PAGE, BLOCK_D=D, BLOCK_H=16, BLOCK_N=bn, FORM=form)
            sig, attrs = {}, {}
            for i, n in enumerate(fn.arg_names):
                sig[n] = ("constexpr" if n in const else "*fp8e4nv" if n in ("k_buf", "v_buf")
                          else "*bf16" if n in ("q", "o") else "*i32" if n in ("page_table", "seq_lens")
                          else "fp32" if n in ("qk_scale", "v_scale") else "i32")
                divisible = sig[n].startswith("*") or (n.startswith("stride") and n != "stride_pt_b")
                if n not in const and divisible:
                    attrs[(i,)] = [["tt.divisibility", 16]]
            constexprs = {(fn.arg_names.index(k),): v for k, v in const.items()}
            src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
            try:
                k = triton_compile(src, target=GPUTarget("cuda", 90, 32),
                                   options={"num_warps": warps, "num_stages": stages})
            except Exception as e:  # noqa: BLE001 - report and go on
                failed += 1
                print(f"{form:9} {bn}x{warps}w{stages}s FAILED {type(e).__name__}: {str(e)[:300]}")
                continue
            ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
            waits = re.findall(r"ttg\.async_wait .*?\{num = (\d+) : i32\}", ttgir)
            counts = {name: len(re.findall(pat, ptx)) for name, pat in (
                ("wgmma", r"wgmma\.mma_async"), ("mma", r"\bmma\.sync"), ("ld.shared.b8", r"ld\.shared\.b8"),
                ("st.shared", r"st\.shared"), ("ldmatrix", r"ldmatrix"), ("cvt", r"\bcvt\."),
                ("cp.async16", r"cp\.async\.cg\.shared\.global.*16;"), ("cp.async<16", r"cp\.async\.ca"))}
            use = ptxas_usage(ptx)
            tail = (f" regs {use.get('regs')} spills {use.get('spill_bytes')} B"
                    f" ({use.get('local_ops_in_loops')} local ops in loops)")
            print(f"{form:9} {bn}x{warps}w{stages}s shared {k.metadata.shared:6} waits {waits} "
                  + " ".join(f"{a}={b}" for a, b in counts.items()) + tail, flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    # (256x777, a partial last block: "vt_f16t" at 128 x 4w2s hit an illegal address on the H200,
    # 2026-12-03, unexplained; every form before it in that run passed its check there)
    p.add_argument("--shapes", default="64x4096,128x2048,256x512")
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument("--quick", action="store_true", help="the first two configs only")
    p.add_argument("--configs", default=None, help="BLOCK_NxWARPSwSTAGESs list, e.g. 128x8w2s,64x4w3s")
    p.add_argument("--cp-async-l2", type=int, default=0, choices=[0, 64, 128, 256],
                   help="compile every kernel with cp.async's .L2::<n>B prefetch size (own TRITON_CACHE_DIR)")
    p.add_argument("--peers", action="store_true",
                   help="also cuDNN SDPA (contiguous bf16) and the bf16 default over pages in order")
    p.add_argument("--compile", action="store_true", help="compile for sm_90 on this machine, no GPU")
    p.add_argument("--device", default="cuda", help="cpu: a check of the script under TRITON_INTERPRET=1")
    ns = p.parse_args(argv)
    if ns.cp_async_l2:
        install_cp_async_l2_hint(ns.cp_async_l2)
    if ns.compile:
        return compile_report()
    import kv_layout as kl
    import torch
    from sdpa_peers import peer_rows, reference

    from bench.common import out_path, rel_err, run_header, write_json
    from bench.kernels_import import import_kernels

    K = import_kernels()
    dev, bf16, fp8 = torch.device(ns.device), torch.bfloat16, torch.float8_e4m3fn
    torch.manual_seed(0)
    result: dict = {**run_header(), "rows": []}
    path = out_path(ns.out, "decode-vt.json")
    forms = ns.forms.split(",")
    configs = CONFIGS[:2] if ns.quick else CONFIGS
    if ns.configs:
        configs = [tuple(int(x) for x in re.fullmatch(r"(\d+)x(\d+)w(\d+)s", c).groups())
                   for c in ns.configs.split(",")]
    log2e = 1.4426950408889634

    def timed(run, out, ref, tol):
        if dev.type != "cuda":  # the interpreter check: correctness only
            out.fill_(float("nan"))
            run()
            return {"us": 1.0, "rel_err": rel_err(out, ref)}
        return kl.timed(run, out, ref, tol)  # checked against ref, then a CUDA graph's median

    for shape in ns.shapes.split(","):
        batch, ctx = (int(x) for x in shape.split("x"))
        q = torch.randn(batch, HQ, D, device=dev, dtype=bf16)
        kc = torch.randn(batch, HKV, ctx, D, device=dev, dtype=bf16)
        vc = torch.randn_like(kc)
        k8, v8 = (kc / K_SCALE).to(fp8), (vc / V_SCALE).to(fp8)
        kd, vd = (k8.float() * K_SCALE).to(bf16), (v8.float() * V_SCALE).to(bf16)
        ref = reference(q[:, :, None], kd, vd, False)[:, :, 0]
        per = triton.cdiv(ctx, PAGE)
        table = (torch.randperm(batch * per, device=dev) + 1).view(batch, per).int()
        slots = (table.long()[:, :, None] * PAGE + torch.arange(PAGE, device=dev)).view(-1)
        n_slots = (batch * per + 1) * PAGE

        sl = slots.view(batch, per * PAGE)[:, :ctx].reshape(-1)
        kb16, vb16 = (paged_pool(x, sl, n_slots) for x in (kd, vd))
        kb8, vb8 = (paged_pool(x, sl, n_slots) for x in (k8, v8))
        vt8 = to_vt_pages(vb8, PAGE)
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
        out = torch.empty_like(q)
        num_sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132
        rows = []
        fp8_scales = {"k_scale": K_SCALE, "v_scale": V_SCALE}
        defaults = {"bf16 pool default": (kb16, vb16, {}, False),
                    "fp8 pool default": (kb8, vb8, fp8_scales, True)}
        for name, (kb, vb, scales, is_fp8) in defaults.items():
            splits = K.choose_num_kv_splits(batch, HKV, ctx, num_sms, kv_fp8=is_fp8)
            mid_o = torch.empty(batch, HQ, splits, D, device=dev)
            mid_lse = torch.empty(batch, HQ, splits, device=dev)
            run = partial(K.decode_attention, q, kb, vb, table, seq_lens, PAGE, None, splits, out=out,
                          mid_o=mid_o, mid_lse=mid_lse, max_seq_len=ctx, **scales)
            rows.append({"shape": shape, "variant": f"{name} ({splits} split)", **timed(run, out, ref, 1e-2)})
        if ns.peers and dev.type == "cuda":
            # the same-run peer of issue 19's goal: cuDNN SDPA on contiguous bf16 K/V (its best case)
            peer = peer_rows(q[:, :, None], kd, vd, False, ref[:, :, None], ("cudnn",))["cudnn"]
            rows.append({"shape": shape, "variant": "cudnn (contiguous bf16)", **peer})
            # the bf16 default over pages in order (request by request): does the random page order cost?
            ordered = (torch.arange(batch * per, device=dev) + 1).view(batch, per).int()
            sl_o = (ordered.long()[:, :, None] * PAGE + torch.arange(PAGE, device=dev)).view(batch, -1)
            kbo, vbo = (paged_pool(x, sl_o[:, :ctx].reshape(-1), n_slots) for x in (kd, vd))
            splits = K.choose_num_kv_splits(batch, HKV, ctx, num_sms)
            mid_o = torch.empty(batch, HQ, splits, D, device=dev)
            mid_lse = torch.empty(batch, HQ, splits, device=dev)
            run = partial(K.decode_attention, q, kbo, vbo, ordered, seq_lens, PAGE, None, splits, out=out,
                          mid_o=mid_o, mid_lse=mid_lse, max_seq_len=ctx)
            rows.append({"shape": shape, "variant": f"bf16 default, pages in order ({splits} split)",
                         **timed(run, out, ref, 1e-2)})
            del kbo, vbo
        for form in forms:
            bf16_form = form in BF16_FORMS
            kb_any = kb16 if bf16_form else kb8
            v_any = (vb16 if bf16_form else vb8) if form in V_POOL_FORMS else vt8
            f_qk, f_v = (D ** -0.5 * log2e, 1.0) if bf16_form else (D ** -0.5 * log2e * K_SCALE, V_SCALE)
            k_int, v_int = INT_WIDEN.get(form, (False, False))
            f_qk, f_v = f_qk * (256.0 if k_int else 1.0), f_v * (256.0 if v_int else 1.0)
            for bn, warps, stages in configs:
                run = partial(decode_vt, q, kb_any, v_any, table, seq_lens, out, f_qk, f_v, form, bn,
                              warps, stages)
                rows.append({"shape": shape, "variant": f"{form} {bn}x{warps}w{stages}s",
                             **timed(run, out, ref, TOL_OF[form])})
        bf = next((r["us"] for r in rows if r["variant"].startswith("bf16") and "us" in r), None)
        kv8_bytes = 2 * batch * ctx * HKV * D
        for r in rows:
            if "us" in r:
                r["vs_bf16"] = r["us"] / bf if bf else None
                r["tb_per_s_fp8_bytes"] = kv8_bytes / (r["us"] * 1e-6) / 1e12
                print(f"[{time.time() - T0:5.1f}s] {shape:10} {r['variant']:30} {r['us']:7.1f} us "
                      f"/bf16 {r['vs_bf16'] or 0:.3f}  {r['tb_per_s_fp8_bytes']:.2f} TB/s(fp8)  "
                      f"err {r['rel_err']:.1e}", flush=True)
            else:
                print(f"[{time.time() - T0:5.1f}s] {shape:10} {r['variant']:30} {r['error']}", flush=True)
        result["rows"] += rows
        write_json(path, result)
        del kb16, vb16, kb8, vb8, vt8
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    if "--compile" in sys.argv and os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("run --compile without TRITON_INTERPRET=1")
    sys.exit(main())
