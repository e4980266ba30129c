"""FP8 checkpoints in the common Hugging Face formats, and bf16 checkpoints quantized at load.

Formats read (config.json `quantization_config`, all with float8_e4m3fn `*.weight` tensors):
  - one float32 `*.weight_scale` per tensor or per output channel ([N] or [N, 1]): compressed-tensors
    (llm-compressor "FP8" / "FP8_DYNAMIC": weights strategy "tensor" or "channel"), fbgemm_fp8
    (per-channel), fp8 without `weight_block_size` (per-tensor), modelopt FP8;
  - block-wise scales: quant_method "fp8" with `weight_block_size` [bn, bk] and a
    `*.weight_scale_inv` [ceil(N / bn), ceil(K / bk)] per weight, w = w_fp8 * scale_inv of its block
    (the format of Qwen3's and DeepSeek-V3's FP8 releases), or compressed-tensors weights of strategy
    "block" (`block_structure` [bn, bk], the same grid as `*.weight_scale`; llm-compressor's
    FP8_BLOCK). radixrt's FP8 kernels take one scale per output channel, so each such weight is
    dequantized at load and quantized again per channel (`requantize_blockwise`: a second rounding,
    bounded like any per-channel quantization of the dequantized values); a block-quantized weight
    of a layer radixrt keeps in the model dtype is dequantized into it. vLLM and SGLang keep the
    blocks and run block-scaled GEMMs instead.
Static activation scales (`*.input_scale`) are dropped: radixrt always quantizes activations per
token at run time. Per-tensor scales are expanded to one per row, so q, k and v (and gate, up) keep
their own scales inside the fused parameters.

KV-cache scales (`self_attn.k_scale` / `v_scale`, older `kv_scale`, compressed-tensors'
`self_attn.k_proj.output_scale` / `v_proj.output_scale`) are collected per layer for the FP8 KV pool
(worker/kv_pool.py); the largest value is kept where a checkpoint has one per head.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from radixrt.models.quant import qconfig
from radixrt.models.quant.fp8 import FP8_DTYPE, quantize_per_channel

_KV_SCALE = re.compile(r"layers\.(\d+)\.self_attn\.(?:(k|v|kv)_scale|(k|v)_proj\.output_scale)$")
_DROPPED = (".input_scale", ".weight_zero_point", ".input_zero_point")

# quantization_config readers (torch-free, in qconfig.py for the launcher), re-exported
checkpoint_quantization = qconfig.checkpoint_quantization
weight_block = qconfig.weight_block


def dequantize_blockwise(w_fp8: torch.Tensor, scale_inv: torch.Tensor,
                         block: tuple[int, int]) -> torch.Tensor:
    """w_fp8 [N, K] float8_e4m3fn, scale_inv [ceil(N / bn), ceil(K / bk)] float -> [N, K] float32,
    each element times its (bn x bk) block's scale (the last blocks may be partial), on w_fp8's device.

    Raises:
        ValueError: w_fp8 not 2-D FP8 e4m3, or scale_inv not of that shape."""
    bn, bk = block
    if w_fp8.dim() != 2 or w_fp8.dtype != FP8_DTYPE:
        raise ValueError(f"a block-wise FP8 weight must be [N, K] float8_e4m3fn, got {tuple(w_fp8.shape)} "
                         f"{w_fp8.dtype}")
    n, k = w_fp8.shape
    want = (-(-n // bn), -(-k // bk))
    if tuple(scale_inv.shape) != want:
        raise ValueError(f"scale_inv {tuple(scale_inv.shape)} for a [{n}, {k}] weight in {bn} x {bk} blocks "
                         f"(expected {list(want)})")
    s = scale_inv.to(w_fp8.device, torch.float32)
    s = s.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return w_fp8.float() * s


def requantize_blockwise(w_fp8: torch.Tensor, scale_inv: torch.Tensor,
                         block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A block-wise FP8 weight as radixrt's per-channel form: (w_fp8' [N, K], scale [N] float32) =
    quantize_per_channel(dequantize_blockwise(...)). Where every block of a row has the same scale and
    the row's largest code is +-448, the codes come back unchanged. Raises as dequantize_blockwise."""
    return quantize_per_channel(dequantize_blockwise(w_fp8, scale_inv, block))


