"""Repetition / frequency / presence penalties and logit bias, applied on device before sampling.

Semantics (applied in this order, to the model's logits of each request that asks):

    repetition_penalty r  (CTRL, Keskar et al. 2019; as Hugging Face's RepetitionPenaltyLogitsProcessor)
                          for every token seen in the prompt or the output so far:
                          logit / r if logit > 0 else logit * r
    frequency_penalty f,  (OpenAI) over the tokens generated so far (not the prompt):
    presence_penalty p    logit -= f * count + p * (count > 0)
    logit_bias            logit += bias[token]  (OpenAI; +-100 effectively forces / bans a token)

State lives per page-table row, on the device, so that nothing per token travels each step:

    output_counts [rows, V] float32  how often the row's request has generated each token
    prompt_mask   [rows, V] bool     which tokens its prompt contains (for repetition_penalty)

Who writes what: when the scheduler gives a row to a request that uses penalties it lists the row in
`penalty_reset_rows` and sends the prompt tokens (`penalty_prompt_*`) and any tokens the request had
generated before a retraction (`penalty_output_*`); the worker applies these before the pass. After
sampling, the worker adds the token it sampled for each request whose penalties are on (the scheduler
sets them neutral for a prompt chunk whose sample it discards). Rows of requests without penalties
are never read, so they are never reset either. This keeps the state right under retraction and
would under overlap scheduling (the worker, not the scheduler, knows the latest token first).
"""

from __future__ import annotations

import numpy as np
import torch

from radixrt.protocol import ForwardBatch


def penalized_indices(batch: ForwardBatch) -> np.ndarray:
    """Indices (into the batch's requests) whose penalties are not neutral; int64 [P], host-side."""
    if len(batch.frequency_penalty) == 0:
        return np.zeros(0, dtype=np.int64)
    on = ((batch.frequency_penalty != 0.0) | (batch.presence_penalty != 0.0)
          | (batch.repetition_penalty != 1.0))
    return np.flatnonzero(on)


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, prompt_mask: torch.Tensor | None,
                    frequency: torch.Tensor, presence: torch.Tensor,
                    repetition: torch.Tensor) -> torch.Tensor:
    """Penalised logits (a new tensor).

    Args:
        logits: [P, V] float32. counts: [P, V] float32 output-token counts. prompt_mask: [P, V] bool,
            or None when no row has a repetition penalty. frequency, presence, repetition: [P] float32.
    """
    generated = counts > 0  # [P, V]
    if prompt_mask is not None:
        seen = prompt_mask | generated
        rep = repetition[:, None]
        logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    return logits - frequency[:, None] * counts - presence[:, None] * generated.to(logits.dtype)


class PenaltyState:
    """The per-row penalty state of one worker (see the module docstring).

    Args:
        num_rows: page-table rows (--max-running-requests). vocab_size: logits width.
        device: where the logits live.
    """

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device) -> None:
        self.device = device
        self.output_counts = torch.zeros((num_rows, vocab_size), dtype=torch.float32, device=device)
        self.prompt_mask = torch.zeros((num_rows, vocab_size), dtype=torch.bool, device=device)

    def _t(self, a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.array(a, copy=True)).to(self.device, dtype, non_blocking=True)

    def prepare(self, batch: ForwardBatch) -> None:
        """Reset and seed the rows the scheduler just assigned (before the pass)."""
        if len(batch.penalty_reset_rows) == 0:
            return
        rows = self._t(batch.penalty_reset_rows, torch.int64)
        self.output_counts[rows] = 0.0
        self.prompt_mask[rows] = False
        if len(batch.penalty_prompt_rows):
            self.prompt_mask[self._t(batch.penalty_prompt_rows, torch.int64),
                             self._t(batch.penalty_prompt_ids, torch.int64)] = True
        if len(batch.penalty_output_rows):
            r = self._t(batch.penalty_output_rows, torch.int64)
            ids = self._t(batch.penalty_output_ids, torch.int64)
            self.output_counts.index_put_((r, ids), torch.ones_like(r, dtype=torch.float32), accumulate=True)

    @staticmethod
    def applies(batch: ForwardBatch) -> bool:
        """Whether `process` changes any row of this batch (a penalty or a logit bias in use)."""
        return penalized_indices(batch).size > 0 or len(batch.logit_bias_idx) > 0

    def process(self, logits: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Logits [B, V] with penalties then logit bias applied; `logits` itself (not a copy, not
        modified) when no request in the batch uses either."""
        idx = penalized_indices(batch)
        has_bias = len(batch.logit_bias_idx) > 0
        if idx.size == 0 and not has_bias:
            return logits
        out = logits.clone()
        if idx.size:
            i = self._t(idx, torch.int64)
            rows = self._t(batch.req_rows[idx], torch.int64)
            rep_np = batch.repetition_penalty[idx]
            mask = self.prompt_mask[rows] if bool((rep_np != 1.0).any()) else None
            out[i] = apply_penalties(out[i], self.output_counts[rows], mask,
                                     self._t(batch.frequency_penalty[idx], torch.float32),
                                     self._t(batch.presence_penalty[idx], torch.float32),
                                     self._t(rep_np, torch.float32))
        if has_bias:
            where = (self._t(batch.logit_bias_idx, torch.int64), self._t(batch.logit_bias_ids, torch.int64))
            out.index_put_(where, self._t(batch.logit_bias_vals, torch.float32), accumulate=True)
        return out

    def record(self, batch: ForwardBatch, next_ids: torch.Tensor) -> None:
        """Count the token just sampled for each penalised request. next_ids: [B] int64."""
        idx = penalized_indices(batch)
        if idx.size == 0:
            return
        rows = self._t(batch.req_rows[idx], torch.int64)
        toks = next_ids[self._t(idx, torch.int64)]
        self.output_counts.index_put_((rows, toks), torch.ones_like(toks, dtype=torch.float32),
                                      accumulate=True)
