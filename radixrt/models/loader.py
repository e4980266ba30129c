"""Load our model from a HF model directory (the worker's side of models/resolve.py).

`load_model` runs in the worker: our own `nn.Module` from safetensors, or random weights ("dummy"),
with the decoder linears in FP8 for `--quantization fp8` or an FP8 checkpoint (models/quant/).
Resolving `--model-path` (`resolve_model_dir`, `read_model_config`, `ModelLoadError`) lives in
models/resolve.py, which imports no torch; the names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from radixrt.models.linear import prepack_cpu_linears
from radixrt.models.model_config import ModelConfig, read_json
from radixrt.models.quant.checkpoint import CheckpointStream, checkpoint_quantization, weight_block
from radixrt.models.quant.fp8 import FP8_DTYPE, Fp8Linear, convert_to_fp8, quantize_lm_head
from radixrt.models.registry import find_spec
from radixrt.models.resolve import (  # noqa: F401 - re-exported
    ModelLoadError,
    check_model_dir,
    default_gguf_path,
    read_model_config,
    resolve_model_dir,
)

if TYPE_CHECKING:
    from radixrt.parallel.group import TPGroup


def resolve_quantization(model_dir: Path, quantization: str | None) -> str | None:
    """The weight format to serve: --quantization, else the checkpoint's own (quantization_config).

    Raises:
        ModelLoadError: an unsupported quantization_config, or a flag that contradicts it.
    """
    try:
        own = checkpoint_quantization(read_json(Path(model_dir) / "config.json"))
    except ValueError as e:
        raise ModelLoadError(f"{model_dir}: {e}") from None
    if quantization not in (None, "fp8"):
        raise ModelLoadError(f"unknown --quantization {quantization!r} (supported: fp8)")
    return quantization or own


def load_model(model_dir: Path, dtype: torch.dtype, device: torch.device | str, load_format: str,
               seed: int = 0, max_positions: int | None = None,
               quantization: str | None = None, tp: TPGroup | None = None,
               lm_head_quantization: str = "auto") -> tuple[torch.nn.Module, ModelConfig]:
    """Build our model for `model_dir` on `device` in `dtype`, with real or random weights.

    load_format "auto": weights from every *.safetensors file (tied embeddings reuse embed_tokens);
    "dummy": normal(0, 0.02) linear/embedding weights from a generator seeded by `seed`, norms = 1.
    max_positions: rotary table length (default: the model's max_position_embeddings).
    quantization: "fp8" (or an FP8 checkpoint): decoder linears become Fp8Linear (quant/fp8.py),
    bf16 and dummy weights quantized per channel as they are loaded.
    lm_head_quantization (--lm-head-quantization; only with FP8 decoder linears): "auto" quantizes the
    LM head too (quant/fp8.py quantize_lm_head, after loading) unless the checkpoint itself is FP8,
    "fp8" always, "none" never.
    The model gets `kv_cache_scales`: {layer: {"k": s, "v": s}} from the checkpoint (empty if none)
    and `quantization`: the weight format in effect, "fp8" (the flag's or the checkpoint's) or None.
    tp: this rank's slice of the model (parallel/layout.py): each rank reads only its slices of the
    safetensors; dummy weights are drawn at full size in the same order as with no tp and sliced,
    so the ranks' shards are slices of the --tp-size 1 weights. The returned config is the rank's.

    Raises:
        ModelLoadError: bad directory, missing or mis-shaped tensors, an unsupported quantization,
            a tp size that does not divide the model, FP8 with tp.
    """
    model_dir = Path(model_dir)
    cfg = read_model_config(model_dir)
    quant = resolve_quantization(model_dir, quantization)
    cls = find_spec([cfg.architecture]).model_class()
    if tp is not None and quant is not None:
        what = f"--quantization {quantization}" if quantization else f"an FP8 checkpoint ({model_dir})"
        raise ModelLoadError(f"{what} with --tp-size {tp.size} is not supported yet")
    with torch.device("meta"):
        try:
            model = cls(cfg) if tp is None else cls(cfg, tp)
        except ValueError as e:  # a tp size that does not divide the model
            raise ModelLoadError(str(e)) from None
    model = model.to(dtype)
    if quant == "fp8":
        convert_to_fp8(model)  # on meta, after .to(dtype), which would widen FP8 parameters
    # to_empty's empty_like on meta tensors runs through torch._refs, whose first call imports sympy
    # (1-3 s of every start); the parameters are contiguous, so a plain empty of the shape is the same.
    model = model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    model = model.requires_grad_(False)
    model.tie_weights()  # to_empty materialises shared parameters separately
    model.kv_cache_scales = {}
    model.quantization = quant  # the weight format in effect ("fp8" or None), for the server's info
    if load_format == "dummy" and tp is None:
        _init_dummy(model, seed, dtype)
    elif load_format == "dummy":
        from radixrt.parallel.loading import init_dummy_sharded

        with torch.device("meta"):
            full = cls(cfg)  # the --tp-size 1 parameters: their names, shapes and drawing order
        init_dummy_sharded(model, full, cfg, seed, dtype)
    elif tp is None:
        model.kv_cache_scales = _load_safetensors(model, model_dir)
    else:
        from radixrt.parallel.loading import rank_slices

        fill_from_safetensors(model, model_dir, lambda st: rank_slices(model, st))
    if quant == "fp8" and _fp8_lm_head(lm_head_quantization, quantization, model_dir):
        quantize_lm_head(model)
    model.init_rope(max(max_positions or 0, cfg.max_position_embeddings), device)
    prepack_cpu_linears(model)
    return model.eval(), model.config


def _fp8_lm_head(policy: str, flag: str | None, model_dir: Path) -> bool:
    """Whether FP8 decoder linears come with an FP8 LM head (--lm-head-quantization, load_model's
    docstring): "auto" means yes for online quantization (--quantization fp8 on a checkpoint without
    an FP8 quantization_config, or dummy weights), no for an FP8 checkpoint, whose head was left
    unquantized by its producer.

    Raises:
        ModelLoadError: a policy other than auto / fp8 / none."""
    if policy not in ("auto", "fp8", "none"):
        raise ModelLoadError(f"unknown --lm-head-quantization {policy!r} (auto, fp8, none)")
    if policy != "auto":
        return policy == "fp8"
    own = checkpoint_quantization(read_json(model_dir / "config.json"))
    return flag == "fp8" and own is None


def _init_dummy(model: torch.nn.Module, seed: int, dtype: torch.dtype) -> None:
    """Random weights drawn on the parameters' own device (a 7B model in seconds on a GPU). An FP8
    layer's weight is drawn in the model dtype from the same generator sequence, then quantized."""
    gens: dict[torch.device, torch.Generator] = {}
    for name, p in model.named_parameters():
        if name.endswith("weight_scale"):
            continue  # set with its FP8 weight
        if p.dtype == FP8_DTYPE:
            layer = model.get_submodule(name.rpartition(".")[0])
            assert isinstance(layer, Fp8Linear)
            gen = gens.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
            w = torch.empty(p.shape, dtype=dtype, device=p.device)
            layer.set_weight(w.normal_(0.0, 0.02, generator=gen))
        elif name.endswith("norm.weight"):
            p.data.fill_(1.0)
        elif name.endswith("bias"):
            p.data.zero_()
        else:
            gen = gens.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
            p.data.normal_(0.0, 0.02, generator=gen)


def _load_safetensors(model: torch.nn.Module, model_dir: Path) -> dict[int, dict[str, float]]:
    """Fill `model` from every *.safetensors file; returns the checkpoint's KV-cache scales per layer."""
    try:
        block = weight_block(read_json(model_dir / "config.json"))
    except ValueError as e:
        raise ModelLoadError(f"{model_dir}: {e}") from None
    stream = CheckpointStream(model, block)

    def all_read() -> None:  # before "weights missing", which an unpaired half would cause
        unpaired = stream.unpaired()
        if unpaired:
            raise ModelLoadError(f"block-wise FP8 weights in {model_dir} without their weight_scale_inv (or "
                                 f"scales without their weight): {', '.join(unpaired[:5])}"
                                 f"{' ...' if len(unpaired) > 5 else ''}")

    fill_from_safetensors(model, model_dir, lambda st: stream((k, st.get_tensor(k)) for k in st.keys()),
                          all_read=all_read)
    return stream.kv_scales


def fill_from_safetensors(model: torch.nn.Module, model_dir: Path,
                          read: Callable[[Any], Iterable[tuple[str, torch.Tensor]]],
                          all_read: Callable[[], None] | None = None) -> None:
    """Fill `model` through `model.load_weights(read(st))` for each open *.safetensors file `st`
    (`read` picks the tensors: whole ones, or a tensor-parallel rank's slices); `all_read()`, if
    given, runs after the last file and before the check for missing weights (it may raise).

    Raises:
        ModelLoadError: no weights, a corrupt file, tensors that do not fit the config, missing ones,
            a tensor found in two files.
    """
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {model_dir}")
    filled: set[str] = set()
    for f in files:
        try:
            with safe_open(str(f), framework="pt", device="cpu") as st:
                got = model.load_weights(read(st))
            again = got & filled
            if again:  # one tensor in two shards: whichever came last would win, silently
                raise ValueError(f"tensors already loaded from another file: {', '.join(sorted(again)[:5])}"
                                 f"{' ...' if len(again) > 5 else ''}")
            filled |= got
        except (KeyError, ValueError) as e:
            raise ModelLoadError(f"weights in {f} do not match config.json: {e}") from None
        except Exception as e:  # safetensors raises its own error type for a corrupt file
            raise ModelLoadError(f"cannot read weights {f}: {e}") from None
    if all_read is not None:
        all_read()
    missing = model.expected_fills() - filled
    if missing:
        raise ModelLoadError(f"weights missing from {model_dir}: {', '.join(sorted(missing)[:5])}"
                             f"{' ...' if len(missing) > 5 else ''}")
