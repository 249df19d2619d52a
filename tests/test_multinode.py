"""A real Ray cluster of two nodes on this machine whose local disks differ, as two machines' do.

The worker node is started inside a mount namespace of its own (``unshare -m``) with a tmpfs over
one folder: on the head (and the driver) that folder is this machine's disk, on the worker it is
another, empty one. Ray Data writes each block's results on the node that holds it, so a run with
its ``OUTPUT_DIR`` there would leave the worker's results on the worker's "disk", lost to the
driver. The kit must stop before that (``helpers.output_dir.check_every_node_sees``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from test_ray_job import free_port, stop_processes

RAY = str(Path(sys.executable).parent / "ray")


def _unshare_works() -> str:
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"unshare -m is not permitted here: {probe.stderr.strip()}"


def _node_ports() -> list[str]:
    """Free ports for one node's own services (two nodes on one machine must not share them)."""
    return ["--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
            "--metrics-export-port", str(free_port()), "--runtime-env-agent-port", str(free_port())]


@pytest.fixture
def two_nodes(tmp_path):
    """``(gcs address, env, node_disk)``: a head and a worker node; ``node_disk`` is a folder the
    worker sees as an empty tmpfs of its own. Stopped by PID afterwards (never ``ray stop``)."""
    reason = _unshare_works()
    if reason:
        pytest.skip(reason)
    ray_tmpdir = tempfile.mkdtemp(prefix="kit2n-")  # short: Ray's socket paths must stay under ~100 characters
    temp_dir = os.path.join(ray_tmpdir, "ray")
    node_disk = tmp_path / "node-disk"
    node_disk.mkdir()
    # Ray 2.60's `ray start` turns token authentication on: the nodes and the driver share the token.
    env = {**os.environ, "RAY_AUTH_MODE": "token",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    try:
        head = subprocess.run(
            [RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(free_port()), "--num-cpus", "2",
             "--temp-dir", temp_dir, "--disable-usage-stats", "--include-dashboard", "false", *_node_ports()],
            env=env, capture_output=True, text=True, timeout=180)
        assert head.returncode == 0, head.stdout[-2000:] + head.stderr[-2000:]
        gcs = Path(temp_dir, "ray_current_cluster").read_text().strip()
        worker_start = " ".join([RAY, "start", "--address", gcs, "--node-ip-address", "127.0.0.1", "--num-cpus", "2",
                                 "--disable-usage-stats", *_node_ports()])
        worker = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             f"mount -t tmpfs kit-node-disk {node_disk} && exec {worker_start}"],
            env=env, capture_output=True, text=True, timeout=180)
        assert worker.returncode == 0, worker.stdout[-2000:] + worker.stderr[-2000:]
        yield gcs, env, node_disk
    finally:
        gcs = locals().get("gcs")
        stop_processes(temp_dir, *([gcs] if gcs else []))  # the worker's processes name the head's address
        shutil.rmtree(ray_tmpdir, ignore_errors=True)


CHECK = """
import json, sys
import ray
from helpers import cluster, engine, output_dir
ray.init(address=sys.argv[1], log_to_driver=False)
nodes = [n for n in ray.nodes() if n["Alive"]]
found = {"nodes": len(nodes)}
for name, folder in (("private", sys.argv[2]), ("shared", sys.argv[3])):
    try:
        found[name] = output_dir.check_every_node_sees(folder)
    except output_dir.NodeLocalOutputError as exc:
        found[name] = str(exc)
print(json.dumps(found))
"""


@pytest.mark.slow
def test_a_folder_one_node_does_not_see_stops_the_run_before_rows_are_lost(two_nodes, tmp_path):
    gcs, env, node_disk = two_nodes
    private = node_disk / "results"  # the driver's disk here; the worker's own tmpfs there
    private.mkdir()
    shared = tmp_path / "shared-results"  # the same folder on both nodes, as a shared mount is
    shared.mkdir()
    result = subprocess.run([sys.executable, "-c", CHECK, gcs, str(private), str(shared)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["nodes"] == 2
    assert found["shared"] == 2  # every node read the driver's marker back
    assert "1 of the Ray cluster's 2 nodes do not see" in found["private"], found
    assert "a folder every node mounts" in found["private"] and "a bucket (s3://" in found["private"]
    assert not list(private.glob(".node-check-*")) and not list(shared.glob(".node-check-*"))  # markers removed


def run_notebook(env: dict, out: str, params: dict, wait: bool = True):
    """The text notebook through the kit's runner, as a user runs it against the cluster (RAY_ADDRESS)."""
    from test_resume import REPO

    cmd = [sys.executable, str(REPO / "scripts" / "run_notebooks.py"), "--only", "text_classification", "--out", out]
    for name, value in params.items():
        cmd += ["-p", name, repr(value)]
    if not wait:
        return subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)


@pytest.mark.slow
def test_on_two_nodes_a_local_output_dir_stops_and_a_bucket_loses_and_duplicates_nothing_across_a_kill(
        s3, two_nodes, tmp_path):
    """The issue's run, on a real two-node cluster: the text notebook with a local OUTPUT_DIR the
    worker node cannot see stops with the message; with OUTPUT_DIR in a bucket (moto's S3 server,
    reached from both nodes), a run SIGKILLed part-way and run again accounts for every row once."""
    import pandas as pd

    from conftest import BUCKET
    from helpers import report
    from test_resume import committed_ids, kill_when_checkpointed

    gcs, env, node_disk = two_nodes
    env = {**env, "RAY_ADDRESS": gcs, "LLM_KIT_CELL_TIMEOUT": "900"}
    local = run_notebook(env, str(node_disk / "results"), {"LIMIT": 20, "PRESET": "text-cpu-offline"})
    assert local.returncode != 0
    assert "do not see" in local.stdout + local.stderr and "a bucket" in local.stdout + local.stderr

    limit = 120
    cpu = {"PRESET": "text-cpu-offline", "LIMIT": limit}  # "auto" never falls back to CPUs on a cluster
    slow = {**cpu, "NUM_BLOCKS": 30, "BATCH_SIZE": 4, "MAX_CONCURRENT_BATCHES": 1}
    root = f"s3://{BUCKET}/two-nodes"
    checkpoint = f"{root}/text_classification/checkpoint/results"
    kill_when_checkpointed(run_notebook(env, root, slow, wait=False), checkpoint)
    done_before = committed_ids(checkpoint)
    assert 0 < len(done_before) < limit

    resumed = run_notebook(env, root, {**cpu, "NUM_BLOCKS": 8})
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    folder = "two-nodes/text_classification/"

    def read(name):
        return s3.get_object(Bucket=BUCKET, Key=folder + name)["Body"].read()

    summary = json.loads(read("summary.json"))
    assert summary["run"].startswith("resuming an interrupted run")
    assert summary["rows read"] == limit and summary["all rows accounted for"]
    assert summary["rows written in this run"] == summary[report.ENTERED_NOW] == limit - len(done_before)
    import io

    predictions, errors = (pd.read_parquet(io.BytesIO(read(n))) for n in ("predictions.parquet", "errors.parquet"))
    ids = pd.concat([predictions["Customer Id"], errors["Customer Id"]])
    assert ids.is_unique and len(ids) == limit and done_before <= set(ids)
    listed = {o["Key"][len(folder):] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=folder)["Contents"]}
    assert {"text_classification.html", "text_classification.ipynb", "label_counts.png", "run.json"} <= listed
    assert not committed_ids(checkpoint)  # a finished run deletes its checkpoints
