"""Benchmarks stay runnable: a tiny run of each, with no timing assertions."""

import os
import re

import pytest

from conftest import load_script


def test_image_prep_benchmark_runs_and_prints_ratios(capsys):
    bench = load_script("bench_image_prep", folder="benchmarks")
    assert bench.main(["--images", "5", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "machine:" in out and "kit/tutorial" in out
    assert any(line.startswith("all ") and line.rstrip().endswith("x") for line in out.splitlines())


def test_benchmark_corpus_spans_sizes_and_formats():
    bench = load_script("bench_image_prep", folder="benchmarks")
    items = bench.corpus(25)
    megapixels = sorted(w * h / 1e6 for _, (w, h), _ in items)
    assert megapixels[0] < 0.5 and megapixels[-1] >= 12
    assert {f for f, _, _ in items} == {"JPEG", "PNG", "WEBP"}
    assert bench.tutorial_approach(items[0][2]).size == (225, 225)


def _results(answers: dict[str, str], digests: dict[str, str] | None = None) -> dict:
    return {"answers": answers, "digests": digests or {k: "d-" + k for k in answers}}


def test_agreement_passes_a_few_flipped_answers_for_identical_requests():
    bench = load_script("bench_pipeline", folder="benchmarks")
    ids = [f"r{i}" for i in range(40)]
    raw = _results({i: "Retail" for i in ids})
    flipped = _results({**raw["answers"], "r3": "Other", "r7": "Finance"})
    checked = bench.agreement(raw, flipped, ids)
    assert checked.ok and checked.compared == 40 and checked.rate == 38 / 40
    assert any("not batch-invariant" in line for line in checked.lines())


def test_agreement_fails_on_other_requests_missing_rows_or_too_many_flips():
    bench = load_script("bench_pipeline", folder="benchmarks")
    ids = [f"r{i}" for i in range(40)]
    raw = _results({i: "Retail" for i in ids})
    # One row sent with another prompt or setting: a pipeline bug, even with the same answer.
    other = _results(raw["answers"], {**raw["digests"], "r5": "changed"})
    assert not bench.agreement(raw, other, ids).ok
    assert "FIRST DIFFERENT: ['r5']" in "\n".join(bench.agreement(raw, other, ids).lines())
    # A row the kit never answered, or one nobody asked for.
    assert not bench.agreement(raw, _results({k: v for k, v in raw["answers"].items() if k != "r9"}), ids).ok
    assert not bench.agreement(raw, _results({**raw["answers"], "extra": "Retail"}), ids).ok
    # Identical requests, but 9 of 40 answers differ: below the threshold.
    many = _results({**raw["answers"], **{f"r{i}": "Other" for i in range(9)}})
    assert bench.agreement(raw, many, ids).rate < bench.AGREEMENT_THRESHOLD
    assert not bench.agreement(raw, many, ids).ok


def test_pipeline_benchmark_pieces():
    bench = load_script("bench_pipeline", folder="benchmarks")
    table = bench.ratio_table(bench.Timing(100, 80, 60), bench.Timing(90, 70, 40), bench.Timing(50, 40, 30))
    assert "2.00x" in table and "1.75x" in table  # whole run 100/50; tuned pipeline 70/40
    gpu = bench.ratio_table(bench.Timing(100, 80, 60), None, bench.Timing(50, 40, 30))
    assert "raw+CPU" not in gpu and "2.00x" in gpu and gpu.splitlines()[-1].startswith("steady state")


def test_pipeline_benchmark_reads_what_vllm_and_the_gpu_reported(tmp_path):
    import nbformat

    bench = load_script("bench_pipeline", folder="benchmarks")
    (tmp_path / "a.log").write_text("INFO [kv_cache_utils.py:1087] GPU KV cache size: 455,264 tokens\nother\n")
    (tmp_path / "b.log").write_text("(EngineCore pid=7) INFO GPU KV cache size: 140,112 tokens\n")
    assert bench.kv_cache_tokens([tmp_path / "a.log", tmp_path / "b.log", tmp_path / "missing.log"]) == [455264, 140112]
    sampler = bench.GpuSampler()
    sampler.samples = [(1.0, 0, 10.0, 1024.0), (2.0, 0, 80.0, 40960.0), (3.0, 0, 90.0, 41984.0), (9.0, 0, 0.0, 0.0),
                       (2.0, 1, 0.0, 512.0), (3.0, 1, 0.0, 512.0)]  # GPU 1 idles beside GPU 0
    # Per GPU: mean %, peak GiB, samples inside the window; never a mean over the GPUs (that would say 42.5%).
    assert sampler.busy(1.5, 3.5) == {0: (85.0, 41.0, 2), 1: (0.0, 0.5, 2)}
    assert sampler.busy(4, 5) == {}
    assert bench.gpu_lines(sampler.busy(1.5, 3.5)) == [
        "GPU0: 85% busy (mean of 2 nvidia-smi samples), memory used up to 41.0 GiB",
        "GPU1: 0% busy (mean of 2 nvidia-smi samples), memory used up to 0.5 GiB"]
    parts = tmp_path / "kit" / "parts" / "results"
    parts.mkdir(parents=True)
    for i, when in enumerate([100.0, 130.0, 110.0]):
        (parts / f"{i}.parquet").write_bytes(b"")
        os.utime(parts / f"{i}.parquet", (when, when))
    assert bench.result_window(tmp_path / "kit") == (100.0, 130.0)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import ray\nx = 1"),
                                         nbformat.v4.new_code_cell("result = pipeline.run(...)")])
    nb.cells[0].metadata["papermill"] = {"duration": 4.5}
    nb.cells[1].metadata["papermill"] = {"duration": 60.0}
    nbformat.write(nb, tmp_path / "run.ipynb")
    assert bench.cell_seconds(tmp_path / "run.ipynb") == [(60.0, "result = pipeline.run(...)"), (4.5, "import ray"),
                                                          (64.5, "all cells")]
    assert "raw: vLLM reports 455,264 tokens per engine; kit: no KV-cache size in vLLM's log" in bench.kv_report(
        [455264], [], None, None, None)


