"""Stop strings matched across token boundaries, with hold-back of text that may start a stop string.

The scheduler only sees token ids (EOS, stop_token_ids); stop *strings* are matched here, on the
detokenized text. Text is held back while its tail could still be the beginning of a stop string, so
that a client never receives part of a stop string that is later trimmed.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feeds text deltas, returns the text that is safe to emit, and reports the first stop match.

    Output is everything before the earliest stop-string occurrence; the stop string itself and all
    later text are dropped. After a match every further `feed` returns "".
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.max_stop_len = max((len(s) for s in self.stops), default=0)
        self.pending = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add `text`; return what can be emitted now. Sets `matched` when a stop string appears."""
        if self.matched is not None:
            return ""
        if not self.stops:
            return text
        buf = self.pending + text
        hit_pos, hit = -1, None
        for s in self.stops:
            pos = buf.find(s)
            if pos != -1 and (hit_pos == -1 or pos < hit_pos):
                hit_pos, hit = pos, s
        if hit is not None:
            self.matched = hit
            self.pending = ""
            return buf[:hit_pos]
        keep = self._partial_len(buf)
        self.pending = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def _partial_len(self, buf: str) -> int:
        """Length of the longest tail of `buf` that is a proper prefix of some stop string."""
        for n in range(min(len(buf), self.max_stop_len - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def flush(self) -> str:
        """At the end of the request: the held-back text (it never became a stop string)."""
        out, self.pending = self.pending, ""
        return "" if self.matched is not None else out
