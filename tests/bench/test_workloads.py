"""Workload generators: exact lengths, token ranges, determinism, sharing and multi-turn history."""

from __future__ import annotations

import argparse

import pytest

from bench.workloads import WorkloadSpec, add_workload_args, next_prompt, spec_from_args


def _prompts(spec: WorkloadSpec) -> list[list[int]]:
    return [p for p, _ in spec.build().single_turn_requests()]


def test_random_exact_lengths_and_token_range() -> None:
    spec = WorkloadSpec(name="random", num_prompts=50, input_len=33, output_len=7, vocab_size=2000,
                        min_token_id=1000)
    reqs = spec.build().single_turn_requests()
    assert len(reqs) == 50
    assert all(len(p) == 33 and n == 7 for p, n in reqs)
    ids = [t for p, _ in reqs for t in p]
    assert min(ids) >= 1000 and max(ids) < 2000
    assert len(set(ids)) > 500  # spread over the range, not a constant


def test_random_range_ratio_bounds() -> None:
    spec = WorkloadSpec(name="random", num_prompts=400, input_len=100, output_len=40, range_ratio=0.5)
    reqs = spec.build().single_turn_requests()
    in_lens = [len(p) for p, _ in reqs]
    out_lens = [n for _, n in reqs]
    assert min(in_lens) >= 50 and max(in_lens) <= 100 and len(set(in_lens)) > 20
    assert min(out_lens) >= 20 and max(out_lens) <= 40


@pytest.mark.parametrize("name", ["random", "shared-prefix", "multi-turn", "long-short"])
def test_same_seed_same_workload_other_seed_differs(name: str) -> None:
    kw = dict(name=name, num_prompts=20, input_len=16, output_len=4, prompts_per_group=5, num_groups=2,
              system_prompt_len=32, question_len=8, num_clients=3, num_turns=2, long_input_len=64)
    a, b, c = (WorkloadSpec(seed=s, **kw).build() for s in (3, 3, 4))
    ids = [[t.user_ids for t in s.turns] for s in a.sessions]
    assert ids == [[t.user_ids for t in s.turns] for s in b.sessions]
    assert ids != [[t.user_ids for t in s.turns] for s in c.sessions]


def test_shared_prefix_groups_share_exactly_the_system_prompt() -> None:
    spec = WorkloadSpec(name="shared-prefix", num_groups=3, prompts_per_group=4, system_prompt_len=40,
                        question_len=10, output_len=5)
    w = spec.build()
    assert w.num_requests == 12
    by_group: dict[int, list[list[int]]] = {}
    for s in w.sessions:
        assert len(s.turns[0].user_ids) == 50 and s.prefix_len == 40
        by_group.setdefault(s.group, []).append(s.turns[0].user_ids)
    assert sorted(by_group) == [0, 1, 2] and all(len(v) == 4 for v in by_group.values())
    prefixes = {g: v[0][:40] for g, v in by_group.items()}
    for g, prompts in by_group.items():
        assert all(p[:40] == prefixes[g] for p in prompts)
        assert len({tuple(p[40:]) for p in prompts}) == 4  # unique questions
    assert len({tuple(p) for p in prefixes.values()}) == 3
    assert [s.group for s in w.sessions] != sorted(s.group for s in w.sessions)  # shuffled


def test_peers_shared_prefix_shape() -> None:
    """peers.md: 128 requests = one 2,048-token prefix + 128 unique tokens, 64 out."""
    w = WorkloadSpec(name="shared-prefix", output_len=64).build()
    assert w.num_requests == 128 and w.total_output_len() == 128 * 64
    assert {len(s.turns[0].user_ids) for s in w.sessions} == {2176}


def test_multi_turn_history_grows_by_answer_and_new_tokens() -> None:
    spec = WorkloadSpec(name="multi-turn", num_clients=2, num_turns=4, input_len=30, turn_len=6, output_len=9)
    w = spec.build()
    assert w.is_multi_turn and w.num_requests == 8
    for s in w.sessions:
        assert [len(t.user_ids) for t in s.turns] == [30, 6, 6, 6]
        prompt, answer = None, None
        for k, turn in enumerate(s.turns):
            new = next_prompt(prompt, answer, turn)
            assert len(new) == 30 + k * (9 + 6)
            if prompt is not None:
                assert new[:len(prompt)] == prompt and new[len(prompt):len(prompt) + 9] == answer
                assert new[-6:] == turn.user_ids
            prompt, answer = new, [100 + k] * 9
    with pytest.raises(ValueError):
        w.single_turn_requests()


def test_long_short_mix() -> None:
    spec = WorkloadSpec(name="long-short", num_prompts=40, long_fraction=0.25, input_len=20,
                        long_input_len=300, output_len=3)
    lens = [len(p) for p in _prompts(spec)]
    assert sorted(set(lens)) == [20, 300]
    assert lens.count(300) == 10
    assert lens[:10] != [300] * 10  # mixed in, not front-loaded


@pytest.mark.parametrize("bad", [dict(name="nope"), dict(min_token_id=5, vocab_size=5),
                                 dict(range_ratio=0.0), dict(long_fraction=1.5), dict(input_len=0)])
def test_spec_rejects_bad_values(bad: dict) -> None:
    with pytest.raises(ValueError):
        WorkloadSpec(**bad)


def test_cli_flags_round_trip() -> None:
    parser = argparse.ArgumentParser()
    add_workload_args(parser)
    ns = parser.parse_args(["--workload", "shared-prefix", "--system-prompt-len", "77", "--seed", "9",
                            "--range-ratio", "0.5"])
    spec = spec_from_args(ns)
    assert spec == WorkloadSpec(name="shared-prefix", system_prompt_len=77, seed=9, range_ratio=0.5)
