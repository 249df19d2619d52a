"""Ray for a run: the GPUs read (this machine's, or a cluster's), Ray started or joined with room for
every stage, and a cluster's autoscaler asked for what is missing; a run that can never be scheduled,
or whose model folder some node does not see, is refused with the numbers instead of waiting forever.

The kit's only uses of Ray's internals are here, each marked ``Ray 2.60 internal`` with why."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.parameters import Explained, flag, raise_if
from helpers.presets import GPUS, ray_label

# --- the GPUs ------------------------------------------------------------------------------------


def _driver() -> Any:
    for name in ("libcuda.so.1", "libcuda.so"):
        with contextlib.suppress(OSError):  # not this name: the next (none: no driver, None)
            return ctypes.CDLL(name)


def local_gpus(driver: Any = None) -> tuple[int, str | None, float | None]:
    """This machine's CUDA GPUs (those ``CUDA_VISIBLE_DEVICES`` leaves): count, the first one's name and
    GiB, from the driver's library; any driver error reads as no GPU. Not torch: importing it took
    3-10 s of the first cell on GPU machines, and starts CUDA in the kernel."""
    driver = _driver() if driver is None else driver
    count, device, memory, text = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_size_t(0), ctypes.create_string_buffer(256)
    try:
        if (driver is None or driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0
                or count.value < 1 or driver.cuDeviceGet(ctypes.byref(device), 0) != 0
                or driver.cuDeviceGetName(text, ctypes.c_int(256), device) != 0
                or driver.cuDeviceTotalMem_v2(ctypes.byref(memory), device) != 0):
            return 0, None, None
    except AttributeError:  # not a CUDA driver
        return 0, None, None
    return count.value, text.value.decode(errors="replace"), memory.value / 1024**3


def gpu_label(device_name: str) -> str:
    """The ``accelerator_type`` Ray gives a node with this CUDA device ("NVIDIA L40S" is an L40S)."""
    # Ray 2.60 internal: Ray's own rule, so that "auto" names the type as Ray schedules it.
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

    return NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(device_name) or "unknown"


@dataclass(frozen=True)
class Gpus:
    """The GPUs a plan is made for: one type, its count on each node, one GPU's memory, and the rest."""

    gpu_type: str | None
    per_node: tuple[int, ...] = ()
    memory_gib: float | None = None
    memory_basis: str = "unknown"
    others: str = ""

    @property
    def count(self) -> int:
        return sum(self.per_node)

    def replicas(self, per_replica: int) -> int:
        return sum(n // max(1, per_replica) for n in self.per_node)

    def describe(self) -> str:
        nodes = f" on {len(self.per_node)} nodes ({' + '.join(map(str, self.per_node))})" if len(self.per_node) > 1 else ""
        memory = "memory unknown" if self.memory_gib is None else f"{self.memory_gib:.0f} GiB each, {self.memory_basis}"
        return f"{self.count} x {self.gpu_type or 'GPU of no reported type'}{nodes} ({memory}){self.others}"


def choose(cluster: Mapping[str, Any], gpu_type: str | None = None) -> Gpus:
    """The GPU type to plan for in ``cluster`` (:func:`visible`'s): ``gpu_type`` where named, else the
    most numerous; its memory as measured here, else the kit's table."""
    nodes = [n for n in cluster.get("nodes", []) if n["gpus"]]
    totals: dict[str | None, int] = {}
    for n in nodes:
        totals[n["gpu_type"]] = totals.get(n["gpu_type"], 0) + n["gpus"]
    chosen = ray_label(gpu_type) if gpu_type else min(totals, key=lambda t: (-totals[t], t or ""), default=None)
    mine = [n for n in nodes if n["gpu_type"] == chosen]
    measured = [n["memory_gib"] for n in mine if n.get("memory_gib")]
    table = GPUS.get(gpu_type or "") or GPUS.get(chosen or "")
    memory, basis = ((min(measured), "measured") if measured else
                     (table.memory_gib, f"not measured: the kit's table for {table.name}") if table else (None, "unknown"))
    others = ", ".join(f"{c} x {t or 'untyped'}" for t, c in sorted(totals.items(), key=str) if t != chosen)
    return Gpus(chosen, tuple(n["gpus"] for n in mine), memory, basis, f"; left out: {others}" if others else "")


def read_cluster() -> dict[str, Any]:
    """The running Ray cluster: its resources, each live node's CPUs, GPUs and GPU type (Ray's label)."""
    import ray

    nodes = []
    for node in ray.nodes():
        if node.get("Alive"):
            r = node.get("Resources") or {}
            types = sorted(k.split(":", 1)[1] for k in r if k.startswith("accelerator_type:"))
            nodes.append({"cpus": float(r.get("CPU", 0)), "gpus": int(r.get("GPU", 0)), "gpu_type": types[0] if types else None})
    return {**ray.cluster_resources(), "nodes": nodes}


def visible(wait_s: float = 0, wanted: tuple[str, int] | None = None) -> dict[str, Any]:
    """What ``PRESET="auto"`` plans on: the cluster ``RAY_ADDRESS`` names (one that scales from zero shows
    no GPUs until work asks: its autoscaler is asked for the ``wanted`` (type, count), waiting up to
    ``wait_s``), else this machine's GPUs, read before Ray starts."""
    address = os.environ.get("RAY_ADDRESS")
    if address and address != "local":
        import ray

        if not ray.is_initialized():
            _token_auth()
            ray.init(address=address, log_to_driver=False)
        found = read_cluster()
        if not found.get("GPU") and wait_s and wanted:
            gpu = {"GPU": 1.0, f"accelerator_type:{wanted[0]}": 0.001}
            found = wait_for(found, [dict(gpu) for _ in range(wanted[1])],
                             lambda c: gpu_problems(c, wanted[0], 1, wanted[1]), timeout_s=wait_s)[0]
        return {**found, "remote": True}
    count, name, memory_gib = local_gpus()
    node = {"cpus": float(os.cpu_count() or 1), "gpus": count, "gpu_type": gpu_label(name) if count and name else None,
            "memory_gib": memory_gib}
    return {"CPU": node["cpus"], "GPU": float(count), "nodes": [node]}


# --- what a run needs, and whether the cluster has it ---------------------------------------------


@dataclass(frozen=True)
class Needs:
    """What a run holds: engine replicas (a CPU each, and their GPUs), light stage actors, and room for
    a light task (actors hold their CPUs for the whole run; without that room Ray's tasks wait forever)."""

    replicas: int
    stage_actors: int
    stage_cpus: float
    gpu_type: str | None = None  # Ray's label
    gpus_per_replica: float = 0
    stages: int = 1  # pipeline-parallel stages: each stage's GPUs on one node
    task_cpus: float = 1.0

    @property
    def reserved(self) -> float:
        return self.replicas + self.stage_cpus * self.stage_actors

    def bundles(self) -> list[dict[str, float]]:
        """The shapes the autoscaler is asked for: each replica's (a bundle per GPU worker, as Ray Data
        LLM places tp x pp), each light actor's, a light task's."""
        engine: list[dict[str, float]] = [{"CPU": 1.0}]
        if self.gpu_type:
            gpu = {"GPU": min(self.gpus_per_replica, 1.0), f"accelerator_type:{self.gpu_type}": 0.001}
            engine = [{"CPU": 1.0, **gpu}] + [dict(gpu) for _ in range(round(self.gpus_per_replica) - 1)]
        light = [{"CPU": self.stage_cpus}] * self.stage_actors if self.stage_cpus else []
        return [dict(b) for _ in range(self.replicas) for b in engine] + [dict(b) for b in light] + [{"CPU": self.task_cpus}]


def gpu_problems(cluster: Mapping[str, Any], gpu_type: str, per_replica: float, replicas: int, stages: int = 1) -> list[str]:
    """What ``cluster`` lacks for ``replicas`` engines of ``per_replica`` GPUs each, node by node: each of a
    replica's pipeline ``stages`` (its tensor-parallel group) on one node."""
    label = ray_label(gpu_type)
    types = sorted({str(n["gpu_type"]) for n in cluster.get("nodes", []) if n["gpus"]})
    if label not in types:
        return [f"accelerator_type={gpu_type!r} is not in the cluster (it has: {types or 'no GPUs'})"]
    gpus, group = choose(cluster, label), per_replica / stages
    fit = (sum(int(n / group + 1e-9) for n in gpus.per_node) if group < 1 else gpus.replicas(math.ceil(group - 1e-9))) // stages
    if fit >= replicas:
        return []
    return [f"{replicas} engine replicas x {per_replica:g} GPU need {math.ceil(per_replica * replicas - 1e-9)} GPUs, "
            f"but the cluster has {gpus.describe()}, which holds {fit} (a tensor-parallel group's GPUs are on one node)"]


def problems(cluster: Mapping[str, Any], needs: Needs) -> list[str]:
    """What ``cluster`` lacks for ``needs``, in words: CPUs in all, then every actor placed node by node
    (largest first) with a light task's room left on some node, then GPUs."""
    found, free = [], sorted((n["cpus"] for n in cluster.get("nodes", [])), reverse=True)
    shown = " + ".join(f"{c:g}" for c in free)
    if needs.reserved + needs.task_cpus > cluster.get("CPU", 0.0):
        found.append(f"the actors reserve {needs.reserved:g} CPUs and tasks need {needs.task_cpus:g} more, but the "
                     f"cluster has {cluster.get('CPU', 0.0):g} CPUs")
    else:
        for need in sorted([1.0] * needs.replicas + [needs.stage_cpus] * needs.stage_actors, reverse=True):
            room = next((i for i, f in enumerate(free) if f + 1e-9 >= need), None)
            if room is None:
                found.append(f"an actor holding {need:g} CPUs fits on none of the nodes once the others are placed "
                             f"(nodes of {shown} CPUs)")
                break
            free[room] -= need
        if not found and free and max(free) + 1e-9 < needs.task_cpus:
            found.append(f"with the actors placed, no node keeps {needs.task_cpus:g} CPU free for the pipeline's tasks "
                         f"(nodes of {shown} CPUs)")
    if needs.gpu_type:
        found += gpu_problems(cluster, needs.gpu_type, needs.gpus_per_replica, needs.replicas, needs.stages)
    return found


def engines_per_node(replicas: int) -> int:
    """The fewest CPU engines (a CPU each) a node must hold for ``replicas`` to fit the cluster's nodes. Serve
    places no more on one: an engine replacing one of a lost node then never takes the CPUs that the run's
    stages need on the nodes left (it waits for a node, which an autoscaler adds)."""
    fits = [int(n["cpus"]) for n in read_cluster()["nodes"]]
    return next((k for k in range(1, replicas) if sum(min(k, f) for f in fits) >= replicas), replicas)


def shortfall(stage_cpus: float) -> str:
    """What a run lacks now, in Ray's and Serve's words ("" if nothing): a CPU for its stages, an engine running."""
    import ray
    from ray import serve

    total, free, job = ray.cluster_resources(), ray.available_resources(), ray.get_runtime_context().get_job_id()
    mine = [d for name, app in serve.status().applications.items() if name.endswith(f"-engines-{job}") for d in app.deployments.values()]
    lacks = [f"the run's stages need {stage_cpus:g} CPU each, and no node has it free"] if free.get("CPU", 0) < stage_cpus else []
    lacks += [f"no engine runs ({'; '.join(d.message for d in mine) or 'Serve says no more'})"] if mine and not any(
        d.replica_states.get("RUNNING") for d in mine) else []
    return "; ".join(lacks + [f"the cluster has {free.get('CPU', 0):g} of {total.get('CPU', 0):g} CPUs and {free.get('GPU', 0):g} "
                              f"of {total.get('GPU', 0):g} GPUs free; {sum(not n['Alive'] for n in ray.nodes())} node(s) lost"]) if lacks else ""


class UnschedulableError(Explained, RuntimeError):
    """The run asks for what the cluster does not have: Ray would wait forever."""


# --- a cluster's autoscaler ------------------------------------------------------------------------


def autoscaler_kind(v2_flag: bytes | None, status: bytes | None, now: float) -> str | None:
    """The cluster's autoscaler from the GCS's records: ``"v2"`` (it marks itself), ``"v1"`` (the monitor's
    report names node types of a cluster configuration), None (a fresh report of ``node_<id>`` types
    only: nothing can add a node) or ``"unknown"`` (no report, a stale one, a platform's own)."""
    if v2_flag == b"1":
        return "v2"
    try:
        report = json.loads(status or b"")
    except ValueError:
        return "unknown"
    summary = report.get("autoscaler_report") if now - float(report.get("time", 0)) <= 60 else None
    types = {*(summary.get("active_nodes") or {}), *(summary.get("idle_nodes") or {}), *(summary.get("pending_launches") or {}),
             *(n[1] for n in summary.get("pending_nodes") or [])} if summary else set()
    if not types:
        return "unknown"
    return "v1" if any(not (t.startswith("node_") and len(t) == 61) for t in types) else None


def detect_autoscaler(wait_s: float = 12) -> str | None:
    """:func:`autoscaler_kind` of this cluster, waiting up to ``wait_s`` for a monitor's first report."""
    # Ray 2.60 internal: the autoscaler's records in the GCS, as `ray status` reads them.
    import ray._raylet as raylet
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    deadline = time.monotonic() + wait_s
    while True:
        kind = autoscaler_kind(_internal_kv_get(raylet.GCS_AUTOSCALER_V2_ENABLED_KEY,
                                                namespace=raylet.GCS_AUTOSCALER_STATE_NAMESPACE),
                               _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS), time.time())
        if kind != "unknown" or time.monotonic() >= deadline:
            return kind
        time.sleep(2)


