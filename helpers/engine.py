"""Start Ray and choose the engine's resources: the part of the set-up that differs on CPU and GPU."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CpuBudget:
    """Ray's logical CPU budget for one pipeline.

    Ray schedules by logical CPUs, not by load. Actors hold their CPUs for the whole run; map,
    read and write tasks need theirs each time they start. If the actors' reservations leave less
    than one task's worth free, those tasks wait forever with no error (the silent back-pressure
    hang). ``ray_cpus`` therefore reserves room for every actor plus one default 1-CPU task.
    """

    engine_cpus: float
    engine_replicas: int
    stage_cpus: float
    stage_actors: int
    task_cpus: float = 1.0

    @property
    def reserved(self) -> float:
        return self.engine_cpus * self.engine_replicas + self.stage_cpus * self.stage_actors

    @property
    def ray_cpus(self) -> int:
        """Logical CPUs to start a local Ray with: the machine's cores, or more if the plan needs it."""
        return max(os.cpu_count() or 1, math.ceil(self.reserved + self.task_cpus))


def cluster_address() -> str | None:
    """The Ray cluster this run joins, found as ``ray.init()`` finds it: ``RAY_ADDRESS`` (a Ray job, a
    remote cluster), else the cluster that ``ray start`` left running on this machine (its address
    recorded in Ray's temp folder, its GCS process alive). ``None``: no cluster, start a local Ray.

    Ray's own rule is to join such a cluster even without ``RAY_ADDRESS``: the kit follows it
    (and then must not size the cluster: Ray refuses ``num_cpus`` when it connects). A record left
    by a cluster that is gone is ignored (``ray.init()`` would try to join it and fail)."""
    address = os.environ.get("RAY_ADDRESS") or None
    if address == "local":  # Ray's own word for "start one, join none"
        return None
    if address:
        return address
    from ray._private import services

    recorded = services.find_bootstrap_address(None)
    if recorded and recorded in set(services.find_gcs_addresses()):
        return recorded
    return None


