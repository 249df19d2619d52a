import time
import subprocess
from pathlib import Path
import sys

import nbformat
import pandas as pd
import pytest

from conftest import load_script, parameterised_notebook

UNPATCHED = '''
@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    pass


@torch.library.register_fake("torchvision::qnms")
def meta_qnms(dets, scores, iou_threshold):
    pass
'''


def test_torchvision_patch_guards_both_ops_once():
    patch = load_script("patch_torchvision")
    patched = patch.patch_source(UNPATCHED)
    assert patched.count("if torchvision.extension._has_ops() else (lambda fn: fn)") == 2
    assert patch.patch_source(patched) == patched  # idempotent
    with pytest.raises(SystemExit, match="found 0"):
        patch.patch_source("nothing to patch here")


def test_torchvision_imports_in_this_environment():
    # The install path patched it; vLLM's vision models need this import.
    subprocess.run([sys.executable, "-c", "import torchvision, torchvision.transforms"], check=True)


def test_clear_outputs_keeps_only_checked_cells_and_drops_injected_parameters():
    clear = load_script("clear_outputs")
    nb = nbformat.v4.new_notebook()
    checked = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(1)", execution_count=3)
    checked.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n"),
                       nbformat.v4.new_output("stream", name="stderr", text="log noise\n")]
    other = nbformat.v4.new_code_cell("print(2)", execution_count=2)
    other.outputs = [nbformat.v4.new_output("stream", name="stdout", text="2\n")]
    injected = nbformat.v4.new_code_cell("LIMIT = 3")
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells = [other, injected, checked]
    out = clear.cleaned(nb)
    assert len(out.cells) == 2
    assert out.cells[0].outputs == [] and out.cells[0].execution_count is None
    assert [o.text for o in out.cells[1].outputs] == ["1\n"]


def test_the_runner_redacts_secrets_papermill_wrote_into_the_executed_notebook(tmp_path):
    runner = load_script("run_notebooks")
    nb = nbformat.v4.new_notebook()
    injected = nbformat.v4.new_code_cell('INPUT_PATH = "s3://AKIAKIT:s3cr3t@bucket/x/"\nLIMIT = 3')
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells = [injected]
    executed = tmp_path / "run.ipynb"
    nbformat.write(nb, executed)
    runner.redact_notebook(executed, {"INPUT_PATH": "s3://AKIAKIT:s3cr3t@bucket/x/", "LIMIT": 3})
    text = executed.read_text()
    assert "s3cr3t" not in text and "AKIAKIT" not in text and "s3://***@bucket/x/" in text
    runner.redact_notebook(tmp_path / "missing.ipynb", {})  # a run that wrote nothing: nothing to do


def test_the_runner_refuses_an_output_folder_that_is_not_the_kits(tmp_path):
    from helpers import run_folder

    runner = load_script("run_notebooks")
    (tmp_path / "text_classification" / "checkpoint").mkdir(parents=True)
    (tmp_path / "text_classification" / "model.ckpt").write_text("x")
    with pytest.raises(run_folder.NotTheKitsFolderError):
        runner.run("text_classification", tmp_path, {})
    assert (tmp_path / "text_classification" / "checkpoint").is_dir()


def test_run_notebooks_parses_parameter_literals():
    runner = load_script("run_notebooks")
    assert runner.parse_value("50") == 50
    assert runner.parse_value("None") is None
    assert runner.parse_value("[1, 4]") == [1, 4]
    assert runner.parse_value("unsloth/Llama-3.1-8B-Instruct") == "unsloth/Llama-3.1-8B-Instruct"


def test_run_notebooks_reads_each_notebooks_defaults():
    runner = load_script("run_notebooks")
    text = runner.defaults("text_classification")
    assert text["PRESET"] == "auto" and text["ENGINE"] == {} and text["LABELS"][0] == "Law Firm"
    assert text["USER_TEMPLATE"] == "Company: {text}" and text["OUTPUT_DIR"] == "results/text_classification"
    vision = runner.defaults("vlm_captioning")
    assert vision["IMAGE_TOKENS"] == 64 and "LABELS" not in vision


