"""The small per-token ops of a decoder layer: fused Triton kernels on CUDA, torch elsewhere (float32
RMSNorm: the native C loop of `radixrt.worker.cpu_native` when that library is loaded).

Every model calls these functions (and nothing else) for RMSNorm, rotary embedding and the gated MLP
activation (the `_fp8` forms where an FP8 linear takes their output quantized), so that fused Triton
kernels (`radixrt.kernels`) can replace them later without touching model code. Numerics follow the
Hugging Face Llama reference: RMSNorm in float32, cast back to the input dtype before the weight
multiply; rotary tables in float32.
"""

from __future__ import annotations

from types import ModuleType

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
    if x.dtype == torch.float32:
        native = _cpu_native()
        if native is not None and native.takes_rms_norm(x, weight, residual):  # add and norm: one C loop
            return native.rms_norm(x, weight, eps, residual)
    if residual is not None:
        x = x + residual
    new_residual = x
    if x.dtype == torch.float32:  # one fused op instead of six; the same float32 arithmetic as below
        return F.rms_norm(x, weight.shape, weight, eps), new_residual
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype), new_residual


# The last pass's rotary rows: every layer of a pass rotates at the same positions, so the tables are
# gathered once per pass, not 30 times (index_select + 2 repeats per layer; ~3% of a CPU decode step).
# Keyed on the tensors' identity (ForwardMeta's tensors stay unchanged through a pass, and each pass
# has new ones) and, outside inference mode, their version counters.
_cos_sin_memo: tuple | None = None


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version


def _cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor, dtype: torch.dtype
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin_signed) [T, 1, D] in `dtype`: cos = [c, c], sin_signed = [-s, s] (rotate-half's sign
    folded into the table, so that rotate_half(x) * sin == roll(x, D/2) * sin_signed)."""
    global _cos_sin_memo
    memo = _cos_sin_memo
    key = (_version(positions), _version(cos_sin_cache), dtype)
    if memo is not None and memo[0] is positions and memo[1] is cos_sin_cache and memo[2] == key:
        return memo[3]
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache.index_select(0, positions)  # [T, D]
    cos = cs[:, :half].repeat(1, 2).unsqueeze(1).to(dtype)  # [T, 1, D]
    sin = torch.cat((-cs[:, half:], cs[:, half:]), dim=-1).unsqueeze(1).to(dtype)  # [T, 1, D]
    _cos_sin_memo = (positions, cos_sin_cache, key, (cos, sin))
    return cos, sin


def _adjacent_heads(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """q [T, Hq, D] and k [T, Hkv, D] as one [T, Hq + Hkv, D] view when k's heads follow q's in
    every row (the q|k|v columns of a fused QKV output), else None."""
    if (q.dtype != k.dtype or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]
            or q.stride()[1:] != k.stride()[1:] or (q.shape[0] > 1 and q.stride(0) != k.stride(0))
            or q.stride(2) != 1 or q.stride(1) != q.shape[2]
            or q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()):
        return None
    if k.data_ptr() != q.data_ptr() + q.shape[1] * q.shape[2] * q.element_size():
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1], q.shape[2]), q.stride())


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
        (q_rot [T, Hq, D], k_rot [T, Hkv, D]) in the input dtype: q and k themselves, rotated in
        place, on CUDA and where k's heads follow q's (a fused QKV output) in float32 on a CPU with
        the native library loaded (`radixrt.worker.cpu_native.rotary_`); new tensors elsewhere.
    """
    if q.is_cuda:  # in place on q and k (views of the fused QKV output)
        from radixrt.kernels import apply_rotary as fused_rotary

        fused_rotary(q, k, positions, cos_sin_cache)
        return q, k
    qk = _adjacent_heads(q, k)  # one pass over q and k together: 3 ops instead of 10 (CPU decode)
    if qk is not None and q.dtype == torch.float32:
        native = _cpu_native()
        if native is not None and native.takes_rotary(qk, positions, cos_sin_cache):
            native.rotary_(qk, qk.shape[1], positions, cos_sin_cache)  # in place, one C loop
            return q, k
    cos, sin = _cos_sin(positions, cos_sin_cache, q.dtype)
    half = q.shape[-1] // 2
    if qk is not None:
        rot = (qk * cos).addcmul_(torch.roll(qk, half, dims=-1), sin)  # [T, Hq + Hkv, D]
        return rot[:, :q.shape[1]], rot[:, q.shape[1]:]
    return ((q * cos).addcmul_(torch.roll(q, half, dims=-1), sin),
            (k * cos).addcmul_(torch.roll(k, half, dims=-1), sin))


