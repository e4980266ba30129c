"""The host KV tier on the real default model (CPU: the host pool is a second CPU pool behind the
same code path): greedy tokens are the same with the tier on and off at page sizes 1, 16 and 64,
and with a device pool too small for the prompts, second-round prompts come back from the host
tier (cached_tokens near the prompt length) while the tier-off engine recomputes them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from radixrt.engine import Engine

GREEDY = {"temperature": 0.0, "max_new_tokens": 4}
PROMPT_LEN = 70
POOL_TOKENS = 256  # device pool: about two of the four prompts


def _prompts() -> list[list[int]]:
    rng = random.Random(17)
    return [[rng.randrange(100, 20000) for _ in range(PROMPT_LEN + k)] for k in (0, 5, 17, 33)]


def _two_rounds(model_dir: Path, page_size: int, tier: bool) -> tuple[list, list, Engine]:
    eng = Engine(model_path=str(model_dir), page_size=page_size, max_total_tokens=POOL_TOKENS, device="cpu",
                 enable_hierarchical_cache=tier, max_running_requests=2)
    prompts = _prompts()
    first = eng.generate(prompts, GREEDY)  # the later prompts evict the earlier ones from the device
    second = eng.generate(prompts, GREEDY)
    eng.scheduler.check_invariants()
    return first, second, eng


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> tuple[list, list]:
    first, second, _ = _two_rounds(model_dir, 16, tier=False)
    return first, second


# page 16 (the default) in `make test`; 1 and 64 (~1.5 min each on 2 cores) with `pytest -m stress`
@pytest.mark.parametrize("page_size", [pytest.param(1, marks=pytest.mark.stress), 16,
                                       pytest.param(64, marks=pytest.mark.stress)])
def test_tier_gives_the_same_tokens_and_hits_the_host(model_dir: Path, reference, page_size: int) -> None:
    ref_first, ref_second = reference
    want = [o["output_ids"] for o in ref_first]
    assert [o["output_ids"] for o in ref_second] == want
    first, second, eng = _two_rounds(model_dir, page_size, tier=True)
    assert [o["output_ids"] for o in first] == want
    assert [o["output_ids"] for o in second] == want
    stats = eng.stats()
    assert stats["hicache_host_hit_tokens"] > 0 and stats["hicache_load_bytes"] > 0
    # the first prompts were evicted from the device: with the tier they come back from the host
    # (all but the last prompt token can be cached), without it they are recomputed
    for p, o in zip(_prompts()[:2], second[:2], strict=True):
        assert o["meta_info"]["cached_tokens"] >= (len(p) - 1) // page_size * page_size - page_size
    assert ref_second[0]["meta_info"]["cached_tokens"] < PROMPT_LEN // 2
    assert stats["num_protected_pages"] == 0 or stats["hicache_copies_in_flight"] > 0
