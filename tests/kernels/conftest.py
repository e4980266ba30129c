"""Kernel tests: run Triton on the CPU interpreter when there is no GPU; shared paged-batch builder.

TRITON_INTERPRET must be set before any @triton.jit decorator runs, i.e. before radixrt.kernels is
imported, so it is set here at conftest import time (and only without CUDA).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()  # installed, or kernels/ mapped onto radixrt.kernels

from radixrt.kernels.reference import slots_of  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class PagedBatch:
    """B requests laid out in a random-page pool: the prefix K/V sits in the pool, new tokens in [T]."""

    page_size: int
    k_buffer: torch.Tensor  # [S, Hkv, D]
    v_buffer: torch.Tensor
    page_table: torch.Tensor  # [B, P] int32, padded with page 0
    prefix_lens: torch.Tensor  # [B] int32
    extend_lens: torch.Tensor
    extend_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor  # [T] int64
    q: torch.Tensor  # [T, Hq, D]
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor

    @property
    def max_extend_len(self) -> int:
        return int(self.extend_lens.max()) if self.extend_lens.numel() else 0


def make_paged_batch(prefix_lens: list[int], extend_lens: list[int], page_size: int, num_q_heads: int,
                     num_kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int = 0,
                     device: torch.device = DEVICE) -> PagedBatch:
    """Random pool (every slot holds random data, so a wrong slot gives a wrong answer), pages handed
    out in a shuffled order, page 0 kept as the sink. q/k/v are strided views of one fused tensor."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    pages_per_req = [-(-s // page_size) for s in seq_lens]
    num_pages = 1 + sum(pages_per_req) + 3
    perm = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    max_pages = max(1, max(pages_per_req))
    page_table = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    for b, n in enumerate(pages_per_req):
        page_table[b, :n] = torch.tensor([perm.pop() for _ in range(n)], dtype=torch.int32)
    num_slots = num_pages * page_size
    k_buffer = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(dtype=dtype, device=device)
    v_buffer = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(dtype=dtype, device=device)
    out_cache_loc = torch.cat([slots_of(page_table[b], page_size, p, p + e)
                               for b, (p, e) in enumerate(zip(prefix_lens, extend_lens, strict=True))])
    num_tokens = sum(extend_lens)
    qkv = torch.randn(num_tokens, (num_q_heads + 2 * num_kv_heads) * head_dim, generator=gen)
    qkv = qkv.to(dtype=dtype, device=device)  # views are taken on the device, so they stay strided
    q = qkv[:, : num_q_heads * head_dim].view(num_tokens, num_q_heads, head_dim)
    k = qkv[:, num_q_heads * head_dim:(num_q_heads + num_kv_heads) * head_dim].view(
        num_tokens, num_kv_heads, head_dim)
    v = qkv[:, (num_q_heads + num_kv_heads) * head_dim:].view(num_tokens, num_kv_heads, head_dim)
    ext = torch.tensor(extend_lens, dtype=torch.int32)
    start = torch.cumsum(ext, 0, dtype=torch.int32) - ext
    to = dict(device=device)
    return PagedBatch(page_size, k_buffer, v_buffer, page_table.to(**to),
                      torch.tensor(prefix_lens, dtype=torch.int32, **to), ext.to(**to), start.to(**to),
                      torch.tensor(seq_lens, dtype=torch.int32, **to), out_cache_loc.to(**to), q, k, v)


def assert_close(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> None:
    """Elementwise closeness plus no NaN anywhere (poisoned outputs must be fully overwritten)."""
    assert not torch.isnan(out).any(), "output has NaN (unwritten or bad softmax)"
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@pytest.fixture
def device() -> torch.device:
    return DEVICE


@pytest.fixture
def no_attention_overrides():
    """The attention config table without RADIXRT_ATTN_CONFIG / set_overrides entries for the test;
    what was set before is restored after it."""
    from radixrt.kernels import attention_configs as ac

    saved = ac.get_overrides()
    ac.set_overrides(None)
    yield
    ac.set_overrides(saved)


@pytest.fixture
def paged_batch():
    """Factory fixture: make_paged_batch(prefix_lens, extend_lens, page_size, Hq, Hkv, D, dtype, seed)."""
    return make_paged_batch


@pytest.fixture
def close():
    """assert_close(out, ref, atol, rtol) with a NaN check."""
    return assert_close


def run_sm90_script(script: str) -> subprocess.CompletedProcess:
    """Run bench/kernels/<script> (a compile-for-sm_90 check) without TRITON_INTERPRET in a fresh
    process; skips when this Triton build carries no ptxas."""
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this Triton build has no ptxas")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, str(root / "bench" / "kernels" / script)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)


# the Gluon kernels' GPU tests (wgmma, TMA, setmaxnreg: compute capability 9.x)
_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
requires_hopper = [pytest.mark.gpu, pytest.mark.skipif(not _HOPPER, reason="needs a Hopper GPU")]


def count_calls(monkeypatch, module, name: str) -> list[int]:
    """Patch module.<name> with a wrapper that records each call's first argument's length; returns
    the record (a routing test asserts on it)."""
    calls: list[int] = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def check_attention(o: torch.Tensor, ref: torch.Tensor) -> None:
    """bf16/fp16 attention output against its fp32 reference: no NaN, relative norm error <= 1e-2,
    max |o - ref| <= 2e-2 + 2e-2 |ref| (tests/kernels/test_kernels_gpu.py's tolerances)."""
    assert not torch.isnan(o).any()
    rel = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel <= 1e-2, f"relative error {rel:.2e}"
    torch.testing.assert_close(o.float(), ref.float(), atol=2e-2, rtol=2e-2)
