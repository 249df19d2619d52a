import json

import pytest

from helpers import cluster, engine


def test_cpu_budget_always_leaves_room_for_one_task(monkeypatch):
    monkeypatch.setattr(engine.os, "cpu_count", lambda: 2)
    small = engine.CpuBudget(engine_cpus=1, engine_replicas=1, stage_cpus=0.1, stage_actors=1)
    assert small.reserved == pytest.approx(1.1)
    assert small.ray_cpus == 3  # 2 cores would leave 0.9 CPU: a 1-CPU task would wait forever
    big = engine.CpuBudget(engine_cpus=1, engine_replicas=4, stage_cpus=0.25, stage_actors=4)
    assert big.ray_cpus == 6
    monkeypatch.setattr(engine.os, "cpu_count", lambda: 64)
    assert big.ray_cpus == 64


def test_engine_placement_cpu_and_gpu():
    cpu = engine.engine_placement(None)
    assert cpu == {"accelerator_type": None, "placement_group_config": {"bundles": [{"CPU": 1.0}]}}
    assert engine.engine_placement("L4") == {"accelerator_type": "L4"}


def test_engine_env(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    env = engine.engine_env(1)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and "HF_HUB_OFFLINE" not in env
    assert env["VLLM_LOGGING_LEVEL"] == "WARNING"  # vLLM's start-up chatter stays out of the way
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")  # yours reaches the workers
    assert engine.engine_env(1)["VLLM_LOGGING_LEVEL"] == "INFO"
    assert engine.engine_env(1, log_level="DEBUG")["VLLM_LOGGING_LEVEL"] == "DEBUG"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert engine.engine_env(None)["HF_HUB_OFFLINE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in engine.engine_env(None)


def test_a_lone_local_cpu_engine_computes_on_every_core(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(engine.os, "sched_getaffinity", lambda pid: {0, 1, 3}, raising=False)
    assert engine.cpu_threads_bind(None, 1) == "0,1,3"
    assert engine.engine_env(1, threads_bind="0,1,3")["VLLM_CPU_OMP_THREADS_BIND"] == "0,1,3"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine.engine_env(1)
    assert engine.cpu_threads_bind("L4", 1) is None  # a GPU engine: vLLM's choice
    assert engine.cpu_threads_bind(None, 2) is None  # two replicas would fight over the same cores
    monkeypatch.setattr(engine.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert engine.cpu_threads_bind(None, 1) is None  # one core: nothing to gain
    monkeypatch.setattr(engine.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")  # as cluster.start_ray passes it:
    assert engine.cpu_threads_bind(None, 1, joined=cluster.cluster_address() is not None) is None  # not this machine's cores


def test_the_cluster_a_run_joins(monkeypatch, tmp_path):
    """RAY_ADDRESS; else a cluster `ray start` recorded in Ray's temp folder, if its GCS is alive (a
    stale record is ignored: ray.init() would try to join it and fail); RAY_ADDRESS=local: none."""
    from ray._private import services

    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert cluster.cluster_address() == "ray://head:10001"
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert cluster.cluster_address() is None
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert cluster.cluster_address() is None  # no record
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:6399")
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: frozenset())
    assert cluster.cluster_address() is None  # recorded, but that cluster is gone
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: frozenset({"127.0.0.1:6399"}))
    assert cluster.cluster_address() == "127.0.0.1:6399"
    monkeypatch.setattr(engine.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert engine.cpu_threads_bind(None, 1, joined=cluster.cluster_address() is not None) is None  # a shared cluster's


@pytest.mark.parametrize("value, arg, most", [(3, 3, 3), ([1, 4], (1, 4), 4), ((2, 2), (2, 2), 2)])
def test_concurrency(value, arg, most):
    assert engine.concurrency_arg(value) == arg
    assert engine.max_replicas(value) == most


def test_processor_config_accepts_cpu_placement():
    from ray.data.llm import vLLMEngineProcessorConfig

    config = vLLMEngineProcessorConfig(model_source="m", concurrency=engine.concurrency_arg([1, 2]),
                                       **engine.engine_placement(None))
    assert config.accelerator_type is None and config.concurrency == (1, 2)


def test_check_schedulable_names_the_missing_resources():
    budget = engine.CpuBudget(engine_cpus=1, engine_replicas=2, stage_cpus=0.1, stage_actors=2)
    cluster.check_schedulable({"CPU": 4.0}, budget, None)
    with pytest.raises(cluster.UnschedulableError, match=r"reserve 2.2 CPUs and tasks need 1 more, but the cluster has 3 CPUs"):
        cluster.check_schedulable({"CPU": 3.0}, budget, None)
    with pytest.raises(cluster.UnschedulableError, match="need 2 GPUs, but the cluster has 0"):
        cluster.check_schedulable({"CPU": 8.0}, budget, "L4")
    with pytest.raises(cluster.UnschedulableError, match=r"ACCELERATOR_TYPE='H100' is not in the cluster \(it has: \['L4'\]\)"):
        cluster.check_schedulable({"CPU": 8.0, "GPU": 2.0, "accelerator_type:L4": 1.0}, budget, "H100")
    cluster.check_schedulable({"CPU": 8.0, "GPU": 2.0, "accelerator_type:L4": 1.0}, budget, "L4")


def test_a_local_rays_job_has_no_runtime_env_and_a_hub_token_reaches_its_workers_by_inheritance(monkeypatch, tmp_path):
    """Ray shows a runtime_env in its Dashboard and keeps it in the GCS: the token is never in the
    engine's environment, the job's runtime_env or the session's repr; a local Ray's workers read it
    from the environment they inherit. The local job has no runtime_env at all: with one, Ray gave
    every short task a new worker process instead of the ones it starts with (the first read of a
    run waited ~7 s for them on 2 cores)."""
    import ray

    from helpers import fitting

    secret = "hf_kit_test_secret_4242"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert not any(secret in v for v in engine.engine_env(1).values())
    session = cluster.start_ray(fitting.select("text-cpu-offline", "text"), stage_cpus=0.1,
                                stage_actors_per_replica=1, kv_cache_gib=1, startup_timeout_s=60)
    try:
        assert secret not in repr(session) and secret not in session.describe()
        job_env = ray.get_runtime_context().runtime_env
        assert secret not in str(job_env)
        assert not job_env.get("env_vars") and "worker_process_setup_hook" not in job_env
        seen = ray.get(ray.remote(lambda: __import__("os").environ.get("HF_TOKEN")).options(
            runtime_env={"env_vars": session.engine_env}).remote())
        assert seen == secret  # what the engines get: inherited, not shipped
    finally:
        ray.shutdown()


def test_job_env_vars_are_left_to_the_job(monkeypatch):
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert engine.job_env_vars() == {}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR",
                       '{"runtime_env": {"working_dir": "gcs://x.zip", "env_vars": {"HF_HUB_OFFLINE": "1"}}, "metadata": {}}')
    assert engine.job_env_vars() == {"HF_HUB_OFFLINE": "1"}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE" not in engine.engine_env(1)  # the job sets it; setting it again is refused
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "not json")
    assert engine.job_env_vars() == {}


def test_every_actor_pool_starts_at_once(monkeypatch):
    # A positive wait_for_min_actors_s makes Ray Data start the stages' actor pools one after the
    # other: on the H100, 49 s of light stages before the engine could start.
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: None)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 2.0}}])
    budget = engine.CpuBudget(engine_cpus=1, engine_replicas=1, stage_cpus=0.1, stage_actors=2)
    ray.data.DataContext.get_current().use_datasource_v2 = True  # Ray 2.60's default
    assert cluster._init_ray(budget, {}) == {"CPU": 2.0, "nodes": [], "node_cpus": [2.0]}  # no GPU nodes
    assert ray.data.DataContext.get_current().wait_for_min_actors_s <= 0
    assert ray.data.DataContext.get_current().use_datasource_v2 is False  # parquet without 32 footer actors


