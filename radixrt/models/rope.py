"""Rotary-embedding frequency tables, with the rope_scaling variants radixrt supports.

Supported `rope_type`s: "default" (plain RoPE, Su et al. 2021), "linear" (position interpolation,
Chen et al. 2023: every frequency divided by `factor`) and "llama3" (Meta's Llama 3.1 recipe: low
frequencies divided by `factor`, high frequencies kept, a linear blend between the two bands).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from radixrt.models.resolve import SUPPORTED_ROPE_TYPES  # declared torch-free there


def inv_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [D/2] float32 for rotary dimension pairs.

    Raises:
        ValueError: an unsupported rope_type.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        return _llama3_scale(inv_freq, scaling)
    raise ValueError(f"unsupported rope_scaling type {rope_type!r} (supported: {SUPPORTED_ROPE_TYPES})")


def _llama3_scale(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency scaling: long wavelengths slowed by `factor`, short ones kept, blended between."""
    factor = float(scaling["factor"])
    low_ff = float(scaling.get("low_freq_factor", 1.0))
    high_ff = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = old_ctx / low_ff  # longer than this: fully scaled
    high_freq_wavelen = old_ctx / high_ff  # shorter than this: untouched
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    blend = (old_ctx / wavelen - low_ff) / (high_ff - low_ff)  # 0 at the low band edge, 1 at the high
    blended = (1 - blend) * scaled / factor + blend * scaled
    in_between = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_between, blended, scaled)


def build_cos_sin_cache(head_dim: int, max_positions: int, theta: float,
                        scaling: dict[str, Any] | None, device: torch.device | str) -> torch.Tensor:
    """Table [max_positions, D] float32: columns [:D/2] = cos(p * f), [D/2:] = sin(p * f).

    Raises:
        ValueError: an unsupported rope_type.
    """
    inv_freq = inv_frequencies(head_dim, theta, scaling)  # [D/2]
    pos = torch.arange(max_positions, dtype=torch.int64).float()  # [P]
    freqs = pos[:, None] * inv_freq[None, :]  # [P, D/2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)
