"""Pure-torch references for every kernel in radixrt.kernels (slow, obviously correct, any device).

The attention references loop over requests, gather each request's keys/values position by
position through the page table (dequantized with the layer's scales for an FP8 pool), and compute
softmax attention in fp32 with an explicit causal mask.
"""

from __future__ import annotations

import math

import torch


def slots_of(page_table_row: torch.Tensor, page_size: int, start: int, end: int) -> torch.Tensor:
    """Slots of positions [start, end) of one request:
    page_table_row[pos // page_size] * page_size + pos % page_size."""
    pos = torch.arange(start, end, device=page_table_row.device)
    return page_table_row.long()[pos // page_size] * page_size + pos % page_size


FP8_KV = torch.float8_e4m3fn


def quantize_kv_ref(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x [..] float -> float8_e4m3fn: clamp(x * (1 / scale), +-448), rounded to nearest even (as
    kernels.store_kv stores into an FP8 pool; the reciprocal is taken in fp32 as the kernel does)."""
    inv = torch.tensor(1.0 / scale, dtype=torch.float32)
    return (x.float() * inv).clamp(-448.0, 448.0).to(FP8_KV)


def kv_rows(buffer: torch.Tensor, slots: torch.Tensor, scale: float) -> torch.Tensor:
    """Rows of a pool layer at `slots` as fp32 values: dequantized (x scale) for an FP8 pool."""
    rows = buffer[slots]
    return rows.float() * scale if buffer.dtype == FP8_KV else rows.float()


def store_kv_ref(k_buffer: torch.Tensor, v_buffer: torch.Tensor, out_cache_loc: torch.Tensor,
                 k: torch.Tensor, v: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """k_buffer[out_cache_loc] = k; v_buffer[out_cache_loc] = v (in place); quantized with the scales
    (quantize_kv_ref) into an FP8 pool."""
    if k_buffer.dtype == FP8_KV:
        k, v = quantize_kv_ref(k, k_scale), quantize_kv_ref(v, v_scale)
    k_buffer[out_cache_loc.long()] = k.to(k_buffer.dtype)
    v_buffer[out_cache_loc.long()] = v.to(v_buffer.dtype)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            q_pos: torch.Tensor) -> torch.Tensor:
    """q [M, Hq, D] at positions q_pos [M] over keys/values [N, Hkv, D] at positions 0..N-1, causal,
    fp32."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)  # [N, Hq, D]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k) * scale  # [Hq, M, N]
    visible = torch.arange(k.shape[0], device=q.device)[None, :] <= q_pos[:, None]  # [M, N]
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hmn,nhd->mhd", scores.softmax(dim=-1), v)


def extend_attention_ref(q, k_new, v_new, k_buffer, v_buffer, page_table, prefix_lens, extend_lens,
                         extend_start_loc, page_size: int, scale: float | None, k_scale: float = 1.0,
                         v_scale: float = 1.0) -> torch.Tensor:
    """Same contract as kernels.extend_attention; returns o [T, Hq, D] in q's dtype."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.zeros_like(q)
    for b in range(page_table.shape[0]):
        prefix_len, ext_len = int(prefix_lens[b]), int(extend_lens[b])
        start = int(extend_start_loc[b])
        if ext_len == 0:
            continue
        slots = slots_of(page_table[b], page_size, 0, prefix_len)
        k = torch.cat([kv_rows(k_buffer, slots, k_scale), k_new[start:start + ext_len].float()])
        v = torch.cat([kv_rows(v_buffer, slots, v_scale), v_new[start:start + ext_len].float()])
        q_pos = prefix_len + torch.arange(ext_len, device=q.device)
        out[start:start + ext_len] = _attend(q[start:start + ext_len], k, v, scale, q_pos).to(q.dtype)
    return out


def decode_attention_ref(q, k_buffer, v_buffer, page_table, seq_lens, page_size: int,
                         scale: float | None, kv_start=None, k_scale: float = 1.0,
                         v_scale: float = 1.0) -> torch.Tensor:
    """Same contract as kernels.decode_attention; returns o [B, Hq, D] (zero rows where seq_len == 0,
    or where kv_start >= seq_len when kv_start [B] restricts each row to positions [kv_start, seq_len))."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        seq_len = int(seq_lens[b])
        start = 0 if kv_start is None else min(int(kv_start[b]), seq_len)
        if seq_len == start:
            continue
        slots = slots_of(page_table[b], page_size, start, seq_len)
        q_pos = torch.tensor([seq_len - start - 1], device=q.device)
        k, v = kv_rows(k_buffer, slots, k_scale), kv_rows(v_buffer, slots, v_scale)
        out[b] = _attend(q[b:b + 1], k, v, scale, q_pos)[0].to(q.dtype)
    return out


def assert_groups_share_prefix(page_table, seq_lens, kv_start, group_members, group_starts, group_prefix_lens,
                               page_size: int) -> None:
    """AssertionError unless the cascade metadata is consistent: each request is in at most one group;
    members have kv_start == the group's prefix_len <= seq_len and the same pages for it (all of
    page_table[b, :cdiv(prefix_len, page_size)]); requests in no group have kv_start == 0."""
    starts = [int(x) for x in group_starts]
    members = [int(x) for x in group_members[: starts[-1]]]
    assert len(set(members)) == len(members), "a request is in two groups"
    for b in set(range(page_table.shape[0])) - set(members):
        assert int(kv_start[b]) == 0, f"request {b} is in no group but has kv_start {int(kv_start[b])}"
    for g, prefix_len in enumerate(int(x) for x in group_prefix_lens):
        rows = members[starts[g]:starts[g + 1]]
        num_pages = -(-prefix_len // page_size)
        for b in rows:
            assert int(kv_start[b]) == prefix_len <= int(seq_lens[b]), (
                f"request {b}: kv_start {int(kv_start[b])}, seq_len {int(seq_lens[b])}, "
                f"group prefix {prefix_len}")
            assert torch.equal(page_table[b, :num_pages], page_table[rows[0], :num_pages]), (
                f"request {b} does not share group {g}'s prefix pages")


def cascade_decode_attention_ref(q, k_buffer, v_buffer, page_table, seq_lens, kv_start, group_members,
                                 group_starts, group_prefix_lens, page_size: int,
                                 scale: float | None, k_scale: float = 1.0,
                                 v_scale: float = 1.0) -> torch.Tensor:
    """Same contract as kernels.cascade_decode_attention: checks the group metadata
    (assert_groups_share_prefix), then plain decode attention over each whole sequence, which is what
    the cascade must equal."""
    assert_groups_share_prefix(page_table, seq_lens, kv_start, group_members, group_starts, group_prefix_lens,
                               page_size)
    return decode_attention_ref(q, k_buffer, v_buffer, page_table, seq_lens, page_size, scale,
                                k_scale=k_scale, v_scale=v_scale)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, new_residual) as kernels.rms_norm: residual add rounded to x's dtype, statistics in fp32."""
    h = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    hf = h.float()
    out = hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return out.to(x.dtype), h


def apply_rotary_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX rotate-half RoPE; returns new (q, k) and leaves the inputs untouched."""
    half = cos_sin_cache.shape[1] // 2
    cos = cos_sin_cache[positions.long(), :half].float()[:, None, :]  # [T, 1, R/2]
    sin = cos_sin_cache[positions.long(), half:].float()[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float().clone()
        x1, x2 = xf[..., :half].clone(), xf[..., half:2 * half].clone()
        xf[..., :half] = x1 * cos - x2 * sin
        xf[..., half:2 * half] = x2 * cos + x1 * sin
        return xf.to(x.dtype)

    return rotate(q), rotate(k)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """silu(x[:, :I]) * x[:, I:] in fp32, cast back to x's dtype."""
    inter = x.shape[-1] // 2
    xf = x.float()
    return (torch.nn.functional.silu(xf[..., :inter]) * xf[..., inter:]).to(x.dtype)


def skinny_linear_ref(x: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight^T (+ bias) in fp32 from the (rounded) inputs, cast to x's dtype; as
    kernels.skinny_linear."""
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
