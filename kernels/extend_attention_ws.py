"""Extend (prefill) attention for Hopper (sm_90) as a warp-specialized Gluon kernel.

Same contract as kernels.extend_attention (bf16 / fp16 pool of the same dtype, head dim 128): the
new tokens of B requests attend to their cached prefix, read from the paged pool, and causally to
their own new tokens. The structure is FlashAttention-3's (Shah et al., 2024, "FlashAttention-3:
Fast and Accurate Attention with Asynchrony and Low-precision", sections 3.1-3.2), written in Gluon
(triton.experimental.gluon, Triton 3.6) from the paper's description:

- one CTA per (128 query rows, query head, request), longest query blocks first; three partitions:
  two consumer warpgroups of 64 query rows each (the default partition and worker 0) and a
  producer warp (worker 1);
- the producer copies Q once, then K and V blocks of BLOCK_N keys by TMA into a ring of STAGES
  shared-memory stages: the prefix page by page (a [page_size, D] box per page, from the pool viewed
  as [slots, Hkv * D]), the new tokens as [BLOCK_N, D] boxes of k_new / v_new viewed as
  [T, Hkv * D]. Barriers: k_ready / v_ready (TMA byte counts), kv_empty (both consumers arrive);
- each consumer computes S = Q K^T and O += P V with wgmma (P as a register operand, O in fp32
  registers), online softmax in exp2 with the scale folded into log2(e) (FlashAttention-2, Dao,
  2023), and issues block j's Q K^T before block j-1's P V completes, so one block's softmax runs
  while the tensor cores hold the other's product (the paper's intra-warpgroup pipelining).

A prefix block past the prefix's last page re-reads that page (finite data, masked), so no stage
holds uninitialised shared memory; new-token blocks that run past their request read the next
request's rows (or TMA's zero fill past T), which the causal mask removes. Measured on an H200
against the Triton kernel and cuDNN: docs/benchmarks.md ("Extend attention as a warp-specialized
Gluon kernel"). Gluon kernels need a CUDA device of compute capability 9.x; `supported` says when
extend_attention may route here.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634
BLOCK_M = 128  # query rows per CTA: two consumer warpgroups of 64
HEAD_DIM = 128
# Where extend_attention routes here (H200, docs/benchmarks.md): a launch costs ~200 us of host time
# (five TMA descriptors; the Triton kernel ~100), so passes of fewer than MIN_TOKENS new tokens, whose
# layers take less device time than that, stay on the Triton kernel; a request with few new tokens
# would fill a 128-row CTA per query head with a few rows, so every request needs MIN_EXTEND.
MIN_TOKENS = 1024
MIN_MAX_EXTEND = 256
MIN_EXTEND = 64


@gluon.jit
def load_pages(kp_desc, vp_desc, k_dst, v_dst, k_bar, v_bar, page_row, first_page, last_page, kv_col):
    """One K block and one V block of a paged prefix by TMA: page ids page_row[first_page ...] (one
    [page_size, D] box each, clamped to last_page: a block past the prefix re-reads its last page,
    finite data the caller masks) into k_dst / v_dst [BLOCK_N, D]; k_bar / v_bar count the bytes."""
    PAGE: gl.constexpr = kp_desc.block_type.shape[0]
    PAGES: gl.constexpr = k_dst.shape[0] // PAGE
    mbarrier.expect(k_bar, PAGES * kp_desc.block_type.nbytes)
    mbarrier.expect(v_bar, PAGES * vp_desc.block_type.nbytes)
    for i in gl.static_range(PAGES):
        page = gl.load(page_row + gl.minimum(first_page + i, last_page))
        tma.async_copy_global_to_shared(kp_desc, [page * PAGE, kv_col], k_bar, k_dst.slice(i * PAGE, PAGE))
        tma.async_copy_global_to_shared(vp_desc, [page * PAGE, kv_col], v_bar, v_dst.slice(i * PAGE, PAGE))


@gluon.jit
def _producer(q_desc, kn_desc, vn_desc, kp_desc, vp_desc, q_smem, k_smem, v_smem,
              q_bar, k_ready, v_ready, kv_empty, page_row, prefix_len, n_pre, n_new,
              q_row0, kn_row0, q_col, kv_col):
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    PAGE: gl.constexpr = kp_desc.block_type.shape[0]
    PAGES_PER_BLOCK: gl.constexpr = BLOCK_N // PAGE
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row0, q_col], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row0 + 64, q_col], q_bar, q_smem.index(1))
    last_page = (prefix_len - 1) // PAGE
    for j in range(n_pre):
        s = j % STAGES
        # a stage is free once both consumers arrived on it; the first round passes at once (the
        # parity before a fresh barrier's first phase counts as complete)
        mbarrier.wait(kv_empty.index(s), ((j // STAGES) & 1) ^ 1)
        load_pages(kp_desc, vp_desc, k_smem.index(s), v_smem.index(s), k_ready.index(s), v_ready.index(s),
                   page_row, j * PAGES_PER_BLOCK, last_page, kv_col)
    for jj in range(n_new):
        j = n_pre + jj
        s = j % STAGES
        mbarrier.wait(kv_empty.index(s), ((j // STAGES) & 1) ^ 1)
        row = kn_row0 + jj * BLOCK_N
        mbarrier.expect(k_ready.index(s), kn_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(kn_desc, [row, kv_col], k_ready.index(s), k_smem.index(s))
        mbarrier.expect(v_ready.index(s), vn_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(vn_desc, [row, kv_col], v_ready.index(s), v_smem.index(s))


@gluon.jit
def _mask_block(s, j, n_pre, prefix_len, rows, my_pos0, BLOCK_N: gl.constexpr, col_layout: gl.constexpr):
    """Block j's scores with the keys a row may not see at -inf: past the prefix's end in its last
    prefix block, after the row's own position in the new-token blocks on or past the diagonal."""
    if j < n_pre:
        if j * BLOCK_N + BLOCK_N > prefix_len:
            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_layout)
            s = gl.where((cols < prefix_len)[None, :], s, -float("inf"))
    else:
        jj = j - n_pre
        if jj * BLOCK_N + BLOCK_N > my_pos0:
            cols = jj * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_layout)
            s = gl.where(cols[None, :] <= rows[:, None], s, -float("inf"))
    return s


