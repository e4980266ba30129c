"""The CUDA worker path: Triton backend, CUDA graphs with padded batches, bf16, KV pool sizing.

Tiny random-weight checkpoints (built in-process) against Hugging Face transformers on the same
GPU. Run with `make test-gpu` on a CUDA machine; skipped elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixrt.config import ServerArgs
from radixrt.worker.model_runner import ModelRunner
from tests.models.tiny import save_tiny_model
from tests.worker.driver import GreedyDriver, single_request_batch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

BF16_ATOL = 0.1  # bf16 vs the fp32 reference; these logits span about [-2.5, 2.5]
PROMPT_LENS = [3, 17, 40, 97, 200]  # 5 requests: decode graphs of size 8 with 3 padded rows


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model("llama", d, max_position_embeddings=1024)
    return d


@pytest.fixture(scope="module")
def hf_model(tiny_dir: Path):
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).cuda().eval()


def _assert_bf16_paths_agree(got: torch.Tensor, want: torch.Tensor) -> None:
    """Two bf16 paths' logits [B, V] for one step (different kernels, so different rounding) agree
    within bf16 noise. H200, 2026-12-05 (bench/lab/graph_eager_noise.py, these tests' models, logits
    |mean| ~2, |max| ~11): the Gluon routes against the Triton / cuBLAS ones differ by max 0.11-0.14,
    mean 0.020, argmax 98-100% the same, while each bf16 path is as far from a float32 runner with
    the Gluon route as without it (max 0.76 / mean 0.087 for the GEMM's model; 3.37 / 0.47 with an
    FP8 pool). A wrong tile or request row would give logits unrelated to the right ones there,
    differing by the logits' own scale (~2; reasoned, not measured)."""
    d = (got.float() - want.float()).abs()
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    mean, worst = d.mean().item(), d.max().item()
    assert mean < 0.05 and worst < 0.4 and agree >= 0.9, (mean, worst, agree)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 300, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _args(**kw) -> ServerArgs:
    base = dict(device="cuda", dtype="float32", page_size=16, max_total_tokens=8192,
                max_running_requests=16, cuda_graph_max_bs=16)
    return ServerArgs(**{**base, **kw})


@pytest.mark.parametrize("backend,disable_graph", [("triton", False), ("triton", True), ("torch", True)])
def test_fp32_greedy_matches_hf(tiny_dir: Path, hf_model, backend: str, disable_graph: bool) -> None:
    runner = ModelRunner(_args(attention_backend=backend, disable_cuda_graph=disable_graph), tiny_dir)
    assert (runner.graphs is not None) == (backend == "triton" and not disable_graph)
    prompts = _prompts()
    ours = GreedyDriver(runner, chunk=64).generate(prompts, 16)
    for p, got in zip(prompts, ours, strict=True):
        ids = torch.tensor([p], device="cuda")
        want = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert got == want, f"prompt of {len(p)} tokens"


def test_graph_replay_equals_eager(tiny_dir: Path) -> None:
    """One decode step through the captured graph equals the same step run eagerly."""
    runner = ModelRunner(_args(), tiny_dir)
    ids = _prompts()[3]
    runner.forward_logits(single_request_batch(ids, page_size=16))
    step = single_request_batch([7], start=len(ids), page_size=16, batch_id=2)
    graph_logits = runner.forward_logits(step).clone()
    graphs, runner.graphs = runner.graphs, None
    eager_logits = runner.forward_logits(step)
    runner.graphs = graphs
    torch.testing.assert_close(graph_logits, eager_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kv_cache_dtype, tol", [("auto", 1e-4), ("fp8_e4m3", 1e-2)])
def test_graph_of_each_length_class_equals_eager(tmp_path: Path, kv_cache_dtype: str, tol: float) -> None:
    """With a 4,096-token context the decode graphs come in length classes (1,024 / 2,048 / 4,096,
    worker/cuda_graph.py): a batch-1 step over 98 and over 1,501 tokens replays the graph of its
    class (different split counts) and equals the same step run eagerly, fp32 and FP8 pools.
    (FP8: the graph's split count differs from the eager one, and P is rounded to fp16 per split.)"""
    from types import SimpleNamespace

    save_tiny_model("llama", tmp_path, max_position_embeddings=4096)
    runner = ModelRunner(_args(kv_cache_dtype=kv_cache_dtype), tmp_path)
    g = runner.graphs
    assert g is not None and g.len_classes == [1024, 2048, 4096]
    keys = {n: g.graph_key(1, n) for n in (98, 1501)}
    assert keys[98] != keys[1501] and {(1, k) for k in keys.values()} <= set(g.graphs)
    replayed = []
    for k in keys.values():  # record which graph replays
        graph = g.graphs[1, k]
        g.graphs[1, k] = SimpleNamespace(replay=lambda k=k, graph=graph: (replayed.append(k), graph.replay()))
    gen = torch.Generator().manual_seed(7)
    for n, key in keys.items():
        ids = torch.randint(0, 300, (n - 1,), generator=gen).tolist()
        runner.forward_logits(single_request_batch(ids, page_size=16))
        step = single_request_batch([7], start=len(ids), page_size=16, batch_id=2)
        graph_logits = runner.forward_logits(step).clone()
        assert runner.last_path == "graph" and replayed[-1] == key
        graphs, runner.graphs = runner.graphs, None
        eager_logits = runner.forward_logits(step)
        runner.graphs = graphs
        torch.testing.assert_close(graph_logits, eager_logits, atol=tol, rtol=tol)


def test_bf16_logits_close_to_fp32_hf(tiny_dir: Path, hf_model) -> None:
    runner = ModelRunner(_args(dtype="bfloat16"), tiny_dir)
    assert runner.info()["dtype"] == "bfloat16"
    ids = _prompts()[4]
    prefill = runner.forward_logits(single_request_batch(ids[:-1], page_size=16))[0]
    decode = runner.forward_logits(single_request_batch(ids[-1:], start=len(ids) - 1, page_size=16))[0]
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids], device="cuda")).logits[0, -2:].float()
    torch.testing.assert_close(prefill, ref[0], atol=BF16_ATOL, rtol=0)
    torch.testing.assert_close(decode, ref[1], atol=BF16_ATOL, rtol=0)