def wait_for(cluster: dict[str, Any], shapes: list[dict[str, float]], missing: Callable[[dict[str, Any]], list[str]],
             *, timeout_s: float, poll_s: float = 5) -> tuple[dict[str, Any], str]:
    """Ask the autoscaler for ``shapes`` and wait up to ``timeout_s`` until ``missing`` finds nothing;
    return the cluster and why it still falls short ("" if not): no autoscaler (said at once), or the time
    ran out. The request is always withdrawn: Ray would keep it for good."""
    from ray.autoscaler.sdk import request_resources

    from helpers.progress import say

    kind = detect_autoscaler()
    if kind is None:
        return cluster, "The cluster has no autoscaler that could add nodes."
    started = time.monotonic()
    request_resources(bundles=shapes)
    try:
        say(f"Waiting up to {timeout_s:g} s (startup_timeout_s) for the cluster's autoscaler to add nodes: "
            f"{'; '.join(missing(cluster))}.")
        while True:
            cluster = read_cluster()
            if not missing(cluster):
                say(f"The autoscaler added them in {time.monotonic() - started:.0f} s: the cluster has "
                    f"{cluster.get('CPU', 0):g} CPUs and {cluster.get('GPU', 0):g} GPUs now.")
                return cluster, ""
            if time.monotonic() - started >= timeout_s:
                return cluster, (f"The cluster's autoscaler did not add them within {timeout_s:g} s: see `ray status` "
                                 "for its node types, limits and failed launches.")
            time.sleep(poll_s)
    finally:
        try:
            request_resources(bundles=[])
        except Exception:  # a cluster gone: nothing to withdraw
            pass


