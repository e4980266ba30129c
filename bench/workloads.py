"""Benchmark workloads as token-id prompts, deterministic given a seed.

Every workload is a list of sessions; a session is a list of turns that run one after the other.
Single-turn workloads (`random`, `shared-prefix`, `long-short`) have one turn per session. In
`multi-turn` each turn resends the whole history:

    prompt(turn k) = prompt(turn k-1) + answer(turn k-1) + user_ids(turn k)

so the answer tokens come from whoever ran turn k-1 (the server, or an HF baseline); `next_prompt`
builds it. Prompts are token ids drawn uniformly from [min_token_id, vocab_size) (peers.md uses
[1000, 150000)) so that input lengths are exact and no special token is sent.

The same `WorkloadSpec` feeds bench/serving.py, bench/peers.py and bench/roofline.py, so the three
measure the same requests.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field, fields

import numpy as np

WORKLOAD_NAMES = ("random", "shared-prefix", "multi-turn", "long-short")


@dataclass(slots=True)
class Turn:
    """One request of a session: the new tokens it adds and how many tokens it must generate."""

    user_ids: list[int]  # new prompt tokens (for turn 0: the whole prompt)
    output_len: int  # tokens to generate (EOS is ignored, so exactly this many)


@dataclass(slots=True)
class Session:
    """A client's script: turns run in order, each after the previous one's answer arrived.

    `prefix_len` tokens at the start of turn 0 are shared with every session of the same `group`
    (shared-prefix workload); group is None where nothing is shared by construction.
    """

    session_id: int
    turns: list[Turn]
    group: int | None = None
    prefix_len: int = 0


@dataclass(slots=True)
class Workload:
    """Sessions plus the spec that produced them (for the JSON report)."""

    spec: WorkloadSpec
    sessions: list[Session]

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    @property
    def is_multi_turn(self) -> bool:
        return any(len(s.turns) > 1 for s in self.sessions)

    def total_output_len(self) -> int:
        """Requested output tokens over all requests."""
        return sum(t.output_len for s in self.sessions for t in s.turns)

    def total_new_input_len(self) -> int:
        """Prompt tokens sent for the first time (multi-turn histories are not counted again)."""
        return sum(len(t.user_ids) for s in self.sessions for t in s.turns)

    def single_turn_requests(self) -> list[tuple[list[int], int]]:
        """[(prompt_ids, output_len)] in session order; raises ValueError for multi-turn workloads."""
        if self.is_multi_turn:
            raise ValueError("a multi-turn workload has no fixed prompts; run it turn by turn")
        return [(s.turns[0].user_ids, s.turns[0].output_len) for s in self.sessions]

    def describe(self) -> dict:
        """JSON-ready summary: the spec plus request and token counts."""
        return {**asdict(self.spec), "num_sessions": len(self.sessions), "num_requests": self.num_requests,
                "total_output_len": self.total_output_len(),
                "total_new_input_len": self.total_new_input_len()}


def next_prompt(prev_prompt: list[int] | None, prev_answer: list[int] | None, turn: Turn) -> list[int]:
    """The prompt of a turn: previous prompt + previous answer + the turn's new user tokens."""
    if prev_prompt is None:
        return list(turn.user_ids)
    return [*prev_prompt, *(prev_answer or []), *turn.user_ids]


@dataclass(slots=True)
class WorkloadSpec:
    """Parameters of every workload; each generator reads the fields it needs.

    Lengths are in tokens. `range_ratio` in (0, 1]: random lengths are drawn uniformly from
    [round(len * range_ratio), len] (1.0 = exact lengths).
    """

    name: str = "random"
    seed: int = 0
    vocab_size: int = 150000  # token ids are drawn from [min_token_id, vocab_size)
    min_token_id: int = 1000
    num_prompts: int = 256  # random, long-short
    input_len: int = 512  # random; long-short: short prompts; multi-turn: first turn
    output_len: int = 256  # every workload
    range_ratio: float = 1.0  # random, long-short
    num_groups: int = 1  # shared-prefix
    prompts_per_group: int = 128  # shared-prefix
    system_prompt_len: int = 2048  # shared-prefix
    question_len: int = 128  # shared-prefix
    num_clients: int = 8  # multi-turn
    num_turns: int = 4  # multi-turn
    turn_len: int = 64  # multi-turn: new user tokens in turns after the first
    long_fraction: float = 0.1  # long-short: share of long prompts
    long_input_len: int = 8192  # long-short
    extra: dict = field(default_factory=dict)  # free-form notes kept in the report

    def __post_init__(self) -> None:
        if self.name not in WORKLOAD_NAMES:
            raise ValueError(f"unknown workload {self.name!r}; choose from {', '.join(WORKLOAD_NAMES)}")
        if not 0 <= self.min_token_id < self.vocab_size:
            raise ValueError(f"need 0 <= min_token_id < vocab_size, got {self.min_token_id}, "
                             f"{self.vocab_size}")
        if not 0.0 < self.range_ratio <= 1.0:
            raise ValueError(f"range_ratio must be in (0, 1], got {self.range_ratio}")
        if not 0.0 <= self.long_fraction <= 1.0:
            raise ValueError(f"long_fraction must be in [0, 1], got {self.long_fraction}")
        lengths = (self.input_len, self.output_len, self.system_prompt_len, self.question_len,
                   self.turn_len, self.long_input_len)
        if min(lengths) < 1 or min(self.num_prompts, self.num_groups, self.prompts_per_group,
                                   self.num_clients, self.num_turns) < 1:
            raise ValueError("lengths and counts must be >= 1")

    def build(self) -> Workload:
        """Generate the workload; the same spec always yields the same token ids."""
        rng = np.random.default_rng(self.seed)
        make = {"random": _random, "shared-prefix": _shared_prefix, "multi-turn": _multi_turn,
                "long-short": _long_short}[self.name]
        return Workload(spec=self, sessions=make(self, rng))


