"""The paged decode loop over an FP8 (e4m3) KV pool with FP8 tensor-core operands.

FP8 operands as in FlashAttention-3 (Shah et al. 2024, "FlashAttention-3: fast and accurate attention
with asynchrony and low-precision"): the query rows are quantized to e4m3 with one scale per row
before Q K^T, the probabilities P are quantized to e4m3 (times P_SCALE) before P V, and the K / V
blocks go to the MMAs as they were loaded from the pool. The "f16" form (paged_loop.py) widens every
K and V value to fp16 in registers, one conversion instruction per two values, which an H200 SM
issues at 16 per clock (docs/kernels.md, "Why FP8 was not faster"); here the conversions are per
query row and per probability (16 rows x BLOCK_N values per block, against 2 x BLOCK_N x 128).

Triton (3.6) gives a dot FP8 wgmma (QGMMA) only when its output has a multiple of 64 rows, and
widens both operands to fp16 otherwise; a decode block has a 16-row query tile (the padded GQA
group), so the scores are computed transposed, with the keys as the MMA rows:
  S^T [BLOCK_N, ROWS]  = K [BLOCK_N, D] @ q^T [D, ROWS]        (K as loaded: e4m3 wgmma)
and the softmax reduces over axis 0. P V then takes one of two forms (PV_DOT):
  "e4m3" / "e4m3x2"   O^T [D, ROWS] += V^T [D, BLOCK_N] @ P^T [BLOCK_N, ROWS]   (e4m3 wgmma)
  "f16"               O [ROWS, D]   += P [ROWS, BLOCK_N] @ V [BLOCK_N, D]       (fp16 mma.sync, V
                      widened and staged through shared memory as in the f16 form)
FP8 wgmma needs both operands K-major; V^T is not (the pool's rows are the head dim), so for the
e4m3 forms Triton transposes each V block from registers into shared memory, with one-byte stores,
and loads V without pipelining. On an H200 (2026-12-02, bench/results/fp8.md) that made them 2x
slower than the f16 form (64 x 4,096: 210-250 against 101 us); the "f16" P V form ("qk8" in the
config table) ran 109 us. The f16 form stays the default; these forms are kept, tested and swept
(bench/kernels/sweep_fp8.py) for a compiler that stages V better.

Precision (split operands): e4m3 keeps 3 mantissa bits (relative rounding error up to 2^-4), which
on q alone gives score errors of ~2.5% of the score spread (2.5-9% output error at 4K keys on
random data). With SPLIT_Q (PV_DOT "e4m3x2") each of q (and P) is held as two e4m3 terms,
hi + lo / 8 (the error-correcting operand split of Markidis et al. 2018 and Ootomo & Yokota 2022,
applied to FP8): the dot reads K (V) once from shared memory for two MMAs, and the operand keeps
~7 bits (relative error <= 2^-7, about bf16's). Measured against the bf16 kernel on the dequantized
pool (H200, 64 x 4,096): single terms 3.6e-2, split 3.1e-3, q split with fp16 P V 2.8e-3, the f16
form 2.4e-3 (relative norm).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .paged_loop import block_slots, load_rows, prefetch_pages

P_SCALE = tl.constexpr(256.0)  # P in [0, 1] is quantized as P * 256 in [0, 256]: e4m3 is exact to 2^-9 there
LO_WEIGHT = tl.constexpr(0.125)  # an operand split x = hi + lo * LO_WEIGHT (split_e4m3)
# fp32 bits kept by the truncation in split_e4m3: sign, exponent and the 3 leading mantissa bits
# (0xFFF00000 as a signed int32)
E4M3_MASK = tl.constexpr(-1048576)


@triton.jit
def split_e4m3(x, SPLIT: tl.constexpr):
    """x (fp32, |x| <= 448) as two e4m3 tensors (hi, lo) with x ~ hi + lo * LO_WEIGHT.

    hi is x truncated to 3 mantissa bits (exactly an e4m3 number for |x| >= 2^-6); the remainder
    x - hi < 2^-3 |x| is exact in fp32, and lo = 8 (x - hi) <= |x| rounds to e4m3 with an error of
    at most 2^-7 |x| in the sum (a bf16-like operand from two MMAs), plus at most 2^-9 absolute
    below e4m3's normal range (steps of 2^-9 there; the callers scale their operands to a largest
    value of 256-448, so that is < 2^-16 of it). Without SPLIT, hi is x rounded to nearest (error
    <= 2^-4 |x|) and lo is hi (unused)."""
    if SPLIT:
        hi = (x.to(tl.int32, bitcast=True) & E4M3_MASK).to(tl.float32, bitcast=True)
        lo = ((x - hi) * (1.0 / LO_WEIGHT)).to(tl.float8e4nv)
        return hi.to(tl.float8e4nv), lo
    hi = x.to(tl.float8e4nv)
    return hi, hi


@triton.jit
def quantize_rows_e4m3(x, SPLIT: tl.constexpr):
    """Rows of x [ROWS, D] (any float dtype) as e4m3 with one fp32 scale per row: returns
    (hi, lo, scale [ROWS]) with x ~ (hi + lo * LO_WEIGHT) * scale[:, None]; scale = amax / 448
    (1.0 for an all-zero row)."""
    xf = x.to(tl.float32)
    amax = tl.max(tl.abs(xf), 1)
    scale = tl.where(amax > 0.0, amax / 448.0, 1.0)
    hi, lo = split_e4m3(tl.clamp(xf / scale[:, None], -448.0, 448.0), SPLIT)
    return hi, lo, scale


@triton.jit
def paged_attn_loop_fp8(q_hi, q_lo, col_scale, k_buf, v_buf, pt_row, kvh, start, end,
                        stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
                        ROWS: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_Q: tl.constexpr,
                        PV_DOT: tl.constexpr):
    """Online softmax of ROWS query rows over positions [start, end) of one paged sequence (page-table
    row `pt_row`) in KV head `kvh` of an e4m3 pool, with e4m3 MMA operands (see the module docstring).

    q_hi, q_lo : [BLOCK_D, ROWS] e4m3, the query rows transposed and split (quantize_rows_e4m3)
    col_scale  : [ROWS] fp32, each row's quantization scale times qk_scale (log2 units, k_scale in)
    SPLIT_Q    : use q_lo (else q_hi alone);  PV_DOT: "e4m3", "e4m3x2" (P split) or "f16"
    Returns (m_i, l_i [ROWS], acc) in fp32, started empty (m = -inf, l = 0, acc 0), with acc =
    P_SCALE * (P V)^T [BLOCK_D, ROWS] for the e4m3 forms and P_SCALE * P V [ROWS, BLOCK_D] for "f16":
    the caller divides by P_SCALE (and applies v_scale). Positions at and past `end` are masked;
    page ids are loaded one block ahead (prefetch_pages)."""
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_blk = tl.zeros([BLOCK_N, ROWS], dtype=tl.float32)  # row sums kept per key lane, reduced once
    if PV_DOT == "f16":
        acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_D, ROWS], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    pages = prefetch_pages(pt_row, start, end, offs_n, PAGE_SIZE)
    for n0 in range(start, end, BLOCK_N):
        slot, mask_n, kv_mask, pages = block_slots(pt_row, pages, n0, end, offs_n, mask_d, PAGE_SIZE, BLOCK_N)
        kb = load_rows(k_buf, slot, kvh, stride_kb_s, stride_kb_h, offs_d, kv_mask)
        # the V block is loaded here, before the score work, so its latency overlaps that work:
        # Triton's pipeliner stages K through shared memory but not V, whose transpose for the
        # FP8 MMA goes through registers (register prefetching of the next block instead spilled)
        vb = load_rows(v_buf, slot, kvh, stride_vb_s, stride_vb_h, offs_d, kv_mask)
        # scores S^T [BLOCK_N, ROWS]; each dot starts from zero, so the MMA's own (reduced
        # precision) FP8 accumulation spans one block only, and blocks add up in fp32
        s = tl.dot(kb, q_hi)
        if SPLIT_Q:
            s += tl.dot(kb, q_lo) * LO_WEIGHT
        s = tl.where(mask_n[:, None], s * col_scale[None, :], float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        l_blk = l_blk * alpha[None, :] + p
        if PV_DOT == "f16":  # P [ROWS, BLOCK_N] @ V on mma.sync, V staged as in paged_loop.py
            pv = tl.dot(tl.trans(p * P_SCALE).to(tl.float16), vb.to(tl.float16))
        else:
            p_hi, p_lo = split_e4m3(p * P_SCALE, PV_DOT == "e4m3x2")
            vt = tl.trans(vb)
            pv = tl.dot(vt, p_hi)
            if PV_DOT == "e4m3x2":
                pv += tl.dot(vt, p_lo) * LO_WEIGHT
        if PV_DOT == "f16":
            acc = acc * alpha[:, None] + pv
        else:
            acc = acc * alpha[None, :] + pv
        m_i = m_new
    return m_i, tl.sum(l_blk, 0), acc


@triton.jit
def paged_attn_fp8_operands(qg, qk_scale, k_buf, v_buf, pt_row, kvh, start, end,
                            stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
                            ROWS: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                            BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, KV_DOT: tl.constexpr):
    """paged_attn_loop's contract (query rows qg [ROWS, BLOCK_D] in any float dtype, qk_scale in
    log2 units with k_scale folded in; returns m_i, l_i [ROWS] and acc [ROWS, BLOCK_D] fp32, v_scale
    not applied) for an e4m3 pool with e4m3 MMA operands, by decode_fp8's kv_dot:
      "fp8"    q and P as single e4m3 terms (FlashAttention-3's FP8 operands)
      "fp8x2"  q and P as two e4m3 terms each (split_e4m3)
      "qk8"    q as two e4m3 terms against K; P V in fp16 (V widened, as in the f16 form)"""
    q_hi, q_lo, q_row_scale = quantize_rows_e4m3(qg, KV_DOT != "fp8")
    m_i, l_i, acc = paged_attn_loop_fp8(
        tl.trans(q_hi), tl.trans(q_lo), q_row_scale * qk_scale, k_buf, v_buf, pt_row, kvh, start, end,
        stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h, ROWS, PAGE_SIZE, HEAD_DIM, BLOCK_D, BLOCK_N,
        KV_DOT != "fp8", "f16" if KV_DOT == "qk8" else "e4m3x2" if KV_DOT == "fp8x2" else "e4m3")
    if KV_DOT != "qk8":  # the e4m3 P V forms accumulate O^T
        acc = tl.trans(acc)
    return m_i, l_i, acc * (1.0 / P_SCALE)
