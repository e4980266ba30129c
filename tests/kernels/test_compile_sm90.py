"""The attention kernels compile for sm_90 (H100/H200) at their GPU configs, on a machine without a
GPU: the CPU tests run them in Triton's interpreter, which accepts code the compiler rejects. Their
paged loops are software-pipelined where the config has >= 3 stages (K/V blocks in flight while a
block is computed), which a change to how the loops load page ids can silently undo."""

from __future__ import annotations

from .conftest import run_sm90_script


def test_attention_kernels_compile_for_sm90():
    proc = run_sm90_script("compile_sm90.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == 13, proc.stdout  # 12 variants and the FP8-operand check
    assert "pipelined loops 3, want >= 3" in proc.stdout and "pipelined loops 1, want >= 1" in proc.stdout
