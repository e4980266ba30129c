"""How `make test` shares the suite between pytest-xdist workers (`-n 2 --dist loadfile`).

`--dist loadfile` sends each test file whole to one worker (its module-scoped servers, fleets and
Engines start once; its tests run in file order). `SessionServerScheduling` keeps that, and makes all
the files that use a session-scoped server of tests/conftest.py (`SESSION_SERVERS`) one unit, so each
of those servers starts once per run instead of once per worker (a start is ~24 s of CPU: measured
2026-12, launcher 2.4 + worker 3.6 + scheduler 8.9 + tokenizer 9.0). The controller does not collect
tests, so a file's use is read from its source: a `def` (test or fixture) with a parameter of that
name. Getting it wrong costs only an extra server start, never a test.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

SESSION_SERVERS = ("server", "keyed_server")  # session-scoped fixtures of tests/conftest.py
SESSION_SERVER_UNIT = "tests-using-session-servers"
_DEF_PARAMS = re.compile(r"\bdef \w+\(([^)]*)\)", re.S)
_NAMES = re.compile(r"\b(?:" + "|".join(SESSION_SERVERS) + r")\b")


@functools.cache
def uses_session_server(path: Path) -> bool:
    """Whether the test file at `path` has a def taking a SESSION_SERVERS fixture (False if unreadable)."""
    try:
        source = path.read_text(errors="replace")
    except OSError:
        return False
    return any(_NAMES.search(params) for params in _DEF_PARAMS.findall(source))


class SessionServerScheduling(LoadScopeScheduling):
    """LoadFileScheduling, except that the files using a session server form one unit (module docstring)."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return SESSION_SERVER_UNIT if uses_session_server(self.config.rootpath / path) else path
