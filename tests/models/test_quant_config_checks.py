"""Malformed quantization_config values and config.json shapes: a ValueError / ModelLoadError naming
them, found by the launcher before any child starts (exit 2, one line), never AttributeError /
TypeError tracebacks from the worker (before: exit 1, a traceback from the worker and one from the
tokenizer process, which parsed the same config)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from radixrt.models.quant.qconfig import checkpoint_quantization, weight_block
from radixrt.models.resolve import ModelLoadError, check_model_dir
from tests.models.tiny import save_tiny_model


def _ct(weights: object) -> dict:
    return {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": weights}}}


MALFORMED = [
    "fp8", ["fp8"], 1,
    {"quant_method": "fp8", "weight_block_size": 0},
    {"quant_method": "fp8", "weight_block_size": []},
    {"quant_method": "compressed-tensors", "config_groups": [1, 2]},
    {"quant_method": "compressed-tensors", "config_groups": {"g": "junk"}},
    _ct("junk"),
    _ct({"type": "float", "num_bits": None, "strategy": "channel"}),
    _ct({"type": "float", "num_bits": [8], "strategy": "channel"}),
    _ct({"type": "float", "num_bits": 8.7, "strategy": "channel"}),
    _ct({"type": "float", "num_bits": "8", "strategy": "channel"}),
]


def test_compressed_tensors_without_groups_quantizes_nothing() -> None:
    """A sparsity-only compressed-tensors config (no config_groups) describes dense weights."""
    for q in ({"quant_method": "compressed-tensors"},
              {"quant_method": "compressed-tensors", "config_groups": {},
               "sparsity_config": {"format": "dense"}}):
        assert checkpoint_quantization({"quantization_config": q}) is None


@pytest.mark.parametrize("qc", MALFORMED, ids=[json.dumps(q)[:40] for q in MALFORMED])
def test_malformed_quantization_config_is_a_value_error(qc: object) -> None:
    with pytest.raises(ValueError):
        checkpoint_quantization({"quantization_config": qc})
    try:  # weight_block reads part of it: it may find nothing wrong, but raises nothing but ValueError
        weight_block({"quantization_config": qc})
    except ValueError:
        pass


def test_null_block_size_and_absent_config_still_mean_none() -> None:
    assert weight_block({"quantization_config": {"quant_method": "fp8", "weight_block_size": None}}) is None
    assert checkpoint_quantization({"quantization_config": None}) is None
    assert checkpoint_quantization({"quantization_config": {}}) is None


def test_check_model_dir_refuses_bad_quantization_and_non_object_config(tmp_path: Path) -> None:
    save_tiny_model("llama", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = _ct({"type": "float", "num_bits": None, "strategy": "channel"})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="compressed-tensors group 'g'"):
        check_model_dir(tmp_path, "auto")
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="JSON object"):
        check_model_dir(tmp_path, "auto")


def test_cli_exits_2_with_one_line_before_any_child(tmp_path: Path) -> None:
    save_tiny_model("llama", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = "fp8"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "radixrt.cli", "launch-server", "--device", "cpu",
                        "--port", str(port), "--model-path", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "quantization_config must be an object" in err[0], r.stderr
    assert "Traceback" not in r.stderr
