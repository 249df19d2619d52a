"""What each answer's confidence costs: the text notebook with ``CONFIDENCE`` off and on, on the same
rows, back to back on one machine; the ratio of their rates.

Each run is the kit's own notebook through papermill (as ``bench_pipeline.py``'s kit side), on the
same input file, greedy, with the CPU preset (on a GPU: "auto"); ``--order`` sets the runs
(default ``off,on,off``: the off runs bracket the on run, so a machine that slows down or speeds
up during the benchmark shows as two different off rates). For each run: the pipeline cell's
seconds (engine start included) and the steady-state rate (``summary.json``'s "rows/s steady
state"). The ratios are on / mean of the off runs; below 1, the confidence costs that share.

It also checks what it measures: with ``CONFIDENCE`` on every answered row has a confidence, off
none has. Run ``python benchmarks/bench_confidence.py --rows 1000``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
import bench_pipeline  # noqa: E402  (the pipeline benchmark's input and settings)
from bench_pipeline import run_notebooks  # noqa: E402


def run(flag: bool, csv: Path, workdir: Path, overrides: dict) -> dict:
    """One notebook run with ``CONFIDENCE=flag``: its timings, and whether its rows say what they should."""
    params = {**bench_pipeline.run_settings("text", overrides), "INPUT_PATH": str(csv), "CONFIDENCE": flag}
    started = time.perf_counter()
    folder = Path(run_notebooks.run("text_classification", workdir, params))
    whole = time.perf_counter() - started
    summary = json.loads((folder / "summary.json").read_text())
    predictions = pd.read_parquet(folder / "predictions.parquet")
    # With CONFIDENCE the notebook's postprocess adds the column (labels.confidence); without, it has none.
    has = "confidence" in predictions and bool(predictions["confidence"].notna().all())
    return {"confidence": flag, "whole s": whole, "pipeline s": float(summary["pipeline seconds"]),
            "rows": summary["classified"], "steady rows/s": summary["rows/s steady state"],
            "end-to-end rows/s": summary["rows/s end to end"], "steady basis": summary["steady state"],
            "rows as they should be": has if flag else "confidence" not in predictions,
            "median confidence": float(predictions["confidence"].median()) if has else None}


def ratio(runs: list[dict], key: str) -> float:
    off = [r[key] for r in runs if not r["confidence"] and r[key]]
    on = [r[key] for r in runs if r["confidence"] and r[key]]
    if not off or not on:
        return float("nan")
    return statistics.mean(on) / statistics.mean(off) if key.endswith("rows/s") else \
        statistics.mean(off) / statistics.mean(on)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000, help="prompts per run (default 1000)")
    parser.add_argument("--order", default="off,on,off", help="the runs, in order (default off,on,off)")
    parser.add_argument("--workdir", default=None, help="keep inputs and results here (default: a temp folder)")
    parser.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a notebook parameter for every run (a Python literal, else a string)")
    args = parser.parse_args(argv)
    order = [x.strip() for x in args.order.split(",")]
    if not set(order) <= {"on", "off"} or "on" not in order or "off" not in order:
        parser.error("--order lists on and off runs, e.g. off,on,off")
    from bench_image_prep import machine

    overrides = {name: run_notebooks.parse_value(value) for name, value in args.p}
    print(f"machine: {machine()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-confidence-") as tmp:
        workdir = Path(args.workdir or tmp)
        csv = bench_pipeline.text_input(args.rows, workdir / "input")
        runs = []
        for i, which in enumerate(order):
            runs.append(run(which == "on", csv, workdir / f"run{i}-{which}", overrides))
            print(f"run {i} CONFIDENCE={which}: {json.dumps(runs[-1])}", flush=True)
    table = pd.DataFrame(runs)
    print(table[["confidence", "rows", "pipeline s", "steady rows/s", "end-to-end rows/s"]].to_string())
    steady, pipeline = ratio(runs, "steady rows/s"), ratio(runs, "pipeline s")
    print(f"on/off steady state rate: {steady:.3f}x (cost {1 - steady:+.1%}); "
          f"pipeline cell, engine start in: {pipeline:.3f}x (cost {1 - pipeline:+.1%})")
    ok = all(r["rows as they should be"] and r["rows"] == args.rows for r in runs)
    print("rows: " + ("every run answered every row; with CONFIDENCE every row has one, without none has" if ok
                      else "NOT AS EXPECTED: " + json.dumps(runs)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
