"""Per-pass metadata on the worker's device, and the attention-backend contract.

Built once per forward pass from a `protocol.ForwardBatch` (B requests, T new tokens) and handed
to every attention layer. Backends: `attention_torch.TorchAttnBackend` (CPU reference, CI) and
`attention_triton.TritonAttnBackend` (CUDA, kernels in `radixrt.kernels`).

KV layout (see docs/memory.md): per layer, K and V buffers `[num_slots, num_kv_heads, head_dim]`,
num_slots = num_pages * page_size, slot = page * page_size + offset. Page 0 is the sink for
padded tokens (e.g. CUDA-graph padding) and is never read by a real request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from radixrt.protocol import ForwardMode


@dataclass(slots=True)
class CascadeMeta:
    """Groups of decode requests whose first `prefix_lens[g]` tokens are the same physical pages
    (the scheduler finds them; see scheduler/cascade.py). Device int32 tensors:

    members      [M]    batch indices of grouped requests, each group contiguous
    starts       [G+1]  offsets of the groups in `members`
    prefix_lens  [G]    shared tokens of each group (a whole number of pages, < every member's seq_len)
    kv_start     [B]    the group's prefix length for members, 0 for requests in no group
    max_group_size, max_prefix_len, max_suffix_len (longest seq_len - kv_start), num_q_heads:
                        host ints (grid sizes)
    """

    members: torch.Tensor
    starts: torch.Tensor
    prefix_lens: torch.Tensor
    kv_start: torch.Tensor
    max_group_size: int
    max_prefix_len: int
    max_suffix_len: int
    num_q_heads: int


@dataclass(slots=True)
class ForwardMeta:
    """Device tensors describing one pass. All int tensors are int32 unless noted.

    mode              ForwardMode (EXTEND, DECODE or MIXED; DECODE means every extend_len == 1)
    page_size         tokens per page
    page_table        [B, max_pages]  pages of each request in position order (row of req_to_page)
    seq_lens          [B]  prefix_len + extend_len
    extend_lens       [B]  new tokens per request (1 for decode)
    prefix_lens       [B]  tokens whose KV was already in the pool before this pass
    extend_start_loc  [B]  exclusive cumsum of extend_lens: request i's new tokens start here in [T]
    out_cache_loc     [T]  int64 slot where each new token's K/V is stored
    positions         [T]  int64 position of each new token
    max_seq_len, max_extend_len : host ints (kernel grid sizes, no device sync needed)
    cascade           CascadeMeta when a DECODE batch has groups of requests sharing prefix pages
    """

    mode: ForwardMode
    page_size: int
    page_table: torch.Tensor
    seq_lens: torch.Tensor
    extend_lens: torch.Tensor
    prefix_lens: torch.Tensor
    extend_start_loc: torch.Tensor
    out_cache_loc: torch.Tensor
    positions: torch.Tensor
    max_seq_len: int
    max_extend_len: int
    cascade: CascadeMeta | None = None

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.out_cache_loc.shape[0])


class KVPool(Protocol):
    """Paged K/V storage owned by the worker (implementation: worker/kv_pool.py)."""

    page_size: int
    k_buffers: list[torch.Tensor]  # per layer [num_slots, num_kv_heads, head_dim]
    v_buffers: list[torch.Tensor]

    def copy_pages(self, src: torch.Tensor, dst: torch.Tensor) -> None: ...


class AttentionBackend(Protocol):
    """What an attention layer calls. `prepare` once per pass, then `forward` per layer.

    forward(q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], layer_id, scale) -> o [T, Hq, D]:
    stores k, v into the pool at meta.out_cache_loc, then computes for each new token causal
    attention over its request's whole sequence (cached prefix read through page_table, plus the
    new tokens up to and including itself). GQA: query head h uses KV head h // (Hq // Hkv).
    """

    def prepare(self, meta: ForwardMeta) -> None: ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                scale: float) -> torch.Tensor: ...
