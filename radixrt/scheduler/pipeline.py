"""The pass pipeline: schedule -> build -> launch, then complete -> process, with overlap scheduling.

One loop for both drivers of the scheduler: the scheduler process (the worker over ZeroMQ) and the
in-process `radixrt.Engine` (a ModelRunner). They differ only in how a pass is launched and how
its result is awaited, which a `PassLauncher` supplies; everything else lives here: the pass in
flight, late binding after long prefill passes, and the device busy / gap totals.

Overlap scheduling (docs/scheduling.md): pass N+1 is built and launched before the result of pass N
is processed, so the device goes from N to N+1 without waiting for the scheduler's Python; the
tokens N samples enter N+1 as in-flight inputs the worker fills in (ForwardBatch.prev_token_pos).
A grammar-constrained request in N+1 whose token from N is in flight has its bitmask row deferred
(ForwardBatch.grammar_deferred): as soon as N's result arrives the pipeline resolves and accepts
only N's constrained tokens (`Scheduler.resolve_grammar`), fills those rows and hands them to the
launcher (`supply_mask`), and only then processes the rest of N's result; the worker, which started
N+1's forward at once, applies the rows before sampling.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from radixrt.protocol import ForwardBatch, ForwardResult, GrammarMask
from radixrt.scheduler.batch import ScheduledBatch, build_forward_batch
from radixrt.scheduler.scheduler import Scheduler

# A pass whose prompt chunks cost at least this many tokens' time (Scheduler.prefill_cost: a chunk
# deep into a long prompt costs more than its token count, scheduler/chunking.py) runs long (tens to
# hundreds of ms on a GPU), so the next pass is built after it ends rather than during it: requests
# that arrive meanwhile join the very next pass (lower TTFT), and the few ms of scheduling that
# overlap would hide are small next to such a pass. Shorter passes (decode, small prefills) keep
# overlap scheduling, and so does a long pass that left requests waiting: the next pass has queued
# work to take (e.g. the requests deferred behind a shared prefix this pass publishes), so it is
# built at once.
LATE_BINDING_PREFILL_TOKENS = 1024


class PassLauncher(Protocol):
    """How a pass reaches the device. `launch` must not wait for the pass; `finish` waits for its
    result. Passes are finished in launch order, each exactly once. ModelRunner is one.

    `supply_mask(handle, mask)` is called exactly once for a pass with deferred grammar rows, after
    the previous pass was finished and before this one is: the pass samples only once it has the
    mask. Launchers that never see grammar rows need not implement it.
    """

    def launch(self, batch: ForwardBatch) -> Any: ...

    def finish(self, handle: Any) -> ForwardResult: ...

    def supply_mask(self, handle: Any, mask: GrammarMask) -> None: ...


@dataclass(slots=True)
class PassRecord:
    """One completed pass, for pass hooks (benchmark tracing). Times in ms, t_s in perf_counter s.

    gap_ms: device idle before the pass (-1: the first pass, or one launched after an idle period).
    handle: what the launcher returned (e.g. ModelRunner's PendingPass, whose `path` names the
    forward path). process_ms is filled in after the hooks ran (they run before process_result,
    so the scheduler's state is the one the pass's result found).
    """

    sb: ScheduledBatch
    num_tokens: int
    handle: Any
    t_s: float
    schedule_ms: float
    build_ms: float
    launch_ms: float
    wait_ms: float = 0.0
    busy_ms: float = 0.0
    gap_ms: float = -1.0
    process_ms: float = 0.0


@dataclass(slots=True)
class _InFlight:
    sb: ScheduledBatch
    handle: Any
    after_idle: bool  # launched with nothing in flight after a step with no work: its gap is not idle
    num_prefill_tokens: int  # prompt tokens (of extends longer than one token)
    prefill_cost: float  # their estimated cost, in tokens (Scheduler.prefill_cost)
    record: PassRecord
    long: bool = False  # cost >= LATE_BINDING_PREFILL_TOKENS, and nobody waiting after its step


class PassPipeline:
    """Owns the pass in flight between `step` calls. Not thread-safe; one per Scheduler.

    Totals (ms): gpu_busy_ms_total (device time in passes), gpu_gap_ms_total (device idle between
    consecutive passes while there was work), forward_ms_total (worker wall time per pass),
    wait_ms_total (waiting for results), schedule_ms_total (schedule + build + launch).
    """

    def __init__(self, sched: Scheduler, launcher: PassLauncher, overlap: bool = True) -> None:
        self.sched = sched
        self.launcher = launcher
        self.overlap = overlap
        self.in_flight: _InFlight | None = None
        self._prev_busy = False
        self._hooks: list[Callable[[PassRecord], None]] = []
        self.num_passes = 0
        self.gpu_busy_ms_total = 0.0
        self.gpu_gap_ms_total = 0.0
        self.forward_ms_total = 0.0
        self.wait_ms_total = 0.0
        self.schedule_ms_total = 0.0

    def add_pass_hook(self, fn: Callable[[PassRecord], None]) -> Callable[[], None]:
        """Call fn(record) for every pass completed from now on; returns the function removing it."""
        self._hooks.append(fn)
        return lambda: self._hooks.remove(fn)

    @property
    def long_pass_in_flight(self) -> bool:
        """Late binding: the pass in flight is a long prefill; finish it before building the next."""
        return self.in_flight is not None and self.in_flight.long

    def step(self) -> bool:
        """Schedule and launch one pass; complete and process the previous one. False when idle.

        With overlap, the new pass is launched before the previous one's result is processed;
        without it (overlap=False) each pass is completed before the step returns.
        """
        t0 = time.perf_counter()
        sb = self.sched.schedule()
        launched = None
        if sb is not None:
            t1 = time.perf_counter()
            fb = build_forward_batch(sb)
            t2 = time.perf_counter()
            handle = self.launcher.launch(fb)
            t3 = time.perf_counter()
            self.schedule_ms_total += (t3 - t0) * 1e3
            record = PassRecord(sb=sb, num_tokens=len(fb.input_ids), handle=handle, t_s=t0,
                                schedule_ms=(t1 - t0) * 1e3, build_ms=(t2 - t1) * 1e3,
                                launch_ms=(t3 - t2) * 1e3)
            num_prefill = sum(it.extend_len for it in sb.items if it.extend_len > 1)
            after_idle = not self._prev_busy and self.in_flight is None
            launched = _InFlight(sb, handle, after_idle, num_prefill, self.sched.prefill_cost(sb), record)
        busy = sb is not None or self.in_flight is not None
        self._prev_busy = busy
        has_deferred = launched is not None and sb.grammar is not None and len(sb.grammar[2]) > 0
        awaits_mask = launched if has_deferred else None
        if self.in_flight is not None:
            self._complete(self.in_flight, awaits_mask)
        elif awaits_mask is not None:  # (deferred rows imply a pass in flight; kept for safety)
            self.launcher.supply_mask(awaits_mask.handle, self.sched.grammar.fill_deferred(sb))
        if launched is not None and not self.overlap:
            self._complete(launched)
            launched = None
        self.in_flight = launched
        if launched is not None:  # (requests that arrived while the previous pass ran count as waiting)
            launched.long = (not self.sched.waiting
                             and launched.prefill_cost >= LATE_BINDING_PREFILL_TOKENS)
        return busy

    def finish_in_flight(self) -> None:
        """Complete and process the pass in flight now, if any (late binding)."""
        if self.in_flight is not None:
            self._complete(self.in_flight)
            self.in_flight = None

    def _complete(self, p: _InFlight, awaits_mask: _InFlight | None = None) -> None:
        """Wait for pass p's result and process it. awaits_mask: the pass launched behind p with
        deferred grammar rows; its GrammarMask goes out as early as it can: after only the
        constrained tokens of p were resolved and accepted, before the rest of process_result."""
        t0 = time.perf_counter()
        res = self.launcher.finish(p.handle)
        t1 = time.perf_counter()
        self.wait_ms_total += (t1 - t0) * 1e3
        self.forward_ms_total += res.forward_ms
        self.gpu_busy_ms_total += res.gpu_busy_ms
        if not p.after_idle and res.gpu_gap_ms >= 0:
            self.gpu_gap_ms_total += res.gpu_gap_ms
        self.num_passes += 1
        rec = p.record
        if self._hooks:
            rec.wait_ms, rec.busy_ms = (t1 - t0) * 1e3, res.gpu_busy_ms
            rec.gap_ms = -1.0 if p.after_idle else res.gpu_gap_ms
            for fn in list(self._hooks):
                fn(rec)
        early = None
        if awaits_mask is not None:  # the device idles until the mask arrives: send it first
            early = self.sched.resolve_grammar(p.sb, res)
            mask = self.sched.grammar.fill_deferred(awaits_mask.sb, early.ending)
            self.launcher.supply_mask(awaits_mask.handle, mask)
        self.sched.process_result(p.sb, res, early)
        if self._hooks:
            rec.process_ms = (time.perf_counter() - t1) * 1e3
