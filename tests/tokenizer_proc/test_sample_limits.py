"""How many samples (prompts x n) one request may have: more than --max-running-requests +
--max-queued-requests can never be in flight at once and get a 400 (not a 429 that no retry gets past;
break-it pass 3: 4,100 samples on an idle server). Until 2026-12-05 the bound was --max-queued-requests
alone, because the scheduler counted every waiting request as queued, even those the running set was
about to take (a burst of 8 on a 4 + 4 server got two 429s; break-it, 2026-12-05)."""

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


def test_more_samples_than_running_plus_queued_is_a_400_naming_n(small_queue: Front) -> None:
    fr = small_queue
    body = {"model": fr.served_model, "prompt": [[5]] * 21, "max_tokens": 1}
    r = httpx.post(fr.base_url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "n" and "at most 20" in err["message"]
    assert "--max-queued-requests" in err["message"]
    body["prompt"], body["n"] = [[5]], 21
    assert httpx.post(fr.base_url + "/v1/completions", json=body, timeout=30).status_code == 400


def test_as_many_samples_as_running_plus_queued_are_served(small_queue: Front) -> None:
    fr = small_queue
    n_before = len(fr.sched.received)
    body = {"model": fr.served_model, "prompt": [[5]] * 5, "n": 4, "max_tokens": 1}
    r = httpx.post(fr.base_url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 20 and len(fr.sched.received) - n_before == 20
