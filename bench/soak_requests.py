"""The request mix of the soak harness (bench/soak.py): shapes, how each client misbehaves, and how
each answer is judged.

Every client is one `Plan`: a route, a JSON body (or raw bytes for malformed ones), whether it
streams, and what the client does: `complete` (read to the end and check the answer), `disconnect`
(close the connection after `after_chunks` SSE lines, 0 = before the first byte, i.e. during
prefill) or `abort` (a non-streamed request cancelled after `after_s` seconds). Abandoned plans use
`ignore_eos` and a generous `max_tokens`, so that they cannot finish before the client leaves: the
server's aborted counter must then equal the number of abandoned clients exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import orjson

MODEL = "SmolLM2-135M-Instruct"
_WORDS = ("radix tree page cache token decode prefill batch stream model kernel request server "
          "memory queue policy sample logits prompt shared prefix evict lock").split()
SYSTEM = "You are a terse assistant. " + " ".join(_WORDS * 6)  # a shared prefix: cache hits
JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
               "required": ["name", "n"], "additionalProperties": False}
STOPS = [".", " the", "\n"]


@dataclass(slots=True)
class Plan:
    """One client of the soak run (see module docstring)."""

    kind: str
    path: str
    body: dict[str, Any] | None = None
    raw: bytes | None = None  # malformed: sent as is instead of body
    stream: bool = False
    action: str = "complete"  # complete | disconnect | abort | malformed
    after_chunks: int = 0
    after_s: float = 0.0
    n: int = 1


@dataclass(slots=True)
class Outcome:
    """What happened to one Plan. `problem` is None when the answer was right."""

    kind: str
    action: str
    status: int | None = None
    problem: str | None = None
    hung: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _text(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(num_words))


def _chat(rng: random.Random, max_tokens: int, **kw: Any) -> dict[str, Any]:
    msgs = [{"role": "system", "content": SYSTEM}] if rng.random() < 0.5 else []
    msgs.append({"role": "user", "content": f"{rng.randrange(10**6)} {_text(rng, 12)}"})
    return {"model": MODEL, "messages": msgs, "max_tokens": max_tokens, "temperature": 0.8,
            "seed": rng.randrange(1 << 30), **kw}


def _completion(rng: random.Random, max_tokens: int, words: int = 16, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": f"{rng.randrange(10**6)} {_text(rng, words)}", "max_tokens": max_tokens,
            "temperature": 0.8, "seed": rng.randrange(1 << 30), **kw}


def good_plan(rng: random.Random, max_tokens: int, long_words: int) -> Plan:
    """A well-formed request that the client reads to the end."""
    kind = rng.choice(["chat", "chat_stream", "completion_n2_logprobs", "stop_stream", "json_schema",
                       "long_prompt", "generate_stream", "chat_logprobs"])
    usage = {"stream_options": {"include_usage": True}}
    if kind == "chat":
        return Plan(kind, "/v1/chat/completions", _chat(rng, max_tokens))
    if kind == "chat_stream":
        return Plan(kind, "/v1/chat/completions", _chat(rng, max_tokens, stream=True, **usage), stream=True)
    if kind == "chat_logprobs":
        return Plan(kind, "/v1/chat/completions", _chat(rng, max_tokens, logprobs=True, top_logprobs=2))
    if kind == "completion_n2_logprobs":
        return Plan(kind, "/v1/completions", _completion(rng, max_tokens, n=2, logprobs=2), n=2)
    if kind == "stop_stream":
        return Plan(kind, "/v1/completions", _completion(rng, 2 * max_tokens, stop=STOPS, stream=True,
                                                          **usage), stream=True)
    if kind == "json_schema":
        fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": JSON_SCHEMA}}
        return Plan(kind, "/v1/chat/completions", _chat(rng, 2 * max_tokens, response_format=fmt))
    if kind == "long_prompt":
        return Plan(kind, "/v1/completions", _completion(rng, max(2, max_tokens // 4), words=long_words))
    body = {"text": f"{rng.randrange(10**6)} {_text(rng, 10)}", "stream": True,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.7}}
    return Plan("generate_stream", "/generate", body, stream=True)


def abandoned_plan(rng: random.Random, long_words: int) -> Plan:
    """A client that leaves: during prefill, mid-stream, or a cancelled non-streamed request."""
    kind = rng.choice(["disconnect_prefill", "disconnect_mid_stream", "abort_non_streamed"])
    hold = {"max_tokens": 256, "ignore_eos": True}  # cannot finish before the client leaves
    if kind == "disconnect_prefill":
        body = _completion(rng, 256, words=long_words, ignore_eos=True, stream=True)
        return Plan(kind, "/v1/completions", body, stream=True, action="disconnect", after_chunks=0,
                    after_s=rng.uniform(0.3, 1.0))
    if kind == "disconnect_mid_stream":
        return Plan(kind, "/v1/chat/completions", _chat(rng, stream=True, **hold), stream=True,
                    action="disconnect", after_chunks=rng.randint(1, 4))
    return Plan(kind, "/v1/chat/completions", _chat(rng, **hold), action="abort",
                after_s=rng.uniform(0.3, 1.0))


def malformed_plan(rng: random.Random) -> Plan:
    """A request the server must reject with a 4xx and an OpenAI error body."""
    cases: list[tuple[str, str, dict[str, Any] | None, bytes | None]] = [
        ("bad_json", "/v1/chat/completions", None, b'{"model": "x", "messages": [,]}'),
        ("not_an_object", "/v1/completions", None, b"[1, 2, 3]"),
        ("wrong_type", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": "5"}, None),
        ("unknown_model", "/v1/chat/completions",
         {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, None),
        ("empty_messages", "/v1/chat/completions", {"model": MODEL, "messages": []}, None),
        ("bad_range", "/v1/completions", {"model": MODEL, "prompt": "hi", "temperature": 9.5}, None),
        ("bad_token_id", "/v1/completions", {"model": MODEL, "prompt": [[1, -4]]}, None),
        ("huge_n", "/v1/completions", {"model": MODEL, "prompt": "hi", "n": 100000}, None),
        ("bad_schema", "/v1/chat/completions",
         {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_schema"}}, None),
        ("generate_both", "/generate", {"text": "a", "input_ids": [1, 2]}, None),
    ]
    kind, path, body, raw = rng.choice(cases)
    return Plan(kind, path, body, raw=raw, action="malformed")


def make_plans(num_requests: int, seed: int, disconnect_frac: float, malformed_frac: float,
               max_tokens: int, long_words: int) -> list[Plan]:
    """The whole run's clients in submission order (deterministic for a seed)."""
    rng = random.Random(seed)
    plans = []
    for _ in range(num_requests):
        u = rng.random()
        if u < disconnect_frac:
            plans.append(abandoned_plan(rng, long_words))
        elif u < disconnect_frac + malformed_frac:
            plans.append(malformed_plan(rng))
        else:
            plans.append(good_plan(rng, max_tokens, long_words))
    return plans