def silu_and_mul(x: torch.Tensor, rms: tuple[torch.Tensor, float, int] | None = None) -> torch.Tensor:
    """SwiGLU activation (Shazeer 2020): x = [gate | up] -> silu(gate) * up.

    Args:
        x: [T, 2 * I].
        rms: (sq [T, P] float32, eps, hidden) when x is the bias-free linear of RMSNorm rows left
            unnormalized (models/quant/fp8.py NormedAct): x's rows are first multiplied by
            1 / sqrt(sum(sq[t]) / hidden + eps) (kernels.silu_and_mul's `rms`).

    Returns:
        [T, I], same dtype.
    """
    if x.is_cuda:
        from radixrt.kernels import silu_and_mul as fused_silu_and_mul

        return fused_silu_and_mul(x, rms)
    if rms is not None:
        sq, eps, hidden = rms
        x = (x.float() * torch.rsqrt(sq.sum(1, keepdim=True) / hidden + eps)).to(x.dtype)
    if x.dtype == torch.float32 and x.dim() == 2 and x.is_contiguous() and x.device.type == "cpu":
        native = _cpu_native()
        if native is not None:  # one C loop instead of chunk, silu and mul
            return native.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """`rms_norm` whose output is quantized per token to FP8 for an FP8 linear (models/quant/fp8.py).

    Args:
        x: [T, H] activations; weight, eps, residual as `rms_norm`.

    Returns:
        (Fp8Act of the normalised [T, H] rows in x's dtype, new_residual [T, H]). On CUDA one kernel
        (`kernels.rms_norm_quant_fp8`: the bf16 output is never written); elsewhere `rms_norm` then
        `quantize_per_token`, the same values.
    """
    from radixrt.models.quant.fp8 import Fp8Act, quantize_per_token

    if x.is_cuda:
        from radixrt.kernels import rms_norm_quant_fp8

        q, scale, new_residual = rms_norm_quant_fp8(x, weight, eps, residual)
        return Fp8Act(q, scale, x.dtype), new_residual
    out, new_residual = rms_norm(x, weight, eps, residual)
    return Fp8Act(*quantize_per_token(out), x.dtype), new_residual


def silu_and_mul_fp8(x: torch.Tensor):
    """`silu_and_mul` quantized per token to FP8 for an FP8 down projection: x [T, 2I] -> Fp8Act of
    [T, I] rows in x's dtype. On CUDA from kernels.activation.quant_fused_min_rows(I) rows one kernel
    (`kernels.silu_and_mul_quant_fp8`, faster there); otherwise `silu_and_mul` then
    `quantize_per_token`, the same values."""
    from radixrt.models.quant.fp8 import Fp8Act, quantize_per_token

    if x.is_cuda:
        from radixrt.kernels import silu_and_mul_quant_fp8
        from radixrt.kernels.activation import quant_fused_min_rows

        if x.shape[0] >= quant_fused_min_rows(x.shape[1] // 2):
            return Fp8Act(*silu_and_mul_quant_fp8(x), x.dtype)
    return Fp8Act(*quantize_per_token(silu_and_mul(x)), x.dtype)


def _cpu_native() -> ModuleType | None:
    """radixrt.worker.cpu_native when its library is loaded (the worker loads it at start-up), else None."""
    global _native_mod
    if _native_mod is None:
        from radixrt.worker import cpu_native

        _native_mod = cpu_native
    return _native_mod if _native_mod._lib is not None else None


_native_mod: ModuleType | None = None
