"""Prometheus metrics of the front end (GET /metrics), in a private registry (no global state).

Request outcomes and token counts are recorded when a request ends (RequestHandle.on_done); running /
waiting requests and cache figures are read from the scheduler (get_server_info) at scrape time.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

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
        self.ttft = Histogram("radixrt_time_to_first_token_seconds", "Time to first token.",
                              buckets=_LATENCY_BUCKETS_S, registry=r)
        self.itl = Histogram("radixrt_inter_token_latency_seconds", "Time between output tokens.",
                             buckets=_ITL_BUCKETS_S, registry=r)
        self.e2e = Histogram("radixrt_e2e_request_latency_seconds", "Request latency, end to end.",
                             buckets=_LATENCY_BUCKETS_S, registry=r)
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
        """Count one finished request by outcome; latency and token figures for "ok" ones. `handle`
        is None for a request whose client left before it was read (outcome "disconnected")."""
        counter = self._by_outcome.get(outcome)
        if counter is None:
            counter = self._by_outcome[outcome] = self.requests.labels(outcome=outcome)
        counter.inc()
        if outcome != "ok" or handle is None:
            return
        t = handle.timing
        self.e2e.observe(time.perf_counter() - t.start_s)
        if t.first_token_s is not None:
            self.ttft.observe(t.first_token_s - t.start_s)
        for gap in t.itl_s:
            self.itl.observe(gap)
        seen: set[tuple[int, ...]] = set()
        for st in handle.samples.values():
            self.generation_tokens.inc(st.completion_tokens)
            key = tuple(st.spec.input_ids[:64]) + (len(st.spec.input_ids),)
            if key not in seen:  # n > 1: the prompt counts once
                seen.add(key)
                self.prompt_tokens.inc(len(st.spec.input_ids))
                self.cached_tokens.inc(st.cached_tokens)

    async def refresh(self, ctx: ServingContext) -> None:
        """Scheduler gauges from get_server_info (short timeout; a dead scheduler shows as up=0)."""
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
