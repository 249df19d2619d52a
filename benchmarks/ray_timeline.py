"""Ray's task timeline (``ray.timeline``, as ``bench_second_run.py --ray-timeline`` writes it) summed up
per run: how long the read ran, and each engine-stage actor's calls (start and length, from the run's
first call), to see what paces a run: the read handing out blocks, or the engines.

    python benchmarks/ray_timeline.py text8b-second.ray-timeline.json

Runs are told apart by the longest pause between two calls of the engines' stage (two runs: one pause).
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

STAGE, READ = "MapBatches(_Send)).submit", "task::Read"  # the engines' stage's actor calls; a read task


def runs(events: list[dict], count: int = 2) -> list[str]:
    """Lines per run: the read tasks still running at its first call, then each stage actor's calls, in seconds."""
    spans = [e for e in events if e.get("ph") == "X"]
    calls = sorted((e for e in spans if e["cat"].endswith(STAGE)), key=lambda e: e["ts"])
    cuts = sorted(sorted(range(1, len(calls)), key=lambda i: calls[i]["ts"] - calls[i - 1]["ts"])[-(count - 1):]) if count > 1 else []
    lines = []
    for number, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(calls)]), 1):
        run = calls[a:b]
        start, end = run[0]["ts"], max(e["ts"] + e["dur"] for e in run)
        lines.append(f"run {number}: {len(run)} calls of the engines' stage over {(end - start) / 1e6:.1f} s")
        for e in spans:
            if e["cat"].startswith(READ) and e["ts"] + e["dur"] > start and e["ts"] < end:  # ran with the run
                lines.append(f"  {e['cat'][6:]}: from {(e['ts'] - start) / 1e6:+.1f} s for {e['dur'] / 1e6:.1f} s")
        actors = collections.defaultdict(list)
        for e in run:
            actors[e["tid"]].append(f"{(e['ts'] - start) / 1e6:.1f}+{e['dur'] / 1e6:.1f}")
        for tid, each in actors.items():
            lines.append(f"  actor {tid[-8:]}: {len(each)} calls (start+length, s): {' '.join(each)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timeline", type=Path)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    print("\n".join(runs(json.loads(args.timeline.read_text()), args.runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
