"""GET /openapi.json: the routes' OpenAPI document, with the request bodies the handlers validate.

The handlers read their bodies themselves (http_io.read_json, then a pydantic model in strict mode),
so FastAPI's generated document has no request schemas. `install_openapi` adds them from
REQUEST_MODELS (route path -> pydantic model), so that clients and fuzzers (schemathesis, see
tests/reliability/test_fuzz_openapi.py) see what each route accepts. Like every route but /health,
the document sits behind --api-key.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .openai_protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest

# route path -> the model its POST body is validated with (routes added later may register theirs)
REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/generate": GenerateRequest,
}
_REF = "#/components/schemas/{model}"


def build_openapi(app: FastAPI, models: dict[str, type[BaseModel]]) -> dict[str, Any]:
    """FastAPI's document for `app` with a JSON requestBody on each POST route named in `models`."""
    doc = get_openapi(title=app.title, version="1", routes=app.routes)
    refs, defs = models_json_schema([(m, "validation") for m in models.values()], ref_template=_REF)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(defs.get("$defs", {}))
    for path, model in models.items():
        op = doc.get("paths", {}).get(path, {}).get("post")
        if op is not None:
            op["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": refs[(model, "validation")]}}}
    return doc


def install_openapi(app: FastAPI) -> None:
    """Serve build_openapi(app, REQUEST_MODELS) at /openapi.json (built once, at the first request)."""
    cache: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if "doc" not in cache:
            cache["doc"] = build_openapi(app, REQUEST_MODELS)
        return cache["doc"]

    app.openapi = openapi  # type: ignore[method-assign]