class CheckpointStream:
    """Adapts a checkpoint's (HF name, tensor) stream to `model.load_weights`.

    For a parameter that is an Fp8Linear weight: an FP8 tensor passes as is, a float one is
    quantized per channel on the parameter's device (yielding `<name>_scale` after it); a
    `*.weight_scale` becomes float32 [rows] (a per-tensor value repeated). KV-cache scales are taken
    out into `kv_scales` ({layer: {"k": s, "v": s}}); static activation scales are dropped.
    `model` must have `map_name(hf_name) -> (param name, row range or None)`.

    With `weight_block` (a block-wise checkpoint, `weight_block(config)`), an FP8 `*.weight` and its
    `*.weight_scale_inv` are held until both have come (in either order, from any file of the
    checkpoint: the stream may be called once per file), then yielded per channel
    (`requantize_blockwise`) for an FP8 parameter, or dequantized for one in the model dtype.
    `unpaired()` names the weights still waiting for their other half.

    Raises (while iterating):
        ValueError: a block-wise scale in a checkpoint without weight_block_size, an FP8 tensor
            without scales for a layer kept in the model dtype, a scale whose size matches
            neither one value nor one per row (nor the blocks), or a weight or KV-cache scale that
            is not a float tensor of finite values >= 0 (> 0 for KV-cache scales): NaN / inf scales
            would load as NaN weights and serve garbage.
    """

    def __init__(self, model: nn.Module, weight_block: tuple[int, int] | None = None) -> None:
        self.model = model
        self.params = dict(model.named_parameters())
        self.kv_scales: dict[int, dict[str, float]] = {}
        self.weight_block = weight_block
        self._halves: dict[str, dict[str, torch.Tensor]] = {}  # weight name -> "weight" / "scale_inv"
        self._paired: set[str] = set()  # block-wise weights already yielded

    def unpaired(self) -> list[str]:
        """Block-wise weights (or scales) whose other half has not come yet, by weight name."""
        return sorted(self._halves)

    def __call__(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in weights:
            if self._take_kv_scale(name, t) or name.endswith(_DROPPED):
                continue
            if name.endswith(".weight_scale_inv"):
                if self.weight_block is None:
                    raise ValueError(f"{name}: a block-wise FP8 scale, but config.json's quantization_config "
                                     "has no weight_block_size")
                _check_scales(name, t)
                yield from self._block_half(name.removesuffix("_scale_inv"), "scale_inv", t)
            elif self.weight_block is not None and name.endswith(".weight_scale"):
                _check_scales(name, t)
                yield from self._block_half(name.removesuffix("_scale"), "scale_inv", t)  # compressed-tensors
            elif self.weight_block is not None and name.endswith(".weight") and t.dtype == FP8_DTYPE:
                yield from self._block_half(name, "weight", t)
            elif name.endswith(".weight_scale"):
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

    def _block_half(self, weight_name: str, half: str, t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """Hold one half of a block-wise weight; with both, yield it in the form its parameter takes."""
        halves = self._halves.setdefault(weight_name, {})
        if half in halves or weight_name in self._paired:  # the same tensor twice (in two shards)
            what = 'scale' if half == 'scale_inv' else 'weight'
            raise ValueError(f"{weight_name}: its {what} appears twice in the checkpoint")
        halves[half] = t
        if len(halves) < 2:
            return
        del self._halves[weight_name]
        self._paired.add(weight_name)
        w, scale_inv = halves["weight"], halves["scale_inv"]
        try:
            if self._target_is_fp8(weight_name):
                w = w.to(self._target(weight_name)[0].device)
                q, s = requantize_blockwise(w, scale_inv, self.weight_block)
                yield weight_name, q
                yield weight_name + "_scale", s
            else:  # a layer radixrt keeps in the model dtype (or an unknown name: load_weights says so)
                try:  # on the parameter's device (a GPU's dequantization is faster than the CPU's)
                    w = w.to(self._target(weight_name)[0].device)
                except KeyError:
                    pass
                yield weight_name, dequantize_blockwise(w, scale_inv, self.weight_block)
        except ValueError as e:
            raise ValueError(f"{weight_name}: {e}") from None

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
        _check_scales(name, t)
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
        if not t.is_floating_point() or t.numel() == 0:
            raise ValueError(f"{name}: a KV-cache scale of dtype {t.dtype} and {t.numel()} values")
        # kept as read: only an FP8 KV pool uses them, and it checks them (PagedKVPool.set_kv_scales)
        value = float(t.float().max())
        for key in ("k", "v") if which == "kv" else (which,):
            self.kv_scales.setdefault(layer, {})[key] = value
        return True


def _check_scales(name: str, t: torch.Tensor) -> None:
    """Raise ValueError (naming the tensor) unless `t` is a non-empty float tensor (fp32, fp16 or bf16:
    not FP8, whose few codes cannot hold a scale, nor an integer type) of finite values >= 0 (a weight
    scale of 0 is a zero row or block)."""
    if not t.is_floating_point() or t.element_size() < 2:
        raise ValueError(f"{name}: scales of dtype {t.dtype} (expected float32, float16 or bfloat16)")
    if t.numel() == 0:
        raise ValueError(f"{name}: an empty scale tensor")
    tf = t.float()
    bad = ~torch.isfinite(tf) | (tf < 0)
    if bad.any():
        first = tf.reshape(-1)[bad.reshape(-1)][0].item()
        raise ValueError(f"{name}: {int(bad.sum())} of {t.numel()} scales are not finite and >= 0 "
                         f"(e.g. {first})")
