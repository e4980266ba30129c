"""bench/lab/client_burst.py: the load generator's burst against its no-op server, both connection modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.lab import client_burst
from bench.server_proc import free_port


@pytest.mark.parametrize("connections", ["close", "keep-alive"])
def test_a_small_burst_arrives_whole(connections: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Every request reaches the no-op server (the lab raises otherwise); with keep-alive every request
    goes over a connection the pool opened before the clock (the lab checks the pool's count)."""
    rc = client_burst.main(["--rounds", "1", "--requests", "6", "--prompt-len", "32",
                            "--port", str(free_port()), "--connections", connections,
                            "--arrivals", str(tmp_path / "arrivals.json")])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"connections {connections}: 6 x 32 ids" in out and "first" in out and "last" in out
