"""The FP8 quantizers, Fp8Linear on the CPU, FP8 checkpoint formats, dummy FP8 weights, and a tiny
model served with FP8 weights and an FP8 KV pool (Triton backend through the interpreter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from radixrt.config import ServerArgs
from radixrt.models.linear import Linear
from radixrt.models.loader import ModelLoadError, load_model
from radixrt.models.quant.checkpoint import checkpoint_quantization
from radixrt.models.quant.fp8 import (
    FP8_DTYPE,
    Fp8Linear,
    dequantize,
    fp8_linear_ref,
    quantize_per_channel,
    quantize_per_token,
)
from radixrt.worker.model_runner import ModelRunner
from tests.models.tiny import save_tiny_model
from tests.worker.driver import single_request_batch

pytestmark = pytest.mark.usefixtures("one_thread")


def _weights(n: int = 48, k: int = 80, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.logspace(-3, 1, n)[:, None]  # rows of very different scale
    w[7] = 0.0
    return w


def test_per_channel_round_trip_error_bound_and_shapes() -> None:
    w = _weights()
    q, s = quantize_per_channel(w)
    assert q.dtype == FP8_DTYPE and q.shape == w.shape
    assert s.dtype == torch.float32 and s.shape == (w.shape[0],)
    err = (dequantize(q, s) - w).abs()
    bound = torch.maximum(w.abs() * 2.0 ** -4, s[:, None] * 2.0 ** -10)  # half an e4m3 step
    assert (err <= bound * (1 + 1e-6)).all()
    amax_q = q.float().abs().amax(dim=1)
    assert torch.equal(amax_q[torch.arange(48) != 7], torch.full((47,), 448.0))  # each row uses the range
    assert s[7] == 1.0 and (q[7].float() == 0).all()  # a zero row: scale 1, zero weights, no NaN


def test_per_token_scales_and_zero_rows() -> None:
    x = _weights(8, 40, seed=1)  # row 7 is zero
    q, s = quantize_per_token(x)
    assert q.dtype == FP8_DTYPE and s.shape == (8, 1) and s.dtype == torch.float32
    assert s[7, 0] == 1.0 and torch.isfinite(q.float()).all() and (q[7].float() == 0).all()
    bound = torch.maximum(x.abs() * 2.0 ** -4, s * 2.0 ** -10)
    assert ((q.float() * s - x).abs() <= bound * (1 + 1e-6)).all()


def _fp8_layer(w: torch.Tensor, bias: torch.Tensor | None) -> Fp8Linear:
    with torch.device("meta"):
        lin = Linear(w.shape[1], w.shape[0], bias=bias is not None)
    layer = Fp8Linear.from_linear(lin).to_empty(device="cpu")
    layer.set_weight(w)
    if bias is not None:
        layer.bias.data.copy_(bias)
    return layer


def test_fp8_linear_cpu_matches_the_dequantized_reference() -> None:
    w = _weights(64, 96)
    bias = torch.randn(64, generator=torch.Generator().manual_seed(2))
    layer = _fp8_layer(w, bias)
    x = torch.randn(2, 5, 96, generator=torch.Generator().manual_seed(3))
    y = layer(x)
    assert y.shape == (2, 5, 64) and y.dtype == torch.float32
    want = fp8_linear_ref(x.view(10, 96), layer.weight, layer.weight_scale, bias)
    torch.testing.assert_close(y.view(10, 64), want, atol=1e-4, rtol=1e-4)
    exact = x.view(10, 96) @ w.t() + bias  # and close to the unquantized product
    assert (y.view(10, 64) - exact).abs().max() < 0.08 * exact.abs().max()
    assert layer(x[:0]).shape == (0, 5, 64)


def test_bf16_and_fp8_checkpoints_load_to_the_same_fp8_weights(tmp_path: Path) -> None:
    """A compressed-tensors-style FP8 checkpoint (per-channel down/gate/up, per-tensor q/k/v/o,
    [N, 1] and scalar scales, input scales, KV scales) loads to the weights that quantizing the
    bf16 checkpoint at load gives, where the formats agree, and with its own scales otherwise."""
    from safetensors.torch import load_file, save_file

    src, dst = tmp_path / "bf16", tmp_path / "fp8"
    save_tiny_model("qwen2", src)  # qkv bias, tied embeddings
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    group = {"weights": {"type": "float", "num_bits": 8, "strategy": "channel"}}
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "ignore": ["lm_head"],
                                  "config_groups": {"group_0": group}}
    (dst / "config.json").write_text(json.dumps(cfg))
    tensors = {}
    for name, t in load_file(src / "model.safetensors").items():
        if name.endswith("proj.weight"):
            if "self_attn" in name:  # per-tensor
                s = t.abs().max() / 448.0
                tensors[name] = (t / s).to(FP8_DTYPE)
                tensors[name + "_scale"] = s.reshape(1)
            else:
                q, s = quantize_per_channel(t)
                tensors[name], tensors[name + "_scale"] = q, s[:, None]
            tensors[name.replace(".weight", ".input_scale")] = torch.ones(1)
        else:
            tensors[name] = t
    tensors["model.layers.1.self_attn.k_scale"] = torch.tensor(0.5)
    tensors["model.layers.1.self_attn.v_scale"] = torch.tensor(0.25)
    save_file(tensors, dst / "model.safetensors")

    m_fp8, _ = load_model(dst, torch.float32, "cpu", "auto")  # detected from quantization_config
    m_bf16, _ = load_model(src, torch.float32, "cpu", "auto", quantization="fp8")
    assert m_fp8.kv_cache_scales == {1: {"k": 0.5, "v": 0.25}}
    a, b = m_fp8.model.layers[0].mlp.down_proj, m_bf16.model.layers[0].mlp.down_proj
    assert torch.equal(a.weight.view(torch.uint8), b.weight.view(torch.uint8))
    assert torch.equal(a.weight_scale, b.weight_scale)
    qkv = m_fp8.model.layers[0].self_attn.qkv_proj
    c = m_fp8.config
    q_s, k_s = qkv.weight_scale[: c.q_size], qkv.weight_scale[c.q_size: c.q_size + c.kv_size]
    assert (q_s == q_s[0]).all() and (k_s == k_s[0]).all() and q_s[0] != k_s[0]  # per-tensor, expanded
    assert type(m_fp8.lm_head) is Linear


def test_unsupported_quantization_configs_are_refused(tmp_path: Path) -> None:
    assert checkpoint_quantization({}) is None
    assert checkpoint_quantization({"quantization_config": {"quant_method": "fbgemm_fp8"}}) == "fp8"
    assert checkpoint_quantization({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                                            "weight_block_size": [128, 128]}}) == "fp8"
    for bad in ({"quant_method": "fp8", "weight_block_size": [128]},
                {"quant_method": "fp8", "weight_block_size": [128, 0]},
                {"quant_method": "fp8", "weight_block_size": [128.0, 128]},
                {"quant_method": "fp8", "fmt": "e5m2"}, {"quant_method": "awq"},
                {"quant_method": "compressed-tensors", "config_groups": {
                    "g": {"weights": {"type": "int", "num_bits": 4, "strategy": "group"}}}}):
        with pytest.raises(ValueError):
            checkpoint_quantization({"quantization_config": bad})
    save_tiny_model("llama", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="gptq"):
        load_model(tmp_path, torch.float32, "cpu", "auto")


def test_dummy_fp8_weights_are_the_quantized_dummy_weights(tmp_path: Path) -> None:
    save_tiny_model("llama", tmp_path)
    ref, _ = load_model(tmp_path, torch.float32, "cpu", "dummy", seed=3)
    fp8, _ = load_model(tmp_path, torch.float32, "cpu", "dummy", seed=3, quantization="fp8")
    for name in ("self_attn.qkv_proj", "mlp.down_proj"):
        w = ref.model.layers[1].get_submodule(name).weight
        layer = fp8.model.layers[1].get_submodule(name)
        q, s = quantize_per_channel(w)
        assert torch.equal(layer.weight.view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(layer.weight_scale, s)


def test_tiny_model_with_fp8_weights_and_fp8_kv_pool_on_triton(tmp_path: Path) -> None:
    """Prefill then one decode step: FP8 weights + FP8 KV (Triton backend, interpreter) stay close to
    fp32 weights + fp32 KV; the pool really is FP8 and its scales reach the kernels."""
    save_tiny_model("llama", tmp_path)
    ids = torch.randint(0, 300, (23,), generator=torch.Generator().manual_seed(5)).tolist()

    def logits(**kw) -> tuple[torch.Tensor, ModelRunner]:
        args = ServerArgs(device="cpu", page_size=4, max_total_tokens=256, max_running_requests=2,
                          attention_backend="triton", **kw)
        r = ModelRunner(args, tmp_path)
        if "kv_cache_dtype" in kw:
            r.pool.set_kv_scales({0: {"k": 0.5, "v": 0.25}})
        prefill = r.forward_logits(single_request_batch(ids[:-1]))[0]
        step = r.forward_logits(single_request_batch(ids[-1:], start=len(ids) - 1))[0]
        return torch.stack([prefill, step]), r

    ref, _ = logits()
    got, runner = logits(quantization="fp8", kv_cache_dtype="fp8_e4m3")
    assert runner.pool.k_buffers[0].dtype == FP8_DTYPE and runner.info()["kv_cache_dtype"] == "float8_e4m3fn"
    assert (runner.pool.k_buffers[0].float().abs().amax() > 0)
    # logits span about [-2.3, 2.3] (std 0.69); measured: FP8 weights alone max 0.20 / mean 0.046,
    # FP8 KV alone 0.19 / 0.029, both with these scales 0.29 / about 0.06
    diff = (got - ref).abs()
    assert float(diff.max()) < 0.5 and 0 < float(diff.mean()) < 0.1
    with pytest.raises(ValueError, match="triton"):
        ModelRunner(ServerArgs(device="cpu", page_size=4, max_total_tokens=256, attention_backend="torch",
                               kv_cache_dtype="fp8_e4m3"), tmp_path)


def test_fused_activation_quantization_changes_nothing_but_the_kernels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With FP8 linears the decoder layer hands qkv / gate_up their input quantized by the RMSNorm
    (`ops.rms_norm_fp8`) and down by the SiLU-and-mul (`ops.silu_and_mul_fp8`); the logits equal
    those of the linears quantizing their own input (RADIXRT_FP8_FUSED_QUANT=0), bit for bit."""
    from radixrt.models import ops

    monkeypatch.setattr(Fp8Linear, "fused_quant", True)  # whatever RADIXRT_FP8_FUSED_QUANT says
    monkeypatch.setattr(Linear, "_skinny", True)  # and RADIXRT_SKINNY_GEMM
    save_tiny_model("llama", tmp_path)
    model, _ = load_model(tmp_path, torch.float32, "cpu", "dummy", seed=3, quantization="fp8")
    layer = model.model.layers[0]
    assert layer.self_attn.qkv_proj.takes_fp8_input(5, torch.device("cpu"))
    assert not layer.self_attn.qkv_proj.takes_fp8_input(0, torch.device("cpu"))
    # on CUDA, decode rows stay on the W8A16 skinny path, which takes bf16 x
    assert not layer.mlp.down_proj.takes_fp8_input(Fp8Linear.skinny_max_rows, torch.device("cuda"))
    assert layer.mlp.down_proj.takes_fp8_input(Fp8Linear.skinny_max_rows + 1, torch.device("cuda"))
    assert not Linear(8, 8).takes_fp8_input(64, torch.device("cpu"))

    calls = {"rms_norm_fp8": 0, "silu_and_mul_fp8": 0}
    for name in calls:
        real = getattr(ops, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(ops, name, spy)
    ids = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(4))
    runner_args = ServerArgs(device="cpu", page_size=4, max_total_tokens=64, max_running_requests=1,
                             quantization="fp8")
    runner = ModelRunner(runner_args, tmp_path)
    fused = runner.forward_logits(single_request_batch(ids.tolist()))[0]
    n = len(runner.model.model.layers)
    assert calls == {"rms_norm_fp8": 2 * n, "silu_and_mul_fp8": n}
    monkeypatch.setattr(Fp8Linear, "fused_quant", False)
    plain = runner.forward_logits(single_request_batch(ids.tolist()))[0]
    assert calls == {"rms_norm_fp8": 2 * n, "silu_and_mul_fp8": n}  # not called again
    assert torch.equal(fused, plain)


