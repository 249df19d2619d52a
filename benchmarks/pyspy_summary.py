"""A py-spy recording with ``--subprocesses -f raw`` summed up per process: how much of a core each one
used while recorded (samples over rate x seconds; py-spy leaves idle threads out, and with ``--gil``
keeps only samples where a thread holds the GIL), and where: the functions its samples were in
(self), and the kit's and Ray Data's frames they passed through.

    python benchmarks/pyspy_summary.py pyspy-kept-batch+confidence.txt --rate 50 --seconds 15
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

PROCESS = re.compile(r'process (\d+):"(.*?)"(?=;|$)', re.S)


def per_process(text: str) -> dict[str, tuple[int, collections.Counter, collections.Counter]]:
    """Samples, self frames and every frame (once a sample) per process (its pid and title)."""
    out: dict[str, tuple[int, collections.Counter, collections.Counter]] = {}
    for record, count in re.findall(r"(.*?) (\d+)\n", text, re.S):
        owners = list(PROCESS.finditer(record))
        if not owners:
            continue
        pid, title = owners[-1].groups()
        frames = [f for f in record[owners[-1].end():].split(";") if f]
        name = f"{pid} {title.split(chr(10))[0][:90]}"
        n, own, seen = out.get(name, (0, collections.Counter(), collections.Counter()))
        own[frames[-1] if frames else "?"] += int(count)
        seen.update({f: int(count) for f in set(frames)})
        out[name] = (n + int(count), own, seen)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    for name, (n, own, seen) in sorted(per_process(args.raw.read_text()).items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{n / (args.rate * args.seconds):5.2f} cores  {name}")
        for frame, k in own.most_common(6):
            print(f"        {100 * k / n:4.0f}% self   {frame[:140]}")
        for frame, k in [(f, k) for f, k in seen.most_common(60) if "helpers/" in f or "ray/data/" in f][:6]:
            print(f"        {100 * k / n:4.0f}% within {frame[:140]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
