"""Next-token sampling on device: greedy, temperature, top-k, top-p, min-p, with per-row seeds.

Randomness comes from a counter-based generator (the idea of Salmon et al. 2011, "Parallel random
numbers: as easy as 1, 2, 3"): the uniform for (row i, vocab entry j) is a hash of
(seeds[i], sample_steps[i], j). A seeded request therefore draws the same token whatever else is in
the batch, and no generator state lives between passes. A token is drawn from the filtered
distribution p by an exponential race: argmax_j p_j / E_j with E_j = -log U_j ~ Exp(1), which
picks j with probability proportional to p_j.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF


@dataclass(slots=True)
class SamplingTensors:
    """Per-row sampling parameters on the logits' device. All [B].

    temperature float32 (0 = greedy); top_p float32 (1 = off); top_k int64 (-1 or >= V = off;
    1 = greedy); min_p float32 (0 = off); seeds int64; sample_steps int64.
    """

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor
    seeds: torch.Tensor
    sample_steps: torch.Tensor
    plan: SamplingPlan | None = None  # host-side decisions; None = decide on the device (syncs)


@dataclass(slots=True)
class SamplingPlan:
    """What `sample` must do, decided on the host from the batch's numpy parameters, so that
    sampling needs no device->host synchronisation (overlap scheduling launches the next pass
    while this one runs; a sync here would stall it).

    sampled_rows: [R] int64 device tensor of the rows that are not greedy (R may be 0);
    use_min_p: some sampled row has min_p > 0; need_sort: some sampled row uses top-k or top-p.
    """

    sampled_rows: torch.Tensor
    num_sampled: int
    use_min_p: bool
    need_sort: bool


def host_plan(temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, min_p: np.ndarray,
              vocab_size: int) -> tuple[np.ndarray, bool, bool]:
    """(sampled row indices int64 [R], use_min_p, need_sort) from host arrays [B] (see SamplingPlan)."""
    greedy = (temperature <= 0) | (top_k == 1)
    rows = np.flatnonzero(~greedy).astype(np.int64)
    use_min_p = bool((min_p[rows] > 0).any())
    k = top_k[rows]
    need_sort = bool(((k > 0) & (k < vocab_size)).any()) or bool((top_p[rows] < 1.0).any())
    return rows, use_min_p, need_sort


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """32-bit integer finaliser on int64 tensors holding values in [0, 2^32).

    Multipliers are odd and below 2^31, so every product stays below 2^63 (no signed overflow)
    and right shifts of non-negative values are logical.
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x446CA68B) & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x2C1B3C6D) & _MASK32
    return x ^ (x >> 15)


def counter_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniforms in (0, 1), [B, V] float32, a pure function of (seeds[b], steps[b], column).

    Args:
        seeds, steps: [B] integer tensors (any sign; only the low 32 bits matter).
    """
    dev = seeds.device
    col = torch.arange(vocab_size, dtype=torch.int64, device=dev)  # [V]
    s = _mix32((seeds.long() & _MASK32) ^ 0x243F6A88)  # [B]
    s = _mix32(s ^ (steps.long() & _MASK32))  # [B]
    h = _mix32(s[:, None] ^ _mix32(col ^ 0x13198A2E)[None, :])  # [B, V]
    h = _mix32(h ^ s[:, None])
    return ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))  # 24 random bits, never 0 or 1


def _filter_probs(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  min_p: torch.Tensor, use_min_p: bool | None = None,
                  need_sort: bool | None = None) -> torch.Tensor:
    """Zero the probabilities that top-k / top-p / min-p exclude. probs [B, V] float32 -> [B, V].

    The most likely token always survives. top-p keeps the smallest prefix of the descending
    order whose mass reaches top_p (the token that crosses the threshold is kept).
    """
    vocab = probs.shape[-1]
    if use_min_p is None:  # decided on the device: a sync
        use_min_p = bool((min_p > 0).any())
    if use_min_p:
        p_max = probs.max(dim=-1, keepdim=True).values
        probs = torch.where(probs < min_p[:, None] * p_max, 0.0, probs)
    if need_sort is None:
        need_sort = bool(((top_k > 0) & (top_k < vocab)).any()) or bool((top_p < 1.0).any())
    if not need_sort:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # [B, V]
    rank = torch.arange(vocab, device=probs.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # mass of strictly more likely tokens
    drop = (rank >= k) | ((mass_before >= top_p[:, None]) & (rank > 0))
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p)


def sample(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Pick one token per row.

    Args:
        logits: [B, V] raw logits, float32 or the model's dtype (a CUDA graph's bf16 logits): greedy
            rows take the argmax of the values as given, which is that of their float32 conversion
            (exact, order-preserving; the same first index on ties); sampled rows are converted.
        st: per-row parameters (see SamplingTensors).

    Returns:
        [B] int64 token ids. Greedy rows (temperature == 0 or top_k == 1) get exactly argmax.
    """
    greedy_ids = logits.argmax(dim=-1)  # [B]
    plan = st.plan
    if plan is None:  # decide on the device (a sync; the model runner always passes a plan)
        greedy = (st.temperature <= 0) | (st.top_k == 1)
        if bool(greedy.all()):
            return greedy_ids
        rows = (~greedy).nonzero().squeeze(1)  # [R]
        use_min_p = need_sort = None
    else:
        if plan.num_sampled == 0:
            return greedy_ids
        rows, use_min_p, need_sort = plan.sampled_rows, plan.use_min_p, plan.need_sort
    lg = logits[rows].float()  # [R, V]
    temp = st.temperature[rows].clamp_min(1e-6)[:, None]
    probs = torch.softmax(lg / temp, dim=-1)
    probs = _filter_probs(probs, st.top_k[rows], st.top_p[rows], st.min_p[rows], use_min_p, need_sort)
    u = counter_uniform(st.seeds[rows], st.sample_steps[rows], lg.shape[-1])  # [R, V]
    # argmax of p / Exp(1) samples j with probability ~ p_j. u's top value rounds to 1.0 in float32,
    # so Exp(1) can be 0: clamped, a zero-probability token (masked by a grammar, or underflowed)
    # races 0 instead of 0 / 0 = NaN, which argmax would pick.
    race = probs / (-torch.log(u)).clamp_min(1e-30)
    drawn = race.argmax(dim=-1)
    out = greedy_ids.clone()
    out[rows] = drawn
    return out


def logprobs_of(logits: torch.Tensor, token_ids: torch.Tensor, top_n: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities under the raw distribution (before temperature and filters).

    Args:
        logits: [B, V] float32; token_ids: [B] int64 chosen tokens; top_n: how many top entries.

    Returns:
        (chosen [B] float32, top_ids [B, top_n] int64, top_vals [B, top_n] float32).
    """
    lp = torch.log_softmax(logits, dim=-1)  # [B, V]
    chosen = lp.gather(-1, token_ids[:, None]).squeeze(1)
    if top_n > 0:
        vals, ids = lp.topk(top_n, dim=-1)
    else:
        vals = lp.new_zeros((lp.shape[0], 0))
        ids = token_ids.new_zeros((lp.shape[0], 0))
    return chosen, ids, vals