def enable_token_auth_if_available() -> None:
    """Before joining a cluster: Ray 2.60's ``ray start`` turns token authentication on, but a driver
    that joins it sends its token only in token mode, so a plain join fails (``InvalidAuthToken``,
    retried for ~20 s). Ray's own rule for a local cluster it starts, token mode when
    ``RAY_AUTH_MODE`` is unset and a token exists (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``), is applied here too. A cluster without authentication accepts such a
    driver as well (tried). ``RAY_AUTH_MODE`` set by you always wins."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # another Ray: its own defaults apply
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def engine_placement(accelerator_type: str | None, engine_cpus: float = 1.0,
                     gpus_per_replica: float = 1.0) -> dict[str, Any]:
    """The processor-config fields that place the vLLM engine.

    On a GPU (``accelerator_type`` such as ``"L4"``), Ray's default is right for one or more whole
    GPUs per engine. Replicas that share a GPU (``gpus_per_replica`` below 1) each get a bundle with
    that share of it: Ray then places that many engines on each GPU. On a CPU, the engine must not
    ask for a GPU, so it gets a placement group with one CPU bundle and no accelerator.
    """
    if accelerator_type and gpus_per_replica < 1:
        return {"accelerator_type": accelerator_type,
                "placement_group_config": {"bundles": [{"GPU": gpus_per_replica, "CPU": engine_cpus}]}}
    if accelerator_type:
        return {"accelerator_type": accelerator_type}
    return {"accelerator_type": None, "placement_group_config": {"bundles": [{"CPU": engine_cpus}]}}


def cpu_threads_bind(accelerator_type: str | None, replicas: int) -> str | None:
    """The cores a lone CPU engine should compute on: all of this machine's (``"0,1"``), or
    ``None`` to leave vLLM's choice.

    vLLM's automatic binding keeps one core back for its scheduler process, which on a 2-core
    machine halves the compute: measured here, 2,000 SmolLM2 prompts took 1.8x as long. Only for a
    single CPU replica on a local Ray the run starts: replicas on one node would compete for the
    same cores, and on a cluster (:func:`cluster_address`) this machine's cores say nothing about
    the workers' or are shared with others.
    """
    if accelerator_type or replicas != 1 or cluster_address():
        return None
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return ",".join(str(c) for c in cores) if len(cores) > 1 else None


def engine_env(kv_cache_gib: float | None, log_level: str | None = None,
               threads_bind: str | None = None) -> dict[str, str]:
    """Environment variables for the engine workers (shipped through Ray's ``runtime_env``).

    ``VLLM_CPU_KVCACHE_SPACE`` caps vLLM's CPU KV cache in GiB (unset, it takes a large share of
    RAM); it is ignored on GPUs. ``threads_bind`` (see :func:`cpu_threads_bind`) sets
    ``VLLM_CPU_OMP_THREADS_BIND``, the cores a CPU engine computes on. ``HF_HUB_OFFLINE`` is set
    only when ``HF_HUB_OFFLINE`` is set here, so GPU users can still download models. vLLM logs
    at ``log_level``, else at the ``VLLM_LOGGING_LEVEL`` set here (``INFO`` shows its start-up
    steps with times in Ray's worker logs), else at ``WARNING``.
    """
    log_level = log_level or os.environ.get("VLLM_LOGGING_LEVEL") or "WARNING"
    env = {"VLLM_LOGGING_LEVEL": log_level, "TOKENIZERS_PARALLELISM": "false"}
    # A hub token for gated models travels to the workers from this process's environment only:
    # it is never a parameter, so it never lands in an executed notebook.
    if os.environ.get("HF_TOKEN"):
        env["HF_TOKEN"] = os.environ["HF_TOKEN"]
    if kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    if threads_bind:
        env["VLLM_CPU_OMP_THREADS_BIND"] = threads_bind
    if os.environ.get("HF_HUB_OFFLINE"):
        env["HF_HUB_OFFLINE"] = os.environ["HF_HUB_OFFLINE"]
    # Inside a Ray job, the job's runtime_env already reaches every worker, and Ray refuses any
    # ray.init runtime_env (the processor calls ray.init too) that sets the same variables again.
    job_vars = job_env_vars()
    return {k: v for k, v in env.items() if k not in job_vars}


def job_env_vars() -> dict[str, str]:
    """Environment variables the enclosing Ray job's runtime_env sets ({} outside a Ray job)."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return {}
    try:
        return dict((json.loads(raw).get("runtime_env") or {}).get("env_vars") or {})
    except (ValueError, AttributeError):
        return {}


def start_ray(budget: CpuBudget, env_vars: dict[str, str], verbose: bool = False,
              progress: bool | None = None) -> dict[str, Any]:
    """Connect to Ray, or start a local Ray sized by ``budget``; return the cluster's resources.

    On a cluster (:func:`cluster_address`: ``RAY_ADDRESS``, e.g. in a Ray job, or one ``ray start``
    left running on this machine), the cluster's own resources apply.
    ``verbose=False`` turns off Ray Data's INFO logs, which in a non-interactive run (papermill, a
    job) become thousands of log lines in the report. ``progress`` (default: ``verbose``) turns
    Ray Data's progress reports on or off on their own: outside a terminal Ray logs them as a
    short table every 10 seconds.

    Ray Data's default starts every stage's actors at once, and the kit keeps it. A positive
    ``wait_for_min_actors_s`` (the kit set one up to 2026-11-22, to bound the start) makes each
    actor pool wait for its actors before the next operator starts: on the H100 that put 36 s for
    the multimodal stage and 13 s for the chat template before the engine's 79 s.
    :func:`helpers.pipeline.first_results_within` bounds the wait instead;
    ``benchmarks/bench_startup.py`` measures both ways (Ray reads its default from
    ``RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S``).
    """
    import logging

    import ray

    context = ray.data.DataContext.get_current()
    progress = verbose if progress is None else progress
    context.enable_progress_bars = progress
    if not verbose:  # the memory-use hints repeat every 30 s for the tokenizer stages' ~0.5 GB
        context.issue_detectors_config.detectors = []
    logging.getLogger("ray.data").setLevel(logging.INFO if verbose else logging.WARNING)
    # Off, Ray would still warn once per run that progress bars are off: noise in a report.
    logging.getLogger("ray.data._internal.progress").setLevel(logging.INFO if progress else logging.ERROR)
    if not verbose:
        quiet_ray_notices()

    if ray.is_initialized():
        ray.shutdown()
    # Worker logs (vLLM's start-up chatter) only when verbose; errors still surface as exceptions.
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env_vars}, "log_to_driver": verbose}
    address = cluster_address()
    if address is None:  # "local": never join a cluster by a stale record; sized for the pipeline
        kwargs.update(address="local", num_cpus=budget.ray_cpus)
    else:
        enable_token_auth_if_available()
        kwargs["address"] = address
    ray.init(**kwargs)
    return ray.cluster_resources()