def _smi_lines(gpus: int, seconds: int, busy: dict[int, float], indexed: bool = True) -> str:
    """nvidia-smi's CSV as on_gpu.sh samples it, once a second per GPU (``busy``: % per GPU index)."""
    lines = []
    for t in range(seconds):
        stamp = f"2026/11/27 10:00:{t:02d}.000"
        for index in range(gpus):
            fields = [stamp, f"{busy.get(index, 0):.0f}", f"{1024 * (10 + index)}"]
            lines.append(", ".join(([str(index)] if indexed else []) + fields))
    return "\n".join(lines) + "\n"


def test_gpu_timeline_reads_each_gpu_on_its_own_never_averaged(tmp_path, capsys):
    timeline = load_script("gpu_timeline", folder="benchmarks")
    smi = tmp_path / "four.smi.csv"
    smi.write_text(_smi_lines(4, 30, {0: 90, 1: 60}))  # a run on GPUs 0 and 1 of a 4-GPU machine
    rows = timeline.samples(smi)
    assert len(rows) == 120 and timeline.gpus(rows) == [0, 1, 2, 3]
    windows = timeline.per_window(rows)
    assert len(windows) == 3
    for line in windows:  # one column per GPU, each its own number
        assert line.count("GPU") == 4
        assert "GPU0   90%" in line and "GPU1   60%" in line and "GPU2    0%" in line and "GPU3    0%" in line
        assert "38%" not in line  # (90 + 60 + 0 + 0) / 4: the average that hid an idle GPU
    # The span of this step's result files (made-up ones, 10 s to 20 s after the first sample): per GPU.
    results = tmp_path / "kit" / "parts" / "results"
    results.mkdir(parents=True)
    start = rows[0][0]
    for i, when in enumerate([start + 10, start + 20]):
        (results / f"{i}.parquet").write_bytes(b"")
        os.utime(results / f"{i}.parquet", (when, when))
    stale = results / "earlier.parquet"  # an earlier run's file in the same folder: not this step's
    stale.write_bytes(b"")
    os.utime(stale, (start - 3600, start - 3600))
    assert timeline.result_span([tmp_path / "kit"], since=start - 5) == (start + 10, start + 20)
    timeline.main([str(smi), "--results", str(tmp_path / "kit")])
    out = capsys.readouterr().out
    assert "4 GPU(s) [0, 1, 2, 3]" in out and "never averaged" in out
    assert "GPU0: 90% busy, up to 10.0 GiB" in out and "GPU1: 60% busy" in out and "GPU3: 0% busy, up to 13.0 GiB" in out
    assert "38%" not in out and "2 result files, first at 10s, last at 20s" in out
    # Results that all came between two samples: no busy share is made up for them.
    burst = tmp_path / "burst" / "parts" / "results"
    burst.mkdir(parents=True)
    for i, when in enumerate([start + 10.2, start + 10.5]):
        (burst / f"{i}.parquet").write_bytes(b"")
        os.utime(burst / f"{i}.parquet", (when, when))
    timeline.main([str(smi), "--results", str(tmp_path / "burst")])
    assert "too short to say how busy each GPU was" in capsys.readouterr().out


