"""Penalties and logit bias: the formulas against independent references, and the per-row state."""

from __future__ import annotations

import numpy as np
import torch

from radixrt.protocol import ForwardBatch
from radixrt.worker.penalties import PenaltyState, apply_penalties

V = 40


def rand_logits(b: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_repetition_penalty_matches_hugging_face() -> None:
    from transformers import RepetitionPenaltyLogitsProcessor

    lg = rand_logits(3)
    seqs = [[1, 2, 2, 7], [0, 39], [5]]
    ids = torch.tensor([s + [s[-1]] * (4 - len(s)) for s in seqs])  # padded with a repeat: same set
    want = torch.stack([RepetitionPenaltyLogitsProcessor(1.7)(ids[i:i + 1], lg[i:i + 1].clone())[0]
                        for i in range(3)])
    mask = torch.zeros(3, V, dtype=torch.bool)
    for i, s in enumerate(seqs):
        mask[i, s] = True
    got = apply_penalties(lg, torch.zeros(3, V), mask, torch.zeros(3), torch.zeros(3), torch.full((3,), 1.7))
    torch.testing.assert_close(got, want)


def test_frequency_and_presence_follow_openai() -> None:
    lg = rand_logits(2, seed=1)
    counts = torch.zeros(2, V)
    counts[0, 3], counts[0, 9], counts[1, 3] = 2, 1, 5
    freq, pres = torch.tensor([0.5, -1.0]), torch.tensor([1.5, 0.25])
    got = apply_penalties(lg, counts, None, freq, pres, torch.ones(2))
    want = lg.clone()
    for i in range(2):
        for j in range(V):
            c = float(counts[i, j])
            want[i, j] -= c * float(freq[i]) + (1.0 if c > 0 else 0.0) * float(pres[i])
    torch.testing.assert_close(got, want)
    assert torch.equal(got[:, 4], lg[:, 4])  # tokens never generated are untouched


def batch(rows: list[int], freq: list[float], pres: list[float], rep: list[float], **kw) -> ForwardBatch:
    return ForwardBatch(batch_id=0, mode=2, req_rows=np.array(rows, np.int32),
                        frequency_penalty=np.array(freq, np.float32),
                        presence_penalty=np.array(pres, np.float32),
                        repetition_penalty=np.array(rep, np.float32), **kw)


def i32(x: list[int]) -> np.ndarray:
    return np.array(x, np.int32)


def test_state_reset_seed_record_and_apply() -> None:
    st = PenaltyState(4, V, torch.device("cpu"))
    st.output_counts[2, 5] = 7.0  # stale state of a previous request on row 2
    st.prompt_mask[2, 6] = True
    b = batch([2, 0], [1.0, 0.0], [0.0, 0.0], [2.0, 1.0], penalty_reset_rows=i32([2]),
              penalty_prompt_rows=i32([2, 2]), penalty_prompt_ids=i32([10, 11]),
              penalty_output_rows=i32([2, 2, 2]), penalty_output_ids=i32([12, 12, 13]))
    st.prepare(b)
    assert st.output_counts[2].nonzero().flatten().tolist() == [12, 13]
    assert st.output_counts[2, 12] == 2 and st.prompt_mask[2].nonzero().flatten().tolist() == [10, 11]
    lg = torch.full((2, V), 1.0)
    out = st.process(lg, b)
    assert torch.equal(lg, torch.full((2, V), 1.0)), "the raw logits must stay untouched"
    assert torch.equal(out[1], lg[1])  # row 0's request has no penalties
    assert out[0, 10] == 0.5 and out[0, 11] == 0.5  # prompt tokens: repetition only
    assert out[0, 12] == 0.5 - 2.0 and out[0, 13] == 0.5 - 1.0  # output tokens: both
    assert out[0, 5] == 1.0 and out[0, 6] == 1.0  # the stale state is gone
    st.record(b, torch.tensor([13, 4]))
    assert st.output_counts[2, 13] == 2 and st.output_counts[0].sum() == 0  # neutral rows: not counted


def test_neutral_batch_returns_the_same_tensor() -> None:
    st = PenaltyState(2, V, torch.device("cpu"))
    lg = rand_logits(2)
    assert st.process(lg, ForwardBatch(batch_id=0, mode=2, req_rows=i32([0, 1]))) is lg
    assert st.process(lg, batch([0, 1], [0, 0], [0, 0], [1, 1])) is lg


def test_logit_bias_is_sparse_and_per_request() -> None:
    st = PenaltyState(3, V, torch.device("cpu"))
    lg = rand_logits(3, seed=4)
    b = ForwardBatch(batch_id=0, mode=2, req_rows=i32([2, 0, 1]), logit_bias_idx=i32([0, 0, 2]),
                     logit_bias_ids=i32([7, 8, 7]), logit_bias_vals=np.array([100, -5, -100], np.float32))
    out = st.process(lg, b)
    want = lg.clone()
    want[0, 7] += 100
    want[0, 8] -= 5
    want[2, 7] -= 100
    torch.testing.assert_close(out, want)
    assert int(out[0].argmax()) == 7
