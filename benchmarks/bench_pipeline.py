"""The kit's pipelines vs raw vLLM, side by side in one run: what Ray Data LLM costs (or buys) here.

For each task it runs, on the same inputs, model, engine arguments and sampling settings:

- **raw**: a hand-written script in a fresh process: import vLLM, build one ``vllm.LLM``, call
  ``LLM.chat`` once over every prompt (for captions, each image is first prepared with the kit's
  ``prepare_image``, one by one, as a plain script would). Its requests are the ones the notebook's
  ``preprocess`` sends (:func:`text_request`, :func:`caption_request`; a test compares them). On a CPU
  it runs twice: with vLLM's defaults, and with the CPU settings the kit applies
  (``VLLM_CPU_OMP_THREADS_BIND`` over all cores), so you can tell what the kit's pipeline buys from
  what its settings buy. On a GPU that setting does not exist: it runs once.
- **kit**: the kit's own notebook, executed with papermill (the code users run, not a copy), on the
  same rows written as an input file.

Both sides get the engine arguments the notebook's configuration gives (``plans.fit``, then
``plans.fit_context`` on its requests, as the notebook does); on a GPU raw vLLM gets one engine with
the whole GPU (``replicas_per_gpu`` 1), what a plain script has.

Three times per side, each a ratio raw / kit (above 1: the kit is faster):

- *whole run*: from process start to results. Raw: the script's process. Kit: the notebook, with
  kernel start, Ray start, the checks, the reports and charts.
- *pipeline, engine start in*: raw: import vLLM + engine start + ``chat``. Kit: the notebook's
  pipeline cell (engine start, every stage, writing the results; ``summary.json``).
- *steady state*: raw: ``chat`` alone (engine start excluded). Kit: the run's rows at the rate its
  result files were written once they came (``summary.json``'s "rows/s steady state", fitted over
  the files), i.e. once every stage is running; ``nan`` where the run could not measure it (too few
  files, or all in one burst at the end: ``summary.json``'s "steady state" says which).

On a machine with a CUDA GPU the kit runs with ``PRESET="auto"`` (fitted to the GPU it finds) and
both sides use the offline models from their folders; a folder of ``random_weights.py`` as
``MODEL_SOURCE`` loads with ``load_format="dummy"`` on both sides.

Results are compared row by row (temperature 0 on both sides; see :class:`Agreement`): the rows answered
and the requests sent must be identical, the answers must agree on at least ``AGREEMENT_THRESHOLD`` of
the rows (greedy decoding on a CPU is not batch-invariant, so a few may differ). Run
``python benchmarks/bench_pipeline.py`` (``--rows``, ``--images``, ``--task``; ``-p NAME VALUE``
passes a notebook parameter, e.g. ``-p ENGINE "{'batch_size': 128}"``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "scripts"), str(Path(__file__).parent)]  # run_notebooks; the other benchmarks
import random_weights  # noqa: E402  (beside this script)
import run_notebooks  # noqa: E402  (a script beside the kit, not a package)
from profile_cells import PIPELINE_CELL  # noqa: E402  (the notebooks' run cell)

SUFFIXES = ["", " Group", " Holdings", " International", " & Partners", " Labs", " Services", " Co.",
            " Worldwide", " Systems"]
TEXT_EXAMPLE = "Walmart"  # the text notebook's example row (its prompt cell: ``example = {TEXT_COLUMN: "Walmart"}``)
CAPTION_SYSTEM = "You are a helpful assistant that describes images."  # the captioning notebook's system message
SAMPLE_ROWS = 200  # the rows the notebook's read keeps to fit its context (``pipeline.check_ids``)


@dataclass(frozen=True)
class Timing:
    whole_s: float  # process or notebook start to results
    pipeline_s: float  # engine start included
    generate_s: float  # steady state: engine start excluded


# --- inputs -------------------------------------------------------------------------------------

def text_input(rows: int, folder: Path) -> Path:
    """``rows`` distinct company names built from the bundled sample (name + suffix + number)."""
    from helpers.text_data import sample_path

    sample = pd.read_csv(sample_path()).dropna(subset=["Company"])
    # Only well-formed names: the sample's deliberately bad rows (empty, 60,000 characters) would
    # stop the raw loop, which has no per-row error handling; the kit records them as errors.
    sample = sample[sample["Company"].str.strip().str.len().between(1, 100)].reset_index(drop=True)
    picked = []
    for i in range(rows):
        base = sample.iloc[i % len(sample)]
        round_ = i // len(sample)
        suffix = SUFFIXES[round_ % len(SUFFIXES)] + (f" {round_ // len(SUFFIXES) + 1}" if round_ >= len(SUFFIXES) else "")
        picked.append({"Customer Id": f"bench-{i:06d}", "Company": base["Company"] + suffix, "Industry": base["Industry"]})
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "companies.csv"
    pd.DataFrame(picked).to_csv(path, index=False)
    return path


#: Photo sizes for the captioning benchmark: "large" 0.3 to 3 megapixels (phone photos), "small"
#: 0.08 to 0.5 (web-scraped caption datasets such as BLIP3o's are mostly this size).
PHOTO_SIZES = {"large": [(640, 480), (1024, 768), (1600, 1200), (2048, 1536)],
               "small": [(320, 240), (480, 360), (640, 480), (800, 600)]}


def image_input(images: int, folder: Path, sizes: str = "large") -> Path:
    """``images`` JPEG photos (scaled copies of the bundled sample's photos, :data:`PHOTO_SIZES`): each
    photo and size is encoded once, and repeated under its own file name."""
    import io
    import tarfile

    from make_sample_images import PHOTOS  # scripts/: the sample's real photos (the rest are broken on purpose)
    from PIL import Image

    from helpers.images import sample_path

    with tarfile.open(sample_path()) as tar:
        photos = [Image.open(io.BytesIO(tar.extractfile(f"{name}.jpg").read())).convert("RGB") for name in PHOTOS]
    out = folder / "images"
    out.mkdir(parents=True, exist_ok=True)
    encoded: dict[tuple[int, tuple[int, int]], bytes] = {}
    for i in range(images):
        key = (i % len(photos), PHOTO_SIZES[sizes][i % len(PHOTO_SIZES[sizes])])
        if key not in encoded:
            buffer = io.BytesIO()
            photos[key[0]].resize(key[1]).save(buffer, format="JPEG", quality=90)
            encoded[key] = buffer.getvalue()
        (out / f"img-{i:05d}.jpg").write_bytes(encoded[key])
    return out


# --- the requests: the notebooks' ``preprocess``, written out -----------------------------------

def text_request(text: str, p: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """What the text notebook's ``preprocess`` sends for a row whose text is ``text``, with the notebook's
    parameters ``p`` and its ``MAX_TOKENS`` (``labels.max_tokens``)."""
    from helpers.labels import TOP_LOGPROBS

    return {"messages": [{"role": "system", "content": f"{p['TASK']} Answer with exactly one of: {', '.join(p['LABELS'])}."},
                         {"role": "user", "content": p["USER_TEMPLATE"].format(text=text)}],
            "sampling_params": {"temperature": p["TEMPERATURE"], "max_tokens": max_tokens,
                                "structured_outputs": {"choice": p["LABELS"]},
                                "logprobs": TOP_LOGPROBS if p["CONFIDENCE"] else None,
                                "detokenize": not p["CONFIDENCE"], "flat_logprobs": p["CONFIDENCE"]}}


def caption_request(image: Any, p: dict[str, Any]) -> dict[str, Any]:
    """What the captioning notebook's ``preprocess`` sends for a prepared image (a Pillow image)."""
    return {"messages": [{"role": "system", "content": CAPTION_SYSTEM},
                         {"role": "user", "content": [{"type": "text", "text": p["PROMPT"]},
                                                      {"type": "image_pil", "image_pil": image}]}],
            "sampling_params": {"temperature": p["TEMPERATURE"], "max_tokens": p["MAX_TOKENS"]}}


def digest(sampling_params: dict[str, Any], prompt_tokens: int) -> str:
    """A row's request as :class:`Agreement` compares it: its sampling settings and the prompt tokens
    the engine counted (the chat template applied, the image's tokens in)."""
    from helpers import run_folder

    described = run_folder.describe({"sampling_params": sampling_params, "prompt_tokens": int(prompt_tokens)})
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


# --- raw vLLM (runs in a child process: vLLM spawns its own workers) ----------------------------

def sampling(params: dict[str, Any]):
    """A request's ``sampling_params`` as vLLM takes them (as Ray Data LLM's engine stage converts them)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    params = dict(params)
    structured = params.pop("structured_outputs", None)
    return SamplingParams(**params, structured_outputs=StructuredOutputsParams(**structured) if structured else None)


def raw_text(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    from vllm import LLM

    from helpers import run_folder

    p = spec["params"]
    frame = pd.read_csv(spec["input"])
    requests = [text_request(str(name), p, spec["max_tokens"]) for name in frame[p["TEXT_COLUMN"]]]
    llm = LLM(model=spec["model"], **spec["engine_kwargs"])
    ready, ready_at = time.perf_counter(), time.time()
    # Every row's sampling settings are the same: one SamplingParams for all, as a plain script has it.
    results = llm.chat([r["messages"] for r in requests], sampling(requests[0]["sampling_params"]), use_tqdm=False)
    done, done_at = time.perf_counter(), time.time()
    ids = frame["Customer Id"].tolist()
    return {"start_s": ready - started, "generate_s": done - ready, "window": [ready_at, done_at],
            "answers": dict(zip(ids, (o.outputs[0].text.strip() for o in results))),
            "digests": {i: digest(r["sampling_params"], len(o.prompt_token_ids)) for i, r, o in zip(ids, requests, results)},
            "example": run_folder.describe(text_request(TEXT_EXAMPLE, p, spec["max_tokens"])), **token_counts(results)}


def raw_caption(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    from PIL import Image
    from vllm import LLM

    from helpers import images, run_folder

    p = spec["params"]
    files = sorted(Path(spec["input"]).iterdir())
    llm = LLM(model=spec["model"], **spec["engine_kwargs"], limit_mm_per_prompt={"image": 1})
    ready, ready_at = time.perf_counter(), time.time()
    # A plain loop prepares the images one by one, then generates.
    requests = [caption_request(images.prepare_image(f.read_bytes(), max_tokens=p["IMAGE_TOKENS"], keep_aspect=p["KEEP_ASPECT"],
                                                     max_pixels=p["MAX_PIXELS"]).image, p) for f in files]
    # "string" content, as Ray's multimodal stage renders it (its default), so both sides send the
    # same prompt tokens; vLLM's automatic choice renders the image part one token longer here.
    results = llm.chat([r["messages"] for r in requests], sampling(requests[0]["sampling_params"]), use_tqdm=False,
                       chat_template_content_format="string")
    done, done_at = time.perf_counter(), time.time()
    example = images.example(p["IMAGE_TOKENS"], p["KEEP_ASPECT"])["image"]
    # The tiny random model's greedy tokens are mostly special tokens that decode to "", so the
    # generated-token count is compared too.
    return {"start_s": ready - started, "generate_s": done - ready, "window": [ready_at, done_at],
            "answers": {f.name: [o.outputs[0].text.strip(), len(o.outputs[0].token_ids)] for f, o in zip(files, results)},
            "digests": {f.name: digest(r["sampling_params"], len(o.prompt_token_ids)) for f, r, o in zip(files, requests, results)},
            "example": run_folder.describe(caption_request(Image.fromarray(example), p)), **token_counts(results)}


def token_counts(results) -> dict[str, int]:
    return {"input_tokens": sum(len(o.prompt_token_ids) for o in results),
            "output_tokens": sum(len(o.outputs[0].token_ids) for o in results)}


def run_raw(kind: str, spec: dict[str, Any], workdir: Path,
            extra_env: dict[str, str] | None = None) -> tuple[Timing, dict[str, Any]]:
    """Run the raw script in a fresh process; return its timings and its result (answers, ...)."""
    tag = "tuned" if extra_env else "default"
    spec_file, result_file = workdir / f"raw-{kind}-{tag}-spec.json", workdir / f"raw-{kind}-{tag}-result.json"
    spec_file.write_text(json.dumps(spec))
    # The kit's engine environment (KV cache, log level, tokenizer threads), then the variant's settings.
    env = {**os.environ, **spec["env"], **(extra_env or {})}
    log = workdir / f"raw-{kind}-{tag}.log"
    started = time.perf_counter()
    with open(log, "w") as sink, GpuSampler() as gpu:  # vLLM's own report (its KV cache) is read from the log
        done = subprocess.run([sys.executable, __file__, "--raw", kind, str(spec_file), str(result_file)], env=env,
                              stdout=sink, stderr=subprocess.STDOUT)
    whole = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"the raw script failed ({done.returncode}); its log ends:\n{log.read_text()[-4000:]}")
    result = json.loads(result_file.read_text())
    result["kv_cache_tokens"] = kv_cache_tokens([log])
    result["gpu"] = gpu.busy(*result["window"])
    return Timing(whole, result["start_s"] + result["generate_s"], result["generate_s"]), result


# --- what the GPU did, and what vLLM reported --------------------------------------------------

KV_CACHE_LINE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")


def kv_cache_tokens(logs: list[Path]) -> list[int]:
    """The KV cache vLLM reported in ``logs`` (one line per engine: "GPU KV cache size: N tokens")."""
    found = []
    for log in logs:
        try:
            found += [int(m.replace(",", "")) for m in KV_CACHE_LINE.findall(log.read_text(errors="replace"))]
        except OSError:
            continue
    return found


def ray_logs() -> list[Path]:
    """The log files of the newest local Ray session (where the kit's engines wrote)."""
    folder = Path(tempfile.gettempdir()) / "ray" / "session_latest" / "logs"
    return sorted(p for p in folder.glob("*") if p.is_file()) if folder.exists() else []


class GpuSampler:
    """``nvidia-smi`` every ``every_s`` seconds in a thread: (time, GPU index, utilisation %, memory
    used MiB), one sample per GPU, so that each GPU is read on its own (never averaged over GPUs)."""

    def __init__(self, every_s: float = 0.5):
        import shutil
        import threading

        self.every_s, self.samples = every_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True) if shutil.which("nvidia-smi") else None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
                now = time.time()
                for line in out.stdout.strip().splitlines():
                    index, busy, memory = (part.strip() for part in line.split(","))
                    self.samples.append((now, int(index), float(busy), float(memory)))
            except (subprocess.SubprocessError, ValueError, IndexError):
                pass
            self._stop.wait(self.every_s)

    def __enter__(self) -> "GpuSampler":
        if self._thread:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def busy(self, start: float, end: float) -> dict[int, tuple[float, float, int]]:
        """Per GPU (by index): its mean utilisation (%), its peak memory (GiB) and its samples between
        ``start`` and ``end``; a GPU without samples there is left out ({} for none)."""
        found: dict[int, list[tuple[float, float]]] = {}
        for t, index, u, m in self.samples:
            if start <= t <= end:
                found.setdefault(index, []).append((u, m))
        return {index: (sum(u for u, _ in seen) / len(seen), max(m for _, m in seen) / 1024, len(seen))
                for index, seen in sorted(found.items())}


def gpu_lines(per_gpu: dict[int, tuple[float, float, int]]) -> list[str]:
    """One line per GPU for :meth:`GpuSampler.busy`'s result: never a mean over GPUs, which would hide
    a GPU that idles (a one-GPU run on a two-GPU machine read "43% busy" averaged, its GPU 78-92%)."""
    return [f"GPU{index}: {busy:.0f}% busy (mean of {samples} nvidia-smi samples), memory used up to {memory:.1f} GiB"
            for index, (busy, memory, samples) in per_gpu.items()]


def result_window(folder: Path) -> tuple[float, float]:
    """From the first to the last result file the kit wrote in ``folder`` (its ``OUTPUT_DIR``: Ray writes
    them under ``parts/``): its steady state's span."""
    times = [p.stat().st_mtime for p in (folder / "parts").rglob("*.parquet")]
    return (min(times), max(times)) if times else (float("nan"), float("nan"))


def cell_seconds(executed: Path, top: int = 8) -> list[tuple[float, str]]:
    """The notebook's slowest cells: (seconds, first line), from papermill's record of each cell."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    timed = []
    for cell in nb.cells:
        seconds = (cell.metadata.get("papermill") or {}).get("duration")
        if cell.cell_type == "code" and seconds is not None:
            timed.append((float(seconds), cell.source.strip().splitlines()[0][:70] if cell.source.strip() else ""))
    return sorted(timed, reverse=True)[:top] + [(sum(t for t, _ in timed), "all cells")]


def batches_per_engine() -> dict[str, int]:
    """Batches each engine process ran in the latest Ray session: Ray Data LLM's "Elapsed time for
    batch" lines in each worker's log."""
    batches = {}
    for log in ray_logs():
        if log.name.startswith("worker-") and log.suffix in (".out", ".err"):
            found = len(re.findall(r"Elapsed time for batch", log.read_text(errors="replace")))
            if found:
                batches[log.name] = found
    return batches


def start_marks(executed: Path, folder: Path, pipeline_marker: str = PIPELINE_CELL) -> dict[str, float]:
    """Where a run's start goes, in seconds from the start of the notebook's first code cell (papermill's
    record): its cells before the pipeline cell together, and the first result file written."""
    from datetime import datetime

    import nbformat

    cells = [c for c in nbformat.read(executed, as_version=4).cells
             if c.cell_type == "code" and (c.metadata.get("papermill") or {}).get("start_time")]
    if not cells:
        return {}
    begun = datetime.fromisoformat(cells[0].metadata["papermill"]["start_time"].replace("Z", "+00:00")).timestamp()
    before = 0.0
    for cell in cells:
        if pipeline_marker in cell.source:
            break
        before += float(cell.metadata["papermill"].get("duration") or 0)
    first, _ = result_window(folder)
    return {"cells_before_pipeline_s": round(before, 1), "first_result_s": round(first - begun, 1)}


# --- the kit: its notebook through papermill ----------------------------------------------------

def kit_timing(notebook: str, params: dict[str, Any], workdir: Path) -> tuple[Timing, Path, dict[str, Any]]:
    """Run the notebook; its timings: wall time, the pipeline cell's and the steady state's (rows
    written / rows per second in steady state, from ``summary.json``; NaN where not measured); and
    what else was seen: GPU use over the results' span, vLLM's KV cache per engine, the slowest cells."""
    known = run_notebooks.defaults(notebook)
    started = time.perf_counter()
    with GpuSampler() as gpu:
        folder = run_notebooks.run(notebook, workdir / "kit", {k: v for k, v in params.items() if k in known})
    whole = time.perf_counter() - started
    seen = {"gpu": gpu.busy(*result_window(folder)), "kv_cache_tokens": kv_cache_tokens(ray_logs()),
            "cells": cell_seconds(folder / f"{notebook}.ipynb"),
            "marks": start_marks(folder / f"{notebook}.ipynb", folder)}
    summary = json.loads((folder / "summary.json").read_text())
    rate = summary["rows/s steady state"]  # null when the run could not measure it ("steady state" says why)
    if rate is None:
        print(f"kit steady state {summary['steady state']}", flush=True)
    steady = float("nan") if rate is None else summary["rows written in this run"] / rate
    return Timing(whole, float(summary["pipeline seconds"]), steady), folder, seen


def kit_results(folder: Path, table: str, key: str, answer: Any) -> dict[str, Any]:
    """The kit's results as :func:`agreement` compares them: ``answer(row)`` by ``key`` (a column of
    ``table``), each row's :func:`digest`, and the request the run recorded for its example row
    (``run.json``; the notebooks' sampling settings are the same for every row)."""
    answered = pd.read_parquet(folder / table)
    example = json.loads((folder / "run.json").read_text())["settings"]["request"]
    rows = answered.to_dict("records")
    return {"answers": {r[key]: answer(r) for r in rows},
            "digests": {r[key]: digest(example["sampling_params"], r["num_input_tokens"]) for r in rows},
            "example": example, "input_tokens": int(answered["num_input_tokens"].sum()),
            "output_tokens": int(answered["num_generated_tokens"].sum())}


@dataclass(frozen=True)
class Measured:
    raw: Timing
    tuned: Timing | None  # raw with the kit's CPU settings (None on a GPU)
    kit: Timing
    raw_results: dict[str, dict[str, Any]]  # "default" / "tuned" -> the raw script's result
    kit_folder: Path
    kit_seen: dict[str, Any]  # GPU use, vLLM's KV cache, the slowest cells (:func:`kit_timing`)


def measure(kind: str, notebook: str, spec: dict[str, Any], kit_params: dict[str, Any], workdir: Path,
            side: str = "both") -> Measured | None:
    """Raw vLLM with its defaults, raw with the kit's CPU settings (``spec["cpu_env"]``, where there are
    any), then the kit's notebook.

    ``side="raw"`` runs the raw side(s) only and keeps them in ``workdir``; ``side="kit"`` runs the
    kit and takes the raw side from there, made by an earlier ``side="raw"`` call with the same
    inputs: for runs too long for one command (a machine that allows 10 minutes a command)."""
    saved = workdir / f"raw-{kind}-measured.json"
    if side == "kit":
        if not saved.exists():
            raise SystemExit(f"--side kit needs the raw side first: no {saved} (run --side raw with this --workdir)")
        kept = json.loads(saved.read_text())
        if kept["spec"] != spec:
            raise SystemExit(f"{saved} was measured with other inputs or settings: run --side raw again")
        raw = Timing(**kept["raw"])
        tuned = Timing(**kept["tuned"]) if kept["tuned"] else None
        results = kept["results"]
    else:
        raw, default_result = run_raw(kind, spec, workdir)
        results = {"default": default_result}
        tuned = None
        if spec.get("cpu_env"):
            tuned, results["tuned"] = run_raw(kind, spec, workdir, spec["cpu_env"])
        saved.write_text(json.dumps({"spec": spec, "raw": dataclasses.asdict(raw),
                                     "tuned": dataclasses.asdict(tuned) if tuned else None, "results": results}))
        if side == "raw":
            print(f"raw side of {kind} kept in {saved}: whole {raw.whole_s:.1f}s, pipeline {raw.pipeline_s:.1f}s, "
                  f"steady state {raw.generate_s:.1f}s; run --side kit with the same arguments next", flush=True)
            return None
    kit, folder, seen = kit_timing(notebook, kit_params, workdir)
    return Measured(raw, tuned, kit, results, folder, seen)


#: The share of rows whose answers must agree between raw vLLM and the kit (see :func:`agreement`).
AGREEMENT_THRESHOLD = 0.8
WHY_ANSWERS_DIFFER = (
    "Both sides sent identical requests (same prompt tokens, same sampling settings), so a different "
    "answer is not the kit's doing: greedy decoding on a CPU is not batch-invariant. How prompts are "
    "grouped into batches changes the floating-point rounding, and where a small model's top two labels "
    "score almost the same, the pick flips. Seen on a 2-core Intel machine: 61-66 of 2,000 (3-3.3%); on "
    "AMD machines: none.")


@dataclass(frozen=True)
class Agreement:
    """How the kit's results line up with raw vLLM's, row by row.

    Exact: the rows answered (ids), the requests sent (:func:`digest`: the sampling settings and the
    prompt tokens the engine counted) and the whole request for the notebook's example row (the kit's as
    its ``run.json`` records it, raw's as it builds it). Compared as a rate: the answers. Requests that
    differ mean the kit sent something else than raw vLLM did: a pipeline bug. Answers that differ for
    identical requests come from batch-dependent numerics (see ``WHY_ANSWERS_DIFFER``); they fail the
    check only when more than ``1 - AGREEMENT_THRESHOLD`` of the rows differ. The threshold is far above
    what batching does (at most 3.3% seen; at 40 rows, 20% would take 8 flips where 1.3 are expected,
    p < 1e-4) and far below what a broken pipeline gives (answers matched to the wrong rows agree about
    as often as two random rows' labels do, well under 80% for any model that uses more than one label).
    """

    expected: int  # rows sent
    compared: int  # rows both sides answered
    missing_raw: list[str]
    missing_kit: list[str]
    other_requests: list[str]
    differing: list[tuple[str, Any, Any]]
    other_example: tuple[Any, Any] | None = None  # (raw's, the kit's) request for the example row, where they differ

    @property
    def rate(self) -> float:
        return 1 - len(self.differing) / self.compared if self.compared else 0.0

    @property
    def ok(self) -> bool:
        return (not self.missing_raw and not self.missing_kit and not self.other_requests and self.other_example is None
                and self.rate >= AGREEMENT_THRESHOLD)

    def lines(self) -> list[str]:
        out = [f"rows answered: raw {self.expected - len(self.missing_raw)}, kit {self.expected - len(self.missing_kit)} "
               f"of {self.expected}" + (f"; missing from raw {self.missing_raw[:3]}, from the kit {self.missing_kit[:3]}"
                                        if self.missing_raw or self.missing_kit else "; the same ids")]
        out.append("the example row's request: " + ("identical" if self.other_example is None else
                                                    f"DIFFERENT: raw {str(self.other_example[0])[:600]}; "
                                                    f"the kit's run.json {str(self.other_example[1])[:600]}"))
        out.append(f"requests identical (prompt tokens + sampling settings): {self.compared - len(self.other_requests)} "
                   f"of {self.compared}" + (f"; FIRST DIFFERENT: {self.other_requests[:3]}" if self.other_requests else ""))
        out.append(f"answers agree: {self.compared - len(self.differing)} of {self.compared} ({self.rate:.1%}; "
                   f"the check needs >= {AGREEMENT_THRESHOLD:.0%})"
                   + (f"; first differences (id, raw, kit): {self.differing[:3]}" if self.differing else ""))
        if self.differing and not self.other_requests:
            out.append(WHY_ANSWERS_DIFFER)
        return out


def agreement(raw: dict[str, Any], kit: dict[str, Any], ids: list[str]) -> Agreement:
    """Compare a raw result (``answers`` and ``digests``, by row id; ``example``, the example row's
    request) with the kit's, over the rows ``ids`` that both were given. Rows either side answered that
    were not asked count as missing on the other."""
    asked = set(ids)
    common = sorted(asked & set(raw["answers"]) & set(kit["answers"]))
    return Agreement(
        expected=len(asked),
        compared=len(common),
        missing_raw=sorted((asked | set(kit["answers"])) - set(raw["answers"])),
        missing_kit=sorted((asked | set(raw["answers"])) - set(kit["answers"])),
        other_requests=[k for k in common if raw["digests"][k] != kit["digests"][k]],
        differing=[(k, raw["answers"][k], kit["answers"][k]) for k in common if raw["answers"][k] != kit["answers"][k]],
        other_example=None if raw.get("example") == kit.get("example") else (raw.get("example"), kit.get("example")),
    )


def ratio_table(raw: Timing, tuned: Timing | None, kit: Timing) -> str:
    """Seconds per side and raw/kit (above 1: the kit is faster); the raw+CPU columns only on a CPU."""
    lines = [f"{'':28}{'raw vLLM':>10}" + (f"{'raw+CPU':>10}" if tuned else "") + f"{'kit':>10}{'raw/kit':>10}"
             + (f"{'raw+CPU/kit':>13}" if tuned else "")]

    def cell(value: float, unit: str, width: int, digits: int) -> str:  # n/a: not measured (NaN)
        return f"{'n/a':>{width + 1}}" if math.isnan(value) else f"{value:>{width}.{digits}f}{unit}"

    for label, field in (("whole run", "whole_s"), ("pipeline, engine start in", "pipeline_s"),
                         ("steady state", "generate_s")):
        a, k = getattr(raw, field), getattr(kit, field)
        b = getattr(tuned, field) if tuned else None
        lines.append(f"{label:28}{cell(a, 's', 9, 1)}" + (cell(b, "s", 9, 1) if tuned else "")
                     + f"{cell(k, 's', 9, 1)}{cell(a / k, 'x', 9, 2)}" + (cell(b / k, "x", 12, 2) if tuned else ""))
    return "\n".join(lines)


# --- both sides' settings: the notebook's configuration ------------------------------------------

def on_gpu() -> bool:
    """True where a CUDA GPU is visible (the kit's own reading, from the driver)."""
    from helpers import cluster

    return cluster.local_gpus()[0] > 0


def run_settings(task: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """What the benchmark passes to the notebook: greedy answers (so outputs can be compared), no
    resume, the CPU preset (on a GPU: "auto" with the offline model's folder), then the user's ``-p``
    overrides; ``ENGINE`` loads a :mod:`random_weights` folder with ``load_format="dummy"``. Both
    sides run with the notebook's defaults updated with these."""
    from helpers import models, presets

    if on_gpu():
        model = models.prepare_smollm2() if task == "text" else models.tiny_vlm()
        settings = {"TEMPERATURE": 0.0, "RESUME": False, "PRESET": "auto", "MODEL_SOURCE": str(model), **overrides}
    else:
        settings = {"TEMPERATURE": 0.0, "RESUME": False, "PRESET": presets.CPU_PRESET[task], **overrides}
    return {**settings, "ENGINE": random_weights.engine(settings.get("MODEL_SOURCE"), settings.get("ENGINE") or {})}


@dataclass(frozen=True)
class Setup:
    """One task's run as both sides make it."""

    params: dict[str, Any]  # the notebook's parameters for this run (its defaults, then the benchmark's)
    plan: Any  # the kit's configuration, as its notebook fits it (a ``helpers.presets.Preset``)
    single: Any  # raw vLLM's: on a GPU the same with one engine per GPU (replicas_per_gpu 1); on a CPU the kit's
    spec: dict[str, Any]  # what the raw script gets
    name: str  # the model, in words


def fitted(task: str, params: dict[str, Any], source: Any, requests: Any, engine: dict[str, Any]):
    """The configuration the notebook makes: ``plans.fit``, then ``plans.fit_context`` on the requests
    ``requests(plan)`` gives (the notebook's ``preprocess`` on its first rows)."""
    from helpers import plans

    plan = plans.fit(task, params["PRESET"], params["MODEL_SOURCE"], engine, source=source, limit=params["LIMIT"])
    return plans.fit_context(plan, requests(plan))


def engine_envs(plan: Any) -> dict[str, dict[str, str]]:
    """The raw script's environment: the kit's engine variables without its CPU core binding (``env``),
    and that binding apart (``cpu_env``: raw's second run; empty on a GPU)."""
    from helpers import cluster

    env = cluster.engine_env(plan, joined=False)
    bind = {k: env.pop(k) for k in ["VLLM_CPU_OMP_THREADS_BIND"] if k in env}
    return {"env": env, "cpu_env": bind}


def model_name(task: str, folder: str) -> str:
    """The model a folder holds, for the report."""
    from helpers import models

    if made := random_weights.note(folder):
        return f"{made['model']} shape, random weights"
    offline = models.prepare_smollm2() if task == "text" else models.tiny_vlm()
    return ("SmolLM2-135M" if task == "text" else "tiny random Qwen2-VL") if folder == str(offline.resolve()) else Path(folder).name


def text_setup(csv: Path, settings: dict[str, Any]) -> Setup:
    """Both sides' settings for the text notebook on ``csv``."""
    from helpers import labels, text_data

    params = {**run_notebooks.defaults("text_classification"), **settings, "INPUT_PATH": str(csv)}
    source = text_data.csv_input(params["INPUT_PATH"], params["TEXT_COLUMN"], params["ID_COLUMN"], params["LABEL_COLUMN"])
    first = pd.read_csv(csv, nrows=SAMPLE_ROWS)[params["TEXT_COLUMN"]].astype(str).tolist()

    def requests(plan):
        max_tokens = labels.max_tokens(plan, params["LABELS"])  # the prompt cell's MAX_TOKENS
        return [text_request(text, params, max_tokens) for text in first]

    plan = fitted("text", params, source, requests, params["ENGINE"])
    single = fitted("text", params, source, requests, {**params["ENGINE"], "replicas_per_gpu": 1}) if plan.accelerator_type else plan
    spec = {"params": {k: params[k] for k in ("TEXT_COLUMN", "LABELS", "TASK", "USER_TEMPLATE", "TEMPERATURE", "CONFIDENCE")},
            "input": str(csv), "model": single.model_path, "max_tokens": labels.max_tokens(single, params["LABELS"]),
            "engine_kwargs": single.engine_args, **engine_envs(single)}
    return Setup(params, plan, single, spec, model_name("text", plan.model_path))


def caption_setup(folder: Path, settings: dict[str, Any]) -> Setup:
    """Both sides' settings for the captioning notebook on the images in ``folder``."""
    from PIL import Image

    from helpers import images

    params = {**run_notebooks.defaults("vlm_captioning"), **settings, "INPUT_PATH": str(folder), "INPUT_FORMAT": "images"}
    source = images.image_input(params["INPUT_PATH"], params["INPUT_FORMAT"], params["IMAGE_COLUMN"], params["ID_COLUMN"])
    example = images.example(params["IMAGE_TOKENS"], params["KEEP_ASPECT"])["image"]
    request = caption_request(Image.fromarray(example), params)  # the notebook fits its context on this one

    plan = fitted("vision", params, source, lambda plan: [request], params["ENGINE"])
    single = (fitted("vision", params, source, lambda plan: [request], {**params["ENGINE"], "replicas_per_gpu": 1})
              if plan.accelerator_type else plan)
    spec = {"params": {k: params[k] for k in ("PROMPT", "MAX_TOKENS", "TEMPERATURE", "IMAGE_TOKENS", "KEEP_ASPECT", "MAX_PIXELS")},
            "input": str(folder), "model": single.model_path, "engine_kwargs": single.engine_args, **engine_envs(single)}
    return Setup(params, plan, single, spec, model_name("vision", plan.model_path))


def bench_text(rows: int, workdir: Path, overrides: dict[str, Any], side: str = "both") -> bool:
    settings = run_settings("text", overrides)
    csv = text_input(rows, workdir)
    setup = text_setup(csv, settings)
    run = measure("text", "text_classification", setup.spec, {**settings, "INPUT_PATH": str(csv)}, workdir, side)
    if run is None:
        return True
    kit = kit_results(run.kit_folder, "predictions.parquet", "Customer Id", lambda r: r["predicted_label"])
    ids = pd.read_csv(csv)["Customer Id"].tolist()
    return report(f"text classification, {rows} prompts ({setup.name}, structured choice)", run, kit, ids, setup)


def bench_caption(count: int, workdir: Path, overrides: dict[str, Any], side: str = "both",
                  sizes: str = "large") -> bool:
    settings = run_settings("vision", overrides)
    folder_in = image_input(count, workdir, sizes)
    setup = caption_setup(folder_in, settings)
    run = measure("caption", "vlm_captioning", setup.spec,
                  {**settings, "INPUT_PATH": str(folder_in), "INPUT_FORMAT": "images"}, workdir, side)
    if run is None:
        return True
    kit = kit_results(run.kit_folder, "captions.parquet", "source", lambda r: [r["caption"], r["num_generated_tokens"]])
    ids = sorted(f.name for f in folder_in.iterdir())
    return report(f"image captioning, {count} images ({setup.name}, {setup.params['IMAGE_TOKENS']} image tokens)",
                  run, kit, ids, setup)


def report(title: str, run: Measured, kit: dict[str, Any], ids: list[str], setup: Setup | None = None) -> bool:
    """Print the timings, the settings each side ran with, what the GPU did, tokens per second,
    vLLM's KV cache beside the kit's estimate, the notebook's slowest cells, and, for each raw
    run, how its results line up with the kit's; True when every :class:`Agreement` check passes."""
    print(f"\n== {title}")
    print(ratio_table(run.raw, run.tuned, run.kit))
    raw = run.raw_results["default"]
    if setup is not None:
        from helpers import plans

        print("kit settings (the notebook's table):\n" + setup.plan.table().to_string())
        print(f"raw settings: one vllm.LLM engine in this process, engine arguments {setup.single.engine_args}")
    for side, timing, tokens in (("raw", run.raw.generate_s, raw), ("kit", run.kit.generate_s, kit)):
        if "output_tokens" in tokens and timing and not math.isnan(timing):
            print(f"{side} tokens/s in steady state: {tokens['output_tokens'] / timing:,.0f} generated, "
                  f"{(tokens['input_tokens'] + tokens['output_tokens']) / timing:,.0f} in all")
    for side, seen in (("raw", raw), ("kit", run.kit_seen)):
        for line in gpu_lines(seen.get("gpu") or {}):
            print(f"{side} in steady state, {line}")
    print(kv_report(raw.get("kv_cache_tokens") or [], run.kit_seen.get("kv_cache_tokens") or [],
                    setup and setup.plan, setup and setup.single))
    print("kit notebook, slowest cells (s): " + "; ".join(f"{t:.1f} {line}" for t, line in run.kit_seen.get("cells", [])))
    ok = True
    for tag, result in run.raw_results.items():
        checked = agreement(result, kit, ids)
        ok &= checked.ok
        print(f"raw ({tag} settings) vs kit:" + "".join(f"\n  {line}" for line in checked.lines()))
    return ok


def kv_report(raw_tokens: list[int], kit_tokens: list[int], plan: Any, raw_plan: Any) -> str:
    """vLLM's KV cache per engine beside the kit's estimate of it (:func:`kv_line`), for both sides."""
    return f"KV cache: {kv_line('raw', raw_tokens, raw_plan)}; {kv_line('kit', kit_tokens, plan)}"


def kv_line(side: str, reported: list[int], plan: Any) -> str:
    """The KV cache vLLM reported per engine (tokens, from its logs) beside the kit's estimate for
    ``plan`` (its ``kv_bytes``: the engine's memory budget less the weights), where it makes one."""
    from helpers.presets import GIB

    line = (f"{side}: vLLM reports {', '.join(f'{t:,}' for t in reported)} tokens per engine" if reported
            else f"{side}: no KV-cache size in vLLM's log")
    if plan is not None and plan.kv_bytes is not None:
        tokens = plan.kv_bytes * plan.world / plan.shape.kv_bytes_per_token
        line += f"; the kit estimates {tokens:,.0f} ({plan.kv_bytes / GIB:.1f} GiB per GPU)"
        if side == "kit" and plan.kv_cache_budget is not None:
            line += f" and states {plan.kv_cache_budget / GIB:.2f} GiB to each engine (kv_cache_memory_bytes)"
        if reported:
            line += f", {min(reported) / tokens:.2f}x to {max(reported) / tokens:.2f}x of it reported"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["text", "caption", "all"], default="all")
    parser.add_argument("--rows", type=int, default=2000, help="prompts for the text benchmark (default 2000)")
    parser.add_argument("--images", type=int, default=200, help="images for the captioning benchmark (default 200)")
    parser.add_argument("--workdir", default=None, help="keep inputs and results here (default: a temp folder)")
    parser.add_argument("--side", choices=["both", "raw", "kit"], default="both",
                        help="raw: measure raw vLLM only and keep it in --workdir; kit: the kit, against that kept "
                             "raw side (two commands back to back, for machines that limit a command's time)")
    parser.add_argument("--photos", choices=sorted(PHOTO_SIZES), default="large",
                        help="photo sizes for captioning: large 0.3-3 MP (default), small 0.08-0.5 MP")
    parser.add_argument("--warmup", type=int, default=0, metavar="N",
                        help="first run both sides on N rows (or images), unreported, so that neither side pays "
                             "a cold machine's start-up (file cache, vLLM's compile cache) alone")
    parser.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a notebook parameter for the kit's runs (a Python literal, else a string); engine "
                             "settings are keys of ENGINE, e.g. -p ENGINE \"{'batch_size': 128}\"")
    args = parser.parse_args(argv)
    if args.side != "both" and not args.workdir:
        parser.error("--side raw/kit needs --workdir (where the raw side is kept)")
    from bench_image_prep import machine

    overrides = {name: run_notebooks.parse_value(value) for name, value in args.p}
    known = {name for notebook in run_notebooks.NOTEBOOKS for name in run_notebooks.defaults(notebook)}
    if unknown := sorted(set(overrides) - known):
        parser.error(f"no notebook has the parameter(s) {unknown}")

    print(f"machine: {machine()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        workdir = Path(args.workdir or tmp)
        ok = True
        if args.warmup:
            print(f"-- warm-up: both sides on {args.warmup} rows/images; not the measurement", flush=True)
            if args.task in ("text", "all"):
                bench_text(args.warmup, workdir / "warmup" / "text", overrides)
            if args.task in ("caption", "all"):
                bench_caption(args.warmup, workdir / "warmup" / "caption", overrides, sizes=args.photos)
            print("-- warm-up done", flush=True)
        if args.task in ("text", "all"):
            ok &= bench_text(args.rows, workdir / "text", overrides, args.side)
        if args.task in ("caption", "all"):
            ok &= bench_caption(args.images, workdir / "caption", overrides, args.side, args.photos)
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--raw":
        _, _, kind, spec_path, result_path = sys.argv
        result = (raw_text if kind == "text" else raw_caption)(json.loads(Path(spec_path).read_text()))
        Path(result_path).write_text(json.dumps(result))
        sys.exit(0)
    sys.exit(main())
