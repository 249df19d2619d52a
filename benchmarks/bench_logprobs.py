"""What each way of asking for log-probabilities costs one vLLM engine: the text notebook's requests
(structured choice among its labels) on one ``vllm.LLM``, one variant after another in one process,
each output then turned into a row by Ray's own engine-stage code (``vLLMOutputData``), as the kit's
engine actor does. It answers where ``CONFIDENCE``'s cost goes, before the kit's runs measure it.

Variants (``--variants``, in order; ``off`` twice brackets the rest so a drifting machine shows):

- ``off``: no log-probabilities (``CONFIDENCE = False``).
- ``k20``: ``logprobs=20``, vLLM decoding every candidate (the kit before this benchmark).
- ``k20-raw``: ``logprobs=20``, ``detokenize=False`` (the notebook's request: the labels' token texts
  come from ``labels.pieces``, Ray's detokenize stage decodes the answer).
- ``k20-flat``: ``k20-raw`` with ``flat_logprobs=True`` (vLLM keeps each request's candidates in a few
  flat lists instead of a ``Logprob`` object per candidate; Ray's stage reads them as before).
- ``k5-raw``, ``k1-raw``: 5 and 1 candidates, not decoded.

Per variant: rows/s over ``LLM.chat`` plus Ray's conversion, this process's CPU per row (vLLM's frontend
and Ray's conversion: what a Ray engine actor spends; the least of a variant's runs), each GPU's busy
share (nvidia-smi), and the confidence the kit computes beside ``k20``'s on the same rows (mean absolute
difference, the mean unresolved mass). ``--profile VARIANT`` records that variant's processes with
py-spy (the driver and vLLM's engine core) into ``--out``. Run on the GPU machine (``on_gpu.sh
logprobs``) or here:

    python benchmarks/bench_logprobs.py --rows 200
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_pipeline as b  # noqa: E402  (the notebook's requests and settings)

VARIANTS = {"off": {}, "k20": {"logprobs": 20}, "k20-raw": {"logprobs": 20, "detokenize": False},
            "k20-flat": {"logprobs": 20, "detokenize": False, "flat_logprobs": True},
            "k5-raw": {"logprobs": 5, "detokenize": False}, "k1-raw": {"logprobs": 1, "detokenize": False}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--model", default=None, help="MODEL_SOURCE (a folder); default: the offline SmolLM2")
    ap.add_argument("--variants", default="off,k20,k20-raw,k20-flat,k5-raw,k1-raw,off")
    ap.add_argument("--profile", default=None, help="a variant to record with py-spy")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_logprobs"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")

    settings = b.run_settings("text", {"MODEL_SOURCE": args.model} if args.model else {})
    csv = b.text_input(args.rows, args.out / f"input-{args.rows}")
    setup = b.text_setup(csv, settings)
    spec = setup.spec
    # The kit read the GPUs through CUDA's driver in this process: vLLM's engine core must not be forked.
    os.environ.update(spec["env"], VLLM_WORKER_MULTIPROC_METHOD="spawn")
    import pandas as pd
    from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMOutputData
    from vllm import LLM

    from helpers import labels

    params = spec["params"]
    texts = pd.read_csv(csv)[params["TEXT_COLUMN"]].astype(str).tolist()
    requests = [b.text_request(t, {**params, "CONFIDENCE": False}, spec["max_tokens"]) for t in texts]
    started = time.perf_counter()
    llm = LLM(model=spec["model"], **spec["engine_kwargs"])
    print(f"engine ready in {time.perf_counter() - started:.1f} s; {len(requests):,} prompts of {csv}; "
          f"model {setup.name}; engine arguments {spec['engine_kwargs']}", flush=True)
    pieces = labels.pieces(llm.get_tokenizer(), params["LABELS"])
    tokenizer = llm.get_tokenizer()
    base = requests[0]["sampling_params"]
    seen: dict[str, dict] = {}
    with b.GpuSampler() as gpu:
        for name in names:
            sampling = b.sampling({**base, **VARIANTS[name]})
            spy = None
            if name == args.profile:
                py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                spy = subprocess.Popen([py_spy, "record", "--pid", str(os.getpid()), "--subprocesses", "--nonblocking",
                                        "-d", "20", "-r", "50", "-f", "raw", "-o", str(args.out / f"pyspy-{name}.txt")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            t0, at, cpu0 = time.perf_counter(), time.time(), time.process_time()
            outputs = llm.chat([r["messages"] for r in requests], sampling, use_tqdm=False)
            rows = [vLLMOutputData.from_vllm_engine_output(o).model_dump() for o in outputs]  # Ray's engine stage
            seconds, until = time.perf_counter() - t0, time.time()
            # This process's CPU (vLLM's frontend: requests in, outputs and their log-probabilities out; Ray's
            # conversion), not the engine core's: the share a Ray engine actor spends per row.
            frontend_ms = 1000 * (time.process_time() - cpu0) / len(rows)
            if spy:
                spy.wait(timeout=120)
            answers = [r["generated_text"] or tokenizer.decode(r["generated_tokens"], skip_special_tokens=True) for r in rows]
            conf = [labels.confidence(r, params["LABELS"], pieces) for r in rows] if VARIANTS[name] else None
            busy = " ".join(f"GPU{i} {u:.0f}%" for i, (u, _, _) in gpu.busy(at, until).items()) or "no GPU"
            seen.setdefault(name, {"rates": [], "frontend": []})["rates"].append(len(rows) / seconds)
            seen[name]["frontend"].append(frontend_ms)
            seen[name].update(answers=answers, conf=conf)
            print(f"{name}: {len(rows):,} rows in {seconds:.1f} s, {len(rows) / seconds:,.0f} rows/s, frontend CPU "
                  f"{frontend_ms:.2f} ms/row; {busy}; "
                  f"every answer a label: {all(a.strip() in params['LABELS'] for a in answers)}", flush=True)
    off = sum(seen["off"]["rates"]) / len(seen["off"]["rates"]) if "off" in seen else float("nan")
    print(f"\n{'variant':10} {'rows/s':>8} {'x off':>6} {'frontend ms/row':>15} {'conf mean':>9} {'|d| vs k20':>10} {'unresolved':>10}")
    for name, s in seen.items():
        rate = sum(s["rates"]) / len(s["rates"])
        line = f"{name:10} {rate:8.0f} {rate / off:6.2f} {min(s['frontend']):15.2f}"  # the least: the noise adds
        if s["conf"]:
            c = [x["confidence"] for x in s["conf"]]
            known = [x for x in c if x is not None]
            line += f" {sum(known) / max(len(known), 1):9.4f}"
            if "k20" in seen:
                ref = [x["confidence"] for x in seen["k20"]["conf"]]
                pairs = [(x, y) for x, y in zip(c, ref) if x is not None and y is not None]
                line += f" {sum(abs(x - y) for x, y in pairs) / max(len(pairs), 1):10.5f}"
            unresolved = [x["confidence_unresolved"] for x in s["conf"] if x["confidence_unresolved"] is not None]
            line += f" {sum(unresolved) / max(len(unresolved), 1):10.5f}  ({len(known)} of {len(c)} rows with one)"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
