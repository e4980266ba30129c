"""Grammar-constrained requests in the scheduler, with a model-free worker that honours the bitmask.

The tokenizer is synthetic: ids 0-9 are the digits, 10-35 the letters a-z, 999 is EOS, everything
else a filler token; the fake worker samples among each constrained row's allowed tokens.
"""

from __future__ import annotations

import re
import string
from concurrent.futures import Future

import numpy as np
import pytest

from radixrt.constrained import (
    GrammarCompilerService,
    GrammarError,
    GrammarHandle,
    GrammarKind,
    GrammarSpec,
)
from radixrt.protocol import GenerateReq
from radixrt.scheduler.batch import build_forward_batch
from radixrt.scheduler.grammar import NO_GRAMMAR_SUPPORT
from radixrt.scheduler.scheduler import Scheduler
from tests.scheduler.test_scheduler import EOS, VOCAB, make, run_to_idle

xgr = pytest.importorskip("xgrammar")
ALPHABET = string.digits + string.ascii_lowercase
VOCAB_TEXT = list(ALPHABET) + [f"<f{i}>" for i in range(len(ALPHABET), EOS)] + ["</s>"]


@pytest.fixture(scope="module")
def compiler() -> GrammarCompilerService:
    info = xgr.TokenizerInfo(VOCAB_TEXT, vocab_size=VOCAB, stop_token_ids=[EOS])
    return GrammarCompilerService(info)


def text_of(ids: list[int]) -> str:
    return "".join(VOCAB_TEXT[t] for t in ids if t != EOS)


def constrained(rid: str, prompt: list[int], regex: str, max_new: int = 40, **sp) -> GenerateReq:
    return GenerateReq(rid=rid, input_ids=np.array(prompt, np.int32),
                       sampling={"temperature": 0.0, "max_new_tokens": max_new, **sp},
                       grammar_kind=GrammarKind.REGEX.value, grammar_text=regex)


