"""Tiny random Hugging Face checkpoints (built in-process, nothing downloaded) for model tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

BASE: dict[str, Any] = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                            rms_norm_eps=1e-6)


def tiny_config(family: str, **overrides: Any):
    """A transformers config of a small model of `family` ("llama", "llama3", "qwen2", "qwen3")."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    kw = {**BASE, **overrides}
    if family == "llama":
        return LlamaConfig(**kw, tie_word_embeddings=True, rope_theta=10000.0)
    if family == "llama3":
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64, "rope_theta": 500000.0}
        return LlamaConfig(**kw, rope_parameters=scaling)
    if family == "qwen2":
        return Qwen2Config(**kw, rope_theta=1000000.0, tie_word_embeddings=True)
    if family == "qwen3":
        return Qwen3Config(**kw, head_dim=32, rope_theta=1000000.0)
    raise ValueError(family)


def save_tiny_model(family: str, out: Path, seed: int = 0, **overrides: Any):
    """Random-init HF model of `family` saved to `out` (safetensors); returns the HF model (fp32)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides), dtype=torch.float32).eval()
    with torch.no_grad():  # larger weights than the default init, so logits are far from uniform
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif "bias" in name:
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.08)
    model.save_pretrained(out, safe_serialization=True)
    return model


def write_config(out: Path, **cfg: Any) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    return out
