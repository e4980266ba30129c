"""The worker routes a model gateway reads (tokenizer_proc/gateway_routes.py), on the fake scheduler:
their shapes, the one-token generation of /health_generate, and data_parallel_rank being ignored."""

from __future__ import annotations

import httpx

from .fakes import Front


def test_server_and_model_info(fr: Front) -> None:
    a, b = (httpx.get(fr.base_url + p).json() for p in ("/server_info", "/get_server_info"))
    assert a["served_model_name"] == b["served_model_name"] == fr.served_model and "version" in a
    for path in ("/model_info", "/get_model_info"):
        info = httpx.get(fr.base_url + path).json()
        assert info["served_model_name"] == fr.served_model and info["is_generation"] is True
        assert info["context_length"] == 512
    assert httpx.get(fr.base_url + "/version").status_code == 404  # smg would take us for vLLM


def test_loads_in_both_schemas(fr: Front) -> None:
    loads = httpx.get(fr.base_url + "/v1/loads?include=core,disagg,queues,memory").json()
    assert loads["dp_rank_count"] == 1 and len(loads["loads"]) == 1
    assert loads["loads"][0]["num_running_reqs"] == 0 and loads["loads"][0]["dp_rank"] == 0
    assert httpx.get(fr.base_url + "/get_load").json() == [
        {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]


def test_health_generate_runs_one_token(fr: Front) -> None:
    n = len(fr.sched.received)
    r = httpx.get(fr.base_url + "/health_generate", timeout=30)
    assert r.status_code == 200 and r.json()["completion_tokens"] == 1
    (probe,) = fr.sched.received[n:]
    assert probe.sampling["max_new_tokens"] == 1 and probe.sampling["temperature"] == 0.0


def test_health_generate_is_503_when_the_scheduler_rejects(fr: Front) -> None:
    fr.sched.error = "broken"
    r = httpx.get(fr.base_url + "/health_generate", timeout=30)
    assert r.status_code == 503 and "broken" in r.json()["error"]["message"]


def test_data_parallel_rank_is_ignored(fr: Front) -> None:
    body = {"model": fr.served_model, "messages": [{"role": "user", "content": "Hi"}],
            "data_parallel_rank": 1}
    assert httpx.post(fr.base_url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
    gen = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}, "data_parallel_rank": 1}
    assert httpx.post(fr.base_url + "/generate", json=gen, timeout=30).status_code == 200