# --- what every node must see ---------------------------------------------------------------------


def job_env() -> dict[str, Any]:
    """The enclosing Ray job's ``runtime_env`` ({} outside one): what ``ray.init`` must not set again."""
    try:
        return dict(json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}").get("runtime_env") or {})
    except (ValueError, AttributeError, TypeError):
        return {}


def blind_nodes(path: str, text: str, timeout_s: float = 120) -> list[str]:
    """The addresses of the live nodes where ``path`` does not read as ``text`` (none with one node): Ray's
    tasks read and write files on the node they run on. Read by a zero-CPU task pinned to each, never retried."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")] if ray.is_initialized() else []
    if len(nodes) <= 1:
        return []
    read = ray.remote(num_cpus=0, max_retries=0)(lambda p: Path(p).read_text() if Path(p).is_file() else "")
    refs = [read.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(path)
            for n in nodes]
    deadline, blind = time.monotonic() + timeout_s, []
    for node, ref in zip(nodes, refs):
        try:
            seen = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            seen = None  # no answer: that node is counted blind
        if seen != text:
            blind.append(node["NodeManagerAddress"])
    return blind


class NodeLocalModelError(Explained, RuntimeError):
    """The model's folder is on this machine only: engines on other nodes would not find it."""


def checkpoint_filter():
    """Ray Data's checkpoint filter for Arrow and pandas blocks: Ray 2.60's asserts every block is Arrow,
    and ``read_webdataset`` yields pandas ones (resuming a webdataset failed with a bare AssertionError)."""
    import pyarrow
    # Ray 2.60 internal: the filter class Ray's checkpointing uses, extended to pandas blocks.
    from ray.data.block import BlockAccessor
    from ray.data.checkpoint.checkpoint_filter import NumpyArrayBasedCheckpointFilter

    class AnyBlockCheckpointFilter(NumpyArrayBasedCheckpointFilter):
        def filter_rows_for_block(self, block):
            if not isinstance(block, pyarrow.Table) and len(block):
                block = BlockAccessor.for_block(block).to_arrow()
            return super().filter_rows_for_block(block)

    return AnyBlockCheckpointFilter


