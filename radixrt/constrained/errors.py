"""The one error type of radixrt.constrained, and the clean-up of xgrammar's messages."""

from __future__ import annotations

import re

# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: "; the rest is the message.
_LOG_PREFIX = re.compile(r"^\s*\[[0-9:.]+\]\s+\S+?:\d+:\s*")


class GrammarError(ValueError):
    """A grammar the engine refuses: malformed, invalid, or asking for what xgrammar cannot enforce.

    The message is one line and names the problem (and, for a JSON schema, the JSON pointer of the
    keyword), fit for an HTTP 400 body.
    """

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def one_line(text: str) -> str:
    """Collapse whitespace runs that contain newlines into one space."""
    return re.sub(r"\s*\n\s*", " ", str(text)).strip()


def xgrammar_message(exc: BaseException) -> str:
    """The useful part of an exception raised by xgrammar: its first non-empty line, without the
    C++ log prefix (time stamp and source location)."""
    for line in str(exc).splitlines():
        line = _LOG_PREFIX.sub("", line).strip()
        if line and not line.startswith("Stack trace"):
            return line
    return type(exc).__name__
