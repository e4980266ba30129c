"""The reasoning parsers split `<think>...</think>` the same way whole and streamed, at every split
point, with tags cut across tokens, and with a think block cut by max_tokens."""

from __future__ import annotations

from typing import Any

import pytest

from radixrt.tokenizer_proc.assistant_output import AssistantStream, read_whole
from radixrt.tokenizer_proc.reasoning_parser import REASONING_PARSERS, get_reasoning_parser
from radixrt.tokenizer_proc.tool_parsers import get_tool_parser

# (text, qwen3 split, deepseek-r1 split) as (reasoning, content)
CASES = [
    ("<think>\nLet me see.\n</think>\n\nThe answer is 4.", ("Let me see.", "The answer is 4."),
     ("Let me see.", "The answer is 4.")),
    ("Plain answer.", ("", "Plain answer."), ("Plain answer.", "")),
    ("<think>\nthoughts cut by max_tok", ("thoughts cut by max_tok", ""), ("thoughts cut by max_tok", "")),
    ("step 1\nstep 2\n</think>\n\nDone.", ("", "step 1\nstep 2\n</think>\n\nDone."),
     ("step 1\nstep 2", "Done.")),
    ("<think>a < b and </thin k</think>x", ("a < b and </thin k", "x"), ("a < b and </thin k", "x")),
    ("<think>\n\n</think>\n\n", ("", ""), ("", "")),
]


@pytest.mark.parametrize("text,qwen3,r1", CASES)
def test_whole_split(text: str, qwen3: tuple[str, str], r1: tuple[str, str]) -> None:
    assert REASONING_PARSERS["qwen3"].split(text) == qwen3
    assert REASONING_PARSERS["deepseek-r1"].split(text) == r1


def _streamed(name: str, pieces: list[str]) -> tuple[str, str]:
    s = REASONING_PARSERS[name].stream()
    out = [s.feed(p) for p in pieces] + [s.finish()]
    return "".join(d.reasoning for d in out), "".join(d.content for d in out)


@pytest.mark.parametrize("name", sorted(REASONING_PARSERS))
@pytest.mark.parametrize("text", [c[0] for c in CASES])
def test_every_two_cut_stream_equals_whole(name: str, text: str) -> None:
    whole = REASONING_PARSERS[name].split(text)
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert _streamed(name, [text[:i], text[i:j], text[j:]]) == whole, (i, j)


def test_tag_split_across_real_tokens(tokenizer: Any) -> None:
    """The default tokenizer spells `<think>` / `</think>` in several tokens: fed token by token, no
    piece of a tag leaks into either side."""
    text = "<think>\nThe user greets me.\n</think>\n\nHello!"
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = [tokenizer.decode(ids[:k + 1]) for k in range(len(ids))]
    deltas = [pieces[0]] + [b[len(a):] for a, b in zip(pieces, pieces[1:], strict=False)]
    assert "".join(deltas) == text
    assert not any(d in ("<think>", "</think>") for d in deltas)  # the tags really are split
    got = _streamed("qwen3", deltas)
    assert got == ("The user greets me.", "Hello!")
    s = REASONING_PARSERS["qwen3"].stream()
    for d in deltas:
        out = s.feed(d)
        assert "<" not in out.reasoning and "think" not in out.content, (d, out)


def test_think_block_cut_mid_tag_is_reasoning() -> None:
    """max_tokens ends the output inside `</think>` or `<think>`: the text before it is reasoning (or
    content), the piece of the tag is dropped (it was returned as `reasoning_content: "hi there</"` and
    `content: "<th"`; break-it, 2026-12-05)."""
    assert _streamed("qwen3", ["<think>\nalmost done\n</th"]) == ("almost done", "")
    assert _streamed("deepseek-r1", ["almost", " done", "\n</thi"]) == ("almost done", "")
    assert _streamed("qwen3", ["<think>\nhi there</"]) == ("hi there", "")
    assert _streamed("qwen3", ["<th"]) == ("", "")
    assert _streamed("qwen3", ["Sure: <thi"]) == ("", "Sure: ")
    assert _streamed("deepseek-r1", ["\n<thin"]) == ("", "")
    for name in REASONING_PARSERS:  # whole and streamed agree on each
        for text in ("<think>\nalmost done\n</th", "Sure: <thi", "<think>hi there</"):
            assert REASONING_PARSERS[name].split(text) == _streamed(name, [text[:3], text[3:]])


def test_reasoning_then_tool_call_stream_matches_whole() -> None:
    text = ('<think>\nI need the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Paris"}}\n</tool_call>')
    reasoning, tools = get_reasoning_parser("qwen3"), get_tool_parser("hermes")
    whole = read_whole(text, reasoning, tools)
    assert whole.reasoning == "I need the weather." and whole.content == ""
    assert [(c.name, c.arguments) for c in whole.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    for cut in range(0, len(text), 7):
        s = AssistantStream.of(reasoning, get_tool_parser("hermes"))
        pieces = s.feed(text[:cut]) + s.feed(text[cut:]) + s.finish()
        assert "".join(p.text for p in pieces if p.kind == "reasoning") == whole.reasoning
        assert "".join(p.text for p in pieces if p.kind == "text").strip() == ""
        args = "".join(p.call.arguments for p in pieces if p.call is not None)
        assert args == '{"city": "Paris"}' and s.num_calls == 1


def test_unknown_parser_is_rejected() -> None:
    assert get_reasoning_parser(None) is None
    with pytest.raises(ValueError, match="known: deepseek-r1, qwen3"):
        get_reasoning_parser("nope")
