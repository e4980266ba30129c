"""How `make test` shares the suite between pytest-xdist workers (`-n 2 --dist loadfile`).

`--dist loadfile` sends each test file whole to one worker (its module-scoped servers, fleets and
Engines start once; its tests run in file order). `SessionServerScheduling` keeps that, and makes all
the files that use a session-scoped server of tests/conftest.py (`SESSION_SERVERS`) one unit, so each
of those servers starts once per run instead of once per worker (a start is ~24 s of CPU: measured
2026-12, launcher 2.4 + worker 3.6 + scheduler 8.9 + tokenizer 9.0). The controller does not collect
tests, so a file's use is read from its source: a `def` (test or fixture) with a parameter of that
name. Getting it wrong costs only an extra server start, never a test.

Units start in LONG_FIRST order, then by test count (xdist's own order): the session-server unit,
then the files that start their own servers or fleets and run long with few tests (by test count
they would come last and leave one worker running them alone at the end).
"""

from __future__ import annotations

import functools
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

SESSION_SERVERS = ("server", "keyed_server")  # session-scoped fixtures of tests/conftest.py
SESSION_SERVER_UNIT = "tests-using-session-servers"
# the longest units apart from the session-server one (the last full runs, 2026-12-01: 90-200 s each)
LONG_FIRST = (SESSION_SERVER_UNIT, "tests/reliability/test_faults.py", "tests/fleet/test_fleet_e2e.py",
              "tests/e2e/test_scheduler_e2e.py", "tests/tp/test_tp_server.py",
              "tests/e2e/test_server_openai.py")
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

    def _assign_work_unit(self, node) -> None:  # noqa: ANN001 (xdist's WorkerController)
        """Assign the next unit, the LONG_FIRST ones before the rest (module docstring)."""
        long_first(self.workqueue)
        super()._assign_work_unit(node)


def long_first(workqueue: OrderedDict[str, Any]) -> None:
    """Move the LONG_FIRST units that are still queued to the front of `workqueue`, in that order."""
    for scope in reversed(LONG_FIRST):
        if scope in workqueue:
            workqueue.move_to_end(scope, last=False)
