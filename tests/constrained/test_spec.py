"""GrammarSpec mapping and validation: every refusal is one line and names its problem, and every
keyword refused as "not enforced" really is ignored by xgrammar 0.2.8 (measured on a byte-level
vocabulary: the compiled grammar accepts an instance that violates the keyword). If a future
xgrammar starts enforcing one, its measurement test fails: move it to the enforced list."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixrt.constrained import GrammarError, GrammarKind, GrammarSpec, spec_from_request, validate_spec
from radixrt.constrained.schema_check import ENFORCED_FORMATS


def _js(schema: Any) -> GrammarSpec:
    return GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema))


def _refusal(spec: GrammarSpec) -> str:
    with pytest.raises(GrammarError) as info:
        validate_spec(spec)
    message = str(info.value)
    assert "\n" not in message and message
    return message


# ---- request mapping ---------------------------------------------------------------------------

def test_response_format_maps_to_specs() -> None:
    assert spec_from_request() is None
    assert spec_from_request(response_format={"type": "text"}) is None
    assert spec_from_request(response_format={"type": "json_object"}) == GrammarSpec(GrammarKind.JSON_OBJECT)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    got = spec_from_request(response_format={"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": schema, "strict": True}})
    assert got is not None and got.kind is GrammarKind.JSON_SCHEMA and json.loads(got.text) == schema
    assert spec_from_request(regex="a+") == GrammarSpec(GrammarKind.REGEX, "a+")
    assert spec_from_request(ebnf='root ::= "a"') == GrammarSpec(GrammarKind.EBNF, 'root ::= "a"')
    assert spec_from_request(json_schema='{"type": "integer"}').kind is GrammarKind.JSON_SCHEMA
    tag = spec_from_request(response_format={"type": "structural_tag", "format": {"type": "const_string",
                                                                                  "value": "hi"}})
    assert tag is not None and tag.kind is GrammarKind.STRUCTURAL_TAG


def test_two_constraints_at_once_are_refused() -> None:
    with pytest.raises(GrammarError, match="only one output constraint.*regex, ebnf"):
        spec_from_request(regex="a", ebnf='root ::= "a"')
    with pytest.raises(GrammarError, match="response_format, json_schema"):
        spec_from_request(response_format={"type": "json_object"}, json_schema="{}")


@pytest.mark.parametrize("rf, needle", [
    ({"type": "xml"}, "'xml' is not one of"),
    ({"type": "json_schema"}, "needs 'json_schema'"),
    ("json", "must be an object"),
])
def test_malformed_response_format(rf: Any, needle: str) -> None:
    with pytest.raises(GrammarError, match=needle):
        spec_from_request(response_format=rf)


def test_spec_is_hashable_and_keyed_by_kind_and_text() -> None:
    a, b = GrammarSpec("regex", "a+"), GrammarSpec(GrammarKind.REGEX, "a+")
    assert a == b and hash(a) == hash(b) and a.key == ("regex", "a+")
    assert GrammarSpec("ebnf", "a+").key != a.key


# ---- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, needle", [
    ('{"type": "object",', "JSON schema is not valid JSON"),
    ("[1, 2]", "must be an object or a boolean"),
    ('{"type": "strin"}', "invalid JSON schema at #/type"),
    ('{"properties": {"a": {"minLength": -1}}}', "invalid JSON schema at #/properties/a/minLength"),
    ('{"required": "a"}', "invalid JSON schema at #/required"),
    ('{"type": "string", "pattern": "(a"}', "#/pattern: '(a' is not a 'regex'"),
    ('false', "cannot accept any value"),
    ('{"type": "object", "minProperties": 2, "properties": {"a": {}}, "additionalProperties": false}',
     "minProperties"),
    ('{"$ref": "#/$defs/missing"}', "missing"),
])
def test_invalid_schemas(text: str, needle: str) -> None:
    assert needle in _refusal(GrammarSpec(GrammarKind.JSON_SCHEMA, text))


INT = {"type": "integer"}
AB = {"type": "object", "properties": {"a": INT, "b": INT}}
INTS = {"type": "array", "items": INT}

# (name, schema, instance that satisfies everything but the keyword, pointer/keyword in the message)
UNENFORCED: list[tuple[str, Any, Any, str]] = [
    ("not", {"type": "integer", "not": {"const": 3}}, 3, "#/not"),
    ("if_then", {**AB, "if": {"required": ["a"]}, "then": {"required": ["b"]}}, {"a": 1}, "#/if"),
    ("dependentRequired", {**AB, "dependentRequired": {"a": ["b"]}}, {"a": 1}, "#/dependentRequired"),
    ("dependentSchemas", {**AB, "dependentSchemas": {"a": {"required": ["b"]}}}, {"a": 1},
     "#/dependentSchemas"),
    ("uniqueItems", {**INTS, "uniqueItems": True}, [1, 1], "#/uniqueItems"),
    ("contains", {**INTS, "contains": {"const": 3}}, [1], "#/contains"),
    ("maxContains", {**INTS, "contains": {"const": 3}, "maxContains": 1}, [3, 3], "contains"),
    ("multipleOf_number", {"type": "number", "multipleOf": 0.5}, 0.3, "multipleOf"),
    ("allOf_two", {"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 5}]}, 9, "allOf"),
    ("oneOf_overlap", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1, "oneOf"),
    ("ref_siblings", {"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x", "minimum": 5}, 4,
     "beside $ref are not enforced (minimum)"),
    ("ref_anchor", {"$defs": {"x": {"$anchor": "X", "type": "integer"}}, "$ref": "#X"}, "s", "'#X'"),
    ("contentEncoding", {"type": "string", "contentEncoding": "base64"}, "!!!", "contentEncoding"),
    ("format_unknown", {"type": "string", "format": "int32"}, "x", "format 'int32'"),
    ("nested_path", {"type": "object", "properties": {"a": {**INTS, "items": {"not": {"const": 1}}}}},
     {"a": [1]}, "#/properties/a/items/not"),
    ("pattern_lookahead", {"type": "string", "pattern": "^(?=b)[a-z]$"}, "a", "lookahead"),
]


@pytest.mark.parametrize("name, schema, instance, needle", UNENFORCED, ids=[c[0] for c in UNENFORCED])
def test_unenforced_keywords_are_refused(name: str, schema: Any, instance: Any, needle: str) -> None:
    assert needle in _refusal(_js(schema))


MEASURED = [c for c in UNENFORCED if c[0] not in ("ref_anchor", "nested_path")]  # same keywords again


@pytest.mark.parametrize("name, schema, instance, needle", MEASURED, ids=[c[0] for c in MEASURED])
def test_xgrammar_really_ignores_the_refused_keywords(byte_compiler: Any, name: str, schema: Any,
                                                     instance: Any, needle: str) -> None:
    import jsonschema
    import xgrammar as xgr

    # format and content* are annotations for jsonschema (no format checker): nothing to violate there
    annotation_only = name in ("format_unknown", "contentEncoding")
    assert annotation_only or not jsonschema.Draft202012Validator(schema).is_valid(instance)
    compiled = byte_compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled)
    assert matcher.accept_string(json.dumps(instance)) and matcher.is_completed()


ENFORCED: list[tuple[Any, Any, Any]] = [
    ({"type": "integer", "multipleOf": 3}, 6, 4),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, [1, 2], [1]),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"a": 1}, {}),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "s", True),
    ({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": "integer"}},
                 "required": ["k", "x"]},
                {"type": "object", "properties": {"k": {"const": "b"}, "y": {"type": "string"}},
                 "required": ["k", "y"]}]}, {"k": "a", "x": 1}, {"k": "a", "y": "s"}),
    ({"allOf": [{"type": "integer", "minimum": 5}]}, 6, 4),
    ({"$defs": {"x": {"type": "integer", "minimum": 5}}, "$ref": "#/$defs/x", "description": "d"}, 6, 4),
    ({"type": "string", "format": "date"}, "2024-02-03", "tomorrow"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
     {"a": 1, "b": "x"}, {"a": 1, "b": 2}),
]


@pytest.mark.parametrize("schema, good, bad", ENFORCED)
def test_supported_keywords_pass_validation_and_are_enforced(byte_compiler: Any, schema: Any, good: Any,
                                                             bad: Any) -> None:
    import xgrammar as xgr

    assert validate_spec(_js(schema)) == json.dumps(schema)
    compiled = byte_compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
    for instance, expected in ((good, True), (bad, False)):
        matcher = xgr.GrammarMatcher(compiled)
        assert (matcher.accept_string(json.dumps(instance)) and matcher.is_completed()) is expected


def test_enforced_formats_are_enforced(byte_compiler: Any) -> None:
    import xgrammar as xgr

    for fmt in sorted(ENFORCED_FORMATS):
        compiled = byte_compiler.compile_json_schema(json.dumps({"type": "string", "format": fmt}),
                                                     any_whitespace=False)
        matcher = xgr.GrammarMatcher(compiled)
        assert not (matcher.accept_string('"@@ x @@"') and matcher.is_completed()), fmt


@pytest.mark.parametrize("pattern, needle", [
    ("(a", "is not a valid regex"),
    ("a$b", "'$' is supported only at the end"),
    ("a^b", "'^' is supported only at the start"),
    ("(?=a)a", "lookahead/lookbehind"),
    ("(?<!a)b", "lookahead/lookbehind"),
    (r"\bword", "word boundaries"),
    (r"(a)\1", "backreferences"),
    (r"\Aab", "anchor \\A"),
    (r"ab\Z", "anchor \\Z"),
    ("(?i)ab", "inline flags"),
    ("(?P<x>a)", "named groups"),
    (r"\p{L}", "bad escape \\p"),
])
def test_bad_regexes(pattern: str, needle: str) -> None:
    assert needle in _refusal(GrammarSpec(GrammarKind.REGEX, pattern))


@pytest.mark.parametrize("pattern", [r"^ab$", r"^a|^b", r"(a|b)$", r"[$^.]+", r"\d{3}-\d{4}",
                                     r"[\w.-]+@x\.io"])
def test_good_regexes(pattern: str) -> None:
    validate_spec(GrammarSpec(GrammarKind.REGEX, pattern))


def test_regex_dot_excludes_newline(byte_compiler: Any) -> None:
    import xgrammar as xgr

    text = validate_spec(GrammarSpec(GrammarKind.REGEX, r"a.b[.]"))
    assert text == r"a[^\n]b[.]"
    matcher = xgr.GrammarMatcher(byte_compiler.compile_regex(text))
    assert not matcher.accept_string("a\n")
    raw = xgr.GrammarMatcher(byte_compiler.compile_regex(r"a.b"))
    assert raw.accept_string("a\nb")  # why the rewrite exists


@pytest.mark.parametrize("grammar, needle", [
    ("", "EBNF grammar is empty"),
    ('root ::= "a" |', "EBNF parser error"),
    ("root ::= foo", 'Rule "foo" is not defined'),
    ('start ::= "a"', "root"),
])
def test_bad_ebnf(grammar: str, needle: str) -> None:
    assert needle in _refusal(GrammarSpec(GrammarKind.EBNF, grammar))


def test_structural_tag_checks_inner_schemas_and_bounds_whitespace() -> None:
    bad = {"type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "end": "</a>",
                                                "content": {"type": "json_schema",
                                                            "json_schema": {"not": {"type": "integer"}}}}}
    assert "#/not" in _refusal(GrammarSpec(GrammarKind.STRUCTURAL_TAG, json.dumps(bad)))
    legacy = {"structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}],
              "triggers": ["<f"]}
    text = validate_spec(GrammarSpec(GrammarKind.STRUCTURAL_TAG, json.dumps(legacy)))
    fmt = json.loads(text)["format"]
    assert fmt["type"] == "triggered_tags" and fmt["triggers"] == ["<f"]
    assert fmt["tags"][0]["content"]["max_whitespace_cnt"] == 1
    no_format = GrammarSpec(GrammarKind.STRUCTURAL_TAG, '{"type": "structural_tag"}')
    assert "needs a 'format'" in _refusal(no_format)
    assert "not valid JSON" in _refusal(GrammarSpec(GrammarKind.STRUCTURAL_TAG, "{"))


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_deeply_nested_schemas_are_refused_in_one_line() -> None:
    """A schema nested past MAX_JSON_DEPTH, as an object (json.dumps hit Python's recursion limit near
    500 levels: an HTTP 500 before) or as a string, is a GrammarError naming the depth; a schema at the
    limit passes the mapping."""
    from radixrt.constrained.spec import MAX_JSON_DEPTH, json_depth

    assert json_depth(1) == 0 and json_depth([]) == 1 and json_depth({"a": [[1]]}) == 3
    deep = _nested(600)
    assert json_depth(deep) == 1201
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}
    with pytest.raises(GrammarError, match="JSON schema nests 1201 levels deep"):
        spec_from_request(response_format=rf)
    with pytest.raises(GrammarError, match="nests"):
        spec_from_request(json_schema=deep)
    ok = _nested((MAX_JSON_DEPTH - 1) // 2)
    ok_rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": ok}}
    assert spec_from_request(response_format=ok_rf)
    text = "[" * 100_000 + "]" * 100_000  # too deep for json.loads itself
    assert "nests" in _refusal(GrammarSpec(GrammarKind.JSON_SCHEMA, text))
    assert "nests" in _refusal(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(_nested(100))))
    tag = {"type": "structural_tag", "format": {"type": "json_schema", "json_schema": _nested(80)}}
    assert "nests" in _refusal(GrammarSpec(GrammarKind.STRUCTURAL_TAG, json.dumps(tag)))  # a tag as a string


def test_a_schema_at_the_depth_limit_compiles_and_one_past_it_is_refused() -> None:
    """A chain of `items` (which jsonschema's checks and xgrammar recurse through) of exactly
    MAX_JSON_DEPTH levels, sent as a string, passes the checks and xgrammar; one level more is a
    GrammarError naming the depth, not a quoted RecursionError (break-it pass of 2026-12-05: at a
    limit of 128, chains of 117+ levels failed inside jsonschema)."""
    from radixrt.json_depth import MAX_JSON_DEPTH

    def chain(levels: int) -> str:
        return '{"items": ' * (levels - 1) + "{}" + "}" * (levels - 1)

    assert validate_spec(GrammarSpec(GrammarKind.JSON_SCHEMA, chain(MAX_JSON_DEPTH)))
    refusal = _refusal(GrammarSpec(GrammarKind.JSON_SCHEMA, chain(MAX_JSON_DEPTH + 1)))
    assert f"nests {MAX_JSON_DEPTH + 1} levels deep; at most {MAX_JSON_DEPTH}" in refusal
