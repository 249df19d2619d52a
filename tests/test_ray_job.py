"""Open-source path: submit the text notebook as a Ray job to a real local cluster on 127.0.0.1."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def local_cluster(tmp_path_factory):
    """A Ray head node on loopback, stopped by PID afterwards (``ray stop`` would stop every Ray here)."""
    temp_dir = tmp_path_factory.mktemp("ray")
    gcs_port, dashboard_port = free_port(), free_port()
    ray_bin = Path(sys.executable).parent / "ray"
    before = {p.pid for p in psutil.process_iter()}
    subprocess.run([str(ray_bin), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(gcs_port),
                    "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port), "--num-cpus", "3",
                    "--temp-dir", str(temp_dir), "--disable-usage-stats"],
                   check=True, capture_output=True, timeout=180)
    started = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
               and str(temp_dir) in " ".join(p.info["cmdline"] or [])]
    try:
        yield f"http://127.0.0.1:{dashboard_port}"
    finally:
        family = set()
        for p in started:
            try:
                family |= {p, *p.children(recursive=True)}
            except psutil.NoSuchProcess:
                pass
        for p in family:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(list(family), timeout=30)


@pytest.mark.slow
def test_text_notebook_as_a_ray_job(local_cluster, tmp_path, monkeypatch):
    from ray.job_submission import JobStatus, JobSubmissionClient

    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # Ray 2.60 clusters require the local token
    client = JobSubmissionClient(local_cluster)
    out = tmp_path / "job-results"
    job_id = client.submit_job(
        entrypoint=f"python scripts/run_notebooks.py --only text_classification --out {out} -p LIMIT 24 -p NUM_BLOCKS 2",
        runtime_env={"working_dir": str(REPO), "excludes": [".venv", "results", ".git", "notebooks/results"],
                     "env_vars": {"HF_HUB_OFFLINE": "1"}},
    )
    deadline = time.monotonic() + 900
    while (status := client.get_job_status(job_id)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        assert time.monotonic() < deadline, "the job did not finish in 15 minutes"
        time.sleep(5)
    assert status == JobStatus.SUCCEEDED, client.get_job_logs(job_id)[-3000:]
    summary = json.loads((out / "text_classification" / "summary.json").read_text())
    assert summary["rows read"] == 24 and summary["all rows accounted for"]
    assert (out / "text_classification" / "text_classification.html").is_file()
    assert (out / "text_classification" / "predictions.parquet").is_file()
