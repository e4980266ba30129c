"""The paged online-softmax loop shared by the extend, decode and cascade attention kernels.

Each of those kernels streams key/value blocks of one KV head from the paged pool (slot =
page_table[b, pos // page_size] * page_size + pos % page_size; PagedAttention, Kwon et al. 2023)
against a block of query rows, keeping the FlashAttention-2 running max, sum and accumulator (Dao,
2023) in the exp2 domain with the softmax scale folded into log2(e). What differs between them is
which rows they gather and which positions they cover; the loop itself is `paged_attn_loop`, as the
Triton fused-attention tutorial factors its inner loop into `_attn_fwd_inner`. Triton inlines the
helper into each kernel before software pipelining, so the compiled loops are those of the kernels
that used to carry a copy each (bench/kernels/compile_sm90.py checks the pipelining).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def prefetch_pages(pt_row, n0, end, offs_n, PAGE_SIZE: tl.constexpr):
    """Page ids [BLOCK_N] of positions n0 + offs_n in one page-table row (0 at and past `end`).

    The paged loop calls this one block AHEAD: a step uses the ids loaded by the step before and
    loads the next block's. Loaded in the same step, the ids would make every K/V address depend on
    a load of that step, and Triton's software pipeliner (3.6, sm_90) then issues the K/V copies
    only at the end of the step before and waits on them at once: no copy overlaps compute. With
    the ids carried over, the K/V copies are multi-buffered (num_stages - 1 blocks in flight), as
    for contiguous K/V; tests/kernels/test_compile_sm90.py checks this on the compiled kernels."""
    pos = n0 + offs_n
    return tl.load(pt_row + pos // PAGE_SIZE, mask=pos < end, other=0)


@triton.jit
def block_slots(pt_row, pages, n0, end, offs_n, mask_d, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pool slots [BLOCK_N] (int64) of positions n0 + offs_n from this block's page ids `pages`, the
    position mask [BLOCK_N] (pos < end), the K/V row mask [BLOCK_N, BLOCK_D], and the next block's
    page ids (prefetch_pages: loaded one step ahead)."""
    pos = n0 + offs_n
    mask_n = pos < end
    slot = pages.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
    pages = prefetch_pages(pt_row, n0 + BLOCK_N, end, offs_n, PAGE_SIZE)
    return slot, mask_n, mask_n[:, None] & mask_d[None, :], pages


@triton.jit
def load_rows(buf, slot, kvh, stride_s, stride_h, offs_d, kv_mask):
    """The rows [BLOCK_N, BLOCK_D] of KV head `kvh` at pool slots `slot` (0 where masked). The head
    offset is int64: in a head-major pool (docs/kernels.md, "KV layout") stride_h is the whole
    buffer's slot count times D, and kvh * stride_h passes 2^31 elements on large pools."""
    head = buf + kvh.to(tl.int64) * stride_h
    return tl.load(head + slot[:, None] * stride_s + offs_d[None, :], mask=kv_mask, other=0.0)


@triton.jit
def load_block_rows(buf, slot, kvh, stride_s, stride_h, offs_d, kv_mask, mask_n, MASKED: tl.constexpr):
    """load_rows for paged_attn_block's MASKED: 1 through the mask kv_mask; 0 and 2 without one
    (offs_d covers the head dim), and for 2 the rows past the end (mask_n False) zeroed after."""
    if MASKED == 1:
        return load_rows(buf, slot, kvh, stride_s, stride_h, offs_d, kv_mask)
    head = buf + kvh.to(tl.int64) * stride_h
    rows = tl.load(head + slot[:, None] * stride_s + offs_d[None, :])
    if MASKED == 2:
        rows = tl.where(mask_n[:, None], rows, 0.0)
    return rows


@triton.jit
def online_softmax_step(s, m_i, l_i, acc):
    """One FlashAttention-2 update for a block of scores `s` [M, N] (log2 units, masked = -inf).

    Returns (p, m_new, l_new, acc rescaled): the caller adds p @ V to the accumulator."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, m_new, l_new, acc * alpha[:, None]


@triton.jit
def online_softmax_step_scaled(s, qk_scale, m_i, l_i, acc):
    """online_softmax_step for raw scores `s` (q.k, masked = -inf) that still need the factor
    qk_scale > 0 (softmax scale x log2(e)): the max is taken on the raw scores and scaled once per
    row, and each score enters exp2 as one fused multiply-add s * qk_scale - m (as in the Triton
    fused-attention tutorial), rather than a multiply and a subtract."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, m_new, l_new, acc * alpha[:, None]