def test_fp8_linear_scratch_covers_the_int_gemvs_split_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fp8Linear's split-K scratch (allocated once, before graph capture) is large enough for the int
    GEMV's config at every row count it takes, split-K ones included: with the routing opened to the
    CPU and a 4-way split config, the scratch holds that config's partials and counters."""
    from radixrt.kernels import gemv
    from radixrt.kernels import gemv_fp8_int as G8

    cfg = G8.Fp8IntConfig(4, 64, split_k=4)
    monkeypatch.setattr(G8, "int_routed", lambda m, n, k, dev: cfg if m <= G8.FP8_INT_MAX_ROWS else None)
    monkeypatch.setattr(gemv, "skinny_rows_routed", lambda m, n, k: False)  # only the int configs size it
    n, k = 24, 2048
    layer = _fp8_layer(_weights(n, k), None)
    ws = layer._scratch(torch.device("cpu"))
    need = [G8.int_workspace_need(cfg, m, n, k) for m in range(1, G8.FP8_INT_MAX_ROWS + 1)]
    assert max(p for p, _ in need) == 4 * G8.FP8_INT_MAX_ROWS * n  # the split is real: 4 partials per row
    assert ws.partials.numel() >= max(p for p, _ in need) and ws.counters.numel() >= max(c for _, c in need)


