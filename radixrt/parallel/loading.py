"""Weights of one tensor-parallel rank: safetensors read slice by slice, or dummy weights that are
slices of the --tp-size 1 dummy weights (so that logits can be compared across TP sizes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from radixrt.models.model_config import ModelConfig
from radixrt.parallel.layout import split_fused


def init_dummy_sharded(model: nn.Module, full: nn.Module, cfg: ModelConfig, seed: int,
                       dtype: torch.dtype) -> None:
    """Fill rank `model` (built with a TPGroup) with its slices of the weights that
    loader._init_dummy gives the unsharded model: each parameter of `full` (the unsharded model
    on the meta device, same names and order) is drawn at full size from the same seeded
    generator sequence, normal(0, 0.02) in `dtype` on the rank's device, then sliced (norms = 1,
    biases = 0, as there). Costs one full-size parameter of memory at a time."""
    local = dict(model.named_parameters())
    gen: torch.Generator | None = None
    for name, p_full in full.named_parameters():
        p = local[name]
        if name.endswith("norm.weight"):
            p.data.fill_(1.0)
        elif name.endswith("bias"):
            p.data.zero_()
        else:
            gen = gen or torch.Generator(device=p.device).manual_seed(seed)
            w = torch.empty(p_full.shape, dtype=dtype, device=p.device).normal_(0.0, 0.02, generator=gen)
            model.load_weights((hf, model.layout.take(hf, piece, tuple(piece.shape)))
                               for hf, piece in split_fused(name, w, cfg))


def rank_slices(model: nn.Module, st: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, this rank's slice) for each tensor of an open safetensors file `st`, reading only
    the slice's bytes (`get_slice`); for loader.fill_from_safetensors. The checkpoint's KV-cache
    scales are not read (FP8 is refused with tensor parallelism)."""
    for name in st.keys():
        sl = st.get_slice(name)
        yield name, model.layout.take(name, sl, tuple(sl.get_shape()))
