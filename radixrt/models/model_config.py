"""`ModelConfig`: the architecture facts radixrt needs, read from a Hugging Face config.json.

Read directly from the JSON (no transformers import) so that worker start-up stays fast. Both the
older layout (`rope_theta`, `rope_scaling`) and the transformers-5 layout (`rope_parameters`) are
accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(slots=True)
class ModelConfig:
    """Decoder-only transformer shape and per-architecture switches.

    qkv_bias / o_bias / mlp_bias: linear biases (Qwen2 has qkv_bias only).
    qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3).
    eos_token_ids: ids that end generation (from generation_config.json, else config.json).
    """

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str | None = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _as_id_list(v: Any) -> list[int]:
    if v is None:
        return []
    return [int(x) for x in v] if isinstance(v, list) else [int(v)]


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    params = cfg.get("rope_parameters")
    for key in ("rope_parameters", "rope_scaling"):  # a string or a list crashed later (AttributeError)
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise ValueError(f"{key} (an object or null expected, got {cfg[key]!r})")
    if isinstance(params, dict):  # transformers >= 5: theta and scaling in one dict
        theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = params.get("rope_type", params.get("type", "default"))
        return theta, (None if rope_type == "default" else dict(params))
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return float(cfg.get("rope_theta", 10000.0)), scaling


def parse_config(cfg: dict[str, Any], flags: dict[str, Any], eos_ids: list[int]) -> ModelConfig:
    """Build a ModelConfig from a config.json dict plus registry flags (see registry.py).

    Raises:
        KeyError: a required field is missing. ValueError: rope_parameters / rope_scaling not an
            object (nor null).
    """
    theta, scaling = _rope(cfg)
    num_heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
        architecture=(cfg.get("architectures") or ["?"])[0],
        model_type=str(cfg.get("model_type", "?")),
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=num_heads,
        # absent or null: the MHA / hidden-split defaults; an explicit 0 stays 0 and is refused
        num_kv_heads=int(num_heads if cfg.get("num_key_value_heads") is None else cfg["num_key_value_heads"]),
        head_dim=int((hidden // num_heads if num_heads > 0 else 0) if cfg.get("head_dim") is None
                     else cfg["head_dim"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(flags.get("qkv_bias", attention_bias)),
        o_bias=bool(flags.get("o_bias", attention_bias)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=bool(flags.get("qk_norm", False)),
        eos_token_ids=eos_ids or _as_id_list(cfg.get("eos_token_id")),
        torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
    )


def read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_eos_ids(model_dir: Path) -> list[int]:
    """EOS ids from generation_config.json (preferred, as HF generate does), else []."""
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        return _as_id_list(read_json(gen).get("eos_token_id"))
    return []
