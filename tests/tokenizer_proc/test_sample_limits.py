"""How many samples (prompts x n) one request may have: a request's samples all wait in the
scheduler's queue first, so more than --max-queued-requests can never be admitted and get a 400 (not a
429 that no retry gets past; break-it pass 3: 4,100 samples on an idle server with the default 4,096
queue slots)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import Scripts
from .fakes import Front, start_front


@pytest.fixture(scope="module")
def small_queue(tokenizer: Any, tok_model_dir: Path, front_scripts: Scripts) -> Iterator[Front]:
    f = start_front(tokenizer, tok_model_dir, front_scripts, context_length=512, max_running_requests=16,
                    max_queued_requests=4)
    yield f
    f.stop()


def test_more_samples_than_queue_slots_is_a_400_naming_n(small_queue: Front) -> None:
    fr = small_queue
    body = {"model": fr.served_model, "prompt": [[5]] * 5, "max_tokens": 1}
    r = httpx.post(fr.base_url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "n" and "at most 4" in err["message"] and "--max-queued-requests" in err["message"]
    body["prompt"], body["n"] = [[5]], 5
    assert httpx.post(fr.base_url + "/v1/completions", json=body, timeout=30).status_code == 400


def test_as_many_samples_as_queue_slots_are_served(small_queue: Front) -> None:
    fr = small_queue
    n_before = len(fr.sched.received)
    body = {"model": fr.served_model, "prompt": [[5]] * 2, "n": 2, "max_tokens": 1}
    r = httpx.post(fr.base_url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 4 and len(fr.sched.received) - n_before == 4
