"""Start-up of a short run: the stages' actor pools started at once (the kit) vs one after another.

Ray Data starts an operator's actor pool, and with a positive ``wait_for_min_actors_s`` waits for
its actors before it starts the next operator's. The kit used to set one (to bound the start): the
light stages' actors (the multimodal parser, the chat template) then started, and finished
starting, before the engine's. The kit now leaves Ray's default (no wait); the baseline gets the old
behaviour back through Ray's own variable ``RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S``.

Each side runs the same notebook through ``scripts/run_notebooks.py`` (as a user does), one after the
other in the same run, on the same machine; the ratio is baseline / kit of the pipeline's seconds
(engine start included, from ``summary.json``). Run:
``python benchmarks/bench_startup.py`` (``--only text_classification``, ``-p NAME VALUE``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIDES = {
    "stages in turn (baseline)": {"RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S": "600"},
    "all at once (kit)": {},
}


def run_side(notebook: str, out: Path, env_changes: dict[str, str], params: list[list[str]]) -> dict:
    """Run ``notebook`` once with ``env_changes``; return its summary and the wall time."""
    cmd = [sys.executable, str(REPO / "scripts" / "run_notebooks.py"), "--only", notebook, "--out", str(out)]
    for name, value in params:
        cmd += ["-p", name, value]
    env = {**os.environ, **env_changes}
    started = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    return {**json.loads((out / notebook / "summary.json").read_text()), "wall": wall}


def table(results: dict[str, dict]) -> str:
    (base_name, base), (kit_name, kit) = results.items()
    lines = [f"{'':28}{'pipeline':>10}{'notebook':>10}", *[
        f"{name:28}{r['pipeline seconds']:>9.1f}s{r['wall']:>9.1f}s" for name, r in results.items()]]
    lines.append(f"{'baseline / kit':28}{base['pipeline seconds'] / kit['pipeline seconds']:>9.2f}x"
                 f"{base['wall'] / kit['wall']:>9.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="vlm_captioning", help="the notebook (default vlm_captioning)")
    parser.add_argument("--workdir", default=None, help="keep the runs' results here (default: a temp folder)")
    parser.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a notebook parameter for both sides")
    args = parser.parse_args(argv)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench-startup-"))
    results = {name: run_side(args.only, root / f"side{i}", env, args.p) for i, (name, env) in enumerate(SIDES.items())}
    for name, r in results.items():
        accounted = r.get("all rows accounted for", r.get("all images accounted for"))
        print(f"{name}: {r.get('rows read', r.get('images read'))} read, all accounted for: {accounted}")
    print(f"== {args.only}, {platform.node()}, {os.cpu_count()} cores, parameters {args.p or 'defaults'}")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
