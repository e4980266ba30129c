"""sample_outputs with grammar bitmask rows: only allowed tokens are sampled, logprobs stay raw."""

from __future__ import annotations

import numpy as np
import torch

from radixrt.constrained import allocate_bitmask
from radixrt.protocol import ForwardBatch
from radixrt.worker.forward_pass import sample_outputs
from radixrt.worker.penalties import PenaltyState
from tests.worker.test_sampler import logits, params

V = 70  # not a multiple of 32: the last word is partly padding


def masks(allowed: list[list[int]]) -> np.ndarray:
    bm = allocate_bitmask(len(allowed), V)
    bm[:] = 0
    for r, toks in enumerate(allowed):
        for t in toks:
            bm[r, t // 32] |= np.int32(np.uint32(1 << (t % 32)).view(np.int32))
    return bm


def test_constrained_rows_sample_only_allowed_tokens_and_logprobs_are_raw() -> None:
    b = 4
    lg = logits(b, V, seed=3)
    raw = lg.clone()
    allowed = [[5, 64], [31, 33, 69]]
    rows = np.array([3, 1], np.int32)  # rows not in order and not at the front
    batch = ForwardBatch(batch_id=0, mode=2, req_rows=np.arange(b, dtype=np.int32),
                         grammar_rows=rows, grammar_bitmask=masks(allowed).reshape(-1),
                         return_logprob=True)
    st = PenaltyState(b, V, torch.device("cpu"))
    for seed in range(20):
        sp = params(b, temperature=1.0, seeds=torch.full((b,), seed, dtype=torch.int64))
        ids, out = sample_outputs(batch, lg, sp, st)
        assert int(ids[3]) in allowed[0] and int(ids[1]) in allowed[1]
        assert torch.equal(lg, raw), "the raw logits must stay untouched"
        want = torch.log_softmax(raw, -1).gather(1, ids.view(-1, 1)).view(-1)
        torch.testing.assert_close(out.logprobs, want)
    greedy = params(b, temperature=0.0)
    ids, _ = sample_outputs(batch, lg, greedy, st)
    assert int(ids[0]) == int(raw[0].argmax()) and int(ids[2]) == int(raw[2].argmax())  # unconstrained
    assert int(ids[3]) == max(allowed[0], key=lambda t: float(raw[3, t]))


def test_no_grammar_rows_leaves_sampling_unchanged() -> None:
    b = 3
    lg = logits(b, V, seed=5)
    batch = ForwardBatch(batch_id=0, mode=2, req_rows=np.arange(b, dtype=np.int32))
    st = PenaltyState(b, V, torch.device("cpu"))
    ids, _ = sample_outputs(batch, lg, params(b, temperature=0.0), st)
    assert ids.tolist() == lg.argmax(-1).tolist()


def test_a_uniform_of_one_never_picks_a_zero_probability_token(monkeypatch) -> None:
    """u rounds to 1.0 in float32 for some (seed, step, column): Exp(1) = 0 there, and a masked
    column (p = 0) must race 0, not NaN (which argmax would pick)."""
    from radixrt.worker import sampler

    def ones_at_masked(seeds, steps, v):
        u = torch.full((len(seeds), v), 0.5)
        u[:, 7] = 1.0
        return u

    monkeypatch.setattr(sampler, "counter_uniform", ones_at_masked)
    lg = torch.zeros(2, 10)
    lg[:, 7] = float("-inf")  # masked
    assert 7 not in sampler.sample(lg, params(2, temperature=1.0)).tolist()
