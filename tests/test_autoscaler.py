"""A cluster that scales from zero, on Ray's own autoscaler: named presets wait for the nodes they need.

The head node has 1 CPU and an autoscaling configuration with Ray's fake multi-node provider: the
autoscaler (Ray's monitor on the head) "launches" a worker node by starting another raylet on this
machine. The text notebook runs as a Ray job, submitted with the README's ``ray job submit``: a
user's whole scenario (a spreadsheet's CSV behind a presigned URL, other columns and settings, a
token in the nodes' environment). First with ``PRESET="auto"``, which finds no GPUs there and asks
for a named preset; then with the CPU preset, which needs more CPUs than the head has: it must ask
the autoscaler, wait for a worker and run there. A GPU preset (fake L4s) waits for its GPU node the
same way, and one that asks for GPUs no node type has is refused once its wait is over (v1) or at
once (v2). ``PRESET="auto"`` with ``ENGINE["accelerator_type"]`` named asks for that GPU and runs the notebook on
the node that comes (vLLM's CPU build standing in for the GPU engine). A plain head with no autoscaling
configuration: tests/test_ray_job.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import yaml
from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

from conftest import REPO
from test_multinode import _node_ports
from test_ray_job import free_port, ray_processes, ray_start, start, stop_processes

CPU_WORKER = "ray.worker.cpu"
GPU_WORKER = "ray.worker.l4"


#: Ray's fake provider, with a ``runtime_env`` folder of its own for each node it launches. Its nodes run on
#: this machine and share the head's session folder, where real nodes each have a disk of their own: a
#: node's runtime_env agent unpacks a job's ``working_dir`` into that folder with ``overwrite=True`` (Ray 2.60,
#: ``WorkingDirPlugin.create``), so the first actor on a worker node removed and unpacked again the folder the
#: job's driver ran in on the head, and papermill's ``os.getcwd()`` failed there ("Removing .../working_dir_files/
#: _ray_pkg_..." in the worker's runtime_env_setup log). Ray's provider builds each node's ``RayParams`` under
#: ``self.lock`` from ``ray._private.parameter``; this gives them the node's own ``runtime_env_dir_name``.
OWN_FOLDERS_PROVIDER = """
import ray._private.parameter as parameter
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider


class Provider(FakeMultiNodeProvider):
    def _create_node_with_resources_and_labels(self, node_config, tags, count, resources, labels):
        with self.lock:
            ray_params, folder = parameter.RayParams, f"runtime_resources_node{self._next_node_id + 1}"
            parameter.RayParams = lambda **kwargs: ray_params(**kwargs, runtime_env_dir_name=folder)
            try:
                super()._create_node_with_resources_and_labels(node_config, tags, count, resources, labels)
            finally:
                parameter.RayParams = ray_params
