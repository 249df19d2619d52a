"""Real Ray clusters on 127.0.0.1, started with ``ray start`` as a user starts one, and a plain head node.

The helpers here start and stop the cluster tests' nodes (``ray_start``, ``stop_processes``; also
tests/test_multinode.py and tests/test_autoscaler.py). On a plain head (``local_cluster``: Ray's
monitor runs, with no autoscaling configuration) the notebook's ``cluster.start`` joins the cluster
``ray start`` left running where ``RAY_ADDRESS=auto`` says so, and a named GPU preset is refused at once. The text notebook as a Ray
job, submitted with the README's ``ray job submit``, runs on a cluster that scales from zero:
tests/test_autoscaler.py.
"""

import json
import re
import shutil
import tempfile
import os
from dataclasses import dataclass
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_processes(marker: str) -> set:
    """Every process whose command line names ``marker`` (a cluster's temp folder or address), with its
    children. An address is matched whole: 127.0.0.1:4123 is not found in 127.0.0.1:41234."""
    named = re.compile(re.escape(marker) + r"(?!\d)")
    found = set()
    for p in psutil.process_iter(["cmdline"]):
        try:
            if named.search(" ".join(p.info["cmdline"] or [])):
                found |= {p, *p.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    return found


def ray_start(args: list[str], env: dict, cluster: str, wrap=None, attempts: int = 3) -> None:
    """``ray start <args>`` for the cluster whose processes name ``cluster`` (its temp folder), tried
    again when the node's start-up ran out of time.

    A node's raylet waits a fixed time (not configurable in Ray 2.60) for its dashboard agent, a
    Python process, to report its port; on a loaded 2-core machine (CI) the agent's imports can take
    longer, the raylet aborts ("Timed out waiting for file .../dashboard_agent_listen_port_...") and
    ``ray start`` fails with "timed out during startup". Nothing of that node joined the cluster, so
    starting it again is safe once what the failed attempt left is stopped: a head's GCS holds the
    port, a worker's log monitor names the cluster (and keeps its mount namespace). Those are the
    cluster's processes that came during the attempt and do not descend from one that was there
    before it (a head's raylet may start workers meanwhile). ``wrap(command)``: the command as run
    (in a namespace of its own, say)."""
    command = [str(Path(sys.executable).parent / "ray"), "start", *args]
    # The token a machine has once Ray ran there (a local ray.init makes it): `ray start` turns token
    # authentication on where one exists, and needs one in token mode. Made here, so that a cluster test
    # run first, or alone, on a fresh machine starts the cluster the suite's other orders start.
    subprocess.run([command[0], "get-auth-token", "--generate"], env=env, capture_output=True, check=True, timeout=60)
    for attempt in range(1, attempts + 1):
        before = {p.pid for p in ray_processes(cluster)}
        started = subprocess.run(wrap(command) if wrap else command, env=env, capture_output=True, text=True,
                                 timeout=180)
        said = started.stdout[-2000:] + started.stderr[-2000:]
        if started.returncode == 0:
            return
        assert "timed out during startup" in said and attempt < attempts, said
        print(f"ray start {' '.join(args[:1])}: Ray's start-up wait ran out (attempt {attempt}); starting it again")
        left = []
        for p in ray_processes(cluster):
            try:
                if p.pid not in before and not any(parent.pid in before for parent in p.parents()):
                    left.append(p)
            except psutil.NoSuchProcess:
                pass
        _kill(left)


def stop_processes(*markers: str) -> set:
    """Kill every process whose command line names one of ``markers`` (a cluster's temp folder or
    address), with its children: a test's own cluster, never another Ray on the machine.

    Looked for again after each kill, until none is left: a raylet or the autoscaler can start a
    process (a worker that is still importing Ray, say) between the look and the kill, and that one
    would outlive them. Returns what the last look found: nothing, unless some still ran after 60 s."""
    deadline = time.monotonic() + 60
    while (found := set().union(*(ray_processes(m) for m in markers))) and time.monotonic() < deadline:
        _kill(found)
    return found


def _kill(processes) -> None:
    for p in processes:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(list(processes), timeout=30)


@dataclass(frozen=True)
class Cluster:
    dashboard: str  # the job API's address
    gcs: str  # what ray.init() joins
    ray_tmpdir: str  # RAY_TMPDIR under which Ray finds this cluster's record (ray_current_cluster)


def test_a_node_start_that_ran_out_of_time_is_tried_again_and_any_other_failure_is_not(tmp_path, capsys):
    """The retry in ``ray_start`` (CI's loaded 2-core machine), with a stand-in for ``ray start``:
    its first run fails as Ray's does when the raylet's wait for its agent runs out."""
    tries = tmp_path / "tries"

    def flaky(message: str):
        return lambda cmd: ["sh", "-c", f'echo x >> {tries}; [ "$(wc -l < {tries})" -gt 1 ] || '
                                        f'{{ echo "{message}" >&2; exit 1; }}']

    ray_start(["--address", "127.0.0.1:1"], dict(os.environ), str(tmp_path),
              wrap=flaky("The current node timed out during startup."))
    assert tries.read_text().count("x") == 2 and "starting it again" in capsys.readouterr().out
    tries.unlink()
    with pytest.raises(AssertionError, match="Address already in use"):
        ray_start(["--address", "127.0.0.1:1"], dict(os.environ), str(tmp_path), wrap=flaky("Address already in use"))
    assert tries.read_text().count("x") == 1  # not tried again


def test_a_process_started_between_the_look_and_the_kill_is_stopped_too_and_a_longer_address_is_not(
        tmp_path, monkeypatch):
    """``stop_processes`` looks again after each kill. The first look here is followed by a new process
    of the cluster, as when a raylet starts a worker in that moment; a process naming an address that
    only begins with the cluster's is another cluster's and is left alone."""
    marker, port = str(tmp_path / "ray"), free_port()
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    other = subprocess.Popen([*sleeper, f"--gcs-address=127.0.0.1:{port}0"])
    first = subprocess.Popen([*sleeper, f"--temp-dir={marker}"])
    late = []
    looked = ray_processes

    def look(m: str) -> set:
        found = looked(m)
        if not late:
            late.append(subprocess.Popen([*sleeper, f"--temp-dir={marker}"]))  # not found by the next look
        return found

    monkeypatch.setattr(sys.modules[__name__], "ray_processes", look)
    try:
        assert not stop_processes(marker, f"127.0.0.1:{port}")
        assert first.poll() is not None and late[0].poll() is not None
        assert other.poll() is None
    finally:
        for p in (other, first, *late):
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def local_cluster():
    """A Ray head node on loopback, one per test module, stopped by PID afterwards (``ray stop`` would
    stop every Ray here). Its temp folder is ``<ray_tmpdir>/ray``, its own: ``ray start`` records the cluster there, and a
    ``ray.init()`` finds the record only with ``RAY_TMPDIR=<ray_tmpdir>``, so the rest of the suite
    never joins it."""
    ray_tmpdir = tempfile.mkdtemp(prefix="kitray-")  # short: Ray's socket paths must stay under ~100 characters
    temp_dir = os.path.join(ray_tmpdir, "ray")
    gcs_port, dashboard_port = free_port(), free_port()
    try:
        ray_start(
            ["--head", "--node-ip-address", "127.0.0.1",
             "--port", str(gcs_port), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port),
             "--num-cpus", "3", "--temp-dir", temp_dir, "--disable-usage-stats",
             # Free ports for the node's agents too: their defaults may be taken by another Ray here.
             "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
             "--metrics-export-port", str(free_port()), "--runtime-env-agent-port", str(free_port())],
            # The cluster's environment is the kit's: job entrypoints run `python` from it.
            {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"},
            temp_dir)
        gcs = Path(temp_dir, "ray_current_cluster").read_text().strip()
        yield Cluster(f"http://127.0.0.1:{dashboard_port}", gcs, ray_tmpdir)
    finally:
        stop_processes(temp_dir)
        shutil.rmtree(ray_tmpdir, ignore_errors=True)


JOIN = """
from helpers import cluster
from helpers.presets import PRESETS
cluster.start(PRESETS["text-cpu-offline"].override(stage_cpus=0.1, startup_timeout_s=60))
"""


@pytest.mark.slow
def test_a_cluster_running_on_this_machine_is_joined_with_ray_address_auto_and_left_alone_without(local_cluster):
    """With a cluster from `ray start` on the machine (as many Ray users keep one), ``RAY_ADDRESS=auto``
    joins it, as Ray's own tools do (Ray 2.60's `ray start` turns token authentication on: the kit sends
    its token as Ray's own drivers would); without RAY_ADDRESS the run starts a Ray of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["RAY_TMPDIR"] = local_cluster.ray_tmpdir  # where ray.init() looks for the running cluster
    joined = subprocess.run([sys.executable, "-c", JOIN], env={**env, "RAY_ADDRESS": "auto"}, capture_output=True,
                            text=True, timeout=300)
    assert joined.returncode == 0, joined.stdout[-2000:] + joined.stderr[-3000:]
    assert "joined the Ray cluster at auto: 3 CPUs" in joined.stdout, joined.stdout[-2000:]
    alone = subprocess.run([sys.executable, "-c", JOIN], env=env, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0 and "started a local Ray" in alone.stdout, alone.stdout[-2000:] + alone.stderr[-3000:]


def start(env: dict, preset: str, timeout_s: int) -> tuple[dict, str]:
    """``cluster.start`` with ``preset`` in a driver of its own: ``{"cluster": ...}`` or ``{"refused": message}``,
    and what it printed."""
    result = subprocess.run([sys.executable, "-c", START, preset, str(timeout_s)], env=env, capture_output=True,
                            text=True, timeout=timeout_s + 120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    # The result's line: Ray's raylet may print a line of its own after it (its infeasible-task warning did).
    results = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert results, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(results[-1]), result.stdout + result.stderr


START = """
import json, sys
from helpers import cluster
from helpers.presets import PRESETS
try:
    cluster.start(PRESETS[sys.argv[1]].override(stage_cpus=0.1, startup_timeout_s=int(sys.argv[2])))
    print(json.dumps({"cluster": cluster.read_cluster()}))
except cluster.UnschedulableError as exc:
    print(json.dumps({"refused": str(exc)}))
"""


@pytest.mark.slow
def test_without_an_autoscaler_a_named_gpu_preset_is_refused_at_once(local_cluster):
    """A plain ``ray start --head`` (Ray's monitor runs, with nothing it can add): no wait, the numbers.
    (Clusters that do scale: tests/test_autoscaler.py.)"""
    import time

    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_ADDRESS": local_cluster.gcs}
    started = time.monotonic()
    refused, said = start(env, "text-llama8b-l4", 600)
    assert "accelerator_type='L4' is not in the cluster (it has: no GPUs). The cluster has no autoscaler" in \
        refused.get("refused", ""), refused
    assert "Waiting" not in said and time.monotonic() - started < 120
