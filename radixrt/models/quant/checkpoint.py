"""FP8 checkpoints in the common Hugging Face formats, and bf16 checkpoints quantized at load.

Formats read (config.json `quantization_config`, all with float8_e4m3fn `*.weight` tensors and a
float32 `*.weight_scale` of one value per tensor or one per output channel, [N] or [N, 1]):
  compressed-tensors (llm-compressor "FP8" / "FP8_DYNAMIC": weights strategy "tensor" or "channel"),
  fbgemm_fp8 (per-channel), fp8 without `weight_block_size` (per-tensor), modelopt FP8.
Static activation scales (`*.input_scale`) are dropped: radixrt always quantizes activations per
token at run time. Block-wise formats (`weight_block_size`, `*.weight_scale_inv`, as DeepSeek-V3
ships) and any other method raise. Per-tensor scales are expanded to one per row, so q, k and v
(and gate, up) keep their own scales inside the fused parameters.

KV-cache scales (`self_attn.k_scale` / `v_scale`, older `kv_scale`, compressed-tensors'
`self_attn.k_proj.output_scale` / `v_proj.output_scale`) are collected per layer for the FP8 KV pool
(worker/kv_pool.py); the largest value is kept where a checkpoint has one per head.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from radixrt.models.quant.fp8 import FP8_DTYPE, quantize_per_channel

_KV_SCALE = re.compile(r"layers\.(\d+)\.self_attn\.(?:(k|v|kv)_scale|(k|v)_proj\.output_scale)$")
_DROPPED = (".input_scale", ".weight_zero_point", ".input_zero_point")
_CT_STRATEGIES = ("tensor", "channel")


def checkpoint_quantization(cfg: dict[str, Any]) -> str | None:
    """"fp8" when config.json's `quantization_config` describes FP8 e4m3 weights with per-tensor or
    per-channel scales (formats: module docstring), None when there is no quantization_config.

    Raises:
        ValueError: a quantization_config radixrt cannot serve (message names it).
    """
    q = cfg.get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method")
    if method == "fbgemm_fp8":
        return "fp8"
    if method == "fp8":
        if q.get("weight_block_size"):
            raise ValueError(f"block-wise FP8 (weight_block_size {q['weight_block_size']}) is not supported; "
                             "radixrt reads per-tensor and per-channel FP8 scales")
        return "fp8"
    if method == "modelopt" and str(q.get("quant_algo", "")).upper() == "FP8":
        return "fp8"
    if method == "compressed-tensors":
        for name, group in (q.get("config_groups") or {}).items():
            w = group.get("weights") or {}
            fp8 = w.get("type") == "float" and int(w.get("num_bits", 0)) == 8
            if not fp8 or w.get("strategy") not in _CT_STRATEGIES:
                raise ValueError(f"compressed-tensors group {name!r} ({w}) is not FP8 with per-tensor or "
                                 "per-channel weight scales")
        return "fp8"
    raise ValueError(f"unsupported quantization_config (quant_method {method!r}); radixrt reads FP8 "
                     "checkpoints (compressed-tensors, fbgemm_fp8, fp8, modelopt)")


class CheckpointStream:
    """Adapts a checkpoint's (HF name, tensor) stream to `model.load_weights`.

    For a parameter that is an Fp8Linear weight: an FP8 tensor passes as is, a float one is
    quantized per channel on the parameter's device (yielding `<name>_scale` after it); a
    `*.weight_scale` becomes float32 [rows] (a per-tensor value repeated). KV-cache scales are taken
    out into `kv_scales` ({layer: {"k": s, "v": s}}); static activation scales are dropped.
    `model` must have `map_name(hf_name) -> (param name, row range or None)`.

    Raises (while iterating):
        ValueError: a block-wise scale, an FP8 tensor for a layer kept in the model dtype, or a
            scale whose size matches neither one value nor one per row.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.params = dict(model.named_parameters())
        self.kv_scales: dict[int, dict[str, float]] = {}

    def __call__(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in weights:
            if self._take_kv_scale(name, t) or name.endswith(_DROPPED):
                continue
            if name.endswith(".weight_scale_inv"):
                raise ValueError(f"{name}: block-wise FP8 scales are not supported")
            if name.endswith(".weight_scale"):
                yield name, self._row_scales(name, t)
            elif name.endswith(".weight") and self._target_is_fp8(name):
                if t.dtype == FP8_DTYPE:
                    yield name, t
                elif t.is_floating_point() and t.element_size() >= 2:
                    q, s = quantize_per_channel(t.to(self._target(name)[0].device))
                    yield name, q
                    yield name + "_scale", s
                else:
                    raise ValueError(f"{name}: weights of dtype {t.dtype} cannot be loaded as FP8 e4m3")
            elif t.dtype in (FP8_DTYPE, torch.float8_e5m2):
                raise ValueError(f"{name}: an FP8 tensor for a layer radixrt keeps in the model dtype")
            else:
                yield name, t

    def _target(self, name: str) -> tuple[torch.Tensor, int]:
        """(our parameter, rows the tensor fills) for an HF weight name. Raises KeyError if unknown."""
        target, rows = self.model.map_name(name)
        p = self.params[target]
        return p, (p.shape[0] if rows is None else rows[1] - rows[0])

    def _target_is_fp8(self, name: str) -> bool:
        try:
            return self._target(name)[0].dtype == FP8_DTYPE
        except KeyError:
            return False  # load_weights reports the unknown name

    def _row_scales(self, name: str, t: torch.Tensor) -> torch.Tensor:
        weight_name = name.removesuffix("_scale")
        if not self._target_is_fp8(weight_name):
            raise ValueError(f"{name}: an FP8 scale for a layer radixrt keeps in the model dtype")
        _, rows = self._target(weight_name)
        s = t.float().reshape(-1)
        if s.numel() == 1:
            return s.expand(rows).contiguous()
        if s.numel() != rows:
            raise ValueError(f"{name}: {tuple(t.shape)} scales for {rows} rows (block-wise scales are "
                             "not supported)")
        return s.contiguous()

    def _take_kv_scale(self, name: str, t: torch.Tensor) -> bool:
        m = _KV_SCALE.search(name)
        if m is None:
            return False
        layer, which = int(m.group(1)), m.group(2) or m.group(3)
        value = float(t.float().max())
        for key in ("k", "v") if which == "kv" else (which,):
            self.kv_scales.setdefault(layer, {})[key] = value
        return True
