"""A ForwardBatch's arrays on the worker's device, uploaded in three copies, one field per array.

A pass needs ~25 small arrays on the device. Copying them one by one costs ~10 us of host time
each, so `upload_batch` concatenates the arrays of each device dtype (int64, int32, float32) into
one host buffer, copies that once (pinned and asynchronous on CUDA), and splits it back into views,
one named `DeviceBatch` field per array. Arrays are grouped by name, never by position: adding a
field means adding it to the dataclass and to one group in `upload_batch`, and a name missing on
either side fails at the first pass (TypeError from the dataclass constructor).

Pinned blocks come from torch's caching host allocator, which does not reuse a block until its
copy has finished, so a pass may be uploaded while the previous one still runs. np.concatenate
makes fresh arrays: no device tensor aliases the batch's numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixrt import protocol
from radixrt.attention.base import CascadeMeta, ForwardMeta
from radixrt.protocol import ForwardMode
from radixrt.worker import sampler


@dataclass(slots=True)
class CascadeShape:
    """Host ints of a cascade pass (kernel grid sizes, see attention.base.CascadeMeta)."""

    max_group_size: int
    max_prefix_len: int
    max_suffix_len: int  # longest seq_len - kv_start over the batch


@dataclass(slots=True)
class DeviceBatch:
    """One ForwardBatch on the device (B requests, T new tokens, U page-table writes, C page copies,
    R sampled rows, G cascade groups over M members). Built by `upload_batch`; read-only after.

    Tensors are views of three shared device buffers and live as long as any of them is referenced.
    """

    mode: ForwardMode
    # ---- int64 (one copy)
    req_rows: torch.Tensor  # [B] row of req_to_page of each request
    out_cache_loc: torch.Tensor  # [T] slot each new token's K/V is written to
    positions: torch.Tensor  # [T]
    input_ids: torch.Tensor  # [T] as sent: in-flight inputs not yet resolved (ModelRunner does that)
    prev_token_pos: torch.Tensor  # [K] positions in input_ids sampled by the previous pass
    prev_token_src: torch.Tensor  # [K] their rows in the previous pass's next token ids
    top_k: torch.Tensor  # [B] -1 = off
    seeds: torch.Tensor  # [B]
    sample_steps: torch.Tensor  # [B]
    upd_rows: torch.Tensor  # [U] page-table writes req_to_page[upd_rows, upd_cols] = upd_pages
    upd_cols: torch.Tensor  # [U]
    cow_src: torch.Tensor  # [C] copy-on-write: page cow_src[i] -> page cow_dst[i]
    cow_dst: torch.Tensor  # [C]
    sampled_rows: torch.Tensor  # [R] rows that are not greedy (sampler.SamplingPlan)
    cascade_members: torch.Tensor  # [M]
    # ---- int32 (one copy)
    seq_lens: torch.Tensor  # [B] prefix_len + extend_len
    extend_lens: torch.Tensor  # [B]
    prefix_lens: torch.Tensor  # [B]
    extend_start_loc: torch.Tensor  # [B] exclusive cumsum of extend_lens
    upd_pages: torch.Tensor  # [U]
    cascade_starts: torch.Tensor  # [G+1] (empty without cascade)
    cascade_prefix_lens: torch.Tensor  # [G]
    cascade_kv_start: torch.Tensor  # [B] group prefix length of members, else 0 ([0] without cascade)
    # ---- float32 (one copy)
    temperature: torch.Tensor  # [B]
    top_p: torch.Tensor  # [B]
    min_p: torch.Tensor  # [B]
    # ---- host facts (no device sync needed to use them)
    max_seq_len: int
    max_extend_len: int
    min_extend_len: int
    use_min_p: bool  # sampler.SamplingPlan
    need_sort: bool
    cascade: CascadeShape | None  # set when the batch carries cascade groups

    def forward_meta(self, req_to_page: torch.Tensor, page_size: int, num_q_heads: int) -> ForwardMeta:
        """The pass's ForwardMeta; gathers the requests' page-table rows from `req_to_page`
        [rows, max_pages] int32, so call it after the page-table writes."""
        cascade = None
        if self.cascade is not None:
            c = self.cascade
            cascade = CascadeMeta(members=self.cascade_members, starts=self.cascade_starts,
                                  prefix_lens=self.cascade_prefix_lens, kv_start=self.cascade_kv_start,
                                  max_group_size=c.max_group_size, max_prefix_len=c.max_prefix_len,
                                  max_suffix_len=c.max_suffix_len, num_q_heads=num_q_heads)
        return ForwardMeta(
            mode=self.mode, page_size=page_size, page_table=req_to_page[self.req_rows],
            seq_lens=self.seq_lens, extend_lens=self.extend_lens, prefix_lens=self.prefix_lens,
            extend_start_loc=self.extend_start_loc, out_cache_loc=self.out_cache_loc,
            positions=self.positions, max_seq_len=self.max_seq_len, max_extend_len=self.max_extend_len,
            cascade=cascade, min_extend_len=self.min_extend_len)

    def sampling_tensors(self) -> sampler.SamplingTensors:
        """The per-row sampling parameters with their host-side plan (sampling needs no sync)."""
        plan = sampler.SamplingPlan(self.sampled_rows, int(self.sampled_rows.shape[0]), self.use_min_p,
                                    self.need_sort)
        return sampler.SamplingTensors(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                                       min_p=self.min_p, seeds=self.seeds, sample_steps=self.sample_steps,
                                       plan=plan)


def cascade_kv_start(batch: protocol.ForwardBatch) -> np.ndarray:
    """[B] int32 (or [0] without cascade): each grouped request's shared prefix length, else 0."""
    if len(batch.cascade_starts) < 2:
        return np.zeros(0, np.int32)
    sizes = np.diff(batch.cascade_starts)
    kv_start = np.zeros(len(batch.req_rows), np.int32)
    kv_start[batch.cascade_members] = np.repeat(batch.cascade_prefix_lens, sizes)
    return kv_start


