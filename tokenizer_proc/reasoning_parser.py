"""Reasoning parsers by `--reasoning-parser` name: split a model's `<think>...</think>` block from its answer.

Two members of the `<think>` family:
- `qwen3`: the output starts in the answer; a `<think>` opens the reasoning and `</think>` closes it
  (Qwen3, QwQ with thinking on). Without a `<think>` the whole output is the answer (Qwen3 with
  `enable_thinking: false`, whose template already closed an empty think block in the prompt).
- `deepseek-r1`: the output starts inside the think block (DeepSeek-R1's template ends the generation
  prompt with `<think>\\n`), an opening `<think>` the model writes anyway is dropped, and `</think>`
  starts the answer. Without a `</think>` the whole output is reasoning.

One incremental machine (`ReasoningStream`) serves both paths: streaming feeds it text deltas, and
`ReasoningParser.split` feeds the whole text as one delta, so both give the same split however the
text was cut into tokens (a tag split across tokens is held back until it is known; tests check every
split point). Newlines right after `<think>` and `</think>` and right before `</think>` are layout, not
text (templates render them back themselves); a think block cut by `max_tokens` is reasoning only.
Machines never raise on model output.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tool_parser_base import held_prefix_len

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_BEFORE, _THINK, _ANSWER = 0, 1, 2  # where the machine is in the output


@dataclass(slots=True)
class ReasoningDelta:
    """What one fed delta released: reasoning text and answer (content) text, either may be ""."""

    reasoning: str = ""
    content: str = ""


class ReasoningStream:
    """The split of one choice's output, fed in deltas. Owned by one writer; not thread-safe.

    `starts_in_think`: deepseek-r1 (True) or qwen3 (False).
    """

    def __init__(self, starts_in_think: bool) -> None:
        self.state = _THINK if starts_in_think else _BEFORE
        self.at_start = True  # nothing seen yet: an opening tag may still come first
        self.held = ""  # text kept back: a possible partial tag, or newlines that may be layout
        self.lstrip = starts_in_think  # drop newlines at the start of the current section

    def feed(self, delta: str) -> ReasoningDelta:
        """The reasoning and content that `delta` releases (text that may be a partial tag is held)."""
        out = ReasoningDelta()
        text = self.held + delta
        self.held = ""
        while text:
            if self.at_start and self.state == _THINK:
                stripped = text.lstrip("\n")
                if THINK_OPEN.startswith(stripped):  # maybe the model repeats the opening tag
                    self.held = text
                    return out
                self.at_start = False
                text = stripped[len(THINK_OPEN):] if stripped.startswith(THINK_OPEN) else stripped
                continue
            text = self._step(text, out)
        return out

    def _step(self, text: str, out: ReasoningDelta) -> str:
        """Consume `text` up to the next tag boundary; return what is left to read."""
        self.at_start = False
        if self.lstrip:
            text = text.lstrip("\n")
            if not text:
                return ""
            self.lstrip = False
        if self.state == _ANSWER:
            out.content += text
            return ""
        tag = THINK_CLOSE if self.state == _THINK else THINK_OPEN
        pos = text.find(tag)
        if pos >= 0:
            before, rest = text[:pos], text[pos + len(tag):]
            if self.state == _THINK:
                out.reasoning += before.rstrip("\n")
                self.state = _ANSWER
            else:
                out.content += before
                self.state = _THINK
            self.lstrip = True
            return rest
        keep = held_prefix_len(text, tag)
        body, self.held = text[:len(text) - keep], text[len(text) - keep:]
        if self.state == _THINK:  # newlines before a possible `</think>` wait until it is known
            trimmed = body.rstrip("\n")
            self.held = body[len(trimmed):] + self.held
            out.reasoning += trimmed
        else:
            out.content += body
        return ""

    def finish(self) -> ReasoningDelta:
        """The end of the output: what was held back, placed where it belongs (reasoning if the think
        block was never closed, trailing newlines of reasoning dropped). A tag that the end cut
        (`max_tokens` after `</` or `<th`) is dropped, not returned as text: the held text ends
        with a proper prefix of the tag the machine was waiting for."""
        held, self.held = self.held, ""
        if self.state == _ANSWER:
            return ReasoningDelta(content=held)
        if self.at_start and self.state == _THINK:
            held = held.lstrip("\n")
            held = "" if THINK_OPEN.startswith(held) else held
        tag = THINK_CLOSE if self.state == _THINK else THINK_OPEN
        held = held[:len(held) - held_prefix_len(held, tag)]
        if self.state == _BEFORE:
            return ReasoningDelta(content=held)
        return ReasoningDelta(reasoning=held.rstrip("\n"))


@dataclass(frozen=True, slots=True)
class ReasoningParser:
    """A `--reasoning-parser`: makes streams and splits whole outputs."""

    name: str
    starts_in_think: bool

    def stream(self) -> ReasoningStream:
        """A machine for one choice's output."""
        return ReasoningStream(self.starts_in_think)

    def split(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of a whole output; same result as streaming it in any pieces."""
        s = self.stream()
        a, b = s.feed(text), s.finish()
        return a.reasoning + b.reasoning, a.content + b.content


REASONING_PARSERS: dict[str, ReasoningParser] = {
    "deepseek-r1": ReasoningParser("deepseek-r1", starts_in_think=True),
    "qwen3": ReasoningParser("qwen3", starts_in_think=False),
}


def get_reasoning_parser(name: str | None) -> ReasoningParser | None:
    """The parser registered as `name`; None for None.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name is None:
        return None
    parser = REASONING_PARSERS.get(name)
    if parser is None:
        known = ", ".join(REASONING_PARSERS)
        raise ValueError(f"--reasoning-parser: unknown parser {name!r}; known: {known}")
    return parser
