"""The float32 CPU path of radixrt.models.linear.Linear through oneDNN with a packed weight (the native
linear, which takes float32 calls of up to 128 rows before it where enabled, is off here; its tests:
tests/kernels/test_cpu_native_linear.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixrt.models.linear import CPU_PACKED_ROWS, Linear

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")


@pytest.fixture(autouse=True)
def _native_linear_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import radixrt.models.linear as linear_mod

    monkeypatch.setattr(linear_mod, "_native_on", False)


def _linear(n: int = 96, k: int = 64, bias: bool = True) -> Linear:
    torch.manual_seed(0)
    lin = Linear(k, n, bias=bias)
    lin._cpu_packed = True
    return lin


@pytest.mark.parametrize("m", [1, 2, 4, 16, 128, 129, 300])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_f_linear_and_packs_only_decode_sized_calls(m: int, bias: bool) -> None:
    lin = _linear(bias=bias)
    x = torch.randn(m, 64)
    with torch.inference_mode():
        out = lin(x)
    torch.testing.assert_close(out, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert (lin._packed is not None) == (m in CPU_PACKED_ROWS)


def test_a_changed_weight_is_packed_again() -> None:
    lin = _linear()
    x = torch.randn(4, 64)
    with torch.inference_mode():
        lin(x)
    first = lin._packed[1]
    with torch.no_grad():
        lin.weight.mul_(-2.0)  # in place: same storage, new version
    with torch.inference_mode():
        out = lin(x)
    assert lin._packed[1] is not first
    torch.testing.assert_close(out, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    lin.weight = torch.nn.Parameter(torch.randn(96, 64))  # new storage
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


def test_inference_tensor_weight_and_switch_off() -> None:
    with torch.inference_mode():
        lin = _linear()  # parameters created in inference mode carry no version counter
        x = torch.randn(3, 64)
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        assert lin._packed is not None
        off = _linear()
        off._cpu_packed = False  # RADIXRT_CPU_PACKED_LINEAR=0
        off(x)
        assert off._packed is None
        half = _linear().half()  # only float32 takes the packed path
        half(x.half())
        assert half._packed is None


def test_prepack_packs_every_float32_cpu_linear_once() -> None:
    from radixrt.models.linear import prepack_cpu_linears

    model = torch.nn.Sequential(_linear(), torch.nn.ReLU(), _linear(64, 96))
    for m in model:
        if isinstance(m, Linear):
            m._cpu_packed = True
    assert prepack_cpu_linears(model) == 2
    packed = [m._packed[1] for m in model if isinstance(m, Linear)]
    x = torch.randn(4, 64)
    with torch.inference_mode():
        out = model(x)
    assert [m._packed[1] for m in model if isinstance(m, Linear)] == packed  # not packed again
    ref = F.linear(torch.relu(F.linear(x, model[0].weight, model[0].bias)), model[2].weight, model[2].bias)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    off = torch.nn.Sequential(_linear())
    off[0]._cpu_packed = False
    assert prepack_cpu_linears(off) == 0 and off[0]._packed is None


def test_packed_rows_by_vendor() -> None:
    from radixrt.models.linear import cpu_packed_rows, cpu_vendor

    intel, other = cpu_packed_rows("GenuineIntel"), cpu_packed_rows("AuthenticAMD")
    unknown = cpu_packed_rows("")
    assert 1 not in intel and 4 in intel and 128 in intel and 129 not in intel and 2048 not in intel
    assert unknown == intel
    assert all(m in other for m in (1, 4, 128, 129, 2048, 65536)) and 0 not in other
    assert isinstance(cpu_vendor(), str)


@pytest.mark.parametrize("m", [1, 4, 300])
def test_bfloat16_calls_are_packed_at_every_row_count(m: int) -> None:
    """bf16 CPU calls take oneDNN with a packed bf16 weight whatever the vendor (F.linear's bf16 path
    re-reads an unpacked weight); same result as a float32 matmul of the same bf16 values, rounded."""
    lin = _linear().to(torch.bfloat16)
    x = torch.randn(m, 64).to(torch.bfloat16)
    with torch.inference_mode():
        out = lin(x)
    assert lin._packed is not None and out.dtype == torch.bfloat16
    ref = F.linear(x.float(), lin.weight.float(), lin.bias.float())
    torch.testing.assert_close(out.float(), ref, rtol=1.6e-2, atol=1e-2)
