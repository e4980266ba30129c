"""The steps of one forward pass, as functions of the device state they are given.

    stage_batch     upload the batch, apply its page-table writes, then its copy-on-write page
                    copies (the scheduler's order), and build the pass's ForwardMeta
    eager_logits    run the model through an attention backend; logits of each request's last token
    sample_outputs  penalties and logit bias, grammar bitmasks, sampling, logprobs: what goes back
                    to the scheduler (outside any CUDA graph: a graph replay yields the logits only)

Each takes the model, KV pool, backend, page table and penalty state explicitly, so the same steps
serve the ModelRunner's passes and the memory profile's worst-case pass over a throwaway pool
(memory_profile.py). None of them waits for the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from radixrt import protocol
from radixrt.attention.base import AttentionBackend, ForwardMeta
from radixrt.constrained import apply_token_bitmask
from radixrt.models.model_config import ModelConfig
from radixrt.worker import sampler
from radixrt.worker.device_batch import DeviceBatch, upload_batch
from radixrt.worker.kv_pool import PagedKVPool
from radixrt.worker.penalties import PenaltyState


def stage_batch(batch: protocol.ForwardBatch, req_to_page: torch.Tensor, pool: PagedKVPool,
                config: ModelConfig) -> tuple[ForwardMeta, DeviceBatch]:
    """Upload `batch` to req_to_page's device, apply its memory ops to `req_to_page`
    [rows, max_pages] int32 and `pool`, and return (ForwardMeta, DeviceBatch).

    Three host-to-device copies in all (int64, int32, float32 groups); no device sync. The
    returned input_ids still hold the batch's placeholders.
    """
    db = upload_batch(batch, req_to_page.device, config.vocab_size)
    if len(batch.upd_rows):
        req_to_page[db.upd_rows, db.upd_cols] = db.upd_pages
    if len(batch.cow_src):
        pool.copy_pages(db.cow_src, db.cow_dst)
    return db.forward_meta(req_to_page, pool.page_size, config.num_heads), db


def eager_logits(model: nn.Module, backend: AttentionBackend, meta: ForwardMeta,
                 input_ids: torch.Tensor) -> torch.Tensor:
    """Run `model` over the pass's T tokens ([T] int64 ids) and return logits [B, V] float32 of
    each request's last new token."""
    backend.prepare(meta)
    hidden = model(input_ids, meta.positions, meta, backend)  # [T, H]
    last = (meta.extend_start_loc + meta.extend_lens - 1).long()  # [B]
    return model.compute_logits(hidden[last])


@dataclass(slots=True)
class PassOutputs:
    """What a pass sends back, on the device or (after `to_host`) in pinned host memory.

    next_token_ids [B] int32; when the batch asked for logprobs: logprobs [B] float32 (of the raw
    logits), top_logprob_ids [B * N] int32 and top_logprobs [B * N] float32 (N = top_logprobs_num).
    """

    next_token_ids: torch.Tensor
    logprobs: torch.Tensor | None = None
    top_logprob_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None

    def to_host(self) -> PassOutputs:
        """Device -> pinned host copies queued behind the pass (itself off CUDA); read them only
        after the pass's end event has completed."""
        if self.next_token_ids.device.type != "cuda":
            return self
        return PassOutputs(next_token_ids=_to_pinned(self.next_token_ids), logprobs=_to_pinned(self.logprobs),
                           top_logprob_ids=_to_pinned(self.top_logprob_ids),
                           top_logprobs=_to_pinned(self.top_logprobs))

    def fill(self, res: protocol.ForwardResult) -> None:
        """Copy the (host) outputs into `res`."""
        res.next_token_ids = self.next_token_ids.numpy()
        if self.logprobs is not None:
            res.logprobs = self.logprobs.numpy().astype(np.float32)
            res.top_logprob_ids = self.top_logprob_ids.numpy()
            res.top_logprobs = self.top_logprobs.numpy().astype(np.float32)


