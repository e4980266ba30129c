"""bench/lab/pass_timeline.py: the summary of a pass trace inside a workload's window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.lab.pass_timeline import head, summarize, tables


def rec(t_s: float, ext: int, ext_tokens: int, dec: int, running: int, busy: float = 10.0,
        gap: float = 0.0) -> dict:
    return {"t_s": t_s, "extend_reqs": ext, "extend_tokens": ext_tokens, "decode_reqs": dec,
            "tokens": ext_tokens + dec, "waiting": 0, "running": running, "schedule_ms": 0.5,
            "build_ms": 0.25, "launch_ms": 0.25, "wait_ms": 9.0, "busy_ms": busy, "gap_ms": gap,
            "process_ms": 1.0}


TRACE = [rec(0.5, 1, 100, 0, 1),  # before the window: not counted
         rec(10.002, 2, 512, 0, 2), rec(10.012, 1, 256, 2, 3, gap=2.0), rec(10.022, 0, 0, 3, 3),
         rec(10.032, 0, 0, 3, 3, gap=1.0), rec(10.042, 0, 0, 1, 1, gap=-1.0)]


def test_summary_of_the_passes_in_the_window() -> None:
    s = summarize(TRACE, [10.0, 11.0])
    assert s["passes"] == 5 and s["first_pass_ms"] == pytest.approx(2.0)
    assert s["span_ms"] == pytest.approx(40.0 + 0.25 + 9.0)
    assert s["busy_share"] == pytest.approx(50.0 / 49.25)
    assert (s["extend_passes"], s["decode_passes"]) == (2, 3)
    assert s["mean_extend_tokens"] == pytest.approx(384.0)
    assert s["mean_decode_rows"] == pytest.approx(7 / 3)
    assert (s["peak_running"], s["ramp_ms"], s["drain_ms"]) == (3, pytest.approx(10.0), pytest.approx(10.0))
    assert s["host_ms_per_pass"] == pytest.approx(2.0)
    assert s["gap_ms_total"] == pytest.approx(3.0)  # -1 (after idle) is not idle time
    assert summarize(TRACE, [20.0, 21.0]) == {"passes": 0, "window_s": 1.0}
    assert [round(r["offset_ms"]) for r in head(TRACE, [10.0, 11.0], 20.0)] == [0, 10, 20]


def test_tables_pair_the_engine_and_the_server(tmp_path: Path) -> None:
    (tmp_path / "engine.jsonl").write_text("\n".join(json.dumps(r) for r in TRACE) + "\n")
    (tmp_path / "server.jsonl").write_text("\n".join(json.dumps(r) for r in TRACE[:3]) + "\n")
    report = {"engine": {"random": {"window": [10.0, 11.0], "output_throughput": 100.0}},
              "http": {"random": {"window": [10.0, 11.0], "output_throughput": 90.0},
                       "shared-prefix": {"window": [0.0, 1.0]}}}  # no Engine part: left out
    text, data = tables(report, tmp_path, 200.0)
    assert list(data) == ["random"]
    assert "HTTP / Engine output tok/s 90 / 100 = 0.90" in text
    assert data["random"]["summary"]["engine"]["passes"] == 5
    assert data["random"]["summary"]["http"]["passes"] == 2
    assert "| passes | 5 | 2 |" in text