def test_readme_and_docs_generated_tables_match_their_sources(repo):
    """The parameter tables (from the notebooks) and the presets table (from helpers.presets), in
    whichever of README.md and docs/*.md holds them."""
    render = load_script("render_readme")
    pages = render.pages(repo)
    assert repo / "README.md" in pages and repo / "docs" / "parameters.md" in pages
    texts = {path: path.read_text(encoding="utf-8") for path in pages}
    every = "".join(texts.values())
    for marker in ("<!-- params:text_classification -->", "<!-- params:vlm_captioning -->", "<!-- presets -->"):
        assert every.count(marker) == 1, f"{marker} should be in exactly one of README.md and docs/*.md"
    for path, text in texts.items():
        assert render.render(text) == text, f"{path.relative_to(repo)}: run python scripts/render_readme.py"
    assert render.main(["--check"]) == 0
    checks = {row.split("|")[1].strip(" `"): row.split("|")[-2].strip() for row in render.presets_table().splitlines()[2:]}
    assert checks["text-llama8b-l4-scaled"].startswith("weights") and checks["text-llama8b-a100"] == "passes"


def test_render_readme_check_names_a_stale_docs_page_and_a_run_fixes_it(tmp_path, capsys):
    render = load_script("render_readme")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# no generated blocks here\n")
    page = tmp_path / "docs" / "params.md"
    stale = "# Parameters\n\n<!-- params:vlm_captioning -->\n| an old table |\n<!-- /params:vlm_captioning -->\n"
    page.write_text(stale)
    assert render.main(["--check"], root=tmp_path) == 1
    assert "docs/params.md" in capsys.readouterr().out and page.read_text() == stale  # --check writes nothing
    assert render.main([], root=tmp_path) == 0
    assert "| `IMAGE_COLUMN` |" in page.read_text() and "an old table" not in page.read_text()
    assert render.main(["--check"], root=tmp_path) == 0
    assert (tmp_path / "README.md").read_text() == "# no generated blocks here\n"


def test_sample_customers_check_mode_detects_drift(repo, tmp_path, monkeypatch):
    generator = load_script("make_sample_customers")
    monkeypatch.setattr(generator, "OUT", tmp_path / "customers.csv")
    (tmp_path / "customers.csv").write_text(generator.render().replace("Walmart", "Wal-Mart"))
    monkeypatch.setattr(sys, "argv", ["x", "--check"])
    assert generator.main() == 1


@pytest.mark.parametrize("name", ["make_sample_images", "make_tiny_vlm"])
def test_the_shipped_sample_image_shard_and_tiny_vlm_match_their_generators(name, monkeypatch, tmp_path):
    """Byte for byte: the check mode fails on the committed files' drift, and passes on them as made."""
    generator = load_script(name)
    monkeypatch.setattr(sys, "argv", ["x", "--check"])
    assert generator.main() == 0
    stale = tmp_path / generator.OUT.name
    (stale.mkdir() or (stale / "config.json").write_text("{}")) if generator.OUT.is_dir() else stale.write_bytes(b"old")
    monkeypatch.setattr(generator, "OUT", stale)
    assert generator.main() == 1


