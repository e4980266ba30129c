"""Adaptive chunked prefill (radixrt/scheduler/chunking.py): long prompt chunks are bounded by their
estimated cost (linear layers + attention over the context), to what the full chunk costs from a
prompt's start when the prompt is alone and to a latency chunk's beside decodes, waiting prompts or
recent short arrivals; short prompts keep the pass budget and join the very next pass."""

from __future__ import annotations

import random

import pytest

from radixrt.config import ServerArgs
from radixrt.memory.kv_manager import KVManager
from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import RadixCache
from radixrt.protocol import ForwardBatch, ForwardResult
from radixrt.scheduler.batch import build_forward_batch
from radixrt.scheduler.chunking import (
    INTERACTIVE_WINDOW_S,
    chunk_cap,
    chunk_cost,
    latency_chunk,
    tokens_within_cost,
)
from radixrt.scheduler.pipeline import LATE_BINDING_PREFILL_TOKENS, PassPipeline
from radixrt.scheduler.scheduler import Scheduler
from tests.scheduler.fake_worker import FakeWorker
from tests.scheduler.test_scheduler import EOS, VOCAB, gen, run_to_idle

CHUNK = 2048  # latency chunk: 512
CONTEXT = 4096
PAGE = 16
ATTN = 2048  # attention_context of SmolLM2-135M: a chunk at 2,048 tokens of context costs ~2x


