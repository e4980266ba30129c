"""Penalties end to end through the scheduler: the worker's per-row state must follow each request
through chunked prefill, row reuse and retraction, so that every request gets the tokens it gets
when run alone (greedy over fake logits, penalties applied by a naive reference)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import torch

from radixrt.protocol import ForwardBatch, ForwardResult
from radixrt.scheduler.batch import build_forward_batch, uses_penalties
from radixrt.worker import sampler
from radixrt.worker.penalties import PenaltyState
from tests.scheduler.fake_worker import FakeWorker
from tests.scheduler.test_scheduler import gen, make

VOCAB = 1000
ACTIVE = 24  # fake logits favour a few tokens so that greedy decoding repeats itself


def fake_logits(seq: list[int]) -> torch.Tensor:
    """[VOCAB] float32: a function of the last token only, concentrated on ACTIVE tokens."""
    g = torch.Generator().manual_seed(seq[-1] % ACTIVE)
    lg = torch.full((VOCAB,), -20.0)
    lg[1:ACTIVE + 1] = torch.randn(ACTIVE, generator=g) * 2
    return lg


class PenaltyWorker(FakeWorker):
    """FakeWorker's KV checks, then real PenaltyState + sampler over fake logits of the KV read back."""

    def __init__(self, base: FakeWorker, max_rows: int) -> None:
        self.__dict__.update(base.__dict__)
        self.state = PenaltyState(max_rows, VOCAB, torch.device("cpu"))
        self.seqs: list[list[int]] = []

    def next_token(self, seq: list[int]) -> int:
        self.seqs.append(list(seq))
        return 0

    def forward(self, fb: ForwardBatch, expected: dict[int, list[int]] | None = None) -> ForwardResult:
        self.seqs = []
        self.state.prepare(fb)
        res = super().forward(fb, expected)
        logits = torch.stack([fake_logits(s) for s in self.seqs])
        b = len(self.seqs)
        st = sampler.SamplingTensors(temperature=torch.zeros(b), top_p=torch.ones(b),
                                     top_k=torch.full((b,), -1), min_p=torch.zeros(b),
                                     seeds=torch.zeros(b, dtype=torch.int64),
                                     sample_steps=torch.zeros(b, dtype=torch.int64))
        ids = sampler.sample(self.state.process(logits, fb), st)
        self.state.record(fb, ids)
        res.next_token_ids = ids.numpy().astype(np.int32)
        return res


def reference(prompt: list[int], max_new: int, sp: dict) -> list[int]:
    seq, out = list(prompt), []
    f, p = sp.get("frequency_penalty", 0.0), sp.get("presence_penalty", 0.0)
    r = sp.get("repetition_penalty", 1.0)
    bias = sp.get("logit_bias", {})
    for _ in range(max_new):
        lg = fake_logits(seq).tolist()
        counts = Counter(out)
        for j in set(seq):  # the only tokens penalties touch
            if r != 1.0:
                lg[j] = lg[j] / r if lg[j] > 0 else lg[j] * r
            lg[j] -= f * counts[j] + (p if counts[j] else 0.0)
        for key, v in bias.items():
            lg[int(key)] += v
        t = max(range(VOCAB), key=lambda j: (lg[j], -j))
        out.append(t)
        seq.append(t)
    return out


def test_penalty_state_follows_requests_through_chunks_rows_and_retraction() -> None:
    rng = random.Random(5)
    sched, base = make(16, num_pages=300 // 16 + 1, chunk=40, max_running=6)
    worker = PenaltyWorker(base, 6)
    choices = [{}, {"frequency_penalty": 0.8}, {"presence_penalty": 1.5}, {"repetition_penalty": 1.6},
               {"frequency_penalty": -0.3, "repetition_penalty": 1.2}, {"logit_bias": {"3": 5.0, "4": -100}}]
    reqs = {}
    for i in range(18):
        prompt = [rng.randrange(1, ACTIVE + 1) for _ in range(rng.randrange(5, 90))]
        sp, max_new = choices[i % len(choices)], rng.randrange(20, 80)
        reqs[f"r{i}"] = (prompt, max_new, sp)
        sched.add_request(gen(f"r{i}", prompt, max_new, ignore_eos=True, **sp))
    outputs: dict[str, list[int]] = {}
    resumed = []  # penalised requests retracted after generating: their counts must be replayed
    for _ in range(5000):
        resumed += [r.rid for r in sched.waiting if r.output_ids and uses_penalties(r.sampling)]
        sb = sched.schedule()
        if sb is not None:
            expected = {it.req.req_row: it.req.all_ids for it in sb.items}
            sched.process_result(sb, worker.forward(build_forward_batch(sb), expected))
        out, _ = sched.take_outputs()
        if out is not None:
            for i, rid in enumerate(out.rids):
                outputs.setdefault(rid, []).extend(out.output_ids[out.offsets[i]:out.offsets[i + 1]].tolist())
        if sb is None and sched.is_idle:
            break
    assert resumed, "the pool must be small enough to retract penalised requests mid-output"
    for rid, (prompt, max_new, sp) in reqs.items():
        assert outputs[rid] == reference(prompt, max_new, sp), f"{rid} {sp}"
    plain = [outputs[f"r{i}"] for i in range(0, 18, len(choices))]
    penalised = [outputs[f"r{i}"] for i in range(1, 18, len(choices))]
    assert any(len(set(o)) < len(o) for o in plain), "fake logits should make greedy output repeat"
    assert all(len(set(o)) > 3 for o in penalised)


def test_batches_without_penalties_carry_no_penalty_arrays() -> None:
    sched, _ = make(16, num_pages=65, chunk=64)
    sched.add_request(gen("a", [1, 2, 3], 4))
    fb = build_forward_batch(sched.schedule())
    assert len(fb.frequency_penalty) == 0 and len(fb.penalty_reset_rows) == 0 and len(fb.logit_bias_idx) == 0


def test_out_of_vocabulary_logit_bias_is_rejected() -> None:
    sched, _ = make(16, num_pages=65, chunk=64)
    for rid, bias in (("oov", {str(VOCAB): 1.0}), ("key", {"x": 1.0}), ("val", {"5": 101.0}),
                      ("sup", {"\u00b2": 1.0}), ("arabic", {"\u0665": 1.0})):  # digits int() refuses / reads
        req = sched.add_request(gen(rid, [1, 2, 3], 4, logit_bias=bias))
        assert req.finish_reason == "abort" and req.error and "logit_bias" in req.error
