"""Stop strings: matched across feeds, never leaked, trimmed; partial matches held back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from radixrt.tokenizer_proc.stop import StopMatcher


def test_stop_split_across_feeds_is_trimmed() -> None:
    m = StopMatcher(["STOP"])
    out = [m.feed(x) for x in ["Hel", "lo S", "T", "OP and more"]]
    assert out == ["Hel", "lo ", "", ""]
    assert m.matched == "STOP"
    assert m.feed("later") == "" and m.flush() == ""


def test_partial_match_held_then_released() -> None:
    m = StopMatcher(["</end>"])
    assert m.feed("abc </e") == "abc "
    assert m.feed("x") == "</ex"
    assert m.flush() == ""
    assert m.feed("tail </") == "tail "
    assert m.flush() == "</"
    assert m.matched is None


def test_earliest_stop_wins() -> None:
    m = StopMatcher(["world", "lo w"])
    assert m.feed("hello world") == "hel"
    assert m.matched == "lo w"


def test_no_stops_passes_through() -> None:
    m = StopMatcher([])
    assert m.feed("abc") == "abc" and m.flush() == ""


@given(text=st.text(alphabet="abXY😀 ", max_size=40), stop=st.text(alphabet="abXY😀", min_size=1, max_size=4),
       cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=10))
def test_matches_reference(text: str, stop: str, cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    m = StopMatcher([stop])
    emitted = ""
    for a, b in zip(bounds, bounds[1:], strict=False):
        piece = m.feed(text[a:b])
        emitted += piece
        assert stop not in emitted
    emitted += m.flush()
    pos = text.find(stop)
    assert emitted == (text if pos == -1 else text[:pos])
    assert m.matched == (None if pos == -1 else stop)
