"""The host side of the Gluon decode-batch GEMM (kernels/gemm_ws.py) on the CPU: config validation,
the split plan (no empty split, every K step covered once), the workspace it asks for against the
largest partial and counter index its kernel computes, the default configs of the 7B decode linears
(fitting shared memory and registers), `supported` refusing CPU tensors, and the Linear routing's
shared workspace (grown, never shrunk, outgrown tensors kept alive for graphs that hold them).
The kernel itself runs only on a Hopper GPU: tests/kernels/test_gemm_ws_gpu.py."""

from __future__ import annotations

import itertools

import pytest
import torch

SHAPES = [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944), (1000, 1536), (640, 2000)]


def _ws():
    from radixrt.kernels import gemm_ws

    return gemm_ws


@pytest.mark.parametrize("kwargs", [{"block_n": 32}, {"block_n": 512}, {"block_k": 256}, {"stages": 1},
                                    {"splits": 0}])
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        _ws().GemmWsConfig(**kwargs)


@pytest.mark.parametrize("k", [16, 64, 65, 1536, 2000, 3584, 18944])
@pytest.mark.parametrize("block_k,splits", list(itertools.product((64, 128), (1, 2, 3, 4, 6, 8, 12, 1000))))
def test_split_plan_covers_every_step_once(k, block_k, splits):
    ws = _ws()
    total, per, used = ws.split_plan(k, ws.GemmWsConfig(128, block_k, 3, splits))
    assert total == -(-k // block_k)
    assert 1 <= used <= min(splits, total)
    steps = [min(per, total - s * per) for s in range(used)]  # the kernel's n_steps per split
    assert all(n >= 1 for n in steps) and sum(steps) == total


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [17, 32, 33, 64, 100, 128])
@pytest.mark.parametrize("block_n,splits", [(128, 1), (128, 3), (64, 4), (64, 7), (256, 5)])
def test_workspace_need_bounds_the_kernel_indices(n, k, m, block_n, splits):
    ws = _ws()
    cfg = ws.GemmWsConfig(block_n, 64, 3, splits)
    need_p, need_c = ws.workspace_need(cfg, m, n, k)
    _, _, used = ws.split_plan(k, cfg)
    if used == 1:
        assert (need_p, need_c) == (0, 0)
        return
    mp, tiles, tpc = ws.rows_padded(m), -(-n // block_n), 32 * ws.config_warps(cfg) // block_n
    # _mma_ring: partials (pid_n * splits + pid_k) * BN * MP + r * MP + m; counters
    # pid_n * BN * TPC + r * TPC + t, at the largest pid_n, pid_k, r, m, t
    assert ((tiles - 1) * used + used - 1) * block_n * mp + (block_n - 1) * mp + mp - 1 == need_p - 1
    assert (tiles - 1) * block_n * tpc + (block_n - 1) * tpc + tpc - 1 == need_c - 1


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [17, 48, 64, 128])
def test_default_configs_fit(n, k, m):
    ws = _ws()
    cfg = ws.default_config(m, n, k, 132)
    mp = ws.rows_padded(m)
    assert ws.fits(cfg, mp) and ws.shared_memory_bytes(cfg, mp) <= ws.SMEM_LIMIT
    tiles = -(-n // cfg.block_n)
    total, per, used = ws.split_plan(k, cfg)
    assert tiles * used <= max(132, tiles)  # no second partial wave made by splitting
    assert used == 1 or per >= 4  # a split streams at least 4 K steps (its ring's fill is paid over them)


@pytest.mark.parametrize("n,k", [(256, 512), (128, 1024), (512, 1024)])
def test_default_split_streams_at_least_four_k_steps(n, k):
    """Few tiles leave many SMs idle, but a split of fewer than 4 K steps pays its ring's fill and
    its partial's round trip for too little work: the default stops at one split per 4 steps."""
    ws = _ws()
    cfg = ws.default_config(64, n, k, 132)
    total, per, used = ws.split_plan(k, cfg)
    assert used > 1 and per >= 4 and used == total // 4


def test_rows_padded_buckets():
    ws = _ws()
    assert [ws.rows_padded(m) for m in (17, 32, 33, 64, 65, 128)] == [32, 32, 64, 64, 128, 128]


def test_supported_refuses_cpu_and_other_shapes():
    ws = _ws()
    x, w = torch.zeros(64, 256, dtype=torch.bfloat16), torch.zeros(128, 256, dtype=torch.bfloat16)
    assert not ws.supported(x, w)  # CPU tensors
    with pytest.raises(ValueError):
        ws.gemm_ws(torch.zeros(8, 256, dtype=torch.bfloat16), w)  # 8 rows: below MIN_M


def test_linear_outside_cuda_never_routes(monkeypatch):
    from radixrt.models import linear as L

    monkeypatch.setenv("RADIXRT_GEMM_WS", "all")
    lin = L.Linear(64, 32)
    monkeypatch.setattr(L.Linear, "_gemm_ws", lambda self, x: pytest.fail("routed a CPU call"))
    x = torch.randn(40, 64)
    with L.decode_graph_calls():
        y = lin(x)
    assert torch.allclose(y, torch.nn.functional.linear(x, lin.weight, lin.bias), atol=1e-5)
    assert L._graph_calls == 0


def test_shared_workspace_grows_and_keeps_what_it_outgrew(monkeypatch):
    from radixrt.models import linear as L

    monkeypatch.setattr(L, "_gemm_ws_scratch", {})
    monkeypatch.setattr(L, "_gemm_ws_retired", [])
    dev = torch.device("cpu")
    first = L._gemm_ws_workspace(dev, 100, 10)
    assert first[0].numel() == 100 and first[1].numel() == 10 and int(first[1].abs().sum()) == 0
    assert L._gemm_ws_workspace(dev, 50, 5) is first  # big enough: the same tensors
    grown = L._gemm_ws_workspace(dev, 300, 4)
    assert grown[0].numel() == 300 and grown[1].numel() == 10  # never smaller than before
    assert L._gemm_ws_retired == [first]


def test_tuned_file_round_trip_and_malformed_files(tmp_path):
    ws = _ws()
    good = tmp_path / "tuned.json"
    good.write_text('{"128,4608,3584": [128, 64, 4, 3], "64,37888,3584": [64, 128, 3, 1], '
                    '"128,37888,3584,silu": [128, 64, 4, 1]}')
    assert ws.load_tuned(good) == ({(128, 4608, 3584): ws.GemmWsConfig(128, 64, 4, 3),
                                    (64, 37888, 3584): ws.GemmWsConfig(64, 128, 3, 1)},
                                   {(128, 37888, 3584): ws.GemmWsConfig(128, 64, 4, 1)})
    for text in ('{"128,4608": [128, 64, 4, 3]}', '{"128,4608,3584": [128, 64, 4]}',
                 '{"128,4608,3584": [100, 64, 4, 1]}', '[1, 2]', "not json",
                 '{"128,37888,3584,silu": [128, 64, 4, 2]}',  # the SwiGLU form has one split
                 '{"128,37888,3584,gelu": [128, 64, 4, 1]}', '{"128,37888,3584,1": [128, 64, 4, 1]}'):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ValueError):
            ws.load_tuned(bad)
    with pytest.raises(ValueError):
        ws.load_tuned(tmp_path / "missing.json")


