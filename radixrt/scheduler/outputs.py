"""Output buffering: what each request produced since the last `TokenOutBatch`, and the packing of
that batch for the tokenizer process.

`process_result` appends every resolved token (and, for a request that asked, its logprob and top
logprobs) to the request's `PendingOutput`; a finished request is queued here once. `take` empties
both into one `TokenOutBatch`, so a step sends one message however many requests moved. Internal
requests (health probes) never reach the tokenizer process: `take` hands them back to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from radixrt.protocol import ForwardResult, TokenOutBatch

if TYPE_CHECKING:
    from radixrt.scheduler.req import Req


@dataclass(slots=True)
class PendingOutput:
    """One request's tokens since its last TokenOutBatch, with their logprobs when it asked:
    logprobs one per token, top_ids / top_vals one row of the request's top_logprobs_num per token."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_vals: list[list[float]] = field(default_factory=list)


class OutputStage:
    """Collects tokens and finishes between two `take` calls. Owned by the Scheduler."""

    def __init__(self) -> None:
        self.finished: list[Req] = []  # finished since the last take, in finishing order

    @staticmethod
    def add_logprobs(req: Req, res: ForwardResult, i: int, k: int) -> None:
        """Buffer the logprobs of request i of `res` (k top entries per request in the pass)."""
        out = req.out
        if res.logprobs.size:
            out.logprobs.append(float(res.logprobs[i]))
        kr = min(k, req.top_logprobs_num)
        if kr:
            out.top_ids.append(res.top_logprob_ids[i * k:i * k + kr].tolist())
            out.top_vals.append(res.top_logprobs[i * k:i * k + kr].tolist())

    def take(self, running: list[Req]) -> tuple[TokenOutBatch | None, list[Req]]:
        """New tokens and finishes since the last call, for the tokenizer process (None: nothing
        to send); plus the finished internal requests (health probes), which are not sent there."""
        finished, self.finished = self.finished, []
        # running requests are never finished: the internal ones to return come from `finished`
        internal = [r for r in finished if r.internal]
        reqs = [r for r in running if r.out.token_ids and not r.internal]
        reqs += [r for r in finished if not r.internal]
        if not reqs:
            return None, internal
        return _pack(reqs), internal


def _pack(reqs: list[Req]) -> TokenOutBatch:
    """Move the requests' pending outputs into one TokenOutBatch (layout: protocol.TokenOutBatch)."""
    ids: list[int] = []
    lps: list[float] = []
    tids: list[int] = []
    tvals: list[float] = []
    offsets = [0]
    for r in reqs:
        out = r.out
        ids += out.token_ids
        offsets.append(len(ids))
        out.token_ids = []
        if r.return_logprob:  # the only requests with logprobs pending
            lps += out.logprobs
            for row in out.top_ids:
                tids += row
            for row in out.top_vals:
                tvals += row
            out.logprobs, out.top_ids, out.top_vals = [], [], []
    batch = TokenOutBatch()
    batch.rids = [r.rid for r in reqs]
    batch.top_logprobs_nums = [r.top_logprobs_num if r.return_logprob else -1 for r in reqs]
    batch.finish_reasons = [r.finish_reason for r in reqs]
    batch.matched_stop = [r.matched_stop for r in reqs]
    batch.prompt_tokens = [len(r.prompt_ids) for r in reqs]
    batch.completion_tokens = [r.num_resolved_outputs for r in reqs]
    batch.cached_tokens = [r.cached_tokens for r in reqs]
    batch.errors = [r.error for r in reqs]
    batch.offsets = np.array(offsets, np.int32)
    batch.output_ids = np.array(ids, np.int32)
    batch.logprobs = np.array(lps, np.float32)
    batch.top_logprob_ids = np.array(tids, np.int32)
    batch.top_logprobs = np.array(tvals, np.float32)
    return batch
