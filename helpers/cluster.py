"""Joining or starting Ray for a run, what the cluster has, and whether the run can ever be scheduled on it."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from helpers import autoscale, engine, local_gpus, node_cache, topology
from helpers.engine import CpuBudget
from helpers.errors import Explained
from helpers.gpus import gpu_label, ray_label
from helpers.output_dir import prepare_output_dir
from helpers.outputs import RunOutputs, describe_request
from helpers.progress import dashboard, interactive


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


def parquet_reads_without_footer_actors() -> None:
    """Read parquet with Ray Data's first reader (``DataContext.use_datasource_v2 = False``, Ray's own
    switch, also ``RAY_DATA_USE_DATASOURCE_V2=0``). Ray 2.60's default reader starts a pool of 32
    footer-reading actors (``RAY_DATA_PARQUET_FOOTER_NUM_ACTORS``), each a worker process, for every
    read, however few the files. Ray's checkpoint filter reads the finished rows that way when a run
    resumes. The first 20 rows of a 26-row parquet file took 16-26 s each time on a 2-core machine,
    0.3-2.7 s with the first reader (benchmarks/RESULTS.md). The setting holds for this process's reads
    from now on."""
    import ray

    ray.data.DataContext.get_current().use_datasource_v2 = False


def _init_ray(budget: CpuBudget, env_vars: dict[str, str], verbose: bool = False,
              progress: bool | None = None) -> dict[str, Any]:
    """Connect to Ray, or start a local Ray sized by ``budget``; return the cluster's resources.

    On a cluster (:func:`cluster_address`: ``RAY_ADDRESS``, e.g. in a Ray job, or one ``ray start``
    left running on this machine), the cluster's own resources apply.
    ``verbose=False`` turns off Ray Data's INFO logs, which in a non-interactive run (papermill, a
    job) become thousands of log lines in the report. ``progress`` (default: ``verbose``) turns
    Ray Data's progress reports on or off on their own: outside a terminal Ray logs them as a
    short table every 10 seconds. Every node gets what the run's tasks read from the kit's cache, or
    the run stops here naming the node and the path (:mod:`helpers.node_cache`).

    Ray Data's default starts every stage's actors at once, and the kit keeps it. A positive
    ``wait_for_min_actors_s`` (the kit set one up to 2026-11-22, to bound the start) makes each
    actor pool wait for its actors before the next operator starts: on the H100 that put 36 s for
    the multimodal stage and 13 s for the chat template before the engine's 79 s.
    :func:`helpers.progress.first_results_within` bounds the wait instead;
    ``benchmarks/bench_startup.py`` measures both ways (Ray reads its default from
    ``RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S``).
    """
    import logging

    import ray

    parquet_reads_without_footer_actors()
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
    kwargs: dict[str, Any] = {"log_to_driver": verbose}
    address = cluster_address()
    if address is None:  # "local": never join a cluster by a stale record; sized for the pipeline
        # No job-wide runtime_env: a local Ray's workers inherit this process's environment and
        # cache, and the engines get theirs from the processor. Ray starts a worker process for
        # each task that asks for a runtime_env its ready workers lack: a job-wide one made the
        # first read wait ~7 s on a 2-core machine, and every light task a process of its own.
        kwargs.update(address="local", num_cpus=budget.ray_cpus)
    else:
        enable_token_auth_if_available()
        kwargs.update(address=address, runtime_env=node_cache.runtime_env({"env_vars": env_vars}))
    ray.init(**kwargs)
    node_cache.check_every_node_has()  # the offline model and sample images on every node, before any read
    return topology.read_cluster()


def visible_cluster(wait_s: float = 0, poll_s: float = 5, wanted: tuple[str, int] | None = None) -> dict[str, Any]:
    """What ``PRESET="auto"`` chooses from, in the shape of ``ray.cluster_resources()``.

    On a Ray cluster the run joins (:func:`cluster_address`): the cluster's
    resources, node by node, each GPU type's memory measured on one of its nodes. With ``RAY_ADDRESS``
    set (a Ray job, a remote cluster), it waits up to ``wait_s`` for GPU workers (a cluster that scales
    from zero shows none at first), asking its autoscaler for the ``wanted`` GPUs (type, count) where
    you named them (:func:`helpers.autoscale.wait_for_gpus`), and marks the result ``"remote": True``;
    a cluster ``ray start`` left running on this machine is read as it is.
    Otherwise: this machine's CUDA GPUs (type, count and memory, read from the driver without torch:
    :mod:`helpers.local_gpus`), which the local Ray will have. Before the run's own Ray start, so the
    run's CPU budget can follow the choice.
    """
    import os

    address = cluster_address()
    if address:
        import ray

        if not ray.is_initialized():
            enable_token_auth_if_available()
            ray.init(address=address, log_to_driver=False)
        remote = bool(os.environ.get("RAY_ADDRESS"))
        resources = topology.read_cluster()
        if remote and not resources.get("GPU") and wait_s:
            resources = autoscale.wait_for_gpus(resources, wanted, timeout_s=wait_s, poll_s=poll_s)
        return {**topology.with_measured_memory(resources), "remote": remote}
    cluster: dict[str, Any] = {"CPU": float(os.cpu_count() or 1)}
    gpus = local_gpus.read()  # CUDA's own numbers, without torch (see helpers.local_gpus)
    if gpus.count and gpus.name:
        label = gpu_label(gpus.name)
        cluster.update({"GPU": float(gpus.count), f"accelerator_type:{label}": 1.0, "gpu_memory_gib": gpus.memory_gib,
                        topology.NODES: [{"gpu_type": label, "gpus": gpus.count, "memory_gib": gpus.memory_gib}]})
    return cluster


class UnschedulableError(RuntimeError):
    """The run asks for resources the Ray cluster does not have: it would wait forever."""


def schedulability_problems(cluster: dict[str, float], budget: CpuBudget, accelerator_type: str | None,
                            gpus_per_replica: float = 1) -> list[str]:
    """What ``cluster`` lacks for the engine replicas and the actors' CPUs, in words ([]: nothing)."""
    problems = []
    cpus = cluster.get("CPU", 0.0)
    if budget.reserved + budget.task_cpus > cpus:
        problems.append(f"the actors reserve {budget.reserved:g} CPUs and tasks need {budget.task_cpus:g} more, "
                        f"but the cluster has {cpus:g} CPUs")
    else:  # node by node: every actor placed, and a light task's room left on some node
        actors = [budget.engine_cpus] * budget.engine_replicas + [budget.stage_cpus] * budget.stage_actors
        problems += topology.cpu_problems(cluster, actors, budget.stage_cpus or budget.task_cpus)
    if accelerator_type:
        needed = math.ceil(gpus_per_replica * budget.engine_replicas - 1e-9)
        have = cluster.get("GPU", 0.0)
        if have < needed:
            problems.append(f"{budget.engine_replicas} engine replicas x {gpus_per_replica:g} GPU need {needed} GPUs, "
                            f"but the cluster has {have:g}")
        else:
            problems += topology.gpu_problems(cluster, accelerator_type, gpus_per_replica, budget.engine_replicas)
    return problems