def test_norms_split_across_the_fp8_int_gemvs_at_decode_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 1-2 rows with the int FP8 GEMV (routing opened to the CPU: the interpreter), the RMSNorms
    between o and gate_up and between down and the next layer's qkv run in the GEMVs' epilogues
    (Fp8Linear.forward_then_norm, NormedAct; gate_up's rstd applied by the SiLU-and-mul): only the
    first input norm and the final norm stay
    kernels, and the logits are as close to a float64 reference (the HF model with the dequantized
    weights) as the unfused pass's through the same int GEMVs (bf16 roundings apart: the
    interpreter truncates; measured 0.045 against 0.053 at most). Three rows, or float32, take the
    unfused pass."""
    from radixrt.kernels import gemv_fp8_int as G8
    from radixrt.models import ops

    route = G8.int_routed
    monkeypatch.setattr(G8, "int_routed", lambda m, n, k, dev: route(m, n, k, "cuda"))
    monkeypatch.setattr(Fp8Linear, "fused_norm", True)
    monkeypatch.setattr(Fp8Linear, "skinny_devices", ("cuda", "cpu"))
    monkeypatch.setattr(Linear, "_skinny", True)
    save_tiny_model("llama", tmp_path)
    runner = ModelRunner(ServerArgs(device="cpu", dtype="bfloat16", page_size=4, max_total_tokens=64,
                                    max_running_requests=1, quantization="fp8"), tmp_path)
    model = runner.model
    n = len(model.model.layers)
    calls = {"rms_norm": 0, "fp8_int_gemv_norm_out": 0, "fp8_int_gemv_norm_in": 0}
    for mod, name in ((ops, "rms_norm"), (G8, "fp8_int_gemv_norm_out"), (G8, "fp8_int_gemv_norm_in")):
        real = getattr(mod, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(mod, name, spy)
    h = torch.zeros(2, model.config.hidden_size, dtype=torch.bfloat16)
    assert model.fused_norms(h) and model.fused_norms(h[:1]) and not model.fused_norms(h.repeat(2, 1)[:3])
    assert not model.fused_norms(h.float())
    ids = [5, 17]
    fused = runner.forward_logits(single_request_batch(ids))[0]
    # qkv takes rstd in its epilogue (n - 1 layers after the first), gate_up leaves it to the SiLU
    assert calls == {"rms_norm": 2, "fp8_int_gemv_norm_out": 2 * n - 1, "fp8_int_gemv_norm_in": n - 1}
    monkeypatch.setattr(Fp8Linear, "fused_norm", False)
    assert not model.fused_norms(h)
    plain = runner.forward_logits(single_request_batch(ids))[0]
    assert calls["rms_norm"] == 2 + 2 * n + 1 and calls["fp8_int_gemv_norm_out"] == 2 * n - 1
    assert fused.shape == plain.shape and torch.isfinite(fused).all()
    ref = _dequantized_hf_logits(tmp_path, model, ids)
    err_fused, err_plain = (fused.double() - ref).abs(), (plain.double() - ref).abs()
    assert err_fused.max() <= 1.25 * err_plain.max() + 0.01, (err_fused.max(), err_plain.max())
    assert err_fused.mean() <= 1.25 * err_plain.mean(), (err_fused.mean(), err_plain.mean())


def _dequantized_hf_logits(path: Path, model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """The last position's logits [V] float64 of the HF checkpoint at `path` with the decoder's (and
    an FP8 head's) weights replaced by `model`'s dequantized FP8 ones."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()

    def deq(lin: Fp8Linear) -> torch.Tensor:
        return dequantize(lin.weight, lin.weight_scale).double()

    for ours, theirs in zip(model.model.layers, hf.model.layers, strict=True):
        attn, mlp = ours.self_attn, ours.mlp
        q, kv = attn.q_size, attn.kv_size
        qkv, gate_up = deq(attn.qkv_proj), deq(mlp.gate_up_proj)
        inter = gate_up.shape[0] // 2
        for name, w in (("self_attn.q_proj", qkv[:q]), ("self_attn.k_proj", qkv[q:q + kv]),
                        ("self_attn.v_proj", qkv[q + kv:]), ("self_attn.o_proj", deq(attn.o_proj)),
                        ("mlp.gate_proj", gate_up[:inter]), ("mlp.up_proj", gate_up[inter:]),
                        ("mlp.down_proj", deq(mlp.down_proj))):
            theirs.get_submodule(name).weight.data = w
    if isinstance(model.lm_head, Fp8Linear):
        hf.lm_head.weight = torch.nn.Parameter(deq(model.lm_head))
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1]


