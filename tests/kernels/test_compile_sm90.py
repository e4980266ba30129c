"""The attention kernels compile for sm_90 (H100/H200) at their GPU configs, on a machine without a
GPU: the CPU tests run them in Triton's interpreter, which accepts code the compiler rejects. Their
paged loops are software-pipelined where the config has >= 3 stages (K/V blocks in flight while a
block is computed), which a change to how the loops load page ids can silently undo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_attention_kernels_compile_for_sm90():
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this Triton build has no ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "kernels" / "compile_sm90.py")], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == 13, proc.stdout  # 12 variants and the FP8-operand check
    assert "pipelined loops 3, want >= 3" in proc.stdout and "pipelined loops 1, want >= 1" in proc.stdout
