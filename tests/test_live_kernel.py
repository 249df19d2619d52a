"""The notebooks stepped through as a person does in Jupyter: a live kernel started in ``notebooks/``
(as JupyterLab starts it), driven cell by cell through jupyter_client with ``allow_stdin`` on, as a
frontend sends it. Each step asserts what the person sees (the run cell's output, one progress line
updated in place, no logged progress, one-line interrupts) and what is on disk (rows each once,
nothing deleted that a later cell reports).

Text, on the sample in a private repository of the stand-in Hub (a token in the kernel's environment):
run all but the last cell; run the run cell again (a new run, the first moved aside); edit the parameters
and the postprocess (one more column) and re-run from there, interrupt the run cell after its first
results, re-run it (resume), then the rest (the engines freed); then the one import line changed to Ray's
own processor, and the cells run again: its answers agree with the kit's. Captioning: run all on parquet rows, then restart the kernel and run
all on webdataset shards on the stand-in Hub; restart the kernel while that run is part-way, and run
all again (it resumes).
"""

from __future__ import annotations

import json
import os
import queue
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import HUB_TOKEN, REPO, hub_env

pytestmark = pytest.mark.slow


class Kernel:
    """A live IPython kernel in ``notebooks/`` and the cells of one notebook."""

    def __init__(self, notebook: str, parameters: dict, env: dict | None = None):
        from jupyter_client.manager import KernelManager

        self.cells = [c for c in json.loads((REPO / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
                      if c["cell_type"] == "code"]
        self.parameters = parameters
        # Local sockets, as the kit's runner uses (TCP makes the kernel warn about plain text).
        import tempfile

        # An absolute socket path: the kernel runs in notebooks/, this process elsewhere.
        sockets = Path(tempfile.mkdtemp(prefix="kit-kernel-")) / "kernel-ipc"
        self.km = KernelManager(kernel_name="python3", transport="ipc", ip=str(sockets))
        # env: the kernel's whole environment; without it, this process's (jupyter_client's default). Never
        # pytest's PYTEST_CURRENT_TEST, which JupyterLab's kernels lack: with it, ipykernel leaves file
        # descriptors 1 and 2 alone, and what C code writes there (Ray's core worker) never showed in a cell.
        env = {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTEST_CURRENT_TEST"}
        self.km.start_kernel(cwd=str(REPO / "notebooks"), env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def source(self, index: int) -> str:
        cell = self.cells[index]
        text = "".join(cell["source"])
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            text += "\n" + "\n".join(f"{k} = {v!r}" for k, v in self.parameters.items())
        return text

    def index(self, needle: str) -> int:
        (found,) = [i for i, c in enumerate(self.cells) if needle in "".join(c["source"])]
        return found

    def run(self, index: int, *, interrupt_when=None, timeout: float = 900, source: str | None = None) -> dict:
        """Execute cell ``index`` (or ``source``, a person's edit of it) as a frontend does; what the person
        sees: stdout, stderr, displays (with their updates), the error."""
        msg_id = self.kc.execute(source or self.source(index), allow_stdin=True)
        seen = {"stdout": "", "stderr": "", "displays": [], "updates": [], "error": None}
        deadline, interrupted = time.monotonic() + timeout, False
        while True:
            assert time.monotonic() < deadline, f"cell {index} did not finish in {timeout} s"
            if interrupt_when is not None and not interrupted and interrupt_when():
                self.km.interrupt_kernel()
                interrupted = True
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "update_display_data":
                seen["updates"].append(content)
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if kind == "stream":
                seen[content["name"]] += content["text"]
            elif kind == "display_data":
                seen["displays"].append(content)
            elif kind == "error":
                seen["error"] = content
            elif kind == "status" and content["execution_state"] == "idle":
                break
        self.kc.get_shell_msg(timeout=60)
        return seen

    def restart_when(self, index: int, when, timeout: float = 900) -> None:
        """Execute cell ``index`` and, once ``when()`` holds, press "Restart kernel" while it runs: the
        kernel and what it started are killed, not interrupted."""
        self.kc.execute(self.source(index), allow_stdin=True)
        deadline = time.monotonic() + timeout
        while not when():
            assert time.monotonic() < deadline, f"cell {index}: {when.__name__} did not hold within {timeout} s"
            time.sleep(0.1)
        self.restart()

    def run_all(self, start: int = 0, stop: int | None = None) -> dict[int, dict]:
        seen = {}
        for i in range(start, len(self.cells) if stop is None else stop):
            seen[i] = self.run(i)
            assert seen[i]["error"] is None, f"cell {i}: {seen[i]['error']}"
        return seen

    def restart(self) -> None:
        self.km.restart_kernel(now=True)
        self.kc.wait_for_ready(timeout=60)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def committed_ids(out: Path) -> set:
    """Ids in the committed checkpoint files of a run folder (Ray's; a killed write's are ``.pending``)."""
    files = [p for p in (out / "checkpoint").rglob("*.parquet") if not p.name.endswith(".pending.parquet")]
    return set(pd.concat([pd.read_parquet(p) for p in files]).iloc[:, 0]) if files else set()


#: The one line Ray's core worker logs, from C++, as Ray Data starts an actor stage with its arguments in
#: the object store (ray-project/ray#53727). The kit no longer hides it (the FAQ says why it is harmless).
RAY_LINE = "has constructor arguments in the object store and max_restarts > 0"


def _assert_readable_run_cell(seen: dict, noun: str) -> None:
    """One progress display, updated in place; on stderr nothing but Ray's one known line (Ray's progress
    is not logged); an output a person can read."""
    assert all(RAY_LINE in line for line in seen["stderr"].splitlines() if line.strip()), seen["stderr"][-2000:]
    progress = [d for d in seen["displays"] if "sending the first batches" in d["data"].get("text/plain", "")]
    assert len(progress) == 1, seen["displays"]
    shown = progress[0].get("transient", {}).get("display_id")
    lines = [u["data"]["text/plain"] for u in seen["updates"] if u.get("transient", {}).get("display_id") == shown]
    assert len(lines) >= 3 and lines[-1].startswith("done in "), lines
    assert sum(not line.startswith("done in ") for line in lines) >= 2, lines  # a live ticker, not just the end
    assert len(seen["stdout"]) < 4000, seen["stdout"]
    assert f"{noun} classified" in seen["stdout"] or f"{noun} captioned" in seen["stdout"]


def test_text_notebook_on_a_private_hub_csv_stepped_through_in_a_live_kernel(hub, tmp_path):
    """The sample CSV in a private repository of the stand-in Hub (tests/hub_server.py), HF_TOKEN in the
    kernel's environment as a user sets it: the token reaches no file the runs write."""
    server, url, root = hub
    out = tmp_path / "results"
    kernel = Kernel("text_classification", {"OUTPUT_DIR": str(out), "LIMIT": 60,
                                            "INPUT_PATH": "hf://datasets/kit/customers/customers.csv"},
                    env=hub_env(url, HUB_TOKEN))

    def engines() -> list[str]:
        """The engine replicas alive in the kernel's Ray: their actors' names (a new engine, a new name); none
        where Ray is stopped (asked then, Ray would start again: connecting to a cluster a stale file names, it hung)."""
        shown = kernel.run(0, source="print(sorted(a['name'] for a in ray.util.list_named_actors(all_namespaces=True) "
                                     "if a['name'].startswith('SERVE_REPLICA')) if ray.is_initialized() else [])")
        return eval(shown["stdout"])

    try:
        run_cell, prompt_cell = kernel.index("pipeline.write("), kernel.index("def postprocess(")
        start_cell, last_cell = kernel.index("processor = build_processor("), kernel.index("engines.free()")
        # 1. Run all but the last cell (it frees the engines).
        seen = kernel.run_all(0, last_cell)
        _assert_readable_run_cell(seen[run_cell], "rows")
        first = pd.read_parquet(out / "predictions.parquet")
        assert len(first) + len(pd.read_parquet(out / "errors.parquet")) == 60

        # 2. The run cell again: a new run on the same engines, the first one's files moved aside byte for byte.
        finished, before = _files(out), engines()
        again = kernel.run(run_cell)
        assert again["error"] is None and "starting fresh; the earlier files are kept in" in again["stdout"]
        (earlier,) = [e for e in (out / "earlier").iterdir() if (e / "predictions.parquet").exists()]
        assert _files(earlier)["predictions.parquet"] == finished["predictions.parquet"]
        assert len(before) == 1 and engines() == before

        # 3. Edit the parameters: engine settings changed (the sequences an engine holds, the batches it takes
        # at once) need new engines, and the cell says why; batches of 8 do not (results come in many small
        # files, so the interrupt below finds the run part-way). Then edit the postprocess to return one more column (it was dropped
        # once), run from there, and interrupt the run cell after its first results: the same engines answer.
        kernel.parameters.update(LIMIT=59, ENGINE={"max_num_seqs": 16, "batch_size": 8, "max_concurrent_batches": 1, "num_blocks": 16})
        restarted = kernel.run_all(kernel.index("INPUT_PATH = "), start_cell + 1)[start_cell]["stdout"]
        assert "restarting the engines: max_concurrent_batches, max_num_seqs changed" in restarted, restarted
        assert kernel.run(0, source="processor.engines.ready()")["error"] is None
        running = engines()
        assert len(running) == 1 and running != before
        edited = kernel.source(prompt_cell).replace(
            'answer = {"predicted_label": row["generated_text"].strip()}',
            'answer = {"predicted_label": row["generated_text"].strip(), "answer_chars": len(row["generated_text"])}')
        assert "answer_chars" in edited and kernel.run(prompt_cell, source=edited)["error"] is None
        assert "started earlier are kept" in kernel.run_all(prompt_cell + 1, run_cell)[start_cell]["stdout"]
        assert engines() == running
        stopped = kernel.run(run_cell, interrupt_when=lambda: bool(committed_ids(out)))
        assert stopped["error"]["ename"] == "RunInterrupted", stopped["error"]
        (line,) = stopped["error"]["traceback"]  # one line, not Ray's and the kit's stack
        assert "rows are safe" in line and "run this cell again" in line

        # 4. Run the cell again: it resumes; then the rest of the notebook.
        resumed = kernel.run(run_cell)
        assert resumed["error"] is None and "resuming an interrupted run" in resumed["stdout"]
        assert engines() == running
        kernel.run_all(run_cell + 1)  # the last cell frees the engines, and stops the Ray it started
        assert kernel.run(0, source="print(ray.is_initialized())")["stdout"].strip() == "False"
        predictions = pd.read_parquet(out / "predictions.parquet")
        rows = pd.concat([predictions, pd.read_parquet(out / "errors.parquet")])
        assert len(rows) == 59 and rows["row_id"].is_unique
        assert (predictions["answer_chars"] == predictions["predicted_label"].str.len()).all()  # your column, kept
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rows read"] == 59 and summary["all rows accounted for"] and summary["accuracy"] is not None
        # The file's first 59 rows, each as the file has it (read here with pandas); the token in no file.
        local = pd.read_csv(root / "csv" / "customers.csv", dtype=str, keep_default_na=False).head(59)
        for column in ("Company", "prompt", "messages"):  # the last two: names Ray's stages write into each row
            assert rows.set_index("Customer Id")[column].fillna("").to_dict() == local.set_index("Customer Id")[column].to_dict()

        # 5. The run cell once the engines are freed: it says to run the cells again.
        freed = kernel.run(run_cell)
        assert freed["error"]["ename"] == "EngineStartError" and "run the cells again" in freed["error"]["evalue"]

        # 6. Ray's own processor: the one import line the notebook names, changed, and the cells run again. Ray
        # starts its engines for the run; every row is accounted for, and the answers agree with the kit's
        # engines on the same rows (greedy CPU answers can differ between two correct runs: agreement, not equality).
        kit, ray = "from helpers.engines import build_processor", "from ray.data.llm import build_processor"
        assert f"{kit}  # Ray's own, new engines each run: {ray}" in kernel.source(0)
        assert kernel.run(0, source=kernel.source(0).replace(kit, ray, 1))["error"] is None
        kernel.parameters.update(ENGINE={})  # the preset's batches: the 59 rows in one
        rays = kernel.run_all(1, last_cell)[run_cell]
        assert "starting fresh; the earlier files are kept in" in rays["stdout"], rays["stdout"]
        assert kernel.run(0, source="print(type(processor).__module__)")["stdout"].startswith("ray.")  # Ray's stages ran
        assert engines() == []  # and no kept engine
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rows read"] == 59 and summary["all rows accounted for"] and summary["engine errors"] == 0, summary
        answers = pd.read_parquet(out / "predictions.parquet").set_index("row_id")["predicted_label"]
        same = (answers == predictions.set_index("row_id")["predicted_label"].reindex(answers.index)).mean()
        assert len(answers) == len(predictions) and same >= 0.8, (same, answers)
        kernel.run(last_cell)  # stops the Ray it started
        assert kernel.run(0, source="print(ray.is_initialized())")["stdout"].strip() == "False"
        assert not [p for p in out.rglob("*") if p.is_file() and HUB_TOKEN.encode() in p.read_bytes()]
        assert not server.unexpected

    finally:
        kernel.close()


@pytest.mark.extended  # 6-7 min on a 2-core machine (the text notebook's live kernel runs in CI): make test-extended
def test_captioning_notebook_on_parquet_then_on_hub_shards_restarted_mid_run_and_resumed(hub, tmp_path):
    """Run all on Hugging Face parquet rows (the kit's whole corpus of awkward and broken files, a null
    image, the same bytes twice: two rows, never merged). Then restart the kernel, point INPUT_PATH at
    BLIP3o-style shards on the stand-in Hub (keys restart in every shard, so resuming must key on shard
    + key; a sample with no image), restart the kernel while the run cell runs (after its first
    results), and run all again: it resumes, and every sample is written once."""
    from conftest import blip_samples, sample_files
    from helpers import images

    server, url, _ = hub
    files = sample_files()
    broken_files = {k for k in files if k.startswith("broken_")}
    rows = [{"key": k, "jpg": {"bytes": v, "path": f"{k}.jpg"}} for k, v in files.items()]
    rows += [{"key": "null_image", "jpg": None},
             {"key": "astronaut_again", "jpg": {"bytes": files["astronaut"], "path": "a.jpg"}}]
    (tmp_path / "pq").mkdir()
    pd.DataFrame(rows).to_parquet(tmp_path / "pq" / "train-0000.parquet")
    any_image = "jpg;jpeg;png;webp;gif;bmp;tif;tiff;image"

    out = tmp_path / "results"
    kernel = Kernel("vlm_captioning", {"OUTPUT_DIR": str(out), "INPUT_PATH": str(tmp_path / "pq"), "ID_COLUMN": "key",
                                       "IMAGE_TOKENS": 16, "MAX_TOKENS": 8, "KEEP_ASPECT": False,
                                       "ENGINE": {"batch_size": 4, "num_blocks": 2}}, env=hub_env(url))
    try:
        run_cell = kernel.index("pipeline.write(")
        seen = kernel.run_all()
        _assert_readable_run_cell(seen[run_cell], "images")
        for name in ("captions.parquet", "errors.parquet", "captions.png", "summary.json"):
            assert (out / name).is_file(), name
        broken = broken_files | {"null_image"}
        summary = json.loads((out / "summary.json").read_text())
        assert summary["images read"] == len(rows) and summary["captioned"] == len(rows) - len(broken)
        assert summary["rejected before the model"] == len(broken) and summary["all images accounted for"]
        captions = pd.read_parquet(out / "captions.parquet")
        assert sorted(captions["row_id"]) == sorted({r["key"] for r in rows} - broken)
        assert set(captions.columns) == {"row_id", "source", "key", "width", "height", "vision_tokens", "caption",
                                         "num_input_tokens", "num_generated_tokens"}  # never the image
        assert (captions["width"] == captions["height"]).all() and (captions["vision_tokens"] <= 16).all()
        assert (captions["num_generated_tokens"] >= 1).all() and (captions["num_generated_tokens"] <= 8).all()
        errors = pd.read_parquet(out / "errors.parquet").set_index("row_id")
        assert set(errors.index) == broken and errors["reason"].str.len().gt(0).all()
        assert errors.loc["broken_truncated", "reason"] == "truncated file"
        assert errors.loc["broken_bomb", "reason"].startswith("too many pixels")
        assert errors.loc["null_image", "reason"] == f"no {any_image!r} value in this row"
        first = _files(out)

        # Restart; the shards on the Hub, in batches of 2, one at a time: results come in many small
        # files, so the restart below finds the run part-way.
        kernel.restart()
        kernel.parameters = {"OUTPUT_DIR": str(out), "INPUT_PATH": "hf://datasets/kit/blip3o-style", "IMAGE_TOKENS": 16,
                             "MAX_TOKENS": 8, "ENGINE": {"batch_size": 2, "max_concurrent_batches": 1, "num_blocks": 16}}
        kernel.run_all(0, run_cell)
        # "Restart kernel" while the run cell runs: the kernel, its Ray and the engine die with what
        # they were writing. Then run all again: it resumes.
        kernel.restart_when(run_cell, lambda: bool(committed_ids(out)))
        (earlier,) = (out / "earlier").iterdir()  # the parquet run, moved when this one started
        moved = {k: v for k, v in first.items() if k.startswith(("parts", "captions", "errors", "summary"))}
        assert moved and all(_files(earlier).get(k) == v for k, v in moved.items())  # kept byte for byte
        done_before = committed_ids(out)
        kernel.parameters.update(ENGINE={"batch_size": 16, "num_blocks": 16})  # batches are not a results setting
        seen = kernel.run_all()
        assert "resuming an interrupted run" in seen[run_cell]["stdout"], seen[run_cell]
        shards = blip_samples()
        rejected_ids = {i for i, name in shards.items() if name.startswith("broken_") or name == "no image field"}
        assert 0 < len(done_before) < len(shards), done_before
        summary = json.loads((out / "summary.json").read_text())
        assert summary["images read"] == len(shards) and summary["all images accounted for"], summary
        assert summary["rows written in this run"] == len(shards) - len(done_before)
        captions = pd.read_parquet(out / "captions.parquet")
        errors = pd.read_parquet(out / "errors.parquet")
        ids = pd.concat([captions[images.SAMPLE_ID], errors[images.SAMPLE_ID]])
        assert ids.is_unique and set(ids) == set(shards)  # every sample once, none merged across shards
        assert set(errors[images.SAMPLE_ID]) == rejected_ids
        rejected = {shards[i]: r for i, r in zip(errors[images.SAMPLE_ID], errors["reason"])}
        assert rejected["no image field"] == f"no {any_image!r} value in this row"
        assert rejected["broken_truncated_png"] == "truncated file" and all(rejected.values())
        assert "horse_corrupt_exif" in {shards[i] for i in captions[images.SAMPLE_ID]}
        assert not server.unexpected and "resolve" in server.calls
    finally:
        kernel.close()