def test_an_autoscaler_is_told_from_the_records_ray_keeps_in_the_gcs():
    """v2 marks itself in the GCS; v1's monitor writes ``ray status``'s report, whose node types are a
    cluster configuration's, or, on a cluster started without one, ``node_<id>`` that it cannot add."""
    from helpers import autoscale

    def status(types, time=1000.0, report=True):
        summary = {"active_nodes": {t: 1 for t in types}, "idle_nodes": {}, "pending_launches": {}, "pending_nodes": []}
        return json.dumps({"time": time, **({"autoscaler_report": summary} if report else {})}).encode()

    readonly = "node_" + "ab" * 28
    assert autoscaler_from(b"1", None, 1000) == "v2"
    assert autoscaler_from(None, status(["ray.head.default"]), 1001) == "v1"
    assert autoscaler_from(None, status([readonly]), 1001) is None  # `ray start --head` alone: nothing can be added
    # Nothing Ray reports on: the monitor's first round still to come, a monitor gone, none at all (a
    # platform's own autoscaler may be at work): asked and waited for, never refused at once.
    assert autoscaler_from(None, status([], report=False), 1001) == "unknown"
    assert autoscaler_from(None, status(["ray.head.default"]), 1000 + autoscale.STATUS_FRESH_S + 1) == "unknown"
    assert autoscaler_from(None, None, 1001) == "unknown"


def autoscaler_from(*args):
    from helpers import autoscale

    return autoscale.autoscaler_from(*args)


