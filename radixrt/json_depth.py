"""Nesting depth of parsed JSON, and the deepest schema, tag or tool definition radixrt takes.

A dependency-free module: the grammar specs (radixrt/constrained/spec.py) and the front end's request
checks (tokenizer_proc/json_limits.py, tool_protocol.py) share it, and the launcher imports the latter
through radixrt.config without pulling torch or the grammar stack.
"""

from __future__ import annotations

from typing import Any

# Nesting of a JSON schema or a tool's parameters; far above any real one. jsonschema's checks and
# xgrammar's compiler recurse per level: schemas of ~117 `items` levels raised Python's recursion
# error inside them (a 400 quoting it; break-it pass of 2026-12-05, when this was 128).
MAX_JSON_DEPTH = 64
TAG_LEVELS = 8  # the levels a structural tag adds around the schemas it holds (tool calls' tags: 4)


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar 0, [] or {} 1, [[1]] 2), computed without
    recursion, one nesting level at a time; a container's scalars are skipped in one comprehension
    (a list of 100,000 token ids costs ~2 ms). Also the front end's body check
    (tokenizer_proc/json_limits.py)."""
    depth, level = 0, [value] if type(value) is dict or type(value) is list else []
    while level:  # the containers at nesting `depth + 1`
        depth += 1
        nxt: list[Any] = []
        for v in level:
            items = v.values() if type(v) is dict else v
            nxt.extend([x for x in items if type(x) is dict or type(x) is list])
        level = nxt
    return depth
