"""Cascade decode attention's prefix stage (stage A) for Hopper as a warp-specialized Gluon kernel.

Same work and outputs as kernels.cascade_attention's `_cascade_prefix_kernel` (bf16 / fp16 pool,
head dim 128): for every group of requests that share a cached prefix, the rows (member, query head
of one KV head) attend to one split of the prefix, read once per program through the first
member's page-table row; each row's partial output (normalised, fp32) and its log2-sum-exp go to
the mid workspaces for the suffix stage's merge (Hydragen, Juravsky et al. 2024: the shared prefix
as one matrix product over all members' queries). The structure is kernels/extend_attention_ws.py's
(FlashAttention-3, Shah et al. 2024): a producer warp copies the prefix's K / V pages by TMA into a
ring of shared-memory stages, two consumer warpgroups of 64 rows run wgmma with P in registers and
overlap one block's softmax with the other's product. Here the queries are gathered rows (member
b, head h), gathered by each consumer into its shared Q tile, and no causal mask applies: only keys past the
split's end are masked. Grid (KV head, split, row block of 128 rows), the row blocks numbered group
after group as in the Triton kernel, so a CUDA graph padded with empty groups costs only the real
groups' blocks. Opt-in (RADIXRT_CASCADE_WS=1): on an H200, at the launcher's split counts, it ran
stage A in 0.86-1.17x the Triton kernel's time (0.77-1.40x over all split counts tried;
docs/benchmarks.md, "Cascade's prefix stage as a Gluon kernel"): with many splits a program covers
only 1-2 blocks of 128 keys, so the ring's fill and the fp32 partials' stores weigh as much as the
steady state FlashAttention-3's structure speeds up.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .extend_attention_ws import _as_rows, _is_hopper, _smem_layout, attend_ring, idle_ring, load_pages

BLOCK_M = 128  # rows per CTA: two consumer warpgroups of 64
BLOCK_N = 128  # prefix tokens per block (a split's length is a multiple of it)
STAGES = 3


@gluon.jit
def _producer(kp_desc, vp_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, page_row, start, prefix_len,
              n_blocks, kv_col):
    STAGES_: gl.constexpr = k_smem.shape[0]
    BLOCK: gl.constexpr = k_smem.shape[1]
    PAGE: gl.constexpr = kp_desc.block_type.shape[0]
    first_page = start // PAGE
    last_page = (prefix_len - 1) // PAGE
    for j in range(n_blocks):
        s = j % STAGES_
        mbarrier.wait(kv_empty.index(s), ((j // STAGES_) & 1) ^ 1)
        load_pages(kp_desc, vp_desc, k_smem.index(s), v_smem.index(s), k_ready.index(s), v_ready.index(s),
                   page_row, first_page + j * (BLOCK // PAGE), last_page, kv_col)


@gluon.jit
def _consumer(which: gl.constexpr, q_ptr, stride_q_b, stride_q_h, members, num_rows, row0, kvh, group,
              mid_o, stride_mo_b, stride_mo_h, mid_lse, stride_ml_b, stride_ml_h, q_smem,
              k_smem, v_smem, k_ready, v_ready, kv_empty, start, end, n_blocks, qk_scale):
    ROWS: gl.constexpr = 64
    HEAD: gl.constexpr = k_smem.shape[2]
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD, 16])
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    my_row0 = row0 + which * ROWS
    if my_row0 >= num_rows:  # no row of this warpgroup belongs to the group
        idle_ring(k_ready, kv_empty, n_blocks)
        return
    if n_blocks == 0:  # this split starts past the prefix: an empty partial for the merge
        _store_rows(gl.zeros([ROWS, HEAD], gl.float32, layout=o_layout),
                    gl.full([ROWS], -float("inf"), gl.float32, layout=row_o), members, num_rows, my_row0,
                    kvh, group, mid_o, stride_mo_b, stride_mo_h, mid_lse, stride_ml_b, stride_ml_h)
        return
    # the rows' (member, query head) pairs and their queries, gathered from the requests' rows into
    # this warpgroup's shared Q tile (wgmma's A operand; held in registers it would spill)
    r_ld = my_row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, ld_layout))
    b_ld = gl.load(members + r_ld // group, mask=r_ld < num_rows, other=0).to(gl.int64)
    h_ld = kvh * group + r_ld % group
    d_ld = gl.arange(0, HEAD, layout=gl.SliceLayout(0, ld_layout))
    q = gl.load(q_ptr + (b_ld * stride_q_b + h_ld * stride_q_h)[:, None] + d_ld[None, :],
                mask=(r_ld < num_rows)[:, None], other=0.0)
    q_tile = q_smem.index(which)
    q_tile.store(q)
    fence_async_shared()
    gl.thread_barrier()
    # every block is "prefix" (no causal mask): keys past the split's end are masked in its last block
    acc, m_i, l_i = attend_ring(q_tile, k_smem, v_smem, k_ready, v_ready, kv_empty, n_blocks, end - start,
                                n_blocks, 0, qk_scale)
    l_o = gl.convert_layout(l_i, row_o)
    _store_rows(acc / l_o[:, None], gl.convert_layout(m_i, row_o) + gl.log2(l_o), members, num_rows, my_row0,
                kvh, group, mid_o, stride_mo_b, stride_mo_h, mid_lse, stride_ml_b, stride_ml_h)


@gluon.jit
def _store_rows(out, lse, members, num_rows, my_row0, kvh, group, mid_o, stride_mo_b, stride_mo_h, mid_lse,
                stride_ml_b, stride_ml_h):
    """Rows my_row0 .. + 63's partial outputs [64, D] fp32 and log2-sum-exps [64] to their (member,
    head) places in the mid workspaces (addresses built here, after the loop: held across it, the
    [64, D] pointer tile would spill)."""
    row_o: gl.constexpr = gl.SliceLayout(1, out.type.layout)
    col_o: gl.constexpr = gl.SliceLayout(0, out.type.layout)
    r_o = my_row0 + gl.arange(0, out.shape[0], layout=row_o)
    valid = r_o < num_rows
    b_o = gl.load(members + r_o // group, mask=valid, other=0).to(gl.int64)
    h_o = kvh * group + r_o % group
    d_o = gl.arange(0, out.shape[1], layout=col_o)
    o_ptrs = mid_o + (b_o * stride_mo_b + h_o * stride_mo_h)[:, None] + d_o[None, :]
    gl.store(o_ptrs, out, mask=valid[:, None])
    gl.store(mid_lse + b_o * stride_ml_b + h_o * stride_ml_h, lse, mask=valid)


@gluon.jit
def _consumer0(q_ptr, stride_q_b, stride_q_h, members, num_rows, row0, kvh, group, mid_o, stride_mo_b,
               stride_mo_h, mid_lse, stride_ml_b, stride_ml_h, q_smem, k_smem, v_smem, k_ready, v_ready,
               kv_empty, start, end, n_blocks, qk_scale):
    _consumer(0, q_ptr, stride_q_b, stride_q_h, members, num_rows, row0, kvh, group, mid_o, stride_mo_b,
              stride_mo_h, mid_lse, stride_ml_b, stride_ml_h, q_smem, k_smem, v_smem, k_ready, v_ready,
              kv_empty, start, end, n_blocks, qk_scale)


@gluon.jit
def _consumer1(q_ptr, stride_q_b, stride_q_h, members, num_rows, row0, kvh, group, mid_o, stride_mo_b,
               stride_mo_h, mid_lse, stride_ml_b, stride_ml_h, q_smem, k_smem, v_smem, k_ready, v_ready,
               kv_empty, start, end, n_blocks, qk_scale):
    _consumer(1, q_ptr, stride_q_b, stride_q_h, members, num_rows, row0, kvh, group, mid_o, stride_mo_b,
              stride_mo_h, mid_lse, stride_ml_b, stride_ml_h, q_smem, k_smem, v_smem, k_ready, v_ready,
              kv_empty, start, end, n_blocks, qk_scale)


@gluon.jit(do_not_specialize=["num_groups", "num_prefix_splits", "stride_pt_b", "stride_ml_b", "stride_ml_h",
                              "stride_mo_b", "stride_mo_h"],
           do_not_specialize_on_alignment=["page_table", "group_members", "group_starts",
                                           "group_prefix_lens", "mid_o", "mid_lse"])
def _cascade_prefix_ws_kernel(q_ptr, kp_desc, vp_desc, page_table, group_members, group_starts,
                              group_prefix_lens, mid_o, mid_lse, qk_scale, num_groups, num_prefix_splits,
                              stride_q_b, stride_q_h, stride_pt_b, stride_mo_b, stride_mo_h, stride_mo_s,
                              stride_ml_b, stride_ml_h, GROUP: gl.constexpr, HEAD: gl.constexpr,
                              BLOCK: gl.constexpr, STAGES_: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                              CONSUMER_REGS: gl.constexpr):
    kvh = gl.program_id(0)
    split = gl.program_id(1)
    pid = gl.program_id(2)
    # this program's group and row block: groups own cdiv(members * GROUP, 128) consecutive blocks
    g = -1
    blk = 0
    first_block = 0
    for gi in range(0, num_groups):
        n_rb = gl.cdiv((gl.load(group_starts + gi + 1) - gl.load(group_starts + gi)) * GROUP, 128)
        if (pid >= first_block) & (pid < first_block + n_rb):
            g = gi
            blk = pid - first_block
        first_block += n_rb
    if g >= 0:
        member0 = gl.load(group_starts + g)
        num_rows = (gl.load(group_starts + g + 1) - member0) * GROUP
        first_b = gl.load(group_members + member0).to(gl.int64)
        prefix_len = gl.load(group_prefix_lens + g)
        split_len = gl.cdiv(gl.cdiv(prefix_len, num_prefix_splits), BLOCK) * BLOCK
        start = split * split_len
        end = gl.minimum(start + split_len, prefix_len)
        n_blocks = gl.cdiv(gl.maximum(end - start, 0), BLOCK)
        dtype: gl.constexpr = kp_desc.dtype
        kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK, HEAD], dtype)
        q_smem = gl.allocate_shared_memory(dtype, [2, 64, HEAD],
                                           gl.NVMMASharedLayout.get_default_for([64, HEAD], dtype))
        k_smem = gl.allocate_shared_memory(dtype, [STAGES_, BLOCK, HEAD], kv_layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES_, BLOCK, HEAD], kv_layout)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES_):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=2)
        o_base = mid_o + split * stride_mo_s
        lse_base = mid_lse + split
        consumer_args = (q_ptr, stride_q_b, stride_q_h, group_members + member0, num_rows, blk * 128, kvh,
                         GROUP, o_base, stride_mo_b, stride_mo_h, lse_base, stride_ml_b, stride_ml_h, q_smem,
                         k_smem, v_smem, k_ready, v_ready, kv_empty, start, end, n_blocks, qk_scale)
        producer_args = (kp_desc, vp_desc, k_smem, v_smem, k_ready, v_ready, kv_empty,
                         page_table + first_b * stride_pt_b, start, prefix_len, n_blocks, kvh * HEAD)
        gl.warp_specialize([(_consumer0, consumer_args), (_consumer1, consumer_args),
                            (_producer, producer_args)], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def supported(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, page_size: int) -> bool:
    """Whether stage A can take the Gluon kernel: a Hopper GPU, a bf16 / fp16 pool of q's dtype (no
    FP8), head dim 128, pages of 8-128 tokens dividing 128, the pool viewable as [slots, Hkv * D]."""
    if not q.is_cuda:
        return False
    if not _is_hopper(q.device.index if q.device.index is not None else torch.cuda.current_device()):
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or q.shape[-1] != 128 or q.stride(-1) != 1:
        return False
    if k_buffer.dtype != q.dtype or v_buffer.dtype != q.dtype or page_size < 8 or BLOCK_N % page_size:
        return False
    return _as_rows(k_buffer) is not None and _as_rows(v_buffer) is not None


def run_prefix_stage_ws(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                        page_table: torch.Tensor, group_members: torch.Tensor, group_starts: torch.Tensor,
                        group_prefix_lens: torch.Tensor, page_size: int, qk_scale: float,
                        num_prefix_splits: int, prefix_o: torch.Tensor, prefix_lse: torch.Tensor) -> None:
    """Stage A on inputs `supported` accepted and cascade_decode_attention checked: every group's
    prefix partials into prefix_o [B, Hq, num_prefix_splits, D] fp32 / prefix_lse [B, Hq,
    num_prefix_splits] fp32 (views of the mid workspaces' prefix slots). qk_scale includes log2(e).
    A split's length is a multiple of 128 prefix tokens (the Triton kernel's is one of its tile's
    64); the merge does not depend on where the splits fall."""
    num_groups = group_starts.shape[0] - 1
    _, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    group = num_q_heads // num_kv_heads
    layout = _smem_layout(page_size, head_dim, q.dtype)
    kp_desc = TensorDescriptor.from_tensor(_as_rows(k_buffer), [page_size, head_dim], layout)
    vp_desc = TensorDescriptor.from_tensor(_as_rows(v_buffer), [page_size, head_dim], layout)
    num_blocks = triton.cdiv(group_members.shape[0] * group, BLOCK_M) + num_groups
    grid = (num_kv_heads, num_prefix_splits, num_blocks)
    _cascade_prefix_ws_kernel[grid](
        q, kp_desc, vp_desc, page_table, group_members, group_starts, group_prefix_lens, prefix_o, prefix_lse,
        qk_scale, num_groups, num_prefix_splits, q.stride(0), q.stride(1), page_table.stride(0),
        prefix_o.stride(0), prefix_o.stride(1), prefix_o.stride(2), prefix_lse.stride(0),
        prefix_lse.stride(1),
        GROUP=group, HEAD=head_dim, BLOCK=BLOCK_N, STAGES_=STAGES, PRODUCER_REGS=40, CONSUMER_REGS=232,
        num_warps=4)
