"""Compare a benchmark run with the figures recorded in its results table.

    python3 bench/compare_results.py $OUT/engine.json [--table bench/results/engine.md]

The JSON is what `bench/gpu_engine.py --out` writes (its `headline` dict: figure name -> value);
the table is the markdown table of bench/results/engine.md whose first columns are `figure` and
`value`. Prints one markdown table: each figure the run measured, the recorded value with its date
and commit, the measured value, and measured / recorded. Exit status 0 (it reports, it does not
judge: run-to-run noise on the GPU machine is a few percent).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def recorded_figures(table: Path) -> dict[str, dict[str, str]]:
    """Rows of the first markdown table with a `figure` column: figure -> {column: cell}."""
    header: list[str] | None = None
    rows: dict[str, dict[str, str]] = {}
    for line in table.read_text().splitlines():
        if not line.startswith("|"):
            if header is not None and rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            if cells and cells[0] == "figure":
                header = cells
        elif not set(cells[0]) <= set("-: "):
            rows[cells[0]] = dict(zip(header, cells, strict=False))
    return rows


def _number(cell: str) -> float | None:
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return None  # a range such as "12-16"


def compare(measured: dict[str, float], recorded: dict[str, dict[str, str]]) -> list[str]:
    """Markdown lines: header, separator, one row per measured figure (recorded or not)."""
    lines = ["| figure | recorded | date, commit | measured | measured / recorded |", "|---|---|---|---|---|"]
    for name, value in measured.items():
        rec = recorded.get(name, {})
        ref = _number(rec.get("value", ""))
        ratio = f"{value / ref:.3f}" if ref else ""
        when = f"{rec.get('date', '')}, {rec.get('commit', '')}" if rec else "(not recorded)"
        recorded_cell = f"{rec.get('value', '')} {rec.get('unit', '')}".strip()
        lines.append(f"| {name} | {recorded_cell} | {when} | {value:.2f} | {ratio} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_json", help="the JSON of a bench/gpu_engine.py run")
    p.add_argument("--table", default=str(ROOT / "bench" / "results" / "engine.md"))
    ns = p.parse_args(argv)
    run = json.loads(Path(ns.run_json).read_text())
    print(f"run: {run.get('date', '?')}, commit {run.get('commit', '?')}, {run.get('device', '?')}")
    print("\n".join(compare(run.get("headline", {}), recorded_figures(Path(ns.table)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
