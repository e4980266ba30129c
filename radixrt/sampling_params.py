"""Per-request sampling parameters, shared by the tokenizer process (validation) and the scheduler."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

TOP_K_OFF = 1 << 30  # a top_k of at least this keeps every token: the same as -1
MIN_REPETITION_PENALTY = 1e-6  # positive logits (|x| < ~1e30) divided by it stay finite in float32


@dataclass(slots=True)
class SamplingParams:
    """Sampling and stopping rules of one request (one choice).

    temperature: 0 means greedy. top_k: -1 means off, and so does any value of at least TOP_K_OFF (no
    vocabulary is that large; SGLang reads -1 as 2^30 the same way), so the scheduler's int32 arrays
    never see a larger one. max_new_tokens: None means up to the context
    length. stop: strings matched by the tokenizer process (across token boundaries); stop_token_ids
    and EOS (unless ignore_eos) are matched by the scheduler. seed: None means the scheduler picks one.

    Raises:
        ValueError: a value out of range; the message starts with the parameter's name.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int | None = 128
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checks = [
            ("temperature", self.temperature >= 0.0, "must be >= 0"),
            ("top_p", 0.0 < self.top_p <= 1.0, "must be in (0, 1]"),
            ("top_k", self.top_k == -1 or self.top_k >= 1, "must be -1 or >= 1"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "must be in [0, 1]"),
            ("max_new_tokens", self.max_new_tokens is None or self.max_new_tokens >= 0, "must be >= 0"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "must be in [-2, 2]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "must be in [-2, 2]"),
            # a floor that float32 represents (1e-300 became 0, then logits / 0 = inf and NaN samples)
            ("repetition_penalty", MIN_REPETITION_PENALTY <= self.repetition_penalty <= 2.0,
             f"must be in [{MIN_REPETITION_PENALTY:g}, 2]"),
            # vLLM's range (2^63 and up were accepted and aliased 0 and up); `sampler_seed` maps it
            # onto the sampler's 31 bits
            ("seed", self.seed is None or -(1 << 63) <= self.seed < (1 << 63),
             "must be in [-2^63, 2^63 - 1]"),
        ]
        for name, ok, msg in checks:
            if not ok:
                raise ValueError(f"{name} {msg}")
        for key, value in self.logit_bias.items():  # the scheduler checks again (batch.py relies on it)
            if not (isinstance(value, int | float) and -100.0 <= value <= 100.0):
                raise ValueError(f"logit_bias value for {key} must be a number in [-100, 100]")
        if self.top_k >= TOP_K_OFF:
            self.top_k = -1

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def to_dict(self) -> dict[str, Any]:
        """Every field by name; the lists and the dict are copies (their items are immutable)."""
        d = {name: getattr(self, name) for name in _FIELD_NAMES}
        d["stop"] = list(self.stop)
        d["stop_token_ids"] = list(self.stop_token_ids)
        d["logit_bias"] = dict(self.logit_bias)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        return cls(**{k: v for k, v in d.items() if k in _FIELD_NAMES})


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(SamplingParams))

_MASK64 = (1 << 64) - 1


def sampler_seed(seed: int) -> int:
    """The 31-bit seed the sampler draws with (worker/sampler.py counter_uniform; Req.seed is int32):
    seeds in [0, 2^31) as they are, any other int64 mixed down (splitmix64's finalizer, Steele et al.
    2014) instead of masked, so that 2^31 or -1 do not draw the tokens of 0 or 2^31 - 1."""
    if 0 <= seed < 1 << 31:
        return seed
    x = seed & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & 0x7FFFFFFF


def offset_seed(seed: int, j: int) -> int:
    """seed + j wrapped into int64 (choice j of n > 1 samples with it; tokenizer_proc/submission.py)."""
    return ((seed + j + (1 << 63)) & _MASK64) - (1 << 63)