def _to_pinned(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


def sample_outputs(batch: protocol.ForwardBatch, logits: torch.Tensor, st: sampler.SamplingTensors,
                   penalties: PenaltyState, mask: protocol.GrammarMask | None = None
                   ) -> tuple[torch.Tensor, PassOutputs]:
    """Sample the next token of each request from logits [B, V]: float32, or the model's dtype (a CUDA
    graph's logits), converted to float32 first when the pass has penalties or a logit bias (applied
    in float32) or asks for logprobs; otherwise the grammar mask (-inf, exact in any float dtype) and
    the greedy argmax work on the values as given and the sampler converts the rows it samples, which
    picks the tokens of the float32 conversion (exact) in every case.

    Seeds the penalty rows the scheduler just assigned, applies penalties and logit bias, then the
    grammar bitmask rows (batch.grammar_rows / grammar_bitmask, and `mask`'s rows: the batch's
    deferred ones, required when batch.grammar_deferred is not empty), to a copy of the logits (what
    is sampled), samples, counts the sampled tokens of penalised requests, and takes logprobs of
    the raw logits when asked. Returns (next ids [B] int64 on the device, outputs).

    Raises:
        ValueError: deferred rows without their GrammarMask, or a mask for other rows.
    """
    rows, blocks = grammar_blocks(batch, mask)
    penalties.prepare(batch)
    if logits.dtype != torch.float32 and (batch.return_logprob or penalties.applies(batch)):
        logits = logits.float()
    next_ids = sampler.sample(apply_grammar(rows, blocks, penalties.process(logits, batch), logits), st)
    penalties.record(batch, next_ids)
    out = PassOutputs(next_ids.to(torch.int32))
    if batch.return_logprob:
        chosen, top_ids, top_vals = sampler.logprobs_of(logits, next_ids, batch.top_logprobs_num)
        out.logprobs, out.top_logprob_ids, out.top_logprobs = (chosen, top_ids.reshape(-1).to(torch.int32),
                                                               top_vals.reshape(-1))
    return next_ids, out


def grammar_rows(batch: protocol.ForwardBatch, mask: protocol.GrammarMask | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """All constrained rows of the pass: (rows int32 [R + D] indices into the B requests, bitmask
    int32 [R + D, W]): the batch's own rows, then the deferred ones from `mask` (grammar_blocks,
    joined; for model-free workers).

    Raises:
        ValueError: the batch has deferred rows and `mask` is None or names other rows / another pass.
    """
    rows, blocks = grammar_blocks(batch, mask)
    if not blocks:
        return rows, np.zeros((0, 0), np.int32)
    return rows, blocks[0] if len(blocks) == 1 else np.concatenate(blocks)


def grammar_blocks(batch: protocol.ForwardBatch, mask: protocol.GrammarMask | None
                   ) -> tuple[np.ndarray, list[np.ndarray]]:
    """All constrained rows of the pass without joining their bitmasks: (rows int32 [R + D], the
    bitmask blocks in row order: int32 [R, W] of the batch, then [D, W] of `mask`; empty ones left
    out). The blocks are views of the messages' arrays (no copy).

    Raises:
        ValueError: the batch has deferred rows and `mask` is None or names other rows / another pass.
    """
    rows = np.asarray(batch.grammar_rows, np.int32)
    blocks = [np.asarray(batch.grammar_bitmask, np.int32).reshape(len(rows), -1)] if len(rows) else []
    if not len(batch.grammar_deferred):
        return rows, blocks
    if (mask is None or mask.batch_id != batch.batch_id
            or not np.array_equal(mask.rows, batch.grammar_deferred)):
        got = None if mask is None else (mask.batch_id, mask.rows.tolist())
        raise ValueError(f"ForwardBatch {batch.batch_id}: deferred grammar rows "
                         f"{batch.grammar_deferred.tolist()} need their GrammarMask; got {got}")
    blocks.append(np.asarray(mask.bitmask, np.int32).reshape(len(mask.rows), -1))
    deferred = np.asarray(mask.rows, np.int32)
    rows = np.concatenate([rows, deferred]) if len(rows) else deferred
    return rows, blocks


def upload_bitmask(blocks: list[np.ndarray], device: torch.device) -> torch.Tensor:
    """The blocks (int32 [R_i, W] each, in row order) as one int32 [sum R_i, W] tensor on `device`.

    On CUDA numpy writes them straight into one pinned staging tensor (from torch's caching host
    allocator, reused once its copy is done), uploaded with one non_blocking copy: no joined host
    copy, and no torch CPU copy (one of a mask's size, 64 rows x 4,752 words for Qwen2.5, runs on
    torch's intra-op thread pool, whose threads then spin on cores the other processes need). On
    CPU a view of the one block, or one concatenation.
    """
    if device.type != "cuda":
        joined = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
        # a read-only view (a received message's buffer) is copied: torch warns on one it cannot write
        return torch.from_numpy(np.require(joined, requirements=["C", "W"]))
    staging = torch.empty((sum(len(b) for b in blocks), blocks[0].shape[1]), dtype=torch.int32,
                          pin_memory=True)
    host = staging.numpy()
    start = 0
    for b in blocks:
        host[start:start + len(b)] = b
        start += len(b)
    return staging.to(device, non_blocking=True)


def apply_grammar(rows: np.ndarray, blocks: list[np.ndarray], processed: torch.Tensor,
                  raw: torch.Tensor) -> torch.Tensor:
    """Mask the disallowed tokens of constrained rows (rows int32 [R] into the B requests, blocks
    the int32 [R_i, W] bitmask pieces of grammar_blocks) with -inf in `processed` [B, V] (any float dtype),
    cloned first when it is `raw` (the logits logprobs are taken of; on the CUDA-graph path also a
    static buffer). One host-to-device copy of the bitmask (upload_bitmask: pinned, async on CUDA);
    no device sync. Returns the tensor to sample from."""
    if len(rows) == 0:
        return processed
    if processed is raw:
        processed = raw.clone()
    apply_token_bitmask(processed, upload_bitmask(blocks, processed.device), rows.tolist())
    return processed
