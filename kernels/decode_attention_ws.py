"""Decode attention over an FP8 pool for Hopper (sm_90), as a warp-specialized Gluon kernel.

Same contract as kernels.decode_attention with one KV split and no kv_start: one query token per
request attends to its whole cached sequence in the paged pool. The split-KV Triton kernel reads an
FP8 pool at 0.65x its bf16 time (half the bytes); this kernel moves the page streaming out of the
computing warps and reads it at 0.59-0.60x (docs/benchmarks.md, "Decode over an FP8 pool as a
Gluon kernel").

Structure (the producer / consumer split of FlashAttention-3, Shah et al., 2024, applied to
Flash-Decoding's per-(request, KV head) program, Dao et al., 2023):

- one CTA per (request, KV head); a producer warp (worker partition) loads the page ids and copies
  each block of BLOCK = 4 x SUB keys by TMA, one [page_size, D] box per page of the pool viewed as
  [slots, Hkv * D], into a ring of STAGES shared-memory stages (barriers: k_ready / v_ready with
  the TMA byte counts, kv_empty when the consumers have read a stage);
- the default partition's 4 warps each take SUB keys of every block (a batched mma.sync over
  [4, 16, D] x [4, D, SUB]: the GQA group's query rows padded to 16), each with its own online
  softmax state in exp2 (scale folded into log2(e)); the four states are merged after the loop as
  Flash-Decoding merges its splits. K and V are widened from e4m3 to fp16 in registers (exact, one
  packed cvt per two values; bf16 would take three) and both dots run in fp16 with q clamped to
  fp16's range, as the Triton kernel's "f16" kv_dot does.

A block past the sequence's last page re-reads that page (finite data, masked), so no stage holds
uninitialised shared memory. A request with seq_len 0 gets a zero row. `supported` says when
decode_attention may route here; the route adds the length rule (decode_attention's
DECODE_WS_MIN_SEQ). Without a CUDA graph each call also pays two TMA descriptors' host time.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, mma_v2, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .extend_attention_ws import _as_rows, _is_hopper, _smem_layout

HEAD_DIM = 128
SUB, STAGES, WARPS, MAXNREG = 32, 2, 4, 128  # H200, 64 x 4K: 82.3-83.2 us (16 x 2: 85.2, 16 x 4: 85.8)
FP8 = torch.float8_e4m3fn


@gluon.jit
def _producer(kp_desc, vp_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, page_row, seq_len, kv_col):
    """Block j of BLOCK keys (its pages, one TMA box each) into stage j % STAGES."""
    NSTAGE: gl.constexpr = k_smem.shape[0]
    BLOCK: gl.constexpr = k_smem.shape[1]
    PAGE: gl.constexpr = kp_desc.block_type.shape[0]
    PAGES: gl.constexpr = BLOCK // PAGE
    n_blocks = gl.cdiv(seq_len, BLOCK)
    last_page = (seq_len - 1) // PAGE
    for j in range(n_blocks):
        s = j % NSTAGE
        mbarrier.wait(kv_empty.index(s), ((j // NSTAGE) & 1) ^ 1)
        mbarrier.expect(k_ready.index(s), PAGES * kp_desc.block_type.nbytes)
        mbarrier.expect(v_ready.index(s), PAGES * vp_desc.block_type.nbytes)
        for i in gl.static_range(PAGES):
            page = gl.load(page_row + gl.minimum(j * PAGES + i, last_page))
            tma.async_copy_global_to_shared(kp_desc, [page * PAGE, kv_col], k_ready.index(s),
                                            k_smem.index(s).slice(i * PAGE, PAGE))
            tma.async_copy_global_to_shared(vp_desc, [page * PAGE, kv_col], v_ready.index(s),
                                            v_smem.index(s).slice(i * PAGE, PAGE))


@gluon.jit
def _producer_ids_ahead(kp_desc, vp_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, page_row, seq_len,
                        kv_col):
    """_producer with the page ids of block j + 1 loaded (one vector load) before the wait for block
    j's stage, so their L2 round trip is off the path from a stage's release to its copies (the
    PREFETCH_IDS experiment, not the default)."""
    NSTAGE: gl.constexpr = k_smem.shape[0]
    BLOCK: gl.constexpr = k_smem.shape[1]
    PAGE: gl.constexpr = kp_desc.block_type.shape[0]
    PAGES: gl.constexpr = BLOCK // PAGE
    ids_layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    n_blocks = gl.cdiv(seq_len, BLOCK)
    last_page = (seq_len - 1) // PAGE
    offs = gl.arange(0, PAGES, layout=ids_layout)
    ids = gl.load(page_row + gl.minimum(offs, last_page), mask=(offs >= 0) & (seq_len > 0), other=0)
    for j in range(n_blocks):
        s = j % NSTAGE
        ids_next = gl.load(page_row + gl.minimum((j + 1) * PAGES + offs, last_page))
        mbarrier.wait(kv_empty.index(s), ((j // NSTAGE) & 1) ^ 1)
        mbarrier.expect(k_ready.index(s), PAGES * kp_desc.block_type.nbytes)
        mbarrier.expect(v_ready.index(s), PAGES * vp_desc.block_type.nbytes)
        for i in gl.static_range(PAGES):
            page = gl.sum(gl.where(offs == i, ids, 0), axis=0)  # element i, as a scalar
            tma.async_copy_global_to_shared(kp_desc, [page * PAGE, kv_col], k_ready.index(s),
                                            k_smem.index(s).slice(i * PAGE, PAGE))
            tma.async_copy_global_to_shared(vp_desc, [page * PAGE, kv_col], v_ready.index(s),
                                            v_smem.index(s).slice(i * PAGE, PAGE))
        ids = ids_next


@gluon.jit
def _consumers(q_ptr, o_ptr, q_base, o_base, head0, k_smem, v_smem, k_ready, v_ready, kv_empty,
               seq_len, group, qk_scale, v_scale):
    _consume(q_ptr, o_ptr, q_base, o_base, head0, k_smem, v_smem, k_ready, v_ready, kv_empty,
             seq_len, group, qk_scale, v_scale, False)


@gluon.jit
def _consumers_v_wide(q_ptr, o_ptr, q_base, o_base, head0, k_smem, v_smem, k_ready, v_ready, kv_empty,
                      seq_len, group, qk_scale, v_scale):
    _consume(q_ptr, o_ptr, q_base, o_base, head0, k_smem, v_smem, k_ready, v_ready, kv_empty,
             seq_len, group, qk_scale, v_scale, True)


@gluon.jit
def _consume(q_ptr, o_ptr, q_base, o_base, head0, k_smem, v_smem, k_ready, v_ready, kv_empty,
             seq_len, group, qk_scale, v_scale, V_WIDE: gl.constexpr):
    """The consumer partition. V_WIDE (an experiment, not the default): read an FP8 V stage with
    16-byte loads along D and widen it before its dot (the layout change to the MMA operand goes
    through shared memory as fp16), instead of the MMA operand's own loads, which take single bytes:
    the operand pairs two keys' values, which lie in different rows."""
    NW: gl.constexpr = gl.num_warps()
    NSTAGE: gl.constexpr = k_smem.shape[0]
    SUBK: gl.constexpr = k_smem.shape[1] // NW
    HEAD: gl.constexpr = k_smem.shape[2]
    out_dtype: gl.constexpr = o_ptr.dtype.element_ty
    # the dots' operand type: fp16 over an FP8 pool (e4m3 -> fp16 exact), else q's (the lab's bf16 pools)
    dtype: gl.constexpr = gl.float16 if k_smem.dtype == gl.float8e4nv else out_dtype
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1, 1],
                                                  instr_shape=[1, 16, 8])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    ml_layout: gl.constexpr = gl.SliceLayout(2, mma)  # [NW, 16]
    ld: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 4, 8], [NW, 1, 1], [2, 1, 0])

    # the group's query rows (padded to 16, q's rows at head stride HEAD), the same in every warp
    w_ld = gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, ld)))
    r_ld = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, ld)))
    d_ld = gl.arange(0, HEAD, layout=gl.SliceLayout(0, gl.SliceLayout(1, ld)))
    q_off = (head0 + r_ld)[None, :, None] * HEAD + d_ld[None, None, :] + 0 * w_ld[:, None, None]
    q = gl.load(q_ptr + q_base + q_off, mask=(r_ld < group)[None, :, None] & (w_ld >= 0)[:, None, None],
                other=0.0)
    if dtype != out_dtype:
        q = gl.minimum(gl.maximum(q.to(gl.float32), -65504.0), 65504.0).to(dtype)
    q = gl.convert_layout(q, a_layout)

    acc = gl.zeros([NW, 16, HEAD], gl.float32, layout=mma)
    m_i = gl.full([NW, 16], -float("inf"), gl.float32, layout=ml_layout)
    l_i = gl.zeros([NW, 16], gl.float32, layout=ml_layout)
    key_w = gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(1, mma)))
    key_i = gl.arange(0, SUBK, layout=gl.SliceLayout(0, gl.SliceLayout(1, mma)))
    n_blocks = gl.cdiv(seq_len, SUBK * NW)
    for j in range(n_blocks):
        s = j % NSTAGE
        ph = (j // NSTAGE) & 1
        mbarrier.wait(k_ready.index(s), ph)
        k_t = k_smem.index(s).reshape([NW, SUBK, HEAD]).permute((0, 2, 1))  # [NW, D, SUB]
        sc = mma_v2(q, k_t.load(b_layout).to(dtype), gl.zeros([NW, 16, SUBK], gl.float32, layout=mma))
        if (j + 1) * SUBK * NW > seq_len:
            keys = (j * NW + key_w)[:, None] * SUBK + key_i[None, :]  # [NW, SUB]
            sc = gl.where((keys < seq_len)[:, None, :], sc, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(sc, 2) * qk_scale)
        m_use = gl.where(m_new == -float("inf"), 0.0, m_new)  # a warp whose keys are all past the end
        p = gl.exp2(sc * qk_scale - m_use[:, :, None])
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.sum(p, 2)
        m_i = m_new
        mbarrier.wait(v_ready.index(s), ph)
        if V_WIDE:
            v_rows: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 4, 8], [NW, 1, 1], [2, 1, 0])
            v = gl.convert_layout(v_smem.index(s).reshape([NW, SUBK, HEAD]).load(v_rows).to(dtype), b_layout)
        else:
            v = v_smem.index(s).reshape([NW, SUBK, HEAD]).load(b_layout).to(dtype)  # [NW, SUB, D]
        acc = mma_v2(gl.convert_layout(p.to(dtype), a_layout), v, acc * alpha[:, :, None])
        mbarrier.arrive(kv_empty.index(s), count=1)
    # merge the warps' states (Flash-Decoding's split merge, inside the program); no keys: zeros
    m_all = gl.max(m_i, 0)
    m_all = gl.where(m_all == -float("inf"), 0.0, m_all)
    f = gl.exp2(m_i - m_all[None, :])
    num = gl.sum(acc * f[:, :, None], 0)  # [16, D]
    l_all = gl.sum(l_i * f, 0)
    den = gl.where(l_all > 0.0, l_all, 1.0) / v_scale
    out = num / gl.convert_layout(den, gl.SliceLayout(1, num.type.layout))[:, None]
    rows = gl.arange(0, 16, layout=gl.SliceLayout(1, out.type.layout))
    cols = gl.arange(0, HEAD, layout=gl.SliceLayout(0, out.type.layout))
    o_ptrs = o_ptr + o_base + (head0 + rows)[:, None] * HEAD + cols[None, :]
    gl.store(o_ptrs, out.to(out_dtype), mask=(rows < group)[:, None])