@gluon.jit
def idle_ring(k_ready, kv_empty, n_blocks):
    """A consumer warpgroup with no rows to compute keeps the ring turning: it arrives on each stage
    once that stage's block has landed (an early arrival would complete the stage's phase for the
    other warpgroup)."""
    STAGES: gl.constexpr = k_ready.shape[0]
    for j in range(n_blocks):
        mbarrier.wait(k_ready.index(j % STAGES), (j // STAGES) & 1)
        mbarrier.arrive(kv_empty.index(j % STAGES), count=1)


@gluon.jit
def attend_ring(q, k_smem, v_smem, k_ready, v_ready, kv_empty, n_pre, prefix_len, n_blocks, my_pos0,
                qk_scale):
    """One consumer warpgroup's pass over the ring's n_blocks >= 1 K / V blocks (the first n_pre of
    them a prefix of prefix_len keys, the rest new tokens seen causally by rows at new-token
    positions my_pos0 ..): q is the [64, D] shared Q tile. Each block j issues its Q K^T, then block
    j-1's P V (P from registers); block j's softmax runs while that product is in flight, then O is
    rescaled. Returns O [64, D] fp32 (unnormalised; NVMMA layout of the P V product), the rows'
    running max m (log2 units, scale applied) and sum l (layout of S's rows)."""
    ROWS: gl.constexpr = q.shape[0]
    HEAD: gl.constexpr = k_smem.shape[2]
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    rows = my_pos0 + gl.arange(0, ROWS, layout=row_s)
    acc = gl.zeros([ROWS, HEAD], gl.float32, layout=o_layout)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    # block 0: scores and the softmax state
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok, ))
    s = _mask_block(s, 0, n_pre, prefix_len, rows, my_pos0, BLOCK_N, col_s)
    m_i = gl.max(s, 1) * qk_scale
    p = gl.exp2(s * qk_scale - m_i[:, None])
    l_i = gl.sum(p, 1)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    for j in range(1, n_blocks):
        p_prev = p_op
        st = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_ready.index(st), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        acc_tok = warpgroup_mma(p_prev, v_smem.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok, ))
        s = _mask_block(s, j, n_pre, prefix_len, rows, my_pos0, BLOCK_N, col_s)
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        # block j-1's P is the register operand of the product in flight: kept alive to its wait
        acc, p_prev = warpgroup_mma_wait(0, deps=(acc_tok, p_prev))
        mbarrier.arrive(kv_empty.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    last = (n_blocks - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((n_blocks - 1) // STAGES) & 1)
    acc_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc_tok, p_op))
    mbarrier.arrive(kv_empty.index(last), count=1)
    return acc, m_i, l_i


@gluon.jit
def _consumer(which: gl.constexpr, o_ptr, stride_o_t, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready,
              kv_empty, out_row0, pos0, ext_len, o_col, prefix_len, n_pre, n_blocks, qk_scale):
    ROWS: gl.constexpr = 64
    HEAD: gl.constexpr = q_smem.shape[2]
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD, 16])
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    dtype: gl.constexpr = q_smem.dtype

    my_pos0 = pos0 + which * ROWS  # new-token position of this warpgroup's first row
    if my_pos0 >= ext_len:  # no row of this warpgroup is a token of the request (a short last block)
        idle_ring(k_ready, kv_empty, n_blocks)
        return
    mbarrier.wait(q_bar, 0)
    acc, m_i, l_i = attend_ring(q_smem.index(which), k_smem, v_smem, k_ready, v_ready, kv_empty, n_pre,
                                prefix_len, n_blocks, my_pos0, qk_scale)

    acc = acc / gl.convert_layout(l_i, row_o)[:, None]
    local = which * ROWS + gl.arange(0, ROWS, layout=row_o)
    dcol = gl.arange(0, HEAD, layout=col_o)
    ptrs = o_ptr + (out_row0 + local)[:, None].to(gl.int64) * stride_o_t + o_col + dcol[None, :]
    gl.store(ptrs, acc.to(dtype), mask=(pos0 + local < ext_len)[:, None])


