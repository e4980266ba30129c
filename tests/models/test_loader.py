"""resolve_model_dir / load_model: default GGUF conversion and its cache, errors, dummy weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from radixrt.config import Env
from radixrt.models import resolve
from radixrt.models.loader import ModelLoadError, load_model, resolve_model_dir
from tests.models.tiny import BASE, write_config


def test_default_model_dir_is_complete(model_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (model_dir / name).is_file(), name
    tok_cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    has_template = (model_dir / "chat_template.jinja").is_file() or "chat_template" in tok_cfg
    assert has_template
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in cfg
    assert tok_cfg["eos_token"] == "<|im_end|>"  # GGUF eos id 2, not transformers' guess


def test_second_resolve_uses_cache(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = model_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns

    def no_convert(*a, **kw):
        raise AssertionError("reconverted a cached GGUF")

    monkeypatch.setattr(resolve, "_convert_gguf", no_convert)
    again = resolve_model_dir(None, Env.read().cache_dir, "auto")
    assert again == model_dir
    assert weights.stat().st_mtime_ns == before
    assert not list(model_dir.parent.glob(f".{model_dir.name}.tmp-*"))


def test_hf_dir_returned_as_is(model_dir: Path) -> None:
    assert resolve_model_dir(str(model_dir), Path("/nonexistent-cache"), "auto") == model_dir


def _one_line_error(path: str, tmp_path: Path, load_format: str = "auto") -> str:
    with pytest.raises(ModelLoadError) as ei:
        resolve_model_dir(path, tmp_path / "cache", load_format)
    msg = str(ei.value)
    assert msg and "\n" not in msg
    return msg


def test_missing_path(tmp_path: Path) -> None:
    assert "not found" in _one_line_error(str(tmp_path / "nope"), tmp_path)


def test_dir_without_config(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    assert "config.json" in _one_line_error(str(tmp_path / "m"), tmp_path)


def test_garbage_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file" * 10)
    assert "GGUF" in _one_line_error(str(bad), tmp_path)
    truncated = tmp_path / "trunc.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    assert "GGUF" in _one_line_error(str(truncated), tmp_path)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_unsupported_architecture(tmp_path: Path) -> None:
    d = write_config(tmp_path / "gpt2", architectures=["GPT2LMHeadModel"], model_type="gpt2")
    assert "unsupported architecture" in _one_line_error(str(d), tmp_path, "dummy")


def test_dir_without_weights_needs_dummy(tmp_path: Path) -> None:
    d = write_config(tmp_path / "m", architectures=["LlamaForCausalLM"], model_type="llama", **BASE)
    assert "safetensors" in _one_line_error(str(d), tmp_path, "auto")
    assert resolve_model_dir(str(d), tmp_path / "cache", "dummy") == d


def test_dummy_weights_are_seeded(tmp_path: Path) -> None:
    d = write_config(tmp_path / "m", architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                     tie_word_embeddings=False, **BASE)
    a, cfg = load_model(d, torch.float32, "cpu", "dummy", seed=1)
    b, _ = load_model(d, torch.float32, "cpu", "dummy", seed=1)
    c, _ = load_model(d, torch.float32, "cpu", "dummy", seed=2)
    wa = a.model.layers[0].self_attn.qkv_proj.weight
    assert cfg.qkv_bias and a.model.layers[0].self_attn.qkv_proj.bias is not None
    assert torch.equal(wa, b.model.layers[0].self_attn.qkv_proj.weight)
    assert not torch.equal(wa, c.model.layers[0].self_attn.qkv_proj.weight)
    assert 0.01 < float(wa.std()) < 0.05


def test_missing_tensor_is_reported(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from tests.models.tiny import save_tiny_model

    save_tiny_model("llama", tmp_path / "m")
    f = tmp_path / "m" / "model.safetensors"
    tensors = load_file(f)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="up_proj|gate_up_proj"):
        load_model(tmp_path / "m", torch.float32, "cpu", "auto")


def test_a_tensor_in_two_shards_is_refused(tmp_path: Path) -> None:
    """The same tensor in two safetensors files (a bad re-shard): a ModelLoadError naming it, not the
    last file's copy silently winning (seen with a second, zeroed embed_tokens; and with a block-wise
    FP8 weight present twice, the second replaced the first before its scale came)."""
    from safetensors.torch import load_file, save_file

    from tests.models.test_fp8_quant import _save_blockwise
    from tests.models.tiny import save_tiny_model

    src = tmp_path / "src"
    save_tiny_model("qwen3", src, tie_word_embeddings=False)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    save_file(tensors, plain / "model-00001-of-00002.safetensors")
    save_file({"model.embed_tokens.weight": torch.zeros_like(tensors["model.embed_tokens.weight"])},
              plain / "model-00002-of-00002.safetensors")
    with pytest.raises(ModelLoadError, match="already loaded from another file: model.embed_tokens.weight"):
        load_model(plain, torch.float32, "cpu", "auto")

    blk = tmp_path / "blk"
    _save_blockwise(src, blk, [32, 48])
    name = "model.layers.1.mlp.down_proj.weight"
    files = sorted(blk.glob("*.safetensors"))
    shards = [load_file(f) for f in files]
    home = 0 if name in shards[0] else 1
    shards[1 - home][name] = shards[home][name]  # beside its scale, in the other file
    save_file(shards[1 - home], files[1 - home])
    with pytest.raises(ModelLoadError, match="down_proj.weight: its weight appears twice"):
        load_model(blk, torch.float32, "cpu", "auto")
    # a weight paired with its scale in one file, then the weight again in the other (a reviewer's case:
    # reported as a weight without its scale before)
    shards = [load_file(f) for f in files]  # files are read in sorted order: shard 0 first
    weight = shards[0].get(name, shards[1].get(name))
    scale = shards[0].get(name + "_scale_inv", shards[1].get(name + "_scale_inv"))
    for t in shards:
        t.pop(name, None)
        t.pop(name + "_scale_inv", None)
    shards[0][name], shards[0][name + "_scale_inv"] = weight, scale  # the pair complete in the first file
    shards[1][name] = weight  # and the weight once more in the second
    for f, t in zip(files, shards, strict=True):
        save_file(t, f)
    with pytest.raises(ModelLoadError, match="down_proj.weight: its weight appears twice"):
        load_model(blk, torch.float32, "cpu", "auto")


@pytest.mark.parametrize("field,value", [("max_position_embeddings", 0), ("num_attention_heads", 0),
                                         ("num_hidden_layers", -1), ("vocab_size", 0),
                                         ("num_key_value_heads", 0), ("head_dim", 0)])
def test_config_sizes_a_model_cannot_have_are_refused(tmp_path: Path, field: str, value: int) -> None:
    """Checked with the config, before any child starts (exit 2): before, num_attention_heads 0
    without head_dim raised ZeroDivisionError (a traceback from the launcher), and
    max_position_embeddings 0 started a server of context length 0 that refused every request."""
    cfg = {**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama", field: value}
    model_dir = write_config(tmp_path / "m", **cfg)
    with pytest.raises(ModelLoadError, match=f"{field} {value} \\(must be >= "):
        resolve.check_model_dir(model_dir, "dummy")


def test_integer_or_bool_tensor_for_a_float_parameter_is_refused(tmp_path: Path) -> None:
    """An int8 embedding or a bool norm (a wrongly converted checkpoint) was cast to float and loaded
    silently; now a ModelLoadError naming the tensor."""
    from safetensors.torch import load_file, save_file

    from tests.models.tiny import save_tiny_model

    save_tiny_model("llama", tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    for name, bad in (("model.embed_tokens.weight", lambda t: (t * 100).to(torch.int8)),
                      ("model.norm.weight", lambda t: t > 0)):
        good = tensors[name]
        tensors[name] = bad(good)
        save_file(tensors, tmp_path / "model.safetensors")
        with pytest.raises(ModelLoadError, match=f"{name}: a torch.(int8|bool) tensor for a torch.float32"):
            load_model(tmp_path, torch.float32, "cpu", "auto")
        tensors[name] = good


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
def test_rope_scaling_that_is_not_an_object_is_refused(tmp_path: Path, key: str) -> None:
    """rope_scaling "linear" was an AttributeError traceback from the launcher (exit 1); rope_parameters
    "linear" was ignored here and crashed the tokenizer process (transformers validates it), exit 1."""
    cfg = {**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama", key: "linear"}
    model_dir = write_config(tmp_path / "m", **cfg)
    with pytest.raises(ModelLoadError, match=f"{key} \\(an object or null expected, got 'linear'\\)"):
        resolve.check_model_dir(model_dir, "dummy")
