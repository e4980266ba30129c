"""JSON-schema checks: valid per the metaschema, and only keywords xgrammar 0.2.8 enforces.

A keyword xgrammar ignores would give output that looks constrained but is not, so such a schema
is refused with the keyword and its JSON pointer in the message. Measured on xgrammar 0.2.8 (a
violating instance accepted by the compiled grammar, see tests/constrained/test_schema_check.py):

- ignored, refused here: `not`, `if`/`then`/`else`, `dependentRequired`, `dependentSchemas`,
  `dependencies`, `uniqueItems: true`, `contains`/`minContains`/`maxContains`, `multipleOf` on
  non-integers, `allOf` with more than one subschema, `oneOf` whose branches can overlap (enforced as
  anyOf), `$ref` to anything but a local "#..." pointer, `$ref` beside other validation keywords,
  `$dynamicRef`/`$recursiveRef`, `content*`, `format` values outside `ENFORCED_FORMATS`, and the
  OpenAPI `nullable` (use `"type": [T, "null"]`);
- enforced: type, enum, const, properties, required, additionalProperties, patternProperties,
  propertyNames, unevaluatedProperties, min/maxProperties, items, prefixItems, unevaluatedItems,
  min/maxItems, min/maxLength, pattern, minimum/maximum and their exclusive forms, multipleOf on
  integers, anyOf, oneOf over disjoint branches, single-subschema allOf, local $ref/$defs.

Two stricter-than-the-standard behaviours stay (output still validates): objects without
`additionalProperties` get no extra keys (xgrammar's strict mode), and `pattern` must match the
whole string rather than a substring.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from radixrt.constrained.errors import GrammarError
from radixrt.constrained.regex_check import check_regex

ENFORCED_FORMATS = frozenset({
    "date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri",
    "uri-reference", "uri-template", "json-pointer", "relative-json-pointer", "uuid",
})
_UNENFORCED = {
    "not": "'not' is not enforced",
    "if": "'if'/'then'/'else' is not enforced", "then": "'if'/'then'/'else' is not enforced",
    "else": "'if'/'then'/'else' is not enforced",
    "dependentRequired": "'dependentRequired' is not enforced",
    "dependentSchemas": "'dependentSchemas' is not enforced",
    "dependencies": "'dependencies' is not enforced",
    "contains": "'contains' is not enforced", "minContains": "'minContains' is not enforced",
    "maxContains": "'maxContains' is not enforced",
    "$dynamicRef": "'$dynamicRef' is not supported", "$recursiveRef": "'$recursiveRef' is not supported",
    "contentEncoding": "'contentEncoding' is not enforced",
    "contentMediaType": "'contentMediaType' is not enforced",
    "contentSchema": "'contentSchema' is not enforced",
    "nullable": "'nullable' (OpenAPI) is not JSON Schema; use \"type\": [..., \"null\"]",
}
# Keywords with no effect on validation: allowed beside $ref.
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
    "$schema", "$id", "$anchor", "$defs", "definitions", "discriminator",
})
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SCHEMA_VALUES = ("additionalProperties", "unevaluatedProperties", "propertyNames", "items",
                  "unevaluatedItems")


def parse_json(text: str, what: str) -> Any:
    """json.loads with a one-line GrammarError naming `what` and the position."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        raise GrammarError(f"{what} is not valid JSON: {e}") from None
    except RecursionError:
        raise GrammarError(f"{what} nests too deeply") from None


def check_json_schema(schema: Any) -> None:
    """Refuse a schema that is invalid per its metaschema (Draft 2020-12 unless `$schema` names
    another) or uses a keyword xgrammar 0.2.8 does not enforce. Raises GrammarError."""
    import jsonschema

    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"JSON schema must be an object or a boolean, got {type(schema).__name__}")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = _pointer(list(e.path))
        raise GrammarError(f"invalid JSON schema at {where}: {e.message}") from None
    for path, node in _subschemas(schema, []):
        _check_node(schema, node, path)


