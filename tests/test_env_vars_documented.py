"""Every RADIXRT_* environment variable that radixrt, kernels/ or tokenizer_proc/ reads has a row in
docs/api.md's "Environment variables" table, and the table names no variable the code does not read."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"RADIXRT_[A-Z0-9_]*[A-Z0-9]")


def _read_by_code() -> set[str]:
    names: set[str] = set()
    for folder in ("radixrt", "kernels", "tokenizer_proc"):
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(NAME.findall(path.read_text()))
    return names


def _table() -> set[str]:
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `(RADIXRT_[A-Z0-9_]+)` \|", section, re.M)}


def test_every_variable_the_code_reads_is_in_the_table():
    code, table = _read_by_code(), _table()
    assert code, "found no RADIXRT_ variable in the code: the scan is broken"
    assert not code - table, f"not in docs/api.md's Environment variables table: {sorted(code - table)}"
    assert not table - code, f"in the table but read nowhere: {sorted(table - code)}"


def test_radixrt_switches_take_the_documented_off_values(monkeypatch):
    """docs/api.md: switches take 0, false or off (any case) for off; radixrt's Env and kernels/'s
    switches read them alike."""
    from radixrt.config import Env
    from radixrt.kernels import switches

    for value, want in (("off", False), ("OFF", False), (" False ", False), ("0", False), ("1", True),
                        ("on", True), ("", True)):
        monkeypatch.setenv("RADIXRT_ROPE_STORE", value)
        monkeypatch.setenv("RADIXRT_PDL", value)
        assert Env.read().rope_store is want and switches.pdl_enabled() is want, value
    monkeypatch.setenv("RADIXRT_GEMM_WS", "Off")
    monkeypatch.setenv("RADIXRT_CPU_NATIVE_LINEAR", "on")
    env = Env.read()
    assert env.gemm_ws == "0" and env.cpu_native_linear == "1"