def test_two_warpgroups_at_256_rows():
    ws = _ws()
    assert [ws.config_warps(ws.GemmWsConfig(bn)) for bn in (64, 128, 256)] == [4, 4, 8]
    assert ws.fits(ws.GemmWsConfig(256, 64, 4, 1), 128)  # 128 accumulator registers per thread
    assert not ws.fits(ws.GemmWsConfig(128, 64, 4, 1), 256)  # 256 per thread: refused


def test_decode_graph_calls_read_the_mode_once(monkeypatch):
    from radixrt.models import linear as L

    monkeypatch.setenv("RADIXRT_GEMM_WS", "all")
    with L.decode_graph_calls():
        assert L._graph_calls == 1 and L._gemm_ws_mode == "all"
        monkeypatch.setenv("RADIXRT_GEMM_WS", "0")
        with L.decode_graph_calls():  # nested (a capture inside the warm-up's block): the outer mode
            assert L._graph_calls == 2 and L._gemm_ws_mode == "all"
    assert L._graph_calls == 0
    with L.decode_graph_calls():
        assert L._gemm_ws_mode == "0"
    monkeypatch.setenv("RADIXRT_GEMM_WS", "bogus")  # anything else: auto (the TUNED shapes)
    with L.decode_graph_calls():
        assert L._gemm_ws_mode == "auto"


