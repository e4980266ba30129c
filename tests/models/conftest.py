"""Model-test fixtures (shared with tests/worker)."""

from __future__ import annotations

from tests.worker.conftest import one_thread  # noqa: F401
