"""What OpenAI chat and completions responses share: the usage object, `created`, a stream's tail."""

from __future__ import annotations

import time
from typing import Any

from .request_state import SampleEvent
from .respond import Collected
from .sse import SSE_DONE, sse


def now_s() -> int:
    """The `created` field: Unix time in whole seconds."""
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's usage object, with `prompt_tokens_details.cached_tokens` (radix-cache hits)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def usage_of(choices: dict[int, Collected] | dict[int, SampleEvent], n: int) -> dict[str, Any]:
    """Usage over all choices: each prompt counted once (from its first choice), outputs summed."""
    prompt = sum(c.prompt_tokens for i, c in choices.items() if i % n == 0)
    cached = sum(c.cached_tokens for i, c in choices.items() if i % n == 0)
    completion = sum(c.completion_tokens for c in choices.values())
    return usage(prompt, completion, cached)


def usage_tail(meta: dict[str, Any], with_usage: bool, last: dict[int, SampleEvent], n: int) -> list[bytes]:
    """A stream's end: `{**meta, "choices": [], "usage": ...}` when usage was asked for, then [DONE].

    `last` is each choice's last event (token counts are cumulative); empty, the usage is all zeros.
    """
    out = []
    if with_usage:
        u = usage_of(last, n) if last else usage(0, 0, 0)
        out.append(sse({**meta, "choices": [], "usage": u}))
    out.append(SSE_DONE)
    return out