def test_tuned_file_is_read_at_import(tmp_path):
    """RADIXRT_GEMM_WS_TUNED names a file whose entries join TUNED when kernels/gemm_ws.py is imported
    (the lab's winners routed without a code change); a malformed file fails the import, naming the
    variable (a typo must not silently route nothing)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    good = tmp_path / "tuned.json"
    good.write_text('{"64,4608,3584": [64, 128, 3, 2], "64,37888,3584,silu": [128, 64, 4, 1]}')
    bad = tmp_path / "bad.json"
    bad.write_text('{"64,4608": [64, 128, 3, 2]}')
    code = ("from radixrt.kernels import gemm_ws as G; print(G.TUNED[(64, 4608, 3584)]); "
            "print(G.TUNED_GATED[(64, 37888, 3584)])")

    def run(path):
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              cwd=Path(__file__).resolve().parents[2],
                              env={**os.environ, "RADIXRT_GEMM_WS_TUNED": str(path)})

    ok = run(good)
    assert ok.returncode == 0 and "block_n=64, block_k=128, stages=3, splits=2" in ok.stdout, ok.stderr
    assert "block_n=128, block_k=64, stages=4, splits=1" in ok.stdout
    refused = run(bad)
    assert refused.returncode != 0 and "RADIXRT_GEMM_WS_TUNED" in refused.stderr, refused.stderr


def test_linear_routing_rules_with_a_stand_in_device(monkeypatch):
    """Linear._gemm_ws's host-side rules, with `supported` and the device properties stood in for (the
    kernels recorded, not run): "auto" routes only the TUNED shapes, "0" none; a TUNED config that does
    not fit, a strided bias or a bias of another dtype fall back (None: the caller's F.linear); the
    SwiGLU form takes no bias and one split whatever the config says; the split-K workspace is the
    shared one, of workspace_need's size."""
    import types

    from radixrt.models import linear as L

    ws = _ws()
    calls = []
    monkeypatch.setattr(ws, "supported", lambda x, w: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda dev: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(ws, "gemm_ws", lambda x, w, b, config, partials, counters:
                        calls.append(("plain", config, partials.numel(), counters.numel())) or "y")
    monkeypatch.setattr(ws, "gemm_silu_ws", lambda x, w, config: calls.append(("gated", config)) or "g")
    monkeypatch.setattr(L, "_gemm_ws_scratch", {})
    monkeypatch.setattr(L, "_gemm_ws_retired", [])
    m, n, k = 64, 512, 256
    lin = L.Linear(k, n)
    x = torch.zeros(m, k)
    split = ws.GemmWsConfig(128, 64, 4, 2)
    monkeypatch.setattr(ws, "TUNED", {})

    def route(mode: str, gated: bool = False):
        monkeypatch.setenv("RADIXRT_GEMM_WS", mode)
        with L.decode_graph_calls():
            return lin._gemm_ws(x, gated=gated)

    assert route("auto") is None and calls == []  # not in TUNED
    monkeypatch.setattr(ws, "TUNED", {(64, n, k): split})
    assert route("0") is None and calls == []
    assert route("auto") == "y"
    need_p, need_c = ws.workspace_need(split, m, n, k)
    assert need_p > 0 and calls == [("plain", split, need_p, need_c)]
    calls.clear()
    monkeypatch.setattr(ws, "TUNED", {(64, n, k): ws.GemmWsConfig(128, 128, 8, 1)})  # 384 KiB of ring
    assert route("auto") is None and route("all") is None and calls == []
    monkeypatch.setattr(ws, "TUNED", {(64, n, k): split})
    bias = lin.bias
    lin.bias = torch.nn.Parameter(torch.zeros(2 * n)[::2])  # strided
    assert route("auto") is None
    lin.bias = torch.nn.Parameter(torch.zeros(n, dtype=torch.float16))  # not x's dtype
    assert route("auto") is None and calls == []
    lin.bias = bias
    monkeypatch.setattr(ws, "TUNED_GATED", {(64, n, k): ws.GemmWsConfig(64, 64, 3, 1)})
    assert route("auto", gated=True) is None and calls == []  # a bias: no SwiGLU form
    lin.bias = None
    assert route("auto", gated=True) == "g"
    assert calls == [("gated", ws.GemmWsConfig(64, 64, 3, 1))]  # TUNED_GATED's config
    calls.clear()
    monkeypatch.setattr(ws, "TUNED_GATED", {})  # the plain GEMM in TUNED, the SwiGLU form not measured faster
    assert route("auto", gated=True) is None and calls == []
    assert route("all", gated=True) == "g"
    assert calls == [("gated", ws.GemmWsConfig(128, 64, 4, 1))]  # "all": the plain config at one split
