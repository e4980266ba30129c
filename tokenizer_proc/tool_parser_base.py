"""The tool-call parser contract: result types, the streaming interface, and the pieces every format shares.

A format is one incremental state machine (a `ToolCallStream`). Streaming feeds it text deltas; the
full-text `ToolParser.parse` feeds the whole text as one delta through the same machine, so both paths
reach identical content and calls by construction wherever the machine does not depend on where the
text was split (tests check every split point). A call counts from the moment its format's header
(e.g. hermes' `{"name": ..., "arguments": `) is read, in both paths: a stream has sent that call's
first deltas by then and cannot take them back, so `parse` keeps it too, with the arguments as written
even when they never closed (output cut by max_tokens: finish_reason "length") or are not a JSON
object. That is OpenAI's contract as well (arguments may be incomplete or invalid JSON; the client
validates them).

Machines never raise on model output: text that does not read as a call is content.
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar


def new_call_id() -> str:
    """A fresh OpenAI-style tool call id: "call_" + 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(slots=True)
class ToolCall:
    """One complete call. `arguments` is JSON text, verbatim from the model when it wrote an object."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The `message.tool_calls[i]` item of a chat completion."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of call number `index` (0-based within the choice). `id` and `name` are set on the first
    delta of each call only; `arguments` is the next fragment of the JSON text (may be "")."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The `delta.tool_calls[i]` item of a chat completion chunk."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class ParsedOutput:
    """A whole completion split into content text ("" when none) and calls."""

    content: str
    tool_calls: list[ToolCall]


@dataclass(slots=True)
class StreamDelta:
    """What one fed text delta released: content text and call deltas. When one delta holds text on
    both sides of a call, all of its content is in `content` (a chat chunk sends it first: it is mostly
    the text before the call; clients read the two apart anyway); `pieces` keeps the same text and
    call deltas in output order (adjacent text joined), for protocols whose items are ordered
    (Responses, Messages). `pieces` does not take part in equality."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    pieces: list[str | ToolCallDelta] = field(default_factory=list, compare=False)


@dataclass(slots=True)
class CallRecord:
    """A call as a machine recognised it (owned by its Emitter; ParsedOutput copies what is valid)."""

    index: int
    id: str
    name: str
    arguments: str = ""


class Emitter:
    """Collects what a machine recognised: the ordered segments (content strings and calls) for `parse`,
    and the not-yet-taken StreamDelta for streaming. Owned by one machine."""

    def __init__(self, new_id: Callable[[], str]) -> None:
        self.segments: list[str | CallRecord] = []
        self._new_id = new_id
        self._num_calls = 0
        self._delta = StreamDelta()

    def text(self, s: str) -> None:
        if s:
            self.segments.append(s)
            self._delta.content += s
            pieces = self._delta.pieces
            if pieces and isinstance(pieces[-1], str):
                pieces[-1] += s
            else:
                pieces.append(s)

    def start_call(self, name: str) -> CallRecord:
        rec = CallRecord(self._num_calls, self._new_id(), name)
        self._num_calls += 1
        self.segments.append(rec)
        self._call_delta(ToolCallDelta(rec.index, "", rec.id, name))
        return rec

    def arguments(self, rec: CallRecord, s: str) -> None:
        if not s:
            return
        rec.arguments += s
        last = self._delta.pieces[-1] if self._delta.pieces else None
        if isinstance(last, ToolCallDelta) and last.index == rec.index:
            last.arguments += s
        else:
            self._call_delta(ToolCallDelta(rec.index, s))

    def _call_delta(self, d: ToolCallDelta) -> None:
        self._delta.tool_calls.append(d)
        self._delta.pieces.append(d)

    def whole_call(self, name: str, arguments: str) -> None:
        self.arguments(self.start_call(name), arguments)

    def take(self) -> StreamDelta:
        d, self._delta = self._delta, StreamDelta()
        return d


class ToolCallStream:
    """One choice's incremental parser. Feed text deltas in order, then call finish() once.

    A format is a state machine: `state` names the method `_<state>(final) -> bool` that consumes
    `buf` (emitting into `out`); it returns True when it changed state and the next one should run,
    False when it needs more text (or, with final, is done).
    Raises: nothing on any text (malformed calls become content).
    """

    def __init__(self, new_id: Callable[[], str], state: str) -> None:
        self.out = Emitter(new_id)
        self.buf = ""
        self.state = state

    def feed(self, delta: str) -> StreamDelta:
        """Add the next piece of generated text; returns what can be released now."""
        self.buf += delta
        self._run(final=False)
        return self.out.take()

    def finish(self) -> StreamDelta:
        """The text is complete: release everything still held back."""
        self._run(final=True)
        return self.out.take()

    def _decided_lead(self, tag: str, final: bool) -> str | None:
        """The buffer without leading whitespace, or None while it may still become `tag` (and more
        text is coming)."""
        s = self.buf.lstrip()
        return None if may_become(s, tag) and not final else s

    def _run(self, final: bool) -> None:
        """Consume self.buf as far as possible, emitting into self.out; keep what is undecided."""
        while getattr(self, "_" + self.state)(final):
            pass