# the page table's width varies from pass to pass and the metadata vectors are slices of one upload
# buffer (4- or 16-byte aligned): neither is specialised, so one compile serves every pass
@gluon.jit(do_not_specialize=["stride_pt_b", "stride_q_b", "stride_o_b"],
           do_not_specialize_on_alignment=["page_table", "seq_lens"])
def _decode_ws_kernel(q_ptr, o_ptr, stride_q_b, stride_o_b, kp_desc, vp_desc, page_table, stride_pt_b,
                      seq_lens, qk_scale, v_scale, GROUP: gl.constexpr, SUB_KEYS: gl.constexpr,
                      NUM_STAGES: gl.constexpr, V_WIDE: gl.constexpr = False,
                      PREFETCH_IDS: gl.constexpr = False):
    HEAD: gl.constexpr = kp_desc.block_type.shape[1]
    NW: gl.constexpr = gl.num_warps()
    req = gl.program_id(0)
    kvh = gl.program_id(1)
    seq_len = gl.load(seq_lens + req)
    dtype: gl.constexpr = kp_desc.dtype
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NW * SUB_KEYS, HEAD], dtype)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, NW * SUB_KEYS, HEAD], layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, NW * SUB_KEYS, HEAD], layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=1)
    c_args = (q_ptr, o_ptr, req.to(gl.int64) * stride_q_b, req.to(gl.int64) * stride_o_b, kvh * GROUP,
              k_smem, v_smem, k_ready, v_ready, kv_empty, seq_len, GROUP, qk_scale, v_scale)
    p_args = (kp_desc, vp_desc, k_smem, v_smem, k_ready, v_ready, kv_empty,
              page_table + req.to(gl.int64) * stride_pt_b, seq_len, kvh * HEAD)
    if V_WIDE:
        if PREFETCH_IDS:
            gl.warp_specialize([(_consumers_v_wide, c_args), (_producer_ids_ahead, p_args)], [1], [40])
        else:
            gl.warp_specialize([(_consumers_v_wide, c_args), (_producer, p_args)], [1], [40])
    else:
        if PREFETCH_IDS:
            gl.warp_specialize([(_consumers, c_args), (_producer_ids_ahead, p_args)], [1], [40])
        else:
            gl.warp_specialize([(_consumers, c_args), (_producer, p_args)], [1], [40])


