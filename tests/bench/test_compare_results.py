"""bench/compare_results.py reads the recorded engine figures and lines a run up against them;
bench/gpu_engine.py's headline figures carry the names the table uses."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench import compare_results
from bench.gpu_engine import headline_figures

ROOT = Path(__file__).resolve().parents[2]


def test_recorded_engine_figures_parse() -> None:
    rows = compare_results.recorded_figures(ROOT / "bench" / "results" / "engine.md")
    rand = rows["random tok/s"]
    assert float(rand["value"]) > 0 and re.fullmatch(r"[0-9a-f]{7}", rand["commit"])
    assert rows["batch-1 TPOT overlap on"]["unit"] == "ms" and rows["random tok/s"]["unit"] == "tok/s"
    assert all(r["date"] for r in rows.values())


def test_compare_lines_up_a_run_with_the_table(tmp_path: Path, capsys) -> None:
    table = tmp_path / "t.md"
    table.write_text("text\n\n| figure | value | unit | date | commit |\n|---|---|---|---|---|\n"
                     "| random tok/s | 1,000 | tok/s | 2026-11-30 | abc |\n"
                     "| idle | 12-16 | % | d | c |\n\nafter\n")
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"date": "x", "commit": "y", "device": "z",
                               "headline": {"random tok/s": 1100.0, "idle": 3.0, "new figure": 1.0}}))
    assert compare_results.main([str(run), "--table", str(table)]) == 0
    out = capsys.readouterr().out
    assert "| random tok/s | 1,000 tok/s | 2026-11-30, abc | 1100.00 | 1.100 |" in out
    assert "| idle | 12-16 % | d, c | 3.00 |  |" in out  # a range has no ratio
    assert "| new figure |  | (not recorded) | 1.00 |  |" in out


def test_headline_figures_use_the_table_names() -> None:
    report = {"decode_b1": {"overlap": {"ms_per_token": 4.2, "busy_ms_median": 4.1},
                            "no_overlap": {"ms_per_token": 4.7}, "weights_read_ms": 3.3},
              "profile_b1": {"graph_replay_ms_median": 4.0},
              "medians": {"shared-prefix cache=True cascade=True": 9800.0},
              "results": [{"workload": {"name": "shared-prefix"}, "cache_on": False, "cascade": True,
                           "output_throughput": 1000.0},
                          {"workload": {"name": "shared-prefix"}, "cache_on": True, "cascade": False,
                           "output_throughput": 8800.0},
                          {"workload": {"name": "shared-prefix"}, "cache_on": True, "cascade": True,
                           "output_throughput": 9700.0}]}
    figures = headline_figures(report)
    recorded = compare_results.recorded_figures(ROOT / "bench" / "results" / "engine.md")
    assert figures == {"batch-1 TPOT overlap on": 4.2, "batch-1 TPOT overlap off": 4.7,
                       "batch-1 device time per pass": 4.1, "weights read once at copy bandwidth": 3.3,
                       "batch-1 graph replay": 4.0, "shared-prefix tok/s": 9800.0,
                       "shared-prefix cache off tok/s": 1000.0, "shared-prefix cascade off tok/s": 8800.0}
    assert set(figures) <= set(recorded)
