"""Maps Hugging Face `architectures` names to radixrt model classes and their config switches.

All supported families share one module (`llama.LlamaForCausalLM`); they differ only in flags:
Qwen2/2.5 add biases to the q/k/v projections, Qwen3 adds per-head RMSNorm on q and k.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """How to build one architecture: the module class and flags overriding config.json."""

    architecture: str
    flags: dict[str, Any] = field(default_factory=dict)

    def model_class(self) -> type[nn.Module]:
        from radixrt.models.llama import LlamaForCausalLM

        return LlamaForCausalLM


_SPECS: dict[str, ModelSpec] = {
    "LlamaForCausalLM": ModelSpec("LlamaForCausalLM"),
    "Qwen2ForCausalLM": ModelSpec("Qwen2ForCausalLM", {"qkv_bias": True, "o_bias": False}),
    "Qwen3ForCausalLM": ModelSpec("Qwen3ForCausalLM", {"qk_norm": True}),
}


def supported_architectures() -> list[str]:
    return sorted(_SPECS)


def find_spec(architectures: list[str] | None) -> ModelSpec | None:
    """The spec of the first supported name in a config's `architectures` list, or None."""
    for name in architectures or []:
        if name in _SPECS:
            return _SPECS[name]
    return None