def test_a_report_rendering_error_never_replaces_the_notebooks_outcome(tmp_path, monkeypatch, capsys):
    import papermill

    runner = load_script("run_notebooks")
    calls = []

    def fake_execute(source, executed, parameters, cwd, **kwargs):
        calls.append(cwd)
        Path(executed).write_text("{ not a notebook")  # renders with an error
        if parameters.get("LIMIT") == -1:
            raise RuntimeError("the notebook's own failure")

    monkeypatch.setattr(papermill, "execute_notebook", fake_execute)
    monkeypatch.chdir(tmp_path)
    out = runner.run("text_classification", tmp_path / "results", {"LIMIT": 5})
    assert out == (tmp_path / "results" / "text_classification").resolve()  # the run's result stands
    assert "could not render text_classification.html" in capsys.readouterr().err
    assert calls == [str(tmp_path)]  # relative INPUT_PATHs are relative to where the command runs
    with pytest.raises(RuntimeError, match="the notebook's own failure"):
        runner.run("text_classification", tmp_path / "results", {"LIMIT": -1})


def test_a_stalled_cell_fails_the_run_within_the_cell_timeout(tmp_path, monkeypatch):
    runner = load_script("run_notebooks")
    stalled = parameterised_notebook(tmp_path / "stalled.ipynb", "OUTPUT_DIR = None", "import time\ntime.sleep(600)")
    monkeypatch.setitem(runner.NOTEBOOKS, "stalled", stalled)
    monkeypatch.setenv(runner.CELL_TIMEOUT_ENV, "3")
    started = time.monotonic()
    with pytest.raises(Exception, match="timed out"):  # nbclient's CellTimeoutError
        runner.run("stalled", tmp_path / "results", {})
    assert time.monotonic() - started < 120


def test_the_runner_keeps_the_kernel_off_the_network_and_the_log_quiet(tmp_path, capfd):
    """Kernels run on local sockets: no TCP port, and no 'running over TCP without encryption'
    warning in every job's log. The sockets are not in the folder the notebook runs in (a killed run
    would leave them in the user's project)."""
    runner = load_script("run_notebooks")
    source = parameterised_notebook(tmp_path / "n.ipynb", "X = 1", "import json, os, ipykernel.connect\n"
                                    "info = json.loads(ipykernel.connect.get_connection_info())\n"
                                    "print(info['transport'], X, os.listdir('.'), os.path.isabs(info['ip']))")
    (tmp_path / "run").mkdir()
    runner.execute(source, tmp_path / "out.ipynb", {"X": 2}, cwd=tmp_path / "run")
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert out.cells[-1].outputs[0].text == "ipc 2 [] True\n"
    assert not list((tmp_path / "run").iterdir())
    assert "without encryption" not in capfd.readouterr().err


def tiny_runner(tmp_path, monkeypatch, parameters: str, before: str = ""):
    """The job runner with a notebook ``tiny`` of its own: ``parameters``, then ``before``, then a run started
    in OUTPUT_DIR that prints whether it resumed (its settings: the parameter ``X``)."""
    runner = load_script("run_notebooks")
    tiny = parameterised_notebook(tmp_path / "tiny.ipynb", parameters,
                                  before + "from helpers import pipeline, run_folder\nfrom helpers.presets import PRESETS\n"
                                  "fns = pipeline.checked(lambda r: {'messages': [], 'x': X}, lambda r: {'y': ''}, {'x': 1})\n"
                                  "run = run_folder.open_folder(OUTPUT_DIR).start(PRESETS['text-cpu-offline'], fns, "
                                  "id_column='id', settings={'x': X})\n"
                                  "print('run', X, 'resuming' if run.resuming else 'fresh')\nrun.lock.release()")
    monkeypatch.setitem(runner.NOTEBOOKS, "tiny", tiny)
    monkeypatch.setattr(runner, "render_report", lambda executed, html: html.write_bytes(executed.read_bytes()))
    return runner


