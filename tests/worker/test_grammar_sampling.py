"""sample_outputs with grammar bitmask rows: only allowed tokens are sampled, logprobs stay raw."""

from __future__ import annotations

import numpy as np
import torch

from radixrt.constrained import allocate_bitmask
from radixrt.protocol import ForwardBatch, GrammarMask
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


def _ties(b: int, seed: int) -> torch.Tensor:
    """bf16 logits [b, V] with repeated values (bf16 keeps 8 bits): argmax ties break to the first."""
    return (logits(b, V, seed=seed) * 4).round().bfloat16()


def test_model_dtype_logits_sample_as_their_float32_conversion() -> None:
    """A CUDA graph hands sample_outputs its bf16 logits: every pass must sample (and report logprobs)
    what the same logits converted to float32 give. Greedy rows and grammar masks work on the bf16
    values as they are; penalties, logit bias and logprobs convert first."""
    b = 6
    st = PenaltyState(b, V, torch.device("cpu"))
    rows = np.arange(b, dtype=np.int32)
    plain = ForwardBatch(batch_id=0, mode=2, req_rows=rows)
    with_logprobs = ForwardBatch(batch_id=1, mode=2, req_rows=rows, return_logprob=True, top_logprobs_num=3)
    biased = ForwardBatch(batch_id=2, mode=2, req_rows=rows, logit_bias_idx=np.array([0, 4], np.int32),
                          logit_bias_ids=np.array([7, 9], np.int32),
                          logit_bias_vals=np.array([50.0, 50.0], np.float32))
    grammar = ForwardBatch(batch_id=3, mode=2, req_rows=rows, grammar_rows=np.array([2], np.int32),
                           grammar_bitmask=masks([[1, 40, 66]]).reshape(-1))
    penalised = ForwardBatch(batch_id=4, mode=2, req_rows=rows, frequency_penalty=np.full(b, 0.5, np.float32),
                             presence_penalty=np.full(b, 0.25, np.float32),
                             repetition_penalty=np.full(b, 1.5, np.float32), penalty_reset_rows=rows,
                             penalty_output_rows=rows, penalty_output_ids=rows + 3)
    mixed = params(b, temperature=0.8, seeds=torch.arange(b, dtype=torch.int64) + 11)
    mixed.temperature[::2] = 0.0  # greedy and sampled rows in one pass
    for seed in range(5):
        lg16 = _ties(b, seed)
        lg32 = lg16.float()
        for batch in (plain, with_logprobs, biased, grammar, penalised):
            for sp in (params(b, temperature=0.0), mixed):
                ids16, out16 = sample_outputs(batch, lg16, sp, st)
                ids32, out32 = sample_outputs(batch, lg32, sp, st)
                assert ids16.tolist() == ids32.tolist()
                if batch.return_logprob:
                    assert torch.equal(out16.logprobs, out32.logprobs)
                    assert torch.equal(out16.top_logprob_ids, out32.top_logprob_ids)
        assert lg16.dtype == torch.bfloat16  # the caller's logits are left as they were
    assert int(sample_outputs(biased, lg16, params(b, temperature=0.0), st)[0][4]) == 9


def test_penalties_on_bf16_logits_are_applied_in_float32() -> None:
    """Two adjacent bf16 values that a small frequency penalty reorders only in float32: the penalised
    pass must convert before it applies the penalty (in bf16 1.0078 - 0.005 rounds back to 1.0078,
    a tie the lower index wins)."""
    lg32 = torch.zeros(1, V)
    lg32[0, 0], lg32[0, 1] = 1.0, 1.0078125
    one = np.array([0], np.int32)
    batch = ForwardBatch(batch_id=0, mode=2, req_rows=one, frequency_penalty=np.array([0.005], np.float32),
                         presence_penalty=np.zeros(1, np.float32), repetition_penalty=np.ones(1, np.float32),
                         penalty_reset_rows=one, penalty_output_rows=one,
                         penalty_output_ids=np.array([1], np.int32))
    st = PenaltyState(1, V, torch.device("cpu"))
    want = sample_outputs(batch, lg32, params(1, temperature=0.0), st)[0]
    got = sample_outputs(batch, lg32.bfloat16(), params(1, temperature=0.0), st)[0]
    assert want.tolist() == [1] and got.tolist() == want.tolist()


def test_deferred_grammar_rows_on_bf16_logits() -> None:
    """A pass whose grammar rows arrive later (GrammarMask) samples and reports logprobs from bf16
    logits as from their float32 conversion."""
    lg16 = (logits(3, V, seed=9) * 4).round().bfloat16()
    st = PenaltyState(3, V, torch.device("cpu"))
    batch = ForwardBatch(batch_id=7, mode=2, req_rows=np.arange(3, dtype=np.int32),
                         grammar_deferred=np.array([1], np.int32), return_logprob=True, top_logprobs_num=2)
    mask = GrammarMask(batch_id=7, rows=np.array([1], np.int32), bitmask=masks([[3, 50]]))
    for sp in (params(3, temperature=0.0), params(3, temperature=0.9)):
        a, oa = sample_outputs(batch, lg16, sp, st, mask)
        b, ob = sample_outputs(batch, lg16.float(), sp, st, mask)
        assert a.tolist() == b.tolist() and int(a[1]) in (3, 50)
        assert torch.equal(oa.logprobs, ob.logprobs)



def test_cpu_bitmask_upload_of_a_read_only_block_is_a_writable_copy() -> None:
    """A mask block that views a received message's (read-only) buffer is copied on the CPU, so torch
    does not warn ("The given NumPy array is not writable", seen at server start); a writable one is
    used as it is."""
    import warnings

    import numpy as np

    from radixrt.worker.forward_pass import upload_bitmask

    ro = np.frombuffer(np.arange(8, dtype=np.int32).tobytes(), dtype=np.int32).reshape(2, 4)
    assert not ro.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = upload_bitmask([ro], torch.device("cpu"))
    assert out.tolist() == ro.tolist() and out.data_ptr() != ro.ctypes.data  # a copy
    rw = np.ones((2, 4), dtype=np.int32)
    assert upload_bitmask([rw], torch.device("cpu")).data_ptr() == rw.ctypes.data
