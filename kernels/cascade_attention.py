"""Cascade (shared-prefix) decode attention: the shared prefix of a group of requests is read once.

When many decoding requests share a long prefix (the same physical KV pages, e.g. one system prompt),
plain decode attention streams the prefix's K/V once per request. Here it is streamed once per
(group, block of query rows, KV head), as in cascade inference (Ye et al. 2024, FlashInfer, "Cascade
Inference: memory bandwidth efficient shared prefix batch decoding") and Hydragen (Juravsky et al.
2024, "Hydragen: high-throughput LLM inference with shared prefixes"): the queries of all members of
a group attend to the prefix together, as one matrix product, and the per-request suffix attention
is merged in by log-sum-exp. Three launches:

  A. prefix (this module): grid (KV head, prefix split, block of rows) (config blocks_last; the
     block axis first without it). Rows are
     (member, query head) pairs of one KV head, member-major, packed densely: row r of group g is
     member r // G, query head kvh * G + r % G (G = Hq // Hkv). A program streams its split of the
     group's prefix once, through the FIRST member's page-table row, with tl.dot scores and the
     FlashAttention-2 online softmax (exp2 domain), and writes a partial output and log2-sum-exp
     into mid slot num_kv_splits + split of each of its rows.
  B. suffix: decode_attention's split stage with kv_start, over [kv_start, seq_len) of every request
     (requests in no group have kv_start = 0, i.e. their whole sequence): mid slots 0..S-1.
  C. merge: decode_attention's merge stage over the S suffix slots, plus the prefix slots of rows with
     kv_start > 0 (rows with kv_start == 0 never read them).
With num_kv_splits == 1 (short suffixes, chosen by the caller) B and C are one launch: the single
suffix program of a (request, KV head) merges the prefix partials into its own softmax state and
writes the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import switches
from ._checks import check, dot_precision, gluon_route_open, next_pow2
from .attention_configs import attention_config
from .decode_attention import (
    H200_NUM_SMS,
    LOG2E,
    check_decode_args,
    check_mid,
    check_out,
    run_merge_stage,
    run_split_stage,
)
from .paged_loop import paged_attn_loop


# Integer arguments that change from pass to pass are not specialised (each new value class would
# compile a variant mid-serving); the mid_o strides are multiples of HEAD_DIM, so their
# specialisation is stable, and it matters: unspecialised they made this stage ~1.8x slower (H200,
# 2026-11-30, 128 requests sharing 2,048 tokens: 43.6 against 24.7 us per call).
@triton.jit(do_not_specialize=["num_groups", "num_prefix_splits", "stride_ml_b", "stride_ml_h"])
def _cascade_prefix_kernel(
    q, k_buf, v_buf, page_table, group_members, group_starts, group_prefix_lens, mid_o, mid_lse,
    qk_scale, v_scale, num_groups, num_prefix_splits,
    stride_q_b, stride_q_h, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h, stride_pt_b,
    stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h,
    GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    REMAT_ROWS: tl.constexpr = False, BLOCKS_LAST: tl.constexpr = False,
):
    # grid (KV head, split, row block), or (row block, KV head, split) without BLOCKS_LAST. Row blocks
    # are numbered group after group: group g owns
    # cdiv(members_g * GROUP, BLOCK_M) consecutive blocks; this program finds its group by walking
    # the (few) groups. Programs past the last block, and empty (padding) groups, do no work, so a
    # CUDA graph padded with empty groups costs only the blocks of its real groups. (H200, 2026-11-30:
    # with 8 groups, 7 of them empty, a grid of (group x row block) ran this stage in 127.8 us, as the
    # real group's programs waited behind ~980 empty ones; numbered this way, 32.1 us in the engine.)
    if BLOCKS_LAST:  # grid (KV head, split, row block): the blocks past the groups' end start last
        kvh = tl.program_id(0)
        split = tl.program_id(1)
        pid = tl.program_id(2)
    else:
        pid = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
    g = -1
    blk = 0
    first_block = 0
    for gi in range(0, num_groups):
        n_blocks = tl.cdiv((tl.load(group_starts + gi + 1) - tl.load(group_starts + gi)) * GROUP, BLOCK_M)
        inside = (pid >= first_block) & (pid < first_block + n_blocks)
        g = tl.where(inside, gi, g)
        blk = tl.where(inside, pid - first_block, blk)
        first_block += n_blocks
    has_group = g >= 0
    g = tl.maximum(g, 0)
    row0 = blk * BLOCK_M
    member0 = tl.load(group_starts + g)
    num_members = tl.where(has_group, tl.load(group_starts + g + 1) - member0, 0)
    # this block's rows: (member, query head) pairs; rows past the group's end are padding
    rows = row0 + tl.arange(0, BLOCK_M)
    mask_m = rows < num_members * GROUP
    b = tl.load(group_members + member0 + rows // GROUP, mask=mask_m, other=0).to(tl.int64)
    heads = kvh * GROUP + rows % GROUP
    first_b = tl.load(group_members + member0, mask=num_members > 0, other=0).to(tl.int64)
    # this split's token range of the prefix (empty for a program with no rows)
    prefix_len = tl.load(group_prefix_lens + g)
    split_len = tl.cdiv(tl.cdiv(prefix_len, num_prefix_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, prefix_len)
    end = tl.where(row0 < num_members * GROUP, end, start)

    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    # the rows' queries [BLOCK_M, BLOCK_D], gathered from their requests; padding rows are zero
    qm = tl.load(q + b[:, None] * stride_q_b + heads[:, None] * stride_q_h + offs_d[None, :],
                 mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    # The prefix is read through the first member's page-table row (page ids loaded one step ahead,
    # so the K/V addresses never wait on a load of the same step); one K/V read serves every row.
    m_i, l_i, acc = paged_attn_loop(qm, k_buf, v_buf, page_table + first_b * stride_pt_b, kvh, start, end,
                                    qk_scale, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
                                    BLOCK_M, PAGE_SIZE, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PRECISION)
    acc = acc * v_scale  # an FP8 pool's per-layer V scale (1.0 otherwise; k_scale is in qk_scale)

    if REMAT_ROWS:
        # The rows' requests and heads once more, for the stores: held from before the loop they
        # are spilled to local memory (ptxas -v, sm_90: 448 B at the 128-row GPU tile, 680 B at 64
        # rows; 0 with this). `none` is 0 (l_i >= 0), but the compiler cannot tell, so it recomputes
        # them here instead of merging them with the first ones. (Config "cascade" remat_rows.)
        none = (l_i < 0.0).to(tl.int32)
        rows = row0 + tl.arange(0, BLOCK_M) + none
        mask_m = rows < num_members * GROUP
        b = tl.load(group_members + member0 + rows // GROUP, mask=mask_m, other=0).to(tl.int64)
        heads = kvh * GROUP + rows % GROUP
    # partial result and its log2-sum-exp per row; an empty split writes zeros and lse = -inf
    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    tl.store(mid_o + b[:, None] * stride_mo_b + heads[:, None] * stride_mo_h + split * stride_mo_s
             + offs_d[None, :], out, mask=mask_m[:, None] & mask_d[None, :])
    tl.store(mid_lse + b * stride_ml_b + heads * stride_ml_h + split, lse, mask=mask_m)


@dataclass(frozen=True, slots=True)
class CascadeTile:
    """Tile of the prefix stage (A): block_m query rows x block_n prefix tokens per step."""

    block_m: int  # rows = (member, query head) pairs of one KV head; power of two >= 16 (tl.dot)
    block_n: int  # prefix tokens per step; power of two >= 16
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 16 and v == next_pow2(v),
                  f"{name} must be a power of two >= 16")
        check(self.num_warps in (1, 2, 4, 8, 16) and self.num_stages >= 1, "bad num_warps/num_stages")


def default_tile(head_dim: int, device: torch.device) -> CascadeTile:
    """Stage-A tile from the config table (attention_configs, kind "cascade"). On the GPU, for
    D <= 128: 128 rows x 64 tokens, 8 warps, 3 stages (q 32 KB + 3 x (K 16 KB + V 16 KB) of shared
    memory, so one program per SM), the best of 9 tiles x 4 split counts on an H200 for 128 requests
    sharing a 2,048-token prefix once the page ids were loaded a step ahead (2026-11-30,
    bench/lab/sweep_attention.py, profiler): 17.7 us against 20.3 us for the previous 64 x 64 / 4
    warps / 2 stages. In the engine (shared-prefix, median of 3) the two tiles and 64 x 64 / 3 stages
    gave 9,810 / 9,822 / 9,756 tok/s: equal, as there the prefix K/V come from HBM. Larger heads
    halve the key block. CPU (interpreter): small blocks exercise the loops."""
    c = attention_config("cascade", head_dim, device.type == "cuda")
    return CascadeTile(int(c["block_m"]), int(c["block_n"]), int(c["num_warps"]), int(c["num_stages"]))


def choose_num_prefix_splits(num_groups: int, max_group_size: int, num_q_heads: int, num_kv_heads: int,
                             max_prefix_len: int, num_sms: int = H200_NUM_SMS, max_splits: int = 16,
                             block_m: int = 128) -> int:
    """Number of prefix splits for stage A, from host ints only (no device sync).

    At most one stage-A program per SM over (group x row block, KV head, split), since the default
    tile fills an SM's shared memory, and at least 256 prefix tokens per split: every split costs a
    [rows, D] fp32 partial written and merged, which for a whole group is comparable to the prefix
    K/V it replaces. (On an H200, 2026-11-30, 128 requests sharing 2,048 tokens: 4 splits = 112 programs ran
    stage A in 17.7 us, 3 in 21.3 us, 8 in 22.8 us.) block_m must match the tile used. A CUDA graph
    captured with max_prefix_len >= every replayed prefix stays valid (the kernel clips split ranges
    on the device).
    """
    group = num_q_heads // max(1, num_kv_heads)
    row_blocks = max(1, num_groups) * triton.cdiv(max(1, max_group_size) * group, block_m)
    want = num_sms // (row_blocks * max(1, num_kv_heads))
    by_len = triton.cdiv(max(1, max_prefix_len), 256)
    return int(max(1, min(want, by_len, max_splits)))


def _check_groups(q: torch.Tensor, kv_start: torch.Tensor, group_members: torch.Tensor,
                  group_starts: torch.Tensor, group_prefix_lens: torch.Tensor, num_prefix_splits: int,
                  max_group_size: int) -> None:
    check(isinstance(kv_start, torch.Tensor), "kv_start is required ([B] int32; 0 for requests in no group)")
    for name, t in (("group_members", group_members), ("group_starts", group_starts),
                    ("group_prefix_lens", group_prefix_lens)):
        check(isinstance(t, torch.Tensor) and t.dim() == 1 and t.dtype in (torch.int32, torch.int64),
              f"{name} must be a 1-D int32/int64 tensor")
        check(t.device == q.device, f"all tensors must be on {q.device}")
    check(group_starts.shape[0] >= 1, "group_starts must be [G + 1] (offsets into group_members)")
    num_groups = group_starts.shape[0] - 1
    check(group_prefix_lens.shape[0] == num_groups,
          f"group_prefix_lens must be [{num_groups}] (one per group), got {tuple(group_prefix_lens.shape)}")
    check(isinstance(num_prefix_splits, int) and num_prefix_splits >= 1,
          f"bad num_prefix_splits {num_prefix_splits!r}")
    check(isinstance(max_group_size, int)
          and (max_group_size >= 1 or (max_group_size == 0 and num_groups == 0)),
          f"max_group_size must be an int >= 1 when there are groups, got {max_group_size!r}")


def _use_ws(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, page_table: torch.Tensor,
            group_members: torch.Tensor, group_starts: torch.Tensor, group_prefix_lens: torch.Tensor,
            page_size: int, v_scale: float) -> bool:
    """Whether stage A takes the Gluon kernel (see run_prefix_stage): opted in, int32 metadata, no
    V scale (its pool is never FP8; k_scale is folded into qk_scale, 1.0 for such a pool)."""
    metadata = (page_table, group_members, group_starts, group_prefix_lens)
    if not gluon_route_open(q, switches.cascade_ws(), metadata, (v_scale,)):
        return False
    try:  # Gluon's Hopper API (Triton >= 3.6); without it, the Triton kernel
        from . import cascade_prefix_ws
    except (ImportError, AttributeError):
        return False

    return cascade_prefix_ws.supported(q, k_buffer, v_buffer, page_size)


def run_prefix_stage(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                     page_table: torch.Tensor, group_members: torch.Tensor, group_starts: torch.Tensor,
                     group_prefix_lens: torch.Tensor,
                     page_size: int, qk_scale: float, v_scale: float, num_kv_splits: int,
                     num_prefix_splits: int, mid_o: torch.Tensor, mid_lse: torch.Tensor,
                     tile: CascadeTile) -> None:
    """Stage A on checked arguments (cascade_decode_attention's): every group's prefix partials into
    mid slots num_kv_splits .. num_kv_splits + num_prefix_splits - 1 of its members' rows (qk_scale
    already includes log2(e) and an FP8 pool's k_scale). Launches nothing without groups. With
    RADIXRT_CASCADE_WS=1, on a Hopper GPU with a bf16 / fp16 pool (head dim 128), the
    warp-specialized Gluon kernel runs instead (kernels/cascade_prefix_ws.py; opt-in: on an H200,
    at the launcher's split counts, stage A alone took 0.86-1.17x the Triton kernel's time,
    docs/benchmarks.md)."""
    num_groups = group_starts.shape[0] - 1
    if num_groups <= 0:
        return
    if _use_ws(q, k_buffer, v_buffer, page_table, group_members, group_starts, group_prefix_lens, page_size,
               v_scale):
        from .cascade_prefix_ws import run_prefix_stage_ws

        run_prefix_stage_ws(q, k_buffer, v_buffer, page_table, group_members, group_starts, group_prefix_lens,
                            page_size, qk_scale, num_prefix_splits, mid_o[:, :, num_kv_splits:],
                            mid_lse[:, :, num_kv_splits:])
        return
    _, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    group = num_q_heads // num_kv_heads
    # an upper bound on the row blocks of all groups (see the kernel), from shapes only
    num_blocks = triton.cdiv(group_members.shape[0] * group, tile.block_m) + num_groups
    prefix_o, prefix_lse = mid_o[:, :, num_kv_splits:], mid_lse[:, :, num_kv_splits:]
    cfg = attention_config("cascade", head_dim, q.device.type == "cuda")
    last = bool(cfg.get("blocks_last", False))
    grid = ((num_kv_heads, num_prefix_splits, num_blocks) if last
            else (num_blocks, num_kv_heads, num_prefix_splits))
    _cascade_prefix_kernel[grid](
        q, k_buffer, v_buffer, page_table, group_members, group_starts, group_prefix_lens,
        prefix_o, prefix_lse,
        qk_scale, float(v_scale), num_groups, num_prefix_splits,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), page_table.stride(0),
        prefix_o.stride(0), prefix_o.stride(1), prefix_o.stride(2),
        prefix_lse.stride(0), prefix_lse.stride(1),
        GROUP=group, PAGE_SIZE=page_size, HEAD_DIM=head_dim, BLOCK_D=next_pow2(head_dim),
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, DOT_PRECISION=dot_precision(q.dtype),
        REMAT_ROWS=bool(cfg.get("remat_rows", False)), BLOCKS_LAST=last,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )


def cascade_decode_attention(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, page_table: torch.Tensor,
    seq_lens: torch.Tensor, kv_start: torch.Tensor, group_members: torch.Tensor, group_starts: torch.Tensor,
    group_prefix_lens: torch.Tensor, page_size: int, scale: float | None, num_kv_splits: int,
    num_prefix_splits: int, max_group_size: int, out: torch.Tensor | None = None,
    mid_o: torch.Tensor | None = None, mid_lse: torch.Tensor | None = None, tile: CascadeTile | None = None,
    k_scale: float = 1.0, v_scale: float = 1.0,
) -> torch.Tensor:
    """Decode attention (one query token per request) that reads each group's shared prefix once.

    Equals decode_attention over [0, seq_len) of every request, given consistent group metadata.
    q, k_buffer, v_buffer, page_table, seq_lens, page_size, scale, out: as decode_attention.
    kv_start          : [B] int32/int64, tokens of each request covered by its group's prefix (0 for a
                        request in no group); the request's own split-KV pass covers [kv_start, seq_len)
    group_members     : [M] int32/int64 batch indices of grouped requests, contiguous per group
    group_starts      : [G + 1] int32/int64 offsets into group_members (group g is members
                        group_starts[g] .. group_starts[g + 1] - 1; an empty group is allowed)
    group_prefix_lens : [G] int32/int64 prefix tokens per group. Invariants (not checked on the device;
                        reference.assert_groups_share_prefix checks them in tests): a request is in at
                        most one group; every member b of g has kv_start[b] == group_prefix_lens[g]
                        <= seq_lens[b] and the same pages page_table[b, :cdiv(prefix_len, page_size)]
                        (read through the FIRST member's row); every non-member has kv_start == 0
    num_kv_splits     : host int >= 1, splits of the suffix pass (choose_num_kv_splits on the longest
                        [kv_start, seq_len) range)
    num_prefix_splits : host int >= 1, splits of each prefix (choose_num_prefix_splits)
    max_group_size    : host int >= every group's member count (checked on the host only; the grid
                        is sized from group_members' length, so every member is covered)
    mid_o, mid_lse    : optional fp32 workspaces [B, Hq, num_kv_splits + num_prefix_splits, D] and
                        [B, Hq, num_kv_splits + num_prefix_splits]; i.e. 4 * B * Hq * (S + Sp) * (D + 1) bytes
    tile              : optional stage-A CascadeTile (default: default_tile)
    k_scale, v_scale  : per-layer scales of an FP8 pool (as decode_attention); 1.0 otherwise
    Grids depend only on shapes and host ints and lengths are read on the device (no host sync), so the
    launches can be captured in a CUDA graph (pad G with empty groups to a fixed count).
    Returns o [B, Hq, D] in q's dtype. Raises ValueError on bad shapes/dtypes/devices/arguments.
    """
    check_decode_args(q, k_buffer, v_buffer, page_table, seq_lens, kv_start, page_size, num_kv_splits)
    _check_groups(q, kv_start, group_members, group_starts, group_prefix_lens, num_prefix_splits,
                  max_group_size)
    batch_size, num_q_heads, head_dim = q.shape
    out = check_out(out, q)
    num_slots = num_kv_splits + num_prefix_splits
    mid_o, mid_lse = check_mid(mid_o, mid_lse, (batch_size, num_q_heads, num_slots), head_dim, q.device)
    tile = default_tile(head_dim, q.device) if tile is None else tile
    check(isinstance(tile, CascadeTile), "tile must be a CascadeTile")
    if batch_size == 0:
        return out
    qk_scale = (1.0 / math.sqrt(head_dim) if scale is None else float(scale)) * LOG2E * float(k_scale)

    num_groups = group_starts.shape[0] - 1
    if num_groups > 0:
        run_prefix_stage(q, k_buffer, v_buffer, page_table, group_members, group_starts, group_prefix_lens,
                         page_size, qk_scale, v_scale, num_kv_splits, num_prefix_splits, mid_o, mid_lse, tile)
    if num_kv_splits == 1:  # B + C fused: the suffix program merges the prefix partials itself
        run_split_stage(q, k_buffer, v_buffer, page_table, seq_lens, kv_start, page_size, qk_scale,
                        1, mid_o, mid_lse, out=out,
                        num_prefix_splits=num_prefix_splits if num_groups > 0 else 0, v_scale=v_scale)
        return out
    run_split_stage(q, k_buffer, v_buffer, page_table, seq_lens, kv_start, page_size, qk_scale,
                    num_kv_splits, mid_o, mid_lse, v_scale=v_scale)
    run_merge_stage(mid_o, mid_lse, out, num_kv_splits, kv_start, num_prefix_splits)
    return out
