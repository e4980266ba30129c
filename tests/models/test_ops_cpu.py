"""The CPU (pure torch) paths of radixrt.models.ops against the Hugging Face Llama formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixrt.models import ops


def _hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_hf(dtype: torch.dtype, with_residual: bool) -> None:
    torch.manual_seed(0)
    x, res = torch.randn(5, 96, dtype=dtype) * 3, torch.randn(5, 96, dtype=dtype)
    w = torch.randn(96, dtype=dtype)
    out, new_res = ops.rms_norm(x, w, 1e-5, res if with_residual else None)
    h = x + res if with_residual else x
    torch.testing.assert_close(new_res, h, rtol=0, atol=0)
    tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(out, _hf_rms_norm(h, w, 1e-5), **tol)
    assert out.dtype == dtype


def test_silu_and_mul() -> None:
    """Exact on the torch path; the native C loop (taken once its library is loaded, float32) within
    float32 rounding of torch's, its exp included (tests/kernels/test_cpu_native_ops.py)."""
    torch.manual_seed(0)
    x = torch.randn(3, 2 * 40)
    tol = {"rtol": 2e-6, "atol": 1e-6} if ops._cpu_native() is not None else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(ops.silu_and_mul(x), F.silu(x[:, :40]) * x[:, 40:], **tol)
