"""The native float32 CPU linear (kernels/cpu_native_gemm.h through radixrt.worker.cpu_native) and its
routing in radixrt.models.linear.Linear. Skipped where the library does not build with AVX-512."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixrt.worker import cpu_native

pytestmark = pytest.mark.skipif(not cpu_native.linear_supported(),
                                reason="native CPU linear needs a C compiler and AVX-512")


def _rel_err(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> float:
    """max |y - exact| / max sum |x||w|: float32 rounding of a K-term dot product stays ~1e-7."""
    exact = x.double() @ w.double().t() + (0 if b is None else b.double())
    return ((y.double() - exact).abs().max() / (x.double().abs() @ w.double().abs().t()).max()).item()


# N around the 32-column panels (1, 31, 32, 33, 65, 960), M around the 12-row blocks (1, 11-13, 24,
# 25, 128), K small and odd as well as the default model's 576 / 1536
@pytest.mark.parametrize("n,k", [(1, 5), (31, 7), (32, 64), (33, 576), (65, 1536), (960, 576)])
@pytest.mark.parametrize("m", [1, 2, 11, 12, 13, 24, 25, 128])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_exact_product(n: int, k: int, m: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(n * 1000 + k * 10 + m)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(m, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    y = cpu_native.linear(x, cpu_native.pack_linear(w), n, b)
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert _rel_err(y, x, w, b) < 1e-6


def test_packed_layout_is_panels_of_32_with_zero_padding() -> None:
    w = torch.arange(40 * 3, dtype=torch.float32).reshape(40, 3)
    wp = cpu_native.pack_linear(w).reshape(2, 3, 32)  # [panel][K][32]
    assert torch.equal(wp[0], w[:32].t())
    assert torch.equal(wp[1, :, :8], w[32:].t()) and not wp[1, :, 8:].any()


def test_bad_inputs_raise() -> None:
    w = torch.randn(40, 16)
    wp = cpu_native.pack_linear(w)
    with pytest.raises(ValueError):
        cpu_native.linear(torch.randn(4, 16).double(), wp, 40)
    with pytest.raises(ValueError):
        cpu_native.linear(torch.randn(4, 17), wp, 40)  # K does not match the packed weight
    with pytest.raises(ValueError):
        cpu_native.linear(torch.randn(16, 4).t(), wp, 40)  # not contiguous
    with pytest.raises(ValueError):
        cpu_native.linear(torch.randn(4, 16), wp, 40, torch.randn(39))
    with pytest.raises(ValueError):
        cpu_native.pack_linear(w.half())


@pytest.fixture
def native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route float32 CPU calls to the native linear whatever the vendor (RADIXRT_CPU_NATIVE_LINEAR=1)."""
    import radixrt.models.linear as linear_mod

    monkeypatch.setattr(linear_mod, "_native_on", True)


@pytest.mark.parametrize("m", [1, 4, 32, 128, 129, 300])
def test_linear_routes_up_to_128_rows(native_on: None, m: int) -> None:
    from radixrt.models.linear import NATIVE_LINEAR_ROWS, Linear

    torch.manual_seed(0)
    lin = Linear(64, 96, bias=True)
    x = torch.randn(m, 64)
    with torch.inference_mode():
        out = lin(x)
    torch.testing.assert_close(out, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert (lin._native is not None) == (m in NATIVE_LINEAR_ROWS) == (m <= 128)


def test_a_changed_weight_is_packed_again(native_on: None) -> None:
    from radixrt.models.linear import Linear

    torch.manual_seed(0)
    lin = Linear(64, 96, bias=False)
    x = torch.randn(4, 64)
    with torch.inference_mode():
        lin(x)
    first = lin._native[1]
    with torch.no_grad():
        lin.weight.mul_(-2.0)  # in place: same storage, new version
    with torch.inference_mode():
        out = lin(x)
    assert lin._native[1] is not first
    torch.testing.assert_close(out, F.linear(x, lin.weight), rtol=1e-5, atol=1e-5)


def test_prepack_makes_the_native_copy_only_where_onednn_takes_no_calls(
        native_on: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import radixrt.models.linear as linear_mod
    from radixrt.models.linear import Linear, prepack_cpu_linears

    def model() -> torch.nn.Sequential:
        m = torch.nn.Sequential(Linear(64, 96), torch.nn.ReLU(), Linear(96, 64))
        for lin in m[0], m[2]:
            lin._cpu_packed = True
        return m

    monkeypatch.setattr(linear_mod, "CPU_PACKED_ROWS", range(2, 129))  # Intel's: all inside the native rows
    intel = model()
    assert prepack_cpu_linears(intel) == 2
    assert all(lin._native is not None and lin._packed is None for lin in (intel[0], intel[2]))
    monkeypatch.setattr(linear_mod, "CPU_PACKED_ROWS", range(1, 1 << 62))  # other vendors': prefill rows too
    other = model()
    assert prepack_cpu_linears(other) == 2
    assert all(lin._native is not None and lin._packed is not None for lin in (other[0], other[2]))
    x = torch.randn(4, 64)
    with torch.inference_mode():
        hidden = torch.relu(F.linear(x, other[0].weight, other[0].bias))
        ref = F.linear(hidden, other[2].weight, other[2].bias)
        torch.testing.assert_close(other(x), ref, rtol=1e-5, atol=1e-5)
