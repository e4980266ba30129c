"""The routes a model gateway asks of a worker (SGLang's worker API, as smg 1.13.0 calls it).

What smg does when a worker is registered (`POST /workers`), observed against 1.13.0: `GET /health`
(no key), `/v1/models` (id, root, max_model_len, owned_by), `/version` (a 200 here would make it a
vLLM worker: radixrt leaves it 404), `/server_info` (200 => an SGLang worker; 404 => `/get_server_info`),
`/model_info` (404 => `/get_model_info`); then, every `--load-monitor-interval`, `/v1/loads` (the
canonical load schema; a 404 there makes it fall back to `/metrics` gauges). `/health_generate`,
`/flush_cache` and `/get_load` are what SGLang's router and operators call directly. Everything here
but /health sits behind the server's API key (server.ApiKeyMiddleware); no route returns a secret.

`data_parallel_rank`, which a DP-aware gateway adds to request bodies, is an unknown field and so
ignored by every request model (openai_protocol: unknown fields are accepted and dropped).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from radixrt.sampling_params import SamplingParams

from .errors import APIError
from .http_io import json_response
from .request_state import RequestHandle
from .serving_context import ServingContext
from .submission import make_specs, tokenize

Control = Callable[[ServingContext, str], Awaitable[dict[str, Any]]]
HEALTH_GENERATE_TIMEOUT_S = 60.0  # a CPU worker in the middle of a long prefill answers late
_PROBE_TEXT = "ping"


def scheduler_load(ctx: ServingContext, data: dict[str, Any]) -> dict[str, Any]:
    """One data-parallel rank's load from the scheduler's get_server_info data, in smg's
    `SchedulerLoadSnapshot` terms (counts of requests; tokens; ratios in [0, 1]).

    `num_used_tokens` counts the slots of pages held by running requests (protected pages): pages
    held only by the radix cache are evictable, hence free for admission, as in SGLang's token usage.
    `gen_throughput` is not measured here (0.0: smg falls back to its default throughput).
    """
    sched, worker = data.get("scheduler", {}), data.get("worker", {})
    page_size = int(worker.get("page_size") or ctx.args.page_size)
    total_tokens = int(sched.get("num_total_pages", 0)) * page_size
    used_tokens = int(sched.get("num_protected_pages", 0)) * page_size
    running, waiting = int(sched.get("num_running_reqs", 0)), int(sched.get("num_waiting_reqs", 0))
    return {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
            "num_total_reqs": running + waiting, "num_used_tokens": used_tokens,
            "max_total_num_tokens": total_tokens,
            "token_usage": used_tokens / total_tokens if total_tokens else 0.0,
            "gen_throughput": 0.0, "cache_hit_rate": float(sched.get("hit_rate") or 0.0),
            "utilization": running / max(ctx.args.max_running_requests, 1),
            "max_running_requests": ctx.args.max_running_requests}


def model_info(ctx: ServingContext, worker: dict[str, Any]) -> dict[str, Any]:
    """SGLang's /model_info: the served model as a gateway's metadata labels (no paths to secrets:
    the model path is the one given on the command line, or the served name)."""
    return {"model_path": ctx.args.model_path or ctx.served_model, "tokenizer_path": ctx.args.model_path,
            "served_model_name": ctx.served_model, "is_generation": True,
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": worker.get("model_type"), "context_length": ctx.context_length}


async def health_generate(ctx: ServingContext) -> dict[str, Any]:
    """Generate one greedy token through the whole path (tokenize, scheduler, worker, detokenize).

    Not counted in /metrics (no on_done). Raises APIError 503 when shutting down, when the token does
    not come within HEALTH_GENERATE_TIMEOUT_S, or when the scheduler rejects the probe.
    """
    if ctx.manager.closing:
        raise APIError(503, "server is shutting down")
    sampling = SamplingParams(temperature=0.0, max_new_tokens=1).to_dict()
    specs = make_specs([await tokenize(ctx, _PROBE_TEXT)], 1, sampling, [], True)
    handle = RequestHandle(ctx.manager, ctx.tokenizer, specs, stream=False)

    async def run() -> dict[str, Any]:
        num_tokens, reason = 0, None
        async with handle:
            async for ev in handle.events():
                num_tokens, reason = ev.completion_tokens, ev.finish_reason or reason
        return {"completion_tokens": num_tokens, "finish_reason": reason}

    try:
        return await asyncio.wait_for(run(), HEALTH_GENERATE_TIMEOUT_S)
    except TimeoutError:
        raise APIError(503, f"no token generated within {HEALTH_GENERATE_TIMEOUT_S:.0f} s") from None
    except APIError as e:
        raise APIError(503, f"health generation failed: {e.message}") from None


def add_gateway_routes(app: FastAPI, ctx: ServingContext, control: Control) -> None:
    """/health_generate, /model_info (+ /get_model_info), /v1/loads, /get_load on `app`.

    `control(ctx, kind)` asks the scheduler (server._control: 503 when it does not answer)."""

    @app.get("/health_generate")
    async def _health_generate() -> Response:
        return json_response({"ok": True, **await health_generate(ctx)})

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def _model_info() -> Response:
        data = await control(ctx, "get_server_info")
        return json_response(model_info(ctx, data.get("worker", {})))

    @app.get("/v1/loads")
    async def _loads(request: Request) -> Response:
        load = scheduler_load(ctx, await control(ctx, "get_server_info"))
        now = datetime.datetime.now(datetime.timezone.utc).isoformat()
        return json_response({"timestamp": now, "dp_rank_count": 1, "loads": [load]})

    @app.get("/get_load")
    async def _get_load() -> Response:
        load = scheduler_load(ctx, await control(ctx, "get_server_info"))
        return json_response([{"dp_rank": 0, "num_reqs": load["num_total_reqs"],
                               "num_waiting_reqs": load["num_waiting_reqs"],
                               "num_tokens": load["num_used_tokens"]}])
