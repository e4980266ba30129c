"""Regex checks: refuse what xgrammar 0.2.8 would silently mis-enforce, and fix the meaning of `.`.

xgrammar matches a regex against the whole output (like `re.fullmatch`). Measured on 0.2.8:
- errors (passed through as GrammarError): lookahead and lookbehind in a `regex` grammar,
  backreferences, word boundaries, `\\p{..}`, inline flags and named groups, `{,n}`;
- silently wrong, so refused here: lookaround inside a JSON-schema `pattern` (ignored there with a
  log warning), `^` or `$` where they are not at the start or end of an alternative (ignored),
  `\\A`, `\\Z`, `\\z`, `\\G` and other unknown letter escapes (matched as the literal letter);
- different meaning, so rewritten: `.` matches a newline in xgrammar but not in Python's `re`
  (nor in ECMA-262); `dot_excludes_newline` narrows it to `[^\\n]` for `regex` grammars.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from radixrt.constrained.errors import GrammarError

# Escapes of letters/digits that xgrammar 0.2.8 gives their usual meaning (\x.. and \u.... too).
_KNOWN_LETTER_ESCAPES = frozenset("ntrfv0dDwWsSxu")
_ANCHOR_ESCAPES = frozenset("AZzG")


@dataclass(frozen=True, slots=True)
class _Token:
    start: int
    end: int
    kind: str  # "escape" | "class" | "dot" | "open" | "close" | "alt" | "caret" | "dollar" | "other"
    depth: int  # group depth outside this token


def check_regex(pattern: str, *, where: str) -> None:
    """Refuse a regex that Python cannot compile or xgrammar would not enforce as written.

    where: what the pattern is, for the message ("regex", "pattern at #/properties/zip").
    Raises GrammarError.
    """
    try:
        re.compile(pattern)
    except re.error as e:
        raise GrammarError(f"{where} {pattern!r} is not a valid regex: {e}") from None
    tokens = list(_tokenize(pattern, where))
    for i, tok in enumerate(tokens):
        if tok.kind == "caret" and not _at_alternative_start(tokens, i):
            raise GrammarError(f"{where} {pattern!r}: '^' is supported only at the start of the regex "
                               "or of a top-level alternative")
        if tok.kind == "dollar" and not _at_alternative_end(tokens, i):
            raise GrammarError(f"{where} {pattern!r}: '$' is supported only at the end of the regex "
                               "or of a top-level alternative")


def dot_excludes_newline(pattern: str) -> str:
    """Rewrite each `.` outside a character class to `[^\\n]` (Python's `.` without re.DOTALL)."""
    out: list[str] = []
    for tok in _tokenize(pattern, "regex"):
        out.append("[^\\n]" if tok.kind == "dot" else pattern[tok.start:tok.end])
    return "".join(out)


def _tokenize(pattern: str, where: str) -> Iterator[_Token]:
    """Split a regex into the tokens the checks look at; raise on unsupported escapes and groups."""
    i, depth, n = 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            _check_escape(pattern, i, where, in_class=False)
            yield _Token(i, i + 2, "escape", depth)
            i += 2
        elif c == "[":
            end = _class_end(pattern, i, where)
            yield _Token(i, end, "class", depth)
            i = end
        elif c == "(":
            if pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
                raise GrammarError(f"{where} {pattern!r}: lookahead/lookbehind is not supported")
            if pattern.startswith("(?", i) and not pattern.startswith("(?:", i):
                raise GrammarError(f"{where} {pattern!r}: inline flags and named groups are not supported")
            yield _Token(i, i + 1, "open", depth)
            depth += 1
            i += 1
        else:
            if c == ")":
                depth -= 1
            kind = {")": "close", "|": "alt", "^": "caret", "$": "dollar", ".": "dot"}.get(c, "other")
            yield _Token(i, i + 1, kind, depth)
            i += 1


def _check_escape(pattern: str, i: int, where: str, *, in_class: bool) -> None:
    c = pattern[i + 1] if i + 1 < len(pattern) else ""
    if not c.isalnum() or c in _KNOWN_LETTER_ESCAPES or (in_class and c == "b"):
        return
    if c.isdigit():
        raise GrammarError(f"{where} {pattern!r}: backreferences are not supported")
    if c in "bB":
        raise GrammarError(f"{where} {pattern!r}: word boundaries (\\b, \\B) are not supported")
    if c in _ANCHOR_ESCAPES:
        raise GrammarError(f"{where} {pattern!r}: anchor \\{c} is not supported (use ^ and $)")
    raise GrammarError(f"{where} {pattern!r}: escape \\{c} is not supported")


def _class_end(pattern: str, i: int, where: str) -> int:
    """Index just past the character class that opens at pattern[i] == '['."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1  # a leading ']' is a literal
    while j < len(pattern) and pattern[j] != "]":
        if pattern[j] == "\\":
            _check_escape(pattern, j, where, in_class=True)
            j += 1
        j += 1
    return j + 1


def _at_alternative_start(tokens: list[_Token], i: int) -> bool:
    """True when nothing that consumes input can come before tokens[i] (only '(' or '^' since the
    start or since a top-level '|')."""
    for tok in reversed(tokens[:i]):
        if tok.kind == "alt" and tok.depth == 0:
            return True
        if tok.kind not in ("open", "caret"):
            return False
    return True


def _at_alternative_end(tokens: list[_Token], i: int) -> bool:
    """True when nothing that consumes input can come after tokens[i] (only ')' or '$' up to the
    end or to a top-level '|')."""
    for tok in tokens[i + 1:]:
        if tok.kind == "alt" and tok.depth == 0:
            return True
        if tok.kind not in ("close", "dollar"):
            return False
    return True
