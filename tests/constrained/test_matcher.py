"""RequestMatcher on the default model's tokenizer: acceptance, exact rollback, termination, and
the batch filler agreeing with per-row fills."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from radixrt.constrained import (
    BitmaskFiller,
    GrammarCompilerService,
    GrammarKind,
    GrammarSpec,
    RequestMatcher,
    allocate_bitmask,
)
from tests.constrained.conftest import random_walk

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "b": {"enum": ["x", "yz"]}}, "required": ["a", "b"]}


def _allowed(bitmask: np.ndarray, row: int, vocab_size: int) -> np.ndarray:
    bits = np.unpackbits(bitmask[row].view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)


@pytest.fixture(scope="module")
def compiled(service: GrammarCompilerService) -> Any:
    return service.compile_now(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA)))


def test_rollback_restores_masks_and_counts_exactly(service: GrammarCompilerService, tokenizer: Any,
                                                    compiled: Any) -> None:
    walk = random_walk(service, tokenizer, GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA)), seed=7)
    tokens = walk.token_ids
    matcher = RequestMatcher(compiled)
    bitmask = allocate_bitmask(1, service.vocab_size)
    masks = []
    for tok in tokens:
        matcher.fill_bitmask(bitmask, 0)
        masks.append(bitmask[0].copy())
        assert matcher.accept_token(tok)
    assert matcher.num_accepted == len(tokens) and matcher.is_completed and not matcher.is_terminated
    for k in (1, 3, len(tokens) // 2):
        matcher.rollback_to(len(tokens) - k)
        assert matcher.num_accepted == len(tokens) - k
        matcher.fill_bitmask(bitmask, 0)
        np.testing.assert_array_equal(bitmask[0], masks[len(tokens) - k])
        assert matcher.accept_tokens(tokens[len(tokens) - k:]) == k  # replay gives the same path
    # terminate, then roll back the stop token: the matcher is live again
    assert matcher.accept_token(service.stop_token_ids[0]) and matcher.is_terminated
    matcher.rollback(1)
    assert not matcher.is_terminated and matcher.num_accepted == len(tokens)
    with pytest.raises(ValueError, match="cannot roll back"):
        matcher.rollback(len(tokens) + 1)
    matcher.reset()
    assert matcher.num_accepted == 0
    matcher.fill_bitmask(bitmask, 0)
    np.testing.assert_array_equal(bitmask[0], masks[0])


def test_rejected_tokens_leave_state_unchanged(service: GrammarCompilerService, tokenizer: Any,
                                               compiled: Any) -> None:
    matcher = RequestMatcher(compiled)
    bitmask = allocate_bitmask(1, service.vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    before = bitmask[0].copy()
    allowed = set(_allowed(bitmask, 0, service.vocab_size).tolist())
    bad = next(i for i in range(service.vocab_size) if i not in allowed)
    assert not matcher.accept_token(bad)
    assert not matcher.accept_token(service.vocab_size + 5)  # out of range
    assert matcher.num_accepted == 0
    matcher.fill_bitmask(bitmask, 0)
    np.testing.assert_array_equal(bitmask[0], before)
    assert tokenizer.decode(sorted(allowed)[:1]).startswith("{")


def test_special_tokens_are_never_allowed(service: GrammarCompilerService, tokenizer: Any) -> None:
    matcher = RequestMatcher(service.compile_now(GrammarSpec(GrammarKind.REGEX, r"[^a]{1,20}")))
    bitmask = allocate_bitmask(1, service.vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    allowed = set(_allowed(bitmask, 0, service.vocab_size).tolist())
    specials = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    assert len(allowed) > 20000 and not (allowed & specials)  # "<|im_start|>" is no string content


def test_terminated_matcher_fills_stop_only_rows(service: GrammarCompilerService, tokenizer: Any) -> None:
    matcher = RequestMatcher(service.compile_now(GrammarSpec(GrammarKind.REGEX, "ok")))
    assert matcher.accept_tokens(tokenizer.encode("ok", add_special_tokens=False)) >= 1
    bitmask = allocate_bitmask(1, service.vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    assert _allowed(bitmask, 0, service.vocab_size).tolist() == service.stop_token_ids
    assert matcher.accept_token(service.stop_token_ids[0]) and matcher.is_terminated
    bitmask[:] = 0
    assert matcher.fill_bitmask(bitmask, 0)
    assert _allowed(bitmask, 0, service.vocab_size).tolist() == service.stop_token_ids
    assert not matcher.accept_token(service.stop_token_ids[0])


def test_stop_token_bits_cover_the_sign_bit() -> None:
    from radixrt.constrained.matcher import _bit

    for i in range(32):
        assert int(np.array([_bit(i)], dtype=np.int32).view(np.uint32)[0]) == 1 << i


def test_batch_filler_matches_per_row_fills(service: GrammarCompilerService, tokenizer: Any) -> None:
    specs = [GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA)),
            GrammarSpec(GrammarKind.REGEX, "(yes|no)"),
             GrammarSpec(GrammarKind.JSON_OBJECT), GrammarSpec(GrammarKind.REGEX, "a")]
    matchers = [RequestMatcher(service.compile_now(s)) for s in specs]
    assert matchers[1].accept_tokens(tokenizer.encode("ye", add_special_tokens=False)) >= 1
    matchers[3].accept_tokens([*tokenizer.encode("a", add_special_tokens=False), service.stop_token_ids[0]])
    assert matchers[3].is_terminated
    expected = allocate_bitmask(4, service.vocab_size)
    for i, m in enumerate(matchers):
        m.fill_bitmask(expected, i)
    for layout, threads_from in (("numpy", 1), ("torch", 1), ("numpy", 64)):
        got = allocate_bitmask(5, service.vocab_size)
        got[:] = 0
        target = got if layout == "numpy" else torch.from_numpy(got)
        BitmaskFiller(num_threads=2, min_rows_for_threads=threads_from).fill(matchers, target)
        np.testing.assert_array_equal(got[:4], expected)
        assert not got[4].any()  # rows past the matchers are untouched


@pytest.mark.parametrize("kind, text, prefix", [(GrammarKind.REGEX, "a[^\\s\\S]", "a"),
                                                (GrammarKind.EBNF, "root ::= root", "")])
def test_a_dead_end_admits_no_token_and_the_scheduler_says_so(
        service: GrammarCompilerService, tokenizer: Any, kind: GrammarKind, text: str, prefix: str) -> None:
    """A grammar with no complete match (found valid by the compiler) reaches a state where no token,
    stop included, may follow: admits_any_token is False there, True on the way in and for a live
    grammar, and the scheduler's abort message says the constraint matches nothing instead of
    calling it an internal error (the break-it report of 2026-12-04, F3)."""
    from types import SimpleNamespace

    from radixrt.scheduler.grammar import GrammarStage

    m = RequestMatcher(service.compile_now(GrammarSpec(kind, text)))
    for tok in tokenizer.encode(prefix, add_special_tokens=False):
        assert m.admits_any_token() and m.accept_token(tok)
    assert not m.admits_any_token()
    # the scheduler resolves the sampled token before accept: the count includes the refused one
    req = SimpleNamespace(matcher=m, num_resolved_outputs=len(prefix) + 1)
    action, message = GrammarStage.accept(req, 0)
    assert action == "abort" and "admits no token" in message and "internal error" not in message
    assert f"after {len(prefix)} output tokens" in message
    live = RequestMatcher(service.compile_now(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))))
    assert live.admits_any_token()
    action, message = GrammarStage.accept(SimpleNamespace(matcher=live, num_resolved_outputs=0), 0)
    assert action == "abort" and "internal error" in message  # a token the mask would have refused
