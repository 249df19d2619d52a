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


def test_a_hub_token_reaches_local_workers_by_inheritance_and_is_never_in_a_runtime_env(monkeypatch, tmp_path):
    """Ray shows a runtime_env in its Dashboard and keeps it in the GCS: the token is never in the
    engine's environment, the job's runtime_env or the session's repr; a local Ray's workers read it
    from the environment they inherit."""
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
        assert secret not in str(ray.get_runtime_context().runtime_env)
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
    budget = engine.CpuBudget(engine_cpus=1, engine_replicas=1, stage_cpus=0.1, stage_actors=2)
    assert cluster._init_ray(budget, {}) == {"CPU": 2.0}
    assert ray.data.DataContext.get_current().wait_for_min_actors_s <= 0