def plain(rid: str, prompt: list[int], max_new: int = 20) -> GenerateReq:
    return GenerateReq(rid=rid, input_ids=np.array(prompt, np.int32),
                       sampling={"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True})


def with_compiler(compiler, **kw) -> tuple[Scheduler, object]:
    sched, worker = make(kw.pop("page_size", 4), kw.pop("num_pages", 256), kw.pop("chunk", 64), **kw)
    sched.grammar.compiler = compiler
    return sched, worker


class ManualCompiler:
    """Stands in for the service: compiles finish only when the test says so."""

    def __init__(self, real: GrammarCompilerService) -> None:
        self.real = real
        self.futures: list[tuple[Future, GrammarSpec]] = []

    @property
    def vocab_size(self) -> int:
        return self.real.vocab_size

    def submit(self, spec: GrammarSpec) -> GrammarHandle:
        fut: Future = Future()
        self.futures.append((fut, spec))
        return GrammarHandle(spec, fut)

    def finish_all(self) -> None:
        for fut, spec in self.futures:
            fut.set_result(self.real.compile_now(spec))


def test_without_a_compiler_constrained_requests_are_refused() -> None:
    sched, _ = make(4, 64, 64)
    req = sched.add_request(constrained("c", [1, 2, 3], "[a-c]{3}"))
    assert req.finish_reason == "abort" and req.error == NO_GRAMMAR_SUPPORT
    out, _ = sched.take_outputs()
    assert out is not None and out.errors == [NO_GRAMMAR_SUPPORT]


def test_request_waits_in_the_queue_until_compiled(compiler) -> None:
    manual = ManualCompiler(compiler)
    sched, worker = with_compiler(manual)
    req = sched.add_request(constrained("c", [1, 2, 3], "[a-c]{3}"))
    for _ in range(3):  # compile pending: nothing to run, still waiting
        assert sched.schedule() is None
        assert req in sched.waiting and req.matcher is None
    other = sched.add_request(plain("p", [4, 5, 6], max_new=2))
    sb = sched.schedule()
    assert [it.req for it in sb.items] == [other]  # the unconstrained one is not held up
    sched.process_result(sb, worker.forward(build_forward_batch(sb)))
    manual.finish_all()
    res = run_to_idle(sched, worker)
    assert req.matcher is not None and res["reasons"]["c"] == "stop"
    assert re.fullmatch("[a-c]{3}", text_of(res["outputs"]["c"]))


def test_compile_error_aborts_with_its_message_and_the_next_request_runs(compiler) -> None:
    sched, worker = with_compiler(compiler)
    bad = sched.add_request(constrained("bad", [1, 2, 3], "(unclosed"))
    good = sched.add_request(constrained("good", [1, 2, 3], "[0-9]{2}x"))
    with pytest.raises(GrammarError):
        bad.grammar.result(timeout_s=None)  # wait for the compile (it fails)
    good.grammar.result(timeout_s=None)
    res = run_to_idle(sched, worker)
    assert bad.finish_reason == "abort" and bad.error and "regex" in bad.error
    assert "bad" not in res["outputs"] or res["outputs"]["bad"] == []
    assert res["reasons"]["good"] == "stop"
    assert re.fullmatch("[0-9]{2}x", text_of(res["outputs"]["good"]))


def test_bitmask_rows_only_for_constrained_items_and_matcher_terminates_with_stop(compiler) -> None:
    sched, worker = with_compiler(compiler)
    reqs = [sched.add_request(plain("p0", [7, 8, 9, 10], max_new=50)),
            sched.add_request(constrained("c1", [1, 2, 3], "[a-e]{4}[0-9]")),
            sched.add_request(plain("p2", [11, 12], max_new=50)),
            sched.add_request(constrained("c3", [4, 5, 6, 7, 8], "(ab|cd)+z", max_new=40))]
    for r in reqs:
        if r.grammar is not None:
            r.grammar.result(timeout_s=None)
    passes = []
    while (sb := sched.schedule()) is not None:
        fb = build_forward_batch(sb)
        want = [j for j, it in enumerate(sb.items) if it.completes and it.req.grammar is not None]
        assert fb.grammar_rows.tolist() == want
        assert len(fb.grammar_bitmask) == len(want) * ((VOCAB + 31) // 32)
        passes.append(bool(want))
        sched.process_result(sb, worker.forward(fb))
    assert any(passes) and not all(passes)  # the plain ones ran on after the constrained ended
    by_rid = {r.rid: r for r in reqs}
    for rid, regex in (("c1", "[a-e]{4}[0-9]"), ("c3", "(ab|cd)+z")):
        r = by_rid[rid]
        assert r.finish_reason == "stop" and r.matched_stop == EOS and r.output_ids[-1] == EOS
        assert re.fullmatch(regex, text_of(r.output_ids))
        assert r.matcher.is_terminated and r.matcher.num_accepted == len(r.output_ids)
    assert by_rid["p0"].finish_reason == "length" and len(by_rid["p0"].output_ids) == 50


def test_overlap_defers_the_row_of_a_request_whose_token_is_in_flight(compiler) -> None:
    sched, worker = with_compiler(compiler)
    c = sched.add_request(constrained("c", [1, 2, 3], "[a-z]{8}"))
    sched.add_request(plain("p", [4, 5, 6], max_new=8))
    c.grammar.result(timeout_s=None)
    first = sched.schedule()  # both prefill and sample; c's row is known now
    fb1 = build_forward_batch(first)
    assert len(fb1.grammar_rows) == 1 and len(fb1.grammar_deferred) == 0
    second = sched.schedule()  # overlap: before the first pass's result
    assert {it.req.rid for it in second.items} == {"c", "p"}  # c is not held back
    fb2 = build_forward_batch(second)
    j = next(k for k, it in enumerate(second.items) if it.req is c)
    assert len(fb2.grammar_rows) == 0 and fb2.grammar_deferred.tolist() == [j]
    res1 = worker.forward(fb1)
    with pytest.raises(ValueError, match="GrammarMask"):  # a worker cannot sample it without the mask
        worker.forward(fb2)
    sched.process_result(first, res1)
    assert c.matcher.num_accepted == 1 == c.num_resolved_outputs
    mask = sched.grammar.fill_deferred(second)
    want = np.full_like(mask.bitmask, -1)
    c.matcher.fill_bitmask(want, 0)
    assert mask.batch_id == second.batch_id and mask.rows.tolist() == [j]
    assert np.array_equal(mask.bitmask, want) and not np.all(want == -1)
    sched.process_result(second, worker.forward(fb2, mask=mask))
    assert c.matcher.num_accepted == 2 and re.fullmatch("[a-z]{2}", text_of(c.output_ids))


def test_under_overlap_a_constrained_request_runs_in_every_pass_with_the_same_output(compiler) -> None:
    """Overlap on: the constrained requests are in every pass from admission to their end (plus
    the one pass whose token is dropped after it), and every output equals the overlap-off one."""
    specs = [("c0", [1, 2, 3], "[a-z]{8}"), ("c1", [5, 6, 7, 8], "(ab|cd){3,6}x"), ("c2", [9, 3], "[0-9]{5}")]
    results = {}
    for overlap in (False, True):
        sched, worker = with_compiler(compiler)
        reqs = [sched.add_request(constrained(rid, prompt, rx)) for rid, prompt, rx in specs]
        reqs.append(sched.add_request(plain("p", [4, 5, 6], max_new=30)))
        for r in reqs[:3]:
            r.grammar.result(timeout_s=None)
        passes: list[set[str]] = []  # the rids of each pass
        schedule = sched.schedule

        def recording_schedule(schedule=schedule, passes=passes):
            sb = schedule()
            if sb is not None:
                passes.append({it.req.rid for it in sb.items})
            return sb

        sched.schedule = recording_schedule
        res = run_to_idle(sched, worker, overlap=overlap)
        results[overlap] = res["outputs"]
        for (rid, _, rx), r in zip(specs, reqs, strict=False):
            assert res["reasons"][rid] == "stop" and re.fullmatch(rx, text_of(res["outputs"][rid]))
            steps = [k for k, rids in enumerate(passes) if rid in rids]
            assert steps == list(range(steps[0], steps[0] + len(steps)))  # no pass skipped
            # one pass per output, and under overlap the one whose token is dropped after the end
            assert len(steps) == len(r.output_ids) + overlap
        if overlap:
            assert any(worker.deferred_rows_seen)
    assert results[False] == results[True]


def test_deferred_row_of_a_request_that_ended_meanwhile_allows_every_token(compiler) -> None:
    """c's grammar ends after one letter: the pass scheduled while its EOS was in flight gets an
    all-ones row once the EOS is processed; so does an aborted request's."""
    sched, worker = with_compiler(compiler)
    c = sched.add_request(constrained("c", [1, 2, 3], "[a-z]"))
    d = sched.add_request(constrained("d", [4, 5, 6], "[a-z]{9}"))
    c.grammar.result(timeout_s=None)
    d.grammar.result(timeout_s=None)
    first = sched.schedule()
    fb1 = build_forward_batch(first)
    second = sched.schedule()
    fb2 = build_forward_batch(second)
    sched.process_result(first, worker.forward(fb1))
    mask2 = sched.grammar.fill_deferred(second)
    third = sched.schedule()  # c's EOS (sampled by `second`) is in flight
    fb3 = build_forward_batch(third)
    sched.process_result(second, worker.forward(fb2, mask=mask2))
    assert c.finish_reason == "stop" and c.output_ids[-1] == EOS
    sched.abort("d")
    mask3 = sched.grammar.fill_deferred(third)
    assert len(mask3.rows) == 2 and np.all(mask3.bitmask == -1)
    sched.process_result(third, worker.forward(fb3, mask=mask3))  # both tokens dropped
    assert c.output_ids[-1] == EOS and d.finish_reason == "abort"
    assert sched.schedule() is None and sched.is_idle


@pytest.mark.parametrize("overlap", [False, True])
def test_retraction_keeps_each_matcher_in_step_with_its_output(compiler, overlap: bool) -> None:
    """A pool far too small: requests are retracted (some with a token in flight) and resumed;
    every matcher has accepted exactly the resolved outputs, and every output matches."""
    sched, worker = with_compiler(compiler, page_size=4, num_pages=40, chunk=32, max_running=8)
    regex = "[a-z]{20,40}[0-9]"
    rng = np.random.default_rng(1)
    reqs = [sched.add_request(constrained(f"c{i}", rng.integers(40, 900, 30).tolist(), regex, max_new=60))
            for i in range(8)]
    reqs += [sched.add_request(plain(f"p{i}", rng.integers(40, 900, 20).tolist(), max_new=40))
             for i in range(4)]
    for r in reqs[:8]:
        r.grammar.result(timeout_s=None)

    def check(step: int) -> None:
        for r in reqs[:8]:
            if r.matcher is not None and not r.is_finished:
                assert r.matcher.num_accepted == r.num_resolved_outputs

    res = run_to_idle(sched, worker, on_step=check, overlap=overlap)
    assert sched.num_retractions > 0
    for r in reqs[:8]:
        assert res["reasons"][r.rid] == "stop", r.error
        assert re.fullmatch(regex, text_of(res["outputs"][r.rid]))
        assert r.matcher.num_accepted == len(r.output_ids)
    assert sched.kv.stats()["num_protected_pages"] == 0
