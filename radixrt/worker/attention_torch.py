"""Reference attention over the paged K/V pool in plain torch (CPU path, CI, and the oracle for kernels).

Per pass (`prepare`): split the batch into decode requests (extend_len == 1), which are attended in
padded groups, and extend requests, which are attended one at a time in query blocks; precompute
for each the K/V slots to gather (slot = page_table[b, p // page_size] * page_size + p % page_size
for p < seq_len) and the causal mask. Per layer (`forward`): store the new K/V at out_cache_loc,
gather, attend in float32. Work is chunked so that score tensors stay near `max_score_elems`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixrt.attention.base import AttentionBackend, ForwardMeta, KVPool


@dataclass(slots=True)
class _Group:
    """Requests attended together: their query rows in [T], K/V slots and validity mask."""

    q_index: torch.Tensor  # [G, L] int64 rows of q (padded rows point at row 0, masked out)
    q_valid: torch.Tensor  # [G, L] bool
    slots: torch.Tensor  # [G, S] int64 K/V slots (padding -> slot 0)
    mask: torch.Tensor  # [G, L, S] bool: query may attend key


class TorchAttnBackend(AttentionBackend):
    """Implements attention.base.AttentionBackend with gathers and dense masked softmax.

    Args:
        pool: the paged K/V pool (k_buffers / v_buffers per layer).
        max_score_elems: soft bound on G * L * S per attention call (memory of one score tensor
            per head is about 4 bytes times this).
    """

    def __init__(self, pool: KVPool, max_score_elems: int = 1 << 24) -> None:
        self.pool = pool
        self.max_score_elems = max_score_elems
        self.meta: ForwardMeta | None = None
        self.groups: list[_Group] = []

    def prepare(self, meta: ForwardMeta) -> None:
        """Precompute gather slots and masks for this pass (one host sync: reads the lengths)."""
        self.meta = meta
        seq_lens = meta.seq_lens.tolist()
        ext_lens = meta.extend_lens.tolist()
        starts = meta.extend_start_loc.tolist()
        decode = [i for i, e in enumerate(ext_lens) if e == 1]
        extend = [i for i, e in enumerate(ext_lens) if e > 1]
        self.groups = []
        for chunk in self._chunk_decode(decode, seq_lens):
            self.groups.append(self._build(chunk, seq_lens, ext_lens, starts, 0, 1))
        for i in extend:
            block = max(1, self.max_score_elems // max(seq_lens[i], 1))
            for q0 in range(0, ext_lens[i], block):
                q_len = min(block, ext_lens[i] - q0)
                self.groups.append(self._build([i], seq_lens, ext_lens, starts, q0, q_len))

    def _chunk_decode(self, rows: list[int], seq_lens: list[int]) -> list[list[int]]:
        chunks: list[list[int]] = []
        cur: list[int] = []
        cur_max = 0
        for i in rows:
            new_max = max(cur_max, seq_lens[i])
            if cur and (len(cur) + 1) * new_max > self.max_score_elems:
                chunks.append(cur)
                cur, new_max = [], seq_lens[i]
            cur.append(i)
            cur_max = new_max
        if cur:
            chunks.append(cur)
        return chunks

    def _build(self, rows: list[int], seq_lens: list[int], ext_lens: list[int], starts: list[int],
               q0: int, q_len: int) -> _Group:
        """Group for requests `rows`, query tokens q0..q0+q_len-1 of each (clipped to its extend_len)."""
        meta = self.meta
        dev = meta.page_table.device
        ps = meta.page_size
        rows_t = torch.tensor(rows, dtype=torch.int64, device=dev)
        seq = torch.tensor([seq_lens[i] for i in rows], dtype=torch.int64, device=dev)  # [G]
        ext = torch.tensor([ext_lens[i] for i in rows], dtype=torch.int64, device=dev)  # [G]
        start = torch.tensor([starts[i] for i in rows], dtype=torch.int64, device=dev)  # [G]
        s_max = max(seq_lens[i] for i in rows)
        kpos = torch.arange(s_max, device=dev)  # [S]
        table = meta.page_table[rows_t].long()  # [G, max_pages]
        pages = table[:, kpos // ps]  # [G, S]
        k_valid = kpos[None, :] < seq[:, None]  # [G, S]
        slots = torch.where(k_valid, pages * ps + kpos % ps, 0)
        j = q0 + torch.arange(q_len, device=dev)  # [L] index within each request's new tokens
        q_valid = j[None, :] < ext[:, None]  # [G, L]
        q_index = torch.where(q_valid, start[:, None] + j[None, :], 0)
        qpos = (seq - ext)[:, None] + j[None, :]  # [G, L] position of each query token
        mask = (kpos[None, None, :] <= qpos[:, :, None]) & k_valid[:, None, :] & q_valid[:, :, None]
        return _Group(q_index=q_index, q_valid=q_valid, slots=slots, mask=mask)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                scale: float) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> o [T, Hq, D]; stores k/v at meta.out_cache_loc first."""
        meta = self.meta
        k_buf, v_buf = self.pool.k_buffers[layer_id], self.pool.v_buffers[layer_id]
        k_buf[meta.out_cache_loc] = k.to(k_buf.dtype)
        v_buf[meta.out_cache_loc] = v.to(v_buf.dtype)
        o = torch.zeros_like(q)
        for g in self.groups:
            og = _attend(q[g.q_index], k_buf[g.slots], v_buf[g.slots], g.mask, scale)  # [G, L, Hq, D]
            o[g.q_index[g.q_valid]] = og[g.q_valid].to(o.dtype)
        return o


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
            scale: float) -> torch.Tensor:
    """Dense masked attention with GQA, in float32.

    q [G, L, Hq, D], k/v [G, S, Hkv, D], mask [G, L, S] bool -> [G, L, Hq, D] float32.
    Query head h reads KV head h // (Hq // Hkv). Fully masked rows (padding) give zeros.
    """
    g, l_len, hq, d = q.shape
    hkv = k.shape[2]
    qf = q.float().view(g, l_len, hkv, hq // hkv, d).permute(0, 2, 3, 1, 4)  # [G, Hkv, R, L, D]
    kf = k.float().permute(0, 2, 1, 3).unsqueeze(2)  # [G, Hkv, 1, S, D]
    vf = v.float().permute(0, 2, 1, 3).unsqueeze(2)  # [G, Hkv, 1, S, D]
    scores = (qf @ kf.transpose(-1, -2)) * scale  # [G, Hkv, R, L, S]
    m = mask[:, None, None, :, :]
    scores = scores.masked_fill(~m, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = probs @ vf  # [G, Hkv, R, L, D]
    return out.permute(0, 3, 1, 2, 4).reshape(g, l_len, hq, d)
