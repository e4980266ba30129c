"""Token strings and bytes for logprobs, and the two OpenAI logprobs shapes (chat and completions).

A token's exact bytes come from the tokenizer's vocabulary: byte-level BPE pieces map back through the
GPT-2 byte<->unicode table, SentencePiece byte-fallback pieces look like "<0xE4>", "▁" is a space.
A token that is not valid UTF-8 on its own is shown as "bytes:\\xe4\\xb8" (as OpenAI does).
"""

from __future__ import annotations

import codecs
import re
from functools import lru_cache
from typing import Any

from .request_state import TokenLogprob

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode table (printable bytes map to themselves, others shifted)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and "ByteLevel" in str(getattr(backend, "decoder", ""))


def _skipped_ids(tokenizer: Any) -> frozenset[int]:
    """The ids decode(..., skip_special_tokens=True) leaves out: the special tokens, and the added
    tokens marked special (SmolLM2's <file_sep>, <jupyter_*>, ... are not in all_special_ids)."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(i for i, tok in added.items() if getattr(tok, "special", False))
    return frozenset(ids)


class TokenTexts:
    """Cached id -> (display string, exact bytes) for one tokenizer; `special_ids` the ids that
    decoding with skip_special_tokens leaves out."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.byte_level = _is_byte_level(tokenizer)
        self.special_ids = _skipped_ids(tokenizer)
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._compute(token_id)
        return hit

    def _compute(self, token_id: int) -> tuple[str, list[int]]:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        raw: bytes | None = None
        if isinstance(piece, str):
            table = _unicode_to_byte()
            if self.byte_level and all(ch in table for ch in piece):
                raw = bytes(table[ch] for ch in piece)
            elif m := _BYTE_PIECE.match(piece):
                raw = bytes([int(m.group(1), 16)])
        if raw is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            raw = (piece.replace("▁", " ") if isinstance(piece, str) and "\ufffd" in text else text).encode()
        try:
            return raw.decode("utf-8"), list(raw)
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)


def chat_logprobs(texts: TokenTexts, lps: list[TokenLogprob]) -> list[dict[str, Any]]:
    """The `choices[i].logprobs.content` list of a chat completion."""
    out = []
    for lp in lps:
        tok, raw = texts.get(lp.token_id)
        top = []
        for tid, val in lp.top:
            ttok, traw = texts.get(tid)
            top.append({"token": ttok, "logprob": val, "bytes": traw})
        out.append({"token": tok, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top})
    return out


class CompletionLogprobs:
    """Accumulates the legacy completions `logprobs` object.

    The object: {tokens, token_logprobs, top_logprobs, text_offset}. text_offset[i] is the position in
    the choice's `text` (characters) where token i starts: the characters its bytes complete are
    counted after it (a character split across byte tokens starts at the first of them), and a
    special token the text leaves out (skip_special_tokens) takes no room, so every offset is at most
    len(text).
    """

    def __init__(self, texts: TokenTexts, text_offset: int = 0, skip_special: bool = True) -> None:
        self.texts = texts
        self.offset = text_offset
        self.skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []

    def add_prompt(self, ids: list[int], skip_special: bool | None = None) -> None:
        """Echoed prompt tokens: OpenAI reports null logprobs for them (nothing is computed here).
        skip_special: whether the echoed text leaves out special tokens (None: as the completion)."""
        skip = self.skip_special if skip_special is None else skip_special
        for tid in ids:
            self._push(tid, None, None, skip)

    def add(self, lps: list[TokenLogprob]) -> None:
        for lp in lps:
            self._push(lp.token_id, lp.logprob,
                       {self.texts.get(t)[0]: v for t, v in lp.top} if lp.top else {}, self.skip_special)

    def _push(self, tid: int, lp: float | None, top: dict[str, float] | None, skip_special: bool) -> None:
        tok, raw = self.texts.get(tid)
        self.tokens.append(tok)
        self.token_logprobs.append(lp)
        self.top_logprobs.append(top)
        self.text_offset.append(self.offset)
        if not (skip_special and tid in self.texts.special_ids):
            self.offset += len(self._utf8.decode(bytes(raw)))

    def take(self) -> dict[str, Any]:
        """The accumulated object; resets the lists (for streaming deltas) but keeps the text offset."""
        out = {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
               "top_logprobs": self.top_logprobs, "text_offset": self.text_offset}
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []
        return out
