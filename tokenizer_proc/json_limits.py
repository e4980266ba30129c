"""Bounds on the nesting of JSON that the front end parses or echoes.

orjson parses about 1,000 levels but serializes at most 255, Python's `json` recurses (about 1,000
levels before a RecursionError), and the Responses API echoes parts of the request (`tools`,
`metadata`) inside its response objects. So a request body may nest at most MAX_BODY_DEPTH levels
(a 400 before anything else reads it), well under orjson's 255 with the few levels a response adds
around an echoed part. JSON that the model writes (tool-call arguments) and JSON text inside a request
(an earlier call's `arguments`) is parsed with `loads_bounded`, which refuses the same way instead of
raising RecursionError.
"""

from __future__ import annotations

import json
from typing import Any

from radixrt.json_depth import MAX_JSON_DEPTH, json_depth

MAX_BODY_DEPTH = 192  # > MAX_JSON_DEPTH (a schema's own limit) plus the levels around a tool's schema


def body_depth_error(body: Any, raw: bytes) -> str | None:
    """The 400 message for a request body nested deeper than MAX_BODY_DEPTH, else None. `raw` is the
    body's bytes: with at most MAX_BODY_DEPTH brackets in all (the common case) nothing is walked."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_BODY_DEPTH:
        return None
    depth = json_depth(body)
    if depth > MAX_BODY_DEPTH:
        return f"request body nests {depth} levels deep; at most {MAX_BODY_DEPTH} are supported"
    return None


def loads_bounded(text: str) -> Any:
    """json.loads(text), refusing JSON nested deeper than MAX_JSON_DEPTH.

    Raises:
        ValueError: not JSON, or nested too deeply (instead of the RecursionError json raises near
            1,000 levels, or a value that orjson could not serialize back)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep")
    return value
