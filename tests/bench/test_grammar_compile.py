"""A quick run of bench/grammar_compile.py on the default model's tokenizer: every field is there,
the cached compile returns the same object, and the walks really advanced. No timings asserted."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bench import grammar_compile
from radixrt.constrained import GrammarKind, GrammarSpec


def test_grammar_bench_reports_every_field(model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    grammars = [("yes_no", GrammarSpec(GrammarKind.REGEX, "(yes|no)")),
                ("schema", GrammarSpec(GrammarKind.JSON_SCHEMA, '{"type": "object", "properties": '
                                                                '{"a": {"type": "integer"}}}'))]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = grammar_compile.run(tokenizer, vocab_size=vocab, steps=6, batch_size=2, grammars=grammars)
    finally:
        torch.set_num_threads(before)
    assert set(grammar_compile.RUN_FIELDS) <= result.keys()
    assert result["vocab_size"] == vocab and result["steps"] == 6 and result["batch_size"] == 2
    assert [g["name"] for g in result["grammars"]] == ["yes_no", "schema"]
    for row in result["grammars"]:
        assert set(grammar_compile.GRAMMAR_FIELDS) <= row.keys()
        assert row["cached_same_object"] is True
        assert row["cold_compile_ms"] >= 0 and row["fill_us_per_request_step"] > 0
    # "(yes|no)" ends within 3 tokens + stop, so 6 steps of 2 walks must have reset at least once
    assert result["grammars"][0]["num_resets"] >= 2
    assert set(result["apply_ms_per_step"]) == {"xgrammar", "torch"}
    json.dumps(result)  # serializable as written by --out


def test_default_grammars_are_valid() -> None:
    from radixrt.constrained import validate_spec

    names = [name for name, spec in grammar_compile.default_grammars() if validate_spec(spec)]
    assert len(names) == len(set(names)) == 5
