"""Run the kit's notebooks headlessly with papermill and leave a report a person can open.

For each notebook it writes, into ``<out>/<notebook name>/``: the executed notebook, the same
notebook rendered to HTML, and everything the notebook itself writes there (parquet tables,
charts, summary.json). The notebook is the single source of truth: this runs it, with parameters.

    python scripts/run_notebooks.py                       # both notebooks, bundled data, offline models
    python scripts/run_notebooks.py --only text_classification -p LIMIT 50
    python scripts/run_notebooks.py -p MODEL_SOURCE unsloth/Llama-3.1-8B-Instruct -p ENGINE "{'accelerator_type': 'L4'}"
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import tokenize
import os
import shutil
import sys
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = {path.stem: path for path in sorted((REPO / "notebooks").glob("*.ipynb"))}
#: Seconds any one cell may run before the run fails (unset: no limit). The tests set it, so that a
#: stalled run fails in minutes instead of holding CI until its own time limit.
CELL_TIMEOUT_ENV = "LLM_KIT_CELL_TIMEOUT"


def parse_value(text: str) -> object:
    """Parameters from the command line are Python literals when they parse as one, else strings."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def unknown_names(given: Iterable[str], known: Collection[str], notebook: str) -> list[str]:
    """A problem for each name in ``given`` that ``notebook``'s parameters cell lacks. Papermill only
    warns about such a name and runs on: ``-p LIMT 10000`` would run the whole input."""
    from helpers.parameters import closest

    return [f"{name} is not a parameter of {notebook} (not in its parameters cell): {closest(name, known)}"
            for name in given if name not in known]


@dataclass(frozen=True)
class Parameter:
    name: str
    value: Any
    source: str  # the literal as written
    comment: str  # the comment on its first line


def parse_cell(source: str) -> list[Parameter]:
    """A ``parameters`` cell: ``NAME = literal  # comment`` each, a literal may span lines. Raises
    ``ValueError`` on anything else."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    comments = {t.start[0]: t.string.lstrip("#").strip() for t in tokens}
    found = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            raise ValueError(f"line {node.lineno}: only NAME = literal assignments belong in the parameters cell")
        written = ast.get_source_segment(source, node.value) or ""
        for t in tokens:  # comments inside a multi-line literal are not part of it
            written = written.replace(t.string, "")
        written = " ".join(written.split()).replace("[ ", "[").replace(", ]", "]").replace(" ]", "]")
        found.append(Parameter(node.targets[0].id, ast.literal_eval(node.value), written,
                               comments.get(node.lineno, "")))
    return found


def parameters_cell(path: Path) -> str:
    import nbformat

    return next(c.source for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))


def defaults(name: str) -> dict[str, object]:
    """The notebook's parameters and their default values, read from its ``parameters`` cell."""
    return {p.name: p.value for p in parse_cell(parameters_cell(NOTEBOOKS[name]))}


def check_names(names: list[str], overrides: dict[str, object]) -> None:
    """Raise :class:`helpers.parameters.ParameterError` if an override is not a parameter of each notebook
    in ``names``, naming the closest one: papermill only warns, and a mistyped ``-p LIMT 10000`` would
    run the whole input on paid GPUs. Checked before any kernel starts."""
    from helpers import parameters

    problems = [p for name in names for p in unknown_names(overrides, defaults(name), name)]
    if problems and len(names) > 1:
        problems.append("a parameter that only one notebook has: run that notebook alone, with --only NAME")
    parameters.raise_if(problems)


def kernel_manager_class():
    """Jupyter's kernel manager with the kernel on local sockets (IPC) instead of TCP ports: nothing
    is reachable from the network, and the kernel does not warn, on every run, that its TCP traffic
    is unencrypted. The sockets live in a private temporary folder: Jupyter's default puts them in the
    kernel's working directory (your project), where a run that is killed leaves them behind."""
    import tempfile

    from jupyter_client.manager import AsyncKernelManager
    from traitlets import CaselessStrEnum, default

    class LocalSocketKernelManager(AsyncKernelManager):
        transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

        @default("ip")
        def _ip_default(self) -> str:
            if self.transport != "ipc":
                return super()._ip_default()
            return str(Path(tempfile.mkdtemp(prefix="kit-kernel-")) / "kernel-ipc")

        def cleanup_ipc_files(self) -> None:
            super().cleanup_ipc_files()
            if self.transport == "ipc" and Path(self.ip).parent.name.startswith("kit-kernel-"):
                with contextlib.suppress(OSError):  # not empty: something else put a file there
                    Path(self.ip).parent.rmdir()

    return LocalSocketKernelManager


def execute(notebook: Path, executed: Path, parameters: dict[str, object], cwd: Path) -> None:
    """Run ``notebook`` with ``parameters`` through papermill into ``executed``."""
    import papermill

    papermill.execute_notebook(
        str(notebook), str(executed), parameters=parameters, cwd=str(cwd), kernel_name="python3",
        progress_bar=False, kernel_manager_class=kernel_manager_class(),
        execution_timeout=int(os.environ[CELL_TIMEOUT_ENV]) if os.environ.get(CELL_TIMEOUT_ENV) else None,
    )


