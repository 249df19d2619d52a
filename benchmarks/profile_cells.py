"""Where a notebook's time goes before its pipeline: run its cells up to (not including) the run cell in
this process, as a kernel would, the engines' start left out, and print each cell's seconds and, for
the slow ones, the calls that took them (cProfile, cumulative time).

    python benchmarks/profile_cells.py text_classification -p INPUT_PATH '"/data/companies.csv"' \
        -p MODEL_SOURCE "'$(python benchmarks/random_weights.py unsloth/Llama-3.1-8B-Instruct)'" \
        -p ENGINE "{'engine_kwargs': {'load_format': 'dummy'}}"

Each ``-p NAME VALUE`` sets a parameter (VALUE is Python, as in the parameters cell). Ray is shut
down at the end. Results go to stdout only; nothing is written to OUTPUT_DIR (the pipeline cell is
where the notebook first writes there, and it does not run).
"""

from __future__ import annotations

import argparse
import ast
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PIPELINE_CELL = "pipeline.write("  # the run cell: the first that runs the pipeline (and writes results)
ENGINES_CELL = "build_processor(config"  # the cell that starts the engines (in the background): left out


def code_cells(notebook: str, overrides: dict[str, str]) -> list[tuple[str, str]]:
    """The notebook's code cells before its run cell, with ``overrides`` set after the parameters cell (as
    papermill injects them); the engines' start and IPython-only lines left out."""
    import nbformat

    nb = nbformat.read(REPO / "notebooks" / f"{notebook}.ipynb", as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if PIPELINE_CELL in cell.source:
            break
        if ENGINES_CELL in cell.source:
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.startswith("display("))
        if "parameters" in cell.metadata.get("tags", []):
            for name, value in overrides.items():
                ast.literal_eval(value)  # a literal, as the parameters cell takes
                source += f"\n{name} = {value}"
        cells.append((cell.source.strip().splitlines()[0][:80], source))
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", choices=["text_classification", "vlm_captioning"])
    parser.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    parser.add_argument("--top", type=int, default=20, help="calls shown for each cell over --slow seconds")
    parser.add_argument("--slow", type=float, default=1.0)
    parser.add_argument("--time-only", action="store_true", help="each cell's seconds without cProfile (whose "
                        "overhead falls on Python code only: for timings to compare with a notebook's)")
    args = parser.parse_args(argv)
    os.chdir(REPO / "notebooks")  # where a kernel runs the notebook
    sys.path.insert(0, str(REPO))
    namespace: dict = {"__name__": "__main__"}
    total = 0.0
    for index, (first_line, source) in enumerate(code_cells(args.notebook, dict(args.p))):
        profile = cProfile.Profile()
        start = time.perf_counter()
        if not args.time_only:
            profile.enable()
        exec(compile(source, f"<cell {index}>", "exec"), namespace)
        profile.disable()
        seconds = time.perf_counter() - start
        total += seconds
        print(f"=== cell {index}: {seconds:.2f} s  {first_line}", flush=True)
        if seconds > args.slow and not args.time_only:
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(args.top)
            print(text.getvalue().split("\n\n", 2)[-1].rstrip(), flush=True)
    print(f"=== before the pipeline: {total:.1f} s", flush=True)
    if "ray" in namespace:
        namespace["ray"].shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