# warp_specialize passes run-time values only: each partition's constexprs come from the shapes of
# its shared-memory arguments
@gluon.jit
def _consumer0(o_ptr, stride_o_t, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty,
               out_row0, pos0, ext_len, o_col, prefix_len, n_pre, n_blocks, qk_scale):
    _consumer(0, o_ptr, stride_o_t, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty,
              out_row0, pos0, ext_len, o_col, prefix_len, n_pre, n_blocks, qk_scale)


@gluon.jit
def _consumer1(o_ptr, stride_o_t, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty,
               out_row0, pos0, ext_len, o_col, prefix_len, n_pre, n_blocks, qk_scale):
    _consumer(1, o_ptr, stride_o_t, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty,
              out_row0, pos0, ext_len, o_col, prefix_len, n_pre, n_blocks, qk_scale)


# the page table's width and the grid's query-block count vary from pass to pass, and the metadata
# vectors are slices of one upload buffer (their addresses 4-byte aligned, or 16): none of them is
# specialised, so the compile of the backend's warm-up serves every pass
@gluon.jit(do_not_specialize=["stride_pt_b", "num_m_blocks"],
           do_not_specialize_on_alignment=["page_table", "prefix_lens", "extend_lens", "extend_start_loc"])
def _extend_ws_kernel(q_desc, kn_desc, vn_desc, kp_desc, vp_desc, o_ptr, stride_o_t, stride_o_h,
                      page_table, stride_pt_b, prefix_lens, extend_lens, extend_start_loc, qk_scale,
                      num_m_blocks, GROUP: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    HEAD: gl.constexpr = q_desc.block_type.shape[1]
    m_block = num_m_blocks - 1 - gl.program_id(0)  # longest query blocks first
    head = gl.program_id(1)
    req = gl.program_id(2)
    ext_len = gl.load(extend_lens + req)
    pos0 = m_block * 128
    if pos0 < ext_len:
        start = gl.load(extend_start_loc + req)
        prefix_len = gl.load(prefix_lens + req)
        n_pre = gl.cdiv(prefix_len, BLOCK_N)
        n_new = gl.cdiv(gl.minimum(pos0 + 128, ext_len), BLOCK_N)
        kv_col = (head // GROUP) * HEAD
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [2, 64, HEAD], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD], kn_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD], vn_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=2)
        consumer_args = (o_ptr, stride_o_t, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty,
                         start + pos0, pos0, ext_len, head * stride_o_h, prefix_len, n_pre, n_pre + n_new,
                         qk_scale)
        producer_args = (q_desc, kn_desc, vn_desc, kp_desc, vp_desc, q_smem, k_smem, v_smem, q_bar,
                         k_ready, v_ready, kv_empty, page_table + req.to(gl.int64) * stride_pt_b,
                         prefix_len, n_pre, n_new, start + pos0, start, head * HEAD, kv_col)
        gl.warp_specialize([(_consumer0, consumer_args), (_consumer1, consumer_args),
                            (_producer, producer_args)], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def _gl_dtype(dtype: torch.dtype):
    """Gluon's type for a pool / query dtype (bf16, fp16 or float8_e4m3fn). Raises KeyError otherwise."""
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv}[dtype]


