"""How `make test` shares the suite between pytest-xdist workers (`-n 2 --dist loadfile`).

`--dist loadfile` sends each test file whole to one worker (its module-scoped servers, fleets and
Engines start once; its tests run in file order). `SessionServerScheduling` keeps that, and makes all
the files that use a session-scoped server of tests/conftest.py (`SESSION_SERVERS`) one unit, so each
of those servers starts once per run instead of once per worker (a start is ~12 s of CPU: measured
2026-12-02, launcher 0.3 + worker 4.2-4.7 + scheduler 1.4-1.8 + tokenizer 5.1-5.6). The controller
does not collect tests, so a file's use is read from its source: a `def` (test or fixture) with a
parameter of that name. Getting it wrong costs only an extra server start, never a test.

Units start in LONG_FIRST order, then by test count (xdist's own order): the session-server unit,
then the files that start their own servers or fleets, or run long on few tests (by test count they
would come last and leave one worker running them alone at the end). Longest first is the LPT rule:
what is left for the end are units of under ~25 s.
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
# the units of over 25 s, longest first (make test under other load, 2026-12-02: the session-server
# unit ~650 s, then 104, 76, 76, 58, 38, 33, 30, 29, 28, 25 s)
LONG_FIRST = (SESSION_SERVER_UNIT, "tests/fleet/test_fleet_e2e.py", "tests/reliability/test_faults.py",
              "tests/e2e/test_scheduler_e2e.py", "tests/worker/test_model_vs_hf.py",
              "tests/kernels/test_cascade_attention.py", "tests/kernels/test_attention_triton.py",
              "tests/e2e/test_hicache_e2e.py", "tests/tokenizer_proc/test_process.py",
              "tests/kernels/test_attention_configs.py", "tests/tp/test_tp_server.py")
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
