"""Grammar-constrained decoding in the scheduler: compiles, matchers, and each pass's bitmask rows.

A request with a grammar (GenerateReq.grammar_kind / grammar_text) is submitted to the
`GrammarCompilerService` at arrival (never blocks) and stays in the waiting queue, skipped by
admission, until its compile is done; then it gets its own `RequestMatcher`, or finishes with
finish_reason "abort" and the compile error. See docs/structured-outputs.md.

Matcher invariant: a request's matcher has accepted exactly its resolved outputs
(`Req.num_resolved_outputs`): a token is accepted when its pass's result is processed, and the only
outputs ever dropped (`Req.drop_in_flight_outputs`, at finish) are in-flight ones, never accepted.
Retraction keeps every output, so it needs no rollback either. A row is filled from the matcher
only when every output but the pass's own is resolved: at schedule time for a request with nothing
in flight (`fill`), else (overlap scheduling: its previous token is still being sampled) the row is
deferred and filled right after the previous pass's result is processed (`fill_deferred`), which
resolves that token. The worker waits for the deferred rows (protocol.GrammarMask) before sampling.

Critical path: while a pass waits for its deferred rows the device idles, so on the previous pass's
result the pipeline first does only what the rows need (`resolve`: resolve and accept the
constrained tokens, note which requests end), fills and sends the rows, and only then runs the rest
of `Scheduler.process_result` (finishes, prefix publishing, output buffering).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from radixrt.constrained import GrammarKind, GrammarSpec, RequestMatcher, allocate_bitmask
from radixrt.protocol import GrammarMask

if TYPE_CHECKING:
    from radixrt.constrained import GrammarCompilerService
    from radixrt.protocol import ForwardResult
    from radixrt.scheduler.batch import ScheduledBatch, ScheduledItem
    from radixrt.scheduler.req import Req

NO_GRAMMAR_SUPPORT = "this server has no grammar support (no tokenizer for the model): " \
    "constrained decoding (regex, ebnf, json_schema, response_format) is unavailable"


# the scheduler's finish rule for an output token: (req, token, number of outputs) -> (reason, matched)
FinishCheck = Callable[["Req", int, int], tuple["str | None", Any]]


@dataclass(slots=True)
class GrammarResolved:
    """One pass's result with its constrained tokens already resolved and accepted (`resolve`).

    token_ids: the pass's sampled tokens as Python ints, one per item. outcomes: per item, the
    matcher's verdict (`GrammarStage.accept`'s pair) where the token was accepted here, else None
    (unconstrained, not sampling, or finished before). ending: id() of the requests that end in this
    result (grammar end or rejection, stop token, length): their deferred rows in the next pass
    are all ones. Owned by the pipeline between `resolve` and `Scheduler.process_result`.
    """

    batch_id: int
    token_ids: list[int]
    outcomes: list[tuple[str | None, Any] | None]
    ending: set[int] = field(default_factory=set)


class GrammarStage:
    """The scheduler's grammar side. compiler None: constrained requests are refused with an error.

    Ownership: one per Scheduler; `compiling` holds the waiting requests whose compile is pending.
    """

    def __init__(self, compiler: GrammarCompilerService | None) -> None:
        self.compiler = compiler
        self.compiling: list[Req] = []
        # called (from a compile thread, or at once on a cache hit) when a submitted compile ends,
        # so a process loop that sleeps while only compiles are pending wakes up (scheduler_proc)
        self.on_compiled: Callable[[], None] | None = None

    @property
    def vocab_size(self) -> int:
        """Token ids a bitmask row describes (the compiler's TokenizerInfo, = the LM-head width)."""
        assert self.compiler is not None
        return self.compiler.vocab_size

    def submit(self, req: Req, kind: str, text: str) -> str | None:
        """Start compiling req's grammar; returns an error message when it cannot be (no compiler,
        unknown kind), else None and the request waits in `compiling`."""
        if self.compiler is None:
            return NO_GRAMMAR_SUPPORT
        try:
            spec = GrammarSpec(GrammarKind(kind), text)
        except (ValueError, TypeError) as e:
            return f"invalid grammar: {e}"
        req.grammar = self.compiler.submit(spec)
        self.compiling.append(req)
        if self.on_compiled is not None:
            req.grammar.add_done_callback(self.on_compiled)
        return None

    def poll(self) -> list[tuple[Req, str]]:
        """Give each request whose compile finished its RequestMatcher; returns (request, error)
        for the compiles that failed (the caller finishes them). Requests finished meanwhile
        (aborted while compiling) are dropped. Never blocks."""
        failed: list[tuple[Req, str]] = []
        pending: list[Req] = []
        for req in self.compiling:
            if req.is_finished:
                continue
            handle = req.grammar
            if not handle.done():
                pending.append(req)
                continue
            error = handle.error()
            if error is not None:
                failed.append((req, error))
            else:
                req.matcher = RequestMatcher(handle.result())
        self.compiling = pending
        return failed

    def wait(self, timeout_s: float) -> None:
        """Block up to timeout_s (s) for the oldest pending compile (callers with nothing else to
        do: the Engine while only compiles are pending). Never raises for a failed compile."""
        if self.compiling:
            try:
                self.compiling[0].grammar.result(timeout_s=timeout_s)
            except Exception:  # noqa: BLE001 - TimeoutError or the compile's GrammarError: poll() reports it
                pass

    @staticmethod
    def is_ready(req: Req) -> bool:
        """Unconstrained, or its grammar is compiled: admission may take it."""
        return req.grammar is None or req.matcher is not None

    def fill(self, items: list[ScheduledItem]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Bitmask rows of the pass's sampling constrained items, at schedule time: (rows int32 [R]
        indices into the pass's items, bitmask int32 [R, W], deferred int32 [D] indices into the
        items); None when no item needs one. Call before the pass's outputs begin. An item whose
        request has an output in flight (overlap) is deferred: its matcher has not seen that token
        yet; `fill_deferred` fills its row once the previous pass's result is processed."""
        rows: list[int] = []
        deferred: list[int] = []
        for j, it in enumerate(items):
            if it.completes and it.req.matcher is not None:
                (deferred if it.req.num_in_flight else rows).append(j)
        if not rows and not deferred:
            return None
        bitmask = allocate_bitmask(len(rows), self.vocab_size)
        for r, j in enumerate(rows):
            items[j].req.matcher.fill_bitmask(bitmask, r)
        return np.array(rows, np.int32), bitmask, np.array(deferred, np.int32)

    def resolve(self, sb: ScheduledBatch, res: ForwardResult, check_finish: FinishCheck) -> GrammarResolved:
        """The part of processing pass `sb`'s result that the next pass's deferred rows need: each
        sampling constrained request (not finished) resolves its token and its matcher accepts it;
        a request the verdict or `check_finish` (the scheduler's finish rule, side-effect free) ends
        is noted. Nothing is finished or published: `Scheduler.process_result(sb, res, record)` does
        that, using these verdicts. The matcher invariant holds throughout: resolving and accepting
        happen together, here instead of there."""
        assert res.batch_id == sb.batch_id, "results out of order"
        toks = res.next_token_ids.tolist()
        early = GrammarResolved(sb.batch_id, toks, [None] * len(sb.items))
        for i, it in enumerate(sb.items):
            req = it.req
            if req.matcher is None or not it.completes or req.is_finished:
                continue
            tok = toks[i]
            req.resolve_output(it.out_pos, tok)
            early.outcomes[i] = verdict = self.accept(req, tok)
            if verdict[0] is not None or check_finish(req, tok, it.out_pos + 1)[0] is not None:
                early.ending.add(id(req))
        return early

    def fill_deferred(self, sb: ScheduledBatch, ending: Collection[int] = frozenset()) -> GrammarMask:
        """The deferred rows of pass `sb` (sb.grammar[2]), filled now. Call right after the previous
        pass's result is processed, or resolved (`resolve`; its `ending` then names the requests that
        result ends): each deferred request's matcher has accepted every output but this pass's own.
        A request that ended meanwhile (grammar end, stop, length, abort) gets an all-ones row: its
        token in this pass is dropped, so any token will do. Only the D deferred rows are sent."""
        assert sb.grammar is not None
        deferred = sb.grammar[2]
        bitmask = allocate_bitmask(len(deferred), self.vocab_size)  # all ones
        for r, j in enumerate(deferred.tolist()):
            req = sb.items[j].req
            if req.is_finished or id(req) in ending:
                continue
            assert req.num_in_flight == 1, "a deferred row is filled once only its own output is in flight"
            req.matcher.fill_bitmask(bitmask, r)
        return GrammarMask(batch_id=sb.batch_id, rows=deferred, bitmask=bitmask)

    @staticmethod
    def accept(req: Req, tok: int) -> tuple[str | None, Any]:
        """Advance req's matcher by its sampled token: ("stop", tok) when the grammar terminated,
        ("abort", message) when it rejected the token (the mask was not applied), else (None, None)."""
        matcher = req.matcher
        if not matcher.accept_token(tok):
            if not matcher.admits_any_token():  # an empty language, or a dead end the compiler kept
                # num_resolved_outputs counts `tok`, the token just sampled and refused
                kept = max(0, req.num_resolved_outputs - 1)
                return "abort", (f"the output constraint (response_format, regex, ebnf, json_schema or "
                                 f"the forced tool call) admits no token after {kept} "
                                 f"output tokens: it matches no complete output")
            return "abort", (f"internal error: the grammar rejected sampled token {tok} "
                             f"(output token {req.num_resolved_outputs})")
        if matcher.is_terminated:
            return "stop", tok
        return None, None
