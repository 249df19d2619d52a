"""Clear notebook outputs for committing, keeping only the cells CI checks.

nbval compares the outputs of cells marked ``# NBVAL_CHECK_OUTPUT`` with the outputs stored in
the committed notebook, so those stay; every other output, execution count and papermill
metadata goes. Usage: ``python scripts/clear_outputs.py notebooks/*.ipynb`` (``--check`` only
reports, exit 1 if anything would change).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

CHECK_MARKER = "# NBVAL_CHECK_OUTPUT"


def is_checked(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and cell.source.lstrip().startswith(CHECK_MARKER)


def cleaned(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Return a copy of ``nb`` with outputs cleared except for checked cells."""
    nb = nbformat.from_dict(nb)
    nb.metadata.pop("papermill", None)
    nb.metadata.pop("widgets", None)
    # papermill adds a cell with the parameters it injected; the committed notebook keeps the defaults.
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        if cell.metadata.get("tags") == []:  # papermill adds an empty list to every cell
            del cell.metadata["tags"]
        if cell.cell_type != "code":
            continue
        if is_checked(cell):
            # The checked output must come from the cell's own prints, never from log noise.
            cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]
            # nbval treats a cell with outputs but no execution count as never run: keep a fixed one.
            cell.execution_count = 1
            for output in cell.outputs:
                if output.output_type == "execute_result":
                    output.execution_count = 1
        else:
            cell.outputs = []
            cell.execution_count = None
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    dirty = []
    for path in args.paths:
        nb = nbformat.read(path, as_version=4)
        new = cleaned(nb)
        if nbformat.writes(new) != nbformat.writes(nb):
            dirty.append(path)
            if not args.check:
                nbformat.write(new, path)
    for path in dirty:
        print(("needs clearing: " if args.check else "cleared: ") + str(path))
    return 1 if (args.check and dirty) else 0


if __name__ == "__main__":
    sys.exit(main())