class ToolParser(ABC):
    """A tool-call output format. `new_id` makes call ids (tests pass a deterministic one)."""

    name: ClassVar[str]

    def __init__(self, new_id: Callable[[], str] = new_call_id) -> None:
        self.new_id = new_id

    @abstractmethod
    def stream(self) -> ToolCallStream:
        """A fresh incremental parser for one choice."""

    def parse(self, text: str) -> ParsedOutput:
        """The whole output -> content and calls: what a stream of the same text sends, joined (see the
        module docstring: a call's arguments may be cut short or not be a JSON object)."""
        s = self.stream()
        s.feed(text)
        s.finish()
        content = [seg for seg in s.out.segments if isinstance(seg, str)]
        calls = [ToolCall(seg.id, seg.name, seg.arguments) for seg in s.out.segments
                 if isinstance(seg, CallRecord)]
        return ParsedOutput("".join(content), calls)


def call_from_json(obj: Any) -> tuple[str, str] | None:
    """{"name": str, "arguments"|"parameters": object or JSON text} -> (name, arguments text), else None.

    A missing arguments key means no arguments ("{}")."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, dict):
        return obj["name"], json.dumps(args, ensure_ascii=False)
    if isinstance(args, str):
        return obj["name"], args
    return None


# `{"name": "<name>", "arguments": ` (or "parameters"): a call whose arguments can stream.
CALL_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def header_name(raw: str) -> str | None:
    """The JSON string body captured by CALL_HEADER, decoded; None when its escapes are invalid."""
    try:
        return json.loads(f'"{raw}"')
    except ValueError:
        return None


def may_become(text: str, tag: str) -> bool:
    """`text` is empty or a proper prefix of `tag`: more text may still complete the tag."""
    return not text or (tag.startswith(text) and text != tag)


def held_prefix_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (it may become the tag)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class JsonValueScan:
    """Finds the end of one JSON object or array from its first character, fed in pieces.

    Tracks only string/escape state and bracket depth: it does not validate the JSON (parse does)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.done = False

    def feed(self, s: str) -> int:
        """Consume characters of s; returns how many, stopping just after the closing bracket."""
        for i, c in enumerate(s):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    self.done = True
                    return i + 1
        return len(s)


def json_value_end(text: str, start: int) -> int | None:
    """End index (exclusive) of the object/array starting at text[start], or None if it does not close."""
    scan = JsonValueScan()
    n = scan.feed(text[start:])
    return start + n if scan.done else None


class _CallsOnlyStream(ToolCallStream):
    """A format's stream with its content dropped (CallsOnly)."""

    def __init__(self, inner: ToolCallStream) -> None:  # wraps a machine, runs none of its own
        self.inner = inner
        self.out = inner.out

    @staticmethod
    def _calls(d: StreamDelta) -> StreamDelta:
        return StreamDelta("", d.tool_calls, [p for p in d.pieces if not isinstance(p, str)])

    def feed(self, delta: str) -> StreamDelta:
        return self._calls(self.inner.feed(delta))

    def finish(self) -> StreamDelta:
        return self._calls(self.inner.finish())


class CallsOnly(ToolParser):
    """A format's parser for output sampled under a grammar that forces calls (tool_choice "required"
    or a named function; tool_grammar.py): the grammar admits nothing but calls and their
    separators, so what the format reads as content is the markup of a call that max_tokens cut
    before its header was complete (e.g. `<tool_call>\n{"name`) or a separator. It is dropped, in
    streams and whole outputs alike: the message has no content, as OpenAI's does for a forced call.
    Calls are the inner format's, unchanged."""

    def __init__(self, inner: ToolParser) -> None:
        super().__init__(inner.new_id)
        self.inner = inner
        self.name = inner.name

    def stream(self) -> ToolCallStream:
        return _CallsOnlyStream(self.inner.stream())

    def parse(self, text: str) -> ParsedOutput:
        return ParsedOutput("", self.inner.parse(text).tool_calls)
