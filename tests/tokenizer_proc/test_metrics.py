"""The front end's batched histograms against prometheus_client's own, and the deferred fold."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from radixrt.tokenizer_proc.metrics import FOLD_AT, BatchHistogram, Metrics
from radixrt.tokenizer_proc.request_state import Timing

BOUNDS = (0.001, 0.01, 0.1, 1.0)


def _samples(text: str, name: str) -> dict[str, float]:
    """`name`'s bucket / count / sum lines of an exposition, by their text before the value."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith(f"{name}_created"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_batch_histogram_matches_prometheus_client() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.exponential(0.05, 500), np.array(BOUNDS), [0.0, 5.0]])  # bounds: le
    ref_reg, reg = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("h_seconds", "doc", buckets=BOUNDS, registry=ref_reg)
    for v in values.tolist():
        ref.observe(v)
    ours = BatchHistogram("h_seconds", "doc", BOUNDS, reg)
    ours.observe_many(values[:100])
    ours.observe_many(np.zeros(0))
    ours.observe_many(values[100:])
    want = _samples(generate_latest(ref_reg).decode(), "h_seconds")
    got = _samples(generate_latest(reg).decode(), "h_seconds")
    assert want.keys() == got.keys() and len(got) == len(BOUNDS) + 3  # buckets with +Inf, count, sum
    for k, v in want.items():
        assert np.isclose(got[k], v), k


def _handle(gaps: list[float], prompt_len: int) -> SimpleNamespace:
    t = Timing()
    t.first_token_s, t.itl_s = t.start_s + 0.02, gaps
    st = SimpleNamespace(completion_tokens=len(gaps) + 1, cached_tokens=3,
                         spec=SimpleNamespace(input_ids=list(range(prompt_len))))
    return SimpleNamespace(timing=t, samples={"r": st})


def test_finished_requests_fold_at_scrape_and_when_many() -> None:
    m = Metrics()
    m.on_request_done(_handle([0.003, 0.004], 10), "ok")
    m.on_request_done(None, "disconnected")
    text = generate_latest(m.registry).decode()
    assert 'radixrt_requests_total{outcome="disconnected"} 1.0' in text  # outcomes counted at once
    assert "radixrt_inter_token_latency_seconds_count 0.0" in text  # figures wait for the fold
    m.fold()
    text = generate_latest(m.registry).decode()
    assert "radixrt_inter_token_latency_seconds_count 2.0" in text
    assert "radixrt_time_to_first_token_seconds_count 1.0" in text
    assert "radixrt_generation_tokens_total 3.0" in text and "radixrt_prompt_tokens_total 10.0" in text
    for _ in range(FOLD_AT):
        m.on_request_done(_handle([0.003], 1), "ok")
    text = generate_latest(m.registry).decode()  # folded without a scrape's refresh
    assert f"radixrt_e2e_request_latency_seconds_count {FOLD_AT + 1}.0" in text