# --- starting Ray ----------------------------------------------------------------------------------


def _token_auth() -> None:
    """Ray 2.60's ``ray start`` turns token authentication on, and a driver sends its token only in token
    mode: Ray's own rule (token mode where a token exists and ``RAY_AUTH_MODE`` is unset) applied here."""
    try:  # Ray 2.60 internal: the function Ray runs for a cluster it starts itself.
        from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
    except ImportError:
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def engine_env(plan: Any, joined: bool) -> dict[str, str]:
    """The engines' environment variables, for the processor's ``runtime_env`` (Ray's Dashboard shows
    it: never a secret; ``HF_TOKEN`` reaches the engines from their own environment)."""
    env = {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"), "TOKENIZERS_PARALLELISM": "false",
           "VLLM_CPU_KVCACHE_SPACE": str(plan.kv_cache_gib),  # GiB, a whole number
           "VLLM_USE_FLASHINFER_SAMPLER": "0"}  # vLLM 0.29 builds it with nvcc on each new node: minutes
    if plan.one_process:  # vLLM's CPU platform turns "uni" into a worker process of its own otherwise
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env |= {"KIT_STARTUP_TIMEOUT_S": str(plan.startup_timeout_s), "KIT_STALL_TIMEOUT_S": str(plan.stall_timeout_s)}
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not plan.accelerator_type and plan.replicas == 1 and not joined and len(cores) > 1:
        # vLLM keeps one core back for its scheduler: on 2 cores a lone CPU engine took 1.8x as long.
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    env.update({name: os.environ[name] for name in ["HF_HUB_OFFLINE"] if os.environ.get(name)})
    taken = (job_env().get("env_vars") or {})  # Ray refuses a runtime_env that sets the job's variables again
    return {k: v for k, v in env.items() if k not in taken}


