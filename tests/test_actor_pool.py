"""The replicas a run plans are the replicas Ray starts: every GPU configuration of either notebook
reaches Ray Data LLM's engine stage as a fixed actor pool (min == max), unless the user gives a
(min, max) pair. Ray 2.60 reads a bare integer ``concurrency=n`` as an autoscaling pool of 1..n.

The notebooks' own processor cells are executed (as they are committed) with GPU run configurations,
and the pool is read from the stages Ray built, the object that decides what Ray starts."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from helpers import engine, fitting, pipeline, presets

NOTEBOOKS = {"text": "text_classification", "vision": "vlm_captioning"}
H100 = {"GPU": 1.0, "accelerator_type:H100": 1.0, "gpu_memory_gib": 79.6, "CPU": 16.0}
EIGHT_A100 = {"GPU": 8.0, "accelerator_type:A100": 8.0, "gpu_memory_gib": 80.0, "CPU": 96.0}
FOUR_L4 = {"GPU": 4.0, "accelerator_type:L4": 4.0, "CPU": 48.0}


def _processor_cell(repo, notebook: str) -> str:
    cells = json.loads((repo / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
    (cell,) = [c for c in cells if c["cell_type"] == "code" and "vLLMEngineProcessorConfig(" in "".join(c["source"])]
    return "".join(cell["source"])


def _gpu_configs(task: str):
    """Every GPU configuration the notebook can run: each named GPU preset, and "auto" on three clusters."""
    for name, preset in presets.PRESETS.items():
        if preset.task == task and preset.accelerator_type:
            yield name, fitting.select(name, task)
    for label, cluster in (("auto on 1 H100", H100), ("auto on 8 A100", EIGHT_A100), ("auto on 4 L4", FOUR_L4)):
        yield label, fitting.select("auto", task, cluster=cluster)


def _engine_pool(repo, task: str, run_config, tmp_path):
    """Execute the notebook's processor cell for ``run_config``; the engine stage's actor pool."""
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    session = SimpleNamespace(engine_env={}, placement=engine.engine_placement(
        run_config.accelerator_type, gpus_per_replica=run_config.gpus_per_replica or 1.0))
    namespace = {
        "vLLMEngineProcessorConfig": vLLMEngineProcessorConfig, "build_processor": build_processor,
        "pipeline": pipeline, "run_config": run_config, "session": session, "model_path": str(tmp_path),
        "TRUST_REMOTE_CODE": False, "keep_columns": [], "carry": (),
        "preprocess": lambda row: {"messages": [], "sampling_params": {}}, "postprocess": lambda row: {},
        "example": {},
    }
    exec(compile(_processor_cell(repo, NOTEBOOKS[task]), f"{NOTEBOOKS[task]}: processor cell", "exec"), namespace)
    processor = namespace["processor"]
    # The light stages hold the CPUs the configuration resolved (1 on a GPU), as Ray gets them.
    assert processor.get_stage_by_name("ChatTemplateStage").map_batches_kwargs["num_cpus"] == run_config.stage_cpus
    return processor.get_stage_by_name("vLLMEngineStage").map_batches_kwargs["compute"]


def _blocks_per_replica(pool, run_config) -> int:
    """The blocks Ray Data sends one engine replica at a time, by Ray's own rule."""
    from ray.data._internal.execution.operators.actor_pool_map_operator import (
        DEFAULT_ACTOR_MAX_TASKS_IN_FLIGHT_TO_MAX_CONCURRENCY_FACTOR as FACTOR,
    )

    return pool.max_tasks_in_flight_per_actor or run_config.max_concurrent_batches * FACTOR


@pytest.mark.parametrize("task", ["text", "vision"])
def test_every_gpu_configuration_reaches_ray_as_a_fixed_pool(repo, task, local_ray, tmp_path):
    seen = []
    for label, run_config in _gpu_configs(task):
        pool = _engine_pool(repo, task, run_config, tmp_path)
        replicas = engine.max_replicas(run_config.concurrency)
        assert (pool.min_size, pool.max_size) == (replicas, replicas), f"{label}: {pool}"
        assert run_config.stage_cpus == 1.0, label  # light stages on a GPU: a CPU each
        if replicas > 1:  # enough blocks that the replica ready first cannot take them all
            assert run_config.num_blocks >= 2 * replicas * _blocks_per_replica(pool, run_config), label
        seen.append(label)
    assert len(seen) >= 5


def test_a_pair_you_give_autoscales_and_the_table_says_which(repo, local_ray, tmp_path):
    _, defaults = _defaults(repo)
    for given in ([2, 4], (2, 4), "(2, 4)", "[2, 4]"):
        run_config = fitting.from_parameters("text", {**defaults, "PRESET": "auto", "CONCURRENCY": given}, cluster=H100)
        assert run_config.concurrency == (2, 4)
        pool = _engine_pool(repo, "text", run_config, tmp_path)
        assert (pool.min_size, pool.max_size) == (2, 4)
        row = {r["parameter"]: r for r in fitting.describe(run_config, {**defaults, "CONCURRENCY": given})}["CONCURRENCY"]
        assert "autoscaling pool from 2 to 4" in row["why"] and row["from"] == "your parameter"
    shipped = fitting.from_parameters("text", {**defaults, "PRESET": "auto"}, cluster=H100)
    row = {r["parameter"]: r for r in fitting.describe(shipped, defaults)}["CONCURRENCY"]
    assert f"a fixed pool of {shipped.concurrency} replicas, all started at once" in row["why"]


