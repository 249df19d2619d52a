"""Long runs survive: kill a notebook run part-way, run it again, and account for every row.

Both runs read their input from a bucket, as a job on a cluster does: moto's S3 server on 127.0.0.1,
reached as a MinIO or on-premises user reaches theirs (``AWS_ENDPOINT_URL`` and the usual credential
variables, inherited by the notebook's kernel and Ray's workers).

The proof that finished rows are not read again comes from Ray's checkpoint: the ids committed
before the kill are exactly the rows the re-run skips (the re-run reports how many rows Ray's read
produced and how many it wrote, counted from the files). Rejected rows are written in the same pass,
so they are checkpointed too.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import papermill
import psutil
import pytest

from conftest import BUCKET, REPO, load_script
from helpers.storage import Location


def start(notebook: str, root: Path, params: dict) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "scripts" / "run_notebooks.py"), "--only", notebook, "--out", str(root)]
    for name, value in params.items():
        cmd += ["-p", name, repr(value)]
    return subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def committed_ids(checkpoint) -> set:
    """Ids in Ray's committed checkpoint files in ``checkpoint`` (a folder or a bucket URI; a killed
    write's are ``.pending``)."""
    files = [f for f, _ in Location.of(checkpoint).files() if not f.name.endswith(".pending.parquet")]
    return set(pd.concat([pd.read_parquet(f.path, filesystem=f.fs) for f in files]).iloc[:, 0]) if files else set()


def kill_when_checkpointed(proc: subprocess.Popen, checkpoint, timeout: float = 600) -> None:
    """SIGKILL the run and everything it started (kernel, Ray, engine) once a block is committed."""
    deadline = time.monotonic() + timeout
    while not committed_ids(checkpoint):
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, "no checkpoint was written in time"
        time.sleep(0.1)
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=30)  # the family includes Ray's daemons, started by the kernel


@pytest.mark.slow
@pytest.mark.extended  # 4 to 9 min on a 2-core machine: `make test-extended`
def test_text_run_on_a_csv_in_s3_with_a_limit_resumes_after_kill_with_exact_once_rows(s3, tmp_path):
    """With LIMIT (as job.yaml runs: LIMIT 10000, max_retries 2), a retry started from zero: resuming
    was off whenever LIMIT was set. Now the re-run takes the rest of the limit, each row once.

    In the extended set, with test_multinode's two-node test (the same case on a cluster whose
    worker node dies part-way). Every `make test` covers its parts elsewhere: a kernel killed part-way
    and the run resumed (captioning, in the live kernel), a text run interrupted and resumed with
    LIMIT (the live kernel), input from a bucket (the id check's run), a changed setting refused
    (test_bucket_output)."""
    # Small blocks and batches make the first run write often, so it can be killed part-way; the
    # re-run may use faster settings (resuming needs the same *results* settings, not the same layout).
    s3.upload_file(str(REPO / "helpers" / "sample_data" / "customers.csv"), BUCKET, "customers/part-0.csv")
    limit = 200  # of the sample's 309 rows
    source = {"INPUT_PATH": f"s3://{BUCKET}/customers/", "LIMIT": limit}  # a folder (prefix) of CSV files
    slow = {**source, "ENGINE": {"num_blocks": 40, "batch_size": 8, "max_concurrent_batches": 1}}
    out = tmp_path / "results" / "text_classification"
    proc = start("text_classification", tmp_path / "results", slow)
    kill_when_checkpointed(proc, out / "checkpoint")
    done_before = committed_ids(out / "checkpoint")
    assert 0 < len(done_before) < limit

    # A changed setting (a touched TEMPERATURE) stops the re-run before the pipeline, saying what
    # changed; the interrupted run's files stay byte for byte (they were deleted with one printed line).
    runner = load_script("run_notebooks")
    kept = {p: p.read_bytes() for p in sorted((out / "checkpoint").rglob("*")) + sorted((out / "parts").rglob("*"))
            if p.is_file()}
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "results", {**source, "ENGINE": {"num_blocks": 8}, "TEMPERATURE": 0.5})
    assert err.value.ename == "InterruptedRunError" and "sampling_params.temperature: 0.0 -> 0.5" in err.value.evalue
    assert f"{len(done_before)} rows finished" in err.value.evalue
    assert {p: p.read_bytes() for p in kept} == kept and committed_ids(out / "checkpoint") == done_before

    runner.run("text_classification", tmp_path / "results", {**source, "ENGINE": {"num_blocks": 8}})
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"].startswith("resuming an interrupted run")
    assert summary["rows written in this run"] == limit - len(done_before)
    assert summary["rows entering the pipeline in this run (Ray's count)"] == limit - len(done_before)
    assert summary["rows read"] == limit and summary["all rows accounted for"]
    predictions = pd.read_parquet(out / "predictions.parquet")
    errors = pd.read_parquet(out / "errors.parquet")
    ids = pd.concat([predictions["Customer Id"], errors["Customer Id"]])
    assert ids.is_unique and len(ids) == limit
    assert done_before <= set(predictions["Customer Id"]) | set(errors["Customer Id"])
    assert not committed_ids(out / "checkpoint")  # a finished run deletes its checkpoints
