"""The tool-call output formats: hermes (`<tool_call>` JSON `</tool_call>`), llama3 JSON, pythonic.

Each is a `ToolCallStream` state machine over its buffer (see tool_parser_base for the contract).
Whitespace rule shared by all (`_Content`): whitespace between content and a call, and between calls,
is dropped; text after the last call is content, its leading whitespace dropped unless content came
before the call (then it is the gap between the two texts, kept). llama3_json's separators and a
hermes call without its closing tag take the whitespace after a call themselves, so there the gap
is dropped.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from .json_limits import loads_bounded
from .tool_parser_base import (
    CALL_HEADER,
    CallRecord,
    JsonValueScan,
    ToolCallStream,
    ToolParser,
    call_from_json,
    header_name,
    held_prefix_len,
    json_value_end,
    may_become,
)


class _Content:
    """Content emission with the whitespace rule: trailing whitespace is held until it is known whether
    a call follows (then dropped: layout, not content); leading whitespace right after a call is
    dropped, unless content came before the call, where it is the gap between two pieces of text
    (kept as the model wrote it, so that "Let me check. <call> Then ..." reads "Let me check. Then
    ...", not "check.Then", in chat's one content string)."""

    def __init__(self, stream: ToolCallStream) -> None:
        self.stream = stream
        self.after_call = False
        self.held_ws = ""
        self.had_text = False

    def emit(self, s: str, *, hold_tail: bool) -> None:
        """Emit s as content; with hold_tail its trailing whitespace waits for the next emit/drop."""
        s = self.held_ws + s
        self.held_ws = ""
        if self.after_call:
            body = s.lstrip()
            if not body:
                if self.had_text:  # a gap, if more text follows; dropped at the end or at a call
                    self.held_ws = s
                return
            s, self.after_call = (s if self.had_text else body), False
        if hold_tail:
            body = s.rstrip()
            self.held_ws = s[len(body):]
            s = body
        if s:
            self.had_text = True
        self.stream.out.text(s)

    def call_started(self) -> None:
        self.held_ws = ""

    def call_ended(self) -> None:
        self.after_call = True


class _JsonCallStream(ToolCallStream):
    """Shared states of the JSON formats: content up to a tag, arguments streamed as they arrive,
    and a whole JSON call decided at once. `TAG` opens calls; `after_tag` is the state it leads to."""

    TAG = ""
    after_tag = ""

    def __init__(self, parser: ToolParser, state: str) -> None:
        super().__init__(parser.new_id, state)
        self.content = _Content(self)
        self.call: CallRecord | None = None
        self.scan = JsonValueScan()

    def _text(self, final: bool) -> bool:
        i = self.buf.find(self.TAG)
        if i >= 0:
            self.content.emit(self.buf[:i], hold_tail=True)
            self.buf, self.state = self.buf[i + len(self.TAG):], self.after_tag
            return True
        keep = len(self.buf) if final else len(self.buf) - held_prefix_len(self.buf, self.TAG)
        self.content.emit(self.buf[:keep], hold_tail=not final)
        self.buf = self.buf[keep:]
        return False

    def _streamed_call(self, header: re.Match[str]) -> bool:
        """Start a call whose header matched, if its arguments open an object; True if started."""
        name = header_name(header.group(1))
        if self.buf[header.end()] != "{" or name is None:
            return False
        self.content.call_started()
        self.call = self.out.start_call(name)
        self.buf, self.state, self.scan = self.buf[header.end():], "args", JsonValueScan()
        return True

    def _whole_call(self, body: str, source: str) -> bool:
        """A call given as one JSON text: emit it, or its source as content; True if it was a call."""
        try:
            call = call_from_json(loads_bounded(body))
        except ValueError:  # not JSON, or nested too deeply: the text stays content
            call = None
        if call is None:
            self.content.emit(source, hold_tail=True)
            return False
        self.content.call_started()
        self.out.whole_call(call[0], call[1])
        self.content.call_ended()
        return True

    def _args(self, final: bool) -> bool:
        assert self.call is not None
        n = self.scan.feed(self.buf)
        self.out.arguments(self.call, self.buf[:n])
        self.buf = self.buf[n:]
        if not self.scan.done:
            return False
        self.state = "tail"
        return True

    def _end_call(self, taken: int, state: str) -> bool:
        assert self.call is not None
        self.buf, self.state = self.buf[taken:], state
        self.content.call_ended()
        return True


class _HermesStream(_JsonCallStream):
    TAG, END = "<tool_call>", "</tool_call>"
    after_tag = "header"

    def __init__(self, parser: ToolParser) -> None:
        super().__init__(parser, "text")


    def _header(self, final: bool) -> bool:
        m = CALL_HEADER.match(self.buf)
        if m and m.end() < len(self.buf):
            if not self._streamed_call(m):
                self.state = "block"  # arguments as a JSON string, or not a call: decide on the block
            return True
        if self.END in self.buf or final:
            self.state = "block"
            return True
        return False

    def _block(self, final: bool) -> bool:
        j = self.buf.find(self.END)
        if j < 0 and not final:
            return False
        end = j + len(self.END) if j >= 0 else len(self.buf)
        body, source = self.buf[:j if j >= 0 else len(self.buf)], self.TAG + self.buf[:end]
        self.buf, self.state = self.buf[end:], "text"
        self._whole_call(body, source)
        return True

    def _tail(self, final: bool) -> bool:
        m = re.match(r"\s*\}?\s*", self.buf)
        assert m is not None
        rest = self.buf[m.end():]
        if not final and may_become(rest, self.END):
            return False  # the end tag may still come
        return self._end_call(m.end() + (len(self.END) if rest.startswith(self.END) else 0), "text")


class HermesParser(ToolParser):
    """`<tool_call>{"name": ..., "arguments": ...}</tool_call>` (Hermes 2 Pro, Qwen 2.5/3); text may
    precede and follow calls. The default tool prompt asks for this format."""

    name = "hermes"

    def stream(self) -> ToolCallStream:
        return _HermesStream(self)


class _Llama3Stream(_JsonCallStream):
    """Calls are a run of JSON objects at the start of the output (after optional `<|python_tag|>`), or
    after a `<|python_tag|>` that follows content; separated by whitespace, ';' or ','."""

    TAG = "<|python_tag|>"
    after_tag = "sep"

    def __init__(self, parser: ToolParser) -> None:
        super().__init__(parser, "lead")


    def _lead(self, final: bool) -> bool:
        s = self._decided_lead(self.TAG, final)
        if s is None:
            return False
        if s.startswith(("{", self.TAG)):
            self.buf, self.state = s.removeprefix(self.TAG), "sep"
        else:
            self.state = "text"
        return True

    def _sep(self, final: bool) -> bool:
        s = self.buf.lstrip(" \t\r\n;,")
        if not s:
            self.buf = ""
            return False
        self.buf, self.state = s, ("object" if s[0] == "{" else "text")
        return True

    def _object(self, final: bool) -> bool:
        m = CALL_HEADER.match(self.buf)
        if m and m.end() < len(self.buf) and self._streamed_call(m):
            return True
        if m and m.end() >= len(self.buf) and not final:
            return False  # the arguments value has not started yet
        end = json_value_end(self.buf, 0)
        if end is None and not final:
            return False
        source, self.buf = self.buf[:end or len(self.buf)], self.buf[end or len(self.buf):]
        self.state = "sep" if self._whole_call(source, source) else "text"
        return True

    def _tail(self, final: bool) -> bool:
        m = re.match(r"\s*\}", self.buf)
        if m is None and not final and not self.buf.strip():
            return False  # the object's closing brace may still come
        return self._end_call(m.end() if m else 0, "sep")


class Llama3JsonParser(ToolParser):
    """Llama 3.1/3.2 JSON calls: `{"name": ..., "parameters": ...}`, optionally after `<|python_tag|>`
    (a special token: decode with skip_special_tokens=False to see it; without it, calls must open
    the output)."""

    name = "llama3_json"

    def stream(self) -> ToolCallStream:
        return _Llama3Stream(self)


def _py_list_end(text: str, start: int) -> int | None:
    """End (exclusive) of the Python list opening at text[start], skipping quoted strings; None if open."""
    depth, quote, i = 0, "", start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "[({":
            depth += 1
        elif c in "])}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


_JSON_NAMES = {"true": True, "false": False, "null": None}


def _py_value(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_py_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_py_value(k): _py_value(v) for k, v in zip(node.keys, node.values, strict=True)
                if k is not None}
    return ast.literal_eval(node)


def parse_pythonic(src: str) -> list[tuple[str, str]] | None:
    """`[f(a=1), g(b="x")]` -> [(name, arguments JSON text)]; None unless it is a list of keyword calls
    whose values are literals that JSON can hold (a non-finite float such as `1e999` or `float("nan")`
    is not: json.dumps would write `Infinity`, which is not JSON)."""
    try:
        tree = ast.parse(src.strip(), mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                return None
            kwargs = {kw.arg: _py_value(kw.value) for kw in node.keywords if kw.arg is not None}
            if len(kwargs) != len(node.keywords):
                return None
            calls.append((node.func.id, json.dumps(kwargs, ensure_ascii=False, allow_nan=False)))
        return calls
    except (SyntaxError, ValueError, TypeError, RecursionError):
        return None


class _PythonicStream(ToolCallStream):
    """A call list opens the output; it is held until its closing ']' and then released whole."""

    WRAP_START, WRAP_END = "<|python_start|>", "<|python_end|>"

    def __init__(self, parser: ToolParser) -> None:
        super().__init__(parser.new_id, "lead")
        self.content = _Content(self)


    def _lead(self, final: bool) -> bool:
        s = self._decided_lead(self.WRAP_START, final)
        if s is None:
            return False
        s = s.removeprefix(self.WRAP_START).lstrip()
        if s.startswith("["):
            self.buf, self.state = s, "list"
        elif s or final:
            self.state = "text"
        return self.state != "lead"

    def _wrap_end(self, final: bool) -> bool:
        s = self.buf.lstrip()
        if not final and may_become(s, self.WRAP_END):
            return False  # the closing wrapper may still come
        self.buf, self.state = s.removeprefix(self.WRAP_END), "text"
        return True

    def _list(self, final: bool) -> bool:
        end = _py_list_end(self.buf, 0)
        if end is None and not final:
            return False
        end = end or len(self.buf)
        source, self.buf = self.buf[:end], self.buf[end:]
        calls = parse_pythonic(source)
        if not calls:
            self.content.emit(source, hold_tail=True)
            self.state = "text"
            return True
        for name, args in calls:
            self.out.whole_call(name, args)
        self.content.call_ended()
        self.state = "wrap_end"
        return True

    def _text(self, final: bool) -> bool:
        self.content.emit(self.buf, hold_tail=not final)
        self.buf = ""
        return False


class PythonicParser(ToolParser):
    """Pythonic calls (Llama 3.2/4 style): the output is `[f(a=1), g(b="x")]`, keyword literal arguments.
    Calls are released when the list closes, each with its whole arguments."""

    name = "pythonic"

    def stream(self) -> ToolCallStream:
        return _PythonicStream(self)
