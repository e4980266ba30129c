"""The small per-token ops of a decoder layer: fused Triton kernels on CUDA, pure torch elsewhere.

Every model calls these three functions (and nothing else) for RMSNorm, rotary embedding and the
gated MLP activation, so that fused Triton kernels (`radixrt.kernels`) can replace them later
without touching model code. Numerics follow the Hugging Face Llama reference: RMSNorm in float32,
cast back to the input dtype before the weight multiply; rotary tables in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm with an optional fused residual add (Zhang & Sennrich 2019).

    Args:
        x: [..., H] activations (any float dtype).
        weight: [H] scale, same dtype as x.
        eps: added to the mean square before the reciprocal square root.
        residual: [..., H] or None. When given, `x + residual` is normalised and also returned as
            the new residual stream; when None, `x` itself is the new residual.

    Returns:
        (out [..., H] in x.dtype, new_residual [..., H]).
    """
    if x.is_cuda:  # one fused kernel instead of ~6 elementwise ones (matters at small batch)
        from radixrt.kernels import rms_norm as fused_rms_norm

        return fused_rms_norm(x, weight, eps, residual)
    if residual is not None:
        x = x + residual
    new_residual = x
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype), new_residual


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# The last pass's rotary rows: every layer of a pass rotates at the same positions, so the tables are
# gathered once per pass, not 30 times (index_select + 2 repeats per layer; ~3% of a CPU decode step).
# Keyed on the tensors' identity (ForwardMeta's tensors stay unchanged through a pass, and each pass
# has new ones) and, outside inference mode, their version counters.
_cos_sin_memo: tuple | None = None


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version


def _cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor, dtype: torch.dtype
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [T, 1, D] in `dtype`, each half-table repeated twice (rotate-half layout)."""
    global _cos_sin_memo
    memo = _cos_sin_memo
    key = (_version(positions), _version(cos_sin_cache), dtype)
    if memo is not None and memo[0] is positions and memo[1] is cos_sin_cache and memo[2] == key:
        return memo[3]
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache.index_select(0, positions)  # [T, D]
    cos = cs[:, :half].repeat(1, 2).unsqueeze(1).to(dtype)  # [T, 1, D]
    sin = cs[:, half:].repeat(1, 2).unsqueeze(1).to(dtype)  # [T, 1, D]
    _cos_sin_memo = (positions, cos_sin_cache, key, (cos, sin))
    return cos, sin


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                 cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding (Su et al. 2021), NeoX / "rotate-half" layout as in HF Llama.

    Dimension i of the first half of each head is rotated together with dimension i + D/2.

    Args:
        q: [T, Hq, D]; k: [T, Hkv, D]; same float dtype.
        positions: [T] int64 position of each token.
        cos_sin_cache: [max_positions, D] float32; columns [:D/2] hold cos, [D/2:] hold sin
            (see `rope.build_cos_sin_cache`).

    Returns:
        (q_rot [T, Hq, D], k_rot [T, Hkv, D]) in the input dtype.
    """
    if q.is_cuda:  # in place on q and k (views of the fused QKV output)
        from radixrt.kernels import apply_rotary as fused_rotary

        fused_rotary(q, k, positions, cos_sin_cache)
        return q, k
    cos, sin = _cos_sin(positions, cos_sin_cache, q.dtype)
    q_rot = q * cos + _rotate_half(q) * sin
    k_rot = k * cos + _rotate_half(k) * sin
    return q_rot, k_rot


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation (Shazeer 2020): x = [gate | up] -> silu(gate) * up.

    Args:
        x: [T, 2 * I].

    Returns:
        [T, I], same dtype.
    """
    if x.is_cuda:
        from radixrt.kernels import silu_and_mul as fused_silu_and_mul

        return fused_silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
