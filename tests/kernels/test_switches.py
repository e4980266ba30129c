"""kernels/switches.py: the kernels package's environment switches (read when asked)."""

from __future__ import annotations

import pytest

from radixrt.kernels import switches


@pytest.mark.parametrize("value,want", [("0", False), ("false", False), ("OFF", False), (" 0 ", False),
                                        ("1", True), ("true", True), ("yes", True)])
def test_flag_values(monkeypatch, value, want):
    monkeypatch.setenv("RADIXRT_TEST_SWITCH", value)
    assert switches.flag("RADIXRT_TEST_SWITCH", not want) is want


def test_unset_or_empty_gives_the_default_and_each_route_its_own(monkeypatch):
    for name in ("RADIXRT_PDL", "RADIXRT_EXTEND_WS", "RADIXRT_DECODE_WS", "RADIXRT_CASCADE_WS"):
        monkeypatch.delenv(name, raising=False)
    assert switches.pdl_enabled() and switches.extend_ws() and switches.decode_ws()
    assert not switches.cascade_ws()  # opt-in
    monkeypatch.setenv("RADIXRT_DECODE_WS", "")
    assert switches.decode_ws()
    monkeypatch.setenv("RADIXRT_DECODE_WS", "0")
    monkeypatch.setenv("RADIXRT_CASCADE_WS", "1")
    assert not switches.decode_ws() and switches.cascade_ws()  # read at each call
    monkeypatch.setenv("RADIXRT_GEMM_WS_TUNED", "")
    assert switches.gemm_ws_tuned_file() is None
