"""The deferred GrammarMask goes out before the rest of the previous pass's result is processed:
on pass N's result the pipeline resolves and accepts only the constrained tokens, sends pass N+1's
mask, and only then buffers N's outputs for the tokenizer and finishes requests. Checked on a
scripted launcher that records what the scheduler had published when each mask was sent."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from radixrt.protocol import ForwardBatch, ForwardResult, GrammarMask, TokenOutBatch
from radixrt.scheduler.pipeline import PassPipeline
from radixrt.scheduler.scheduler import Scheduler
from tests.scheduler.fake_worker import FakeWorker
from tests.scheduler.test_grammar import compiler, constrained, plain, text_of, with_compiler  # noqa: F401
from tests.scheduler.test_scheduler import EOS


class RecordingLauncher:
    """PassLauncher over the FakeWorker; `events` is the order of masks and tokenizer messages,
    each mask with what the scheduler held at that moment."""

    def __init__(self, sched: Scheduler, worker: FakeWorker) -> None:
        self.sched, self.worker = sched, worker
        self.batches: dict[int, ForwardBatch] = {}
        self.rids: dict[int, list[str]] = {}  # batch id -> rid of each of its requests
        self.masks: dict[int, GrammarMask] = {}
        self.events: list[tuple[str, Any]] = []

    def launch(self, fb: ForwardBatch) -> int:
        self.batches[fb.batch_id] = fb
        rid_of_row = {r.req_row: r.rid for r in self.sched.running}
        self.rids[fb.batch_id] = [rid_of_row[int(row)] for row in fb.req_rows]
        return fb.batch_id

    def supply_mask(self, handle: int, mask: GrammarMask) -> None:
        buffered = {r.rid: list(r.out.token_ids) for r in self.sched.reqs.values() if r.out.token_ids}
        matchers = {r.rid: (r.matcher.num_accepted, r.num_resolved_outputs)
                    for r in self.sched.running if r.matcher is not None}
        self.events.append(("mask", {"batch_id": handle, "buffered": buffered, "matchers": matchers,
                                     "finished": len(self.sched.outputs.finished), "mask": mask,
                                     "row_rids": [self.rids[handle][j] for j in mask.rows.tolist()]}))
        self.masks[handle] = mask

    def finish(self, handle: int) -> ForwardResult:
        return self.worker.forward(self.batches.pop(handle), mask=self.masks.pop(handle, None))

    def flush(self) -> None:
        """SchedulerLoop.flush_outputs: what goes to the tokenizer after the step."""
        out, _ = self.sched.take_outputs()
        if out is not None:
            self.events.append(("tokens", out))


def run(sched: Scheduler, launcher: RecordingLauncher) -> dict[str, list[int]]:
    pipeline = PassPipeline(sched, launcher, overlap=True)
    outputs: dict[str, list[int]] = {}
    for _ in range(500):
        busy = pipeline.step()
        launcher.flush()
        if not busy and sched.is_idle and pipeline.in_flight is None:
            break
    for kind, ev in launcher.events:
        if kind == "tokens":
            assert isinstance(ev, TokenOutBatch)
            for j, rid in enumerate(ev.rids):
                outputs.setdefault(rid, []).extend(ev.output_ids[ev.offsets[j]:ev.offsets[j + 1]].tolist())
    return outputs


def test_mask_is_sent_before_the_previous_results_outputs_are_buffered(compiler) -> None:  # noqa: F811
    sched, worker = with_compiler(compiler)
    launcher = RecordingLauncher(sched, worker)
    for rid in ("c0", "c1"):
        sched.add_request(constrained(rid, [1, 2, 3, int(rid[1])], "[a-z]{8}", ignore_eos=False))
    sched.add_request(plain("p", [7, 8, 9], max_new=6))
    for req in list(sched.waiting):
        if req.grammar is not None:
            req.grammar.result(timeout_s=None)
    outputs = run(sched, launcher)
    masks = [ev for kind, ev in launcher.events if kind == "mask"]
    assert len(masks) >= 6  # every decode pass of c0 / c1 had its rows deferred
    kinds = [kind for kind, _ in launcher.events]
    for k, (kind, ev) in enumerate(launcher.events):
        if kind != "mask":
            continue
        # nothing of the result just resolved is buffered, nor was anything finished from it ...
        assert ev["buffered"] == {} and ev["finished"] == 0
        # ... yet every constrained matcher has accepted its resolved outputs (the invariant)
        assert all(acc == resolved for acc, resolved in ev["matchers"].values()), ev["matchers"]
        # that result's tokens reach the tokenizer only after the mask
        assert "tokens" in kinds[k + 1:] or k == len(kinds) - 1
    for rid in ("c0", "c1"):
        assert re.fullmatch("[a-z]{8}", text_of(outputs[rid])) and outputs[rid][-1] == EOS
    assert len(outputs["p"]) == 6
    finishes = {rid: reason for kind, ev in launcher.events if kind == "tokens"
                for rid, reason in zip(ev.rids, ev.finish_reasons, strict=True) if reason}
    assert finishes == {"c0": "stop", "c1": "stop", "p": "length"}


def test_a_request_ending_in_the_result_gets_an_all_ones_row(compiler) -> None:  # noqa: F811
    """c ends on its EOS (grammar end) in pass N's result; pass N+1, scheduled while that EOS was
    in flight, gets c's row as all ones although c is finished only after the mask went out."""
    sched, worker = with_compiler(compiler)
    launcher = RecordingLauncher(sched, worker)
    c = sched.add_request(constrained("c", [1, 2, 3], "[a-z]{2}"))
    d = sched.add_request(constrained("d", [4, 5, 6], "[a-z]{9}"))
    for req in (c, d):
        req.grammar.result(timeout_s=None)
    outputs = run(sched, launcher)
    assert c.finish_reason == "stop" and d.finish_reason == "stop"
    assert re.fullmatch("[a-z]{2}", text_of(outputs["c"])) and outputs["c"][-1] == EOS
    masks = [ev for kind, ev in launcher.events if kind == "mask"]
    # c has accepted its 2 letters and EOS (terminated), and is not finished yet
    after_eos = [ev for ev in masks if ev["matchers"].get("c", (0, 0))[0] == 3]
    assert len(after_eos) == 1 and "c" in after_eos[0]["row_rids"] and after_eos[0]["finished"] == 0
    ev = after_eos[0]
    bitmask = ev["mask"].bitmask
    assert np.all(bitmask[ev["row_rids"].index("c")] == -1)
    assert not np.all(bitmask[ev["row_rids"].index("d")] == -1)  # d's row is a real one
