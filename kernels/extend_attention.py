"""Extend (prefill) attention over a paged KV cache, variable lengths in one launch.

Each new token of request b attends to (1) b's cached prefix, read from the pool through the page
table (slot = page_table[b, pos // page_size] * page_size + pos % page_size; PagedAttention, Kwon
et al. 2023), and (2) causally to b's new tokens up to and including itself, read from the new K/V
tensors. Online softmax with a running max and sum over key blocks, as in FlashAttention-2 (Dao,
2023), in exp2 with the softmax scale folded into log2(e). GQA: query head h reads KV head
h // (Hq // Hkv); a request with a single new token (a decoding request in a mixed pass) packs the
query heads of one KV head into the rows of one program. The prefix may end anywhere, also inside a
page.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import switches
from ._checks import (
    FP8_DTYPE,
    check,
    check_int_vector,
    check_page_size,
    check_pool,
    dot_precision,
    gluon_route_open,
    next_pow2,
)
from .attention_configs import attention_config
from .paged_loop import online_softmax_step_scaled, paged_attn_loop

LOG2E = 1.4426950408889634


# The page table's width varies from pass to pass; specialised (== 1, divisible by 16) it would compile
# new variants mid-serving, seconds each (warmup_extend in the attention backend compiles the rest).
# Likewise the metadata vectors' addresses: the backend's are slices of one upload buffer
# (worker/device_batch.py upload_group), 16-byte aligned or not by the batch size, so their
# alignment is not specialised either (they are read as scalars; H200 2026-12-04: with fresh
# tensors in the warm-up, two variants compiled at the first passes, found by
# test_backend_start_compiles_every_extend_variant).
@triton.jit(do_not_specialize=["stride_pt_b"],
            do_not_specialize_on_alignment=["prefix_lens", "extend_lens", "extend_start_loc"])
def _extend_attn_kernel(
    q, k_new, v_new, k_desc, v_desc, k_buf, v_buf, o,
    page_table, prefix_lens, extend_lens, extend_start_loc,
    qk_scale, prefix_qk_scale, v_scale,
    stride_q_t, stride_q_h, stride_kn_t, stride_kn_h, stride_vn_t, stride_vn_h,
    stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h, stride_o_t, stride_o_h, stride_pt_b,
    GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, PACK_GQA: tl.constexpr,
    USE_TMA: tl.constexpr, M_MAJOR: tl.constexpr = False,
):
    # USE_TMA: the new tokens' K/V blocks come through the host tensor descriptors k_desc / v_desc
    # (2-D views [T, Hkv * D], blocks [BLOCK_N, D] at column kvh * D: TMA copies on sm_90, fewer
    # address registers); otherwise k_desc / v_desc are unused and the blocks are pointer loads.
    # Scores in the new-token loops are the raw q.k products, scaled inside the softmax update
    # (one FMA per score: online_softmax_step_scaled).
    # longest query blocks (most causal work) first, to shorten the tail of the launch: with M_MAJOR
    # the grid is (head, query block, request) and the longest blocks of every head go first;
    # otherwise (query block, head, request), longest first within each head
    if M_MAJOR:
        mb = tl.num_programs(1) - 1 - tl.program_id(1)
        h = tl.program_id(0)
    else:
        mb = tl.num_programs(0) - 1 - tl.program_id(0)
        h = tl.program_id(1)
    b = tl.program_id(2)
    ext_len = tl.load(extend_lens + b)
    if mb * BLOCK_M >= ext_len:
        return
    kvh = h // GROUP
    # A request with one new token (a decoding request in a MIXED pass) would fill a BLOCK_M-row
    # tile with one row per query head. With PACK_GQA (1 < GROUP <= BLOCK_M) the program of each KV
    # head's first query head takes all GROUP heads as its rows and the others exit, so the
    # request's prefix is streamed once per KV head rather than once per query head. (H200,
    # 2026-11-30: the mixed pass of shared-prefix, 63 x 128 new + 65 decoding rows over a shared
    # 2,048-token prefix, 1,035 against 1,791 us per layer.)
    packed = ext_len == 1
    if not PACK_GQA:
        packed = ext_len < 0  # (never)
    if packed & (h % GROUP != 0):
        return
    prefix_len = tl.load(prefix_lens + b)
    tok0 = tl.load(extend_start_loc + b).to(tl.int64)

    offs_r = tl.arange(0, BLOCK_M)
    # each row's query: new-token index offs_m (causal position within the extend) and head
    offs_m = tl.where(packed, 0, mb * BLOCK_M + offs_r)
    row_head = tl.where(packed, kvh * GROUP + offs_r, h)
    mask_m = tl.where(packed, offs_r < GROUP, offs_m < ext_len)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    # this block of queries [BLOCK_M, BLOCK_D]; padded rows/dims are zero
    qb = tl.load(q + (tok0 + offs_m)[:, None] * stride_q_t + row_head[:, None] * stride_q_h + offs_d[None, :],
                 mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    # 1) cached prefix: gather key/value rows through the page table, mask the ragged end (an FP8
    # pool's k_scale is in prefix_qk_scale, its v_scale applied to the prefix's acc; the new
    # tokens below are read unquantized from k_new / v_new)
    m_i, l_i, acc = paged_attn_loop(qb, k_buf, v_buf, page_table + b * stride_pt_b, kvh, 0, prefix_len,
                                    prefix_qk_scale, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
                                    BLOCK_M, PAGE_SIZE, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PRECISION)
    acc = acc * v_scale

    # 2) new tokens strictly before this query block: every key is visible to every query row
    for n0 in range(0, mb * BLOCK_M, BLOCK_N):
        if USE_TMA:
            kb = k_desc.load([(tok0 + n0).to(tl.int32), kvh * HEAD_DIM])
        else:
            tok = tok0 + n0 + offs_n
            kb = tl.load(k_new + tok[:, None] * stride_kn_t + kvh * stride_kn_h + offs_d[None, :],
                         mask=mask_d[None, :], other=0.0)
        s = tl.dot(qb, tl.trans(kb), input_precision=DOT_PRECISION)
        p, m_i, l_i, acc = online_softmax_step_scaled(s, qk_scale, m_i, l_i, acc)
        if USE_TMA:
            vb = v_desc.load([(tok0 + n0).to(tl.int32), kvh * HEAD_DIM])
        else:
            vb = tl.load(v_new + tok[:, None] * stride_vn_t + kvh * stride_vn_h + offs_d[None, :],
                         mask=mask_d[None, :], other=0.0)
        acc += tl.dot(p.to(vb.dtype), vb, input_precision=DOT_PRECISION)

    # 3) the diagonal: new tokens inside this query block, causal mask key <= query
    for n0 in range(mb * BLOCK_M, tl.minimum((mb + 1) * BLOCK_M, ext_len), BLOCK_N):
        idx = n0 + offs_n
        mask_n = idx < ext_len
        kv_mask = mask_n[:, None] & mask_d[None, :]
        if USE_TMA:  # rows past this request's end belong to the next one (or are zero past T)
            kb = k_desc.load([(tok0 + n0).to(tl.int32), kvh * HEAD_DIM])
        else:
            kb = tl.load(k_new + (tok0 + idx)[:, None] * stride_kn_t + kvh * stride_kn_h + offs_d[None, :],
                         mask=kv_mask, other=0.0)
        s = tl.dot(qb, tl.trans(kb), input_precision=DOT_PRECISION)
        s = tl.where(mask_n[None, :] & (idx[None, :] <= offs_m[:, None]), s, float("-inf"))
        p, m_i, l_i, acc = online_softmax_step_scaled(s, qk_scale, m_i, l_i, acc)
        if USE_TMA:  # zero the other request's rows: p is 0 there, but 0 * inf would be NaN
            vb = tl.where(mask_n[:, None], v_desc.load([(tok0 + n0).to(tl.int32), kvh * HEAD_DIM]), 0.0)
        else:
            vb = tl.load(v_new + (tok0 + idx)[:, None] * stride_vn_t + kvh * stride_vn_h + offs_d[None, :],
                         mask=kv_mask, other=0.0)
        acc += tl.dot(p.to(vb.dtype), vb, input_precision=DOT_PRECISION)

    # normalise and write the valid rows
    out = acc / l_i[:, None]
    tl.store(o + (tok0 + offs_m)[:, None] * stride_o_t + row_head[:, None] * stride_o_h + offs_d[None, :],
             out.to(o.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def _pick_config(head_dim: int, device: torch.device, max_extend_len: int = 1 << 30,
                 max_seq_len: int | None = None) -> dict:
    """Blocks, warps, stages and USE_TMA from the config table (attention_configs): kind
    "extend_short" when max_extend_len and max_seq_len are both at most its short_max (head dim 128:
    1,024; e.g. 16 x 512 new tokens: 64 x 64 blocks, 4 warps, 2 stages, 154 against 176 us on an
    H200), else "extend" (head dim 128: 128 x 64 blocks, 8 warps, 3 stages, which won every shape
    with a cached prefix or a long extend in bench/lab/sweep_attention.py, 2026-11-30: 8,192 new
    tokens 1,085 against 1,201 us). max_seq_len None means unknown (taken as long). BLOCK_M must be
    a multiple of BLOCK_N (the unmasked loop ends on a block edge; checked)."""
    on_gpu = device.type == "cuda"
    short = attention_config("extend_short", head_dim, on_gpu)
    limit = int(short.get("short_max", 0))
    is_short = limit > 0 and max_extend_len <= limit and max_seq_len is not None and max_seq_len <= limit
    c = short if is_short else attention_config("extend", head_dim, on_gpu)
    check(c["BLOCK_M"] % c["BLOCK_N"] == 0, f"extend config: BLOCK_M {c['BLOCK_M']} is not a multiple of "
          f"BLOCK_N {c['BLOCK_N']}")
    return {"BLOCK_M": c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"], "BLOCK_D": next_pow2(head_dim),
            "num_warps": c["num_warps"], "num_stages": c["num_stages"], "USE_TMA": bool(c.get("USE_TMA")),
            "M_MAJOR": bool(c.get("M_MAJOR"))}


def _use_ws(q, k_new, v_new, k_buffer, v_buffer, page_table, prefix_lens, extend_lens, extend_start_loc,
            page_size: int, out, max_extend_len: int, min_extend_len: int | None, k_scale: float,
            v_scale: float) -> bool:
    """Whether extend_attention routes to the Gluon kernel (see its docstring for the rule). The
    kernel takes int32 metadata and no K/V scales (its pool is never FP8)."""
    switched_on = bool(min_extend_len) and switches.extend_ws()
    metadata = (page_table, prefix_lens, extend_lens, extend_start_loc)
    if not gluon_route_open(q, switched_on, metadata, (k_scale, v_scale)):
        return False
    try:  # Gluon's Hopper API (Triton >= 3.6); without it, the Triton kernel
        from . import extend_attention_ws as ws
    except (ImportError, AttributeError):
        return False

    return (q.shape[0] >= ws.MIN_TOKENS and max_extend_len >= ws.MIN_MAX_EXTEND
            and min_extend_len >= ws.MIN_EXTEND
            and ws.supported(q, k_new, v_new, k_buffer, v_buffer, page_size, out))


def _new_kv_descriptors(k_new: torch.Tensor, v_new: torch.Tensor, block_n: int, block_d: int):
    """Host TMA descriptors of k_new / v_new as 2-D [T, Hkv * D] tensors with [block_n, D] blocks,
    or None when the layout does not allow it (head stride != D, D not a power of two, or a row
    stride / base address not 16-byte aligned, as TMA requires)."""
    num_tokens, num_kv_heads, head_dim = k_new.shape
    esize = k_new.element_size()
    for t in (k_new, v_new):
        if (t.stride(1) != head_dim or head_dim != block_d or (t.stride(0) * esize) % 16
                or t.data_ptr() % 16):
            return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(TensorDescriptor(t, shape=[num_tokens, num_kv_heads * head_dim], strides=[t.stride(0), 1],
                                  block_shape=[block_n, block_d]) for t in (k_new, v_new))


def extend_attention(
    q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, page_table: torch.Tensor,
    prefix_lens: torch.Tensor, extend_lens: torch.Tensor, extend_start_loc: torch.Tensor,
    page_size: int, scale: float | None, max_extend_len: int,
    out: torch.Tensor | None = None, max_seq_len: int | None = None,
    k_scale: float = 1.0, v_scale: float = 1.0, min_extend_len: int | None = None,
) -> torch.Tensor:
    """Causal attention of the new tokens of B requests over their cached prefix plus themselves.

    q                 : [T, Hq, D]   new tokens' queries, T = sum(extend_lens) (last dim contiguous)
    k_new, v_new      : [T, Hkv, D]  new tokens' keys/values (same dtype as q); Hq % Hkv == 0
    k_buffer, v_buffer: [S, Hkv, D]  one layer of the pool; positions < prefix_len are read from it
    page_table        : [B, P] int32 pages of each request in position order (P * page_size >= prefix_len)
    prefix_lens, extend_lens, extend_start_loc : [B] int32/int64; extend_start_loc = exclusive cumsum
    page_size         : tokens per page;  scale: softmax scale (default 1/sqrt(D))
    max_extend_len    : host int >= max(extend_lens) (sets the grid; no device sync)
    out               : optional [T, Hq, D] output buffer (dtype of q)
    max_seq_len       : optional host int >= max(prefix_lens + extend_lens); only picks the tile
    k_scale, v_scale  : per-layer scales of an FP8 (float8_e4m3fn) pool, which holds K / k_scale and
                        V / v_scale; they apply to the prefix read from the pool (1.0 otherwise)
    min_extend_len    : optional host int <= min(extend_lens) (None or 0: unknown). On a Hopper GPU with
                        a bf16/fp16 pool, head dim 128, int32 metadata, T >= 1,024,
                        max_extend_len >= 256 and min_extend_len >= 64, the warp-specialized Gluon
                        kernel runs (kernels/extend_attention_ws.py; RADIXRT_EXTEND_WS=0 keeps the
                        Triton kernel), else the Triton kernel below.
    Returns o [T, Hq, D] in q's dtype. Tokens of a request with extend_len 0 produce nothing.
    Raises ValueError on bad shapes/dtypes/devices.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    check(k_new.dim() == 3 and k_new.shape == v_new.shape and k_new.shape[0] == num_tokens
          and k_new.shape[2] == head_dim, f"k_new/v_new must be [{num_tokens}, Hkv, {head_dim}]")
    num_kv_heads = k_new.shape[1]
    check(num_q_heads % num_kv_heads == 0, f"Hq={num_q_heads} is not a multiple of Hkv={num_kv_heads}")
    check_pool(k_buffer, v_buffer, num_kv_heads, head_dim)
    check(page_table.dim() == 2 and page_table.dtype in (torch.int32, torch.int64),
          "page_table must be a [B, P] int32/int64 tensor")
    batch_size = page_table.shape[0]
    for name, t in (("prefix_lens", prefix_lens), ("extend_lens", extend_lens),
                    ("extend_start_loc", extend_start_loc)):
        check_int_vector(t, name, batch_size)
    check_page_size(page_size)
    check(q.dtype == k_new.dtype == v_new.dtype and k_buffer.dtype in (q.dtype, FP8_DTYPE),
          f"dtypes differ: q {q.dtype}, k_new {k_new.dtype}, v_new {v_new.dtype}, pool {k_buffer.dtype}")
    check(q.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {q.dtype}")
    for name, t in (("q", q), ("k_new", k_new), ("v_new", v_new)):
        check(t.stride(-1) == 1, f"{name} must have a contiguous last dim")
    check(page_table.stride(-1) == 1, "page_table rows must be contiguous")
    for t in (k_new, v_new, k_buffer, v_buffer, page_table, prefix_lens, extend_lens, extend_start_loc):
        check(t.device == q.device, f"all tensors must be on {q.device}")
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    check(out.shape == q.shape and out.dtype == q.dtype and out.stride(-1) == 1, "bad out buffer")
    if num_tokens == 0 or max_extend_len <= 0:
        return out
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    if _use_ws(q, k_new, v_new, k_buffer, v_buffer, page_table, prefix_lens, extend_lens, extend_start_loc,
               page_size, out, max_extend_len, min_extend_len, k_scale, v_scale):
        from .extend_attention_ws import extend_attention_ws

        return extend_attention_ws(q, k_new, v_new, k_buffer, v_buffer, page_table, prefix_lens, extend_lens,
                                   extend_start_loc, page_size, scale, max_extend_len, out)

    cfg = _pick_config(head_dim, q.device, max_extend_len, max_seq_len)
    descs = _new_kv_descriptors(k_new, v_new, cfg["BLOCK_N"], cfg["BLOCK_D"]) if cfg["USE_TMA"] else None
    num_m_blocks = triton.cdiv(max_extend_len, cfg["BLOCK_M"])
    grid = (num_m_blocks, num_q_heads, batch_size)
    m_major = cfg["M_MAJOR"] and num_m_blocks <= 65535  # grid dim 1 is at most 65,535 on CUDA
    if m_major:
        grid = (num_q_heads, num_m_blocks, batch_size)
    _extend_attn_kernel[grid](
        q, k_new, v_new, *(descs or (k_new, v_new)), k_buffer, v_buffer, out,
        page_table, prefix_lens, extend_lens, extend_start_loc,
        scale * LOG2E, scale * LOG2E * float(k_scale), float(v_scale),
        q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        out.stride(0), out.stride(1), page_table.stride(0),
        GROUP=num_q_heads // num_kv_heads, PAGE_SIZE=page_size, HEAD_DIM=head_dim,
        BLOCK_D=cfg["BLOCK_D"], BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
        DOT_PRECISION=dot_precision(q.dtype), PACK_GQA=1 < num_q_heads // num_kv_heads <= cfg["BLOCK_M"],
        USE_TMA=descs is not None, M_MAJOR=m_major, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    return out
