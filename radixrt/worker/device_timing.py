"""When a pass ran on the device: its busy time and the idle gap before it, without host syncs.

On CUDA a pass is bracketed by two timing events recorded on the current stream, so `launch` can
return before the work is done and the times are read once `finish` has waited for the end event.
On CPU the work is done by the time `launch` returns, and wall-clock stamps stand in for events.
The scheduler sums the busy and gap times into its GPU idle fraction (ForwardResult.gpu_busy_ms,
gpu_gap_ms).
"""

from __future__ import annotations

import time

import torch


class TimedSpan:
    """The device span of one pass: CUDA events around its work (wall clock on CPU).

    Created at the start of the pass's work (`start`), closed after its last kernel is queued
    (`stop`). `busy_ms` and `gap_ms` are valid after `wait` (or once `done` is True).
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.begin = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.t_begin = self.t_end = time.perf_counter()

    @classmethod
    def start(cls, device: torch.device) -> TimedSpan:
        """Open a span now (records the begin event on the current CUDA stream)."""
        return cls(device)

    def stop(self) -> None:
        """Close the span after the pass's last queued work."""
        if self.cuda:
            self.end.record()
        else:
            self.t_end = time.perf_counter()

    def done(self) -> bool:
        """True when the device has passed the end of the span (never blocks)."""
        return self.end.query() if self.cuda else True

    def wait(self) -> None:
        """Block until the device has passed the end of the span."""
        if self.cuda:
            self.end.synchronize()

    def busy_ms(self) -> float:
        """Device time of the pass (ms); valid after wait()."""
        return self.begin.elapsed_time(self.end) if self.cuda else (self.t_end - self.t_begin) * 1e3

    def gap_ms(self, prev: TimedSpan | None) -> float:
        """Device idle time (ms) between the end of `prev` and the start of this pass; -1 if none."""
        if prev is None:
            return -1.0
        if self.cuda:
            return max(0.0, prev.end.elapsed_time(self.begin))
        return max(0.0, (self.t_begin - prev.t_end) * 1e3)