def _subschemas(node: Any, path: list[str | int]) -> Iterator[tuple[list[str | int], dict[str, Any]]]:
    """Every object subschema with its path from the root (booleans have no keywords)."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                yield from _subschemas(sub, [*path, key, name])
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield from _subschemas(sub, [*path, key, i])
    for key in _SCHEMA_VALUES:
        if key in node:
            yield from _subschemas(node[key], [*path, key])


def _check_node(root: Any, node: dict[str, Any], path: list[str | int]) -> None:
    where = _pointer(path)
    for key, why in _UNENFORCED.items():
        if key in node:
            raise GrammarError(f"JSON schema keyword at {_pointer([*path, key])}: {why} "
                               "by the grammar engine")
    if node.get("uniqueItems") is True:
        raise GrammarError(f"JSON schema keyword at {where}/uniqueItems: 'uniqueItems' is not enforced "
                           "by the grammar engine")
    if "format" in node and node["format"] not in ENFORCED_FORMATS:
        raise GrammarError(f"JSON schema at {where}: format {node['format']!r} is not enforced "
                           f"(enforced: {', '.join(sorted(ENFORCED_FORMATS))})")
    if "multipleOf" in node and node.get("type") != "integer":
        raise GrammarError(f"JSON schema at {where}: 'multipleOf' is enforced only with "
                           "\"type\": \"integer\"")
    if len(node.get("allOf", [])) > 1:
        raise GrammarError(f"JSON schema at {where}: 'allOf' with more than one subschema is not enforced; "
                           "merge them into one schema")
    if "$ref" in node:
        _check_ref(node, where)
    if "oneOf" in node and not _disjoint(root, node["oneOf"]):
        raise GrammarError(f"JSON schema at {where}: 'oneOf' branches may overlap and would be enforced "
                           "as 'anyOf'; use 'anyOf', or give each branch a required property with a "
                           "distinct 'const'")
    if isinstance(node.get("pattern"), str):
        check_regex(node["pattern"], where=f"pattern at {where}")
    for name in node.get("patternProperties", {}) if isinstance(node.get("patternProperties"), dict) else ():
        check_regex(name, where=f"patternProperties key at {where}")


def _check_ref(node: dict[str, Any], where: str) -> None:
    ref = node["$ref"]
    if not (ref == "#" or ref.startswith("#/")):
        raise GrammarError(f"JSON schema at {where}: $ref {ref!r} is not supported (only local '#/...' "
                           "references, e.g. '#/$defs/Name')")
    extra = sorted(k for k in node if k != "$ref" and k not in _ANNOTATIONS)
    if extra:
        raise GrammarError(f"JSON schema at {where}: keywords beside $ref are not enforced "
                           f"({', '.join(extra)}); move them into the referenced schema")


def _disjoint(root: Any, branches: list[Any]) -> bool:
    """True when no JSON value can match two branches: distinct single types (integer and number
    overlap), or a property every branch requires whose const/enum values are pairwise disjoint."""
    resolved = [_resolve(root, b) for b in branches]
    if not all(isinstance(b, dict) for b in resolved):
        return False
    types = [b.get("type") for b in resolved]
    if all(isinstance(t, str) for t in types):
        norm = ["number" if t == "integer" else t for t in types]
        if len(set(norm)) == len(norm):
            return True
    common = set.intersection(*(set(b.get("required", [])) for b in resolved)) if resolved else set()
    for prop in sorted(common):
        values = [_allowed_values(root, b, prop) for b in resolved]
        if all(v is not None for v in values) and _pairwise_disjoint(values):  # type: ignore[arg-type]
            return True
    return False


def _pairwise_disjoint(sets: list[set[str]]) -> bool:
    seen: set[str] = set()
    for s in sets:
        if s & seen:
            return False
        seen |= s
    return True


def _allowed_values(root: Any, branch: dict[str, Any], prop: str) -> set[str] | None:
    sub = _resolve(root, branch.get("properties", {}).get(prop))
    if not isinstance(sub, dict):
        return None
    if "const" in sub:
        return {json.dumps(sub["const"], sort_keys=True)}
    if isinstance(sub.get("enum"), list):
        return {json.dumps(v, sort_keys=True) for v in sub["enum"]}
    return None


def _resolve(root: Any, node: Any, hops: int = 8) -> Any:
    """Follow local $refs (at most `hops`) to the schema they name; None when one does not resolve."""
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and hops > 0:
        ref, target = node["$ref"], root
        if not ref.startswith("#"):
            return None
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, dict) else None
        node, hops = target, hops - 1
    return node


def _pointer(path: list[str | int]) -> str:
    """A JSON pointer ("#/properties/a/items") for a path from the root."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return "#" + "".join("/" + p for p in parts) if parts else "#"
