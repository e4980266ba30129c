"""A model sharded over two gloo ranks computes what the unsharded model computes: logits within
fp32 tolerance and the same greedy tokens, with KV heads split (2 KV heads) and replicated (1 KV
head, tied embeddings), from dummy weights and from a safetensors checkpoint read slice by slice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from radixrt.models.model_config import parse_config
from radixrt.parallel.layout import ShardLayout, check_divisible, local_config
from tests.tp.tp_ranks import compute, rank_main, tiny_model_dir, write_safetensors


@pytest.fixture(scope="module")
def tp_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], list[dict], list[dict]]:
    """(--tp-size 1 results, rank 0's, rank 1's) for the three cases (one spawn of two ranks)."""
    tmp = tmp_path_factory.mktemp("tp")
    split = tiny_model_dir(tmp / "kv2", num_kv_heads=2, tie=False)
    replicated = tiny_model_dir(tmp / "kv1", num_kv_heads=1, tie=True)
    ckpt = tiny_model_dir(tmp / "ckpt", num_kv_heads=2, tie=False)
    write_safetensors(ckpt)
    cases = [(str(split), "dummy"), (str(replicated), "dummy"), (str(ckpt), "auto")]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = [compute(Path(d), fmt) for d, fmt in cases]
    finally:
        torch.set_num_threads(before)
    mp.spawn(rank_main, args=(str(tmp / "store"), cases, str(tmp)), nprocs=2, join=True)
    return ref, torch.load(tmp / "tp2.pt"), torch.load(tmp / "tp2_rank1.pt")


@pytest.mark.parametrize("case", [0, 1, 2], ids=["kv-split-dummy", "kv-replicated-tied", "safetensors"])
def test_tp2_matches_tp1(tp_results, case: int) -> None:
    ref, rank0, rank1 = (r[case] for r in tp_results)
    assert ref["logits"].shape == rank0["logits"].shape == (1, 1001)
    torch.testing.assert_close(rank0["logits"], ref["logits"], rtol=1e-4, atol=1e-5)
    assert rank0["tokens"] == ref["tokens"]
    # every rank samples the same tokens from the same all-gathered logits
    assert torch.equal(rank0["logits"], rank1["logits"]) and rank1["tokens"] == rank0["tokens"]
    assert rank0["num_pages"] == rank1["num_pages"] == ref["num_pages"]
    assert rank0["kv_heads"] == 1  # 2 KV heads split over 2 ranks, or 1 replicated on both


def _cfg(heads: int, kv: int, inter: int = 512):
    return parse_config({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 11,
                         "hidden_size": 64 * heads, "intermediate_size": inter, "num_hidden_layers": 1,
                         "num_attention_heads": heads, "num_key_value_heads": kv,
                         "max_position_embeddings": 64}, {}, [])


def test_layout_ranges_and_padding() -> None:
    cfg = _cfg(heads=8, kv=2)
    layouts = [ShardLayout(cfg, r, 4) for r in range(4)]
    assert [lay.q_rows() for lay in layouts] == [(0, 128), (128, 256), (256, 384), (384, 512)]
    assert [lay.kv_rows() for lay in layouts] == [(0, 64), (0, 64), (64, 128), (64, 128)]  # replicated
    assert local_config(cfg, 4).num_kv_heads == 1 and local_config(cfg, 4).num_heads == 2
    emb = torch.arange(11 * 2, dtype=torch.float32).view(11, 2)
    last = layouts[3].take("model.embed_tokens.weight", emb, (11, 2))  # vocab 11 -> 3 rows per rank
    assert torch.equal(last, torch.cat([emb[9:], torch.zeros(1, 2)]))
    bias = torch.ones(4)
    assert torch.equal(layouts[1].take("model.layers.0.mlp.down_proj.bias", bias, (4,)), torch.zeros(4))
    assert torch.equal(layouts[0].take("model.layers.0.mlp.down_proj.bias", bias, (4,)), bias)


@pytest.mark.parametrize(("heads", "kv", "inter", "size"), [(6, 2, 512, 4), (8, 3, 512, 2), (8, 2, 510, 4)])
def test_sizes_that_do_not_divide_are_refused(heads: int, kv: int, inter: int, size: int) -> None:
    with pytest.raises(ValueError, match="--tp-size"):
        check_divisible(_cfg(heads, kv, inter), size)


def test_flags_refused_with_tp() -> None:
    from radixrt.config import ServerArgs
    from radixrt.engine import Engine

    with pytest.raises(ValueError, match="--tp-size must be >= 1"):
        ServerArgs(tp_size=0)
    with pytest.raises(ValueError, match="hierarchical-cache with --tp-size"):
        ServerArgs(tp_size=2, enable_hierarchical_cache=True)
    with pytest.raises(ValueError, match="tp_size must be 1"):
        Engine(tp_size=2, device="cpu", load_format="dummy")


def test_launcher_refuses_a_tp_size_that_does_not_divide(tmp_path: Path) -> None:
    import subprocess
    import sys

    from bench.server_proc import free_port

    d = tiny_model_dir(tmp_path / "m", num_kv_heads=2, tie=False)
    cmd = [sys.executable, "-m", "radixrt.cli", "launch-server", "--model-path", str(d), "--load-format",
           "dummy", "--device", "cpu", "--tp-size", "3", "--port", str(free_port())]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--tp-size 3 does not divide the model's 4 attention heads" in r.stderr
