"""A request's output constraint -> the one grammar its samples are decoded under, checked at the edge.

Chat and completions carry `response_format` and SGLang's `regex` / `ebnf` / `json_schema`
(openai_protocol.ConstraintFields); chat also carries the tool grammar of tool_grammar.plan_tools.
Everything is validated here with radixrt.constrained.validate_spec, so a malformed schema, regex,
EBNF or tool schema is a 400 naming its parameter before anything reaches the scheduler, which
compiles the same (kind, text) again from GenerateReq.grammar_kind / grammar_text.
"""

from __future__ import annotations

from typing import Any

from radixrt.constrained.errors import GrammarError
from radixrt.constrained.spec import GrammarSpec, spec_from_request, validate_spec

from .errors import bad_request
from .openai_protocol import ConstraintFields
from .tool_grammar import ToolPlan
from .tool_protocol import ToolFields

_FIELDS = ("response_format", "regex", "ebnf", "json_schema")


def _set_fields(req: ConstraintFields) -> list[str]:
    out = []
    for name in _FIELDS:
        value = getattr(req, name)
        if value is None or (name == "response_format" and value.type == "text"):
            continue
        out.append(name)
    return out


def checked(spec: GrammarSpec, param: str) -> GrammarSpec:
    """`spec` once validate_spec accepts it.

    Raises:
        APIError: 400 with `param` and the grammar engine's one-line message.
    """
    try:
        validate_spec(spec)
    except GrammarError as e:
        raise bad_request(f"{param}: {e}", param=param) from None
    return spec


def constraint_grammar(req: ConstraintFields) -> GrammarSpec | None:
    """The grammar of `response_format` / `regex` / `ebnf` / `json_schema`; None when none is set.

    Raises:
        APIError: 400 when two are set (param: the second one) or the one set is invalid (its name).
    """
    names = _set_fields(req)
    if not names:
        return None
    if len(names) > 1:
        raise _two_constraints(names, "")
    param = names[0]
    rf = req.response_format.as_dict() if req.response_format is not None else None
    try:
        spec = spec_from_request(response_format=rf, regex=req.regex, ebnf=req.ebnf,
                                 json_schema=req.json_schema)
    except GrammarError as e:
        raise bad_request(f"{param}: {e}", param=param) from None
    return checked(spec, param) if spec is not None else None


def _two_constraints(names: list[str], prefix: str) -> Exception:
    return bad_request(f"{prefix}{names[1]}: only one output constraint may be set per request, got "
                       f"{', '.join(names)}", param=prefix + names[1])


GENERATE_KEYS = ("regex", "ebnf", "json_schema")  # SGLang's names in /generate's sampling_params


def generate_grammar(sampling_params: dict[str, Any]) -> tuple[dict[str, Any], GrammarSpec | None]:
    """/generate: split SGLang's `regex` / `ebnf` / `json_schema` (each a string) out of
    `sampling_params`; returns (the other sampling keys, the checked grammar or None).

    Raises:
        APIError: 400 naming `sampling_params.<key>` when a value is not a string, two are set, or
            the grammar is invalid (the same checks and messages as chat and completions).
    """
    rest = {k: v for k, v in sampling_params.items() if k not in GENERATE_KEYS}
    names = [k for k in GENERATE_KEYS if sampling_params.get(k) is not None]
    for name in names:
        if not isinstance(sampling_params[name], str):
            raise bad_request(f"sampling_params.{name}: must be a string", param=f"sampling_params.{name}")
    if len(names) > 1:
        raise _two_constraints(names, "sampling_params.")
    if not names:
        return rest, None
    param = f"sampling_params.{names[0]}"
    try:
        spec = spec_from_request(**{names[0]: sampling_params[names[0]]})
    except GrammarError as e:
        raise bad_request(f"{param}: {e}", param=param) from None
    return rest, checked(spec, param) if spec is not None else None


def chat_grammar(req: ConstraintFields, tools: ToolFields, plan: ToolPlan) -> GrammarSpec | None:
    """The one grammar of a chat request.

    The tool grammar wins for tool_choice "required" or a named function (the output must be calls);
    otherwise the response_format / regex / ebnf / json_schema grammar, and failing that the tool
    grammar of "auto" with a strict tool (its calls are constrained once they start).

    Raises:
        APIError: 400 as constraint_grammar; 400 on `tools` when a tool's schema cannot be enforced.
    """
    constraint = constraint_grammar(req)
    choice = tools.effective_tool_choice()
    forced = choice not in ("none", "auto")
    if plan.grammar is not None and (forced or constraint is None):
        return checked(GrammarSpec(plan.grammar.kind, plan.grammar.text), "tools")
    return constraint


def grammar_fields(spec: GrammarSpec | None) -> tuple[str | None, str]:
    """GenerateReq's (grammar_kind, grammar_text) for `spec` ((None, "") when unconstrained)."""
    return (None, "") if spec is None else (spec.kind.value, spec.text)

