"""Programmatic dependent launch (kernels/pdl.py): off on the CPU; the decode path's kernels' sm_90 PTX
(compiled without a GPU) has the wait and the trigger, no store or atomic before the wait, and the
M = 1 GEMVs' and the norm's weight loads before it (the PTX check cannot tell an activation load from
a weight load: the GPU test below covers that); and on a Hopper GPU a CUDA graph of a
decode layer's kernel chain gives the same results with PDL as without, replay after replay (a
kernel reading its predecessor's output before `griddepcontrol.wait` would read stale or partial
data, differently from one replay to the next)."""

from __future__ import annotations

import math

import pytest
import torch

from radixrt.kernels import pdl

from .conftest import run_sm90_script


def test_pdl_is_off_for_cpu_tensors_and_adds_no_launch_option():
    assert not pdl.use_pdl(torch.zeros(1))
    assert pdl.launch_options(False) == {}
    assert pdl.launch_options(True) == {"launch_pdl": True}


def test_pdl_kernels_compile_for_sm90_with_no_store_before_the_wait():
    proc = run_sm90_script("compile_pdl_sm90.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 16 and all(line.startswith("ok ") for line in lines), proc.stdout
    # the weight reads that PDL overlaps with the previous kernel are issued before the wait
    for name in ("gemv bf16 M=1 (reduce)", "gemv FP8 int M=1 ", "rms_norm + residual"):
        line = next(ln for ln in lines if name in ln)
        assert not line.split(name.strip())[1].strip().startswith("0 global loads"), line


def _decode_chain(layers: int = 3, hidden: int = 1024, hq: int = 8, hkv: int = 2, d: int = 128,
                  inter: int = 2816, seq: int = 300, page: int = 16, dev: str = "cuda"):
    """Static buffers and a function running `layers` decode layers at batch 1 with the radixrt kernels
    (norm, QKV GEMV, rotary, store_kv, decode attention split + merge, o GEMV, norm, gate_up as an FP8
    int GEMV, silu_and_mul, down GEMV with split-K), all reading and writing the static buffers."""
    from radixrt.kernels import (
        Fp8IntConfig,
        SkinnyConfig,
        SkinnyWorkspace,
        apply_rotary,
        build_rope_cache,
        decode_attention,
        fp8_skinny_linear,
        rms_norm,
        silu_and_mul,
        skinny_linear,
        store_kv,
    )

    bf16 = torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, scale=0.05):
        return (torch.randn(*shape, generator=g, device=dev) * scale).to(bf16)

    pages = math.ceil((seq + 1) / page)
    w = []
    for _ in range(layers):
        gate_up = torch.randn(2 * inter, hidden, generator=g, device=dev) * 0.05
        scale = gate_up.abs().amax(1).clamp(min=1e-6) / 448.0
        w.append({"norm1": rnd(hidden, scale=1.0), "norm2": rnd(hidden, scale=1.0),
                  "qkv": rnd((hq + 2 * hkv) * d, hidden), "o": rnd(hidden, hq * d),
                  "gate_up": (gate_up / scale[:, None]).to(torch.float8_e4m3fn), "gate_up_s": scale.float(),
                  "down": rnd(hidden, inter),
                  "k_buf": rnd(pages * page, hkv, d, scale=1.0),
                  "v_buf": rnd(pages * page, hkv, d, scale=1.0)})
    st = {"x": rnd(1, hidden, scale=1.0), "positions": torch.tensor([seq], device=dev),
          "out_cache_loc": torch.tensor([seq], device=dev),
          "page_table": torch.arange(pages, device=dev, dtype=torch.int32)[None], "seq_lens":
          torch.tensor([seq + 1], device=dev, dtype=torch.int32),
          "cos_sin": build_rope_cache(d, 4096, 10000.0, device=dev)}
    ws = SkinnyWorkspace.allocate(4 * hidden, hidden // 8, dev)
    down_cfg = SkinnyConfig(8, 512, 4, 4, 1)  # split-K with the serial fix-up (counters)
    mid_o = torch.empty(1, hq, 4, d, device=dev)
    mid_lse = torch.empty(1, hq, 4, device=dev)

    def run() -> torch.Tensor:
        h, residual = st["x"], None
        for lw in w:
            x, residual = rms_norm(h, lw["norm1"], 1e-6, residual)
            qkv = skinny_linear(x, lw["qkv"])
            q, k, v = qkv.view(1, hq + 2 * hkv, d).split([hq, hkv, hkv], dim=1)
            apply_rotary(q, k, st["positions"], st["cos_sin"])
            store_kv(lw["k_buf"], lw["v_buf"], st["out_cache_loc"], k, v)
            o = decode_attention(q, lw["k_buf"], lw["v_buf"], st["page_table"], st["seq_lens"], page, None, 4,
                                 mid_o=mid_o, mid_lse=mid_lse)
            h = skinny_linear(o.reshape(1, hq * d), lw["o"])
            x, residual = rms_norm(h, lw["norm2"], 1e-6, residual)
            gu = fp8_skinny_linear(x, lw["gate_up"], lw["gate_up_s"], config=Fp8IntConfig(8, 128))
            h = skinny_linear(silu_and_mul(gu), lw["down"], config=down_cfg, workspace=ws)
        return h + residual

    return st, run


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_decode_chain_graph_with_pdl_equals_without(monkeypatch, replays=40):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs compute capability >= 9.0")
    outs = {}
    for on in (False, True):
        monkeypatch.setattr(pdl, "enabled", on)
        torch.manual_seed(1)
        st, run = _decode_chain()
        assert pdl.use_pdl(st["x"]) == on
        run()  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
        res = []
        inputs = torch.Generator(device="cuda").manual_seed(2)
        for _ in range(replays):
            st["x"].copy_(torch.randn(st["x"].shape, generator=inputs, device="cuda").to(st["x"].dtype))
            graph.replay()
            res.append(out.clone())
        torch.cuda.synchronize()
        eager = run()  # the eager chain on the last input agrees with the graph's last replay
        torch.testing.assert_close(eager, res[-1], atol=0, rtol=0)
        outs[on] = torch.stack(res)
    assert torch.isfinite(outs[True]).all()
    assert torch.equal(outs[True], outs[False])