class Clock:
    """A settable monotonic clock (seconds)."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(adaptive: bool = True, num_pages: int = 1024, chunk: int = CHUNK,
         context: int = CONTEXT) -> tuple[Scheduler, FakeWorker, Clock]:
    alloc = PageAllocator(num_pages)
    clock = Clock()
    sched = Scheduler(KVManager(alloc, RadixCache(alloc, PAGE), PAGE), page_size=PAGE,
                      max_running_requests=16, chunk_size=chunk, context_len=context, vocab_size=VOCAB,
                      eos_token_ids=[EOS], adaptive_chunk=adaptive, attn_context=ATTN, clock=clock)
    return sched, FakeWorker(num_pages, PAGE, 16, context // PAGE + 2, VOCAB), clock


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, EOS) for _ in range(n)]


def step(sched: Scheduler, worker: FakeWorker) -> dict[str, int]:
    """One pass without overlap: {rid: extend_len}."""
    sb = sched.schedule()
    assert sb is not None
    sched.process_result(sb, worker.forward(build_forward_batch(sb)))
    return {it.req.rid: it.extend_len for it in sb.items}


def long_chunk(start: int, tokens: int) -> int:
    """What a long prompt at `start` gets from a budget of `tokens` tokens' cost from position 0,
    ending on a page edge (start is page-aligned in these tests)."""
    return tokens_within_cost(start, chunk_cost(0, tokens, ATTN), ATTN) // PAGE * PAGE


# ----------------------------------------------------------------------------- the pure policy


def test_latency_chunk_is_a_quarter_of_the_chunk_with_a_floor() -> None:
    assert latency_chunk(8192, 16) == 2048
    assert latency_chunk(2048, 16) == 512
    assert latency_chunk(512, 16) == 512  # the CPU default is not cut
    assert latency_chunk(100, 16) == 100
    assert latency_chunk(3000, 64) == 704  # page multiple


def test_chunk_cost_grows_with_the_context_before_the_chunk() -> None:
    assert chunk_cost(0, 1, 1000) == pytest.approx(1.001)
    assert chunk_cost(0, 1000, 1000) == pytest.approx(1000 * (1 + 500.5 / 1000))
    assert chunk_cost(3000, 1000, 1000) == pytest.approx(1000 * (1 + 3500.5 / 1000))  # ~2.3x
    assert chunk_cost(3000, 1000, 10**9) == pytest.approx(1000, rel=1e-5)  # attention negligible


@pytest.mark.parametrize("attn", [2048, 16384, 21674])
def test_tokens_within_cost_inverts_chunk_cost(attn: int) -> None:
    for n in (1, 512, 2048, 8192):
        assert tokens_within_cost(0, chunk_cost(0, n, attn), attn) == n  # the first chunk, exactly
    for start in (1, 100, 4096, 30000):
        budget = chunk_cost(0, 2048, attn)
        n = tokens_within_cost(start, budget, attn)
        assert 0 < n < 2048
        assert chunk_cost(start, n, attn) <= budget < chunk_cost(start, n + 1, attn)
    assert tokens_within_cost(10**6, 1.0, attn) == 0  # not even one token
    assert tokens_within_cost(0, 0.0, attn) == 0


def test_attention_context_from_the_model_shape() -> None:
    from radixrt.scheduler.chunking import attention_context

    assert attention_context(3584, 18944, 3584, 512) == 21674  # Qwen2.5-7B
    assert attention_context(576, 1536, 576, 192) == 2048  # SmolLM2-135M
    with pytest.raises(ValueError):
        attention_context(0, 1536, 576, 192)


def test_the_interactive_window() -> None:
    from radixrt.scheduler.chunking import is_interactive

    assert not is_interactive(10.0, None)
    assert is_interactive(10.0, 10.0 - INTERACTIVE_WINDOW_S)
    assert not is_interactive(10.0, 10.0 - INTERACTIVE_WINDOW_S - 0.01)


def test_chunk_cap_in_each_situation() -> None:
    """Alone: the full chunk's cost; contended (waiting, or interactive): a latency chunk's; short
    prompts uncut; long prompts share the budget; an explicit chunk keeps its token rule."""
    alone = chunk_cap(8192, 16, True, [], 1, attn_context=21674)
    assert alone.limit(32000, 0, admitting=True) == 8192
    assert alone.limit(24000, 8192) == tokens_within_cost(8192, chunk_cost(0, 8192, 21674), 21674) // 16 * 16
    assert alone.limit(24000, 8192) < 8192  # a late pass costs what the first did
    assert alone.limit(2048, 30000) == 2048  # at most the latency chunk left: short, not cut
    busy = chunk_cap(8192, 16, True, [], 2, attn_context=21674)
    assert busy.limit(32000, 0, admitting=True) == 2048
    deep = busy.limit(2100, 30000)
    assert 512 < deep < 1024 and deep % 16 == 0  # ~890 tokens deep into a 32K prompt
    assert chunk_cap(8192, 16, True, [], 1, attn_context=21674, interactive=True).limit(32000, 0) == 2048
    busy.take(32000, 0, 2048)  # a second long prompt of the same pass gets nothing more
    assert busy.limit(9000, 0, admitting=True) == 0
    assert busy.limit(100, 0, admitting=True) == 100  # a short one still does
    fixed = chunk_cap(8192, 16, False, [], 1)
    assert fixed.limit(24000, 30000) == 4096  # tokens, whatever the context (half: a request waits)
    assert fixed.limit(24000, 0, admitting=True) == 24000  # admission is not cut (budget is)


def test_a_long_prompt_always_progresses() -> None:
    cap = chunk_cap(512, 16, True, [], 2, attn_context=64)
    assert cap.limit(4000, 100_000) == 16  # the cost allows not one token: up to the next page edge
    assert cap.limit(4000, 100_008) == 8


# ----------------------------------------------------------------------------- the scheduler


def test_a_long_prompt_alone_takes_the_full_chunk() -> None:
    sched, worker, _ = make()
    sched.add_request(gen("long", prompt(random.Random(1), 3000), 2))
    assert step(sched, worker) == {"long": CHUNK}
    assert step(sched, worker) == {"long": 3000 - CHUNK}  # costs less than the first pass


def test_a_lone_long_prompts_late_passes_cost_what_its_first_did() -> None:
    sched, worker, _ = make()
    sched.add_request(gen("long", prompt(random.Random(8), 4000), 2))
    assert step(sched, worker) == {"long": CHUNK}
    second = step(sched, worker)["long"]
    assert second == long_chunk(CHUNK, CHUNK) and second < 4000 - CHUNK
    assert chunk_cost(CHUNK, second, ATTN) <= chunk_cost(0, CHUNK, ATTN)
    assert step(sched, worker) == {"long": 4000 - CHUNK - second}


def test_a_long_prefill_beside_waiting_shorts_is_cut_and_the_shorts_join_the_next_pass() -> None:
    sched, worker, _ = make()
    rng = random.Random(2)
    sched.add_request(gen("long", prompt(rng, 3900), 2))
    assert step(sched, worker) == {"long": CHUNK}
    for i in range(3):
        sched.add_request(gen(f"short{i}", prompt(rng, 100), 2))
    got = step(sched, worker)
    cut = long_chunk(CHUNK, latency_chunk(CHUNK, PAGE))
    assert cut < latency_chunk(CHUNK, PAGE)  # 2,048 tokens into the prompt: fewer than at its start
    assert got == {"long": cut, "short0": 100, "short1": 100, "short2": 100}
    # the shorts now decode beside it: the long prompt keeps a latency chunk's cost
    got = step(sched, worker)
    assert got["long"] == long_chunk(CHUNK + cut, latency_chunk(CHUNK, PAGE))
    assert all(got[f"short{i}"] == 1 for i in range(3))


def test_a_long_prompt_arriving_beside_decodes_starts_with_the_latency_chunk() -> None:
    sched, worker, _ = make()
    rng = random.Random(3)
    sched.add_request(gen("stream", prompt(rng, 20), 50))
    step(sched, worker)
    sched.add_request(gen("long", prompt(rng, 3000), 2))
    assert step(sched, worker) == {"stream": 1, "long": latency_chunk(CHUNK, PAGE)}


def test_a_lone_long_prompt_after_a_recent_short_arrival_takes_latency_chunks() -> None:
    """Interactive traffic: a short request arrived within INTERACTIVE_WINDOW_S, so a long prompt
    alone still takes latency chunks (a short arriving next waits for a short pass, not a full
    chunk); once the window has passed it takes the full chunk's cost again."""
    sched, worker, clock = make()
    rng = random.Random(9)
    sched.add_request(gen("short", prompt(rng, 100), 1))
    assert step(sched, worker) == {"short": 100}
    assert sched.is_idle
    clock.t += 1.0
    sched.add_request(gen("long", prompt(rng, 3900), 2))  # alone: nothing decodes, nothing waits
    assert step(sched, worker) == {"long": latency_chunk(CHUNK, PAGE)}
    clock.t += INTERACTIVE_WINDOW_S  # the short arrived INTERACTIVE_WINDOW_S + 1 s ago
    assert step(sched, worker) == {"long": long_chunk(latency_chunk(CHUNK, PAGE), CHUNK)}


