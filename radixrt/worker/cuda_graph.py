"""CUDA graphs for DECODE passes at padded batch sizes.

Decode steps are small and launch-bound: one graph replay replaces hundreds of kernel launches.
A graph is captured per batch size in `graph_batch_sizes` (1, 2, 4, 8, 16, 24, ... max_bs), all
sharing one memory pool (captured largest first). A batch of B requests replays the smallest
graph of size bs >= B, with static input buffers filled as follows:

    rows [0, B)   the real requests (ids, positions, slots, seq_lens, page-table rows)
    rows [B, bs)  padding: token 0 at position 0, written to slot 0 of the reserved page 0,
                  seq_len 1 and a page-table row of zeros, so it attends only to its own sink slot
                  and never reads or writes a real request's pages.

Length classes: a backend may bake a length-dependent launch shape into a graph (the Triton
backend's KV split count, chosen from the batch size and max_seq_len). One graph sized for the
context length then runs long-context launches on every short batch: 33 splits per (request, KV
head) at batch 256 over 32K tokens (FP8 pool, before the rule's program cost), 28 of them empty over
~640-token sequences, which doubled the batch-256 decode step. So each batch size gets one graph per
distinct `backend.decode_graph_key(bs, L)` over the length classes L = 1,024, 2,048, 4,096, ...
(doubling, below the context length) and the context length, captured with max_seq_len = the
longest L of its key; a replay takes the key of the smallest class >= the batch's max_seq_len (a
host int). Every graph is exact for any length (the kernel clips split ranges to each row's seq_len
on the device); the classes only bound how far a graph's shape is from the batch's (<= 2x the
length above 1,024 tokens). Only backends that do no host synchronisation in `forward` can be
captured (Triton; the torch reference backend cannot).

Cascade passes (decode groups sharing prefix pages, ForwardMeta.cascade) have their own graphs at
the sizes in `cascade_batch_sizes`, captured with MAX_CASCADE_GROUPS groups of up to bs members and
prefix lengths up to the context length, twice: once with suffix lengths up to the context length,
and once (when the backend has `cascade_fused_max_suffix` > 0) with suffixes up to that bound, where
the backend runs the fused two-launch form; a replay whose longest suffix fits the bound uses the
second. A replay fills the real groups and pads the rest as empty groups (start = end), and padding
rows are in no group (kv_start 0). A cascade pass with more groups, or larger than the largest
cascade graph, runs eagerly.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable

import torch
from torch import nn

from radixrt.attention.base import AttentionBackend, CascadeMeta, ForwardMeta
from radixrt.models.linear import decode_graph_calls
from radixrt.protocol import ForwardMode

MAX_CASCADE_GROUPS = 8
SHORTEST_LEN_CLASS = 1024  # tokens: below this a longer class's launch shape costs little (batch 1)


def seq_len_classes(context_len: int, shortest: int = SHORTEST_LEN_CLASS) -> list[int]:
    """Longest sequence of each decode-graph length class, ascending: shortest, 2 x shortest, ...
    while below context_len, then context_len (one class when context_len <= shortest)."""
    classes = []
    length = max(1, shortest)
    while length < context_len:
        classes.append(length)
        length *= 2
    return classes + [context_len]


def cascade_batch_sizes(max_bs: int) -> list[int]:
    """Batch sizes with a cascade graph: 16, 32, then every multiple of 32 up to max_bs (and max_bs).
    Coarser than the plain sizes: cascade pays only at larger batches, where padding costs little."""
    sizes = [b for b in (16, 32) if b <= max_bs] + list(range(64, max_bs + 1, 32))
    if max_bs >= 16 and sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def graph_batch_sizes(max_bs: int) -> list[int]:
    """Captured batch sizes: 1, 2, 4, 8, then every multiple of 8 up to max_bs (and max_bs itself)."""
    sizes = [b for b in (1, 2, 4, 8) if b <= max_bs] + list(range(16, max_bs + 1, 8))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class CudaGraphRunner:
    """Captures and replays decode graphs for a model and its attention backend.

    Args:
        model: the model (its `config` gives vocab_size and num_heads); called as in forward_pass.
        backend: the attention backend over the worker's KV pool (captured graphs keep using it).
        device: the CUDA device. page_size: tokens per page. context_len: longest sequence a graph
            replays (the backend is prepared with it as max_seq_len).
        max_pages_per_req: width of the device page table (a replay's page_table must match it).
        max_bs: largest batch served by a graph; larger decode batches run eagerly.
        cascade: also capture cascade graphs (the backend supports ForwardMeta.cascade).
        dtype: the model's dtype, that of the static logits buffer (the LM head's output, copied as
            is; float32 by default).

    The logits returned by `replay` are a view of a static buffer in the model's dtype (the LM head's
    output dtype, copied as is: no float32 conversion inside the graph; sampling converts only
    what needs it, worker/forward_pass.py sample_outputs), valid until the next replay.
    """

    def __init__(self, model: nn.Module, backend: AttentionBackend, *, device: torch.device, page_size: int,
                 context_len: int, max_pages_per_req: int, max_bs: int, cascade: bool = False,
                 dtype: torch.dtype = torch.float32) -> None:
        self.model = model
        self.backend = backend
        self.page_size = page_size
        self.context_len = context_len
        self.sizes = graph_batch_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        dev, n = device, self.max_bs
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.prefix_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.extend_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.extend_start_loc = torch.arange(n, dtype=torch.int32, device=dev)
        self.page_table = torch.zeros(n, max_pages_per_req, dtype=torch.int32, device=dev)
        self.logits = torch.zeros(n, model.config.vocab_size, dtype=dtype, device=dev)
        self.num_q_heads = model.config.num_heads
        self.kv_start = torch.zeros(n, dtype=torch.int32, device=dev)
        self.members = torch.zeros(n, dtype=torch.int32, device=dev)
        self.group_starts = torch.zeros(MAX_CASCADE_GROUPS + 1, dtype=torch.int32, device=dev)
        self.group_prefix_lens = torch.zeros(MAX_CASCADE_GROUPS, dtype=torch.int32, device=dev)
        self.mem_pool = torch.cuda.graph_pool_handle()
        # (bs, key) -> graph; key = backend.decode_graph_key(bs, L), one graph per distinct key
        self.graphs: dict[tuple[int, Hashable], torch.cuda.CUDAGraph] = {}
        self.len_classes = seq_len_classes(context_len, SHORTEST_LEN_CLASS)  # (read now: benches set it)
        # bs -> the graph key of each length class
        self.class_keys = {bs: [backend.decode_graph_key(bs, n) for n in self.len_classes]
                           for bs in self.sizes}
        self.cascade_sizes = cascade_batch_sizes(self.max_bs) if cascade else []
        # (bs, fused) -> graph; fused graphs serve replays whose suffixes are all <= fused_max_suffix
        self.cascade_graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.fused_max_suffix = min(int(backend.cascade_fused_max_suffix), self.context_len)
        with torch.inference_mode():
            for bs in reversed(self.sizes):
                longest = {key: n for n, key in zip(self.len_classes, self.class_keys[bs], strict=True)}
                for n in sorted(longest.values(), reverse=True):
                    self._capture(bs, n)
            for bs in reversed(self.cascade_sizes):
                self._capture(bs, context_len, cascade=True)
                if self.fused_max_suffix > 0:
                    self._capture(bs, context_len, cascade=True, fused=True)

    def _meta(self, bs: int, max_seq_len: int, cascade: bool = False, fused: bool = False) -> ForwardMeta:
        groups = None
        if cascade:
            groups = CascadeMeta(members=self.members[:bs], starts=self.group_starts,
                                 prefix_lens=self.group_prefix_lens, kv_start=self.kv_start[:bs],
                                 max_group_size=bs, max_prefix_len=self.context_len,
                                 max_suffix_len=self.fused_max_suffix if fused else self.context_len,
                                 num_q_heads=self.num_q_heads)
        return ForwardMeta(
            mode=ForwardMode.DECODE, page_size=self.page_size, page_table=self.page_table[:bs],
            seq_lens=self.seq_lens[:bs], extend_lens=self.extend_lens[:bs],
            prefix_lens=self.prefix_lens[:bs], extend_start_loc=self.extend_start_loc[:bs],
            out_cache_loc=self.out_cache_loc[:bs], positions=self.positions[:bs],
            max_seq_len=max_seq_len, max_extend_len=1, cascade=groups)

    def _run(self, bs: int, meta: ForwardMeta) -> None:
        self.backend.prepare(meta)
        hidden = self.model(self.input_ids[:bs], self.positions[:bs], meta, self.backend)  # [bs, H]
        self.model.compute_logits(hidden, out=self.logits[:bs])

    def _capture(self, bs: int, max_seq_len: int, cascade: bool = False, fused: bool = False) -> None:
        meta = self._meta(bs, max_seq_len, cascade, fused)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        # decode_graph_calls: linears may take the Gluon GEMM (models/linear.py), whose workspace and
        # compile come with the warm-up
        with decode_graph_calls():
            with torch.cuda.stream(side):  # warm-up: Triton compilation, cuBLAS workspaces
                for _ in range(2):
                    self._run(bs, meta)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.mem_pool):
                self._run(bs, meta)
        if cascade:
            self.cascade_graphs[bs, fused] = graph
        else:
            self.graphs[bs, self.backend.decode_graph_key(bs, max_seq_len)] = graph

    def graph_key(self, bs: int, max_seq_len: int) -> Hashable:
        """The key of the plain graph of size bs that serves a batch whose longest sequence is
        max_seq_len tokens: that of the smallest length class >= max_seq_len (the longest class
        beyond the context length)."""
        i = min(bisect.bisect_left(self.len_classes, max_seq_len), len(self.len_classes) - 1)
        return self.class_keys[bs][i]

    def can_run(self, meta: ForwardMeta) -> bool:
        if meta.mode != ForwardMode.DECODE or meta.page_table.shape[1] != self.page_table.shape[1]:
            return False
        if meta.cascade is not None:
            return (bool(self.cascade_sizes) and 0 < meta.batch_size <= self.cascade_sizes[-1]
                    and int(meta.cascade.starts.shape[0]) - 1 <= MAX_CASCADE_GROUPS)
        return 0 < meta.batch_size <= self.max_bs

    def replay(self, meta: ForwardMeta, input_ids: torch.Tensor) -> torch.Tensor:
        """Run a DECODE batch of B <= max_bs requests; returns logits [B, V] in the model's dtype (a view)."""
        n = meta.batch_size
        c = meta.cascade
        bs = next(b for b in (self.sizes if c is None else self.cascade_sizes) if b >= n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(meta.positions)
        self.out_cache_loc[:n].copy_(meta.out_cache_loc)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.page_table[:n].copy_(meta.page_table)
        if bs > n:  # padding rows: the sink (see module docstring)
            self.input_ids[n:bs].zero_()
            self.positions[n:bs].zero_()
            self.out_cache_loc[n:bs].zero_()
            self.seq_lens[n:bs].fill_(1)
            self.page_table[n:bs].zero_()
        torch.sub(self.seq_lens[:bs], 1, out=self.prefix_lens[:bs])
        if c is None:
            self.graphs[bs, self.graph_key(bs, meta.max_seq_len)].replay()
            return self.logits[:n]
        g, m = int(c.starts.shape[0]) - 1, int(c.members.shape[0])
        self.kv_start[:n].copy_(c.kv_start)
        self.kv_start[n:bs].zero_()
        self.members[:m].copy_(c.members)
        self.group_starts[:g + 1].copy_(c.starts)
        self.group_starts[g + 1:].fill_(m)  # empty groups
        self.group_prefix_lens[:g].copy_(c.prefix_lens)
        self.group_prefix_lens[g:].zero_()
        fused = self.fused_max_suffix > 0 and c.max_suffix_len <= self.fused_max_suffix
        self.cascade_graphs[bs, fused].replay()
        return self.logits[:n]
