"""Keep the generated tables in README.md and docs/*.md in step with their sources.

A parameter table sits between ``<!-- params:NAME -->`` and ``<!-- /params:NAME -->`` and is
generated from the ``parameters`` cell of ``notebooks/NAME.ipynb``; the presets table sits between
``<!-- presets -->`` and ``<!-- /presets -->`` and comes from ``helpers.presets``. Blocks are
rendered in whichever of README.md and docs/*.md holds them (today docs/parameters.md and
docs/gpus-and-presets.md). Without options, those files are rewritten in place; ``--check``
changes nothing and fails, naming the files, when a table is out of date (a test runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- params:(?P<name>\w+) -->\n)(?P<body>.*?)(<!-- /params:(?P=name) -->)", re.DOTALL)


def parameter_rows(notebook: Path) -> list[tuple[str, str, str]]:
    """(name, default, comment) for each parameter of the notebook's parameters cell."""
    from run_notebooks import parameters_cell, parse_cell  # a script beside this one

    return [(p.name, p.source, p.comment) for p in parse_cell(parameters_cell(notebook))]


def table(notebook: Path) -> str:
    lines = ["| parameter | default | what it does |", "|---|---|---|"]
    for name, value, comment in parameter_rows(notebook):
        shown = value if len(value) <= 40 else value[:37] + "..."
        lines.append(f"| `{name}` | `{shown}` | {comment.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


PRESETS_BLOCK = re.compile(r"(<!-- presets -->\n)(?P<body>.*?)(<!-- /presets -->)", re.DOTALL)


def checked(preset) -> str:
    """What the kit's configuration checks find in ``preset`` on its own hardware."""
    from helpers.plans import ConfigurationError, check

    try:
        return "; ".join(check(preset)) or "passes"
    except ConfigurationError as exc:
        return " ".join(str(exc).split())


def presets_table() -> str:
    from helpers.presets import PRESETS

    lines = ["| preset | model | GPU | replicas x GPUs each | batch | max_model_len | blocks | about | the checks |",
             "|---|---|---|---|---|---|---|---|---|"]
    for task in ("text", "vision"):
        for p in (p for p in PRESETS.values() if p.task == task):
            lines.append(f"| `{p.name}` | {p.model_source} | {p.accelerator_type or 'CPU'} | {p.concurrency} x "
                         f"{p.gpus_per_replica:g} | {p.batch_size} | {p.max_model_len} | {p.num_blocks} | {p.description} "
                         f"| {checked(p)} |")
    return "\n".join(lines) + "\n"


def render(text: str) -> str:
    text = BLOCK.sub(lambda m: m.group(1) + table(REPO / "notebooks" / f"{m.group('name')}.ipynb") + m.group(4), text)
    return PRESETS_BLOCK.sub(lambda m: m.group(1) + presets_table() + m.group(3), text)


def pages(root: Path = REPO) -> list[Path]:
    """The files that may hold generated blocks: README.md and every page in docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def main(argv: list[str] | None = None, root: Path = REPO) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; fail if a table is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path in pages(root):
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        new = render(text)
        if new == text:
            continue
        stale.append(path.relative_to(root).as_posix())
        if not args.check:
            path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(f"generated tables out of date in {', '.join(stale)}: run python scripts/render_readme.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
