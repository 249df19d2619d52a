"""Start your own project from one of the kit's use cases: one command, a self-contained folder.

    python scripts/new_project.py text_classification ~/work/ticket-router --job-name ticket-router
    python scripts/new_project.py kit-job     # re-render the kit's own job.yaml from the same template

The new folder holds the use case's notebook (as committed: outputs cleared except the checked
summary cell), only the ``helpers`` modules it imports (found by following its imports), the
requirement files and Makefile (same two install paths, same two commands), the runner script, a
``job.yaml`` named after your job, a README, and tests: the kit's unit tests for the modules you
take, plus a test of the project itself. Nothing in it refers back to the kit.

The small files that differ per project are Jinja templates in ``templates/project/``, rendered
with Jinja2 (already installed with nbconvert). Everything else is copied from the kit as it is,
so a project starts from exactly the code the kit tests.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "templates" / "project"
USE_CASES = {
    "text_classification": {"task": "text", "title": "Text classification with structured outputs",
                            "gpu_preset": "text-llama8b-l4", "sample_data": ["customers.csv"]},
    "vlm_captioning": {"task": "vision", "title": "Image captioning with a vision-language model",
                       "gpu_preset": "vision-qwen3b-l4", "sample_data": ["sample-000000.tar", "tiny-qwen2-vl"]},
}
#: Copied verbatim: the install paths, the two commands and the scripts they run.
COPIED = ["Makefile", "requirements.txt", "requirements-cpu.txt", "requirements-common.txt",
          "scripts/run_notebooks.py", "scripts/patch_torchvision.py", "scripts/clear_outputs.py"]
#: Modules of vLLM and Ray that are not their public API: nothing a project carries imports them.
INTERNALS = re.compile(r"\b(vllm\.(v1|entrypoints|engine|executor)|ray\.llm\._internal|ray\.[\w.]*\._private)\b")
JOB_NAME = re.compile(r"^[a-z][a-z0-9-]{1,62}[a-z0-9]$")


def helper_imports(source: str) -> set[str]:
    """``helpers`` modules that Python ``source`` imports (``from helpers import x``,
    ``from helpers.x import y``, ``import helpers.x``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "helpers":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("helpers."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("helpers."))
    return found


def notebook_code(path: Path) -> str:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code" and not c.source.lstrip().startswith("%"))


def module_closure(roots: set[str], package: Path = REPO / "helpers") -> list[str]:
    """``roots`` and every ``helpers`` module they import, transitively, sorted."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        file = package / f"{name}.py"
        if not file.is_file():
            raise FileNotFoundError(f"helpers.{name} is imported but {file} does not exist")
        seen.add(name)
        todo.extend(helper_imports(file.read_text()) - seen)
    return sorted(seen)


def portable_tests(modules: list[str]) -> list[Path]:
    """The kit's unit tests that test only ``modules`` and need nothing else from the kit
    (no scripts, notebooks, repository paths, the kit's own fixtures or other test modules, which a
    project does not carry)."""
    chosen = []
    for test in sorted((REPO / "tests").glob("test_*.py")):
        source = test.read_text()
        imported = helper_imports(source)
        needs_kit = re.search(r"\bload_script\b|\bREPO\b|\brepo\b|^\s*(from|import)\s+(test_\w+|conftest)", source, re.M)
        internals = re.search(INTERNALS, source)  # the kit's checks against vLLM's and Ray's internals stay in the kit
        if imported and imported <= set(modules) and not needs_kit and not internals:
            chosen.append(test)
    return chosen


def project_modules(use_case: str) -> list[str]:
    """The ``helpers`` modules a project for ``use_case`` takes: what its notebook imports, transitively."""
    return module_closure(helper_imports(notebook_code(REPO / "notebooks" / f"{use_case}.ipynb")))


def carried(use_case: str) -> list[Path]:
    """The kit's files a project for ``use_case`` runs as they are: its notebook (under nbval) and the
    kit's unit tests it takes (:func:`portable_tests`)."""
    return [REPO / "notebooks" / f"{use_case}.ipynb", *portable_tests(project_modules(use_case))]


def render(template: str, context: dict) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    return env.get_template(template).render(**context)


#: The kit's own job.yaml is rendered from the same template (``new_project.py kit-job`` rewrites it).
KIT_JOB = ("text_classification", "llm-batch-text-classification")


def render_job(use_case: str, job_name: str) -> str:
    return render("job.yaml.jinja", {"use_case": use_case, "job_name": job_name, **USE_CASES[use_case]})


def create(use_case: str, dest: Path, job_name: str) -> Path:
    """Write the project for ``use_case`` into ``dest`` (new or empty) and return it."""
    if use_case not in USE_CASES:
        raise ValueError(f"use case must be one of {sorted(USE_CASES)}, got {use_case!r}")
    if not JOB_NAME.match(job_name):
        raise ValueError(f"job name must be 3-64 characters of a-z, 0-9 and '-', starting with a letter, "
                         f"got {job_name!r}")
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not empty; choose a new folder")
    notebook = REPO / "notebooks" / f"{use_case}.ipynb"
    modules = project_modules(use_case)
    tests = portable_tests(modules)

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "notebooks").mkdir()
    shutil.copy2(notebook, dest / "notebooks" / notebook.name)
    (dest / "helpers").mkdir()
    for name in modules:
        shutil.copy2(REPO / "helpers" / f"{name}.py", dest / "helpers" / f"{name}.py")
    (dest / "helpers" / "sample_data").mkdir()
    for name in USE_CASES[use_case]["sample_data"]:  # the bundled input and offline model it runs on
        source, target = REPO / "helpers" / "sample_data" / name, dest / "helpers" / "sample_data" / name
        shutil.copytree(source, target) if source.is_dir() else shutil.copy2(source, target)
    for rel in COPIED:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)
    (dest / "tests").mkdir()
    for test in tests:
        shutil.copy2(test, dest / "tests" / test.name)

    context = {
        "use_case": use_case, "job_name": job_name, **USE_CASES[use_case],
        "modules": modules,
        "tests": [t.name for t in tests],
    }
    for template in sorted(TEMPLATES.rglob("*.jinja")):
        rel = template.relative_to(TEMPLATES)
        target = dest / str(rel)[: -len(".jinja")]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(str(rel), context))
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("use_case", choices=[*sorted(USE_CASES), "kit-job"],
                        help="the use case to start from (kit-job: re-render the kit's own job.yaml)")
    parser.add_argument("dest", type=Path, nargs="?", help="the new project's folder (new or empty)")
    parser.add_argument("--job-name", help="the Anyscale job's name (default: the folder's name)")
    args = parser.parse_args(argv)
    if args.use_case == "kit-job":
        (REPO / "job.yaml").write_text(render_job(*KIT_JOB))
        print("wrote job.yaml")
        return 0
    if args.dest is None:
        parser.error("give the new project's folder")
    job_name = args.job_name or args.dest.resolve().name.lower().replace("_", "-")
    try:
        dest = create(args.use_case, args.dest, job_name)
    except (ValueError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"created {dest}: cd there and run `make test`, then `make job`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
