"""Split-KV decode attention over a paged KV cache (one query token per request).

Two stages, as in Flash-Decoding (Dao, Haziza, Massa, Sizov 2023, "Flash-Decoding for long-context
inference"):
  1. grid (split, KV head, request): each program streams its slice of the sequence once, for ALL
     query heads that share that KV head (GQA group padded to >= 16 rows so the scores are one
     tl.dot), and writes a partial output normalised by its own softmax sum plus its log-sum-exp.
  2. grid (request, query head): merge the splits, weighting each by exp(lse_split - lse_max).
     With one split (large batches) stage 1 writes the output itself and stage 2 does not run.
Reading each K/V page once per KV head (not per query head) is what keeps the kernel at the
memory-bandwidth roofline for GQA models. Pages are read through the page table (PagedAttention,
Kwon et al. 2023); the split ranges are computed on the device from seq_lens, so one launch shape
serves every sequence length (CUDA-graph friendly).

An optional per-request kv_start restricts the attention to positions [kv_start, seq_len); cascade
decode attention (cascade_attention.py) uses it for the private suffix of requests whose shared
prefix it attends to separately, and reuses both stages (run_split_stage, run_merge_stage).
"""

from __future__ import annotations

import functools
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
from .attention_configs import F16_KV_DOTS, attention_config, warp_split_error
from .paged_loop import paged_attn_loop, paged_attn_loop_ws
from .paged_loop_fp8 import paged_attn_fp8_operands
from .pdl import gdc_enter, launch_options, use_pdl

LOG2E = 1.4426950408889634
H200_NUM_SMS = 132


# Ints that vary from pass to pass are not specialised (Triton would compile a variant per value
# class: == 1, divisible by 16): the split counts and the workspace strides that follow them.
SPLIT_INTS = ["num_splits", "num_prefix_splits", "stride_mo_b", "stride_mo_h", "stride_mo_s",
              "stride_ml_b", "stride_ml_h"]


