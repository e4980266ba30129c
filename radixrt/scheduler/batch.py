"""Turn the scheduler's decisions for one step into a `protocol.ForwardBatch`.

A `ScheduledItem` is one request's share of a pass: `extend_len` new tokens whose KV goes to
`slots`. Decode is the case extend_len == 1; a prompt chunk is extend_len > 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixrt.protocol import ForwardBatch, ForwardMode
from radixrt.scheduler.req import Req

I32 = np.int32


@dataclass(slots=True)
class ScheduledItem:
    req: Req
    start: int  # position of the first new token (== kv_len before the pass)
    extend_len: int
    slots: list[int]
    completes: bool  # after this pass every known token has KV: sample the next token
    is_prefill: bool  # the request has no output yet (prompt or prompt chunk)


@dataclass(slots=True)
class ScheduledBatch:
    batch_id: int
    items: list[ScheduledItem] = field(default_factory=list)
    cow_pairs: list[tuple[int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.items)


def _page_table_updates(items: list[ScheduledItem]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entries of each request's page list not yet sent to the worker (append-only after admit)."""
    rows: list[int] = []
    cols: list[int] = []
    pages: list[int] = []
    for it in items:
        req = it.req
        assert req.kv is not None
        new = req.kv.pages[req.pages_sent:]
        rows.extend([req.req_row] * len(new))
        cols.extend(range(req.pages_sent, req.pages_sent + len(new)))
        pages.extend(new)
        req.pages_sent = len(req.kv.pages)
    return np.array(rows, I32), np.array(cols, I32), np.array(pages, I32)


def build_forward_batch(sb: ScheduledBatch) -> ForwardBatch:
    """Pack a ScheduledBatch into the wire message (see protocol.ForwardBatch for the layout)."""
    items = sb.items
    assert items and all(it.extend_len >= 1 for it in items), "every request in a pass adds a token"
    extend_lens = np.array([it.extend_len for it in items], I32)
    mode = ForwardMode.DECODE if bool(np.all(extend_lens == 1)) else (
        ForwardMode.MIXED if any(not it.is_prefill for it in items) else ForwardMode.EXTEND)
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    for it in items:
        ids = it.req.all_ids
        input_ids.extend(ids[it.start:it.start + it.extend_len])
        positions.extend(range(it.start, it.start + it.extend_len))
        slots.extend(it.slots)
    upd_rows, upd_cols, upd_pages = _page_table_updates(items)
    sp = [it.req.sampling for it in items]
    return ForwardBatch(
        batch_id=sb.batch_id,
        mode=int(mode),
        req_rows=np.array([it.req.req_row for it in items], I32),
        input_ids=np.array(input_ids, I32),
        positions=np.array(positions, I32),
        out_cache_loc=np.array(slots, I32),
        seq_lens=np.array([it.start + it.extend_len for it in items], I32),
        extend_lens=extend_lens,
        upd_rows=upd_rows, upd_cols=upd_cols, upd_pages=upd_pages,
        cow_src=np.array([s for s, _ in sb.cow_pairs], I32),
        cow_dst=np.array([d for _, d in sb.cow_pairs], I32),
        temperature=np.array([s.temperature for s in sp], np.float32),
        top_p=np.array([s.top_p for s in sp], np.float32),
        top_k=np.array([s.top_k for s in sp], I32),
        min_p=np.array([s.min_p for s in sp], np.float32),
        seeds=np.array([it.req.seed for it in items], I32),
        sample_steps=np.array([len(it.req.output_ids) for it in items], I32),
        return_logprob=any(it.req.return_logprob for it in items),
        top_logprobs_num=max((it.req.top_logprobs_num for it in items), default=0),
    )
