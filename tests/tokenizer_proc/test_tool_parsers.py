"""Tool-call parsers: full-text results, streaming at every split point equal to them, fallbacks, registry."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.tokenizer_proc.tool_parsers import (
    TOOL_PARSERS,
    ParsedOutput,
    StreamDelta,
    ToolCall,
    assistant_message,
    detect_tool_parser,
    finish_reason_with_tools,
    get_tool_parser,
)

HERMES_OK = [
    ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "Let me check.", [("get_weather", '{"city": "Paris"}')]),
    ('<tool_call>{"name": "a", "arguments": {"x": "}{\\"<tool_call>"}}</tool_call>\n'
     '<tool_call>{"name": "b", "arguments": "{\\"y\\": [1, 2]}"}</tool_call>',
     "", [("a", '{"x": "}{\\"<tool_call>"}'), ("b", '{"y": [1, 2]}')]),
    ('<tool_call>\n{"arguments": {"q": 1}, "name": "late_name"}\n</tool_call>\nDone.',
     "Done.", [("late_name", '{"q": 1}')]),
    ('<tool_call>{"name": "no_args"}</tool_call>', "", [("no_args", "{}")]),
    ('<tool_call>{"name": "f", "parameters": {"k": {"n": [true, null]}}}',
     "", [("f", '{"k": {"n": [true, null]}}')]),
    ("Just text, a < sign and <tool but no call.\n", "Just text, a < sign and <tool but no call.\n", []),
]
LLAMA3_OK = [
    ('<|python_tag|>{"name": "f", "parameters": {"x": [1, "}"]}}; {"name": "g", "parameters": {}}',
     "", [("f", '{"x": [1, "}"]}'), ("g", "{}")]),
    ('{"name": "search", "parameters": {"query": "radix"}}', "", [("search", '{"query": "radix"}')]),
    ('Sure. <|python_tag|>{"name": "f", "arguments": {"a": 1}}', "Sure.", [("f", '{"a": 1}')]),
    ('{"parameters": {"a": 1}, "name": "late"}\n{"name": "g", "parameters": {}}',
     "", [("late", '{"a": 1}'), ("g", "{}")]),
    ("The answer is 42.", "The answer is 42.", []),
    ('{"a": 1} is a JSON object.', '{"a": 1} is a JSON object.', []),
]
PYTHONIC_OK = [
    ('[get_weather(city="San Francisco", days=3), add(a=1, b=2.5)]',
     "", [("get_weather", '{"city": "San Francisco", "days": 3}'), ("add", '{"a": 1, "b": 2.5}')]),
    ("<|python_start|>[f(flag=True, tags=['x)', \"y]\"], m={'k': None})]<|python_end|>",
     "", [("f", '{"flag": true, "tags": ["x)", "y]"], "m": {"k": null}}')]),
    ("[ping()]\nThat was the call.", "That was the call.", [("ping", "{}")]),
    ("[1] is a citation, not a call.", "[1] is a citation, not a call.", []),
    ("No calls here.", "No calls here.", []),
]
CASES = ([("hermes", *c) for c in HERMES_OK] + [("llama3_json", *c) for c in LLAMA3_OK]
         + [("pythonic", *c) for c in PYTHONIC_OK])


def _ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def _run_stream(parser_name: str, pieces: list[str]) -> tuple[str, list[tuple[str, str]], list[StreamDelta]]:
    """Feed pieces; reassemble content and calls from the deltas, checking the delta contract."""
    s = get_tool_parser(parser_name, _ids()).stream()
    deltas = [s.feed(p) for p in pieces] + [s.finish()]
    content = "".join(d.content for d in deltas)
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for c in d.tool_calls:
            if c.index not in calls:
                assert c.index == len(calls), "call indexes start at 0 and grow by one"
                assert c.id is not None and c.id.startswith("call_") and c.name, "first delta names the call"
                calls[c.index] = [c.name, ""]
            else:
                assert c.id is None and c.name is None, "only the first delta carries id and name"
            calls[c.index][1] += c.arguments
    return content, [(n, a) for n, a in calls.values()], deltas


@pytest.mark.parametrize(("parser_name", "text", "content", "calls"), CASES)
def test_parse(parser_name: str, text: str, content: str, calls: list[tuple[str, str]]) -> None:
    out = get_tool_parser(parser_name, _ids()).parse(text)
    assert out.content == content
    assert [(c.name, c.arguments) for c in out.tool_calls] == calls
    assert [c.id for c in out.tool_calls] == [f"call_{i}" for i in range(len(calls))]


@pytest.mark.parametrize(("parser_name", "text", "content", "calls"), CASES)
def test_stream_every_split_point_matches_parse(parser_name: str, text: str, content: str,
                                                calls: list[tuple[str, str]]) -> None:
    for i in range(len(text) + 1):
        assert _run_stream(parser_name, [text[:i], text[i:]])[:2] == (content, calls), f"split at {i}"
    assert _run_stream(parser_name, list(text))[:2] == (content, calls), "one character per delta"
    for i in range(0, len(text), 3):  # three pieces: a tag split in the middle of the text too
        j = (i + len(text)) // 2
        assert _run_stream(parser_name, [text[:i], text[i:j], text[j:]])[:2] == (content, calls)


def test_hermes_streams_arguments_before_the_call_closes() -> None:
    text = '<tool_call>\n{"name": "write", "arguments": {"body": "a long text"}}\n</tool_call>'
    s = get_tool_parser("hermes", _ids()).stream()
    head = s.feed(text[: text.index("long")])
    assert [(c.index, c.id, c.name) for c in head.tool_calls] == [(0, "call_0", "write")]
    assert "".join(c.arguments for c in head.tool_calls) == '{"body": "a '
    rest = s.feed(text[text.index("long"):])
    assert [c.id for c in rest.tool_calls] == [None]
    assert s.finish() == StreamDelta()


def test_content_before_a_call_streams_and_its_trailing_space_is_held() -> None:
    s = get_tool_parser("hermes").stream()
    assert s.feed("Checking ").content == "Checking"
    assert s.feed("now. <tool").content == " now."
    d = s.feed('_call>{"name": "f", "arguments": {}}</tool_call>')
    assert d.content == "" and [c.name for c in d.tool_calls] == ["f"]


@pytest.mark.parametrize("text", [
    "<tool_call>not json at all</tool_call>",
    '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
    '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>',
    '<tool_call>{"name": "f", "arguments": "unterminated',
])
def test_hermes_text_that_never_starts_a_call_is_content(text: str) -> None:
    out = get_tool_parser("hermes").parse(text)
    assert out.tool_calls == [] and out.content == text
    for i in range(len(text) + 1):  # streaming never raises either, wherever the text is cut
        assert _run_stream("hermes", [text[:i], text[i:]])[:2] == (text, [])


@pytest.mark.parametrize(("parser_name", "text", "content", "calls"), [
    # cut by max_tokens inside the arguments: the call as written so far (the stream has sent it)
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city":',
     "", [("get_weather", '{"city":')]),
    ("hermes", 'hi <tool_call>{"name": "f", "arguments": {"a": }}</tool_call> bye',
     "hi bye", [("f", '{"a": }')]),  # the gap between the texts on either side stays a gap
    ("llama3_json", '{"name": "f", "parameters": {"a": ', "", [("f", '{"a": ')]),
])
def test_a_started_call_stays_a_call_when_cut_or_malformed(parser_name: str, text: str, content: str,
                                                          calls: list[tuple[str, str]]) -> None:
    """Once its header is read a call counts in both paths, its arguments as written (OpenAI's
    contract too: they may be incomplete or invalid JSON): the whole-text parse equals the joined
    stream at every split point."""
    out = get_tool_parser(parser_name).parse(text)
    assert (out.content, [(c.name, c.arguments) for c in out.tool_calls]) == (content, calls)
    for i in range(len(text) + 1):
        assert _run_stream(parser_name, [text[:i], text[i:]])[:2] == (content, calls), f"split at {i}"


@pytest.mark.parametrize(("parser_name", "text"), [
    ("llama3_json", "{not json}"),
    ("pythonic", "[f(1, 2)]"),
    ("pythonic", "[f(a=open('x'))]"),
    ("pythonic", "[f(a=1"),
    ("pythonic", "[get_weather(city=1e999)]"),  # Infinity is not JSON: no call (break-it pass 4)
    ("pythonic", "[f(a=[1, -1e999])]"),
])
def test_other_malformed_outputs_are_content(parser_name: str, text: str) -> None:
    out = get_tool_parser(parser_name).parse(text)
    assert out == ParsedOutput(text, [])


_PIECES = [*"ab {}[]()=\"'\\:,;\n", "<tool_call>", "</tool_call>", "<|python_tag|>", '"name": "f"',
           '"arguments": ', "f(a=1", "<|python_start|>"]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=30).map("".join)


@settings(max_examples=150, deadline=None)
@given(text=_TEXT, cut=st.integers(min_value=0), name=st.sampled_from(sorted(TOOL_PARSERS)))
def test_any_text_never_raises(text: str, cut: int, name: str) -> None:
    out = get_tool_parser(name, _ids()).parse(text)
    cut %= len(text) + 1
    # the whole-text parse is the joined stream, wherever the text is cut
    streamed = _run_stream(name, [text[:cut], text[cut:]])[:2]
    assert (out.content, [(c.name, c.arguments) for c in out.tool_calls]) == streamed


_ARGS = st.dictionaries(st.text(alphabet="xyz_<>/\"\\{}", min_size=1, max_size=4),
                        st.one_of(st.integers(), st.booleans(), st.none(), st.text(max_size=6)), max_size=3)
_NAMES = st.text(alphabet="abcdef_-0", min_size=1, max_size=8)


@settings(max_examples=120, deadline=None)
@given(lead=st.text(alphabet="Hello, world.\n", max_size=12).map(str.strip),
       calls=st.lists(st.tuples(_NAMES, _ARGS), min_size=1, max_size=3), as_string=st.booleans(),
       cuts=st.lists(st.integers(min_value=0), max_size=4))
def test_generated_hermes_outputs_round_trip(lead: str, calls: list[tuple[str, dict]], as_string: bool,
                                             cuts: list[int]) -> None:
    blocks = []
    for name, args in calls:
        arg_json = json.dumps(args)
        value = json.dumps(arg_json) if as_string else arg_json
        blocks.append(f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {value}}}\n</tool_call>')
    text = (lead + "\n" if lead else "") + "\n".join(blocks)
    expect = (lead, [(n, json.dumps(a)) for n, a in calls])
    out = get_tool_parser("hermes").parse(text)
    assert (out.content, [(c.name, c.arguments) for c in out.tool_calls]) == expect
    points = sorted({c % (len(text) + 1) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    assert _run_stream("hermes", pieces)[:2] == expect


def test_registry_and_unknown_name() -> None:
    assert {"hermes", "qwen", "llama3_json", "pythonic"} <= set(TOOL_PARSERS)
    assert get_tool_parser("qwen").name == "hermes"
    with pytest.raises(ValueError, match="unknown parser 'mistral'.*hermes"):
        get_tool_parser("mistral")


def test_detect_from_template() -> None:
    smol = "{% for message in messages %}{{'<|im_start|>' + message['role'] }}{% endfor %}"
    assert detect_tool_parser(smol) is None
    assert detect_tool_parser(None) is None
    assert detect_tool_parser("{% if tools %}<tool_call>{{ t | tojson }}</tool_call>{% endif %}") == "hermes"
    assert detect_tool_parser('{{- "<|python_tag|>" }}{"name": x, "parameters": y}') == "llama3_json"
    assert detect_tool_parser("[func_name1(params_name1=params_value1)]") == "pythonic"


def test_openai_shapes() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    out = get_tool_parser("hermes", _ids()).parse(text)
    assert assistant_message(out) == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}
    assert assistant_message(ParsedOutput("hi", [])) == {"role": "assistant", "content": "hi"}
    d = _run_stream("hermes", ['<tool_call>{"name": "f", "arguments": {"a"', ": 1}}</tool_call>"])[2]
    first, later = d[0].tool_calls[0], d[1].tool_calls[0]
    assert first.to_openai() == {"index": 0, "id": "call_0", "type": "function",
                                 "function": {"name": "f", "arguments": '{"a"'}}
    assert later.to_openai() == {"index": 0, "function": {"arguments": ": 1}"}}
    assert ToolCall("call_x", "g", "{}").to_openai()["function"] == {"name": "g", "arguments": "{}"}
    assert finish_reason_with_tools("stop", 2) == "tool_calls"
    assert finish_reason_with_tools("length", 1) == "length"
    assert finish_reason_with_tools("stop", 0) == "stop"


@pytest.mark.parametrize("text", [
    "<tool_call>\n{\"name",                       # cut by max_tokens inside the header
    "<tool_call",                                 # cut inside the tag
    # a second call cut
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", "
    "\"arguments\": {\"x\": 2}}\n</tool_call>",   # two calls and their separator
])
def test_calls_only_drops_content_whole_and_streamed(text: str) -> None:
    """Output sampled under a grammar that forces calls: the cut markup and the separators the format
    reads as content are dropped, in a whole output and at every split point of a stream; the calls
    are the format's own."""
    from radixrt.tokenizer_proc.tool_parser_base import CallsOnly

    ids = itertools.count()
    want = get_tool_parser("hermes", new_id=lambda: f"call_{next(ids)}").parse(text).tool_calls
    parser = CallsOnly(get_tool_parser("hermes", new_id=lambda: f"call_{next(ids)}"))
    whole = parser.parse(text)
    assert whole.content == "" and [(c.name, c.arguments) for c in whole.tool_calls] == [
        (c.name, c.arguments) for c in want]
    for cut in range(len(text) + 1):
        s = parser.stream()
        deltas = [s.feed(text[:cut]), s.feed(text[cut:]), s.finish()]
        assert all(d.content == "" and all(not isinstance(p, str) for p in d.pieces) for d in deltas)
        names = [td.name for d in deltas for td in d.tool_calls if td.id is not None]
        assert names == [c.name for c in want]