def test_no_run_overwrites_an_earlier_runs_report(tmp_path, monkeypatch):
    """The runner wrote ``<name>.ipynb`` and ``.html`` straight into OUTPUT_DIR: every re-run, job retry,
    and a re-run that stopped with InterruptedRunError ("Nothing was changed there") replaced the last
    report. Now a run's report is one of its files (the next run moves it aside), and a run that stops
    before it starts writes its report beside the earlier one."""
    import papermill

    runner = tiny_runner(tmp_path, monkeypatch, "OUTPUT_DIR = None\nX = 1")
    out = tmp_path / "results" / "tiny"

    def reports(folder):
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in (".ipynb", ".html")}

    runner.run("tiny", tmp_path / "results", {"X": 1}, cwd=tmp_path)
    first = reports(out)
    assert set(first) == {"tiny.ipynb", "tiny.html"} and b"run 1 fresh" in first["tiny.ipynb"]
    # That run was interrupted (a committed checkpoint); a re-run with other settings stops.
    (out / "checkpoint").mkdir()
    pd.DataFrame({"id": ["a"]}).to_parquet(out / "checkpoint" / "ids.parquet")
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("tiny", tmp_path / "results", {"X": 2}, cwd=tmp_path)
    assert err.value.ename == "InterruptedRunError"
    now = reports(out)
    assert {k: now[k] for k in first} == first  # the earlier report, byte for byte
    html, executed = sorted(set(now) - set(first))  # the stopped run's own, beside it
    assert html.startswith("tiny-") and executed == html.replace(".html", ".ipynb") and b"InterruptedRunError" in now[executed]
    # The interrupted run resumed: its report moves aside with its record; the stopped run's report,
    # never a run's file, stays where it is.
    runner.run("tiny", tmp_path / "results", {"X": 1}, cwd=tmp_path)
    (kept,) = (out / "earlier").iterdir()
    assert reports(kept) == first and b"run 1 resuming" in (out / "tiny.ipynb").read_bytes()
    assert html in reports(out)


def test_a_notebook_that_stops_before_its_run_leaves_a_folder_the_next_run_takes(tmp_path, monkeypatch):
    """A job whose notebook stopped at its checks (PRESET="auto" on a cluster without GPUs) left only its
    report in a new OUTPUT_DIR, and the next job was refused it: "not written by this kit"."""
    import papermill

    runner = tiny_runner(tmp_path, monkeypatch, "OUTPUT_DIR = None\nX = 1\nSTOP = True", "assert not STOP, 'stopped at the checks'\n")
    with pytest.raises(papermill.PapermillExecutionError):
        runner.run("tiny", tmp_path / "results", {}, cwd=tmp_path)
    assert (tmp_path / "results" / "tiny" / "tiny.html").is_file()
    runner.run("tiny", tmp_path / "results", {"STOP": False}, cwd=tmp_path)
    assert (tmp_path / "results" / "tiny" / "run.json").is_file()


def test_a_mistyped_parameter_stops_the_runner_before_the_kernel_starts(tmp_path, monkeypatch, capsys):
    """``-p LIMT 10000`` passed papermill's warning and ran the whole input."""
    import papermill

    from helpers import parameters

    runner = load_script("run_notebooks")

    def no_kernel(*args, **kwargs):
        raise AssertionError("the notebook started")

    monkeypatch.setattr(papermill, "execute_notebook", no_kernel)
    out = tmp_path / "results"
    assert runner.main(["--only", "text_classification", "--out", str(out), "-p", "LIMT", "10000"]) == 2
    said = capsys.readouterr().err
    assert "LIMT is not a parameter of text_classification" in said and "did you mean LIMIT?" in said
    # Both notebooks: a parameter only one has stops before either starts, saying to run it alone.
    assert runner.main(["--out", str(out), "-p", "LABELS", "['a', 'b']", "-p", "LIMIT", "5"]) == 2
    said = capsys.readouterr().err
    assert "LABELS is not a parameter of vlm_captioning" in said and "--only" in said
    assert "text_classification" not in said.split("LABELS is not")[0]  # the text notebook has LABELS
    with pytest.raises(parameters.ParameterError, match="did you mean TEMPERATURE"):
        runner.run("vlm_captioning", out, {"TEMPRATURE": 0.5})
    assert not out.exists()  # nothing claimed