def test_gpu_timeline_still_reads_one_gpu_logs_without_an_index(tmp_path):
    timeline = load_script("gpu_timeline", folder="benchmarks")
    smi = tmp_path / "old.smi.csv"
    smi.write_text(_smi_lines(1, 20, {0: 75}, indexed=False))  # timestamp, utilization.gpu, memory.used
    rows = timeline.samples(smi)
    assert len(rows) == 20 and timeline.gpus(rows) == [0]
    assert timeline.per_window(rows)[0] == "     0s  GPU0   75%  10.0 GiB"


def test_pipeline_benchmark_inputs_are_distinct_and_well_formed(tmp_path):
    import pandas as pd

    bench = load_script("bench_pipeline", folder="benchmarks")
    frame = pd.read_csv(bench.text_input(700, tmp_path))
    assert len(frame) == 700 and frame["Company"].is_unique and frame["Customer Id"].is_unique
    assert frame["Company"].str.len().max() <= 120
    images = sorted(bench.image_input(5, tmp_path).iterdir())
    assert len(images) == 5 and all(p.suffix == ".jpg" for p in images)


def test_pipeline_benchmark_refuses_a_parameter_no_notebook_has(capsys):
    bench = load_script("bench_pipeline", folder="benchmarks")
    with pytest.raises(SystemExit):
        bench.main(["--task", "text", "-p", "BATCH_SIZ", "8"])
    assert "no notebook has the parameter(s) ['BATCH_SIZ']" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.extended  # raw vLLM and the kit, end to end: outside CI's hour, in make test-extended
