"""A cluster that scales from zero, on Ray's own autoscaler: named presets wait for the nodes they need.

The head node has 1 CPU and an autoscaling configuration with Ray's fake multi-node provider: the
autoscaler (Ray's monitor on the head) "launches" a worker node by starting another raylet on this
machine. The text notebook with the CPU preset needs more CPUs than the head has, so it must ask the
autoscaler, wait for a worker and run there; a GPU preset (fake L4s) waits for its GPU node the same
way, and one that asks for GPUs no node type has is refused once its wait is over.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

from test_multinode import _node_ports, run_notebook
import test_ray_job
from test_ray_job import free_port, ray_processes, ray_start, stop_processes

local_cluster = test_ray_job.local_cluster  # a plain head node: Ray's monitor, no autoscaling configuration

FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider"
CPU_WORKER = "ray.worker.cpu"
GPU_WORKER = "ray.worker.l4"


def cluster_config(gcs: str) -> dict:
    """An autoscaling configuration for the fake provider (the ``example.yaml`` that Ray's own
    ``AutoscalingCluster`` loads is not in the wheel): a 1-CPU head, up to two 3-CPU workers and one
    node of four fake L4 GPUs, none at the start."""
    return {
        "cluster_name": "kit-autoscale", "max_workers": 3, "upscaling_speed": 1.0, "idle_timeout_minutes": 5,
        "provider": {"type": "fake_multinode", "gcs_address": gcs, "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
            CPU_WORKER: {"resources": {"CPU": 3, "object_store_memory": 300_000_000}, "node_config": {},
                         "min_workers": 0, "max_workers": 2},
            GPU_WORKER: {"resources": {"CPU": 6, "GPU": 4, "accelerator_type:L4": 1, "object_store_memory": 200_000_000},
                         "node_config": {}, "min_workers": 0, "max_workers": 1},
        },
        "head_node_type": "ray.head.default", "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
        "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


def raylets(marker: str) -> list[str]:
    """Command lines of the raylets and their workers and agents (``pgrep -af raylet``) that name ``marker``."""
    found = subprocess.run(["pgrep", "-af", "raylet"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in found if re.search(re.escape(marker) + r"(?!\d)", line)]


@contextmanager
def autoscaling_cluster(v2: bool = False):
    """``(gcs address, env)``: a 1-CPU head whose autoscaler (Ray's monitor; ``v2``: autoscaler v2, set up
    as Ray's ``AutoscalingCluster`` does) runs the fake provider. Stopped by PID afterwards with every
    node it launched (never ``ray stop``), and checked: no raylet of it is left."""
    ray_tmpdir = tempfile.mkdtemp(prefix="kitas-")  # short: Ray's socket paths must stay under ~100 characters
    temp_dir = os.path.join(ray_tmpdir, "ray")
    port = free_port()
    gcs = f"127.0.0.1:{port}"
    config = cluster_config(gcs)
    if v2:  # v2 fills a config in from its provider type's defaults, which for fake_multinode are not in the
        # wheel (example.yaml): named as an external module, the same provider gets the minimal defaults
        config["provider"].update(type="external", module=f"{FAKE_PROVIDER}.FakeMultiNodeProvider",
                                  launch_multiple=True, head_node_id=FAKE_HEAD_NODE_ID)
    Path(ray_tmpdir, "autoscaling.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_FAKE_CLUSTER": "1", "RAY_TMPDIR": ray_tmpdir,
           "AUTOSCALER_UPDATE_INTERVAL_S": "2", "HF_HUB_OFFLINE": "1",
           # The worker nodes the monitor starts take this machine's loopback address, as the head has.
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # Ray would refuse the fake GPU node more GPUs than it lists
    head_env = {**env, **({"RAY_enable_autoscaler_v2": "1", "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
                           "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID} if v2 else {})}
    try:
        ray_start(["--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "1",
                   "--autoscaling-config", str(Path(ray_tmpdir, "autoscaling.yaml")), "--temp-dir", temp_dir,
                   "--disable-usage-stats", "--include-dashboard", "false", *_node_ports()],
                  head_env, temp_dir)
        yield gcs, env
    finally:
        # The worker nodes' processes are the monitor's children and use the head's temp folder; the
        # address alone could match another cluster's (127.0.0.1:4123 in 127.0.0.1:41234).
        stop_processes(temp_dir)
        left = raylets(ray_tmpdir) + raylets(gcs)
        shutil.rmtree(ray_tmpdir, ignore_errors=True)
        assert not left and not ray_processes(temp_dir), left


@pytest.fixture
def autoscaling_head():
    """A head alone for each test: what one test's run left (an idle worker, the autoscaler's state after a
    notebook run) never decides whether the next one's nodes come. CI once waited 240 s in vain for the L4 node
    on the head the CPU test had used (here it comes in ~15 s either way; why it did not there is unknown: a
    failing wait now shows the autoscaler's log)."""
    with autoscaling_cluster() as head:
        yield head


NODES = """
import json, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False)
print(json.dumps([n["Resources"] for n in ray.nodes() if n["Alive"]]))
"""


def alive_nodes(gcs: str, env: dict) -> list[dict]:
    result = subprocess.run([sys.executable, "-c", NODES, gcs], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def cell_output(notebook: Path) -> str:
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


@pytest.mark.slow
def test_a_named_cpu_preset_waits_for_the_autoscaler_to_add_a_worker_and_accounts_for_every_row(
        autoscaling_head, tmp_path):
    gcs, env = autoscaling_head
    assert [n.get("CPU") for n in alive_nodes(gcs, env)] == [1.0]  # the head alone
    run = run_notebook({**env, "RAY_ADDRESS": gcs}, str(tmp_path / "out"),
                       {"LIMIT": 20, "PRESET": "text-cpu-offline", "STARTUP_TIMEOUT_S": 300})
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:] + monitor_log(env)
    summary = json.loads((tmp_path / "out" / "text_classification" / "summary.json").read_text())
    assert summary["rows read"] == 20 and summary["all rows accounted for"], summary
    # The autoscaler launched a 3-CPU worker, and the run said what it waited for, then what came:
    # below the cell (the report) and in the log (a job's).
    cpus = sorted(n.get("CPU") for n in alive_nodes(gcs, env))
    assert cpus[0] == 1.0 and 3.0 in cpus, cpus  # the head, and at least one worker the autoscaler added
    said = cell_output(tmp_path / "out" / "text_classification" / "text_classification.ipynb")
    for text in (said, log):
        assert "for the cluster's autoscaler to add nodes: the actors reserve" in text, text[-3000:]
        assert "but the cluster has 1 CPUs" in text and "The autoscaler added them in" in text


def monitor_log(env: dict, lines: int = 30) -> str:
    """What the autoscaler's own log (Ray's monitor on the head) says of launches, failed ones, errors and
    terminations, and its last ``lines`` (the latest status): v1 tells a driver none of it."""
    logs = Path(env["RAY_TMPDIR"], "ray", "session_latest", "logs")
    events = re.compile(r"Got \d+ nodes|Launching|Failed|Error|ERROR|Exception|Traceback|Terminating|[Ii]nfeasible|timed out")
    parts = []
    for f in sorted(logs.glob("monitor.*")):
        text = f.read_text(errors="replace").splitlines()
        if text:
            parts += [f"--- {f.name}: events", *[t for t in text if events.search(t)][-40:],
                      f"--- {f.name}: last {lines} lines", *text[-lines:]]
    return "\n".join(parts) or f"(no monitor log in {logs})"


def start(env: dict, preset: str, timeout_s: int) -> tuple[dict, str]:
    """``start_ray`` with ``preset`` in a driver of its own: ``{"cluster": ...}`` or ``{"refused": message}``,
    and what it printed."""
    result = subprocess.run([sys.executable, "-c", START, preset, str(timeout_s)], env=env, capture_output=True,
                            text=True, timeout=timeout_s + 120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stdout + result.stderr


START = """
import json, sys
from helpers import cluster, fitting
try:
    session = cluster.start_ray(fitting.select(sys.argv[1], "text"), stage_cpus=0.1, stage_actors_per_replica=1,
                                kv_cache_gib=None, startup_timeout_s=int(sys.argv[2]))
    print(json.dumps({"cluster": session.cluster}))
except cluster.UnschedulableError as exc:
    print(json.dumps({"refused": str(exc)}))
"""


@pytest.mark.slow
def test_a_named_gpu_preset_waits_for_its_gpus_and_one_no_node_type_has_is_refused(autoscaling_head):
    """Ray's tutorial preset (4 replicas x 1 L4) on the fake L4 node type; then A10Gs, which no node
    type has: autoscaler v1 tells only its own log so, so the run is refused once STARTUP_TIMEOUT_S is over."""
    gcs, env = autoscaling_head
    env = {**env, "RAY_ADDRESS": gcs}

    found, said = start(env, "text-llama8b-l4", 240)
    assert found.get("cluster", {}).get("GPU") == 4 and "accelerator_type:L4" in found["cluster"], (found, monitor_log(env))
    assert "4 engine replicas x 1 GPU need 4 GPUs, but the cluster has 0" in said and "GPUs (L4)" in said, said
    refused, said = start(env, "text-llama8b-a10g", 15)  # 4 replicas, as the L4 preset: only the GPU type is missing
    assert "ACCELERATOR_TYPE='A10G' is not in the cluster (it has: ['L4'])" in refused.get("refused", ""), refused
    assert "did not add them within STARTUP_TIMEOUT_S=15 s" in refused["refused"]


@pytest.mark.slow
def test_without_an_autoscaler_a_named_gpu_preset_is_refused_at_once(local_cluster):
    """A plain ``ray start --head`` (Ray's monitor runs, with nothing it can add): no wait, the numbers."""
    import time

    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_ADDRESS": local_cluster.gcs}
    started = time.monotonic()
    refused, said = start(env, "text-llama8b-l4", 600)
    assert "need 4 GPUs, but the cluster has 0. The cluster has no autoscaler" in refused.get("refused", ""), refused
    assert "Waiting" not in said and time.monotonic() - started < 120


@pytest.mark.slow
def test_autoscaler_v2_says_what_no_node_type_has_and_the_run_is_refused_without_waiting_it_out():
    """Autoscaler v2 (``ray up``'s default in Ray 2.60) reports requests no node type can hold: the
    run stops at once, not after STARTUP_TIMEOUT_S. The tutorial preset still waits for its L4s."""
    import time

    with autoscaling_cluster(v2=True) as (gcs, env):
        env = {**env, "RAY_ADDRESS": gcs}
        found, said = start(env, "text-llama8b-l4", 240)
        assert found.get("cluster", {}).get("GPU") == 4, (found, monitor_log(env))
        assert "need 4 GPUs, but the cluster has 0" in said and "The autoscaler added them in" in said, said
        started = time.monotonic()
        refused, said = start(env, "text-llama8b-a10g", 300)
        assert "reports that none of its node types can provide them" in refused.get("refused", ""), refused
        assert time.monotonic() - started < 120