def test_forward_then_norm_falls_back_to_the_same_kind_of_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """forward_then_norm where the int GEMV cannot take the call (here: a strided residual) computes
    the same NormedAct in torch (so the next layer's input norm passes it through as with the kernel:
    a plain normed tensor there would be normed and added to the residual twice); with routing opened
    to the CPU the kernel's NormedAct and the fallback's give the same normed rows and residual."""
    from radixrt.kernels import gemv_fp8_int as G8
    from radixrt.models.llama import RMSNorm
    from radixrt.models.quant.fp8 import NormedAct

    route = G8.int_routed
    monkeypatch.setattr(G8, "int_routed", lambda m, n, k, dev: route(m, n, k, "cuda"))
    monkeypatch.setattr(Fp8Linear, "fused_norm", True)
    monkeypatch.setattr(Fp8Linear, "skinny_devices", ("cuda", "cpu"))
    monkeypatch.setattr(Linear, "_skinny", True)
    gen = torch.Generator().manual_seed(5)
    layer = _fp8_layer(torch.randn(64, 96, generator=gen) * 0.1, None)
    norm = RMSNorm(64, 1e-6)
    norm.weight.data = torch.rand(64, generator=gen) + 0.5
    x = torch.randn(2, 96, generator=gen).to(torch.bfloat16)
    residual = torch.randn(2, 64, generator=gen).to(torch.bfloat16)
    strided = torch.zeros(2, 128, dtype=torch.bfloat16)[:, ::2]
    strided.copy_(residual)
    assert layer.norm_fusable(2, x.device, x.dtype)
    fused, h_fused = layer.forward_then_norm(x, residual, norm)
    fallback, h_fallback = layer.forward_then_norm(x, strided, norm)
    assert isinstance(fused, NormedAct) and isinstance(fallback, NormedAct)
    assert fused.sq.shape[1] > 1 and fallback.sq.shape == (2, 1)
    ref_out, ref_h = norm(layer(x), residual)
    for out, h in ((fused, h_fused), (fallback, h_fallback)):
        torch.testing.assert_close(h.float(), ref_h.float(), atol=0.05, rtol=0.02)
        torch.testing.assert_close(out.materialize().float(), ref_out.float(), atol=0.05, rtol=0.03)
    x_next, r_next = norm(fallback, h_fallback)  # the next layer's input norm passes it through
    assert x_next is fallback and r_next is h_fallback