_connected: dict[str, tuple] = {}  # how this kernel started or joined Ray: a run with the same keeps it


def stop() -> None:
    """Ray stopped now where this kernel started it on this machine: its processes are the kernel's children,
    and Jupyter's kernel shutdown waits up to 29 s for each child before Ray's own shutdown runs at exit (past
    the 5 s Jupyter gives a kernel: papermill's SIGTERM, and Ray's stack trace in the log). A cluster this
    kernel joined runs on (others' engines live there): the kernel leaves it as it ends."""
    import ray

    started = _connected.pop("ray", None)
    if started and started[0] == "local" and ray.is_initialized() and started[-1] == ray.get_runtime_context().get_job_id():
        ray.shutdown()


def start(plan: Any, verbose: bool = False) -> dict[str, str]:
    """Join the cluster ``RAY_ADDRESS`` names (a Ray job sets it) or start Ray here with room for every
    stage; ask the autoscaler for what is missing; refuse what can never be scheduled, or a model folder
    some node does not see. Returns the engines' environment variables."""
    import ray
    import ray.serve  # noqa: F401  (importing it sets its logger's level: set here after, for the engines' start)

    raise_if(flag("VERBOSE", verbose))
    needs = Needs(plan.replicas, plan.replicas,  # an engine each, and the share of a CPU its sending tasks take
                  plan.stage_cpus, plan.ray_type, plan.gpus_per_replica, plan.pipeline_parallel_size)
    address = os.environ.get("RAY_ADDRESS")
    joined = bool(address) and address != "local"
    context = ray.data.DataContext.get_current()
    context.use_datasource_v2 = False  # Ray 2.60's parquet reader starts 32 actors per read: 16-26 s a resume
    context.enable_progress_bars = verbose  # the kit shows one line of its own
    if not verbose:  # notices a person cannot act on; VERBOSE keeps them
        context.issue_detectors_config.detectors = []  # memory hints every 30 s
        for name in ("ray.data", "ray.serve", "ray._private.worker", "ray._private.authentication",
                     "ray.data._internal.progress", *(n for n in list(logging.root.manager.loggerDict) if n.startswith("ray.llm"))):
            logging.getLogger(name).setLevel(logging.ERROR)
    env = engine_env(plan, joined)
    cpus = None if joined else max(os.cpu_count() or 1, math.ceil(needs.reserved + needs.task_cpus))
    wanted = (address if joined else "local", verbose, cpus)
    if ray.is_initialized() and _connected.get("ray") != (*wanted, ray.get_runtime_context().get_job_id()):
        ray.shutdown()  # kept only where this kernel started it so before: with it, the engines
    if not ray.is_initialized() and joined:
        _token_auth()
        ray.init(address=address, log_to_driver=verbose, runtime_env={"env_vars": env})
    elif not ray.is_initialized():  # a local Ray's workers inherit this process's environment
        ray.init(address="local", num_cpus=cpus, log_to_driver=verbose)
    _connected["ray"] = (*wanted, ray.get_runtime_context().get_job_id())
    cluster, why = read_cluster(), ""
    if joined and problems(cluster, needs):
        cluster, why = wait_for(cluster, needs.bundles(), lambda c: problems(c, needs), timeout_s=plan.startup_timeout_s)
    found = problems(cluster, needs)
    if found:
        raise UnschedulableError("This run cannot be scheduled and would wait forever: " + "; ".join(found)
                                 + (f". {why}" if why else "") + ". Set ENGINE={'accelerator_type': None} to run on "
                                 "CPUs, lower the concurrency, or use a bigger cluster.")
    config = Path(plan.model_path) / "config.json"
    blind = blind_nodes(str(config), config.read_text()) if config.is_file() else []
    if blind:
        raise NodeLocalModelError(
            f"The model's folder {config.parent} is on this machine only: {', '.join(blind)} do not see it, and "
            "engines placed there would not find it. Use a folder every node mounts (for the offline model, set "
            "LLM_KIT_CACHE to one, e.g. /mnt/cluster_storage/llm-kit-cache), or a Hugging Face id for MODEL_SOURCE.")
    print(f"{'joined the Ray cluster at ' + address if joined else 'started a local Ray'}: {cluster.get('CPU', 0):g} CPUs "
          f"and {cluster.get('GPU', 0):g} GPUs; the run's actors hold {needs.reserved:g} CPUs")
    return env
