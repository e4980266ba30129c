"""Incremental detokenization: never a broken UTF-8 character, and increments join to the full decode."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.tokenizer_proc.detokenizer import IncrementalDetokenizer, decode

TEXTS = [
    "héllo 😀 世界",
    "Emoji run: 🇫🇷👨‍👩‍👧‍👦🎉 done",
    "日本語のテキストと中文混合。",
    "  leading spaces\n\tand tabs\r\n",
    "ünïcödé ∑∫√ ≠ ≤ math",
]


def _deltas(tokenizer: Any, ids: list[int], step: int = 1) -> list[str]:
    d = IncrementalDetokenizer(tokenizer)
    out = [d.add(ids[i:i + step]) for i in range(0, len(ids), step)]
    out.append(d.flush())
    return out


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_never_breaks_utf8(tokenizer: Any, text: str) -> None:
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    deltas = _deltas(tokenizer, ids)
    assert all("\ufffd" not in d for d in deltas), deltas
    assert "".join(deltas) == decode(tokenizer, ids) == text


def test_multibyte_character_split_over_tokens_is_held_back(tokenizer: Any) -> None:
    ids = list(tokenizer.encode("a😀", add_special_tokens=False))
    assert len(ids) >= 3, "the emoji should take several byte-level tokens"
    d = IncrementalDetokenizer(tokenizer)
    seen = [d.add([t]) for t in ids]
    assert seen[0] == "a"
    assert all(s == "" for s in seen[1:-1])
    assert seen[-1] == "😀"


def test_invalid_utf8_at_the_end_is_flushed(tokenizer: Any) -> None:
    ids = list(tokenizer.encode("x😀", add_special_tokens=False))[:-1]  # cut inside the emoji
    d = IncrementalDetokenizer(tokenizer)
    text = "".join(d.add([t]) for t in ids)
    assert text == "x"
    assert d.flush().endswith("\ufffd")


def test_special_tokens_skipped(tokenizer: Any) -> None:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = list(tokenizer.encode("Hi", add_special_tokens=False)) + [eos]
    assert "".join(_deltas(tokenizer, ids)) == "Hi"
    keep = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert keep.add(ids) + keep.flush() == "Hi<|im_end|>"


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(st.sampled_from(TEXTS + ["a", " ", "€", "🙂🙃", "\n"]), min_size=1, max_size=6),
       step=st.integers(min_value=1, max_value=4))
def test_joined_increments_equal_full_decode(tokenizer: Any, parts: list[str], step: int) -> None:
    ids = list(tokenizer.encode("".join(parts), add_special_tokens=False))
    deltas = _deltas(tokenizer, ids, step)
    assert "".join(deltas) == decode(tokenizer, ids)
    assert all("\ufffd" not in d for d in deltas)


def test_fast_decoder_equals_the_transformers_decode(tokenizer: Any) -> None:
    import random

    from radixrt.tokenizer_proc.detokenizer import _backend_decode_is_equivalent, make_decoder

    assert _backend_decode_is_equivalent(tokenizer)  # the default model takes the fast path
    rng = random.Random(0)
    specials = list(tokenizer.all_special_ids)
    for skip in (True, False):
        fast = make_decoder(tokenizer, skip)
        for _ in range(200):
            ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(0, 6))]
            ids += rng.sample(specials, k=min(1, len(specials)))
            assert fast(ids) == decode(tokenizer, ids, skip)


def test_other_tokenizers_take_the_generic_path() -> None:
    from radixrt.tokenizer_proc.detokenizer import make_decoder

    class Tok:
        def decode(self, ids: list[int], skip_special_tokens: bool = True,
                   clean_up_tokenization_spaces: bool = False) -> str:
            return "".join(chr(97 + i) for i in ids)

    assert make_decoder(Tok())([0, 1, 2]) == "abc"
