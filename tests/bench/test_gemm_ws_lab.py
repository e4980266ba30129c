"""bench/lab/gemm_ws.py's report on the CPU: which measured cases become TUNED / TUNED_GATED entries,
and that the file it writes is one kernels/gemm_ws.py's loader reads (the next device call routes the
Engine through that file, so a mismatch would waste it)."""

from __future__ import annotations

import json

from bench.lab import gemm_ws as lab
from radixrt.kernels import gemm_ws as G


def _case(name, m, torch_us, best_us=None, cfg=(128, 64, 4, 2)):
    n, k, _ = lab.SHAPES[name]
    c = {"name": name, "m": m, "mp": G.rows_padded(m), "n": n, "k": k, "torch_us": torch_us, "configs": []}
    if best_us is not None:
        c["best"] = {"us": best_us, "rel_err": 3e-3, "splits_used": cfg[3],
                     "config": dict(zip(("block_n", "block_k", "stages", "splits"), cfg, strict=True))}
    return c


def _gated(m, fused_us, unfused_us, err=3e-3):
    n, k, _ = lab.SHAPES["gate_up"]
    return {"m": m, "mp": G.rows_padded(m), "n": n, "k": k,
            "config": {"block_n": 128, "block_k": 64, "stages": 4, "splits": 1},
            "forms": {"F.linear + silu_and_mul": {"us": unfused_us, "rel_err": 3e-3},
                      "gemm_ws + silu_and_mul": {"us": unfused_us + 1, "rel_err": 3e-3},
                      "gemm_silu_ws": {"us": fused_us, "rel_err": err}}}


def test_report_keeps_winners_only_and_its_file_loads(tmp_path, capsys):
    out = {"cases": [_case("down", 128, 40.0, 30.0), _case("o_proj", 128, 10.0, 9.95),  # 1.005x: no
                     _case("qkv", 128, 12.0), _case("down", 100, 40.0, 20.0, cfg=(64, 64, 3, 4)),
                     _case("qkv", 64, 12.0, 11.0, cfg=(128, 128, 3, 1))],
           "gated": [_gated(128, 60.0, 70.0), _gated(64, 60.0, 60.5),  # 1.008x: no
                     _gated(100, 10.0, 70.0, err=0.5)]}  # fast but wrong: no
    entries = lab.report(out)
    assert entries == {f"128,{3584},{18944}": [128, 64, 4, 2],  # M = 128 measured first keeps the key
                       f"64,{4608},{3584}": [128, 128, 3, 1],
                       f"128,{37888},{3584},silu": [128, 64, 4, 1]}
    assert "TUNED lines:" in capsys.readouterr().out
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(entries))
    plain, gated = G.load_tuned(path)
    assert plain == {(128, 3584, 18944): G.GemmWsConfig(128, 64, 4, 2),
                     (64, 4608, 3584): G.GemmWsConfig(128, 128, 3, 1)}
    assert gated == {(128, 37888, 3584): G.GemmWsConfig(128, 64, 4, 1)}


def test_gated_wins_needs_a_checked_and_faster_fused_form():
    assert lab.gated_wins(_gated(128, 60.0, 70.0))
    assert not lab.gated_wins(_gated(128, 69.0, 70.0))
    assert not lab.gated_wins(_gated(128, 10.0, 70.0, err=0.5))
    broken = _gated(128, 60.0, 70.0)
    broken["forms"]["gemm_silu_ws"] = {"error": "CompilationError"}
    assert not lab.gated_wins(broken)