def test_plan_parser_wraps_only_forced_plans() -> None:
    from radixrt.tokenizer_proc.tool_grammar import ToolPlan
    from radixrt.tokenizer_proc.tool_parser_base import CallsOnly
    from radixrt.tokenizer_proc.tool_parsers import plan_parser

    assert plan_parser(ToolPlan([], None, None)) is None
    assert type(plan_parser(ToolPlan([], "hermes", None))).__name__ == "HermesParser"
    assert isinstance(plan_parser(ToolPlan([], "hermes", None, forced=True)), CallsOnly)


@pytest.mark.parametrize("text, content", [
    ('Let me check. <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call> Then I will answer.',
     "Let me check. Then I will answer."),
    ('Hello\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\nbye', "Hello\nbye"),
    ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n  Done.', "Done."),  # nothing before
    ('Checking.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n', "Checking."),  # nothing after
    ('A <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "f", '
     '"arguments": {}}\n</tool_call> B', "A B"),  # between two calls: layout
])
def test_text_on_both_sides_of_a_call_keeps_its_gap(text: str, content: str) -> None:
    """Chat's content is one string: the whitespace between text before a call and text after it is
    the gap between two words, kept as written, in a whole output and at every split point."""
    parser = get_tool_parser("hermes")
    assert parser.parse(text).content == content
    for cut in range(len(text) + 1):
        s = parser.stream()
        got = "".join(d.content for d in (s.feed(text[:cut]), s.feed(text[cut:]), s.finish()))
        assert got == content, cut