def check_schedulable(cluster: dict[str, float], budget: CpuBudget, accelerator_type: str | None,
                      gpus_per_replica: float = 1, why: str = "") -> None:
    """Fail fast, with numbers, when the engine replicas cannot all be placed on ``cluster``.

    Ray does not fail when a request can never be met: the tasks and actors wait. This turns the
    known cases into an error before anything starts: GPUs (of the requested type) missing, and
    actor CPU reservations that leave no room for the pipeline's short tasks. ``why``: what
    :func:`helpers.autoscale.wait_for` found, said after the numbers.
    """
    problems = schedulability_problems(cluster, budget, accelerator_type, gpus_per_replica)
    if problems:
        raise UnschedulableError("This run cannot be scheduled and would wait forever: " + "; ".join(problems)
                                 + (f". {why.rstrip('.')}" if why else "") + ". Set ACCELERATOR_TYPE=None to run on CPUs, "
                                 "lower CONCURRENCY, or use a bigger cluster.")


#: The DataContext entry that records which Ray session a dataset was read in (:meth:`Session.check_ready`).
OWNER_KEY = "llm_batch_kit.owner"


class NotReadyError(Explained, RuntimeError):
    """The run cell cannot start in this kernel's state; the message says which cell to run from."""


@dataclass(frozen=True)
class Session:
    """What :func:`start_ray` set up: the cluster's resources, the CPU budget, the engine's
    environment (for the processor's ``runtime_env``) and whether progress is shown."""

    cluster: dict[str, float]
    budget: engine.CpuBudget
    engine_env: dict[str, str]
    threads_bind: str | None
    progress: bool
    #: The processor-config fields that place the engine (:func:`helpers.engine.engine_placement`).
    placement: dict[str, Any] = field(default_factory=dict)
    stage_cpus: float = 0.1  # Ray CPUs each light stage holds (read, prompts, write)
    startup_timeout_s: float | None = 600  # the first results must be written within this (None: no limit)
    address: str | None = None  # the cluster joined (RAY_ADDRESS, or one running here); None: a local Ray
    batch_size: int = 0  # rows per engine batch: the rows of each block that enters the engine (0: as read)
    #: A token of this start, recorded in the datasets read after it (:data:`OWNER_KEY`).
    owner: str = ""
    #: This driver's connection to Ray: its node and job (a Ray started again, or joined again, has
    #: another pair; the driver's worker id stays the same).
    connection: str = ""

    def check_ready(self, ds) -> None:
        """Raise :class:`NotReadyError`, saying which cell to run from, unless Ray is the one this session
        started and ``ds`` was built in it. Called before anything touches the output folder: in
        Jupyter, re-running the run cell after the summary cell (which shuts Ray down) failed only
        after the earlier results were gone, and a dataset of the previous Ray session fails with
        Ray's "owner is unknown"."""
        import ray

        if not ray.is_initialized():
            raise NotReadyError("Ray is not running: the Summary cell shuts it down to free the engine's memory. "
                                "Run the notebook again from the 'Start Ray' cell down. Nothing in OUTPUT_DIR was touched.")
        if _connection() != self.connection:
            raise NotReadyError("Ray was started again after the 'Start Ray' cell ran. Run the notebook again from the "
                                "'Start Ray' cell down. Nothing in OUTPUT_DIR was touched.")
        built_in = ds.context.get_config(OWNER_KEY)
        if built_in != self.owner:
            raise NotReadyError("`ds` was read before Ray was last started, and Ray has forgotten its blocks. Run the "
                                "notebook again from the 'Read the data' cell down. Nothing in OUTPUT_DIR was touched.")

    def prepare_output(self, output_dir: str, ds, *, resume: bool, start_over: bool, settings: Mapping[str, Any],
                       request: Any = None) -> RunOutputs:
        """:meth:`check_ready`, then :func:`helpers.output_dir.prepare_output_dir`: the output folder is
        touched only once the run can start, and every node sees it before anything in it moves.
        ``request``: what your ``preprocess`` sends for an example row, recorded with the ``settings``
        (:func:`helpers.outputs.describe_request`), so a resume with another prompt or sampling is refused."""
        self.check_ready(ds)
        if request is not None:
            settings = {**settings, "request": describe_request(request)}
        return prepare_output_dir(output_dir, resume=resume, settings=settings, start_over=start_over, check_nodes=True)

    def describe(self) -> str:
        where = f"joined the Ray cluster at {self.address}" if self.address else "started a local Ray"
        return (f"{where}: {self.cluster.get('CPU', 0):g} CPUs and {self.cluster.get('GPU', 0):g} GPUs; this run "
                f"reserves {self.budget.reserved:g} CPUs for actors; engine cores: {self.threads_bind or 'chosen by vLLM'}; "
                f"progress: {'one line below the run cell, updated in place' if self.progress else 'a line in the log every minute'}"
                f"{dashboard()}")


