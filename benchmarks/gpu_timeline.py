"""A compact GPU timeline for a benchmark step: ``nvidia-smi`` samples summarised per 10 s, beside the
moments the engines reported (vLLM's and Ray Data's own log lines) and the kit's result files.

``benchmarks/on_gpu.sh`` samples the GPU once a second for each step::

    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1

and runs this afterwards::

    python3 benchmarks/gpu_timeline.py SAMPLES.csv [--logs FOLDER] [--results FOLDER ...]

Prints one line per 10 s (mean % busy, the most memory in use), then the engines' events (weights
loaded, KV cache sized, CUDA graphs captured, engine ready) and the first and last result file, each
at its second from the first sample, so that idle stretches can be put beside what happened then.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from pathlib import Path

#: vLLM's log lines ("INFO 11-24 17:03:12 [gpu_worker.py:123] ...") that mark an engine's start.
EVENTS = re.compile(r"(Loading weights took|Model loading took|Available KV cache memory|reserved .* KV Cache|"
                    r"GPU KV cache size|Maximum concurrency|Graph capturing finished|init engine|"
                    r"Engine core initialization failed|No available memory|Error in memory profiling|"
                    r"Free memory on device|CUDA out of memory|torch.compile takes|Compiling a graph)")
VLLM_TIME = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG)\s+(\d\d-\d\d \d\d:\d\d:\d\d)")
PID = re.compile(r"\((\w+) pid=(\d+)")


def samples(path: Path) -> list[tuple[float, float, float]]:
    """(unix time, % busy, MiB used) per sample line."""
    out = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            when = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((when, float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    return out


def per_window(rows: list[tuple[float, float, float]], width: float = 10) -> list[str]:
    if not rows:
        return ["no nvidia-smi samples"]
    start = rows[0][0]
    lines = []
    window = 0
    while start + window * width <= rows[-1][0]:
        inside = [(u, m) for t, u, m in rows if start + window * width <= t < start + (window + 1) * width]
        if inside:
            lines.append(f"{window * width:6.0f}s {sum(u for u, _ in inside) / len(inside):5.0f}% busy "
                         f"{max(m for _, m in inside) / 1024:6.1f} GiB")
        window += 1
    return lines


def events(folder: Path, year: int, start: float) -> list[str]:
    """Engine events from vLLM's lines in the logs under ``folder``, at their second from ``start``."""
    found = []
    for log in sorted(folder.rglob("*")):
        if not log.is_file() or log.suffix not in (".out", ".err", ".log"):
            continue
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if not EVENTS.search(line):
                continue
            stamp = VLLM_TIME.search(line)
            if not stamp:
                continue
            when = dt.datetime.strptime(f"{year}-{stamp.group(1)}", "%Y-%m-%d %H:%M:%S").timestamp()
            if when < start - 5:  # an earlier step's
                continue
            who = PID.search(line)
            message = line[stamp.end():].strip()[:150]
            found.append((when, f"{when - start:6.0f}s {('pid ' + who.group(2)) if who else log.name[:20]}: {message}"))
    return [text for _, text in sorted(set(found))]


def result_files(folders: list[Path], start: float) -> list[str]:
    lines = []
    for folder in folders:
        times = sorted(p.stat().st_mtime for p in folder.rglob("*.parquet") if "results" in p.parts)
        if times:
            lines.append(f"{folder.name}: {len(times)} result files, first at {times[0] - start:.0f}s, "
                         f"last at {times[-1] - start:.0f}s")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", type=Path)
    parser.add_argument("--logs", type=Path, action="append", default=[])
    parser.add_argument("--results", type=Path, action="append", default=[])
    args = parser.parse_args()
    rows = samples(args.samples)
    print(f"== GPU timeline ({len(rows)} samples, 1 s apart; per 10 s: mean busy, most memory in use)")
    print("\n".join(per_window(rows)))
    if rows:
        start = rows[0][0]
        year = dt.datetime.fromtimestamp(start).year
        for folder in args.logs:
            if folder.exists():
                print(f"== engine events in {folder} (s from the first sample)")
                print("\n".join(events(folder, year, start)[:80]))
        print("\n".join(result_files(args.results, start)))


if __name__ == "__main__":
    main()
