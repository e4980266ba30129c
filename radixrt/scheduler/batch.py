"""Turn the scheduler's decisions for one step into a `protocol.ForwardBatch`.

A `ScheduledItem` is one request's share of a pass: `extend_len` new tokens whose KV goes to
`slots`. Decode is the case extend_len == 1; a prompt chunk is extend_len > 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixrt.memory.host_tier import CopyOp
from radixrt.protocol import ForwardBatch, ForwardMode
from radixrt.sampling_params import SamplingParams
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
    out_pos: int = -1  # when `completes`: output index of the token this pass samples
    # overlap: this item's last input token is still being sampled by the previous pass, by its
    # request number prev_src there (an index into that pass's next_token_ids); -1: all inputs known
    prev_src: int = -1


@dataclass(slots=True)
class ScheduledBatch:
    batch_id: int
    items: list[ScheduledItem] = field(default_factory=list)
    cow_pairs: list[tuple[int, int]] = field(default_factory=list)
    # DECODE passes with requests sharing prefix pages: (members, starts, prefix_lens), see cascade.py
    cascade: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    # constrained items that sample: (rows int32 [R] into items, bitmask int32 [R, W], deferred int32
    # [D] into items: rows filled after the previous pass's result, GrammarStage.fill_deferred)
    grammar: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    # host-tier copies to run with this pass (KVManager.take_copy_ops); a pass may carry only these
    copy_ops: list[CopyOp] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.items)


def _concat_ranges(starts: list[int], lengths: list[int]) -> np.ndarray:
    """int32 concatenation of range(s, s + n) for each (s, n), with a few numpy calls."""
    n = np.array(lengths, np.int64)
    out_start = np.cumsum(n) - n  # where each run begins in the output
    return (np.arange(int(n.sum())) + np.repeat(np.array(starts, np.int64) - out_start, n)).astype(I32)


def _page_table_updates(items: list[ScheduledItem]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entries of each request's page list not yet sent to the worker (append-only after admit):
    (rows, cols, pages), int32."""
    rows: list[int] = []
    first_cols: list[int] = []
    counts: list[int] = []
    pages: list[int] = []
    for it in items:
        req = it.req
        assert req.kv is not None
        held, sent = req.kv.pages, req.pages_sent
        if len(held) == sent:  # the common decode case: nothing new
            continue
        new = held[sent:]
        rows.append(req.req_row)
        first_cols.append(sent)
        counts.append(len(new))
        pages += new
        req.pages_sent = len(held)
    return (np.repeat(np.array(rows, I32), counts), _concat_ranges(first_cols, counts),
            np.array(pages, I32))


def build_mode(sb: ScheduledBatch) -> ForwardMode:
    """DECODE when every request adds one token, MIXED when prompt chunks ride with decodes, else EXTEND."""
    return _mode(sb.items, all(it.extend_len == 1 for it in sb.items))


def _mode(items: list[ScheduledItem], decode: bool) -> ForwardMode:
    if decode:
        return ForwardMode.DECODE
    return ForwardMode.MIXED if any(not it.is_prefill for it in items) else ForwardMode.EXTEND


def build_forward_batch(sb: ScheduledBatch) -> ForwardBatch:
    """Pack a ScheduledBatch into the wire message (see protocol.ForwardBatch for the layout).
    A batch with no items is an IDLE pass that carries host-tier copies only."""
    items = sb.items
    if not items:
        fb = ForwardBatch(batch_id=sb.batch_id, mode=int(ForwardMode.IDLE))
        _fill_copies(fb, sb.copy_ops)
        return fb
    extend = [it.extend_len for it in items]
    assert items and min(extend) >= 1, "every request in a pass adds a token"
    reqs = [it.req for it in items]
    starts = [it.start for it in items]
    decode = sum(extend) == len(items)  # every extend_len is 1
    mode = _mode(items, decode)
    if decode:  # one token per request: no per-request lists to join
        input_ids = [req.token_ids[start] for req, start in zip(reqs, starts, strict=True)]
        positions = starts
        slots = [it.slots[0] for it in items]
    else:
        positions = _concat_ranges(starts, extend)
        input_ids, slots = [], []
        for it in items:
            input_ids += it.req.token_ids[it.start:it.start + it.extend_len]
            slots += it.slots
    prev_pos, prev_src = _in_flight_inputs(items, extend, decode)
    fresh = [req.pages_sent == 0 for req in reqs]  # row just assigned: nothing sent for it yet
    upd_rows, upd_cols, upd_pages = _page_table_updates(items)
    sp = [req.sampling for req in reqs]
    fb = ForwardBatch(
        batch_id=sb.batch_id,
        mode=int(mode),
        req_rows=np.array([req.req_row for req in reqs], I32),
        input_ids=np.array(input_ids, I32),
        prev_token_pos=prev_pos, prev_token_src=prev_src,
        positions=np.array(positions, I32),
        out_cache_loc=np.array(slots, I32),
        seq_lens=np.array([start + n for start, n in zip(starts, extend, strict=True)], I32),
        extend_lens=np.array(extend, I32),
        upd_rows=upd_rows, upd_cols=upd_cols, upd_pages=upd_pages,
        cow_src=np.array([s for s, _ in sb.cow_pairs], I32),
        cow_dst=np.array([d for _, d in sb.cow_pairs], I32),
        temperature=np.array([s.temperature for s in sp], np.float32),
        top_p=np.array([s.top_p for s in sp], np.float32),
        top_k=np.array([s.top_k for s in sp], I32),
        min_p=np.array([s.min_p for s in sp], np.float32),
        seeds=np.array([req.seed for req in reqs], I32),
        sample_steps=np.array([it.out_pos if it.completes else len(it.req.output_ids) for it in items], I32),
        return_logprob=any([req.return_logprob for req in reqs]),
        top_logprobs_num=max([req.top_logprobs_num for req in reqs]),
    )
    if sb.cascade is not None:
        fb.cascade_members, fb.cascade_starts, fb.cascade_prefix_lens = sb.cascade
    if sb.grammar is not None:
        fb.grammar_rows, fb.grammar_bitmask, fb.grammar_deferred = (sb.grammar[0], sb.grammar[1].reshape(-1),
                                                                    sb.grammar[2])
    if any([uses_penalties(s) for s in sp]):
        _fill_penalties(fb, items, fresh)
    if any([s.logit_bias for s in sp]):
        _fill_logit_bias(fb, sp)
    if sb.copy_ops:
        _fill_copies(fb, sb.copy_ops)
    return fb