def start_ray(run_config: Any, *, stage_cpus: float, stage_actors_per_replica: int, kv_cache_gib: float | None,
              startup_timeout_s: int = 600, verbose: bool = False) -> Session:
    """Start (or connect to) Ray for one run and fail fast if the run can never be scheduled.

    On a cluster that lacks the GPUs or CPUs the run needs, its autoscaler is asked for them and the
    start waits up to ``startup_timeout_s``, saying what it waits for and then what came
    (:func:`helpers.autoscale.wait_for`); without an autoscaler, or where it reports them infeasible,
    the run is refused at once.

    The engine holds one CPU per replica and each light actor stage ``stage_cpus`` per replica; a
    local Ray gets enough logical CPUs that short tasks never wait forever behind them
    (:class:`helpers.engine.CpuBudget`). A single local CPU engine computes on every core
    (:func:`helpers.engine.cpu_threads_bind`). Progress reports are on when a person steps through
    the notebook (:func:`interactive`) or with ``verbose``, off in papermill runs and jobs.
    """
    replicas = engine.max_replicas(run_config.concurrency)
    budget = engine.CpuBudget(engine_cpus=1, engine_replicas=replicas, stage_cpus=stage_cpus,
                              stage_actors=stage_actors_per_replica * replicas)
    threads = engine.cpu_threads_bind(run_config.accelerator_type, replicas, joined=cluster_address() is not None)
    env = engine.engine_env(kv_cache_gib, threads_bind=threads)
    progress = interactive()  # the kit's one line that updates in place; Ray's own reports only with verbose
    address = cluster_address()
    cluster = _init_ray(budget, env, verbose=verbose, progress=verbose)
    # Ray's label for the type (an A100-80G preset schedules on nodes Ray labelled A100)
    accelerator = ray_label(run_config.accelerator_type) if run_config.accelerator_type else None
    gpus = run_config.gpus_per_replica
    why = ""
    if address is not None and schedulability_problems(cluster, budget, accelerator, gpus):  # a cluster may grow
        cluster, why = autoscale.wait_for(cluster, autoscale.bundles(budget, accelerator, gpus or 1),
                                          lambda c: schedulability_problems(c, budget, accelerator, gpus),
                                          timeout_s=startup_timeout_s)
    check_schedulable(cluster, budget, accelerator, gpus, why=why)
    import uuid

    import ray

    owner = uuid.uuid4().hex
    ray.data.DataContext.get_current().set_config(OWNER_KEY, owner)  # datasets read from now on carry it
    return Session(cluster=cluster, budget=budget, engine_env=env, threads_bind=threads, progress=progress,
                   placement=engine.engine_placement(accelerator,
                                                     gpus_per_replica=run_config.gpus_per_replica or 1.0),
                   stage_cpus=stage_cpus, startup_timeout_s=startup_timeout_s, address=address,
                   batch_size=run_config.batch_size, owner=owner, connection=_connection())


def _connection() -> str:
    """This driver's connection to Ray: the node and the job it runs as."""
    import ray

    context = ray.get_runtime_context()
    return f"{context.get_node_id()}:{context.get_job_id()}"