@pytest.fixture
def fake_autoscaler(monkeypatch):
    """``autoscale.wait_for`` against a scripted cluster: ``state["kind"]``, the resources each poll
    returns, whether v2 reports the request infeasible; ``state["requests"]`` records what was asked."""
    from helpers import autoscale

    state = {"kind": "v1", "polls": [], "infeasible": False, "requests": [], "said": [], "now": 0.0}

    def resources():
        return state["polls"].pop(0) if len(state["polls"]) > 1 else state["polls"][0]

    monkeypatch.setattr(autoscale, "detect", lambda: state["kind"])
    monkeypatch.setattr(autoscale, "_request", lambda kind, shapes: state["requests"].append(shapes) or 7)
    monkeypatch.setattr(autoscale, "_infeasible", lambda kind, version: state["infeasible"] and version == 7)
    monkeypatch.setattr(autoscale, "_resources", resources)
    monkeypatch.setattr(autoscale, "_alive_nodes", lambda: 2)
    monkeypatch.setattr(autoscale.time, "monotonic", lambda: state["now"])
    monkeypatch.setattr(autoscale.time, "sleep", lambda s: state.__setitem__("now", state["now"] + s))
    return state


def _wait(state, head, accelerator="L4", replicas=4, timeout_s=600):
    from helpers import autoscale

    budget = engine.CpuBudget(engine_cpus=1, engine_replicas=replicas, stage_cpus=0.1, stage_actors=replicas)
    shapes = autoscale.bundles(budget, accelerator, 1)
    found, why = autoscale.wait_for(head, shapes, lambda c: cluster.schedulability_problems(c, budget, accelerator),
                                    timeout_s=timeout_s, say=state["said"].append)
    return budget, shapes, found, why


def test_a_named_gpu_preset_asks_the_autoscaler_and_waits_for_the_gpus(fake_autoscaler):
    head = {"CPU": 2.0}
    grown = {"CPU": 18.0, "GPU": 4.0, "accelerator_type:L4": 4.0}
    fake_autoscaler["polls"] = [head, head, grown]
    budget, shapes, found, why = _wait(fake_autoscaler, head)
    assert found == grown and why == ""
    assert shapes[:4] == [{"CPU": 1, "GPU": 1, "accelerator_type:L4": 0.001}] * 4  # the replicas, as their actors ask
    assert sum(s["CPU"] for s in shapes) == pytest.approx(budget.reserved + budget.task_cpus)
    assert fake_autoscaler["requests"] == [shapes, []]  # asked, then withdrawn once the GPUs came
    waiting, came = fake_autoscaler["said"]
    assert waiting.startswith("Waiting up to 600 s (STARTUP_TIMEOUT_S) for the cluster's autoscaler to add nodes: ")
    assert "4 engine replicas x 1 GPU need 4 GPUs, but the cluster has 0" in waiting and "4 x {CPU: 1, GPU: 1" in waiting
    assert came == "The autoscaler added them in 10 s: the cluster has 18 CPUs and 4 GPUs (L4) on 2 nodes now."
    cluster.check_schedulable(found, budget, "L4", why=why)


def test_what_can_never_come_is_refused_at_once(fake_autoscaler):
    head = {"CPU": 2.0}
    fake_autoscaler.update(kind=None, polls=[head])
    budget, _, found, why = _wait(fake_autoscaler, head)
    assert why == "The cluster has no autoscaler that could add nodes." and fake_autoscaler["requests"] == []
    assert fake_autoscaler["said"] == [] and fake_autoscaler["now"] == 0  # no wait
    with pytest.raises(cluster.UnschedulableError, match=r"need 4 GPUs, but the cluster has 0\. The cluster has no "
                       r"autoscaler that could add nodes\. Set ACCELERATOR_TYPE=None"):
        cluster.check_schedulable(found, budget, "L4", why=why)

    fake_autoscaler.update(kind="v2", infeasible=True, requests=[], said=[])  # autoscaler v2: no node type has them
    _, shapes, _, why = _wait(fake_autoscaler, head, accelerator="H100")
    assert why == "The cluster's autoscaler reports that none of its node types can provide them."
    assert fake_autoscaler["requests"] == [shapes, []] and fake_autoscaler["now"] == 0


def test_a_cluster_that_does_not_grow_in_time_is_refused_and_the_request_withdrawn(fake_autoscaler):
    head = {"CPU": 2.0}
    fake_autoscaler["polls"] = [head]
    _, shapes, _, why = _wait(fake_autoscaler, head, timeout_s=30)
    assert why.startswith("The cluster's autoscaler did not add them within STARTUP_TIMEOUT_S=30 s")
    assert fake_autoscaler["requests"] == [shapes, []] and fake_autoscaler["now"] == 30


def test_a_cpu_preset_asks_for_cpus_only():
    from helpers import autoscale

    budget = engine.CpuBudget(engine_cpus=1, engine_replicas=1, stage_cpus=0.1, stage_actors=2)
    shapes = autoscale.bundles(budget, None)
    assert shapes == [{"CPU": 1}, {"CPU": 0.1}, {"CPU": 0.1}, {"CPU": 1.0}]
    assert autoscale.describe_bundles(shapes) == "2 x {CPU: 1}, 2 x {CPU: 0.1}"
