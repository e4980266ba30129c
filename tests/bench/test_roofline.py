"""Roofline numbers against the table of shared/bench/peers.md (Qwen2.5-7B shape on one H200)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.roofline import H200, QWEN25_7B, Hardware, ModelShape, roofline
from bench.workloads import WorkloadSpec

RANDOM = WorkloadSpec(name="random", num_prompts=256, input_len=512, output_len=256)
SHARED = WorkloadSpec(name="shared-prefix", num_groups=1, prompts_per_group=128, system_prompt_len=2048,
                      question_len=128, output_len=64)


def test_qwen_shape_constants() -> None:
    assert QWEN25_7B.kv_bytes_per_token == 56 * 1024  # 28 x 2 x 4 x 128 x 2 bytes
    assert QWEN25_7B.weight_bytes == pytest.approx(14.1e9, rel=0.01)
    assert QWEN25_7B.weight_bytes / H200.copy_bytes_per_s == pytest.approx(3.3e-3, rel=0.03)


def test_random_512_256_matches_peers() -> None:
    b = roofline(QWEN25_7B, H200, RANDOM.build(), "compute")
    assert b["prefill_s"] == pytest.approx(2.43, rel=0.05)
    assert b["decode_s"] == pytest.approx(1.42, rel=0.05)
    assert b["total_s"] == pytest.approx(3.85, rel=0.05)
    assert b["output_tok_s"] == pytest.approx(17_000, rel=0.05)
    assert b["prompt_tokens_computed"] == 256 * 512


@pytest.mark.parametrize("reuse,prefill_s,decode_s,tok_s", [
    ("compute", 0.35, 0.46, 10_100),
    ("compute_and_read", 0.35, 0.23, 14_100),
    ("none", 5.28, 0.46, 1_430),
])
def test_shared_prefix_matches_peers(reuse: str, prefill_s: float, decode_s: float, tok_s: float) -> None:
    b = roofline(QWEN25_7B, H200, SHARED.build(), reuse)
    assert b["prefill_s"] == pytest.approx(prefill_s, rel=0.06)
    assert b["decode_s"] == pytest.approx(decode_s, rel=0.05)
    assert b["output_tok_s"] == pytest.approx(tok_s, rel=0.05)


def test_from_config_file_equals_preset(tmp_path: Path) -> None:
    cfg = {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
           "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert ModelShape.from_config(tmp_path) == QWEN25_7B  # head_dim derived: 3584 / 28
    assert ModelShape.from_config(tmp_path / "config.json") == QWEN25_7B


def test_single_decode_step_is_the_larger_of_bytes_and_flops() -> None:
    shape = ModelShape(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                       intermediate_size=128, vocab_size=1000)
    w = WorkloadSpec(name="random", num_prompts=1, input_len=10, output_len=1, vocab_size=2000).build()
    mem_bound = Hardware(copy_bytes_per_s=1e9, matmul_flops_per_s=1e30)
    b = roofline(shape, mem_bound, w)
    assert b["decode_s"] == pytest.approx((shape.weight_bytes + 10 * shape.kv_bytes_per_token) / 1e9)
    flop_bound = Hardware(copy_bytes_per_s=1e30, matmul_flops_per_s=1e9)
    b = roofline(shape, flop_bound, w)
    step_flops = 2 * shape.params_without_embedding + shape.attn_flops_per_pair * 10
    assert b["decode_s"] == pytest.approx(step_flops / 1e9)


def test_multi_turn_reuse_saves_prefill_only() -> None:
    w = WorkloadSpec(name="multi-turn", num_clients=4, num_turns=3, input_len=256, turn_len=32,
                     output_len=32).build()
    none = roofline(QWEN25_7B, H200, w, "none")
    cached = roofline(QWEN25_7B, H200, w, "compute")
    assert none["prompt_tokens_computed"] == 4 * (256 + 320 + 384)
    assert cached["prompt_tokens_computed"] == 4 * (256 + 32 + 32)
    assert cached["prefill_s"] < none["prefill_s"]
    assert cached["decode_s"] == pytest.approx(none["decode_s"])


def test_bad_reuse_mode() -> None:
    with pytest.raises(ValueError):
        roofline(QWEN25_7B, H200, RANDOM.build(), "sometimes")
