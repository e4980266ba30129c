"""bench/host_schedule_bench.py: the model-free harness runs the real engine loop, reports every pass
kind, and its decision fingerprint is reproducible."""

from __future__ import annotations

import pytest

from bench.host_schedule_bench import main


def test_reports_every_pass_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workload", "shared-prefix", "--repeat", "1", "--show-passes", "3"]) == 0
    out = capsys.readouterr().out
    assert "shared-prefix: 66 passes" in out and "cached tokens 260096" in out
    for kind in ("first ", "admission ", "decode "):
        assert f"  {kind}" in out
    assert "generate() before the first pass" in out and "overall host" in out


def test_fingerprint_is_reproducible(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--workload", "shared-prefix", "--fingerprint", "--num-pages", "700", "--max-running-requests",
            "64"]
    main(args)
    first = capsys.readouterr().out
    main(args)
    assert capsys.readouterr().out == first
    assert "retractions 0," not in first  # the small pool makes the run retract