def _blockwise(t: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """t [N, K] float -> (FP8 codes, scale_inv [ceil(N / bn), ceil(K / bk)]) as a block-wise FP8
    checkpoint stores them: each block's largest magnitude at 448 (written out here, block by block,
    rather than with the loader's functions)."""
    n, k = t.shape
    q = torch.empty(n, k, dtype=FP8_DTYPE)
    s = torch.empty(-(-n // bn), -(-k // bk))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            block = t[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            s[i, j] = block.abs().max() / 448.0
            q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = (block / s[i, j]).to(FP8_DTYPE)
    return q, s


def _block_dequantized(q: torch.Tensor, s: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    out = q.float()
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            out[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] *= s[i, j]
    return out


def _save_blockwise(src: Path, dst: Path, block: list[int], *, drop: str | None = None,
                    bad_scale: str | None = None,
                    style: str = "fp8") -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """src's checkpoint in a block-wise FP8 format, the linears and the untied LM head quantized, in
    two shards that split weights from their scales both ways; returns {weight name: (codes,
    scales)}. style "fp8": Qwen3-FP8's (quant_method fp8, fmt e4m3, weight_block_size,
    `*.weight_scale_inv`); "ct": compressed-tensors' weights strategy "block" (block_structure,
    `*.weight_scale`)."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    if style == "fp8":
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                      "weight_block_size": block}
    else:
        weights = {"type": "float", "num_bits": 8, "strategy": "block", "block_structure": block}
        cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized",
                                      "config_groups": {"group_0": {"weights": weights,
                                                                    "targets": ["Linear"]}}}
    suffix = "_scale_inv" if style == "fp8" else "_scale"
    (dst / "config.json").write_text(json.dumps(cfg))
    shards: list[dict[str, torch.Tensor]] = [{}, {}]
    blocks = {}
    for i, (name, t) in enumerate(sorted(load_file(src / "model.safetensors").items())):
        if name.endswith("proj.weight") or name == "lm_head.weight":
            q, s = _blockwise(t, *block)
            blocks[name] = (q, s)
            if name == bad_scale:
                s = s[:, :1].contiguous()
            shards[i % 2][name] = q
            if name != drop:
                shards[(i + 1) % 2][name + suffix] = s  # the other shard
        else:
            shards[i % 2][name] = t
    for i, tensors in enumerate(shards):
        save_file(tensors, dst / f"model-0000{i + 1}-of-00002.safetensors")
    return blocks


def test_blockwise_fp8_checkpoint_loads_per_channel(tmp_path: Path) -> None:
    """A Qwen3-style block-wise FP8 checkpoint (weight_scale_inv per 32 x 48 block: partial blocks in
    both dimensions) loads to per-channel FP8 weights within half an e4m3 step of the block-wise
    values, the LM head (kept in the model dtype) to the block-wise values themselves, whichever
    shard holds a weight's scale; its logits stay as close to the fp32 model's as quantizing the
    fp32 checkpoint at load does."""
    src, dst = tmp_path / "fp32", tmp_path / "fp8"
    save_tiny_model("qwen3", src, tie_word_embeddings=False)
    blocks = _save_blockwise(src, dst, [32, 48])
    m_blk, _ = load_model(dst, torch.float32, "cpu", "auto")
    assert m_blk.quantization == "fp8"  # detected from config.json, no flag
    assert load_model(src, torch.float32, "cpu", "auto")[0].quantization is None
    checked = 0
    for name, (q, s) in blocks.items():
        want = _block_dequantized(q, s, 32, 48)
        if name == "lm_head.weight":
            assert torch.equal(m_blk.lm_head.weight.detach(), want)
            continue
        target, rows = m_blk.map_name(name)
        layer = m_blk.get_submodule(target.removesuffix(".weight"))
        assert isinstance(layer, Fp8Linear)
        lo, hi = rows or (0, layer.weight.shape[0])
        scale = layer.weight_scale[lo:hi]
        got = dequantize(layer.weight[lo:hi], scale)
        bound = torch.maximum(want.abs() * 2.0 ** -4, scale[:, None] * 2.0 ** -10)
        assert ((got - want).abs() <= bound * (1 + 1e-6)).all(), name
        checked += 1
    assert checked == 2 * 7  # q, k, v, o, gate, up, down in each of the two layers

    ids = torch.randint(0, 300, (17,), generator=torch.Generator().manual_seed(6)).tolist()

    def logits(model_dir: Path, **kw) -> torch.Tensor:
        args = ServerArgs(device="cpu", page_size=4, max_total_tokens=256, max_running_requests=1, **kw)
        return ModelRunner(args, model_dir).forward_logits(single_request_batch(ids))[0]

    ref, blk, at_load = logits(src), logits(dst), logits(src, quantization="fp8")
    err_blk, err_load = float((blk - ref).abs().max()), float((at_load - ref).abs().max())
    assert 0 < err_blk < 2 * err_load + 0.05, (err_blk, err_load)


def test_blockwise_fp8_checkpoint_errors(tmp_path: Path) -> None:
    """A weight without its scale_inv, a scale_inv of the wrong shape, and a scale_inv in a
    checkpoint that declares no blocks: each a ModelLoadError that names the tensor."""
    src = tmp_path / "fp32"
    save_tiny_model("qwen3", src, tie_word_embeddings=False)
    name = "model.layers.1.mlp.down_proj.weight"
    _save_blockwise(src, tmp_path / "drop", [32, 48], drop=name)
    with pytest.raises(ModelLoadError, match="without their weight_scale_inv.*layers.1.mlp.down_proj"):
        load_model(tmp_path / "drop", torch.float32, "cpu", "auto")
    _save_blockwise(src, tmp_path / "shape", [32, 48], bad_scale=name)
    with pytest.raises(ModelLoadError, match="down_proj.*scale_inv"):
        load_model(tmp_path / "shape", torch.float32, "cpu", "auto")
    tied = tmp_path / "tied"  # no LM head tensor, so a linear's scale_inv is the first thing refused
    save_tiny_model("llama", tied)
    _save_blockwise(tied, tmp_path / "noblock", [32, 48])
    cfg = json.loads((tmp_path / "noblock" / "config.json").read_text())
    del cfg["quantization_config"]["weight_block_size"]
    (tmp_path / "noblock" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="weight_scale_inv.*weight_block_size"):
        load_model(tmp_path / "noblock", torch.float32, "cpu", "auto")


def test_compressed_tensors_block_checkpoint_loads_like_the_fp8_format(tmp_path: Path) -> None:
    """llm-compressor's FP8_BLOCK (compressed-tensors, weights strategy "block", scales in
    `*.weight_scale`) loads to the same weights as the same blocks in Qwen3-FP8's format; groups
    that mix block scales with others, or carry a malformed block_structure, are refused."""
    src = tmp_path / "fp32"
    save_tiny_model("qwen3", src, tie_word_embeddings=False)
    _save_blockwise(src, tmp_path / "fp8", [32, 48])
    _save_blockwise(src, tmp_path / "ct", [32, 48], style="ct")
    a, _ = load_model(tmp_path / "fp8", torch.float32, "cpu", "auto")
    b, _ = load_model(tmp_path / "ct", torch.float32, "cpu", "auto")
    for (name, p), (name_b, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert name == name_b and p.dtype == q.dtype
        assert torch.equal(p.view(torch.uint8) if p.dtype == FP8_DTYPE else p,
                           q.view(torch.uint8) if q.dtype == FP8_DTYPE else q), name
    assert any(p.dtype == FP8_DTYPE for p in b.state_dict().values())
    channel = {"type": "float", "num_bits": 8, "strategy": "channel"}
    for groups in ({"g0": {"weights": {"type": "float", "num_bits": 8, "strategy": "block",
                                       "block_structure": [32, 48]}}, "g1": {"weights": channel}},
                   {"g0": {"weights": {"type": "float", "num_bits": 8, "strategy": "block",
                                       "block_structure": [32]}}}):
        with pytest.raises(ValueError, match="block"):
            checkpoint_quantization({"quantization_config": {"quant_method": "compressed-tensors",
                                                             "config_groups": groups}})


def test_non_finite_negative_or_non_float_scales_are_refused(tmp_path: Path) -> None:
    """A NaN / inf / negative weight scale (per-channel or block-wise), an integer or FP8 scale
    tensor, and a NaN or zero KV-cache scale: each a ModelLoadError naming the tensor. Before, they
    loaded: NaN weights (the server answered "\\u0000..." to every chat) or sign-flipped ones."""
    from safetensors.torch import load_file, save_file

    src = tmp_path / "fp32"
    save_tiny_model("qwen3", src, tie_word_embeddings=False)
    name = "model.layers.1.mlp.down_proj.weight"
    cases = [("_scale_inv", lambda s: torch.full_like(s, float("nan")), "not finite"),
             ("_scale_inv", lambda s: torch.full_like(s, float("inf")), "not finite"),
             ("_scale_inv", lambda s: -s, "not finite and >= 0"),
             ("_scale_inv", lambda s: torch.ones_like(s, dtype=torch.int32), "dtype torch.int32"),
             ("_scale_inv", lambda s: s.to(FP8_DTYPE), "dtype torch.float8_e4m3fn")]
    for i, (suffix, bad, match) in enumerate(cases):
        dst = tmp_path / f"blk{i}"
        _save_blockwise(src, dst, [32, 48])
        for f in dst.glob("*.safetensors"):
            tensors = load_file(f)
            if name + suffix in tensors:
                tensors[name + suffix] = bad(tensors[name + suffix])
                save_file(tensors, f)
        with pytest.raises(ModelLoadError, match=f"down_proj.weight{suffix}.*{match}"):
            load_model(dst, torch.float32, "cpu", "auto")
    # per-channel (fbgemm_fp8) scales and KV-cache scales
    tensors = load_file(src / "model.safetensors")
    bad_kv = "layer 0 must be finite and > 0"
    for kv, match in ((None, "weight_scale: 64 of 64 scales are not finite"), (float("nan"), bad_kv),
                      (0.0, bad_kv)):
        dst = tmp_path / f"pc{kv}"
        dst.mkdir()
        cfg = json.loads((src / "config.json").read_text())
        cfg["quantization_config"] = {"quant_method": "fbgemm_fp8"}
        (dst / "config.json").write_text(json.dumps(cfg))
        out = {}
        for k, t in tensors.items():
            if k.endswith("proj.weight"):
                out[k], s = quantize_per_channel(t)
                out[k + "_scale"] = s.fill_(float("nan")) if (k == name and kv is None) else s
            else:
                out[k] = t
        if kv is not None:
            out["model.layers.0.self_attn.k_scale"] = torch.tensor(kv)
        save_file(out, dst / "model.safetensors")
        if kv is None:
            with pytest.raises(ModelLoadError, match=match):
                load_model(dst, torch.float32, "cpu", "auto")
        else:  # a bad KV-cache scale matters only to an FP8 KV pool, which refuses it
            assert load_model(dst, torch.float32, "cpu", "auto")[0].kv_cache_scales[0]["k"] != 1.0
            with pytest.raises(ModelLoadError, match=match):
                _fp8_kv_runner(dst)


def _fp8_kv_runner(model_dir: Path) -> ModelRunner:
    return ModelRunner(ServerArgs(device="cpu", page_size=4, max_total_tokens=256, max_running_requests=2,
                                  attention_backend="triton", kv_cache_dtype="fp8_e4m3"), model_dir)


def test_kv_cache_scale_for_a_layer_the_model_lacks_is_refused_by_an_fp8_pool(tmp_path: Path) -> None:
    """KV-cache scales are used only by an FP8 KV pool: a checkpoint with one for a layer the model
    lacks loads for a pool in the model dtype (as it did before FP8 KV existed) and is refused,
    naming the layer, for an FP8 pool."""
    from safetensors.torch import load_file, save_file

    save_tiny_model("llama", tmp_path)  # two layers
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.1.self_attn.k_scale"] = torch.tensor(0.5)
    tensors["model.layers.9.self_attn.v_scale"] = torch.tensor(0.5)
    save_file(tensors, tmp_path / "model.safetensors")
    model, _ = load_model(tmp_path, torch.float32, "cpu", "auto")
    assert model.kv_cache_scales == {1: {"k": 0.5}, 9: {"v": 0.5}}
    with pytest.raises(ModelLoadError, match="layer 9 of a 2-layer model"):
        _fp8_kv_runner(tmp_path)