# ----------------------------------------------------------------------------- judging answers
def check_error_body(status: int, data: bytes) -> str | None:
    """An OpenAI error body, or what is wrong with it."""
    try:
        err = orjson.loads(data)["error"]
        ok = isinstance(err["message"], str) and isinstance(err["type"], str)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        ok = False
    return None if ok else f"status {status} without an OpenAI error body: {data[:200]!r}"


def check_usage(usage: Any) -> str | None:
    """Full usage: prompt, completion and total tokens that add up, and cached_tokens."""
    try:
        p, c, t = usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
    except (KeyError, TypeError):
        return f"incomplete usage {usage!r}"
    if not (p > 0 and c >= 1 and t == p + c and 0 <= cached < p):
        return f"usage does not add up: {usage!r}"
    return None


_FINISH = {"stop", "length"}


def check_choices(plan: Plan, choices: list[dict[str, Any]]) -> str | None:
    """Every choice finished with a finish reason that fits the request; stop strings and JSON."""
    if len(choices) != plan.n:
        return f"{len(choices)} choices, expected {plan.n}"
    for ch in choices:
        fr = ch.get("finish_reason")
        if fr not in _FINISH:
            return f"finish_reason {fr!r}"
        text = ch.get("text") if "text" in ch else (ch.get("message") or {}).get("content") or ""
        if plan.kind == "stop_stream" and any(s in text for s in STOPS):
            return f"stop string in the output {text!r}"
        if plan.kind == "json_schema" and fr == "stop":
            try:
                obj = orjson.loads(text)
            except orjson.JSONDecodeError:
                return f"json_schema output is not JSON: {text!r}"
            if not (isinstance(obj, dict) and set(obj) == {"name", "n"}):
                return f"json_schema output does not match: {text!r}"
        if "logprobs" in (plan.body or {}) and not ch.get("logprobs"):
            return "logprobs asked for, none returned"
    return None
