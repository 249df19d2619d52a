"""Around the processor: your functions guarded, every row written once with the columns your
postprocess returns, resumed after a failure, the start watched; on a real local Ray with a stand-in
engine between your mapped functions (as the kit's processor maps them), so each test takes seconds."""

from __future__ import annotations

import os
import time

import pandas as pd
import pyarrow as pa
import pytest

from helpers import pipeline, progress, report, run_folder
from helpers.pipeline import ENGINE, POSTPROCESS, REJECTED
from helpers.presets import PRESETS

LABELS = ["Retail", "Finance"]


def preprocess(row):
    if row["name"] == "raise":
        raise ValueError("no prompt for this one")
    return {"messages": [{"role": "user", "content": row["name"]}], "sampling_params": {"max_tokens": 4}, "name": row["name"]}


def postprocess(row):
    if row["name"] == "bad answer":
        raise KeyError("missing")
    return {"predicted_label": row["generated_text"], "answer_chars": len(row["generated_text"])}


def checked(post=postprocess):
    return pipeline.checked(preprocess, post, {"name": "Walmart"}, keep=["id", "name"])


def stand_in_processor(functions, fail_file=None, sleep_s=0.0, fail_on="39"):
    """What ``build_processor`` makes, with a stand-in engine between your mapped functions; rows named
    "engine fails" come back with the engine's error."""

    def engine(batch: pd.DataFrame) -> pd.DataFrame:
        if fail_file and os.path.exists(fail_file) and (batch[pipeline.INPUT + "id"] == fail_on).any():
            time.sleep(5)  # the other batches are written first
            raise RuntimeError("the node went away")  # the whole task: Ray's own failure, not a row's
        time.sleep(sleep_s)
        rows = []
        for d in batch.to_dict("records"):
            if not d.get("__inference_error__") and d[pipeline.INPUT + "name"] == "engine fails":
                d["__inference_error__"] = "RuntimeError: engine died on this one"
            elif not d.get("__inference_error__"):
                d.update(generated_text=LABELS[len(d[pipeline.INPUT + "name"]) % 2], generated_tokens=[1, 2], num_input_tokens=7,
                         num_generated_tokens=2)
            rows.append(d)
        return pd.DataFrame(rows)

    def processor(ds):  # as the kit's: what preprocess returns goes on; a failed row passes postprocess by
        ds = ds.map(functions.preprocess)
        ds = ds.map_batches(engine, batch_format="pandas", batch_size=4, num_cpus=0.5, max_retries=0)
        return ds.map(lambda row: row if row.get(pipeline.INFERENCE_ERROR) else functions.postprocess(row))

    return processor


def rows(n=20):
    names = [f"company {i}" for i in range(n)]
    names[1], names[2], names[5], names[7] = "", "raise", "engine fails", "bad answer"
    return pd.DataFrame({"id": [str(i) for i in range(n)], "name": names})


def with_ids(batch: pd.DataFrame) -> pd.DataFrame:
    """What the notebooks' readers add: each row's id, and why it is not sent to the model."""
    names = batch["name"].fillna("").astype(str)
    return batch.assign(**{pipeline.ROW_ID: batch["id"].astype(str),
                           pipeline.REJECT_REASON: ["" if n.strip() else "empty value" for n in names]})


