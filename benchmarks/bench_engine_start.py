"""Where one vLLM engine's start goes on a GPU, and what compilation settings cost in steady state.

Each of the kit's engines spends seconds compiling (torch.compile; its cache is cold on a
fresh machine) and capturing CUDA graphs before its first batch. This runs ``vllm.LLM`` (the engine
the kit's notebook runs through Ray, with the same engine-core process) once per setting, each in a
fresh Python process, in the order given, and prints per run: the import, the engine's start
(``LLM(...)``) with vLLM's own lines for its parts (weights, torch.compile, CUDA graphs, the whole
init), and prompts/s over the same prompts (about 60 tokens each, 8 answer tokens: the shape of the
text notebook's requests), after a warm-up batch.

    python benchmarks/bench_engine_start.py MODEL_FOLDER default kit-sizes default no-compile kit

MODEL_FOLDER: a shape with random weights (``python benchmarks/random_weights.py MODEL`` prints one; the
engine makes the weights up, ``load_format="dummy"``). The first run of a setting on a machine compiles
cold; repeat it to read the warm start. Settings: ``default`` (vLLM's own), ``kit-sizes`` (the kit's CUDA
graph sizes, ``presets.CAPTURE_SIZES``, compiled: what ``ENGINE={"torch_compile": True}`` runs),
``no-compile`` (``presets.NO_COMPILE``: no torch.compile, CUDA graphs for decode-only steps, vLLM's
sizes), ``kit`` (both: the kit's GPU engines by default).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.presets import CAPTURE_SIZES, NO_COMPILE, PRESETS  # noqa: E402

SETTINGS = {
    "default": None,
    "kit-sizes": {"cudagraph_capture_sizes": list(CAPTURE_SIZES)},
    "no-compile": dict(NO_COMPILE),
    # What the kit's engine arguments give a GPU engine of 512 sequences (the child's), as the kit makes them.
    "kit": PRESETS["text-llama8b-h100"].override(max_num_seqs=512).engine_args["compilation_config"],
}

#: vLLM's own lines for the parts of its start (the same in 0.26 and 0.29), and what each is called here.
PARTS = {
    "weights_s": r"Model loading took [\d.]+ GiB memory and ([\d.]+) seconds",
    "compile_s": r"torch\.compile took ([\d.]+) s in total",
    "graphs_s": r"Graph capturing finished in ([\d.]+) sec",
    "init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}

CHILD = r"""
import json, random, sys, time
spec = json.loads(sys.argv[1])
began = time.perf_counter()
from vllm import LLM, SamplingParams
imported = time.perf_counter() - began
kwargs = dict(model=spec["model"], load_format="dummy", max_model_len=256, max_num_seqs=512,
              max_num_batched_tokens=16384, gpu_memory_utilization=0.9, disable_log_stats=True)
if spec["cc"] is not None:
    kwargs["compilation_config"] = spec["cc"]
began = time.perf_counter()
llm = LLM(**kwargs)
started = time.perf_counter() - began
rng = random.Random(0)
prompts = [{"prompt_token_ids": [rng.randrange(1000, 40000) for _ in range(60)]} for _ in range(spec["prompts"])]
params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
llm.generate(prompts[:1024], params, use_tqdm=False)
began = time.perf_counter()
llm.generate(prompts, params, use_tqdm=False)
seconds = time.perf_counter() - began
print("RESULT " + json.dumps({"import_s": round(imported, 1), "start_s": round(started, 1),
                              "prompts_per_s": round(len(prompts) / seconds, 1)}), flush=True)
"""


def run(model: str, name: str, prompts: int) -> dict:
    spec = {"model": model, "cc": SETTINGS[name], "prompts": prompts}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, timeout=580)
    said = done.stdout + done.stderr
    found = {"setting": name, "process_s": round(time.perf_counter() - began, 1), "rc": done.returncode}
    for line in said.splitlines():
        if line.startswith("RESULT "):
            found.update(json.loads(line[len("RESULT "):]))
    for part, pattern in PARTS.items():
        values = [float(v) for v in re.findall(pattern, said)]
        if values:
            found[part] = values[-1]
    if done.returncode:
        found["error"] = said[-1500:]
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model folder (a random-weights shape: load_format dummy)")
    parser.add_argument("settings", nargs="+", choices=sorted(SETTINGS))
    parser.add_argument("--prompts", type=int, default=20_000)
    args = parser.parse_args(argv)
    for name in args.settings:
        print("ENGINE " + json.dumps(run(args.model, name, args.prompts)), flush=True)


if __name__ == "__main__":
    main()
