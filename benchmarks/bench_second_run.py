"""A second run in the same kernel, as a person in Jupyter makes it: the text notebook run in one live
kernel down to the cell that frees the engines, then its prompt (``TASK``) and output folder changed in the
parameters cell and run so again (the engines kept). For each run: the cells before the pipeline, the first result file's time from the run's
first cell and from the start of its pipeline cell (the engines' start, with Ray's), and the whole run.

    python benchmarks/bench_second_run.py --input companies.csv --workdir /root/bench/second \\
        -p MODEL_SOURCE "'$(python benchmarks/random_weights.py unsloth/Llama-3.1-8B-Instruct)'"

Each ``-p NAME VALUE`` sets a parameter (VALUE is Python, as in the parameters cell), over the
benchmark's own (greedy answers, no resume, "auto" on a GPU, a random-weights folder loaded with
``load_format="dummy"``: ``bench_pipeline.run_settings``). The kernel runs in ``notebooks/`` through
nbclient, as Jupyter runs it (not papermill); it writes each run's results under ``--workdir``.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
CHANGED_TASK = "Name the industry of the company the user names."  # the second run's prompt


def run_all(client, nb, parameters: dict[str, str], folder: Path) -> dict[str, float]:
    """Execute every code cell of ``nb`` in ``client``'s kernel, ``parameters`` appended to its
    parameters cell (as papermill injects them); the run's marks, in seconds from its first cell."""
    from bench_pipeline import result_window
    from profile_cells import ENGINES_CELL, PIPELINE_CELL

    begun, marks = time.time(), {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if "parameters" in cell.metadata.get("tags", []):
            cell.source = cell.source.split("\n# injected\n")[0] + "\n# injected\n" + "\n".join(
                f"{name} = {value}" for name, value in parameters.items())
        if PIPELINE_CELL in cell.source:
            marks["cells_before_pipeline_s"] = time.time() - begun
        if cell.source.startswith("engines.free("):  # a person iterating stops before it: the engines stay up
            break
        client.execute_cell(cell, index)
        if ENGINES_CELL in cell.source:
            marks["engines_started_s"] = time.time() - begun  # the cell that starts them (in the background) done
    first, _ = result_window(folder)
    marks["first_result_s"] = first - begun
    marks["pipeline_cell_to_first_result_s"] = first - begun - marks["cells_before_pipeline_s"]
    marks["whole_s"] = time.time() - begun
    return {name: round(value, 1) for name, value in marks.items()}


def main(argv: list[str] | None = None) -> int:
    import nbformat
    from nbclient import NotebookClient

    import bench_pipeline as b
    import run_notebooks  # scripts/, on the path bench_pipeline sets

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="the CSV of companies both runs read")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    parser.add_argument("--params", default="", help="more parameters as JSON, e.g. on_gpu.sh's KIT_PARAMS")
    parser.add_argument("--ray-timeline", type=Path, help="after the runs, Ray's task timeline (ray.timeline) here")
    args = parser.parse_args(argv)
    given = {name: ast.literal_eval(value) for name, value in args.p}  # literals, as the parameters cell takes
    given |= json.loads(args.params or "{}")
    settings = {name: repr(value) for name, value in b.run_settings("text", given).items()}
    settings["INPUT_PATH"] = repr(str(Path(args.input).resolve()))
    nb = nbformat.read(REPO / "notebooks" / "text_classification.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}},
                            kernel_manager_class=run_notebooks.kernel_manager_class())  # local sockets, as the kit's runner
    runs = {"first": {}, "second (TASK changed)": {"TASK": repr(CHANGED_TASK)}}
    with client.setup_kernel():
        for name, changed in runs.items():
            folder = args.workdir / name.split()[0]
            marks = run_all(client, nb, {**settings, **changed, "OUTPUT_DIR": repr(str(folder))}, folder)
            print(f"RESULT {name} run in one kernel: {marks}", flush=True)
        if args.ray_timeline:  # every task's and actor call's span (the stages', Serve's), for chrome://tracing
            cell = nbformat.v4.new_code_cell(f"ray.timeline(filename={str(args.ray_timeline.resolve())!r})")
            nb.cells.append(cell)
            client.execute_cell(cell, len(nb.cells) - 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
