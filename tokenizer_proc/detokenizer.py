"""Incremental detokenization that never emits a broken UTF-8 character.

Technique (the prefix-offset / read-offset scheme used by text-generation-inference and vLLM):
decoding a single token in isolation loses context (SentencePiece drops a leading space, byte-level
BPE splits multi-byte characters over tokens), so each step decodes a short window twice:

    ids:  [ ... | prefix_offset ......... read_offset ......... len(ids) ]
                 `-- already emitted text --'  `--- new tokens ---'

    prefix_text = decode(ids[prefix_offset:read_offset])
    new_text    = decode(ids[prefix_offset:])

and emits new_text[len(prefix_text):] only when it is longer and does not end in U+FFFD (the
replacement character a decoder produces for an incomplete UTF-8 sequence). Held-back tokens are
retried with the next token; `flush` emits whatever is left at the end of the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REPLACEMENT_CHAR = "\ufffd"


def decode(tokenizer: Any, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """The one decode call used everywhere, so incremental and full decodes agree."""
    return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens,
                            clean_up_tokenization_spaces=False)


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas.

    Invariant: "".join(all deltas returned by add() and flush()) == decode(all ids), for tokenizers whose
    decode of a window starting at a token boundary is a suffix-stable continuation (byte-level BPE,
    SentencePiece with byte fallback).
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return decode(self.tokenizer, ids, self.skip_special_tokens)

    def add(self, token_ids: Sequence[int]) -> str:
        """Append new token ids; return the text that is now complete ("" while a character is partial)."""
        self.ids.extend(int(t) for t in token_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = new_text[len(prefix_text):]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return delta

    def flush(self) -> str:
        """Text still held back (possibly ending in U+FFFD if the model emitted invalid UTF-8)."""
        if self.read_offset == len(self.ids):
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return new_text[len(prefix_text):]
