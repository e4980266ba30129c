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


def _silu_mul_exact(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu(x Wg^T) * (x Wu^T), |x||Wg|^T + |x||Wu|^T) in float64 for w = [Wg; Wu]."""
    g, u = (x.double() @ w.double().t()).chunk(2, dim=-1)
    ag, au = (x.double().abs() @ w.double().abs().t()).chunk(2, dim=-1)
    return F.silu(g) * u, ag + au


# I around the 16-column half panels (1, 15, 16, 17, 40, 1536), M around the 12-row blocks
@pytest.mark.parametrize("n,k", [(1, 5), (15, 7), (16, 64), (17, 576), (40, 33), (1536, 576)])
@pytest.mark.parametrize("m", [1, 2, 12, 13, 25, 128])
def test_linear_silu_matches_exact_swiglu(n: int, k: int, m: int) -> None:
    g = torch.Generator().manual_seed(n * 1000 + k * 10 + m)
    w = torch.randn(2 * n, k, generator=g) / k ** 0.5
    x = torch.randn(m, k, generator=g)
    y = cpu_native.linear_silu(x, cpu_native.pack_gate_up(w), n)
    exact, scale = _silu_mul_exact(x, w)
    assert y.shape == (m, n) and y.dtype == torch.float32
    # float32 rounding of the two K-term dot products, carried through silu(g) * u (|d silu / dg| <= 1.1)
    assert ((y.double() - exact).abs() <= 1e-6 * (scale * (1 + scale)) + 1e-7).all()


@pytest.mark.parametrize("m", [1, 13, 32])
def test_linear_silu_is_the_linear_then_silu_and_mul_bit_for_bit(m: int) -> None:
    """Same GEMM (same blocks, same K order) and the same exp: where I is a multiple of 16 (silu_and_mul's
    vector loop covers every column) the fused result is exactly the two calls' result."""
    g = torch.Generator().manual_seed(m)
    w = torch.randn(2 * 96, 576, generator=g) / 24
    x = torch.randn(m, 576, generator=g)
    fused = cpu_native.linear_silu(x, cpu_native.pack_gate_up(w), 96)
    assert torch.equal(fused, cpu_native.silu_and_mul(cpu_native.linear(x, cpu_native.pack_linear(w), 192)))


def test_gate_up_layout_pairs_gate_and_up_columns_with_zero_padding() -> None:
    w = torch.arange(2 * 20 * 3, dtype=torch.float32).reshape(40, 3)  # I = 20: gate rows 0-19, up 20-39
    wp = cpu_native.pack_gate_up(w).reshape(2, 3, 32)  # [panel][K][32]
    assert torch.equal(wp[0, :, :16], w[:16].t()) and torch.equal(wp[0, :, 16:], w[20:36].t())
    assert torch.equal(wp[1, :, :4], w[16:20].t()) and not wp[1, :, 4:16].any()
    assert torch.equal(wp[1, :, 16:20], w[36:40].t()) and not wp[1, :, 20:].any()


def test_linear_silu_bad_inputs_raise() -> None:
    w = torch.randn(40, 16)
    wp = cpu_native.pack_gate_up(w)
    with pytest.raises(ValueError):
        cpu_native.linear_silu(torch.randn(4, 17), wp, 20)  # K does not match the packed weight
    with pytest.raises(ValueError):
        cpu_native.linear_silu(torch.randn(4, 16), wp, 40)  # I does not match the packed weight
    with pytest.raises(ValueError):
        cpu_native.linear_silu(torch.randn(16, 4).t(), wp, 20)  # not contiguous
    with pytest.raises(ValueError):
        cpu_native.pack_gate_up(torch.randn(39, 16))  # odd rows: no [gate; up] halves


@pytest.mark.parametrize("m", [1, 32, 128, 129])
def test_gated_linear_fuses_the_silu_up_to_128_rows(native_on: None, m: int) -> None:
    from radixrt.models import ops
    from radixrt.models.linear import NATIVE_LINEAR_ROWS, Linear

    torch.manual_seed(0)
    lin = Linear(64, 2 * 48, bias=False)
    lin.gated = True
    x = torch.randn(m, 64)
    with torch.inference_mode():
        out = lin.silu_and_mul(x)
        ref = ops.silu_and_mul(F.linear(x, lin.weight))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert (lin._native_gated is not None) == (m in NATIVE_LINEAR_ROWS)
    assert lin._native is None or m not in NATIVE_LINEAR_ROWS  # the fused call packs only its own copy


def test_gated_linear_with_bias_or_fp16_takes_the_unfused_path(native_on: None) -> None:
    from radixrt.models import ops
    from radixrt.models.linear import Linear, prepack_cpu_linears

    torch.manual_seed(0)
    lin = Linear(64, 96, bias=True)
    lin.gated = True
    x = torch.randn(4, 64)
    with torch.inference_mode():
        out = lin.silu_and_mul(x)
    torch.testing.assert_close(out, ops.silu_and_mul(F.linear(x, lin.weight, lin.bias)), rtol=1e-5, atol=1e-5)
    assert lin._native_gated is None and lin._native is not None
    assert prepack_cpu_linears(torch.nn.Sequential(lin)) == 1 and lin._native_gated is None
    plain = Linear(64, 96, bias=False)
    plain.gated = True
    assert prepack_cpu_linears(torch.nn.Sequential(plain)) == 1
    assert plain._native_gated is not None and plain._native is None