@functools.lru_cache(maxsize=32)
def _smem_layout(rows: int, cols: int, dtype: torch.dtype):
    """The NVMMA shared layout of a [rows, cols] TMA block (cached: ~6 us to build per call)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], _gl_dtype(dtype))


@functools.lru_cache(maxsize=16)
def _is_hopper(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] == 9


def _as_rows(t: torch.Tensor) -> torch.Tensor | None:
    """[N, H, D] with head stride D and unit last stride as a 2-D [N, H * D] view, else None."""
    n, h, d = t.shape
    if t.stride(2) != 1 or t.stride(1) != d or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
        return None
    return t.as_strided((n, h * d), (t.stride(0), 1))


def supported(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_buffer: torch.Tensor,
              v_buffer: torch.Tensor, page_size: int, out: torch.Tensor | None) -> bool:
    """Whether these tensors can take the Gluon kernel: CUDA compute capability 9.x, bf16 / fp16
    everywhere (no FP8 pool), head dim 128, page_size dividing 128 (at least 8 rows: TMA's
    swizzle atom), every tensor's [N, H, D] viewable as [N, H * D] with 16-byte aligned rows."""
    if not q.is_cuda:
        return False
    if not _is_hopper(q.device.index if q.device.index is not None else torch.cuda.current_device()):
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or q.shape[-1] != HEAD_DIM:
        return False
    if any(t.dtype != q.dtype for t in (k_new, v_new, k_buffer, v_buffer)):
        return False
    if page_size < 8 or 128 % page_size:
        return False
    tensors = (q, k_new, v_new, k_buffer, v_buffer) + ((out,) if out is not None else ())
    return all(_as_rows(t) is not None for t in tensors)


def extend_attention_ws(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_buffer: torch.Tensor,
                        v_buffer: torch.Tensor, page_table: torch.Tensor, prefix_lens: torch.Tensor,
                        extend_lens: torch.Tensor, extend_start_loc: torch.Tensor, page_size: int,
                        scale: float, max_extend_len: int, out: torch.Tensor, block_n: int = 128,
                        stages: int = 3) -> torch.Tensor:
    """The Gluon kernel over inputs `supported` accepted (kernels.extend_attention checks the rest
    of the contract first). Tensors as in kernels.extend_attention; prefix_lens / extend_lens /
    extend_start_loc int32; page_table int32 with contiguous rows. block_n x stages: 128 x 3 (H200,
    8,192 causal: 816 us against 894 at 128 x 2 and 942-945 at 64 x 3-4); shared memory
    2 x 16 KiB of Q + 2 x stages x block_n x 256 B of K / V. Returns out. Raises ValueError when
    block_n is not a multiple of page_size."""
    t, hq, d = q.shape
    if block_n % page_size or block_n < page_size:
        raise ValueError(f"block_n {block_n} must be a multiple of page_size {page_size}")
    q_layout = _smem_layout(64, d, q.dtype)
    kv_layout = _smem_layout(block_n, d, q.dtype)
    page_layout = _smem_layout(page_size, d, q.dtype)
    q_desc = TensorDescriptor.from_tensor(_as_rows(q), [64, d], q_layout)
    kn_desc = TensorDescriptor.from_tensor(_as_rows(k_new), [block_n, d], kv_layout)
    vn_desc = TensorDescriptor.from_tensor(_as_rows(v_new), [block_n, d], kv_layout)
    kp_desc = TensorDescriptor.from_tensor(_as_rows(k_buffer), [page_size, d], page_layout)
    vp_desc = TensorDescriptor.from_tensor(_as_rows(v_buffer), [page_size, d], page_layout)
    num_m = triton.cdiv(max_extend_len, BLOCK_M)
    grid = (num_m, hq, extend_lens.shape[0])
    _extend_ws_kernel[grid](q_desc, kn_desc, vn_desc, kp_desc, vp_desc, out, out.stride(0), out.stride(1),
                            page_table, page_table.stride(0), prefix_lens, extend_lens, extend_start_loc,
                            scale * LOG2E, num_m, GROUP=hq // k_new.shape[1], BLOCK_N=block_n, STAGES=stages,
                            PRODUCER_REGS=40, CONSUMER_REGS=232, num_warps=4)
    return out
