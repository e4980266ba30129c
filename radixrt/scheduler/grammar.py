"""Grammar-constrained decoding in the scheduler: compiles, matchers, and each pass's bitmask rows.

A request with a grammar (GenerateReq.grammar_kind / grammar_text) is submitted to the
`GrammarCompilerService` at arrival (never blocks) and stays in the waiting queue, skipped by
admission, until its compile is done; then it gets its own `RequestMatcher`, or finishes with
finish_reason "abort" and the compile error. See docs/structured-outputs.md.

Matcher invariant: a request's matcher has accepted exactly its resolved outputs
(`Req.num_resolved_outputs`): a token is accepted when its pass's result is processed, and the only
outputs ever dropped (`Req.drop_in_flight_outputs`, at finish) are in-flight ones, never accepted.
Retraction keeps every output, so it needs no rollback either. Since a pass's mask depends on the
previous token, a constrained request whose last token is still in flight (overlap scheduling) is
not scheduled in that pass (`blocks_overlap`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from radixrt.constrained import GrammarKind, GrammarSpec, RequestMatcher, allocate_bitmask

if TYPE_CHECKING:
    from radixrt.constrained import GrammarCompilerService
    from radixrt.scheduler.batch import ScheduledItem
    from radixrt.scheduler.req import Req

NO_GRAMMAR_SUPPORT = "this server has no grammar support (no tokenizer for the model): " \
    "constrained decoding (regex, ebnf, json_schema, response_format) is unavailable"


class GrammarStage:
    """The scheduler's grammar side. compiler None: constrained requests are refused with an error.

    Ownership: one per Scheduler; `compiling` holds the waiting requests whose compile is pending.
    """

    def __init__(self, compiler: GrammarCompilerService | None) -> None:
        self.compiler = compiler
        self.compiling: list[Req] = []

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

    @staticmethod
    def is_ready(req: Req) -> bool:
        """Unconstrained, or its grammar is compiled: admission may take it."""
        return req.grammar is None or req.matcher is not None

    @staticmethod
    def blocks_overlap(req: Req) -> bool:
        """Constrained with its last token still being sampled: its next mask is not known yet."""
        return req.matcher is not None and req.num_in_flight > 0

    def fill(self, items: list[ScheduledItem]) -> tuple[np.ndarray, np.ndarray] | None:
        """Bitmask rows of the pass's sampling constrained items: (rows int32 [R] indices into the
        pass's items, bitmask int32 [R, W]); None when no item needs one. Call before the pass's
        outputs begin (each matcher has accepted every resolved output)."""
        rows = [j for j, it in enumerate(items) if it.completes and it.req.matcher is not None]
        if not rows:
            return None
        bitmask = allocate_bitmask(len(rows), self.vocab_size)
        for r, j in enumerate(rows):
            items[j].req.matcher.fill_bitmask(bitmask, r)
        return np.array(rows, np.int32), bitmask

    @staticmethod
    def accept(req: Req, tok: int) -> tuple[str | None, Any]:
        """Advance req's matcher by its sampled token: ("stop", tok) when the grammar terminated,
        ("abort", message) when it rejected the token (the mask was not applied), else (None, None)."""
        matcher = req.matcher
        if not matcher.accept_token(tok):
            return "abort", (f"internal error: the grammar rejected sampled token {tok} "
                             f"(output token {req.num_resolved_outputs})")
        if matcher.is_terminated:
            return "stop", tok
        return None, None
