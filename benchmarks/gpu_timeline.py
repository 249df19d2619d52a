"""A compact GPU timeline for a benchmark step: ``nvidia-smi`` samples summarised per 10 s, one column
per GPU (never averaged over the GPUs), beside the moments the engines reported (vLLM's and Ray
Data's own log lines) and the kit's result files.

``benchmarks/on_gpu.sh`` samples every GPU once a second for each step::

    nvidia-smi --query-gpu=index,timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1

and runs this afterwards::

    python3 benchmarks/gpu_timeline.py SAMPLES.csv [--logs FOLDER] [--results FOLDER ...]

(``--results``: a folder holding kit runs' ``OUTPUT_DIR``; their result files are under ``parts/``.)

Prints one line per 10 s with each GPU's mean % busy and the most memory it held, then each GPU's
busy share over the span of the result files (the steady state), the engines' events (weights
loaded, KV cache sized, CUDA graphs captured, engine ready) and the first and last result file, each
at its second from the first sample, so that idle stretches can be put beside what happened then.
Older logs without ``index`` (one GPU: ``timestamp,utilization.gpu,memory.used``) read as GPU 0.
An average over the GPUs would hide a GPU that idles: a one-GPU run on a two-GPU machine read
"43% busy" averaged where its GPU was 78-92% busy.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
from pathlib import Path

#: vLLM's log lines ("INFO 11-24 17:03:12 [gpu_worker.py:123] ...") that mark an engine's start.
EVENTS = re.compile(r"(Resolved architecture|Initializing a V1 LLM engine|Starting to load model|"  # config, core, load
                    r"Loading weights took|Model loading took|Available KV cache memory|reserved .* KV Cache|"
                    r"GPU KV cache size|Maximum concurrency|Graph capturing finished|init engine|"
                    r"Engine core initialization failed|No available memory|Error in memory profiling|"
                    r"Free memory on device|CUDA out of memory|torch.compile takes|Compiling a graph)")
VLLM_TIME = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG)\s+(\d\d-\d\d \d\d:\d\d:\d\d)")
PID = re.compile(r"\((\w+) pid=(\d+)")
RESULTS = "parts"  # the folder of OUTPUT_DIR where Ray writes the kit's result files (helpers.run_folder.PARTS)


Sample = tuple[float, int, float, float]  # (unix time, GPU index, % busy, MiB used)


def samples(path: Path) -> list[Sample]:
    """(unix time, GPU index, % busy, MiB used) per sample line: ``index,timestamp,util,memory``, or
    ``timestamp,util,memory`` from logs written before the index was asked for (GPU 0)."""
    out = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            index = 0
            if len(parts) >= 4 and parts[0].isdigit():
                index, parts = int(parts[0]), parts[1:]
            when = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((when, index, float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    return out


def gpus(rows: list[Sample]) -> list[int]:
    """The GPU indices the samples cover, in order."""
    return sorted({index for _, index, _, _ in rows})


def per_gpu(rows: list[Sample], start: float, end: float) -> dict[int, tuple[float, float, int]]:
    """Each GPU's own mean % busy, most memory in use (GiB) and sample count between ``start`` and
    ``end`` (inclusive); a GPU with no sample there is left out. Never a mean over GPUs."""
    found: dict[int, list[tuple[float, float]]] = {}
    for when, index, busy, memory in rows:
        if start <= when <= end:
            found.setdefault(index, []).append((busy, memory))
    return {index: (sum(b for b, _ in seen) / len(seen), max(m for _, m in seen) / 1024, len(seen))
            for index, seen in sorted(found.items())}


def per_gpu_line(stats: dict[int, tuple[float, float, int]]) -> str:
    """``GPU0  85% 41.0 GiB | GPU1 ...``: one column per GPU."""
    return " | ".join(f"GPU{index} {busy:4.0f}% {memory:5.1f} GiB" for index, (busy, memory, _) in stats.items())


def per_window(rows: list[Sample], width: float = 10) -> list[str]:
    """One line per ``width`` seconds: each GPU's mean busy and most memory, a column per GPU."""
    if not rows:
        return ["no nvidia-smi samples"]
    start, last = min(r[0] for r in rows), max(r[0] for r in rows)
    lines = []
    window = 0
    while start + window * width <= last:
        # Half-open windows, so that a sample on a boundary counts once.
        inside = [r for r in rows if start + window * width <= r[0] < start + (window + 1) * width]
        if inside:
            lines.append(f"{window * width:6.0f}s  {per_gpu_line(per_gpu(inside, -math.inf, math.inf))}")
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


def result_span(folders: list[Path], since: float = -math.inf) -> tuple[float, float] | None:
    """From the first to the last result file in ``folders`` written after ``since`` (unix times;
    earlier runs' files, kept in the same folders, are left out); None without any."""
    times = [t for folder in folders for p in folder.rglob("*.parquet")
             if RESULTS in p.relative_to(folder).parts and (t := p.stat().st_mtime) >= since]
    return (min(times), max(times)) if times else None


def result_files(folders: list[Path], start: float) -> list[str]:
    lines = []
    for folder in folders:
        times = sorted(t for p in folder.rglob("*.parquet")
                       if RESULTS in p.relative_to(folder).parts and (t := p.stat().st_mtime) >= start - 5)  # this step's
        if times:
            lines.append(f"{folder.name}: {len(times)} result files, first at {times[0] - start:.0f}s, "
                         f"last at {times[-1] - start:.0f}s")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", type=Path)
    parser.add_argument("--logs", type=Path, action="append", default=[])
    parser.add_argument("--results", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    rows = samples(args.samples)
    seen = gpus(rows)
    print(f"== GPU timeline ({len(rows)} samples of {len(seen)} GPU(s) {seen}, 1 s apart; per 10 s and per GPU, "
          f"never averaged over GPUs: mean busy, most memory in use)")
    print("\n".join(per_window(rows)))
    if rows:
        start = min(r[0] for r in rows)
        span = result_span([f for f in args.results if f.exists()], since=start - 5)
        steady = per_gpu(rows, *span) if span else {}
        if span and not steady:
            print(f"== no GPU sample from the first to the last result file ({span[0] - start:.0f}s to "
                  f"{span[1] - start:.0f}s): too short to say how busy each GPU was")
        elif steady:
            print(f"== per GPU from the first to the last result file ({span[0] - start:.0f}s to {span[1] - start:.0f}s; "
                  f"{', '.join(f'GPU{i} {n} samples' for i, (_, _, n) in steady.items())}):")
            print("\n".join(f"GPU{index}: {busy:.0f}% busy, up to {memory:.1f} GiB"
                            for index, (busy, memory, _) in steady.items()))
        year = dt.datetime.fromtimestamp(start).year
        for folder in args.logs:
            if folder.exists():
                print(f"== engine events in {folder} (s from the first sample)")
                print("\n".join(events(folder, year, start)[:80]))
        print("\n".join(result_files(args.results, start)))


if __name__ == "__main__":
    main()