def test_pool_sized_by_mem_fraction(tiny_dir: Path) -> None:
    torch.cuda.empty_cache()
    total = torch.cuda.mem_get_info()[1]
    runner = ModelRunner(_args(dtype="bfloat16", max_total_tokens=None, mem_fraction_static=0.3), tiny_dir)
    info = runner.info()
    assert info["pool_tokens"] > 1_000_000  # a tiny model: most of the 30% goes to the pool
    assert info["pool_gib"] * (1 << 30) <= 0.3 * total
    assert info["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 2  # K+V, 2 layers, 2 kv heads, dim 16, bf16
    assert runner.pool.num_pages == info["num_pages"] and info["cuda_graph"]


@pytest.mark.parametrize("fused_max_suffix", [0, 8, None], ids=["three-launch", "both-forms", "default"])
def test_cascade_graphs_give_the_same_tokens(tiny_dir: Path, fused_max_suffix: int | None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """20 decoding requests sharing a 96-token prefix: with cascade grouping forced on, decode runs
    from the cascade CUDA graphs (size 32, 12 padded rows) and gives the plain graphs' tokens, with
    the three-launch form only (bound 0), the fused form until suffixes pass 8 tokens then the
    three-launch one (bound 8: both graph variants replay), and the default bound."""
    from radixrt.engine import Engine
    from radixrt.worker import attention_triton

    if fused_max_suffix is not None:
        monkeypatch.setattr(attention_triton, "CASCADE_FUSED_MAX_SUFFIX", fused_max_suffix)

    g = torch.Generator().manual_seed(11)
    system = torch.randint(3, 290, (96,), generator=g).tolist()
    prompts = [system + torch.randint(3, 290, (1 + i % 7,), generator=g).tolist() for i in range(20)]
    params = {"temperature": 0.0, "max_new_tokens": 10, "ignore_eos": True}
    outs = {}
    for cascade in (False, True):
        eng = Engine(model_path=str(tiny_dir), device="cuda", dtype="float32", page_size=16,
                     max_total_tokens=16384, max_running_requests=32, cuda_graph_max_bs=32,
                     disable_cascade_attention=not cascade)
        assert bool(eng.runner.graphs.cascade_graphs) == cascade
        if cascade:  # both variants captured unless the fused form is off
            assert {f for _, f in eng.runner.graphs.cascade_graphs} == ({False} if fused_max_suffix == 0
                                                                         else {False, True})
        if cascade:
            eng.scheduler.cascade_min_saved_tokens = 1
        outs[cascade] = [o["output_ids"] for o in eng.generate(prompts, params)]
        assert (eng.scheduler.num_cascade_passes > 0) == cascade
    assert outs[True] == outs[False]


def test_skinny_gemm_decode_matches_hf(tiny_dir: Path, hf_model, monkeypatch: pytest.MonkeyPatch) -> None:
    """RADIXRT_SKINNY_GEMM=1: decode-sized linears (<= 16 rows) run the Triton skinny GEMM, in and
    out of CUDA graphs; fp32 greedy tokens still equal HF `generate`."""
    from radixrt.models.linear import Linear

    monkeypatch.setattr(Linear, "_skinny", True)
    runner = ModelRunner(_args(), tiny_dir)
    prompts = _prompts()
    ours = GreedyDriver(runner, chunk=64).generate(prompts, 16)
    assert runner.model.lm_head._workspace is not None  # the skinny path ran
    for p, got in zip(prompts, ours, strict=True):
        ids = torch.tensor([p], device="cuda")
        want = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert got == want, f"prompt of {len(p)} tokens"


@pytest.mark.parametrize("silu_min_rows", [1024, 16])  # the fused SiLU off / on at a 40-token prefill
def test_fp8_fused_activation_quantization_on_cuda(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                   silu_min_rows: int) -> None:
    """bf16 model with FP8 linears on CUDA: a 40-token prefill (W8A8 rows) with the RMSNorm / SiLU
    kernels quantizing the linears' inputs gives the logits of the linears quantizing their own
    inputs, up to the fused norm's fp32 summation order; the fused kernels do run."""
    import radixrt.kernels as K
    from radixrt.kernels import activation
    from radixrt.models.quant.fp8 import Fp8Linear

    monkeypatch.setattr(activation, "QUANT_FUSED_MIN_ROWS", silu_min_rows)
    calls = {"rms_norm_quant_fp8": 0, "silu_and_mul_quant_fp8": 0}
    for name in calls:  # ops.rms_norm_fp8 / silu_and_mul_fp8 look them up at each call
        real = getattr(K, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(K, name, spy)
    runner = ModelRunner(_args(dtype="bfloat16", quantization="fp8", disable_cuda_graph=True), tiny_dir)
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    monkeypatch.setattr(Fp8Linear, "fused_quant", True)
    fused = runner.forward_logits(single_request_batch(ids, page_size=16))[0].float()
    layers = len(runner.model.model.layers)
    assert calls["rms_norm_quant_fp8"] == 2 * layers
    assert calls["silu_and_mul_quant_fp8"] == (layers if silu_min_rows <= 40 else 0)
    monkeypatch.setattr(Fp8Linear, "fused_quant", False)
    plain = runner.forward_logits(single_request_batch(ids, page_size=16, batch_id=2))[0].float()
    assert torch.isfinite(fused).all()
    torch.testing.assert_close(fused, plain, atol=2e-2, rtol=0)


def test_l2_prefetch_in_the_decode_graph_changes_nothing(tiny_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """RADIXRT_L2_PREFETCH on (radixrt/models/llama.py L2Prefetch): a batch-1 decode step replayed
    from a graph captured with the side-stream prefetch (a fork and a join in the graph) gives the
    logits of the same step from a runner without it; the prefetch stream was made and used."""
    from radixrt.models.llama import L2Prefetch

    ids = _prompts()[3]
    step = single_request_batch([7], start=len(ids), page_size=16, batch_id=2)
    logits = {}
    for on in (True, False):
        monkeypatch.setattr(L2Prefetch, "enabled", on)
        runner = ModelRunner(_args(), tiny_dir)
        assert runner.graphs is not None
        runner.forward_logits(single_request_batch(ids, page_size=16))
        logits[on] = runner.forward_logits(step).clone()
        assert runner.last_path == "graph"  # the step replayed the graph captured with the fork / join
        assert (runner.model.l2_prefetch.stream is not None) == on
    torch.testing.assert_close(logits[True], logits[False], atol=1e-5, rtol=1e-5)


def test_fp8_fused_norms_in_the_decode_graph(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 model with FP8 linears: a batch-1 decode step replayed from a graph captured with the
    RMSNorms split across the int GEMVs (Fp8Linear.forward_then_norm; RADIXRT_FP8_FUSED_NORM) equals
    the same step run eagerly, and is within bf16 roundings of a runner with the norms as kernels."""
    from radixrt.models.quant.fp8 import Fp8Linear

    ids = _prompts()[3]
    step = single_request_batch([7], start=len(ids), page_size=16, batch_id=2)
    logits = {}
    for on in (True, False):
        monkeypatch.setattr(Fp8Linear, "fused_norm", on)
        runner = ModelRunner(_args(dtype="bfloat16", quantization="fp8"), tiny_dir)
        h = torch.zeros(1, runner.model.config.hidden_size, device="cuda", dtype=torch.bfloat16)
        assert runner.graphs is not None and runner.model.fused_norms(h) == on
        runner.forward_logits(single_request_batch(ids, page_size=16))
        logits[on] = runner.forward_logits(step).clone()
        assert runner.last_path == "graph"
        if on:
            graphs, runner.graphs = runner.graphs, None
            eager = runner.forward_logits(step)
            runner.graphs = graphs
            torch.testing.assert_close(logits[on], eager, atol=1e-2, rtol=0)
    assert torch.isfinite(logits[True]).all()
    torch.testing.assert_close(logits[True], logits[False], atol=5e-2, rtol=0)


def test_decode_graph_linears_take_the_gluon_gemm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hopper, bf16, RADIXRT_GEMM_WS=all: the decode graphs of 17..128 requests were captured with
    their linears through kernels/gemm_ws.py (gemm_ws for qkv / o / down, gemm_silu_ws for gate_up
    with its SiLU) and the smaller ones without; a 64-request decode step replayed from its graph
    gives the logits of the same step run eagerly (F.linear and the SiLU kernel)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper GPU")
    from radixrt.kernels import gemm_ws as gw

    plain: list[int] = []
    gated: list[int] = []
    real_plain, real_gated = gw.gemm_ws, gw.gemm_silu_ws
    monkeypatch.setattr(gw, "gemm_ws", lambda *a, **kw: plain.append(len(a[0])) or real_plain(*a, **kw))
    monkeypatch.setattr(gw, "gemm_silu_ws", lambda *a, **kw: gated.append(len(a[0])) or real_gated(*a, **kw))
    monkeypatch.setenv("RADIXRT_GEMM_WS", "all")
    save_tiny_model("llama", tmp_path, hidden_size=1024, num_attention_heads=8, num_key_value_heads=4,
                    intermediate_size=512)
    bs, prompt_len = 64, 100
    runner = ModelRunner(_args(dtype="bfloat16", max_total_tokens=bs * 160 + 1024, max_running_requests=bs,
                               cuda_graph_max_bs=bs, disable_cascade_attention=True), tmp_path)
    assert runner.graphs is not None
    assert bs in plain and bs in gated, (sorted(set(plain)), sorted(set(gated)))
    assert min(plain + gated) >= 17  # batches of 16 and fewer keep the skinny GEMM
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 300, (prompt_len,), generator=gen).tolist() for _ in range(bs)]
    driver = GreedyDriver(runner, chunk=2048)
    first = driver.generate(prompts, 1)
    step = driver._batch(list(range(bs)), [[o[0]] for o in first], [prompt_len] * bs, [], 16, 0.0, None,
                         [1] * bs)
    plain.clear()
    gated.clear()
    graph_logits = runner.forward_logits(step)
    assert runner.last_path == "graph"
    graphs, runner.graphs = runner.graphs, None
    eager_logits = runner.forward_logits(step)
    runner.graphs = graphs
    assert plain == [] and gated == []  # neither the replay nor an eager pass calls it from Python
    _assert_bf16_paths_agree(graph_logits, eager_logits)


def test_fp8_kv_decode_graph_takes_the_gluon_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hopper, bf16 weights, an FP8 KV pool, head dim 128, 64 requests (one KV split): the decode
    graphs of the length classes >= 4,096 carry the Gluon route in their keys ("+ws") and were
    captured through decode_attention_ws; the shorter classes' keys do not. A decode step over
    4,100-token sequences, replayed from the graph, gives the logits of the same step run eagerly
    with RADIXRT_DECODE_WS=0 (the Triton split kernel)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper GPU")
    from radixrt.kernels import decode_attention_ws as ws

    calls: list[int] = []
    real = ws.decode_attention_ws

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(ws, "decode_attention_ws", counted)
    monkeypatch.delenv("RADIXRT_DECODE_WS", raising=False)
    save_tiny_model("llama", tmp_path, hidden_size=1024, num_attention_heads=8, num_key_value_heads=4,
                    intermediate_size=256, max_position_embeddings=8192)
    bs, prompt_len = 64, 4100
    runner = ModelRunner(_args(dtype="bfloat16", kv_cache_dtype="fp8_e4m3", max_total_tokens=bs * 4160 + 1024,
                               max_running_requests=bs, cuda_graph_max_bs=bs, disable_cascade_attention=True),
                         tmp_path)
    g = runner.graphs
    assert g is not None and g.len_classes[-1] == 8192
    keys = {n: g.graph_key(bs, n) for n in g.len_classes}
    assert [str(k[1]).endswith("+ws") for k in keys.values()] == [n >= 4096 for n in keys], keys
    assert str(g.graph_key(bs, prompt_len + 1)[1]).endswith("+ws")  # the graph the step below replays
    assert bs in calls, "no graph of size 64 was captured through the Gluon kernel"
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 300, (prompt_len,), generator=gen).tolist() for _ in range(bs)]
    driver = GreedyDriver(runner, chunk=2048)
    first = driver.generate(prompts, 1)  # the prefill passes and each request's first token
    step = driver._batch(list(range(bs)), [[o[0]] for o in first], [prompt_len] * bs, [], 16, 0.0, None,
                         [1] * bs)
    graph_logits = runner.forward_logits(step)  # (a new float32 tensor)
    assert runner.last_path == "graph"
    monkeypatch.setenv("RADIXRT_DECODE_WS", "0")
    graphs, runner.graphs = runner.graphs, None
    eager_logits = runner.forward_logits(step)
    runner.graphs = graphs
    _assert_bf16_paths_agree(graph_logits, eager_logits)
