"""A pass-by-pass trace of the scheduler's pipeline, for benchmarks: RADIXRT_PASS_TRACE=PATH.

When the variable is set, the scheduler process and `radixrt.Engine` append one JSON object per
completed pass to PATH (one line each, written in batches of `FLUSH_EVERY` and at exit):

    t_s            time.perf_counter() at the start of the pass's schedule step (s; CLOCK_MONOTONIC
                   on Linux, so comparable between the processes of one machine)
    extend_reqs    requests in the pass with more than one new token (prompt chunks)
    extend_tokens  their new tokens
    decode_reqs    requests with one new token (decodes, and one-token prompt tails)
    tokens         all new tokens of the pass
    waiting        requests queued when the pass's result came back; running: requests running then
    schedule_ms / build_ms / launch_ms   host time of the three steps before the launch
    wait_ms        host time waiting for the result; busy_ms: the worker's device (or forward) time
    gap_ms         device idle before the pass (-1: the first pass after an idle period)
    process_ms     host time processing the result (after the trace hook ran)

Two processes must not share PATH: the Engine and a server each get their own file. Readers:
bench/lab/pass_timeline.py.
"""

from __future__ import annotations

import atexit
import json
from pathlib import Path
from typing import IO

from radixrt.scheduler.pipeline import PassPipeline, PassRecord

FLUSH_EVERY = 256  # records per write


class PassTrace:
    """A pass hook writing the records above; `close` flushes the last ones. Not thread-safe."""

    def __init__(self, path: str | Path, pipeline: PassPipeline) -> None:
        self._file: IO[str] | None = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._pipeline = pipeline
        # the last record with the queue lengths at its completion; its process_ms is known once the
        # next pass completes (or at close)
        self._last: tuple[PassRecord, int, int] | None = None
        self._lines: list[str] = []
        self._remove = pipeline.add_pass_hook(self._on_pass)
        atexit.register(self.close)

    def _on_pass(self, rec: PassRecord) -> None:
        if self._last is not None:
            self._lines.append(self._line(*self._last))
            if len(self._lines) >= FLUSH_EVERY:
                self.flush()
        sched = self._pipeline.sched
        self._last = (rec, len(sched.waiting), len(sched.running))

    @staticmethod
    def _line(rec: PassRecord, waiting: int, running: int) -> str:
        ext = [it.extend_len for it in rec.sb.items if it.extend_len > 1]
        return json.dumps({
            "t_s": round(rec.t_s, 6), "extend_reqs": len(ext), "extend_tokens": sum(ext),
            "decode_reqs": len(rec.sb.items) - len(ext), "tokens": rec.num_tokens,
            "waiting": waiting, "running": running,
            "schedule_ms": round(rec.schedule_ms, 3), "build_ms": round(rec.build_ms, 3),
            "launch_ms": round(rec.launch_ms, 3), "wait_ms": round(rec.wait_ms, 3),
            "busy_ms": round(rec.busy_ms, 3), "gap_ms": round(rec.gap_ms, 3),
            "process_ms": round(rec.process_ms, 3)})

    def flush(self) -> None:
        if self._file is not None and self._lines:
            self._file.write("\n".join(self._lines) + "\n")
            self._file.flush()
            self._lines.clear()

    def idle(self) -> None:
        """The pipeline has nothing in flight: write every record, the last one included."""
        if self._last is not None:
            self._lines.append(self._line(*self._last))
            self._last = None
        self.flush()

    def close(self) -> None:
        """Write what is left and stop tracing; idempotent."""
        if self._file is None:
            return
        self.idle()
        self._file.close()
        self._file = None
        self._remove()


def maybe_trace(pipeline: PassPipeline, path: Path | None) -> PassTrace | None:
    """A PassTrace on `pipeline` when `path` (Env.pass_trace) is set, else None."""
    return PassTrace(path, pipeline) if path is not None else None
