"""CPU attention over the paged K/V pool with torch's fused SDPA kernels (the default on CPU).

Per pass (`prepare`, one read of the lengths and page-table rows on the host) each request gets a
plan: where its K/V rows [0, seq_len) live in the pool and which mask its queries need. Per layer
(`forward`): store the new K/V at out_cache_loc, then one `scaled_dot_product_attention` call per
request (torch's CPU flash-attention kernel, FlashAttention-2-style blocked online softmax, GQA
through `enable_gqa` so K/V heads are never repeated).

Where a request's K/V comes from (cheapest first):
- extend with no cached prefix: the pass's own k/v (strided views of the QKV output), causal; the
  pool is only written.
- pages consecutive in the pool (a prompt prefilled into freshly allocated pages, the common case):
  one strided view `buf[first_slot : first_slot + seq_len]`, no copy.
- otherwise: one `index_select` of whole pages (`page_size` rows per copy, not a row per token),
  then a view of its first seq_len rows.
Queries of an extend over a cached prefix see keys up to their own position: a bool mask
[extend_len, seq_len] aligned to the bottom right, built once per pass and shared by all layers.

The plain reference (`attention_torch.TorchAttnBackend`) stays the tests' oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from radixrt.attention.base import AttentionBackend, ForwardMeta, KVPool


@dataclass(slots=True)
class _ReqPlan:
    """One request's share of a pass: its query rows [start, start + extend_len) of q."""

    start: int
    extend_len: int
    seq_len: int
    first_slot: int  # >= 0: K/V rows are pool slots [first_slot, first_slot + seq_len); -1: gather
    pages: torch.Tensor | None  # [n_pages] int64 pages to gather when first_slot < 0
    mask: torch.Tensor | None  # [extend_len, seq_len] bool (extend over a prefix), else None
    from_new: bool  # no cached prefix: attend the pass's own k/v, causal


def _plan(start: int, ext: int, seq: int, row: np.ndarray, page_size: int) -> _ReqPlan:
    """Plan of one request from its lengths and page-table row (host int32 numpy)."""
    prefix = seq - ext
    if prefix == 0 and ext > 0:
        return _ReqPlan(start, ext, seq, -1, None, None, True)
    n_pages = -(-seq // page_size)
    pages = row[:n_pages]
    mask = None
    if ext > 1:  # key j is visible to query i (at position prefix + i) when j <= prefix + i
        mask = torch.arange(seq)[None, :] <= (prefix + torch.arange(ext))[:, None]
    if n_pages == 1 or bool(np.all(np.diff(pages) == 1)):
        return _ReqPlan(start, ext, seq, int(pages[0]) * page_size, None, mask, False)
    return _ReqPlan(start, ext, seq, -1, torch.from_numpy(pages.astype(np.int64)), mask, False)


class SdpaAttnBackend(AttentionBackend):
    """Implements attention.base.AttentionBackend on CPU with `F.scaled_dot_product_attention`.

    Args:
        pool: the paged K/V pool (k_buffers / v_buffers per layer, `[num_slots, Hkv, D]`).

    `prepare` syncs with the host (it reads lengths and page-table rows), so this backend cannot be
    captured in a CUDA graph; it also runs on CUDA tensors (SDPA dispatches there) but the worker
    uses it on CPU only. Exact against the reference up to fp32 rounding (tests/worker).
    """

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.meta: ForwardMeta | None = None
        self.plans: list[_ReqPlan] = []

    def prepare(self, meta: ForwardMeta) -> None:
        """Plan each request of the pass (where its K/V lives, its mask); see the module docstring."""
        self.meta = meta
        seq_lens = meta.seq_lens.tolist()
        ext_lens = meta.extend_lens.tolist()
        starts = meta.extend_start_loc.tolist()
        max_pages = -(-max(seq_lens, default=0) // meta.page_size)
        table = meta.page_table[:, :max_pages].cpu().numpy()  # [B, used pages] int32
        self.plans = [_plan(starts[b], ext_lens[b], seq_lens[b], table[b], meta.page_size)
                      for b in range(len(seq_lens))]

    def _kv(self, buf: torch.Tensor, new: torch.Tensor, p: _ReqPlan) -> torch.Tensor:
        """K or V of request `p` as [1, Hkv, seq_len, D] (a view where possible), dtype of `new`."""
        if p.from_new:
            rows = new[p.start:p.start + p.extend_len]
        elif p.first_slot >= 0:
            rows = buf[p.first_slot:p.first_slot + p.seq_len]
        else:
            ps = self.meta.page_size
            by_page = buf.view(-1, ps * buf.shape[1] * buf.shape[2])  # [num_pages, ps * Hkv * D]
            rows = by_page.index_select(0, p.pages).view(-1, buf.shape[1], buf.shape[2])[:p.seq_len]
        return rows.to(new.dtype).unsqueeze(0).transpose(1, 2)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                scale: float) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> o [T, Hq, D]; stores k/v at meta.out_cache_loc first."""
        meta = self.meta
        k_buf, v_buf = self.pool.k_buffers[layer_id], self.pool.v_buffers[layer_id]
        k_buf.index_copy_(0, meta.out_cache_loc, k.to(k_buf.dtype))
        v_buf.index_copy_(0, meta.out_cache_loc, v.to(v_buf.dtype))
        o = torch.empty_like(q)
        for p in self.plans:
            if p.extend_len == 0:
                continue
            qb = q[p.start:p.start + p.extend_len].unsqueeze(0).transpose(1, 2)  # [1, Hq, L, D]
            ob = F.scaled_dot_product_attention(qb, self._kv(k_buf, k, p), self._kv(v_buf, v, p),
                                                attn_mask=p.mask, is_causal=p.from_new and p.extend_len > 1,
                                                scale=scale, enable_gqa=True)  # [1, Hq, L, D]
            o[p.start:p.start + p.extend_len] = ob[0].transpose(0, 1)
        return o