#: Loggers whose INFO and WARNING notices need nothing from a user of the kit (their messages): Ray's
#: start ("Started a local Ray instance", "Calling ray.init() again"), token authentication being on
#: (Ray 2.60's default; a notice, not a problem), Ray Data LLM's "No cloud storage mirror configured".
QUIET_LOGGERS = ("ray._private.worker", "ray._private.authentication")


def quiet_ray_notices() -> None:
    """Raise the loggers of :data:`QUIET_LOGGERS`, and Ray Data LLM's (each has a handler and level of
    its own), to ERROR: in a notebook each notice is a red line a person cannot act on. ``VERBOSE``
    keeps them."""
    import logging

    names = [*QUIET_LOGGERS, "ray.llm", *(n for n in list(logging.root.manager.loggerDict) if n.startswith("ray.llm."))]
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
    llm = logging.getLogger("ray.llm")
    if not llm.handlers:  # Ray Data LLM gives a logger made later a handler and INFO level of its own unless
        llm.addHandler(logging.NullHandler())  # "ray.llm" has a handler: then it inherits ERROR from here


def concurrency_arg(concurrency: int | str | list[int] | tuple[int, int]) -> int | tuple[int, int]:
    """Normalise ``CONCURRENCY``: papermill and YAML turn a tuple into a list, and papermill's ``-p``
    passes ``"(2, 2)"`` or ``"[2, 2]"`` as text; each becomes the tuple, a number stays a number.
    Text that is neither is returned as it is (the parameter checks name it)."""
    if isinstance(concurrency, str):
        import ast

        try:
            concurrency = ast.literal_eval(concurrency.strip())
        except (ValueError, SyntaxError):
            return concurrency  # type: ignore[return-value]
    return tuple(concurrency) if isinstance(concurrency, (list, tuple)) else concurrency  # type: ignore[return-value]


def actor_pool(concurrency: int | list[int] | tuple[int, int]) -> tuple[int, int]:
    """``concurrency`` as Ray Data LLM should get it: ``(n, n)``, a fixed pool of ``n`` engine replicas,
    for a number ``n``; a ``(min, max)`` pair as it is (an autoscaling pool). Ray 2.60's processor
    turns a bare ``n`` into an autoscaling pool of 1 to ``n`` (``ProcessorConfig.get_concurrency``):
    on an H100, "2 replicas" then ran as one for two thirds of a run (benchmarks/RESULTS.md)."""
    value = concurrency_arg(concurrency)
    return value if isinstance(value, tuple) else (int(value), int(value))  # type: ignore[return-value]


def describe_pool(concurrency: int | list[int] | tuple[int, int]) -> str:
    """What Ray runs for ``concurrency``, in words, for the settings table."""
    low, high = actor_pool(concurrency)
    if low == high:
        return f"Ray gets ({low}, {high}): a fixed pool of {high} replica{'s' if high > 1 else ''}, all started at once"
    return f"Ray gets ({low}, {high}): an autoscaling pool from {low} to {high} replicas"


def max_replicas(concurrency: int | list[int] | tuple[int, int]) -> int:
    """The most engine replicas ``CONCURRENCY`` can scale to."""
    return int(concurrency[-1]) if isinstance(concurrency, (list, tuple)) else int(concurrency)