"""


def cluster_config(gcs: str) -> dict:
    """An autoscaling configuration for the fake provider (the ``example.yaml`` that Ray's own
    ``AutoscalingCluster`` loads is not in the wheel): a 1-CPU head, up to two 3-CPU workers and one
    node of four fake L4 GPUs, none at the start. The provider is :data:`OWN_FOLDERS_PROVIDER`, named as an
    external module (``kit_fake_provider``, on the head's ``PYTHONPATH``): the autoscaler fills the
    configuration in with the minimal defaults (those of ``fake_multinode`` are not in the wheel either)."""
    return {
        "cluster_name": "kit-autoscale", "max_workers": 3, "upscaling_speed": 1.0, "idle_timeout_minutes": 5,
        "provider": {"type": "external", "module": "kit_fake_provider.Provider", "gcs_address": gcs,
                     "use_node_id_as_ip": True, "disable_node_updaters": True, "disable_launch_config_check": True},
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


@contextmanager
def autoscaling_cluster(v2: bool = False, dashboard_port: int | None = None, node_env: dict | None = None):
    """``(gcs address, env)``: a 1-CPU head whose autoscaler (Ray's monitor; ``v2``: autoscaler v2, set up
    as Ray's ``AutoscalingCluster`` does) runs the fake provider. Stopped by PID afterwards with every
    node it launched (never ``ray stop``), and checked: no process of it is left.

    ``dashboard_port``: the head's dashboard, and with it the job API (``ray job submit``), on
    ``http://127.0.0.1:<dashboard_port>``; without it, no dashboard. ``node_env``: variables the nodes
    start with (the head, and the worker nodes its autoscaler launches) and ``env`` does not hold, as a
    platform gives its nodes their secrets."""
    ray_tmpdir = tempfile.mkdtemp(prefix="kitas-")  # short: Ray's socket paths must stay under ~100 characters
    temp_dir = os.path.join(ray_tmpdir, "ray")
    port = free_port()
    gcs = f"127.0.0.1:{port}"
    config = cluster_config(gcs)
    if v2:  # as Ray's AutoscalingCluster sets v2 up
        config["provider"].update(launch_multiple=True, head_node_id=FAKE_HEAD_NODE_ID)
    Path(ray_tmpdir, "autoscaling.yaml").write_text(yaml.safe_dump(config))
    provider = Path(ray_tmpdir, "provider")  # a folder of its own: the temp folder holds one named `ray`
    provider.mkdir()
    (provider / "kit_fake_provider.py").write_text(OWN_FOLDERS_PROVIDER)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_FAKE_CLUSTER": "1", "RAY_TMPDIR": ray_tmpdir,
           "AUTOSCALER_UPDATE_INTERVAL_S": "2", "HF_HUB_OFFLINE": "1",
           # The worker nodes the monitor starts take this machine's loopback address, as the head has.
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for name in ("RAY_ADDRESS", *(node_env or {})):
        env.pop(name, None)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # Ray would refuse the fake GPU node more GPUs than it lists
    head_env = {**env, **(node_env or {}),
                "PYTHONPATH": os.pathsep.join(filter(None, (str(provider), os.environ.get("PYTHONPATH")))),
                **({"RAY_enable_autoscaler_v2": "1", "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
                    "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID} if v2 else {})}
    dashboard = (["--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port)] if dashboard_port
                 else ["--include-dashboard", "false"])
    try:
        ray_start(["--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "1",
                   "--autoscaling-config", str(Path(ray_tmpdir, "autoscaling.yaml")), "--temp-dir", temp_dir,
                   "--disable-usage-stats", *dashboard, *_node_ports()],
                  head_env, temp_dir)
        yield gcs, env
    finally:
        # The worker nodes' processes are the monitor's children and use the head's temp folder; what
        # one starts while it is stopped names the cluster's address (matched whole: 127.0.0.1:4123 is
        # not 127.0.0.1:41234).
        left = stop_processes(ray_tmpdir, gcs)
        shutil.rmtree(ray_tmpdir, ignore_errors=True)
        assert not left, [p.as_dict(["pid", "cmdline"]) for p in left]


@pytest.fixture
def autoscaling_head():
    """A head alone for each test: what one test's run left (an idle worker, the autoscaler's state after a
    notebook run) never decides whether the next one's nodes come. CI once waited 240 s in vain for the L4 node
    on the head a CPU run had used (here it comes in ~15 s either way; why it did not there is unknown: a
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


#: A token the nodes start with, as a platform's secret store gives it to them: it must reach no report.
NODE_SECRET = "hf_kit_test_secret_4242"


def submit_job(dashboard: str, env: dict, job_id: str, runtime_env: dict, out: Path,
               *params: str) -> tuple[str, str]:
    """The README's ``ray job submit ... -- python scripts/run_notebooks.py ...`` (the text notebook, ``-p NAME
    VALUE`` for each pair in ``params``), waited on to the end: the job's status (lower case) and its log."""
    ray_cli = str(Path(sys.executable).parent / "ray")
    command = [ray_cli, "job", "submit", "--address", dashboard, "--submission-id", job_id, "--no-wait",
               "--runtime-env-json", json.dumps(runtime_env), "--",
               "python", "scripts/run_notebooks.py", "--only", "text_classification", "--out", str(out), *params]
    for _ in range(20):  # the head's job agent takes a few seconds to come up after `ray start`
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        if "No available agent" not in result.stdout + result.stderr:
            break
        time.sleep(3)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:] + monitor_log(env)
    logs = subprocess.run([ray_cli, "job", "logs", "--address", dashboard, "--follow", job_id],
                          env=env, capture_output=True, text=True, timeout=900)
    status = subprocess.run([ray_cli, "job", "status", "--address", dashboard, job_id],
                            env=env, capture_output=True, text=True, timeout=60)
    return status.stdout.lower(), logs.stdout


def assert_no_secret_in_reports(folder: Path, *secrets: str) -> None:
    """No report the run wrote (``.json``, ``.ipynb``, ``.html``) holds any of ``secrets``."""
    for written in folder.iterdir():
        if written.suffix in (".json", ".ipynb", ".html"):
            text = written.read_text()
            assert not [s for s in secrets if s in text], written


@pytest.mark.slow
def test_a_job_on_a_cluster_that_scales_from_zero_on_a_spreadsheets_csv_behind_a_presigned_url(tmp_path,
                                                                                               http_folder):
    """A user's whole scenario: the README's ``ray job submit`` to a cluster that starts with a 1-CPU head
    and no worker, on any CSV as users get one (saved by a Windows spreadsheet, handed out as a presigned
    URL, served over HTTP on 127.0.0.1) with other columns than the sample's and settings overridden.

    ``PRESET="auto"`` finds no GPUs there (a cluster scaling from zero shows none) and asks for a named
    preset instead of running on CPUs; the CPU preset then waits for the autoscaler to add a worker,
    runs there and accounts for every row. The job joins the cluster, its progress goes to the job's log
    and not the report, and neither the URL's signature nor the nodes' HF_TOKEN reaches a report."""
    www, url = http_folder
    # cp1252, accented names (Ray's read stopped with "Failed to read CSV file" before the kit detected
    # the encoding). Walmart twice, exactly: with ids from content the two rows share one, and are each
    # answered.
    (www / "firms.csv").write_bytes(pd.DataFrame({
        "name": ["Walmart", "Walmart", "Pfizer", "", "Goldman Sachs", "Kirkland & Ellis", "Zillow", "Société Générale",
                 "   ", "Accenture", "Apple", "Nestlé", "Target"],
        "truth": ["Retail", "Retail", "Healthcare", "", "Finance", "Law Firm", "Real Estate", "Finance", "",
                  "Consulting", "Technology", "Other", "Retail"],
    }).to_csv(index=False).encode("cp1252"))
    signature = "0f1e2d3c4b5a-kit-signature"
    presigned = f"{url}/firms.csv?X-Amz-Credential=AKIAKIT%2F2026&X-Amz-Signature={signature}"
    secrets = (NODE_SECRET, signature, "AKIAKIT")
    params = ["-p", "INPUT_PATH", presigned, "-p", "TEXT_COLUMN", "name", "-p", "ID_COLUMN", "None",
              "-p", "LABEL_COLUMN", "truth",
              # LIMIT is the first 10 rows in file order, whatever the blocks (Ray's own limit took the first
              # blocks to arrive: CI once read a set with one blank).
              "-p", "LIMIT", "10"]
    engine = {"num_blocks": 5, "batch_size": 4}
    out = tmp_path / "job-results"
    report = out / "text_classification"
    # LLM_KIT_HEARTBEAT_S: a headless run's progress lines every 5 s (every minute by default). HF_TOKEN is
    # not in it: the kit never ships a secret in a runtime_env (Ray shows it), the nodes have it.
    runtime_env = {"working_dir": str(REPO), "excludes": [".venv", "results", ".git", "notebooks/results"],
                   "env_vars": {"HF_HUB_OFFLINE": "1", "LLM_KIT_HEARTBEAT_S": "5"}}
    dashboard_port = free_port()
    dashboard = f"http://127.0.0.1:{dashboard_port}"
    job_id = f"kit-test-{os.getpid()}"
    # The token reaches the nodes only (the client's environment has none: node_env).
    with autoscaling_cluster(dashboard_port=dashboard_port, node_env={"HF_TOKEN": NODE_SECRET}) as (gcs, env):
        assert [n.get("CPU") for n in alive_nodes(gcs, env)] == [1.0]  # the head alone

        status, logs = submit_job(dashboard, env, f"{job_id}-auto", runtime_env, out, *params,
                                  "-p", "ENGINE", repr({**engine, "startup_timeout_s": 10}))
        assert "failed" in status and "found no GPUs on the Ray cluster" in logs, (
            f"{status}\n--- the job's log\n{logs[-3000:]}\n--- the autoscaler's\n{monitor_log(env)}")
        assert_no_secret_in_reports(report, *secrets)

        status, logs = submit_job(dashboard, env, job_id, runtime_env, out, *params, "-p", "PRESET", "text-cpu-offline",
                                  "-p", "ENGINE", repr({**engine, "startup_timeout_s": 300}))
        # What a failing assertion below shows: the job's status and log, and the autoscaler's log.
        why = f"{status}\n--- the job's log\n{logs[-4000:]}\n--- the autoscaler's\n{monitor_log(env)}"
        assert "succeeded" in status, why
        # The autoscaler launched a 3-CPU worker, and the run said what it waited for, then what came:
        # below the cell (the report) and in the job's log (further down).
        cpus = sorted(n.get("CPU") for n in alive_nodes(gcs, env))
        assert cpus[0] == 1.0 and 3.0 in cpus, (cpus, why)  # the head, and a worker the autoscaler added
        # The token was there to leak: every node of the cluster, the worker it added too, started with it.
        raylets = [p for p in ray_processes(os.path.join(env["RAY_TMPDIR"], "ray")) if p.name() == "raylet"]
        assert len(raylets) >= 2 and all(p.environ().get("HF_TOKEN") == NODE_SECRET for p in raylets), raylets

    for name in ("text_classification.ipynb", "text_classification.html", "predictions.parquet",
                 "errors.parquet", "confusion_matrix.png", "label_counts.png", "summary.json"):
        assert (report / name).is_file(), (name, why)
    summary = json.loads((report / "summary.json").read_text())
    assert summary["rows read"] == 10, (summary, why)
    assert summary["rejected before the model"] == 2 and summary["engine errors"] == 0
    assert summary["classified"] == 8 and summary["all rows accounted for"]
    assert not summary["row ids unique"] and summary["rows identical to another (ids from content)"] == 1
    predictions = pd.read_parquet(report / "predictions.parquet")
    assert predictions["row_id"].nunique() == 7 and len(predictions["row_id"].iloc[0]) == 16  # content-hash ids
    assert (predictions["name"] == "Walmart").sum() == 2
    assert set(predictions["predicted_label"]) <= {"Law Firm", "Healthcare", "Technology", "Retail", "Consulting",
                                                   "Manufacturing", "Finance", "Real Estate", "Other"}
    assert set(predictions["name"]) == {"Walmart", "Pfizer", "Goldman Sachs", "Kirkland & Ellis", "Zillow",
                                        "Société Générale", "Accenture"}  # the first 10 rows, decoded
    errors = pd.read_parquet(report / "errors.parquet")
    assert sorted(errors["reason"]) == ["blank value (only whitespace)", "empty value"]
    html = (report / "text_classification.html").read_text()
    assert "accuracy:" in html and "all rows accounted for" in html and "(cp1252;" in html
    assert_no_secret_in_reports(report, *secrets)
    assert NODE_SECRET not in logs  # nor in the job's log, which Ray's dashboard shows
    # The job joined the cluster it runs on; its progress went to the job's log (the kernel's own
    # stderr, which papermill's terminal shows), not into the report.
    executed = (report / "text_classification.ipynb").read_text()
    assert "joined the Ray cluster at " in executed
    assert "[llm-batch-kit] pipeline started: a progress line every 5 s here" in logs, why
    assert "rows written, " in logs and "[llm-batch-kit]" not in executed, why
    said = cell_output(report / "text_classification.ipynb")
    for text in (said, logs):
        assert "for the cluster's autoscaler to add nodes: the actors reserve" in text, (text[-3000:], why)
        assert "but the cluster has 1 CPUs" in text and "The autoscaler added them in" in text, (text[-3000:], why)


@pytest.mark.slow
def test_a_named_gpu_preset_waits_for_its_gpus_and_one_no_node_type_has_is_refused(autoscaling_head):
    """Ray's tutorial preset (4 replicas x 1 L4) on the fake L4 node type; then A10Gs, which no node
    type has: autoscaler v1 tells only its own log so, so the run is refused once startup_timeout_s is over."""
    gcs, env = autoscaling_head
    env = {**env, "RAY_ADDRESS": gcs}

    found, said = start(env, "text-llama8b-l4", 240)
    assert found.get("cluster", {}).get("GPU") == 4 and "accelerator_type:L4" in found["cluster"], (found, monitor_log(env))
    assert "accelerator_type='L4' is not in the cluster (it has: no GPUs)" in said and "4 GPUs now" in said, said
    refused, said = start(env, "text-llama8b-a10g", 15)  # 4 replicas, as the L4 preset: only the GPU type is missing
    assert "accelerator_type='A10G' is not in the cluster (it has: ['L4'])" in refused.get("refused", ""), refused
    assert "did not add them within 15 s" in refused["refused"]


AUTO = """
import json, sys
from helpers import cluster, plans
planned = plans.fit("text", "auto", None, {"accelerator_type": sys.argv[1], "startup_timeout_s": 240, "stage_cpus": 0.1})
cluster.start(planned)
print(json.dumps({"gpus": cluster.read_cluster().get("GPU"), "planned": [planned.accelerator_type, planned.concurrency],
                  "ray_type": planned.ray_type}))
"""


#: Where the run's vLLM engine actors ran, from Ray's actor table in the GCS (what Ray's state API serves;
#: this cluster has no dashboard to serve it): each one's node, the resources it asked for, and the nodes.
ENGINES = """
import json, sys
import ray
from ray._private.state import state
from ray.core.generated import gcs_pb2
ray.init(address=sys.argv[1], log_to_driver=False)
actors = [gcs_pb2.ActorTableData.FromString(a) for a in state._connect_and_get_accessor().get_actor_table(None, None)]
print(json.dumps({
    "engines": [{"node": a.address.node_id.hex(), "resources": dict(a.required_resources)}
                for a in actors if a.class_name.startswith("ServeReplica:kit-engines-")],  # an engine's replica
    "nodes": {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}}))
"""


@pytest.mark.slow
@pytest.mark.extended  # 2-3 min on a 2-core machine (a job on a cluster from zero runs in CI): make test-extended
def test_auto_with_a_gpu_type_named_asks_a_cluster_that_scales_from_zero_for_it_and_runs_there(autoscaling_head,
                                                                                                 tmp_path):
    """PRESET="auto" on a cluster that starts with no GPU asked its autoscaler for nothing and waited out
    its start-up timeout. With ENGINE's accelerator_type named, the text notebook (the kit's runner, joined to the
    cluster with RAY_ADDRESS) asks for one such GPU, the autoscaler adds the fake L4 node type, auto plans
    on its 4 GPUs, and the run goes on there: its engine actor, which asks for a GPU and the L4 label, is
    placed on the node the autoscaler added, and every row of the LIMIT is accounted for.

    The fake GPUs cannot run CUDA; the engine that runs on them is vLLM's CPU build, with the settings
    auto planned for an L4 (vLLM's CPU build computes on the node's CPUs whatever GPU Ray hands the
    actor). One replica (concurrency 1: four CPU engines would not fit this machine's two cores); auto's
    plan of four, one per GPU, is checked after it, in a driver on the same cluster, as far as the Ray start."""
    from test_multinode import run_notebook

    gcs, env = autoscaling_head
    assert not [n for n in alive_nodes(gcs, env) if n.get("GPU")]  # no GPU: it scales from zero
    run = run_notebook({**env, "RAY_ADDRESS": gcs, "LLM_KIT_CELL_TIMEOUT": "600"}, str(tmp_path),
                       {"PRESET": "auto", "LIMIT": 8,
                        "ENGINE": {"accelerator_type": "L4", "concurrency": 1, "startup_timeout_s": 240}})
    report = tmp_path / "text_classification"
    said = run.stdout + run.stderr
    why = f"{said[-4000:]}\n--- the autoscaler's\n{monitor_log(env)}"
    assert run.returncode == 0, why
    notebook = cell_output(report / "text_classification.ipynb")
    assert ("for the cluster's autoscaler to add nodes: accelerator_type='L4' is not in the cluster (it has: no GPUs)"
            in notebook), notebook[-3000:]
    assert "The autoscaler added them in" in notebook and "auto: 4 x L4" in notebook, notebook[-3000:]

    found = subprocess.run([sys.executable, "-c", ENGINES, gcs], env=env, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr[-3000:]
    found = json.loads(found.stdout.strip().splitlines()[-1])
    # The autoscaler added the L4 node type (the only one with GPUs), and the one engine ran there.
    l4 = [node for node, resources in found["nodes"].items()
          if resources.get("GPU") == 4 and resources.get("accelerator_type:L4") == 1]
    assert len(l4) == 1, (found, why)
    assert [e["node"] for e in found["engines"]] == l4, (found, why)
    asked = found["engines"][0]["resources"]
    assert asked.get("GPU") == 1 and asked.get("accelerator_type:L4", 0) > 0, (asked, why)

    summary = json.loads((report / "summary.json").read_text())
    assert summary["rows read"] == 8 and summary["all rows accounted for"], (summary, why)
    assert summary["classified"] + summary["rejected before the model"] == 8 and summary["engine errors"] == 0, summary
    assert summary["classified"] > 0, summary

    result = subprocess.run([sys.executable, "-c", AUTO, "L4"], env={**env, "RAY_ADDRESS": gcs}, capture_output=True,
                            text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:] + monitor_log(env)
    planned = json.loads(result.stdout.strip().splitlines()[-1])
    assert planned["gpus"] == 4 and planned["planned"] == ["L4", 4], planned
    assert planned["ray_type"] == "L4"


@pytest.mark.slow
def test_autoscaler_v2_adds_the_l4s_a_preset_asks_for_and_a_gpu_no_node_type_has_is_refused_in_time():
    """Autoscaler v2 (``ray up``'s default in Ray 2.60): the tutorial preset waits for its L4s, which
    come; A10Gs, which no node type has, are refused once ``startup_timeout_s`` is over, naming what is
    missing. (The kit no longer reads v2's infeasible report: a Ray internal; benchmarks/RESULTS.md.)"""
    with autoscaling_cluster(v2=True) as (gcs, env):
        env = {**env, "RAY_ADDRESS": gcs}
        found, said = start(env, "text-llama8b-l4", 240)
        assert found.get("cluster", {}).get("GPU") == 4, (found, monitor_log(env))
        assert "is not in the cluster (it has: no GPUs)" in said and "The autoscaler added them in" in said, said
        started = time.monotonic()
        refused, said = start(env, "text-llama8b-a10g", 20)
        assert "accelerator_type='A10G' is not in the cluster" in refused.get("refused", ""), refused
        assert "did not add them within 20 s" in refused["refused"] and time.monotonic() - started < 120