def test_short_prompts_beside_decodes_still_fill_the_pass_budget() -> None:
    """Only long prompts are cut: a burst of prompts under the latency chunk is admitted as before."""
    sched, worker, _ = make()
    rng = random.Random(4)
    sched.add_request(gen("stream", prompt(rng, 20), 50))
    step(sched, worker)
    for i in range(4):
        sched.add_request(gen(f"p{i}", prompt(rng, 500), 2))
    got = step(sched, worker)
    assert got == {"stream": 1, "p0": 500, "p1": 500, "p2": 500, "p3": 500}


def test_long_prompts_share_one_latency_budget_per_pass() -> None:
    sched, worker, _ = make()
    rng = random.Random(5)
    sched.add_request(gen("stream", prompt(rng, 20), 50))
    step(sched, worker)
    for i in range(3):
        sched.add_request(gen(f"long{i}", prompt(rng, 1500), 2))
    sched.add_request(gen("short", prompt(rng, 40), 2))
    budget = chunk_cost(0, latency_chunk(CHUNK, PAGE), ATTN)
    for _ in range(4):
        starts = {r.rid: r.kv.kv_len if r.kv is not None else 0 for r in sched.reqs.values()}
        got = step(sched, worker)
        spent = sum(chunk_cost(starts[rid], n, ATTN) for rid, n in got.items() if rid.startswith("long"))
        assert 0 < spent <= budget
        if "short" in got:
            break
    assert got.get("short") == 40  # a short prompt behind the long ones is not held back by them


