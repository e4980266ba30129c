"""The attention kernels compile for sm_90 (H100/H200) at their GPU configs, on a machine without a
GPU: the CPU tests run them in Triton's interpreter, which accepts code the compiler rejects. Their
paged loops are software-pipelined where the config has >= 3 stages (K/V blocks in flight while a
block is computed), which a change to how the loops load page ids can silently undo; kv_dot "f16v"
reads an FP8 pool's V without byte loads from shared memory."""

from __future__ import annotations

from .conftest import run_sm90_script


def test_attention_kernels_compile_for_sm90():
    proc = run_sm90_script("compile_sm90.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 15 variants (a peeled-tail decode, the warp-split decode and the cascade prefix with its rows
    # recomputed among them), the FP8-operand check and the FP8 V-widening check (no byte loads from
    # shared memory)
    assert proc.stdout.count("ok ") == 17, proc.stdout
    assert "peeled tail" in proc.stdout
    assert any("warp split" in line and "pipelined loops 1" in line for line in proc.stdout.splitlines())
    # no spilled registers at all where the cascade prefix recomputes its rows after the loop
    lines = proc.stdout.splitlines()
    assert any("rows recomputed" in line and "spills 0 B" in line for line in lines), proc.stdout
    assert "V widened before its dot" in proc.stdout
    assert "pipelined loops 3, want >= 3" in proc.stdout and "pipelined loops 1, want >= 1" in proc.stdout


def test_gluon_kernels_compile_for_sm90():
    """The warp-specialized Gluon kernels (extend, cascade stage A, decode over an FP8 pool, the
    decode-batch GEMM) lower for sm_90 at their configs: one CTA per SM's shared memory, no spills, P
    V's wgmma with P from registers (extend, cascade), mma.sync over K / V widened by packed e4m3 ->
    fp16 cvts (decode) or wgmma with acq_rel arrival atomics where split (GEMM), the producer's
    registers lowered (setmaxnreg) and TMA copies (bench/kernels/compile_sm90_ws.py checks the PTX)."""
    proc = run_sm90_script("compile_sm90_ws.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 3 extend configs, 2 cascade prefix pages, 3 decode pages, the decode's three experiment forms
    # and 9 GEMM configs (4 of them split, 4 SwiGLU (one at block_n 64), 2 with two consumer warpgroups)
    assert proc.stdout.count("ok ") == 20, proc.stdout
    assert proc.stdout.count("gemm ws M") == 9 and proc.stdout.count("SwiGLU") == 4, proc.stdout
    assert proc.stdout.count("decode ws (FP8 pool)") == 6, proc.stdout
