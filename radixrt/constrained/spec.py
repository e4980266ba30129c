"""What a request constrains its output to: one grammar, named by kind and text.

A request carries at most one constraint. The OpenAI `response_format` (json_object, json_schema,
structural_tag) and SGLang's extensions (`regex`, `ebnf`, `json_schema`) all map onto a
`GrammarSpec`; `spec_from_request` does the mapping and refuses two constraints at once.

`validate_spec` checks a spec without a tokenizer (it runs in the tokenizer process, so a bad
grammar is an HTTP 400 before the request is queued) and returns the text handed to xgrammar.
The compiler service runs it again on its own threads; both give the same one-line
`GrammarError` message, which names the problem and, for JSON schemas, where it sits.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from radixrt.constrained.errors import GrammarError, xgrammar_message
from radixrt.constrained.regex_check import check_regex, dot_excludes_newline
from radixrt.constrained.schema_check import check_json_schema, parse_json
from radixrt.json_depth import MAX_JSON_DEPTH, TAG_LEVELS, json_depth

# JSON output is single-line with `json.dumps`' default separators (", " and ": "): the most common
# layout in training data, and with no whitespace choice left a small model cannot loop on spaces or
# newlines until max_tokens. Structural tags have no such switch in xgrammar 0.2.8; their JSON
# contents get a bound on consecutive whitespace instead (see docs/structured-outputs.md).
JSON_ANY_WHITESPACE = False
STRUCTURAL_TAG_MAX_WHITESPACE = 1
# What OpenAI's `json_object` promises: some JSON object (not any JSON value).
JSON_OBJECT_SCHEMA = '{"type": "object"}'


class GrammarKind(str, enum.Enum):
    """The kinds of grammar a request may carry (the wire names of the API fields)."""

    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    EBNF = "ebnf"
    STRUCTURAL_TAG = "structural_tag"


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """One output constraint; hashable, and `(kind, text)` is the compile-cache key.

    text: the JSON schema as JSON text (json_schema), the regex (matched against the whole output,
    as `re.fullmatch`), the EBNF grammar with a `root` rule (xgrammar's GBNF dialect), the
    structural tag as JSON text, or "" for json_object.
    """

    kind: GrammarKind
    text: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, GrammarKind):
            object.__setattr__(self, "kind", GrammarKind(self.kind))
        if not isinstance(self.text, str):
            raise TypeError(f"GrammarSpec.text must be str, got {type(self.text).__name__}")

    @property
    def key(self) -> tuple[str, str]:
        """The compile-cache key."""
        return (self.kind.value, self.text)


def spec_from_request(*, response_format: dict[str, Any] | None = None, regex: str | None = None,
                      ebnf: str | None = None, json_schema: str | dict[str, Any] | None = None,
                      structural_tag: str | dict[str, Any] | None = None) -> GrammarSpec | None:
    """Map a request's constraint fields onto one spec (None: unconstrained).

    response_format: the OpenAI object ({"type": "text" | "json_object" | "json_schema" |
    "structural_tag", ...}); `json_schema.schema` is required for type json_schema.
    regex / ebnf / json_schema / structural_tag: SGLang's sampling-parameter extensions.
    Raises GrammarError on a malformed response_format or when two constraints are given.
    """
    found: list[tuple[str, GrammarSpec]] = []
    if response_format is not None:
        spec = _spec_from_response_format(response_format)
        if spec is not None:
            found.append(("response_format", spec))
    for name, value, kind in (("regex", regex, GrammarKind.REGEX), ("ebnf", ebnf, GrammarKind.EBNF),
                              ("json_schema", json_schema, GrammarKind.JSON_SCHEMA),
                              ("structural_tag", structural_tag, GrammarKind.STRUCTURAL_TAG)):
        if value is not None:
            limit = MAX_JSON_DEPTH + (TAG_LEVELS if kind is GrammarKind.STRUCTURAL_TAG else 0)
            text = value if isinstance(value, str) else dumps_checked(value, name, limit)
            found.append((name, GrammarSpec(kind, text)))
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise GrammarError(f"only one output constraint may be set per request, got {names}")
    return found[0][1] if found else None


def dumps_checked(value: Any, what: str, limit: int = MAX_JSON_DEPTH, **kwargs: Any) -> str:
    """`json.dumps(value, **kwargs)` of a grammar's JSON (schema, structural tag, tool parameters);
    `limit` MAX_JSON_DEPTH for a schema, plus TAG_LEVELS for a structural tag around schemas.

    Raises:
        GrammarError: value nests deeper than `limit` (json.dumps would hit Python's recursion limit
            near 500 levels; jsonschema and the grammar compiler recurse too)."""
    depth = json_depth(value)
    if depth > limit:
        raise GrammarError(f"{what} nests {depth} levels deep; at most {limit} are supported")
    return json.dumps(value, **kwargs)


def _spec_from_response_format(rf: dict[str, Any]) -> GrammarSpec | None:
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise GrammarError("response_format must be an object with a string 'type'")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec(GrammarKind.JSON_OBJECT)
    if kind == "json_schema":
        inner = rf.get("json_schema")
        if not isinstance(inner, dict) or "schema" not in inner:
            raise GrammarError("response_format json_schema needs "
                               "'json_schema': {'name': ..., 'schema': {...}}")
        schema = inner["schema"]
        return GrammarSpec(GrammarKind.JSON_SCHEMA,
                           schema if isinstance(schema, str) else dumps_checked(schema, "the JSON schema"))
    if kind == "structural_tag":
        return GrammarSpec(GrammarKind.STRUCTURAL_TAG,
                           dumps_checked(rf, "the structural tag", MAX_JSON_DEPTH + TAG_LEVELS))
    raise GrammarError(f"response_format type {kind!r} is not one of text, json_object, json_schema, "
                       "structural_tag")


def validate_spec(spec: GrammarSpec) -> str:
    """Check a spec without a tokenizer; return the text to hand to xgrammar for its kind.

    For regex the returned text has `.` narrowed to `[^\\n]` (Python's meaning, which xgrammar's
    `.` does not follow); for structural tags, JSON contents get the whitespace bound. The check
    ends by building xgrammar's (tokenizer-free) grammar, so every xgrammar parse error is caught
    here too. Raises GrammarError with a one-line message.
    """
    import xgrammar as xgr

    kind = spec.kind
    try:
        if kind is GrammarKind.JSON_OBJECT:
            return JSON_OBJECT_SCHEMA
        if kind is GrammarKind.JSON_SCHEMA:
            schema = parse_json(spec.text, "JSON schema")
            dumps_checked(schema, "the JSON schema")  # the depth limit for schemas sent as strings
            check_json_schema(schema)
            xgr.Grammar.from_json_schema(spec.text, any_whitespace=JSON_ANY_WHITESPACE)
            return spec.text
        if kind is GrammarKind.REGEX:
            check_regex(spec.text, where="regex")
            text = dot_excludes_newline(spec.text)
            xgr.Grammar.from_regex(text)
            return text
        if kind is GrammarKind.EBNF:
            if not spec.text.strip():
                raise GrammarError("EBNF grammar is empty")
            xgr.Grammar.from_ebnf(spec.text)
            return spec.text
        text = _prepare_structural_tag(spec.text)
        xgr.Grammar.from_structural_tag(text)
        return text
    except GrammarError:
        raise
    except (RuntimeError, ValueError, TypeError) as e:
        raise GrammarError(f"invalid {kind.value}: {xgrammar_message(e)}") from None


def _prepare_structural_tag(text: str) -> str:
    """Parse a structural tag (xgrammar's {"type": "structural_tag", "format": {...}} or SGLang's
    legacy {"structures": [{"begin", "schema", "end"}], "triggers": [...]}), check every JSON
    schema inside, bound the whitespace of JSON contents, and return xgrammar's form as JSON."""
    tag = parse_json(text, "structural tag")
    dumps_checked(tag, "the structural tag", MAX_JSON_DEPTH + TAG_LEVELS)  # for tags sent as strings
    if not isinstance(tag, dict):
        raise GrammarError("structural tag must be a JSON object")
    if "structures" in tag:
        structures, triggers = tag.get("structures"), tag.get("triggers")
        if not isinstance(structures, list) or not isinstance(triggers, list) or not all(
                isinstance(s, dict) and {"begin", "schema", "end"} <= s.keys() for s in structures):
            raise GrammarError("legacy structural tag needs 'structures': [{'begin', 'schema', 'end'}] "
                               "and 'triggers': [...]")
        tags = [{"type": "tag", "begin": s["begin"], "end": s["end"],
                 "content": {"type": "json_schema", "json_schema": s["schema"]}} for s in structures]
        tag = {"type": "structural_tag",
               "format": {"type": "triggered_tags", "triggers": triggers, "tags": tags}}
    if "format" not in tag:
        raise GrammarError("structural tag needs a 'format' object (or legacy 'structures' and 'triggers')")
    _walk_formats(tag["format"])
    return json.dumps(tag)


def _walk_formats(node: Any) -> None:
    """Check the JSON schemas of a structural-tag format tree in place and bound their whitespace."""
    if isinstance(node, list):
        for item in node:
            _walk_formats(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "json_schema" and "json_schema" in node:
        check_json_schema(node["json_schema"])
        node.setdefault("max_whitespace_cnt", STRUCTURAL_TAG_MAX_WHITESPACE)
    if node.get("type") == "regex" and isinstance(node.get("pattern"), str):
        check_regex(node["pattern"], where="structural tag regex")
    for value in node.values():
        if isinstance(value, (dict, list)):
            _walk_formats(value)