def read(ray, tmp_path, frame):
    import pyarrow as pa
    import pyarrow.csv as pacsv

    frame.to_csv(tmp_path / "in.csv", index=False)
    as_text = pacsv.ConvertOptions(column_types={"id": pa.string(), "name": pa.string()})
    ds = ray.data.read_csv(str(tmp_path / "in.csv"), convert_options=as_text, override_num_blocks=len(frame) // 4)
    return ds.map_batches(with_ids, batch_format="pandas")


PLAN = PRESETS["text-cpu-offline"].override(batch_size=4, stage_cpus=0.1, startup_timeout_s=600)


def config_of(plan, **fields):
    """Ray Data LLM's config as the notebooks' config cell builds it from ``plan`` (the kit's waits in its variables)."""
    from ray.data.llm import vLLMEngineProcessorConfig

    waits = {"KIT_STARTUP_TIMEOUT_S": str(plan.startup_timeout_s), "KIT_STALL_TIMEOUT_S": str(plan.stall_timeout_s)}
    return vLLMEngineProcessorConfig(**{
        "model_source": plan.model_path or "model", "engine_kwargs": plan.engine_args, "concurrency": plan.actor_pool,
        "batch_size": plan.batch_size, "max_concurrent_batches": plan.max_concurrent_batches, "accelerator_type": plan.ray_type,
        "placement_group_config": plan.placement_group_config, "chat_template_stage": {"num_cpus": plan.stage_cpus},
        "should_continue_on_error": True, "log_engine_metrics": False, "runtime_env": {"env_vars": waits}, **fields})


def test_your_functions_are_tried_on_the_example_before_anything_runs():
    with pytest.raises(ValueError, match="your preprocess fails on the example row {'name': 'raise'}"):
        pipeline.checked(preprocess, postprocess, {"name": "raise"})
    with pytest.raises(ValueError, match="your postprocess fails on an empty answer"):
        pipeline.checked(preprocess, lambda row: {"n": row["nope"]}, {"name": "x"})
    with pytest.raises(TypeError, match=r"no table column can hold for \['when'\]"):
        pipeline.checked(preprocess, lambda row: {"when": object()}, {"name": "x"})
    with pytest.raises(ValueError, match=r"returns \['stage'\], which the kit sets"):
        pipeline.checked(preprocess, lambda row: {"stage": 1}, {"name": "x"})
    fns = checked()
    assert fns.columns == ("row_id", "id", "name", "predicted_label", "answer_chars", "num_input_tokens",
                           "num_generated_tokens", "error", "stage")
    assert fns.request["sampling_params"] == {"max_tokens": 4}


def test_one_rows_failure_is_that_rows_reason_never_the_runs():
    fns = checked()
    rejected = fns.preprocess({"name": "", "reject_reason": "empty value"})
    assert rejected["__inference_error__"] == "empty value" and rejected["stage"] == REJECTED
    assert rejected["sampling_params"] == {"max_tokens": 4}  # the example's request: one shape for every row
    raised = fns.preprocess({"name": "raise", "reject_reason": ""})
    assert raised["__inference_error__"] == "preprocess failed: ValueError: no prompt for this one"
    assert fns.preprocess({"name": "ok", "reject_reason": ""})["__inference_error__"] == ""
    assert {k: v for k, v in raised.items() if k.startswith("__input__")} == {
        "__input__row_id": None, "__input__id": None, "__input__name": "raise"}  # yours, out of the stages' way
    answer = {"__input__row_id": "r", "__input__id": "1", "name": "x", "__input__name": "x", "generated_text": "Retail",
              "num_input_tokens": 5}
    assert fns.postprocess(answer) == {"__input__row_id": "r", "__input__id": "1", "__input__name": "x", "predicted_label": "Retail",
                                       "answer_chars": 6, "num_input_tokens": 5, "num_generated_tokens": 0,
                                       "error": "", "stage": ""}
    failed = fns.postprocess({**answer, "name": "bad answer"})
    assert failed["stage"] == POSTPROCESS and "KeyError" in failed["error"] and failed["__input__id"] == "1"
    other = pipeline.checked(preprocess, lambda row: {"a": 1} if row["name"] != "y" else {"b": 2}, {"name": "x"})
    assert "did not return for the example (['b'])" in other.postprocess({**answer, "name": "y"})["error"]
    odd = pipeline.checked(preprocess, lambda row: {"a": 1} if row["name"] != "y" else {"a": object()}, {"name": "x"})
    assert "no table column can hold its values for ['a']" in odd.postprocess({**answer, "name": "y"})["error"]


def test_finish_gives_every_row_the_columns_and_its_stage_and_types_what_ray_pickled():
    from ray.data.extensions import ArrowPythonObjectArray

    fns = checked()
    table = pa.table({"__input__row_id": ["a", "b", "c"], "__input__id": ["1", "2", "3"], "__input__name": ["x", "y", "z"],
                      "name": ["replaced by a stage"] * 3,
                      "predicted_label": ["Retail", None, None], "answer_chars": [6, None, None],
                      "messages": [[{"role": "user", "content": "x"}]] * 3,
                      "__inference_error__": ["", "RuntimeError: engine died", "empty value"],
                      "stage": ["", "", REJECTED], "error": ["", None, None],
                      "num_input_tokens": [5, None, None], "num_generated_tokens": [2, None, None]})
    out = pipeline.finish(table, columns=fns.columns, kept=["id", "name"]).to_pandas()
    assert list(out.columns) == list(fns.columns) and out["stage"].tolist() == ["", ENGINE, REJECTED]
    assert out["error"].tolist() == ["", "RuntimeError: engine died", "empty value"]
    assert out["name"].tolist() == ["x", "y", "z"] and out["predicted_label"][1:].isna().all()
    assert out["num_input_tokens"].tolist() == [5, 0, 0]
    pickled = pa.table({"row_hash": ArrowPythonObjectArray.from_objects([2**64 - 1, 5]),
                        "mixed": ArrowPythonObjectArray.from_objects([1, "two"]), "__inference_error__": ["", ""]})
    typed = pipeline.finish(pickled, columns=["row_hash", "mixed", "error", "stage", *pipeline.TOKENS])
    assert typed.schema.field("row_hash").type == pa.uint64() and typed.column("mixed").to_pylist() == ["1", "two"]


def test_one_pass_writes_every_row_once_with_every_column_your_postprocess_returns(local_ray, tmp_path):
    """A column postprocess added (answer_chars) vanished: only declared outputs were kept."""
    fns = checked()
    run = run_folder.open_folder(str(tmp_path / "out")).start(PLAN, fns, id_column="id", settings={})
    written = pipeline.write(run, stand_in_processor(fns)(read(local_ray, tmp_path, rows())), "predictions.parquet")
    answered, errors = written.answered, written.errors
    assert len(answered) + len(errors) == 20 and written.rows_entered == written.rows_read == 20
    assert sorted(errors["stage"]) == sorted([POSTPROCESS, ENGINE, REJECTED, REJECTED])
    assert "answer_chars" in answered and (answered["answer_chars"] == answered["predicted_label"].str.len()).all()
    assert pd.read_parquet(tmp_path / "out" / "predictions.parquet")["answer_chars"].notna().all()
    assert set(errors.columns) >= {"row_id", "id", "name", "stage", "reason"} and errors["name"].notna().all()
    summary = report.summary(written)
    assert summary["all rows accounted for"] and summary["rows read"] == 20 and summary["classified"] == 16
    assert report.require(summary).splitlines()[0].startswith("at least one row read:")


def test_a_failed_run_resumes_where_it_stopped_and_writes_each_row_once(local_ray, tmp_path):
    fail = tmp_path / "fail-now"
    fail.write_text("")
    fns = checked()
    frame = rows(40)
    folder = run_folder.open_folder(str(tmp_path / "out"))
    run = folder.start(PLAN, fns, id_column="id", settings={})
    limited = pipeline.first_rows(read(local_ray, tmp_path, frame), 30)  # LIMIT 30 of the 40 rows
    with pytest.raises(Exception, match="the node went away"):
        pipeline.write(run, stand_in_processor(fns, str(fail), fail_on="29")(run.unfinished(limited, 30)), "predictions.parquet")
    fail.unlink()
    # The folder as checked before the failure: the rows done are counted as the run starts, not here.
    run = folder.start(PLAN, fns, id_column="id", settings={})
    written = pipeline.write(run, stand_in_processor(fns)(run.unfinished(limited, 30)), "predictions.parquet")
    ids = pd.concat([written.answered["id"], written.errors["id"]])
    assert run.resuming and sorted(ids, key=int) == [str(i) for i in range(30)]  # the first 30, each once
    assert written.rows_before == run.rows_done > 0 and written.rows_read == 30


def test_engines_that_do_not_start_in_time_fail_or_were_freed_stop_the_run_with_the_cause(monkeypatch):
    """The run cell waits for the first engine (``processor(ds)``), never forever: engines still starting
    after ``startup_timeout_s`` (a cluster that never gets its GPUs), a start that failed, or engines the
    last cell freed each stop it with one line saying why; one engine of two running is enough to begin
    (Serve sends requests to those running; on a cluster adding nodes the rest come later). The real
    start: test_notebook_runs and test_live_kernel."""
    from helpers import engines

    states = {"slow": ("DEPLOYING", 0, ""), "failed": ("DEPLOY_FAILED", 0, "RuntimeError: no GPU of type L4"),
              "half": ("DEPLOYING", 1, "")}
    freed = []
    monkeypatch.setattr(engines, "_state", lambda name: states[name])
    monkeypatch.setattr(engines, "free", lambda name, quiet=False: freed.append(name))
    slow = engines.Engines("slow", {}, 1)
    failed, half = engines.Engines("failed", {}), engines.Engines("half", {})
    for started in (slow, failed, half):
        monkeypatch.setitem(engines._kept, started.name, started)
    began = time.monotonic()
    with pytest.raises(engines.EngineStartError, match=r"did not start \(not ready in 1 s\).*startup_timeout_s"):
        engines.Processor(slow, config_of(PLAN))(None)
    assert 1 <= time.monotonic() - began < 10 and "slow" not in engines._kept and freed == ["slow"]  # let go
    with pytest.raises(engines.EngineStartError, match="DEPLOY_FAILED.*RuntimeError.*no GPU of type L4"):
        failed.ready()
    with pytest.raises(engines.EngineStartError, match="were stopped.*run the cells again from 'Start Ray and the engines'"):
        failed.ready()  # freed
    began = time.monotonic()
    assert half.ready() is half and time.monotonic() - began < 1 and "half" in engines._kept


def first_to_start(marker) -> bool:
    """True in the one replica of a stand-in deployment that starts first: it makes ``marker``, the others find it."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def test_the_run_begins_once_one_engine_answers_as_serve_itself_reports_it(local_ray, tmp_path, monkeypatch):
    """Serve's own status, not a stand-in: an application of two replicas, the second slow to start (a
    node the autoscaler adds later); ``ready()`` returns with one running while Serve still deploys the
    other, and ``free`` removes the application, the slow replica too."""
    from ray import serve

    from helpers import engines

    @serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0})
    class Engine:
        def __init__(self, first: str):
            import time

            if not first_to_start(first):
                time.sleep(120)  # the second engine

    serve.start(proxy_location="Disabled")
    name = "two-engines"
    serve.run_many([serve.RunTarget(Engine.options(name=name).bind(str(tmp_path / "first")), name=name, route_prefix=None)],
                   wait_for_applications_running=False)
    kept = engines.Engines(name, {}, 100)
    monkeypatch.setitem(engines._kept, name, kept)
    assert kept.ready() is kept and time.monotonic() - kept.started < 60
    assert engines._state(name)[:2] == ("DEPLOYING", 1)
    engines.free(kept, quiet=True)
    assert name not in serve.status().applications and name not in engines._kept


def test_each_engine_takes_max_concurrent_batches_at_once_so_one_that_starts_later_gets_its_share(local_ray, tmp_path,
                                                                                                   monkeypatch):
    """The kit's own deployment (its options, a stand-in's body: a batch at a time, 0.3 s each) and run stage.
    A first run begins with one engine up and every batch in flight at once: uncapped, Serve sent them all to
    that engine and the second, up a second later, got none; capped, Serve holds them for the next free one."""
    import asyncio
    import json

    import ray
    from ray import serve

    from helpers import engines

    class Engine:
        def __init__(self, *_):
            self.late = not first_to_start(tmp_path / "first")
            if self.late:  # the second engine: up a second after the first one's first batch
                while not (tmp_path / "calls").exists():
                    time.sleep(0.05)
                time.sleep(1)
            self.now, self.engine = 0, asyncio.Lock()

        async def generate(self, requests: list) -> list:
            self.now += 1
            with open(tmp_path / "calls", "a") as log:
                log.write(json.dumps([self.late, self.now]) + "\n")
            async with self.engine:
                await asyncio.sleep(0.3)
            self.now -= 1
            return [{"generated_text": "Retail", pipeline.INFERENCE_ERROR: ""} for _ in requests]

    config = config_of(PLAN.override(concurrency=2, max_concurrent_batches=2))
    name = "capped-engines"
    kits = engines._deployment(config, name)._bound_deployment  # the kit's deployment, options and all
    serve.start(proxy_location="Disabled")
    serve.run_many([serve.RunTarget(kits.options(func_or_class=Engine, ray_actor_options={"num_cpus": 0}).bind(),
                                    name=name, route_prefix=None)], wait_for_applications_running=False)
    kept = engines.Engines(name, {})
    monkeypatch.setitem(engines._kept, name, kept)
    request = {"messages": [{"role": "user", "content": "Walmart"}], "sampling_params": {"max_tokens": 4}}
    ds = ray.data.from_items([request] * 64, override_num_blocks=4)  # 16 batches of 4, all in flight at once
    try:
        answered = engines.Processor(kept, config)(ds).take_all()
    finally:
        engines.free(kept, quiet=True)
    calls = [json.loads(line) for line in (tmp_path / "calls").read_text().splitlines()]
    assert len(answered) == 64 and len(calls) == 16
    assert max(now for _, now in calls) <= config.max_concurrent_batches  # never more at once than it works on
    assert sum(late for late, _ in calls) >= 4, calls  # the engine that started later got its share


def test_a_batch_whose_engine_dies_is_answered_by_another_and_a_run_that_stops_moving_ends_saying_why(local_ray, tmp_path,
                                                                                                       monkeypatch):
    """The kit's own deployment and run stage, a stand-in's body: the engine that starts first dies (its process
    exits, as a lost node's or a killed engine's does) on its first batch. That batch goes to an engine that lives
    (Serve's, or its replacement) and every row is answered: none failed, none lost, none twice. Then a run whose
    stages no node can take any more (every CPU held): it stops once no row came for ``stall_timeout_s``, naming
    what the cluster lacks, instead of waiting for ever."""
    import json

    import ray
    from ray import serve

    from helpers import engines

    class Engine:
        def __init__(self, *_):
            self.first = first_to_start(tmp_path / "first")

        async def generate(self, requests: list) -> list:
            with open(tmp_path / "calls", "a") as log:
                log.write(json.dumps([self.first, len(requests)]) + "\n")
            if self.first:
                os._exit(1)  # the engine's process dies with the batch in it
            return [{"generated_text": r["messages"][0]["content"], pipeline.INFERENCE_ERROR: ""} for r in requests]

    config = config_of(PLAN.override(concurrency=2, max_concurrent_batches=2, stall_timeout_s=60))
    name = "dying-engines"
    kits = engines._deployment(config, name)._bound_deployment  # the kit's deployment, options and all
    serve.start(proxy_location="Disabled")
    serve.run_many([serve.RunTarget(kits.options(func_or_class=Engine, ray_actor_options={"num_cpus": 0}).bind(),
                                    name=name, route_prefix=None)])
    kept = engines.Engines(name, {})
    monkeypatch.setitem(engines._kept, name, kept)
    asked = [{"messages": [{"role": "user", "content": str(i)}], "sampling_params": {"max_tokens": 4}} for i in range(32)]
    try:
        began = time.monotonic()
        answered = engines.Processor(kept, config)(ray.data.from_items(asked, override_num_blocks=4)).take_all()
    finally:
        engines.free(kept, quiet=True)
    calls = [json.loads(line) for line in (tmp_path / "calls").read_text().splitlines()]
    assert [first for first, _ in calls].count(True) == 1 and len(calls) > 8, calls  # died on its first; sent again
    assert sorted(int(r["generated_text"]) for r in answered) == list(range(32)), answered  # each row once
    assert not any(r[pipeline.INFERENCE_ERROR] for r in answered) and time.monotonic() - began < 60

    @ray.remote(num_cpus=2)
    class Hold:
        def ready(self):
            return True

    fns = checked()
    run = run_folder.open_folder(str(tmp_path / "out")).start(PLAN.override(stall_timeout_s=10), fns, id_column="id",
                                                            settings={})
    results = stand_in_processor(fns)(read(local_ray, tmp_path, rows()))
    hold = Hold.remote()  # the cluster's every CPU: the run's stages can be placed nowhere
    ray.get(hold.ready.remote())
    began = time.monotonic()
    try:
        with pytest.raises(pipeline.RunStalledError) as stopped:
            pipeline.write(run, results, "predictions.parquet")
    finally:
        ray.kill(hold)
    assert 10 <= time.monotonic() - began < 40
    said = str(stopped.value)
    assert "No row was written for 10 s" in said and "0 of 2 CPUs" in said and "no node has it free" in said, said


def holding(name: str):
    """A stand-in for the engines: a replica that holds a CPU (an engine's GPU on a cluster) and does nothing."""
    from ray import serve

    @serve.deployment(name=name, ray_actor_options={"num_cpus": 1})
    class Holding:
        pass

    return Holding.bind()


KERNEL = """
import sys, time, ray
from ray import serve
from ray.data.llm import vLLMEngineProcessorConfig
from helpers import engines

@serve.deployment(ray_actor_options={"num_cpus": 1})
class Holding:  # as holding() below
    pass

engines._deployment = lambda config, name: Holding.options(name=name).bind()
ray.init(address=sys.argv[1], log_to_driver=False)
config = vLLMEngineProcessorConfig(model_source="model", concurrency=(1, 1), log_engine_metrics=False)
print("started", engines.build_processor(config).engines.name, sys.argv[2], flush=True)
time.sleep(600)
"""


def start_kernel(gcs: str, notebook: str, script: str = KERNEL):
    """``script`` (KERNEL) in a process of its own, on the cluster at ``gcs``, its output (errors too) in ``stdout``."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", script, gcs, notebook], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "RAY_ADDRESS": ""})


def engines_of(process) -> str:
    """The application name a :func:`start_kernel` printed once its engines started; else a failure with its output."""
    said = []
    for line in process.stdout:  # until its engines start, or it ends
        said.append(line)
        if line.startswith("started "):
            return line.split()[1]
    pytest.fail("the kernel ended before its engines started:\n" + "".join(said)[-3000:])


def test_engines_whose_kernel_was_killed_are_freed_by_the_next_start_and_a_live_kernels_are_kept(local_ray, monkeypatch):
    """A kernel killed before its last cell (a crashed job, a killed kernel, a job's retry) leaves its engines,
    a Serve application, holding their GPUs: the next start on the cluster, from any notebook, frees them,
    and its engines start on what they held; the engines of a kernel still running are kept. Real kernels
    (Ray drivers) in processes of their own, killed with SIGKILL."""
    from ray import serve

    from helpers import engines

    gcs, kernels, names = local_ray.get_runtime_context().gcs_address, [], []
    try:
        for notebook in ("killed", "alive"):  # one after the other: their names in this order
            kernels.append(start_kernel(gcs, notebook))
            names.append(engines_of(kernels[-1]))
        killed, alive = names
        assert killed.startswith("kit-engines-") and alive.startswith("kit-engines-") and killed != alive
        kernels[0].kill()  # SIGKILL: no atexit, no last cell
        kernels[0].wait()
        monkeypatch.setattr(engines, "_deployment", lambda config, name: holding(name))
        began = time.monotonic()
        started = engines.build_processor(config_of(PLAN.override(startup_timeout_s=60))).engines  # 2 CPUs: one was held
        assert started.ready() is started and time.monotonic() - began < 60
        assert killed not in serve.status().applications and alive in serve.status().applications
        engines.free(started, quiet=True)
    finally:
        for kernel in kernels:
            kernel.kill()
        for name in names:
            serve.delete(name)


def test_engines_whose_start_failed_are_restarted_by_the_next_start_and_the_cell_says_so(local_ray, monkeypatch, capsys):
    """A start that failed (Serve gave up on the replica's constructor) is not kept as this kernel's engines:
    the engines' cell run again starts new ones with the same settings, and says why."""
    from ray import serve

    from helpers import engines

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Failing:
        def __init__(self):
            raise RuntimeError("no GPU of type L4")

    monkeypatch.setattr(engines, "_deployment", lambda config, name: Failing.options(name=name).bind())
    config = config_of(PLAN.override(startup_timeout_s=120))
    failed = engines.build_processor(config).engines
    began = time.monotonic()
    while engines._state(failed.name)[0] != "DEPLOY_FAILED":  # Serve retries the constructor, then gives up
        assert time.monotonic() - began < 120, engines._state(failed.name)
        time.sleep(0.5)
    monkeypatch.setattr(engines, "_deployment", lambda config, name: holding(name))
    capsys.readouterr()
    again = engines.build_processor(config).engines  # the processor's cell run again, nothing changed
    said = capsys.readouterr().out
    assert "restarting the engines: their state" in said and "DEPLOY_FAILED" in said, said
    assert again is not failed and again.ready() is again
    with pytest.raises(engines.EngineStartError, match="were stopped"):
        failed.ready()
    engines.free(again, quiet=True)


def test_kept_engines_serve_a_changed_prompt_and_a_shorter_context_and_are_restarted_for_anything_else():
    """A prompt edited in the notebook: ``plans.fit_context`` measures the real requests again. Engines
    with a context at least as long are kept; a lengthened prompt that needs a longer one, another engine
    setting, or a start that failed restarts them, and the cell names why."""
    from helpers import engines

    settings = engines._settings(config_of(PLAN.override(max_model_len=512)))
    kept = engines.Engines("kept", settings)
    assert kept.changes(settings) == [] and settings["max_model_len"] == 512
    assert kept.changes(engines._settings(config_of(PLAN.override(max_model_len=256)))) == []  # shorter: fits
    assert kept.changes(engines._settings(config_of(PLAN.override(max_model_len=1024)))) == ["max_model_len"]
    assert kept.changes(engines._settings(config_of(PLAN.override(max_model_len=256, max_num_seqs=16)))) == [
        "max_model_len", "max_num_seqs"]
    waits = config_of(PLAN.override(max_model_len=512, stall_timeout_s=60, startup_timeout_s=30))
    assert kept.changes(engines._settings(waits)) == []  # the kit's waits are the run's, not the engines'


@pytest.mark.parametrize("flat", [True, False])
def test_the_engines_answer_in_ray_data_llms_fields_without_the_candidates_a_choice_masked(flat):
    """vLLM's answer as your ``postprocess`` gets it: the text decoded where vLLM did not (the notebook asks it
    not to), the token counts, and each step's candidates but those the structured output masked (-inf:
    probability 0), most of the 20 under a choice, which every stage after the engines would carry."""
    from types import SimpleNamespace

    from vllm.logprobs import FlatLogprobs, Logprob

    from helpers import engines

    steps = [{7: -0.1, 8: -2.5, 9: float("-inf")}, {4: 0.0, 5: float("-inf"), 6: float("-inf")}]
    logprobs = FlatLogprobs() if flat else []
    for step in steps:
        logprobs.append({t: Logprob(v, rank=None, decoded_token=None) for t, v in step.items()})
    answer = SimpleNamespace(text="", token_ids=[7, 4], logprobs=logprobs)
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: "".join(map(str, ids)))
    row = engines.fields(SimpleNamespace(outputs=[answer], prompt_token_ids=[1, 2, 3]), tokenizer)
    assert row == {"generated_text": "74", "num_input_tokens": 3, "num_generated_tokens": 2, "generated_tokens": [7, 4],
                   pipeline.INFERENCE_ERROR: "", "logprobs": [{7: {"logprob": -0.1}, 8: {"logprob": -2.5}}, {4: {"logprob": 0.0}}]}
    assert engines.fields(SimpleNamespace(outputs=[SimpleNamespace(text="x", token_ids=[7], logprobs=None)],
                                          prompt_token_ids=[1]), tokenizer)["logprobs"] is None


def test_progress_updates_one_line_in_jupyter_and_logs_a_line_when_headless(tmp_path, monkeypatch, capfd):
    folder = run_folder.Location.of(tmp_path)
    shown: list[str] = []

    class Handle:
        def update(self, content, raw):
            shown.append(content["text/plain"])

    def display(content, raw, display_id):
        shown.append(content["text/plain"])
        return Handle()

    monkeypatch.setenv(progress.PROGRESS_ENV, "1")
    with progress.shown(folder, total=10, about=True, every_s=0.2, display=display):
        time.sleep(0.5)
        pd.DataFrame({"x": range(4)}).to_parquet(tmp_path / "a.parquet")
        time.sleep(0.5)
    assert shown[0].startswith("0 s: sending the first batches") and shown[-1].startswith("done in ")
    assert any("4 of about 10 rows written" in line for line in shown)
    monkeypatch.setenv(progress.PROGRESS_ENV, "0")
    monkeypatch.setenv(progress.HEARTBEAT_ENV, "1")
    with progress.shown(folder, total=None, about=False):
        time.sleep(2.5)
    err = capfd.readouterr().err
    assert "[llm-batch-kit] pipeline started" in err and "rows written" in err
    # The last line's rate is the whole run's: a log saw the first rows at its first line only, and the rate
    # since then was 47 rows/s at the end of a 63 s run of 309 rows.
    (tmp_path / "log").mkdir()
    started = time.monotonic()
    with progress.shown(run_folder.Location.of(tmp_path / "log"), total=None, about=False):
        time.sleep(0.3)
        pd.DataFrame({"x": range(4)}).to_parquet(tmp_path / "log" / "a.parquet")
        time.sleep(1.5)
        pd.DataFrame({"x": range(4)}).to_parquet(tmp_path / "log" / "b.parquet")
    whole = 8 / (time.monotonic() - started)
    (last,) = [line for line in capfd.readouterr().err.splitlines() if "done in" in line]
    assert "8 rows written" in last and abs(float(last.split(", ")[-1].split()[0]) - whole) < 0.3, (last, whole)


def test_a_run_with_no_new_row_stops_only_when_it_cannot_go_on(tmp_path, monkeypatch):
    """No row for ``stall_s`` while nothing is lacking (a slow run writing big files) goes on; once something
    is (``stuck`` names it), the code inside is interrupted as the stop button does, with the reason."""
    monkeypatch.setenv(progress.PROGRESS_ENV, "0")
    monkeypatch.setenv(progress.HEARTBEAT_ENV, "0")
    folder, lacking = run_folder.Location.of(tmp_path), []
    with progress.shown(folder, total=None, about=False, stall_s=1, stuck=lambda: "".join(lacking)) as watched:
        time.sleep(3.5)  # slow, not stuck: never interrupted
        lacking.append("no CPU for the stages")
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            time.sleep(10)
    assert watched["stalled"] == "no CPU for the stages" and time.monotonic() - began < 3


def test_steady_state_and_files_per_run():
    files = [(t, 100) for t in (10.0, 11.0, 12.0, 13.0, 14.0)]
    assert pipeline.steady_state(files, 20)[0] == pytest.approx(100.0)
    assert "fewer than 5" in pipeline.steady_state(files[:3], 20)[1]
    assert "within 0.4 s" in pipeline.steady_state([(10 + i / 10, 100) for i in range(5)], 60)[1]
    gpu = PRESETS["text-llama8b-l4"]
    assert pipeline.rows_per_file(gpu, 1_000_000) == 10_000 and pipeline.rows_per_file(gpu, 6_400) == 256
    assert pipeline.rows_per_file(PRESETS["text-cpu-offline"], 1_000_000) == 64  # a CPU writes each batch


def test_limit_keeps_the_first_rows_in_file_order_even_when_the_first_file_arrives_last(local_ray, tmp_path):
    ray = local_ray
    for n in range(4):
        pd.DataFrame({"Company": [f"c{n}-{i}" for i in range(50)]}).to_csv(tmp_path / f"part-{n}.csv", index=False)
    ds = ray.data.read_csv(str(tmp_path), override_num_blocks=8)
    assert [r["Company"] for r in pipeline.first_rows(ds, 60).take_all()] == [f"c0-{i}" for i in range(50)] + [
        f"c1-{i}" for i in range(10)]
    resumed = ray.data.read_csv(str(tmp_path), override_num_blocks=8)
    assert len(pipeline.first_rows(resumed, 60, done=45).take_all()) == 15  # the rest of LIMIT after a resume


def test_no_column_ray_or_your_request_writes_replaces_a_column_of_yours(local_ray, tmp_path):
    """Ray Data LLM's stages write their fields into each row (a response's ``id``, the engine's
    ``generated_text``, your request's ``messages``): your columns of those names came back replaced."""
    fns = pipeline.checked(preprocess, postprocess, {"name": "Walmart"}, keep=["id", "name", "messages", "generated_text"])
    frame = rows().assign(messages=lambda f: "yours " + f["id"], generated_text=lambda f: "also yours " + f["id"])
    run = run_folder.open_folder(str(tmp_path / "out")).start(PLAN, fns, id_column="id", settings={})
    written = pipeline.write(run, stand_in_processor(fns)(read(local_ray, tmp_path, frame)), "predictions.parquet")
    every = pd.concat([written.answered, written.errors])
    assert len(every) == 20 and len(written.errors) == 4
    assert (every["messages"] == "yours " + every["id"]).all()
    assert (every["generated_text"] == "also yours " + every["id"]).all()
    assert (written.answered["predicted_label"].isin(LABELS)).all()


def test_a_config_field_the_kept_engines_cannot_honour_is_refused_by_name_before_anything_starts():
    """Ray's own ``vLLMEngineProcessorConfig``: what the kept engines do (generation, their placement, the stages
    they run inside the engine) goes through; anything else is named, with the way out (Ray's own processor)."""
    from helpers import engines

    assert engines.refused(config_of(PLAN)) == []
    assert engines.refused(config_of(PLAN, prepare_multimodal_stage={"enabled": True, "num_cpus": 0.1},
                                     tokenize_stage=False, detokenize_stage={"enabled": False})) == []  # in the engine
    said = engines.refused(config_of(PLAN, task_type="embed", max_pending_requests=8, log_engine_metrics=True,
                                     chat_template_stage={"enabled": False, "chat_template": "{{x}}"},
                                     detokenize_stage={"batch_size": 8}, dynamic_lora_loading_path="s3://loras"),
                           builder_kwargs={"chat_template_kwargs": {}})
    assert said == ["builder_kwargs ['chat_template_kwargs']", "task_type='embed' (they generate text)",
                    "log_engine_metrics=True (they export no metrics to Ray's; set it False)",
                    "dynamic_lora_loading_path='s3://loras'", "max_pending_requests=8", "chat_template_stage['chat_template']",
                    "chat_template_stage disabled (the engines take messages)", "detokenize_stage['batch_size']"], said
    with pytest.raises(engines.UnsupportedConfigError, match=r"cannot honour task_type='embed'.*from ray.data.llm import build_processor"):
        engines.build_processor(config_of(PLAN, task_type="embed"))


def test_a_message_with_images_reaches_the_chat_template_as_image_parts_and_vllm_as_its_images():
    """The notebook's request (an ``image_pil`` part) as the model's chat template and vLLM take it, with no
    vLLM internals: text-only content as one text; an image part as ``{"type": "image"}``, the image in order;
    a part of a kind the engines do not take fails that row, by name."""
    from PIL import Image

    from helpers import engines

    red, blue = Image.new("RGB", (2, 2), "red"), Image.new("RGB", (2, 2), "blue")
    messages, found = engines.chat([
        {"role": "system", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Both:"}, {"type": "image_pil", "image_pil": red},
                                     {"type": "image_pil", "image_pil": blue}]}])
    assert messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
        {"type": "text", "text": "Both:"}, {"type": "image"}, {"type": "image"}]}] and found == [red, blue]
    assert engines.chat([{"role": "user", "content": "plain"}]) == ([{"role": "user", "content": "plain"}], [])
    with pytest.raises(ValueError, match="'image_url'.*take text and image_pil parts"):
        engines.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}])