def upload_group(arrays: dict[str, np.ndarray], np_dtype: type,
                 device: torch.device) -> dict[str, torch.Tensor]:
    """Host arrays -> device tensors of `np_dtype` (same names) in ONE host-to-device copy."""
    host = torch.from_numpy(np.concatenate(list(arrays.values())).astype(np_dtype, copy=False))
    if device.type == "cuda":
        host = host.pin_memory().to(device, non_blocking=True)
    parts = torch.split(host, [len(a) for a in arrays.values()])
    return dict(zip(arrays, parts, strict=True))


def upload_batch(batch: protocol.ForwardBatch, device: torch.device, vocab_size: int) -> DeviceBatch:
    """`batch`'s arrays on `device` (three copies, no device sync); see the module docstring."""
    ext = batch.extend_lens.astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(ext)[:-1]]) if len(ext) else ext
    seq = batch.seq_lens.astype(np.int64)
    sampled_rows, use_min_p, need_sort = sampler.host_plan(batch.temperature, batch.top_k, batch.top_p,
                                                           batch.min_p, vocab_size)
    kv_start = cascade_kv_start(batch)
    int64 = upload_group({
        "req_rows": batch.req_rows, "out_cache_loc": batch.out_cache_loc, "positions": batch.positions,
        "input_ids": batch.input_ids, "prev_token_pos": batch.prev_token_pos,
        "prev_token_src": batch.prev_token_src, "top_k": batch.top_k, "seeds": batch.seeds,
        "sample_steps": batch.sample_steps, "upd_rows": batch.upd_rows, "upd_cols": batch.upd_cols,
        "cow_src": batch.cow_src, "cow_dst": batch.cow_dst, "sampled_rows": sampled_rows,
        "cascade_members": batch.cascade_members}, np.int64, device)
    int32 = upload_group({
        "seq_lens": seq, "extend_lens": ext, "prefix_lens": seq - ext, "extend_start_loc": starts,
        "upd_pages": batch.upd_pages, "cascade_starts": batch.cascade_starts,
        "cascade_prefix_lens": batch.cascade_prefix_lens, "cascade_kv_start": kv_start}, np.int32, device)
    float32 = upload_group({"temperature": batch.temperature, "top_p": batch.top_p, "min_p": batch.min_p},
                           np.float32, device)
    cascade = None
    if len(batch.cascade_starts) > 1:
        cascade = CascadeShape(max_group_size=int(np.diff(batch.cascade_starts).max()),
                               max_prefix_len=int(batch.cascade_prefix_lens.max()),
                               max_suffix_len=int((seq - kv_start).max()))
    return DeviceBatch(
        mode=ForwardMode(batch.mode), **int64, **int32, **float32,
        max_seq_len=int(seq.max()) if len(seq) else 0, max_extend_len=int(ext.max()) if len(ext) else 0,
        min_extend_len=int(ext.min()) if len(ext) else 0,
        use_min_p=use_min_p, need_sort=need_sort, cascade=cascade)