def _defaults(repo):
    nb = json.loads((repo / "notebooks" / "text_classification.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    namespace: dict = {}
    exec("".join(cell["source"]), namespace)
    return cell, {k: v for k, v in namespace.items() if k.isupper()}


@pytest.mark.parametrize("text, ok", [("(2, 2)", True), ("[2, 2]", True), ("3", True), ("(3, 2)", False),
                                      ("two", False), ("(0, 2)", False), ("(1, 2, 3)", False)])
def test_concurrency_text_from_papermill(repo, text, ok):
    from helpers import params

    _, defaults = _defaults(repo)
    problems = params.text_problems({**defaults, "CONCURRENCY": text})
    assert (problems == []) is ok, problems


def _rows_per_replica(blocks: int, in_flight: int, gate, rows: int = 800) -> list[int]:
    import collections

    import ray

    # Defined here, so that Ray ships it by value: its workers cannot import the test module.
    class _Replica:
        """An engine replica stand-in: the first to start is ready at once; each holds its rows until the
        second is ready too (the light stages have finished long before the engines, as on a GPU)."""

        def __init__(self, gate: str):
            import os
            import time

            self.gate, self.pid = gate, os.getpid()
            try:
                os.mkdir(os.path.join(gate, "first"))
            except FileExistsError:
                time.sleep(2)  # the second replica starts later
                os.mkdir(os.path.join(gate, "second"))

        def __call__(self, batch):
            import os
            import time

            while not os.path.isdir(os.path.join(self.gate, "second")):
                time.sleep(0.05)
            return {"pid": [self.pid] * len(batch["id"])}

    ds = ray.data.range(rows, override_num_blocks=blocks).map_batches(
        _Replica, fn_constructor_kwargs={"gate": str(gate)}, batch_size=16, num_cpus=0.1,
        compute=ray.data.ActorPoolStrategy(min_size=2, max_size=2, max_tasks_in_flight_per_actor=in_flight))
    return sorted(collections.Counter(r["pid"] for r in ds.take_all()).values())


def test_the_replica_ready_first_leaves_blocks_for_the_others(local_ray, tmp_path):
    """Ray Data hands a ready replica up to ``2 x max_concurrent_batches`` blocks and stops replicas
    that are idle once the input is all handed out: with as many blocks as one replica holds, the
    first replica ready took them all (control), and on an H100 two engines for 10,000 images ran as
    one. With the blocks the kit plans (:func:`helpers.fitting.with_blocks_for_every_replica`) both work."""
    plan = fitting.with_blocks_for_every_replica(fitting.select("text-llama8b-l4", "text").override(
        concurrency=2, max_concurrent_batches=2, num_blocks=4))
    held = 2 * plan.max_concurrent_batches
    assert plan.num_blocks == 2 * 2 * held and dict(plan.reasons)["num_blocks"].startswith(f"{plan.num_blocks}: ")
    (tmp_path / "control").mkdir()
    assert _rows_per_replica(held, held, tmp_path / "control") == [800]  # one replica did every row
    (tmp_path / "kit").mkdir()
    shares = _rows_per_replica(plan.num_blocks, held, tmp_path / "kit")
    assert len(shares) == 2 and shares[0] >= 800 // 4, shares  # the second replica got its share


def test_a_short_run_gives_every_replica_its_share_of_few_batches(repo, local_ray, tmp_path):
    """A run of fewer batches than one replica takes at once (Ray's 2 x max_concurrent_batches):
    on an H100, 500 images in 32 batches ran on one of two engines. The kit's configuration for a
    short run reaches Ray through the notebook's processor cell, and with it both replicas work;
    with Ray's rule (control), the replica ready first took every batch."""
    _, defaults = _defaults(repo)
    short = fitting.from_parameters("text", {**defaults, "PRESET": "auto", "INPUT_PATH": "/data/customers.csv",
                                             "LIMIT": 1_000}, cluster=H100)
    batches = -(-1_000 // short.batch_size)
    assert short.concurrency == 2 and batches == 4 and short.max_tasks_in_flight_per_actor == 2
    pool = _engine_pool(repo, "text", short, tmp_path)
    assert pool.max_tasks_in_flight_per_actor == 2  # the notebook passes it to Ray's actor pool
    unfitted = short.override(max_tasks_in_flight_per_actor=None, max_concurrent_batches=6)
    held = _blocks_per_replica(_engine_pool(repo, "text", unfitted, tmp_path), unfitted)
    assert held >= batches  # Ray's rule: one replica may take them all
    (tmp_path / "control").mkdir()
    assert _rows_per_replica(batches, held, tmp_path / "control", rows=64) == [64]  # one replica did all
    (tmp_path / "kit").mkdir()
    assert _rows_per_replica(batches, pool.max_tasks_in_flight_per_actor, tmp_path / "kit", rows=64) == [32, 32]
