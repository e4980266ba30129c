"""Sampler: exact greedy, filters, per-row seeded reproducibility, and the sampled distribution."""

from __future__ import annotations

import torch

from radixrt.worker import sampler
from radixrt.worker.sampler import SamplingTensors


def params(b: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0,
           seeds: torch.Tensor | None = None, steps: torch.Tensor | None = None) -> SamplingTensors:
    return SamplingTensors(
        temperature=torch.full((b,), temperature), top_p=torch.full((b,), top_p),
        top_k=torch.full((b,), top_k, dtype=torch.int64), min_p=torch.full((b,), min_p),
        seeds=seeds if seeds is not None else torch.arange(b, dtype=torch.int64),
        sample_steps=steps if steps is not None else torch.zeros(b, dtype=torch.int64))


def logits(b: int, v: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax() -> None:
    lg = logits(16, 1000)
    assert torch.equal(sampler.sample(lg, params(16, temperature=0.0)), lg.argmax(-1))


def test_top_k_one_is_greedy() -> None:
    lg = logits(16, 1000, seed=1)
    assert torch.equal(sampler.sample(lg, params(16, temperature=1.3, top_k=1)), lg.argmax(-1))


def test_tiny_top_p_is_argmax() -> None:
    lg = logits(16, 1000, seed=2)
    assert torch.equal(sampler.sample(lg, params(16, temperature=1.0, top_p=1e-6)), lg.argmax(-1))


def test_sampling_is_not_greedy() -> None:
    lg = torch.zeros(64, 100)  # uniform: the draws must spread out
    out = sampler.sample(lg, params(64, steps=torch.arange(64)))
    assert len(set(out.tolist())) > 20


def test_seeded_row_independent_of_batch_companions() -> None:
    v = 500
    row = logits(1, v, seed=3)
    seed, step = torch.tensor([1234]), torch.tensor([7])
    alone = sampler.sample(row, params(1, temperature=1.5, top_p=0.95, seeds=seed, steps=step))
    for companions in (3, 17):
        others = logits(companions, v, seed=companions)
        lg = torch.cat([others[:1], row, others[1:]])
        st = params(companions + 1, temperature=1.5, top_p=0.95,
                    seeds=torch.cat([torch.tensor([99]), seed, torch.arange(companions - 1)]),
                    steps=torch.cat([torch.tensor([0]), step, torch.arange(companions - 1)]))
        st.temperature[0] = 0.0  # a greedy companion too
        st.top_k[2:] = 5  # filters on other rows must not matter
        assert sampler.sample(lg, st)[1] == alone[0]
    # ... and the draw changes with the step or the seed (over many, not all equal)
    draws = {int(sampler.sample(row, params(1, temperature=1.5, seeds=seed, steps=torch.tensor([s])))[0])
             for s in range(30)}
    assert len(draws) > 3


def _chi_square(counts: torch.Tensor, expected_p: torch.Tensor) -> float:
    n = counts.sum()
    exp = expected_p * n
    keep = exp > 0
    assert counts[~keep].sum() == 0, "sampled a token with probability 0"
    return float(((counts[keep] - exp[keep]) ** 2 / exp[keep]).sum())


def _draw(lg_row: torch.Tensor, n: int, **kw) -> torch.Tensor:
    lg = lg_row.expand(n, -1).contiguous()
    st = params(n, seeds=torch.full((n,), 42, dtype=torch.int64), steps=torch.arange(n), **kw)
    return torch.bincount(sampler.sample(lg, st), minlength=lg_row.numel()).double()


def test_distribution_matches_softmax() -> None:
    lg = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 1.5])
    counts = _draw(lg, 20000, temperature=0.8)
    p = torch.softmax(lg.double() / 0.8, -1)
    # 7 degrees of freedom: P(chi2 > 30) < 1e-4
    assert _chi_square(counts, p) < 30.0


def test_distribution_with_top_k_top_p_min_p() -> None:
    lg = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 1.5])
    p = torch.softmax(lg.double(), -1)
    order = p.argsort(descending=True)
    top3 = torch.zeros_like(p)
    top3[order[:3]] = p[order[:3]]
    assert _chi_square(_draw(lg, 20000, top_k=3), top3 / top3.sum()) < 25.0
    # top_p: the smallest prefix reaching the mass (tokens 0, 7, 1 hold ~0.72 here)
    cum = p[order].cumsum(0)
    n_keep = int((cum < 0.7).sum()) + 1
    tp = torch.zeros_like(p)
    tp[order[:n_keep]] = p[order[:n_keep]]
    assert _chi_square(_draw(lg, 20000, top_p=0.7), tp / tp.sum()) < 25.0
    mp = torch.where(p >= 0.3 * p.max(), p, 0.0)
    assert _chi_square(_draw(lg, 20000, min_p=0.3), mp / mp.sum()) < 25.0


def test_counter_uniform_is_uniform_and_keyed() -> None:
    u = sampler.counter_uniform(torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0]), 50000)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    again = sampler.counter_uniform(torch.tensor([2]), torch.tensor([0]), 50000)
    assert torch.equal(again[0], u[2])
    hist = torch.histc(u[0], bins=10, min=0.0, max=1.0)
    assert float((hist - 5000).abs().max()) < 400


def test_logprobs() -> None:
    lg = logits(4, 50, seed=9)
    ids = lg.argmax(-1)
    chosen, top_ids, top_vals = sampler.logprobs_of(lg, ids, 3)
    ref = torch.log_softmax(lg, -1)
    torch.testing.assert_close(chosen, ref.gather(-1, ids[:, None]).squeeze(1))
    assert torch.equal(top_ids[:, 0], ids)
    torch.testing.assert_close(top_vals, ref.topk(3, -1).values)
    assert sampler.logprobs_of(lg, ids, 0)[1].shape == (4, 0)
