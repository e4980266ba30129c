"""The pytest-xdist scheduler of `make test` (tests/xdist_scheduling.py) finds exactly the test files
that use a session server, judged against the fixtures pytest itself resolved for this run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("xdist", reason="pytest-xdist is not installed")

from tests.xdist_scheduling import (  # noqa: E402
    LONG_FIRST,
    SESSION_SERVER_UNIT,
    SESSION_SERVERS,
    SessionServerScheduling,
    long_first,
    uses_session_server,
)


def test_source_scan_matches_the_resolved_fixtures(request: pytest.FixtureRequest) -> None:
    items = request.session.items
    resolved = {Path(item.path) for item in items if set(SESSION_SERVERS) & set(item.fixturenames)}
    scanned = {Path(item.path) for item in items if uses_session_server(Path(item.path))}
    assert scanned == resolved


def test_files_using_a_session_server_are_one_unit(pytestconfig: pytest.Config) -> None:
    def scope(nodeid: str) -> str:  # the instance needs `-n` worker specs; _split_scope reads only .config
        return SessionServerScheduling._split_scope(SimpleNamespace(config=pytestconfig), nodeid)

    assert scope("tests/e2e/test_conformance.py::test_x[a]") == SESSION_SERVER_UNIT
    assert scope("tests/reliability/test_soak_quick.py::test_y") == SESSION_SERVER_UNIT
    assert scope("tests/memory/test_page_allocator.py::test_z") == "tests/memory/test_page_allocator.py"
    assert not uses_session_server(pytestconfig.rootpath / "tests/no_such_file.py")


def test_long_units_start_first_in_their_order(pytestconfig: pytest.Config) -> None:
    from collections import OrderedDict

    for path in LONG_FIRST[1:]:
        assert (pytestconfig.rootpath / path).is_file(), path  # a renamed file would silently drop out
    queue = OrderedDict((s, {}) for s in ["tests/a.py", LONG_FIRST[2], "tests/b.py", SESSION_SERVER_UNIT])
    long_first(queue)
    assert list(queue) == [SESSION_SERVER_UNIT, LONG_FIRST[2], "tests/a.py", "tests/b.py"]
    long_first(queue)  # idempotent: called before every assignment
    assert list(queue) == [SESSION_SERVER_UNIT, LONG_FIRST[2], "tests/a.py", "tests/b.py"]
