"""rms_norm (with/without fused residual), NeoX RoPE (full and partial rotary dim, Llama-3 scaling)
and silu_and_mul against their torch references."""

from __future__ import annotations

import math

import pytest
import torch

from radixrt.kernels import apply_rotary, build_rope_cache, rms_norm, silu_and_mul
from radixrt.kernels.reference import apply_rotary_ref, rms_norm_ref, silu_and_mul_ref

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3)}


def _randn(*shape, dtype, device, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype=dtype, device=device)


@pytest.mark.parametrize("num_tokens, hidden, dtype, with_residual", [
    (1, 64, torch.float32, False), (7, 100, torch.float16, True), (33, 1000, torch.float32, True),
])
def test_rms_norm_matches_reference(device, close, num_tokens, hidden, dtype, with_residual):
    x = _randn(num_tokens, hidden, dtype=dtype, device=device, seed=1)
    w = _randn(hidden, dtype=dtype, device=device, seed=2)
    res = _randn(num_tokens, hidden, dtype=dtype, device=device, seed=3) if with_residual else None
    x_before = x.clone()
    out, new_res = rms_norm(x, w, 1e-6, res)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-6, res)
    close(out, ref_out, *TOL[dtype])
    assert torch.equal(new_res, ref_res)
    assert torch.equal(x, x_before)  # inputs untouched


def test_rms_norm_3d_per_head(device, close):
    """Qwen3-style q/k norm: a [T, H, D] input normalised over D."""
    x = _randn(5, 3, 16, dtype=torch.float32, device=device)
    w = _randn(16, dtype=torch.float32, device=device, seed=4)
    out, _ = rms_norm(x, w, 1e-5)
    close(out, rms_norm_ref(x, w, 1e-5)[0], 1e-5, 1e-5)


@pytest.mark.parametrize("num_tokens, hq, hkv, head_dim, rotary_dim, dtype", [
    (1, 4, 4, 64, 64, torch.float32), (7, 7, 1, 80, 80, torch.float16), (33, 4, 2, 64, 32, torch.float32),
])
def test_rotary_matches_reference(device, close, num_tokens, hq, hkv, head_dim, rotary_dim, dtype):
    cache = build_rope_cache(rotary_dim, 4096, 10000.0, device=device)
    qkv = _randn(num_tokens, (hq + 2 * hkv) * head_dim, dtype=dtype, device=device, seed=5)
    q = qkv[:, : hq * head_dim].view(num_tokens, hq, head_dim)
    k = qkv[:, hq * head_dim:(hq + hkv) * head_dim].view(num_tokens, hkv, head_dim)
    v_before = qkv[:, (hq + hkv) * head_dim:].clone()
    positions = torch.randint(0, 4096, (num_tokens,), generator=torch.Generator().manual_seed(6)).to(device)
    q_ref, k_ref = apply_rotary_ref(q, k, positions, cache)
    apply_rotary(q, k, positions, cache)
    close(q, q_ref, *TOL[dtype])
    close(k, k_ref, *TOL[dtype])
    assert torch.equal(qkv[:, (hq + hkv) * head_dim:], v_before)  # v untouched


def test_rotary_position_zero_is_identity_and_norm_preserving(device):
    cache = build_rope_cache(64, 16, 10000.0, device=device)
    q = _randn(2, 2, 64, dtype=torch.float32, device=device)
    k = _randn(2, 1, 64, dtype=torch.float32, device=device, seed=1)
    q0, k0 = q.clone(), k.clone()
    apply_rotary(q, k, torch.tensor([0, 9], device=device), cache)
    assert torch.allclose(q[0], q0[0]) and torch.allclose(k[0], k0[0])
    assert not torch.allclose(q[1], q0[1])
    torch.testing.assert_close(q.norm(dim=-1), q0.norm(dim=-1), atol=1e-4, rtol=1e-4)


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def test_llama3_rope_cache_bands():
    """High frequencies unchanged, low frequencies divided by `factor`, a smooth band in between."""
    dim, base = 128, 500000.0
    plain = build_rope_cache(dim, 2, base)[1, dim // 2:]  # sin(1 * inv_freq), inv_freq <= 1
    scaled = build_rope_cache(dim, 2, base, LLAMA3_SCALING)[1, dim // 2:]
    inv = 1.0 / base ** (torch.arange(0, dim, 2).float() / dim)
    inv_scaled = torch.asin(scaled.double()).float()
    wavelen = 2 * math.pi / inv
    high = wavelen < 8192 / 4.0
    low = wavelen > 8192 / 1.0
    assert high.any() and low.any() and (~high & ~low).any()
    assert torch.equal(scaled[high], plain[high])
    torch.testing.assert_close(inv_scaled[low], inv[low] / 8.0, rtol=1e-3, atol=1e-7)
    mid = ~high & ~low
    assert ((inv_scaled[mid] <= inv[mid] * 1.001) & (inv_scaled[mid] >= inv[mid] / 8.0 * 0.999)).all()


def test_llama3_rope_cache_matches_transformers():
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    fn = rope_utils.ROPE_INIT_FUNCTIONS.get("llama3")
    if fn is None:
        pytest.skip("this transformers has no llama3 rope init")
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=256, num_attention_heads=2, max_position_embeddings=131072,
                      rope_theta=500000.0, rope_scaling=dict(LLAMA3_SCALING))
    inv_freq = fn(cfg, "cpu")[0]
    ours = build_rope_cache(128, 3, 500000.0, LLAMA3_SCALING)[2, :64]
    torch.testing.assert_close(ours, torch.cos(2.0 * inv_freq.float()), atol=1e-6, rtol=1e-6)


def test_rope_cache_rejects_unknown_scaling():
    with pytest.raises(ValueError):
        build_rope_cache(64, 8, 10000.0, {"rope_type": "yarn", "factor": 4.0})


@pytest.mark.parametrize("num_tokens, inter, dtype", [
    (1, 33, torch.float32), (7, 2048 + 5, torch.float16),
])
def test_silu_and_mul_matches_reference(device, close, num_tokens, inter, dtype):
    x = _randn(num_tokens, 2 * inter, dtype=dtype, device=device, seed=8) * 4
    close(silu_and_mul(x), silu_and_mul_ref(x), *TOL[dtype])


@pytest.mark.parametrize("num_tokens, inter, num_p", [(1, 33, 5), (2, 2048 + 5, 448)])
def test_silu_and_mul_of_unnormalized_rms_rows(device, close, num_tokens, inter, num_p):
    """`rms` (sq, eps, hidden): each row is first multiplied by 1 / sqrt(sum(sq[t]) / hidden + eps),
    as if the linear before had normalized its input (kernels/gemv_fp8_int.py NORM_OUT's partial sums);
    the same result as scaling x in torch first."""
    x = _randn(num_tokens, 2 * inter, dtype=torch.float32, device=device, seed=9) * 20
    sq = _randn(num_tokens, num_p, dtype=torch.float32, device=device, seed=10).abs() * 50
    eps, hidden = 1e-5, 3584
    rstd = torch.rsqrt(sq.sum(1, keepdim=True) / hidden + eps)
    close(silu_and_mul(x, rms=(sq, eps, hidden)), silu_and_mul_ref(x * rstd), *TOL[torch.float32])
    with pytest.raises(ValueError, match="sq"):
        silu_and_mul(x, rms=(sq[:, :1].expand(num_tokens, 2), eps, hidden))