@triton.jit(do_not_specialize=SPLIT_INTS)
def _decode_split_kernel(
    q, k_buf, v_buf, page_table, seq_lens, kv_start, mid_o, mid_lse, o,
    qk_scale, v_scale, num_splits, num_prefix_splits,
    stride_q_b, stride_q_h, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h, stride_pt_b,
    stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h, stride_o_b, stride_o_h,
    GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HAS_KV_START: tl.constexpr, DIRECT_OUT: tl.constexpr,
    MERGE_PREFIX: tl.constexpr, PREFIX_SLOTS: tl.constexpr, KV_DOT: tl.constexpr,
    USE_PDL: tl.constexpr = False, PEEL_TAIL: tl.constexpr = 0, WARP_SPLIT: tl.constexpr = 0,
):
    # DIRECT_OUT (num_splits == 1): the program covers the whole range, so it writes the normalised
    # output to o itself and no merge stage runs (H200, 2026-11-30, batch 256 x 768 tokens: 101.7
    # against 109.9 us for split + merge). MERGE_PREFIX (cascade, with DIRECT_OUT): before
    # that, it folds in the prefix partials that the cascade prefix stage left in mid slots
    # 1 .. num_prefix_splits of rows with kv_start > 0 (log-sum-exp merge), so the cascade needs
    # two launches instead of three.
    split = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    gdc_enter(USE_PDL)  # kernels/pdl.py
    # this split's token range within [first, seq_len), a whole number of BLOCK_N blocks long (the
    # last split may be short or empty)
    seq_len = tl.load(seq_lens + b)
    first = 0
    if HAS_KV_START:
        first = tl.minimum(tl.load(kv_start + b), seq_len)
    split_len = tl.cdiv(tl.cdiv(seq_len - first, num_splits), BLOCK_N) * BLOCK_N
    start = first + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_H)
    heads = kvh * GROUP + offs_g
    mask_h = offs_g < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    # the group's queries [BLOCK_H, BLOCK_D]; padding rows are zero and never stored
    qg = tl.load(q + b * stride_q_b + heads[:, None] * stride_q_h + offs_d[None, :],
                 mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    # stream [start, end) once for the whole group (page ids loaded one step ahead)
    if KV_DOT == "fp8" or KV_DOT == "fp8x2" or KV_DOT == "qk8":
        # FP8 pool with e4m3 MMA operands (paged_loop_fp8.py; not the default, see there)
        m_i, l_i, acc = paged_attn_fp8_operands(
            qg, qk_scale, k_buf, v_buf, page_table + b * stride_pt_b, kvh, start, end, stride_kb_s,
            stride_kb_h, stride_vb_s, stride_vb_h, BLOCK_H, PAGE_SIZE, HEAD_DIM, BLOCK_D, BLOCK_N, KV_DOT)
    else:
        if KV_DOT == "f16" or KV_DOT == "f16v" or KV_DOT == "f16v8":
            # FP8 pool, kv_dot "f16" / "f16v" / "f16v8": both dots in fp16 (the loop widens K/V and P
            # to qg's dtype; "f16v" widens V before its dot, "f16v8" from 8-byte pieces:
            # paged_attn_loop's V_WIDEN 1 / 2).
            # e4m3 -> fp16 is exact and one packed cvt per two values; -> bf16 costs three cvts per
            # two values, which bounded the kernel below the bandwidth. q is clamped to fp16's range.
            qg = tl.clamp(qg.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        pt_row = page_table + b * stride_pt_b
        if WARP_SPLIT:  # each block's keys split across the WARP_SPLIT warps (paged_attn_loop_ws)
            m_i, l_i, acc = paged_attn_loop_ws(qg, k_buf, v_buf, pt_row, kvh, start, end,
                                               qk_scale, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
                                               BLOCK_H, PAGE_SIZE, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PRECISION,
                                               WARP_SPLIT)
        else:
            m_i, l_i, acc = paged_attn_loop(qg, k_buf, v_buf, pt_row, kvh, start, end,
                                            qk_scale, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
                                            BLOCK_H, PAGE_SIZE, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PRECISION,
                                            1 if KV_DOT == "f16v" else 2 if KV_DOT == "f16v8" else 0,
                                            PEEL_TAIL)
    acc = acc * v_scale  # an FP8 pool's per-layer V scale (1.0 otherwise; k_scale is in qk_scale)

    if MERGE_PREFIX:
        # a prefix partial (o_p normalised, lse_p = log2 of its softmax sum) is the state
        # (m = lse_p, l = 1, acc = o_p); empty prefix splits have lse_p = -inf and weigh nothing
        # unrolled over PREFIX_SLOTS >= num_prefix_splits (a power of two), so the independent loads
        # of the partials can all be in flight at once; slots past the count are masked off
        n_prefix = tl.where(tl.load(kv_start + b) > 0, num_prefix_splits, 0)
        for sp in tl.static_range(PREFIX_SLOTS):
            use = sp < n_prefix
            lse_p = tl.load(mid_lse + b * stride_ml_b + heads * stride_ml_h + num_splits + sp,
                            mask=mask_h & use, other=float("-inf"))
            o_p = tl.load(mid_o + b * stride_mo_b + heads[:, None] * stride_mo_h
                          + (num_splits + sp) * stride_mo_s + offs_d[None, :],
                          mask=(mask_h[:, None] & mask_d[None, :]) & use, other=0.0)
            m_new = tl.maximum(m_i, lse_p)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_ref)
            w_p = tl.exp2(lse_p - m_ref)
            l_i = l_i * alpha + w_p
            acc = acc * alpha[:, None] + o_p * w_p[:, None]
            m_i = m_new

    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if DIRECT_OUT:  # the final output (a row with no keys at all is zero)
        tl.store(o + b * stride_o_b + heads[:, None] * stride_o_h + offs_d[None, :],
                 out.to(o.dtype.element_ty), mask=mask_h[:, None] & mask_d[None, :])
    else:  # partial result and its log2-sum-exp; an empty split writes zeros and lse = -inf
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(mid_o + b * stride_mo_b + heads[:, None] * stride_mo_h + split * stride_mo_s
                 + offs_d[None, :], out, mask=mask_h[:, None] & mask_d[None, :])
        tl.store(mid_lse + b * stride_ml_b + heads * stride_ml_h + split, lse, mask=mask_h)


@triton.jit(do_not_specialize=SPLIT_INTS)
def _decode_merge_kernel(
    mid_o, mid_lse, o, kv_start, num_splits, num_prefix_splits,
    stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h, stride_o_b, stride_o_h,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, HAS_PREFIX: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    h = tl.program_id(0)
    b = tl.program_id(1)
    gdc_enter(USE_PDL)  # kernels/pdl.py
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    # the suffix splits, then (cascade only) the prefix splits of rows whose prefix was done apart;
    # rows with kv_start == 0 never read the prefix slots, which may hold garbage
    num_used = num_splits
    if HAS_PREFIX:
        num_used += tl.where(tl.load(kv_start + b) > 0, num_prefix_splits, 0)
    mask_s = offs_s < num_used
    mask_d = offs_d < HEAD_DIM
    # weights of the splits relative to the largest lse (all-empty row: weights 0, output 0)
    lse = tl.load(mid_lse + b * stride_ml_b + h * stride_ml_h + offs_s, mask=mask_s, other=float("-inf"))
    lse_max = tl.max(lse, 0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    w = tl.exp2(lse - lse_max)
    # weighted sum of the partial outputs [BLOCK_S, BLOCK_D]
    parts = tl.load(mid_o + b * stride_mo_b + h * stride_mo_h + offs_s[:, None] * stride_mo_s
                    + offs_d[None, :], mask=mask_s[:, None] & mask_d[None, :], other=0.0)
    w_sum = tl.sum(w, 0)
    out = tl.sum(parts * w[:, None], 0) / tl.where(w_sum > 0.0, w_sum, 1.0)
    tl.store(o + b * stride_o_b + h * stride_o_h + offs_d, out.to(o.dtype.element_ty), mask=mask_d)


def _merge_block_s(num_kv_splits: int, num_prefix_splits: int) -> int:
    """Split slots the merge kernel reads at once (a compile-time size). Cascade passes use at least
    32, so that their varying split counts reuse one compiled variant (warmed up at start)."""
    n = next_pow2(num_kv_splits + num_prefix_splits)
    return max(32, n) if num_prefix_splits else n


def _pick_config(head_dim: int, group: int, device: torch.device, merge_prefix: bool = False,
                 kv_fp8: bool = False) -> dict:
    """Blocks and warps for stage 1: BLOCK_N / num_warps / num_stages from the config table
    (attention_configs, kind "decode", "decode_fp8" over an FP8 pool, or "decode_fused" for the
    fused cascade form that also merges the prefix partials), and KV_DOT: the operand form of the
    two dots, decode_fp8's kv_dot over an FP8 pool ("q" otherwise: the pool's values in q's dtype).
    BLOCK_H pads the GQA group to >= 16 rows (tl.dot minimum)."""
    on_gpu = device.type == "cuda"
    cfg = {"BLOCK_D": next_pow2(head_dim), "BLOCK_H": max(16, next_pow2(group)), "KV_DOT": "q"}
    if kv_fp8:
        fp8 = attention_config("decode_fp8", head_dim, on_gpu)
        cfg["KV_DOT"] = fp8.pop("kv_dot")
        if not merge_prefix:
            return {**cfg, **fp8}
    kind = "decode_fused" if merge_prefix else "decode"
    return {**cfg, **attention_config(kind, head_dim, on_gpu)}


def launch_warps(cfg: dict, programs: int, num_sms: int) -> int:
    """Warps per program of a split-stage launch of `programs` programs: launch_config's num_warps.
    H200, 2026-12-03: 8 warps ran 64 x 4,096 (256 programs) in 138.8 against 142.2 us with 4, but
    256 x 768 (1,024 programs) in 113.8 against 110.8."""
    return launch_config(cfg, programs, num_sms)["num_warps"]


def warp_split(cfg: dict) -> int:
    """The WARP_SPLIT of a split-stage launch: its num_warps when the config sets warp_split (each
    block's keys split across the warps, kernels/paged_loop.py paged_attn_loop_ws), else 0. Raises
    ValueError when the config cannot take it (attention_configs.warp_split_error: kv_dot other than
    "q" / "f16", or BLOCK_N not num_warps sub-blocks of a power of two >= 16 positions; overrides
    are checked the same way at load)."""
    if not cfg.get("warp_split"):
        return 0
    err = warp_split_error(int(cfg["BLOCK_N"]), int(cfg["num_warps"]), cfg.get("KV_DOT", "q"))
    check(err is None, err or "")
    return int(cfg["num_warps"])


def launch_variant(cfg: dict, programs: int, num_sms: int, split_tokens: int | None = None) -> str:
    """Which config a split-stage launch of `programs` programs, each over at most `split_tokens`
    keys (None: unknown), takes: "long" when the config sets long_min_tokens (> 0) and "long"
    entries and split_tokens is known and at least that; else "many" when the config has "many"
    entries or num_warps_many, the launch has more than many_per_sm programs per SM (many_per_sm 0
    or absent: never) and, where the config sets many_max_tokens, split_tokens is known and at most
    that; else "" (the config itself). Never raises."""
    long_min = cfg.get("long_min_tokens", 0)
    if long_min and cfg.get("long") and split_tokens is not None and split_tokens >= long_min:
        return "long"
    many = cfg.get("many_per_sm", 0)
    if not many or programs <= many * num_sms or not (cfg.get("many") or "num_warps_many" in cfg):
        return ""
    max_tokens = cfg.get("many_max_tokens", 0)
    if max_tokens and (split_tokens is None or split_tokens > max_tokens):
        return ""
    return "many"


def launch_config(cfg: dict, programs: int, num_sms: int, split_tokens: int | None = None) -> dict:
    """The config of a split-stage launch (launch_variant): `cfg` itself, or a copy with the entries
    of "long" (long splits; kind "decode_fp8": BLOCK_N, num_warps, num_stages, kv_dot, warp_split),
    or with num_warps_many as num_warps (kind "decode") and the entries of "many" in place of the
    config's. Never raises on a validated config (attention_configs checks overrides)."""
    variant = launch_variant(cfg, programs, num_sms, split_tokens)
    if not variant:
        return cfg
    out = dict(cfg)
    if variant == "many" and "num_warps_many" in cfg:
        out["num_warps"] = cfg["num_warps_many"]
    for key, value in cfg.get(variant, {}).items():
        out["KV_DOT" if key == "kv_dot" else key] = value
    return out


def decode_launch_variant(batch_size: int, num_kv_heads: int, head_dim: int, num_kv_splits: int,
                          max_seq_len: int | None, kv_fp8: bool, device: torch.device) -> str:
    """The launch_variant ("", "many" or "long") a plain decode_attention call of this shape
    (max_seq_len passed as given) launches its split stage with (the GQA group does not enter),
    with "+ws" appended where the shape routes to the Gluon kernel (_ws_shape_rule): part of what a
    CUDA graph bakes in besides the split count (worker/attention_triton.py's decode_graph_key), so
    a graph captured at a long length class is not replayed for a shorter one that takes the other
    kernel. Never raises on a validated config table."""
    cfg = _pick_config(head_dim, 1, device, False, kv_fp8)
    tokens = None if max_seq_len is None else triton.cdiv(max_seq_len, num_kv_splits)
    variant = launch_variant(cfg, num_kv_splits * num_kv_heads * batch_size, _num_sms(device), tokens)
    routed = _ws_shape_rule(head_dim, num_kv_splits, max_seq_len, kv_fp8, device)
    return variant + "+ws" if routed else variant


@functools.cache
def _num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (H200_NUM_SMS elsewhere)."""
    if device.type != "cuda":
        return H200_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _splits_by_waves(work: int, seq_len: int, cap: int, num_sms: int, occupancy: int,
                     merge_tokens: int, program_tokens: int = 0) -> int:
    """The split count s in 1..cap that minimises (waves of programs) x (tokens per program +
    `program_tokens`, a program's fixed cost) plus `merge_tokens` for the merge stage when s > 1: a
    model of the tail of the last wave, where occupancy programs fit on an SM at once. The fixed
    cost keeps it from trading a few waves of long programs for many waves of short ones to fill
    the last wave's tail (a small gain on paper, a loss when the sequences are shorter than
    seq_len and most of the programs are empty)."""
    best, best_cost = 1, float("inf")
    for s in range(1, cap + 1):
        waves = triton.cdiv(work * s, max(1, num_sms * occupancy))
        cost = waves * (triton.cdiv(seq_len, s) + program_tokens) + (merge_tokens if s > 1 else 0)
        if cost < best_cost:
            best, best_cost = s, cost
    return best


def choose_num_kv_splits(batch_size: int, num_kv_heads: int, max_seq_len: int,
                         num_sms: int = H200_NUM_SMS, max_splits: int = 64, head_dim: int = 128,
                         kv_fp8: bool = False) -> int:
    """Number of KV splits for stage 1, from host ints only (no device sync).

    The rule is the config table's "decode_splits" entry (attention_configs) for head_dim, or
    "decode_splits_fp8" with kv_fp8 (an FP8 pool: half the bytes per token). Policy
    "per_sm" (the d64 / d256 default): aim for `programs_per_sm` (4) programs per SM over
    (request, KV head, split), but give each split at least `min_split_tokens` (128), so short
    sequences are not cut into slivers whose merge costs more than it saves. (4 per SM and the cap
    of 64 were the best of 2-16 per SM and caps 64 / 128 on an H200, 2026-11-29, over 6 batch x
    context shapes.) Policy "waves":
    _splits_by_waves with the entry's occupancy, merge_tokens and program_tokens, under the same caps
    (the d128 default since 2026-12-03, and FP8 pools').
    bench/kernels/sweep_kernels.py times both policies.
    The result depends only on the arguments, so a CUDA graph captured with max_seq_len set to the
    longest sequence it will replay stays valid (the kernel clips the split ranges on the device).
    """
    rule = attention_config("decode_splits_fp8" if kv_fp8 else "decode_splits", head_dim)
    work = max(1, batch_size * num_kv_heads)
    by_len = triton.cdiv(max(1, max_seq_len), max(1, int(rule["min_split_tokens"])))
    cap = max(1, min(by_len, max_splits))
    if rule["policy"] == "waves":
        return _splits_by_waves(work, max(1, max_seq_len), cap, num_sms, int(rule["occupancy"]),
                                int(rule["merge_tokens"]), int(rule["program_tokens"]))
    check(rule["policy"] == "per_sm", f"unknown decode_splits policy {rule['policy']!r}")
    want = triton.cdiv(int(rule["programs_per_sm"]) * num_sms, work)
    return int(max(1, min(want, cap)))


def check_mid(mid_o: torch.Tensor | None, mid_lse: torch.Tensor | None, shape: tuple[int, int, int],
              head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The split workspaces: given ones are checked (fp32 [*shape, D] and [*shape], contiguous last
    dim), missing ones allocated."""
    if mid_o is None:
        mid_o = torch.empty((*shape, head_dim), dtype=torch.float32, device=device)
    if mid_lse is None:
        mid_lse = torch.empty(shape, dtype=torch.float32, device=device)
    check(mid_o.shape == (*shape, head_dim) and mid_o.dtype == torch.float32 and mid_o.stride(-1) == 1
          and mid_o.device == device, f"mid_o must be fp32 {(*shape, head_dim)} on {device}")
    check(mid_lse.shape == shape and mid_lse.dtype == torch.float32 and mid_lse.stride(-1) == 1
          and mid_lse.device == device, f"mid_lse must be fp32 {shape} on {device}")
    return mid_o, mid_lse


def run_split_stage(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, page_table: torch.Tensor,
                    seq_lens: torch.Tensor, kv_start: torch.Tensor | None, page_size: int, qk_scale: float,
                    num_kv_splits: int, mid_o: torch.Tensor, mid_lse: torch.Tensor,
                    out: torch.Tensor | None = None, num_prefix_splits: int = 0,
                    v_scale: float = 1.0, max_seq_len: int | None = None) -> None:
    """Stage 1 on checked arguments: splits 0..num_kv_splits-1 of [kv_start, seq_len) into
    mid_o[:, :, :num_kv_splits] / mid_lse (qk_scale already includes log2(e) and an FP8 pool's
    k_scale; v_scale multiplies the values read from the pool).

    With `out` (only for num_kv_splits == 1) the single split writes the final output to out instead,
    first merging, when num_prefix_splits > 0, the prefix partials in mid slots
    1 .. num_prefix_splits of rows with kv_start > 0 (cascade); no merge stage is needed then.
    max_seq_len (host int or None) bounds the keys per split for launch_config."""
    batch_size, num_q_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    direct = out is not None
    check(not direct or num_kv_splits == 1, "a direct output needs num_kv_splits == 1")
    merge_prefix = direct and kv_start is not None and num_prefix_splits > 0
    cfg = _pick_config(head_dim, num_q_heads // num_kv_heads, q.device, merge_prefix,
                       k_buffer.dtype == FP8_DTYPE)
    tokens = None if max_seq_len is None else triton.cdiv(max_seq_len, num_kv_splits)
    cfg = launch_config(cfg, num_kv_splits * num_kv_heads * batch_size, _num_sms(q.device), tokens)
    o = out if direct else q  # (o is not read unless DIRECT_OUT)
    pdl = use_pdl(q)
    _decode_split_kernel[(num_kv_splits, num_kv_heads, batch_size)](
        q, k_buffer, v_buffer, page_table, seq_lens, seq_lens if kv_start is None else kv_start,
        mid_o, mid_lse, o,
        qk_scale, float(v_scale), num_kv_splits, num_prefix_splits,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), page_table.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        o.stride(0), o.stride(1),
        GROUP=num_q_heads // num_kv_heads, PAGE_SIZE=page_size,
        HEAD_DIM=head_dim, BLOCK_D=cfg["BLOCK_D"], BLOCK_H=cfg["BLOCK_H"], BLOCK_N=cfg["BLOCK_N"],
        DOT_PRECISION=dot_precision(torch.float16 if cfg["KV_DOT"] in F16_KV_DOTS else q.dtype),
        HAS_KV_START=kv_start is not None, DIRECT_OUT=direct, MERGE_PREFIX=merge_prefix,
        PREFIX_SLOTS=next_pow2(num_prefix_splits) if merge_prefix else 0, KV_DOT=cfg["KV_DOT"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], USE_PDL=pdl,
        PEEL_TAIL=int(cfg.get("peel_tail", 0)) if cfg["BLOCK_D"] == head_dim else 0,
        WARP_SPLIT=warp_split(cfg), **launch_options(pdl),
    )


def run_merge_stage(mid_o: torch.Tensor, mid_lse: torch.Tensor, out: torch.Tensor, num_kv_splits: int,
                    kv_start: torch.Tensor | None = None, num_prefix_splits: int = 0) -> None:
    """Stage 2 on checked arguments: out[b, h] = merge of slots [0, num_kv_splits) of mid_o/mid_lse,
    plus slots [num_kv_splits, num_kv_splits + num_prefix_splits) where kv_start[b] > 0."""
    batch_size, num_q_heads, head_dim = out.shape
    has_prefix = kv_start is not None and num_prefix_splits > 0
    pdl = use_pdl(out)
    _decode_merge_kernel[(num_q_heads, batch_size)](
        mid_o, mid_lse, out, kv_start if has_prefix else mid_lse, num_kv_splits, num_prefix_splits,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=next_pow2(head_dim),
        BLOCK_S=_merge_block_s(num_kv_splits, num_prefix_splits if has_prefix else 0), HAS_PREFIX=has_prefix,
        num_warps=4, USE_PDL=pdl, **launch_options(pdl),
    )


# decode over an FP8 pool takes the Gluon kernel (decode_attention_ws) from this length (class) on: on
# an H200 it took 0.91-0.94x the Triton FP8 kernel's time at 64 x 4,096 and 1.03-1.05x at 128 x 2,048
# (its per-program set-up paid over half the keys; both take one split there)
DECODE_WS_MIN_SEQ = 4096


@functools.cache
def _gluon_decode_device(device: torch.device) -> bool:
    """A Hopper GPU, with Gluon's Hopper API in this Triton (>= 3.6)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if torch.cuda.get_device_capability(index)[0] != 9:
        return False
    try:
        from . import decode_attention_ws  # noqa: F401
    except (ImportError, AttributeError):
        return False
    return True


def _ws_shape_rule(head_dim: int, num_kv_splits: int, max_seq_len: int | None, kv_fp8: bool,
                   device: torch.device) -> bool:
    """The part of the Gluon decode route that follows from the launch shape alone, so that a CUDA
    graph's key can carry it (decode_launch_variant): one split over an FP8 pool, head dim 128, a
    known max_seq_len >= DECODE_WS_MIN_SEQ, RADIXRT_DECODE_WS not "0", a Hopper GPU."""
    return (kv_fp8 and num_kv_splits == 1 and head_dim == 128 and max_seq_len is not None
            and max_seq_len >= DECODE_WS_MIN_SEQ and switches.decode_ws()
            and _gluon_decode_device(device))


def _use_ws(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, page_table: torch.Tensor,
            seq_lens: torch.Tensor, page_size: int, out: torch.Tensor, max_seq_len: int | None) -> bool:
    """Whether a one-split decode without kv_start routes to the Gluon kernel of
    decode_attention_ws: _ws_shape_rule, int32 page table and seq_lens, not Triton's interpreter,
    and the tensors that kernel's `supported` accepts."""
    if not _ws_shape_rule(q.shape[-1], 1, max_seq_len, k_buffer.dtype == FP8_DTYPE, q.device):
        return False
    if not gluon_route_open(q, True, (page_table, seq_lens), ()):
        return False
    from . import decode_attention_ws as ws

    return ws.supported(q, k_buffer, v_buffer, page_size, out)


def check_decode_args(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                      page_table: torch.Tensor, seq_lens: torch.Tensor, kv_start: torch.Tensor | None,
                      page_size: int, num_kv_splits: int) -> None:
    """Shape/dtype/device checks shared by decode_attention and cascade_decode_attention."""
    check(q.dim() == 3, f"q must be [B, Hq, D], got {tuple(q.shape)}")
    batch_size, num_q_heads, head_dim = q.shape
    check(k_buffer.dim() == 3, "k_buffer must be [S, Hkv, D]")
    num_kv_heads = k_buffer.shape[1]
    check(num_kv_heads >= 1 and num_q_heads % num_kv_heads == 0,
          f"Hq={num_q_heads} is not a multiple of Hkv={num_kv_heads}")
    check_pool(k_buffer, v_buffer, num_kv_heads, head_dim)
    check(page_table.dim() == 2 and page_table.shape[0] == batch_size
          and page_table.dtype in (torch.int32, torch.int64),
          f"page_table must be [{batch_size}, P] int32/int64")
    check(page_table.stride(-1) == 1, "page_table rows must be contiguous")
    check_int_vector(seq_lens, "seq_lens", batch_size)
    if kv_start is not None:
        check_int_vector(kv_start, "kv_start", batch_size)
    check_page_size(page_size)
    check(isinstance(num_kv_splits, int) and num_kv_splits >= 1, f"bad num_kv_splits {num_kv_splits!r}")
    check(k_buffer.dtype in (q.dtype, FP8_DTYPE), f"q is {q.dtype} but the pool is {k_buffer.dtype}")
    check(q.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {q.dtype}")
    check(q.stride(-1) == 1, "q must have a contiguous last dim")
    for t in (k_buffer, v_buffer, page_table, seq_lens, kv_start):
        check(t is None or t.device == q.device, f"all tensors must be on {q.device}")


def check_out(out: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """The output buffer: given one checked ([B, Hq, D] in q's dtype, contiguous last dim), else allocated."""
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    check(out.shape == q.shape and out.dtype == q.dtype and out.stride(-1) == 1 and out.device == q.device,
          "bad out buffer")
    return out


def decode_attention(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, page_table: torch.Tensor,
    seq_lens: torch.Tensor, page_size: int, scale: float | None, num_kv_splits: int,
    out: torch.Tensor | None = None, mid_o: torch.Tensor | None = None,
    mid_lse: torch.Tensor | None = None, kv_start: torch.Tensor | None = None,
    k_scale: float = 1.0, v_scale: float = 1.0, max_seq_len: int | None = None,
) -> torch.Tensor:
    """Attention of one new query token per request over its cached sequence.

    q                 : [B, Hq, D]  (last dim contiguous; any row/head strides)
    k_buffer, v_buffer: [S, Hkv, D] one layer of the pool; must already hold the new token's K/V
    page_table        : [B, P] int32/int64, P * page_size >= seq_len
    seq_lens          : [B] int32/int64 tokens to attend to (0 gives a zero output row)
    page_size         : tokens per page;  scale: softmax scale (default 1/sqrt(D))
    num_kv_splits     : host int >= 1 (see choose_num_kv_splits); fixes the grid
    out               : optional [B, Hq, D] output (q's dtype)
    mid_o, mid_lse    : optional fp32 workspaces [B, Hq, num_kv_splits, D] and [B, Hq, num_kv_splits]
                        (pass views of preallocated memory to avoid allocations under CUDA graphs)
    kv_start          : optional [B] int32/int64: attend to positions [kv_start, seq_len) only (the
                        splits then cover that range; kv_start >= seq_len gives a zero row). None
                        (default) means 0, with the same code and speed as before it existed.
    k_scale, v_scale  : host floats, the per-layer scales of an FP8 (float8_e4m3fn) pool: the
                        pool holds K / k_scale and V / v_scale (store_kv); 1.0 for other pools.
                        An FP8 pool's split stage takes the "decode_fp8" config: with kv_dot
                        "f16" (GPU default) q is rounded to fp16 (clamped to +-65504) and both
                        dots run in fp16, whatever q's dtype
    max_seq_len       : optional host int >= every seq_len (a CUDA graph's length class): lets
                        launch_config pick an FP8 pool's config for many short splits or for long
                        ones (None: neither is picked; a bf16 pool's warp switch needs no length and
                        applies either way)
    Returns o [B, Hq, D] in q's dtype. Raises ValueError on bad shapes/dtypes/devices.

    On Hopper, one split over an FP8 pool without kv_start, with int32 metadata and max_seq_len >=
    DECODE_WS_MIN_SEQ (4,096), runs the warp-specialized Gluon kernel of decode_attention_ws instead
    of the split kernel (same result within rounding; RADIXRT_DECODE_WS=0 keeps the split kernel).
    """
    check_decode_args(q, k_buffer, v_buffer, page_table, seq_lens, kv_start, page_size, num_kv_splits)
    batch_size, num_q_heads, head_dim = q.shape
    out = check_out(out, q)
    mid_o, mid_lse = check_mid(mid_o, mid_lse, (batch_size, num_q_heads, num_kv_splits), head_dim, q.device)
    if batch_size == 0:
        return out
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    qk_scale = scale * LOG2E * float(k_scale)
    if num_kv_splits == 1 and kv_start is None and _use_ws(q, k_buffer, v_buffer, page_table, seq_lens,
                                                          page_size, out, max_seq_len):
        from . import decode_attention_ws as ws

        return ws.decode_attention_ws(q, k_buffer, v_buffer, page_table, seq_lens, page_size, qk_scale,
                                      float(v_scale), out)
    if num_kv_splits == 1:  # one split covers everything: it writes the output, no merge stage
        run_split_stage(q, k_buffer, v_buffer, page_table, seq_lens, kv_start, page_size, qk_scale,
                        1, mid_o, mid_lse, out=out, v_scale=v_scale, max_seq_len=max_seq_len)
        return out
    run_split_stage(q, k_buffer, v_buffer, page_table, seq_lens, kv_start, page_size, qk_scale,
                    num_kv_splits, mid_o, mid_lse, v_scale=v_scale, max_seq_len=max_seq_len)
    run_merge_stage(mid_o, mid_lse, out, num_kv_splits)
    return out
