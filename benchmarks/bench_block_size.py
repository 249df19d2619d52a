"""What the KV-cache block size costs one vLLM engine on the text notebook's requests: vLLM reuses a
prompt's cached start (prefix caching) a whole block at a time, and on a CPU its blocks hold 128 tokens,
more than the system message every row starts with. Each variant is one ``vllm.LLM`` in a fresh process
with the engine arguments the notebook's plan makes (``plans.fit``), changed only in its block size:

- ``kit``: the plan's (on a CPU, 32 tokens a block).
- ``vllm``: vLLM's own default (the plan's without ``block_size``: 128 on a CPU, 16 on a GPU).
- ``no-cache``: the plan's, with prefix caching off (what the block size alone changes).

Each prints its rows/s over ``LLM.chat`` (after a warm-up of 8 prompts); the last lines the ratios to
``vllm`` and how many answers equal its answers (greedy CPU answers can differ between correct runs):

    python benchmarks/bench_block_size.py --rows 300
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_pipeline as b  # noqa: E402  (the notebook's requests and settings)

VARIANTS = ("kit", "vllm", "no-cache")


def one(variant: str, rows: int, workdir: Path) -> dict:
    """One variant's engine and run, in this process."""
    settings = b.run_settings("text", {})
    csv = b.text_input(rows, workdir / f"input-{rows}")
    spec = b.text_setup(csv, settings).spec
    os.environ.update(spec["env"])  # as the notebook's engines get them
    from vllm import LLM

    kwargs = dict(spec["engine_kwargs"])
    if variant == "vllm":
        kwargs.pop("block_size", None)
    elif variant == "no-cache":
        kwargs["enable_prefix_caching"] = False
    import pandas as pd

    params = spec["params"]
    texts = pd.read_csv(csv)[params["TEXT_COLUMN"]].astype(str).tolist()
    requests = [b.text_request(t, params, spec["max_tokens"]) for t in texts]
    llm = LLM(model=spec["model"], **kwargs)
    sampling = b.sampling(requests[0]["sampling_params"])
    llm.chat([r["messages"] for r in requests[:8]], sampling, use_tqdm=False)  # warm-up
    started = time.perf_counter()
    outputs = llm.chat([r["messages"] for r in requests], sampling, use_tqdm=False)
    seconds = time.perf_counter() - started
    block = llm.llm_engine.vllm_config.cache_config.block_size
    return {"variant": variant, "block_size": block, "rows": len(outputs), "seconds": seconds,
            "answers": [list(o.outputs[0].token_ids) for o in outputs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench_block_size"))
    ap.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)  # a variant's own process
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.rows, args.workdir)), flush=True)
        return 0
    names = args.variants.split(",")
    if unknown := [n for n in names if n not in VARIANTS]:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    seen = {}
    for name in names:
        done = subprocess.run([sys.executable, __file__, "--one", name, "--rows", str(args.rows), "--workdir", str(args.workdir)],
                              capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        seen[name] = json.loads(lines[-1].removeprefix("RESULT "))
        r = seen[name]
        print(f"{name}: block_size {r['block_size']}, {r['rows']:,} rows in {r['seconds']:.1f} s, "
              f"{r['rows'] / r['seconds']:.1f} rows/s", flush=True)
    if "vllm" in seen:
        base = seen["vllm"]
        for name, r in seen.items():
            same = sum(a == c for a, c in zip(r["answers"], base["answers"]))
            print(f"RATIO {name} / vllm: {base['seconds'] / r['seconds']:.2f}x; answers equal {same} of {r['rows']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
