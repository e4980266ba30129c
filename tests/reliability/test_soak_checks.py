"""The soak harness's accounting rules (bench/soak.py `_check_idle`), on made-up reports."""

from __future__ import annotations

from typing import Any

from bench.soak import SoakReport, _check_idle

IDLE = {"invariants_ok": True, "unfinished_handles": {"json": 0.0},
        "collected_unfinished_handles": {"json": 0.0}}


def _report(ok: float, aborted: float, disconnected: float = 0.0, complete: int = 10, abandoned: int = 4,
            **idle: Any) -> SoakReport:
    r = SoakReport(config={}, counts={"complete": complete, "abandoned": abandoned},
                   aborted_counter_delta=aborted, ok_counter_delta=ok,
                   outcome_deltas={"ok": ok, "aborted": aborted, "disconnected": disconnected},
                   idle_stats={**IDLE, **idle})
    _check_idle(r, None)
    return r


def test_every_request_recorded_passes() -> None:
    r = _report(ok=11, aborted=2, disconnected=1)  # one abandoned request had finished: ok
    assert r.problems == [] and r.counts["abandoned_never_seen"] == 0


def test_abandoned_requests_the_server_never_saw_are_reported_not_failed() -> None:
    r = _report(ok=10, aborted=1)
    assert r.problems == [] and r.counts["abandoned_never_seen"] == 3


def test_lost_complete_requests_and_unended_handles_fail() -> None:
    assert _report(ok=9, aborted=4).problems  # a complete request without an outcome
    assert _report(ok=10, aborted=5).problems  # more aborted than abandoned
    assert _report(ok=10, aborted=4, unfinished_handles={"stream_started": 1.0}).problems
    assert _report(ok=10, aborted=4, collected_unfinished_handles={"json": 2.0}).problems