class NodeLocalOutputError(RuntimeError):
    """``OUTPUT_DIR`` is a folder some of the cluster's nodes do not see: their results would be lost."""


def check_every_node_sees(folder, timeout_s: float = 120) -> int:
    """On a cluster of several nodes, check that every alive node sees ``folder`` (a local path), the
    way Ray Data's writes will use it; return how many nodes were checked.

    Ray Data's write tasks run on whichever node holds each block and write to *that node's* disk.
    With a folder on one machine's disk, the results (and the checkpoints resuming relies on) end up
    scattered over the nodes, and the driver finds only its own share: rows lost without an error.
    So the driver writes a marker with a fresh token into ``folder``, a zero-CPU task on each node
    reads it back, and any node that reads something else stops the run with
    :class:`NodeLocalOutputError`, naming the nodes. A single node is not checked."""
    import uuid
    from pathlib import Path

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) <= 1:
        return len(nodes)
    token = uuid.uuid4().hex
    marker = Path(folder) / f".node-check-{token}"
    marker.write_text(token)

    def read_marker(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError as exc:
            return f"({type(exc).__name__})"

    reader = ray.remote(num_cpus=0, max_retries=0)(read_marker)
    try:
        refs = {n["NodeID"]: reader.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(str(marker)) for n in nodes}
        seen = dict(zip(refs, ray.get(list(refs.values()), timeout=timeout_s)))
    finally:
        marker.unlink(missing_ok=True)
    blind = [n for n in nodes if seen[n["NodeID"]] != token]
    if blind:
        names = ", ".join(f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})" for n in blind)
        raise NodeLocalOutputError(
            f"OUTPUT_DIR={str(folder)!r} is a folder that {len(blind)} of the Ray cluster's {len(nodes)} nodes do not "
            f"see: {names}. Ray Data writes each block's results on the node that holds it, so those nodes' results, "
            "and the checkpoints that resuming needs, would land on their own disks and be missing here. Point "
            "OUTPUT_DIR at a bucket (s3://bucket/run, gs://...; AWS_ENDPOINT_URL for S3-compatible stores) or at a "
            "folder every node mounts (a shared file system: NFS, /mnt/cluster_storage on Anyscale).")
    return len(nodes)


class UnschedulableError(RuntimeError):
    """The run asks for resources the Ray cluster does not have: it would wait forever."""


def check_schedulable(cluster: dict[str, float], budget: CpuBudget, accelerator_type: str | None,
                      gpus_per_replica: float = 1) -> None:
    """Fail fast, with numbers, when the engine replicas cannot all be placed on ``cluster``.

    Ray does not fail when a request can never be met: the tasks and actors wait. This turns the
    known cases into an error before anything starts: GPUs (of the requested type) missing, and
    actor CPU reservations that leave no room for the pipeline's short tasks.
    """
    problems = []
    cpus = cluster.get("CPU", 0.0)
    if budget.reserved + budget.task_cpus > cpus:
        problems.append(f"the actors reserve {budget.reserved:g} CPUs and tasks need {budget.task_cpus:g} more, "
                        f"but the cluster has {cpus:g} CPUs")
    if accelerator_type:
        needed = math.ceil(gpus_per_replica * budget.engine_replicas - 1e-9)
        have = cluster.get("GPU", 0.0)
        if have < needed:
            problems.append(f"{budget.engine_replicas} engine replicas x {gpus_per_replica:g} GPU need {needed} GPUs, "
                            f"but the cluster has {have:g}")
        elif not any(k == f"accelerator_type:{accelerator_type}" for k in cluster):
            types = sorted(k.split(":", 1)[1] for k in cluster if k.startswith("accelerator_type:"))
            problems.append(f"ACCELERATOR_TYPE={accelerator_type!r} is not in the cluster (it has: {types or 'none'})")
    if problems:
        raise UnschedulableError("This run cannot be scheduled and would wait forever: " + "; ".join(problems)
                                 + ". Set ACCELERATOR_TYPE=None to run on CPUs, lower CONCURRENCY, or use a bigger cluster.")
