"""The attention-backend contract: per-pass metadata, the KV pool a backend reads, and the backend.

A neutral module: the models (`radixrt.models`) call attention through `AttentionBackend` and read
`ForwardMeta`; the worker (`radixrt.worker`) builds the metadata and owns the implementations,
`worker/attention_torch.TorchAttnBackend` (CPU reference, CI) and `worker/attention_triton.
TritonAttnBackend` (CUDA, kernels in `radixrt.kernels`). Neither side imports the other for this.

KV layout (see docs/memory.md): per layer, K and V buffers `[num_slots, num_kv_heads, head_dim]`,
num_slots = num_pages * page_size, slot = page * page_size + offset. Page 0 is the sink for
padded tokens (e.g. CUDA-graph padding) and is never read by a real request.

Ownership: the scheduler decides which pages and slots a pass uses; the worker applies those
decisions to its device page table and pool before the pass and builds one `ForwardMeta` per pass
(`worker/device_batch.py`); a backend only reads the metadata and writes K/V at the slots it names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
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
    """Device tensors describing one pass over B requests and T new tokens. All int tensors are
    int32 unless noted.

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
    min_extend_len    host int, the fewest new tokens of any request (0: unknown or none); picks the extend
                      kernel (kernels.extend_attention)
    cascade           CascadeMeta when a DECODE batch has groups of requests sharing prefix pages

    The tensors stay alive and unchanged until the pass's last layer has run; a CUDA graph keeps
    static ones and updates them in place between replays (worker/cuda_graph.py).
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
    min_extend_len: int = 0

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.out_cache_loc.shape[0])


class KVPool(Protocol):
    """Paged K/V storage owned by the worker (implementation: worker/kv_pool.PagedKVPool).

    A backend writes only the slots of `ForwardMeta.out_cache_loc` and reads only the pages of
    `ForwardMeta.page_table`; `copy_pages` (copy-on-write) is the worker's, called before a pass.
    """

    page_size: int
    k_buffers: list[torch.Tensor]  # per layer [num_slots, num_kv_heads, head_dim]
    v_buffers: list[torch.Tensor]

    def copy_pages(self, src: torch.Tensor, dst: torch.Tensor) -> None: ...


class AttentionBackend(ABC):
    """What an attention layer calls: `prepare` once per pass, then `forward` once per layer.

    A backend is built by the worker over one KV pool and used for every pass on that pool. It may
    keep a reference to the last prepared `ForwardMeta` until the next `prepare`. A backend whose
    `forward` makes no host synchronisation and allocates only its output can be captured in a CUDA
    graph (the Triton one; the torch reference syncs in `prepare` and cannot).
    """

    # Longest suffix ([kv_start, seq_len)) of a cascade pass that the backend runs in its fused form;
    # 0 = no fused form. CUDA graphs capture a second set of cascade graphs up to this bound.
    cascade_fused_max_suffix: int = 0

    def decode_graph_key(self, batch_size: int, max_seq_len: int) -> Hashable:
        """What a DECODE pass of `batch_size` requests, the longest `max_seq_len` tokens, bakes into a
        CUDA graph besides the batch size, as a hashable of host values (e.g. the Triton backend's
        (split count, launch variant)): passes with equal keys can replay one graph
        (worker/cuda_graph.py's length classes). Default 0: one graph serves every length."""
        return 0

    @abstractmethod
    def prepare(self, meta: ForwardMeta) -> None:
        """Take this pass's metadata (before the first layer); may pick launch parameters."""

    def forward_rope(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor, layer_id: int, scale: float) -> torch.Tensor:
        """`forward` of q and k after rotary position embedding (`radixrt.models.ops.apply_rotary`:
        positions [T] int64 / int32, cos_sin_cache [max_positions, R] float32). A backend may fuse
        the rotation with the K/V store (the Triton backend does: one kernel instead of two per
        layer). q and k may be rotated in place. Returns forward's o [T, Hq, D]."""
        from radixrt.models import ops

        q, k = ops.apply_rotary(q, k, positions, cos_sin_cache)
        return self.forward(q, k, v, layer_id, scale)

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                scale: float) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] (model dtype; may be strided views) -> o [T, Hq, D].

        Stores k, v into layer `layer_id` of the pool at meta.out_cache_loc, then computes for each
        new token causal attention over its request's whole sequence (cached prefix read through
        page_table, plus the new tokens up to and including itself), scaled by `scale`. GQA: query
        head h uses KV head h // (Hq // Hkv). Only valid after `prepare` of the same pass.
        """
