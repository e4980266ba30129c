"""The native CPU kernels' small ops (radixrt/worker/cpu_native.py); attention: test_attention_torch.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixrt.models import ops
from radixrt.worker import cpu_native

pytestmark = pytest.mark.skipif(cpu_native.load() is None, reason="no C compiler: native kernels not built")


@pytest.mark.parametrize("rows", [1, 4, 300, 1000])
def test_rms_norm_matches_torch_with_and_without_residual(rows: int) -> None:
    """The fused add + RMSNorm equals torch's float32 RMSNorm of x + residual (to float32 rounding), the
    new residual is exactly x + residual, and without a residual x itself comes back."""
    g = torch.Generator().manual_seed(rows)
    x, r = torch.randn(rows, 576, generator=g), torch.randn(rows, 576, generator=g)
    w = torch.randn(576, generator=g)
    out, new_res = cpu_native.rms_norm(x, w, 1e-5, r)
    torch.testing.assert_close(out, F.rms_norm(x + r, (576,), w, 1e-5), atol=1e-5, rtol=1e-5)
    assert torch.equal(new_res, x + r)
    out, same = cpu_native.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(out, F.rms_norm(x, (576,), w, 1e-6), atol=1e-5, rtol=1e-5)
    assert same is x


def test_models_rms_norm_routes_float32_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """models.ops.rms_norm takes the native loop for contiguous float32 CPU tensors (the library loaded)
    and keeps torch for bf16 and for a strided x; all three agree with the Hugging Face formula."""
    native_calls = []
    native = cpu_native.rms_norm
    monkeypatch.setattr(cpu_native, "rms_norm", lambda *a, **k: native_calls.append(1) or native(*a, **k))
    g = torch.Generator().manual_seed(0)
    x, r, w = torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g), torch.randn(64, generator=g)
    assert cpu_native.takes_rms_norm(x, w, r)
    assert not cpu_native.takes_rms_norm(x.bfloat16(), w.bfloat16(), r.bfloat16())
    strided = torch.randn(64, 4, generator=g).t()
    assert not cpu_native.takes_rms_norm(strided, w, None)
    s = x + r
    hf = w * (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5))
    out, _ = ops.rms_norm(strided, w, 1e-5)
    torch.testing.assert_close(out, w * (strided * torch.rsqrt(strided.pow(2).mean(-1, keepdim=True) + 1e-5)))
    out, _ = ops.rms_norm(x.bfloat16(), w.bfloat16(), 1e-5, r.bfloat16())
    torch.testing.assert_close(out.float(), hf, atol=3e-2, rtol=3e-2)
    assert not native_calls  # the strided and the bf16 calls kept torch
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5, r)[0], hf)
    assert len(native_calls) == 1  # the contiguous float32 one took the native loop