@triton.jit
def paged_attn_block(qb, k_buf, v_buf, pt_row, kvh, pages, n0, end, qk_scale, m_i, l_i, acc, offs_n, offs_d,
                     mask_d, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
                     PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                     V_WIDEN: tl.constexpr, MASKED: tl.constexpr):
    """One step of paged_attn_loop: the block of positions n0 + [0, BLOCK_N) (page ids `pages`,
    loaded one step ahead) folded into the softmax state (m_i, l_i, acc). Returns (m_i, l_i, acc, the
    next block's page ids). MASKED:
      0  every position is < end and every column < HEAD_DIM (BLOCK_D == HEAD_DIM): K/V loaded and
         the scores kept without a mask;
      1  masked loads (0 past end and past HEAD_DIM) and the scores selected (-inf past end);
      2  (BLOCK_D == HEAD_DIM) K/V loaded without a mask, then zeroed past end by a select on the
         values, and the scores selected. Positions past end read slots that exist (the rest of the
         request's last page, or the sink page 0, whose page id prefetch_pages gives them) and may
         hold anything, NaN included; the selects keep it out."""
    slot, mask_n, kv_mask, pages = block_slots(pt_row, pages, n0, end, offs_n, mask_d, PAGE_SIZE, BLOCK_N)
    # scores of every row against BLOCK_N keys: one K/V read serves all rows of the block
    kb = load_block_rows(k_buf, slot, kvh, stride_kb_s, stride_kb_h, offs_d, kv_mask, mask_n, MASKED)
    s = tl.dot(qb, tl.trans(kb.to(qb.dtype)), input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        s = tl.where(mask_n[None, :], s, float("-inf"))
    p, m_i, l_i, acc = online_softmax_step(s, m_i, l_i, acc)
    vb = load_block_rows(v_buf, slot, kvh, stride_vb_s, stride_vb_h, offs_d, kv_mask, mask_n, MASKED)
    if V_WIDEN:  # (masked rows are zero already: the select only keeps the widening apart)
        vb = tl.where(kv_mask, vb.to(qb.dtype), 0.0)
    acc += tl.dot(p.to(qb.dtype), vb.to(qb.dtype), input_precision=DOT_PRECISION)
    return m_i, l_i, acc, pages


@triton.jit
def paged_attn_loop(qb, k_buf, v_buf, pt_row, kvh, start, end, qk_scale,
                    stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
                    ROWS: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    V_WIDEN: tl.constexpr = 0, PEEL_TAIL: tl.constexpr = 0):
    """Online softmax of the query rows `qb` [ROWS, BLOCK_D] over positions [start, end) of one paged
    sequence (page-table row `pt_row`) in KV head `kvh`, in blocks of BLOCK_N positions.

    Returns the softmax state (m_i, l_i [ROWS], acc [ROWS, BLOCK_D], fp32; log2 units: qk_scale
    includes log2(e)), started empty (m = -inf, l = 0, acc = 0, which an empty range returns), for
    the caller to normalise or to continue. Positions at and past `end` are masked. Page ids are
    loaded one block ahead (prefetch_pages). An FP8 pool's K/V blocks are converted to qb's dtype
    in registers; its per-layer scales are the caller's (k_scale folded into qk_scale, v_scale
    multiplied into the returned acc).

    PEEL_TAIL (1 or 2; needs BLOCK_D == HEAD_DIM): the whole blocks of [start, end) run without masks
    (no predicated copies, no score select), and the last, partial block, if any, after the loop:
    with masked loads (1) or with K/V loaded whole and zeroed past `end` by selects (2: the widened
    path's code, as bench/lab/decode_vt.py's control kernel does); 0 / False: every block masked
    (paged_attn_block's MASKED).

    V_WIDEN (FP8 pools; 0 = off): the V block is widened to qb's dtype before the P V dot, not inside
    it. The dot contracts over positions, and V's rows are positions: Triton 3.6 otherwise reads the e4m3
    block from shared memory into the MMA's operand layout one byte per load (4 consecutive
    positions of one column per register: 128 `ld.shared.b8` per thread and 128-key block at 4
    warps) and widens after; with the select below the block is read in vectors, widened, stored
    back as fp16 and read with `ldmatrix.trans` (bench/kernels/compile_sm90.py checks both).
    V_WIDEN == 2 (kv_dot "f16v8"; slower than "f16v" on an H200, 2026-12-03): the same, with the
    head-dim offsets hinted contiguous in 8s only (K's copies too: the hint marks the one arange), so
    each thread loads 8 bytes of a row instead of 16 and stores 16 bytes of fp16: one store phase
    then writes 8 consecutive 16-byte chunks of a row. With 16-byte loads a thread stores two chunks
    32 bytes apart, and chunks 8 apart share banks in a 256-byte fp16 row, which the swizzle does not
    separate (2-way conflicts; compiled sm_90 code, docs/benchmarks.md "One-pass fused SiLU")."""
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    if V_WIDEN == 2:  # 8-byte pieces (above); the hint marks the arange itself, so K's copies get it too
        offs_d = tl.max_contiguous(offs_d, 8)
    mask_d = offs_d < HEAD_DIM
    pages = prefetch_pages(pt_row, start, end, offs_n, PAGE_SIZE)
    if PEEL_TAIL:
        tl.static_assert(BLOCK_D == HEAD_DIM, "PEEL_TAIL loads whole rows: BLOCK_D must equal HEAD_DIM")
        full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
        for n0 in range(start, full_end, BLOCK_N):
            m_i, l_i, acc, pages = paged_attn_block(
                qb, k_buf, v_buf, pt_row, kvh, pages, n0, end, qk_scale, m_i, l_i, acc, offs_n, offs_d,
                mask_d, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h, PAGE_SIZE, BLOCK_N, DOT_PRECISION,
                V_WIDEN, 0)
        if full_end < end:
            m_i, l_i, acc, pages = paged_attn_block(
                qb, k_buf, v_buf, pt_row, kvh, pages, full_end, end, qk_scale, m_i, l_i, acc, offs_n, offs_d,
                mask_d, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h, PAGE_SIZE, BLOCK_N, DOT_PRECISION,
                V_WIDEN, 2 if PEEL_TAIL == 2 else 1)
    else:
        for n0 in range(start, end, BLOCK_N):
            m_i, l_i, acc, pages = paged_attn_block(
                qb, k_buf, v_buf, pt_row, kvh, pages, n0, end, qk_scale, m_i, l_i, acc, offs_n, offs_d,
                mask_d, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h, PAGE_SIZE, BLOCK_N, DOT_PRECISION,
                V_WIDEN, 1)
    return m_i, l_i, acc


@triton.jit
def paged_attn_ws_block(q3, k_head, v_head, pages, pos, end, qk_scale, m_i, l_i, acc, offs_d, mask_d,
                        stride_kb_s, stride_vb_s, PAGE_SIZE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        MASKED: tl.constexpr):
    """One step of paged_attn_loop_ws: positions `pos` [W, SUB] (page ids `pages`, loaded one step
    ahead) folded into the W per-warp states m_i, l_i [W, ROWS], acc [W, ROWS, BLOCK_D]. MASKED 0:
    every position < end and BLOCK_D == HEAD_DIM, no masks; 1: masked loads (0 past end and past
    HEAD_DIM), scores -inf past end; a sub-block with no position yet keeps m = -inf, l = 0, acc = 0."""
    slot = pages.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
    mask_n = pos < end
    k_ptrs = k_head + slot[:, :, None] * stride_kb_s + offs_d[None, None, :]
    v_ptrs = v_head + slot[:, :, None] * stride_vb_s + offs_d[None, None, :]
    if MASKED:
        kv_mask = mask_n[:, :, None] & mask_d[None, None, :]
        kb = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        vb = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    else:
        kb = tl.load(k_ptrs)
        vb = tl.load(v_ptrs)
    # [W, ROWS, D] x [W, D, SUB]: a batched dot, the batch axis on the warps
    s = tl.dot(q3, tl.trans(kb.to(q3.dtype), (0, 2, 1)), input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        s = tl.where(mask_n[:, None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 2))
    m_ref = m_new
    if MASKED:  # exp2 against 0 where a sub-block has seen no position yet (not -inf - -inf); m stays -inf
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, :, None])
    l_i = l_i * alpha + tl.sum(p, 2)
    acc = acc * alpha[:, :, None] + tl.dot(p.to(q3.dtype), vb.to(q3.dtype), input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def paged_attn_loop_ws(qb, k_buf, v_buf, pt_row, kvh, start, end, qk_scale,
                       stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
                       ROWS: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                       W: tl.constexpr):
    """paged_attn_loop with the keys of each block split across the program's warps: the block of
    BLOCK_N positions is W sub-blocks of BLOCK_N / W (>= 16) consecutive positions, and sub-block w
    is warp w's (launch with num_warps = W). The two products are batched dots over W, which Triton
    3.6 lays out with the batch axis on the warps (mma.sync, warpsPerCTA [W, 1, 1]), so each warp
    keeps its own running max, sum and accumulator [ROWS, BLOCK_D] and P stays in its registers (in
    the row-split loop the keys of P are spread across the warps and the P V dot gathers them
    through shared memory every block). The W states are merged once, after the loop. This is the
    warp tiling of cuDNN's decode kernel on sm_90 (16 rows x 128 keys x 128, warps 1 x 4 x 1, seen in
    Nsight Compute, docs/benchmarks.md) and of Flash-Decoding's split-K idea (Dao et al. 2023)
    inside one program.

    Same contract as paged_attn_loop: returns (m_i, l_i [ROWS], acc [ROWS, BLOCK_D]) over [start,
    end), fp32, log2 units, the empty state for an empty range. K/V of an FP8 pool are widened to
    qb's dtype in registers (kv_dot "f16"). The whole blocks run without masks when BLOCK_D ==
    HEAD_DIM, the last partial block through masked loads."""
    SUB: tl.constexpr = BLOCK_N // W
    tl.static_assert(SUB * W == BLOCK_N and SUB >= 16, "BLOCK_N must be W sub-blocks of >= 16 positions")
    q3 = tl.broadcast_to(qb[None, :, :], (W, ROWS, BLOCK_D))
    m_i = tl.full([W, ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([W, ROWS], dtype=tl.float32)
    acc = tl.zeros([W, ROWS, BLOCK_D], dtype=tl.float32)
    offs_n = tl.arange(0, W)[:, None] * SUB + tl.arange(0, SUB)[None, :]  # [W, SUB]
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    k_head = k_buf + kvh.to(tl.int64) * stride_kb_h
    v_head = v_buf + kvh.to(tl.int64) * stride_vb_h
    pages = prefetch_pages(pt_row, start, end, offs_n, PAGE_SIZE)
    # whole blocks without masks, then the partial last one, if any; with a padded head dim every
    # block through masked loads
    LOOP_MASKED: tl.constexpr = BLOCK_D != HEAD_DIM
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
    if LOOP_MASKED:
        full_end = end
    for n0 in range(start, full_end, BLOCK_N):
        cur = pages
        pages = prefetch_pages(pt_row, n0 + BLOCK_N, end, offs_n, PAGE_SIZE)
        m_i, l_i, acc = paged_attn_ws_block(q3, k_head, v_head, cur, n0 + offs_n, end, qk_scale, m_i, l_i,
                                            acc, offs_d, mask_d, stride_kb_s, stride_vb_s, PAGE_SIZE,
                                            DOT_PRECISION, LOOP_MASKED)
    if full_end < end:
        m_i, l_i, acc = paged_attn_ws_block(q3, k_head, v_head, pages, full_end + offs_n, end, qk_scale, m_i,
                                            l_i, acc, offs_d, mask_d, stride_kb_s, stride_vb_s, PAGE_SIZE,
                                            DOT_PRECISION, 1)
    # the W states merged: weights 2^(m_w - m); sub-blocks that saw nothing (m_w = -inf) weigh 0
    m_all = tl.max(m_i, 0)
    m_ref = tl.where(m_all == float("-inf"), 0.0, m_all)
    wgt = tl.exp2(m_i - m_ref[None, :])
    return m_all, tl.sum(l_i * wgt, 0), tl.sum(acc * wgt[:, :, None], 0)
