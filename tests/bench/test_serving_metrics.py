"""Serving metrics on synthetic timings: percentiles, TPOT/ITL, throughputs, token-count checks."""

from __future__ import annotations

import numpy as np
import pytest

from bench.serving import (
    RUN_FIELDS,
    STAT_FIELDS,
    BenchConfig,
    RequestOutcome,
    _apply_event,
    _arrival_offsets_s,
    latency_stats_ms,
    summarize,
)


def _outcome(ttft_s: float, itl_s: list[float], *, usage_out: int | None = None, prompt_len: int = 10,
             cached: int | None = 0, output_len: int | None = None,
             error: str | None = None) -> RequestOutcome:
    n_stream = len(itl_s) + 1
    o = RequestOutcome(session_id=0, turn=0, prompt_len=prompt_len, output_len=output_len or n_stream)
    if error:
        o.error = error
        return o
    o.ttft_s, o.itl_s, o.stream_tokens = ttft_s, list(itl_s), n_stream
    o.e2e_s = ttft_s + sum(itl_s)
    o.usage_prompt_tokens = prompt_len
    o.usage_completion_tokens = n_stream if usage_out is None else usage_out
    o.cached_tokens = cached
    return o


def test_latency_stats_percentiles_in_ms() -> None:
    s = latency_stats_ms([x / 1000.0 for x in range(1, 101)])  # 1..100 ms
    assert s["count"] == 100 and s["min"] == pytest.approx(1.0) and s["max"] == pytest.approx(100.0)
    assert s["mean"] == pytest.approx(50.5) and s["median"] == pytest.approx(50.5)
    assert s["p90"] == pytest.approx(90.1) and s["p99"] == pytest.approx(99.01)
    empty = latency_stats_ms([])
    assert set(empty) == set(STAT_FIELDS) and empty["mean"] is None and empty["count"] == 0


def test_summarize_tpot_itl_throughput_and_cache_rate() -> None:
    a = _outcome(0.100, [0.010, 0.020, 0.030], prompt_len=100, cached=50)  # 4 tokens, e2e 160 ms
    b = _outcome(0.200, [0.040], prompt_len=300, cached=0)  # 2 tokens, e2e 240 ms
    m = summarize([a, b], duration_s=2.0)
    assert set(RUN_FIELDS) - {"max_concurrency", "request_rate", "workload_seed"} <= set(m)
    assert m["completed"] == 2 and m["failed"] == 0 and m["errors"] == []
    assert m["total_input_tokens"] == 400 and m["total_output_tokens"] == 6
    assert m["request_throughput"] == pytest.approx(1.0)
    assert m["input_throughput"] == pytest.approx(200.0) and m["output_throughput"] == pytest.approx(3.0)
    assert m["cache_hit_rate"] == pytest.approx(50 / 400)
    assert m["ttft_ms"]["mean"] == pytest.approx(150.0)
    # TPOT = (e2e - ttft) / (n - 1): a: 60/3 = 20 ms, b: 40/1 = 40 ms
    assert m["tpot_ms"]["mean"] == pytest.approx(30.0)
    assert m["itl_ms"]["count"] == 4 and m["itl_ms"]["max"] == pytest.approx(40.0)
    assert m["e2e_ms"]["median"] == pytest.approx(200.0)
    assert m["mean_concurrency"] == pytest.approx(0.4 / 2.0)
    assert m["token_counts_consistent"] and m["token_count_mismatches"] == 0


def test_summarize_flags_count_mismatch_short_outputs_and_errors() -> None:
    good = _outcome(0.1, [0.01], output_len=2)
    short = _outcome(0.1, [0.01], usage_out=3, output_len=5)  # stream saw 2, usage says 3, asked 5
    failed = [_outcome(0.0, [], error=f"HTTP 500: boom {i}") for i in range(7)]
    m = summarize([good, short, *failed], duration_s=1.0)
    assert m["completed"] == 2 and m["failed"] == 7
    assert m["errors"][0] == "HTTP 500: boom 0" and len(m["errors"]) == 5
    assert m["token_count_mismatches"] == 1 and not m["token_counts_consistent"]
    assert m["output_len_mismatches"] == 1
    assert m["total_output_tokens_stream"] == 4 and m["total_output_tokens_usage"] == 5
    assert m["total_output_tokens"] == 5  # usage wins when present


def test_summarize_without_usage_counts_the_stream() -> None:
    o = _outcome(0.1, [0.01, 0.01])
    o.usage_completion_tokens = o.usage_prompt_tokens = o.cached_tokens = None
    m = summarize([o], duration_s=1.0)
    assert m["total_output_tokens"] == 3 and m["total_output_tokens_usage"] is None
    assert m["usage_missing"] == 1 and not m["token_counts_consistent"]
    assert m["cache_hit_rate"] is None


def test_apply_event_counts_token_ids_logprobs_and_text() -> None:
    o = RequestOutcome(0, 0, prompt_len=5, output_len=6, start_s=10.0)
    last = [0.0]
    _apply_event(o, {"choices": [{"text": "ab", "token_ids": [7, 8]}], "usage": None}, 10.5, last)
    _apply_event(o, {"choices": [{"text": "", "token_ids": [9]}]}, 10.6, last)  # held-back text
    _apply_event(o, {"choices": [{"text": "x", "logprobs": {"tokens": ["x", "y"]}}]}, 10.8, last)
    _apply_event(o, {"choices": [{"text": "z"}]}, 10.9, last)
    _apply_event(o, {"choices": [{"text": "", "finish_reason": "length"}]}, 11.0, last)  # no output
    _apply_event(o, {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6,
                                              "prompt_tokens_details": {"cached_tokens": 4}}}, 11.1, last)
    assert o.stream_tokens == 6 and o.answer_ids == [7, 8, 9]
    assert o.ttft_s == pytest.approx(0.5)
    assert o.itl_s == pytest.approx([0.1, 0.2, 0.1])
    assert (o.usage_prompt_tokens, o.usage_completion_tokens, o.cached_tokens) == (5, 6, 4)
    _apply_event(o, {"error": {"message": "overloaded", "code": 503}}, 11.2, last)
    assert o.error == "overloaded"


def test_poisson_arrivals_are_seeded_and_have_the_right_rate() -> None:
    a = _arrival_offsets_s(4000, 50.0, seed=1)
    assert a == _arrival_offsets_s(4000, 50.0, seed=1) and a != _arrival_offsets_s(4000, 50.0, seed=2)
    assert a[0] == 0.0 and all(np.diff(a) >= 0)
    assert np.mean(np.diff(a)) == pytest.approx(1 / 50.0, rel=0.05)
    assert _arrival_offsets_s(3, float("inf"), seed=0) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("bad", [dict(request_rate=0.0), dict(max_concurrency=0),
                                 dict(concurrency_sweep=[4, 0])])
def test_config_rejects_bad_values(bad: dict) -> None:
    with pytest.raises(ValueError):
        BenchConfig(**bad)
