"""Prometheus metrics of the front end (GET /metrics), in a private registry (no global state).

Request outcomes are counted when a request ends (RequestHandle.on_done). Its latencies and token
counts are taken then too but added to the histograms and counters in batches (`_Finished`, folded
at every scrape and every FOLD_AT requests or FOLD_AT_GAPS gaps): a burst of streams ends in one
scheduler pass, and one locked prometheus_client update per inter-token gap (~4 us each, 63 per
64-token request) was a large share of the front end's work between that pass and the last stream's
end. Running / waiting requests and cache figures are read from the scheduler (get_server_info) at
scrape time.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from .request_state import COLLECTED_UNFINISHED, RequestHandle, unfinished_handles
from .serving_context import ServingContext

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
_SCHEDULER_GAUGES = {
    "num_running_reqs": "Requests decoding or prefilling now.",
    "num_waiting_reqs": "Requests queued in the scheduler.",
    "num_free_pages": "Free KV pages.",
    "num_evictable_pages": "KV pages held only by the radix cache.",
    "num_protected_pages": "KV pages held by running requests.",
    "hit_rate": "Radix cache hit rate (prompt tokens served from the cache).",
    # host KV tier (--enable-hierarchical-cache); absent without it
    "hicache_host_hit_tokens": "Prompt tokens whose KV was loaded back from the host tier.",
    "hicache_host_pages_total": "Pages of the host KV tier.",
    "hicache_host_pages_used": "Host KV tier pages in use.",
    "hicache_load_bytes": "Bytes loaded from the host tier to the device.",
    "hicache_load_s": "Device seconds spent loading from the host tier.",
    "hicache_store_bytes": "Bytes stored from the device to the host tier.",
    "hicache_store_s": "Device seconds spent storing to the host tier.",
}


# finished requests, and their inter-token gaps, held before they are folded in without a scrape
FOLD_AT = 1024
FOLD_AT_GAPS = 65_536


class BatchHistogram:
    """A Prometheus histogram (`<name>_bucket{le}`, `_count`, `_sum`, as prometheus_client's Histogram
    writes them, without `_created`) that takes its observations as an array: one np.searchsorted
    and one bincount per batch instead of a locked update per value. Bucket i counts the values
    <= bounds[i] (Prometheus's `le`); the last bucket is +Inf. Registers itself in `registry`.
    Not thread-safe: the front end updates and scrapes it on its one event loop."""

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = np.asarray(bounds, dtype=np.float64)  # ascending, seconds
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)  # per bucket, not cumulative
        self.sum = 0.0
        registry.register(self)

    def observe_many(self, values: np.ndarray) -> None:
        """Count float64 `values` [n] (any n, 0 too) into their buckets."""
        if values.size:
            self.counts += np.bincount(np.searchsorted(self.bounds, values), minlength=self.counts.size)
            self.sum += float(values.sum())

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self) -> list[HistogramMetricFamily]:
        cum = np.cumsum(self.counts).tolist()
        buckets = [(floatToGoString(b), c) for b, c in zip(self.bounds.tolist(), cum, strict=False)]
        buckets.append(("+Inf", cum[-1]))
        return [HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self.sum)]


class _Finished:
    """What the successful requests since the last fold add to the metrics (columns, one entry per
    request: e2e and TTFT seconds, the inter-token gaps, token counts)."""

    __slots__ = ("e2e_s", "ttft_s", "itl_s", "generated", "prompt", "cached")

    def __init__(self) -> None:
        self.e2e_s: list[float] = []
        self.ttft_s: list[float] = []
        self.itl_s: list[float] = []  # every gap of every request, concatenated
        self.generated = self.prompt = self.cached = 0

    def __len__(self) -> int:
        return len(self.e2e_s)


class Metrics:
    """All front-end metrics. `on_request_done` is the RequestHandle callback; `install` adds /metrics."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("radixrt_requests", "Finished requests by outcome.", ["outcome"], registry=r)
        self._by_outcome: dict[str, Any] = {}  # outcome -> its child of `requests` (labels() costs ~5 us)
        self.prompt_tokens = Counter("radixrt_prompt_tokens", "Prompt tokens of finished requests.",
                                     registry=r)
        self.generation_tokens = Counter("radixrt_generation_tokens", "Generated tokens.", registry=r)
        self.cached_tokens = Counter("radixrt_cached_tokens", "Prompt tokens served from the cache.",
                                     registry=r)
        self.ttft = BatchHistogram("radixrt_time_to_first_token_seconds", "Time to first token.",
                                   _LATENCY_BUCKETS_S, r)
        self.itl = BatchHistogram("radixrt_inter_token_latency_seconds", "Time between output tokens.",
                                  _ITL_BUCKETS_S, r)
        self.e2e = BatchHistogram("radixrt_e2e_request_latency_seconds", "Request latency, end to end.",
                                  _LATENCY_BUCKETS_S, r)
        self._finished = _Finished()  # not yet folded into the histograms and token counters
        self.inflight = Gauge("radixrt_tokenizer_inflight_samples", "Samples the front end is waiting on.",
                              registry=r)
        self.unfinished = Gauge("radixrt_tokenizer_unfinished_handles",
                                "Live requests that have not recorded an outcome yet.", ["kind"], registry=r)
        self.collected_unfinished = Gauge("radixrt_tokenizer_collected_unfinished_handles",
                                          "Requests garbage-collected without an outcome (a bug if > 0).",
                                          ["kind"], registry=r)
        self.sched = {k: Gauge(f"radixrt_{k}", h, registry=r) for k, h in _SCHEDULER_GAUGES.items()}
        self.scheduler_up = Gauge("radixrt_scheduler_up", "1 if the scheduler answered the last scrape.",
                                  registry=r)

    def on_request_done(self, handle: RequestHandle | None, outcome: str) -> None:
        """Count one finished request by outcome; keep latency and token figures of "ok" ones for the
        next fold (`fold`). `handle` is None for a request whose client left before it was read
        (outcome "disconnected")."""
        counter = self._by_outcome.get(outcome)
        if counter is None:
            counter = self._by_outcome[outcome] = self.requests.labels(outcome=outcome)
        counter.inc()
        if outcome != "ok" or handle is None:
            return
        t, f = handle.timing, self._finished
        f.e2e_s.append(time.perf_counter() - t.start_s)
        if t.first_token_s is not None:
            f.ttft_s.append(t.first_token_s - t.start_s)
        f.itl_s += t.itl_s
        samples = handle.samples.values()
        if len(samples) == 1:
            st = next(iter(samples))
            f.generated += st.completion_tokens
            f.prompt += len(st.spec.input_ids)
            f.cached += st.cached_tokens
        else:
            self._add_samples(f, samples)
        if len(f) >= FOLD_AT or len(f.itl_s) >= FOLD_AT_GAPS:
            self.fold()

    @staticmethod
    def _add_samples(f: _Finished, samples: Any) -> None:
        seen: set[tuple[int, ...]] = set()
        for st in samples:
            f.generated += st.completion_tokens
            key = tuple(st.spec.input_ids[:64]) + (len(st.spec.input_ids),)
            if key not in seen:  # n > 1: the prompt counts once
                seen.add(key)
                f.prompt += len(st.spec.input_ids)
                f.cached += st.cached_tokens

    def fold(self) -> None:
        """Add the figures of the requests finished since the last fold to the histograms and counters."""
        f, self._finished = self._finished, _Finished()
        if not len(f):
            return
        self.e2e.observe_many(np.asarray(f.e2e_s, dtype=np.float64))
        self.ttft.observe_many(np.asarray(f.ttft_s, dtype=np.float64))
        self.itl.observe_many(np.asarray(f.itl_s, dtype=np.float64))
        self.generation_tokens.inc(f.generated)
        self.prompt_tokens.inc(f.prompt)
        self.cached_tokens.inc(f.cached)

    async def refresh(self, ctx: ServingContext) -> None:
        """The finished requests folded in (`fold`); scheduler gauges from get_server_info (short
        timeout; a dead scheduler shows as up=0)."""
        self.fold()
        self.inflight.set(ctx.manager.num_inflight)
        for kind, n in unfinished_handles().items():
            self.unfinished.labels(kind=kind).set(n)
        for kind, n in COLLECTED_UNFINISHED.items():
            self.collected_unfinished.labels(kind=kind).set(n)
        try:
            resp = await ctx.manager.control("get_server_info", timeout_s=2.0)
        except TimeoutError:
            self.scheduler_up.set(0)
            return
        self.scheduler_up.set(1 if resp.ok else 0)
        stats: dict[str, Any] = resp.data.get("scheduler", resp.data) if resp.ok else {}
        for key, gauge in self.sched.items():
            value = stats.get(key)
            if isinstance(value, int | float):
                gauge.set(value)

    def install(self, app: FastAPI, ctx: ServingContext) -> None:
        @app.get("/metrics")
        async def _metrics() -> Response:
            await self.refresh(ctx)
            return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
