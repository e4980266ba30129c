"""One choice's output text -> reasoning, answer text and tool calls, whole or streamed.

The reading every protocol shares: the `--reasoning-parser` splits the think block off first, then the
tool-call parser reads calls out of the answer. Chat completions, Responses and Messages all build
their items from these pieces; only the shapes differ (serving_chat.py, responses_writer.py,
messages_writer.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .reasoning_parser import ReasoningParser, ReasoningStream
from .tool_parser_base import ToolCall, ToolCallDelta, ToolCallStream, ToolParser


@dataclass(slots=True)
class AssistantTurn:
    """A whole choice: reasoning ("" without a reasoning parser), answer text, and calls."""

    reasoning: str
    content: str
    tool_calls: list[ToolCall]


def read_whole(text: str, reasoning: ReasoningParser | None, tools: ToolParser | None) -> AssistantTurn:
    """Split a whole output (no parser: the text is the answer)."""
    thought, answer = reasoning.split(text) if reasoning is not None else ("", text)
    if tools is None:
        return AssistantTurn(thought, answer, [])
    out = tools.parse(answer)
    return AssistantTurn(thought, out.content, out.tool_calls)


@dataclass(slots=True)
class Piece:
    """A streamed piece, in output order: reasoning text, answer text, or a call delta (ToolCallDelta:
    `id` and `name` set on a call's first delta, then argument fragments)."""

    kind: Literal["reasoning", "text", "call"]
    text: str = ""
    call: ToolCallDelta | None = None


@dataclass(slots=True)
class AssistantStream:
    """The streamed split of one choice. Owned by one writer; feed deltas in order, then finish once."""

    reasoning: ReasoningStream | None
    tools: ToolCallStream | None
    num_calls: int = 0
    _out: list[Piece] = field(default_factory=list)

    @classmethod
    def of(cls, reasoning: ReasoningParser | None, tools: ToolParser | None) -> AssistantStream:
        """A stream for one choice under the given parsers (either may be None)."""
        return cls(reasoning.stream() if reasoning else None, tools.stream() if tools else None)

    def _answer(self, text: str, final: bool) -> None:
        if self.tools is None:
            if text:
                self._out.append(Piece("text", text))
            return
        d = self.tools.feed(text) if text else None
        parts = [d] if d is not None else []
        if final:
            parts.append(self.tools.finish())
        for part in parts:  # in output order, also when one delta holds text on both sides of a call
            for piece in part.pieces:
                if isinstance(piece, str):
                    self._out.append(Piece("text", piece))
                else:
                    self.num_calls += piece.id is not None
                    self._out.append(Piece("call", call=piece))

    def _take(self) -> list[Piece]:
        out, self._out = self._out, []
        return out

    def feed(self, text: str) -> list[Piece]:
        """The pieces `text` (the next delta of the output) releases."""
        if self.reasoning is None:
            self._answer(text, False)
            return self._take()
        d = self.reasoning.feed(text)
        if d.reasoning:
            self._out.append(Piece("reasoning", d.reasoning))
        self._answer(d.content, False)
        return self._take()

    def finish(self) -> list[Piece]:
        """What the end of the output releases (held-back text, unfinished calls)."""
        if self.reasoning is not None:
            d = self.reasoning.finish()
            if d.reasoning:
                self._out.append(Piece("reasoning", d.reasoning))
            self._answer(d.content, True)
        else:
            self._answer("", True)
        return self._take()
