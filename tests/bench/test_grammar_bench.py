"""bench/grammar_bench.py --quick on the CPU: a tiny dummy-weights model with a stand-in tokenizer,
plain and json_schema phases through the Engine, and the compile figures (the HTTP path is the
same code behind a server and is left to the GPU run)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import grammar_bench


def test_quick_run_reports_both_kinds_with_equal_lengths(tmp_path: Path) -> None:
    out = tmp_path / "grammar.json"
    assert grammar_bench.main(["--quick", "--only", "compile,engine", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    engine = report["summary"]["engine"]
    assert engine["plain"]["output_tok_s"] > 0 and engine["json"]["output_tok_s"] > 0
    assert engine["ratio"] > 0
    # the schema cannot be complete before max_new_tokens: both kinds run to the same length
    for row in report["phases"]:
        assert row["finish_reasons"] == {"length": row["num_requests"]}, row
        assert row["mean_output_len"] == report["args"]["output_len"]
    grammars = {g["name"]: g for g in report["compile"]["grammars"]}
    assert grammars["bench_schema"]["cached_same_object"]