def _ids(spec: WorkloadSpec, rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(spec.min_token_id, spec.vocab_size, size=n).tolist()


def _lens(rng: np.random.Generator, length: int, ratio: float, n: int) -> list[int]:
    """n lengths uniform in [max(1, round(length * ratio)), length]."""
    low = max(1, round(length * ratio))
    return rng.integers(low, length + 1, size=n).tolist()


def _random(spec: WorkloadSpec, rng: np.random.Generator) -> list[Session]:
    in_lens = _lens(rng, spec.input_len, spec.range_ratio, spec.num_prompts)
    out_lens = _lens(rng, spec.output_len, spec.range_ratio, spec.num_prompts)
    return [Session(i, [Turn(_ids(spec, rng, n_in), n_out)])
            for i, (n_in, n_out) in enumerate(zip(in_lens, out_lens, strict=True))]


def _shared_prefix(spec: WorkloadSpec, rng: np.random.Generator) -> list[Session]:
    """num_groups system prompts, each shared by prompts_per_group questions; order shuffled."""
    prefixes = [_ids(spec, rng, spec.system_prompt_len) for _ in range(spec.num_groups)]
    pairs = [(g, prefixes[g] + _ids(spec, rng, spec.question_len))
             for g in range(spec.num_groups) for _ in range(spec.prompts_per_group)]
    order = rng.permutation(len(pairs)).tolist()
    return [Session(i, [Turn(pairs[j][1], spec.output_len)], group=pairs[j][0],
                    prefix_len=spec.system_prompt_len)
            for i, j in enumerate(order)]


def _multi_turn(spec: WorkloadSpec, rng: np.random.Generator) -> list[Session]:
    """num_clients sessions of num_turns turns: input_len tokens first, then turn_len per turn."""
    sessions = []
    for c in range(spec.num_clients):
        turns = [Turn(_ids(spec, rng, spec.input_len if k == 0 else spec.turn_len), spec.output_len)
                 for k in range(spec.num_turns)]
        sessions.append(Session(c, turns, group=c))
    return sessions


def _long_short(spec: WorkloadSpec, rng: np.random.Generator) -> list[Session]:
    """Short chat prompts (input_len) with round(long_fraction * num_prompts) long ones mixed in."""
    num_long = round(spec.long_fraction * spec.num_prompts)
    is_long = np.zeros(spec.num_prompts, dtype=bool)
    is_long[rng.choice(spec.num_prompts, size=num_long, replace=False)] = True
    short_lens = _lens(rng, spec.input_len, spec.range_ratio, spec.num_prompts)
    long_lens = _lens(rng, spec.long_input_len, spec.range_ratio, spec.num_prompts)
    out_lens = _lens(rng, spec.output_len, spec.range_ratio, spec.num_prompts)
    sessions = []
    for i in range(spec.num_prompts):
        n_in = long_lens[i] if is_long[i] else short_lens[i]
        sessions.append(Session(i, [Turn(_ids(spec, rng, n_in), out_lens[i])]))
    return sessions


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """Add one --flag per WorkloadSpec field (--workload for `name`)."""
    defaults = WorkloadSpec()
    group = parser.add_argument_group("workload")
    group.add_argument("--workload", choices=WORKLOAD_NAMES, default=defaults.name)
    for f in fields(WorkloadSpec):
        if f.name in ("name", "extra"):
            continue
        value = getattr(defaults, f.name)
        group.add_argument("--" + f.name.replace("_", "-"), type=type(value), default=value,
                           help=f"(default {value})")


def spec_from_args(ns: argparse.Namespace) -> WorkloadSpec:
    """WorkloadSpec from flags added by add_workload_args; raises ValueError on bad values."""
    values = {f.name: getattr(ns, f.name) for f in fields(WorkloadSpec) if f.name not in ("name", "extra")}
    return WorkloadSpec(name=ns.workload, **values)
