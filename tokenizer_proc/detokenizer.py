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

import functools
from collections.abc import Callable, Sequence
from typing import Any

REPLACEMENT_CHAR = "\ufffd"


def decode(tokenizer: Any, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """The one decode call used everywhere, so incremental and full decodes agree."""
    return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens,
                            clean_up_tokenization_spaces=False)


def _backend_decode_is_equivalent(tokenizer: Any) -> bool:
    """True when `decode(..., clean_up_tokenization_spaces=False)` is exactly the Rust tokenizer's
    decode: transformers' TokenizersBackend (or PreTrainedTokenizerFast) with its own decode/_decode."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not callable(getattr(backend, "decode", None)):
        return False
    return _is_plain_fast_class(type(tokenizer))


@functools.cache
def _is_plain_fast_class(cls: type) -> bool:
    """`cls` is transformers' Rust-backed tokenizer class, or a subclass keeping its decode and _decode
    (answered once per class: make_decoder runs once per sample)."""
    try:
        from transformers import tokenization_utils_base as base
        from transformers import tokenization_utils_tokenizers as fast
    except ImportError:
        return False
    fast_cls = getattr(fast, "TokenizersBackend", None) or getattr(fast, "PreTrainedTokenizerFast", None)
    return (fast_cls is not None and issubclass(cls, fast_cls)
            and getattr(cls, "_decode", None) is getattr(fast_cls, "_decode", None)
            and getattr(cls, "decode", None) is getattr(base.PreTrainedTokenizerBase, "decode", None))


def make_decoder(tokenizer: Any, skip_special_tokens: bool = True) -> Callable[[list[int]], str]:
    """`ids -> text`, equal to `decode(tokenizer, ids, skip_special_tokens)` but without transformers'
    per-call Python overhead when that is provably the Rust tokenizer's decode (about 3x cheaper)."""
    if _backend_decode_is_equivalent(tokenizer):
        backend_decode = tokenizer._tokenizer.decode

        def fast(ids: list[int]) -> str:
            return backend_decode(ids, skip_special_tokens=skip_special_tokens)
        return fast

    def slow(ids: list[int]) -> str:
        return decode(tokenizer, ids, skip_special_tokens)
    return slow


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
        self._decode = make_decoder(tokenizer, skip_special_tokens)
        self._prefix_key = (-1, -1)
        self._prefix_text = ""

    def _prefix(self) -> str:
        """decode(ids[prefix_offset:read_offset]), cached while the offsets stay (text held back)."""
        key = (self.prefix_offset, self.read_offset)
        if key != self._prefix_key:
            self._prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
            self._prefix_key = key
        return self._prefix_text

    def add(self, token_ids: Sequence[int]) -> str:
        """Append new token ids; return the text that is now complete ("" while a character is partial)."""
        self.ids.extend(token_ids if isinstance(token_ids, list) else [int(t) for t in token_ids])
        prefix_text = self._prefix()
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
        prefix_text = self._prefix()
        new_text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return new_text[len(prefix_text):]