def test_pipeline_benchmark_runs_end_to_end_at_a_tiny_size(capsys, tmp_path):
    bench = load_script("bench_pipeline", folder="benchmarks")
    status = bench.main(["--rows", "40", "--images", "3", "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "== text classification, 40 prompts" in out and "== image captioning, 3 images" in out
    steady_rows = re.findall(r"^steady state.*$", out, re.M)  # one table row per task
    assert len(steady_rows) == 2
    # A run this small may write too few result files to measure a steady state: then the row says
    # n/a and the kit's reason is printed, never a number.
    assert sum("n/a" in row for row in steady_rows) == out.count("kit steady state not measured: ")
    # Exact on both tasks and both raw runs: the same rows answered, the same requests sent.
    assert out.count("; the same ids") == 4, out
    assert out.count("requests identical (prompt tokens + sampling settings): 40 of 40") == 2, out
    assert out.count("requests identical (prompt tokens + sampling settings): 3 of 3") == 2, out
    # Answers: a rate with a threshold (batch-dependent numerics may flip a few; see bench.Agreement).
    assert status == 0, out


def test_startup_benchmark_runs_the_baseline_with_ray_waiting_for_each_pool(tmp_path, monkeypatch, capsys):
    import json
    import subprocess

    bench = load_script("bench_startup", folder="benchmarks")
    seen = []

    def fake_run(cmd, env, check, stdout):  # the notebook run: record its setting, write its summary
        out = tmp_path / cmd[cmd.index("--out") + 1] / "vlm_captioning"
        out.mkdir(parents=True)
        waits = env.get("RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S")
        seen.append(waits)
        (out / "summary.json").write_text(json.dumps({"images read": 24, "all images accounted for": True,
                                                       "pipeline seconds": 150.0 if waits else 100.0}))

    monkeypatch.delenv("RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S", raising=False)
    monkeypatch.setattr(subprocess, "run", fake_run)
    assert bench.main(["--workdir", str(tmp_path)]) == 0
    assert seen == ["600", None]  # the baseline waits for each pool in turn; the kit runs Ray's default
    out = capsys.readouterr().out
    assert "24 read, all accounted for: True" in out and "1.50x" in out


def test_pipeline_benchmark_splits_raw_and_kit_over_two_commands(tmp_path, monkeypatch):
    """``--side raw`` then ``--side kit``: the kit's run is compared with the raw side kept from the
    first command, and only when the inputs and settings are the same."""
    bench = load_script("bench_pipeline", folder="benchmarks")
    calls = []

    def fake_raw(kind, spec, workdir, extra_env=None):
        calls.append("raw")
        return bench.Timing(100.0, 80.0, 60.0), {"answers": {"a": "x"}, "digests": {"a": "d"}}

    def fake_kit(notebook, params, workdir):
        calls.append("kit")
        return bench.Timing(50.0, 40.0, 30.0), workdir / "kit", {}

    monkeypatch.setattr(bench, "run_raw", fake_raw)
    monkeypatch.setattr(bench, "kit_timing", fake_kit)
    monkeypatch.setattr(bench, "on_gpu", lambda: True)
    spec = {"input": "companies.csv", "engine_kwargs": {"max_num_seqs": 1024}}
    with pytest.raises(SystemExit, match="needs the raw side first"):
        bench.measure("text", "text_classification", spec, {}, tmp_path, side="kit")
    assert bench.measure("text", "text_classification", spec, {}, tmp_path, side="raw") is None
    assert calls == ["raw"]
    run = bench.measure("text", "text_classification", spec, {}, tmp_path, side="kit")
    assert calls == ["raw", "kit"]  # the raw side was not run again
    assert run.raw == bench.Timing(100.0, 80.0, 60.0) and run.kit == bench.Timing(50.0, 40.0, 30.0)
    assert run.raw_results["default"]["answers"] == {"a": "x"}
    with pytest.raises(SystemExit, match="other inputs or settings"):
        bench.measure("text", "text_classification", {**spec, "engine_kwargs": {"max_num_seqs": 256}}, {}, tmp_path,
                      side="kit")
    with pytest.raises(SystemExit):
        bench.main(["--task", "text", "--side", "kit"])  # no --workdir: nowhere to find the raw side


def test_cell_profiler_runs_each_notebooks_cells_up_to_the_pipeline_with_its_parameters():
    profiler = load_script("profile_cells", folder="benchmarks")
    for notebook in ("text_classification", "vlm_captioning"):
        cells = profiler.code_cells(notebook, {"LIMIT": "12"})
        sources = [source for _, source in cells]
        assert sources[0].startswith("import") and "pipeline.run(" not in "".join(sources)
        assert any("build_processor(" in s for s in sources)  # up to and with the processor cell
        [parameters] = [s for s in sources if "\nLIMIT = 12" in s]
        assert parameters.index("\nLIMIT = 12") > parameters.index("LIMIT = None")  # set after, as papermill does
    with pytest.raises(ValueError):
        profiler.code_cells("text_classification", {"LIMIT": "print('not a literal')"})


def _parameters_and_preprocess(name: str) -> str:
    """``notebooks/<name>.ipynb``'s parameters cell, then the ``def preprocess`` of its prompt cell (the
    function alone: the rest of that cell reads the run's sample)."""
    import ast
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / f"{name}.ipynb").read_text())["cells"]
    code = [("".join(c["source"]), c["metadata"].get("tags", [])) for c in cells if c["cell_type"] == "code"]
    (parameters,) = [source for source, tags in code if "parameters" in tags]
    (prompt_cell,) = [source for source, _ in code if "def preprocess(" in source]
    (function,) = [node for node in ast.parse(prompt_cell).body if isinstance(node, ast.FunctionDef) and node.name == "preprocess"]
    return parameters + "\n" + ast.get_source_segment(prompt_cell, function)


def test_the_raw_side_sends_the_messages_the_notebooks_preprocess_sends():
    """The raw vLLM side builds its prompts with ``classify.build_messages`` / ``caption.build_messages``;
    each notebook's own ``preprocess`` (as committed, with its default parameters) must build the same
    ones, or the benchmark compares two different workloads. (A full run also compares the requests'
    token digests; this catches a drift without one.)"""
    import numpy as np
    from PIL import Image

    from helpers import caption, classify

    text: dict = {"MAX_TOKENS": 8}  # one namespace, as a kernel's (the prompt cell sets MAX_TOKENS first)
    exec(_parameters_and_preprocess("text_classification"), text)
    row = {text["TEXT_COLUMN"]: "Walmart"}
    assert text["preprocess"](row)["messages"] == classify.build_messages(
        "Walmart", text["LABELS"], text["TASK"], text["USER_TEMPLATE"])

    vision: dict = {"np": np, "Image": Image}
    exec(_parameters_and_preprocess("vlm_captioning"), vision)
    sent = vision["preprocess"]({"image": np.zeros((28, 28, 3), dtype=np.uint8)})["messages"]
    image = sent[1]["content"][1]["image_pil"]
    assert isinstance(image, Image.Image) and image.size == (28, 28)
    assert sent == caption.build_messages(vision["SYSTEM_PROMPT"], vision["PROMPT"], image)