def test_an_explicit_chunk_keeps_the_fixed_rule() -> None:
    """adaptive off: a prompt in progress takes half the chunk while requests wait, a new one the chunk."""
    sched, worker, _ = make(adaptive=False)
    rng = random.Random(6)
    sched.add_request(gen("long", prompt(rng, 3900), 2))
    assert step(sched, worker) == {"long": CHUNK}
    sched.add_request(gen("short", prompt(rng, 100), 2))
    assert step(sched, worker) == {"long": CHUNK // 2, "short": 100}


class Launcher:
    """PassLauncher over the FakeWorker: passes run when finished, in launch order."""

    def __init__(self, worker: FakeWorker) -> None:
        self.worker = worker
        self.launched: list[ForwardBatch] = []

    def launch(self, fb: ForwardBatch) -> ForwardBatch:
        self.launched.append(fb)
        return fb

    def finish(self, fb: ForwardBatch) -> ForwardResult:
        return self.worker.forward(fb)


def test_a_short_arriving_deep_into_a_long_prefill_joins_the_very_next_pass() -> None:
    """Through the pass pipeline with overlap, driven as SchedulerLoop.run drives it: a latency
    chunk deep into a long prompt has fewer tokens than LATE_BINDING_PREFILL_TOKENS but costs more,
    so the next pass is built only after it ends, and a short request that arrived meanwhile is in
    that pass, whole, beside the long prompt's next chunk (not after its remaining chunks)."""
    sched, worker, _ = make(num_pages=1024, chunk=8192, context=12288)
    rng = random.Random(10)
    pipeline = PassPipeline(sched, Launcher(worker), overlap=True)
    sched.add_request(gen("stream", prompt(rng, 20), 400))  # decodes all along: contended
    sched.add_request(gen("long", prompt(rng, 12000), 2))

    def loop_step() -> None:  # SchedulerLoop.run: late binding, then arrivals, then the step
        if pipeline.long_pass_in_flight:
            pipeline.finish_in_flight()
        pipeline.step()

    long_req = sched.reqs["long"]
    while long_req.kv is None or long_req.kv.kv_len < 6000:
        loop_step()
    flight = pipeline.in_flight
    assert flight is not None
    chunk = {it.req.rid: it.extend_len for it in flight.sb.items}["long"]
    assert chunk < LATE_BINDING_PREFILL_TOKENS and pipeline.long_pass_in_flight
    sched.add_request(gen("short", prompt(rng, 128), 4))  # arrives while that pass runs
    loop_step()
    nxt = {it.req.rid: it.extend_len for it in pipeline.in_flight.sb.items}
    assert nxt["short"] == 128 and nxt["stream"] == 1 and 0 < nxt["long"] <= chunk


@pytest.mark.parametrize("overlap", [False, True])
def test_adaptive_chunks_give_the_reference_outputs(overlap: bool) -> None:
    sched, worker, _ = make()
    rng = random.Random(7)
    prompts = {f"r{i}": prompt(rng, n) for i, n in enumerate([3000, 40, 1200, 700, 2500, 90])}
    arrivals = {0: ["r0", "r1"], 2: ["r2", "r3"], 3: ["r4"], 5: ["r5"]}

    def arrive(k: int) -> None:
        for rid in arrivals.get(k, []):
            sched.add_request(gen(rid, prompts[rid], 6))

    res = run_to_idle(sched, worker, on_step=arrive, overlap=overlap, min_steps=6)
    for rid, p in prompts.items():
        seq, want = list(p), []
        for _ in range(6):
            want.append(worker.next_token(seq))
            seq.append(want[-1])
            if want[-1] == EOS:
                break
        assert res["outputs"][rid] == want


def test_the_chunk_adapts_only_without_the_flag() -> None:
    assert ServerArgs().adaptive_chunked_prefill()
    assert not ServerArgs(chunked_prefill_size=8192).adaptive_chunked_prefill()


def test_the_factory_reads_the_cost_model_from_config_json(tmp_path) -> None:
    import json

    from radixrt.scheduler.chunking import DEFAULT_ATTENTION_CONTEXT
    from radixrt.scheduler.factory import attention_context_of

    qwen7b = {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
              "num_key_value_heads": 4}
    (tmp_path / "config.json").write_text(json.dumps(qwen7b))
    assert attention_context_of(tmp_path) == 21674
    assert attention_context_of(None) == DEFAULT_ATTENTION_CONTEXT
    assert attention_context_of(tmp_path / "missing") == DEFAULT_ATTENTION_CONTEXT