def run(name: str, out_root: Path | str, overrides: dict[str, object], cwd: Path | None = None) -> Path | str:
    """Execute one notebook into ``out_root/name`` and render it to HTML; return the folder.

    ``out_root`` may be a bucket URI (``s3://bucket/runs``): the notebook then writes its results
    there. The notebook runs in ``cwd`` (default: the current directory), so a relative ``INPUT_PATH`` is
    relative to where you ran the command. The HTML report is rendered even when the notebook
    failed (it shows where and why), but a rendering error never hides the notebook's own outcome:
    it is printed, and the run's result (or the notebook's error) stands.

    The executed notebook and its HTML are written to a staging folder while the notebook runs, and
    copied into the output folder when it ends (also when it failed): see :func:`publish_report`.
    """
    import tempfile

    from helpers import run_folder, storage

    check_names([name], overrides)  # before anything is claimed or started
    target = storage.Location.of(out_root) / name
    run_folder.open_folder(target.uri)  # the kit's, reachable, no run in it: before the kernel starts
    before = run_folder.current_run(target)
    staging = Path(tempfile.mkdtemp(prefix="llm-batch-kit-report-"))
    executed, html = staging / f"{name}.ipynb", staging / f"{name}.html"
    parameters = {"OUTPUT_DIR": target.uri, **overrides}
    print(f"[{name}] running with {storage.redact_all(parameters)}", flush=True)
    try:
        execute(NOTEBOOKS[name], executed, parameters, cwd=cwd or Path.cwd())
    finally:
        redact_notebook(executed, parameters)
        render_report(executed, html)
        shown = publish_report(target, name, [executed, html], started=run_folder.current_run(target) != before)
        shutil.rmtree(staging, ignore_errors=True)
    print(f"[{name}] done: open {shown}", flush=True)
    return target.uri if target.remote else Path(target.path)


def publish_report(target, name: str, reports: list[Path], started: bool) -> str:
    """Copy ``reports`` (``<name>.ipynb``, ``<name>.html``) into ``target`` (a
    :class:`helpers.storage.Location`); return where the HTML is, as shown to a person.

    No report overwrites another. Where the notebook ``started`` a run, the reports are that run's
    files (recorded in its ``run.json``: the next run moves them to ``earlier/``). A notebook that
    stopped before (a bad parameter, an interrupted run it would not resume) left the folder as it
    was: its report goes beside an earlier one as ``<name>-<UTC time>.html``, and nothing is moved."""
    import time

    from helpers import run_folder

    stem = name
    target.fs.create_dir(target.path, recursive=True)
    if not started and any((target / f"{name}{suffix}").exists() for suffix in (".ipynb", ".html")):
        stem = f"{name}-{time.strftime('%Y-%m-%dT%H-%M-%SZ', time.gmtime())}"
        while (target / f"{stem}.html").exists():
            stem += "-2"
        print(f"[{name}] the notebook stopped before its run started: its report is {stem}.html, beside the "
              "earlier one", flush=True)
    run_folder.claim(target)  # a report of a notebook that stopped early makes the folder the kit's too
    for report in reports:
        if report.is_file():
            if started:
                run_folder.add_file(target, report, f"{stem}{report.suffix}")
            else:
                (target / f"{stem}{report.suffix}").upload(report)
    return str(target / f"{stem}.html")


def redact_notebook(executed: Path, parameters: dict[str, object]) -> None:
    """Replace every secret a parameter carries (a presigned URL's signature, ``s3://KEY:SECRET@``;
    see :func:`helpers.storage.redact`) in the executed notebook, where papermill wrote the
    parameters as it received them, before the report is rendered from it."""
    import json

    from helpers import storage

    if not executed.exists():
        return
    text = original = executed.read_text(encoding="utf-8")
    for value in parameters.values():
        if isinstance(value, str) and storage.redact(value) != value:
            text = text.replace(json.dumps(value)[1:-1], json.dumps(storage.redact(value))[1:-1])
    if text != original:
        executed.write_text(text, encoding="utf-8")


def render_report(executed: Path, html_path: Path) -> bool:
    """Render an executed notebook to HTML; on any error print it and return False (never raise)."""
    if not executed.exists():
        return False
    try:
        import nbformat
        from nbconvert import HTMLExporter

        html, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))
        html_path.write_text(html, encoding="utf-8")
        return True
    except Exception as exc:  # noqa: BLE001  a report is a convenience; the results are already written
        print(f"could not render {html_path.name} ({type(exc).__name__}: {exc}); "
              f"the executed notebook {executed} and the results are intact", file=sys.stderr, flush=True)
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "results"),
                        help="output root: a folder, or a bucket URI such as s3://bucket/runs (default: results/)")
    parser.add_argument("--only", action="append", choices=sorted(NOTEBOOKS), help="run only this notebook")
    parser.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="override a parameter (a Python literal, else a string)")
    args = parser.parse_args(argv)
    overrides = {name: parse_value(value) for name, value in args.p}
    names = args.only or sorted(NOTEBOOKS)
    from helpers.parameters import ParameterError

    try:
        check_names(names, overrides)  # every notebook's, before the first one starts
    except ParameterError as exc:
        print(exc, file=sys.stderr)
        return 2
    for name in names:
        run(name, args.out, overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