def _fill_copies(fb: ForwardBatch, ops: list[CopyOp]) -> None:
    """The host-tier copies of a pass (protocol.ForwardBatch, "Host KV tier")."""
    if not ops:
        return
    fb.copy_ids = np.array([op.copy_id for op in ops], I32)
    fb.copy_kinds = np.array([op.kind for op in ops], I32)
    fb.copy_starts = np.cumsum([0] + [len(op.host_pages) for op in ops]).astype(I32)
    fb.copy_host_pages = np.array([p for op in ops for p in op.host_pages], I32)
    fb.copy_device_pages = np.array([p for op in ops for p in op.device_pages], I32)


def _in_flight_inputs(items: list[ScheduledItem], extend: list[int], decode: bool
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(prev_token_pos, prev_token_src) int32 [K]: the inputs still being sampled by the previous
    pass (each an item's last input token) and where that pass's next_token_ids holds them."""
    pos: list[int] = []
    src: list[int] = []
    end = 0  # one past the item's last input in input_ids
    for i, it in enumerate(items):
        end = i + 1 if decode else end + extend[i]
        if it.prev_src != -1:
            pos.append(end - 1)
            src.append(it.prev_src)
    return np.array(pos, I32), np.array(src, I32)


def uses_penalties(sp: SamplingParams) -> bool:
    return sp.frequency_penalty != 0.0 or sp.presence_penalty != 0.0 or sp.repetition_penalty != 1.0


def _fill_penalties(fb: ForwardBatch, items: list[ScheduledItem], fresh: list[bool]) -> None:
    """Per-request penalty values, plus the reset and seed of rows just given to a penalised request
    (its prompt for repetition_penalty, and its output so far when it resumes after a retraction)."""
    b = len(items)
    freq, pres, rep = np.zeros(b, np.float32), np.zeros(b, np.float32), np.ones(b, np.float32)
    reset: list[int] = []
    prompt_rows: list[np.ndarray] = []
    prompt_ids: list[np.ndarray] = []
    out_rows: list[int] = []
    out_ids: list[int] = []
    for i, it in enumerate(items):
        req, sp = it.req, it.req.sampling
        if not uses_penalties(sp):
            continue
        if it.completes:  # a prompt chunk that does not complete samples a token that is dropped
            freq[i], pres[i], rep[i] = sp.frequency_penalty, sp.presence_penalty, sp.repetition_penalty
        if not fresh[i]:
            continue
        reset.append(req.req_row)
        if sp.repetition_penalty != 1.0:
            ids = np.unique(np.asarray(req.prompt_ids, I32))
            prompt_ids.append(ids)
            prompt_rows.append(np.full(len(ids), req.req_row, I32))
        done = req.output_ids[:req.num_resolved_outputs]  # not this pass's own, in flight
        out_ids.extend(done)
        out_rows.extend([req.req_row] * len(done))
    fb.frequency_penalty, fb.presence_penalty, fb.repetition_penalty = freq, pres, rep
    fb.penalty_reset_rows = np.array(reset, I32)
    if prompt_ids:
        fb.penalty_prompt_rows = np.concatenate(prompt_rows)
        fb.penalty_prompt_ids = np.concatenate(prompt_ids)
    fb.penalty_output_rows = np.array(out_rows, I32)
    fb.penalty_output_ids = np.array(out_ids, I32)


def _fill_logit_bias(fb: ForwardBatch, sp: list[SamplingParams]) -> None:
    """Sparse (request index, token id, bias) triples; ids were range-checked at arrival."""
    idx: list[int] = []
    ids: list[int] = []
    vals: list[float] = []
    for i, s in enumerate(sp):
        for key, v in s.logit_bias.items():
            idx.append(i)
            ids.append(int(key))
            vals.append(float(v))
    fb.logit_bias_idx = np.array(idx, I32)
    fb.logit_bias_ids = np.array(ids, I32)
    fb.logit_bias_vals = np.array(vals, np.float32)