def supported(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, page_size: int,
              out: torch.Tensor) -> bool:
    """Whether these tensors can take the Gluon kernel: CUDA compute capability 9.x, an FP8 (e4m3)
    pool, bf16 / fp16 q and out with head dim 128, query heads per KV head <= 16, q and out [B, Hq, D]
    with head stride D (any row stride), page_size 8, 16 or 32 (the sizes tested on a GPU; a TMA box
    needs >= 8 rows, and a block of 4 x SUB keys whole pages), the pool viewable as [slots, Hkv * D]
    with 16-byte aligned rows."""
    if not q.is_cuda or not _is_hopper(q.device.index if q.device.index is not None
                                       else torch.cuda.current_device()):
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or out.dtype != q.dtype or q.shape[-1] != HEAD_DIM:
        return False
    if k_buffer.dtype != FP8 or v_buffer.dtype != FP8 or q.shape[1] // k_buffer.shape[1] > 16:
        return False
    if page_size not in (8, 16, 32):
        return False
    if any(t.stride(1) != HEAD_DIM or t.stride(2) != 1 for t in (q, out)):
        return False
    return _as_rows(k_buffer) is not None and _as_rows(v_buffer) is not None


def decode_attention_ws(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                        page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int, qk_scale: float,
                        v_scale: float, out: torch.Tensor, v_wide: bool = False,
                        prefetch_ids: bool = False) -> torch.Tensor:
    """The Gluon kernel over inputs `supported` accepted (kernels.decode_attention checks the rest of
    the contract first): q / out [B, Hq, 128], pool [S, Hkv, 128] float8_e4m3fn holding K / k_scale
    and V / v_scale, page_table [B, P] int32 with contiguous rows, seq_lens [B] int32. qk_scale
    already includes log2(e) and k_scale. Shared memory: 2 x STAGES x 4 x SUB x 128 B of K / V ring
    plus the merge's 32 KiB. v_wide / prefetch_ids: the V_WIDE and PREFETCH_IDS experiments (see
    _consume, _producer_ids_ahead; compiled for sm_90, not yet timed). Returns out."""
    b, hq, d = q.shape
    hkv = k_buffer.shape[1]
    layout = _smem_layout(page_size, d, k_buffer.dtype)
    kp = TensorDescriptor.from_tensor(_as_rows(k_buffer), [page_size, d], layout)
    vp = TensorDescriptor.from_tensor(_as_rows(v_buffer), [page_size, d], layout)
    _decode_ws_kernel[(b, hkv)](q, out, q.stride(0), out.stride(0), kp, vp, page_table, page_table.stride(0),
                                seq_lens, qk_scale, float(v_scale), GROUP=hq // hkv, SUB_KEYS=SUB,
                                NUM_STAGES=STAGES, V_WIDE=v_wide, PREFETCH_IDS=prefetch_ids, num_warps=WARPS,
                                maxnreg=MAXNREG)
    return out
