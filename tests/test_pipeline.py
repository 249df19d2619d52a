"""The shared plumbing: one pass writes every row, no single row fails a run, counts come from Ray."""

import math
import time

import pandas as pd
import pyarrow as pa
import pytest

from helpers import cluster, output_dir, outputs, pipeline, progress, run_stats, stages
from helpers.data import REJECT_REASON
from helpers.stages import ENGINE, INFERENCE_ERROR, POSTPROCESS, REJECTED, STAGE
from helpers.sizing import InputSize


def request(row):
    return {"messages": [{"role": "user", "content": row["text"]}], "sampling_params": {"max_tokens": 3}}


EXAMPLE = {"text": "Walmart"}


def test_rejected_rows_skip_the_model_and_a_raising_preprocess_rejects_only_its_row():
    guarded = pipeline.guard_preprocess(request, EXAMPLE)
    stand_in = request(EXAMPLE)  # what rejected rows carry, never sent: every row has the same columns
    assert guarded({"text": "", REJECT_REASON: "empty value"}) == {**stand_in, INFERENCE_ERROR: "empty value",
                                                                    STAGE: REJECTED}
    ok = guarded({"text": "Acme", REJECT_REASON: ""})
    assert ok["messages"][0]["content"] == "Acme" and ok[INFERENCE_ERROR] == "" and ok[STAGE] == ""
    failed = guarded({REJECT_REASON: ""})  # no "text": the user's function raises KeyError
    assert failed == {**stand_in, INFERENCE_ERROR: "preprocess failed: KeyError: 'text'", STAGE: REJECTED}


def test_a_preprocess_that_fails_on_the_example_is_reported_at_once():
    with pytest.raises(ValueError, match="fails on the example row.*KeyError"):
        pipeline.guard_preprocess(request, {"name": "Walmart"})


@pytest.mark.slow
def test_a_block_of_rejected_rows_keeps_integer_settings_integers(local_ray, tmp_path):
    # Ray Data joins blocks into an actor stage's batch column by column. A block holding rejected
    # rows only, without a request, read as nulls there: every row's max_tokens became a float, which
    # vLLM's engine refuses in its input thread, and the run stalled for good (8 rows, 8 blocks, an
    # empty name). With the stand-in request every row keeps its integer.
    import ray
    from ray.llm._internal.batch.stages.base import wrap_preprocess

    names = ["Walmart", "Pfizer", "", "Zillow", "Siemens", "", "", "Accenture"]
    ds = ray.data.from_items([{"text": n, REJECT_REASON: "" if n else "empty value"} for n in names],
                             override_num_blocks=len(names))
    def ask(row):  # defined here: Ray's workers cannot import this test module
        return {"messages": [{"role": "user", "content": row["text"]}], "sampling_params": {"max_tokens": 3}}

    first = wrap_preprocess(pipeline.guard_preprocess(ask, {"text": "Walmart"}), "__data")

    class Stage:  # what each of Ray Data LLM's stages does with a batch: rows in, the same rows out
        async def __call__(self, batch):
            yield {"__data": list(batch["__data"])}

    class Types:
        def __call__(self, batch):
            return {"text": [r["text"] for r in batch["__data"]],
                    "max_tokens": [type(r["sampling_params"]["max_tokens"]).__name__ if r["sampling_params"]
                                   else "missing" for r in batch["__data"]]}

    pool = ray.data.ActorPoolStrategy(size=1)
    rows = (ds.map(first).map_batches(Stage, batch_size=1, compute=pool, zero_copy_batch=True)
            .map_batches(Types, batch_size=64, compute=pool, zero_copy_batch=True).take_all())
    assert len(rows) == len(names)
    assert {r["max_tokens"] for r in rows} == {"int"}  # without the stand-in: {"float", "missing"}


def test_ray_llm_stages_bypass_only_the_rejected_rows_of_a_mixed_block():
    # Rows of one block go through Arrow: a row that did not set the error column would read as null,
    # which Ray's stages treat as an error. The guard sets "" on every row it lets through.
    from ray.llm._internal.batch.stages.base import StatefulStageUDF

    class Echo(StatefulStageUDF):
        async def udf(self, rows):
            for row in rows:
                yield {self.IDX_IN_BATCH_COLUMN: row[self.IDX_IN_BATCH_COLUMN], "answered": True}

    guarded = pipeline.guard_preprocess(request, EXAMPLE)
    rows = [guarded({"text": "", REJECT_REASON: "empty value"}), guarded({"text": "Acme", REJECT_REASON: ""})]
    block = pa.Table.from_pylist([{**r, "text": t} for r, t in zip(rows, ["", "Acme"])]).to_pylist()

    async def run():
        return [out async for out in Echo("__data")({"__data": block})]

    import asyncio

    [out] = asyncio.run(run())
    rejected, answered = out["__data"]
    assert "answered" not in rejected and rejected[INFERENCE_ERROR] == "empty value"
    assert answered["answered"] is True


def test_postprocess_keeps_the_carried_columns_and_a_raising_postprocess_fails_only_its_row():
    guarded = pipeline.guard_postprocess(lambda r: {"label": r["generated_text"].strip()}, carry=["id"])
    ok = guarded({"id": 1, "generated_text": " A ", "num_input_tokens": 9, "prompt_token_ids": [1], "params": "p"})
    assert ok["id"] == 1 and ok["label"] == "A" and ok["num_input_tokens"] == 9 and ok[STAGE] == "" and ok["error"] == ""
    failed = guarded({"id": 2})
    assert failed == {"id": 2, "error": "postprocess failed: KeyError: 'generated_text'", STAGE: POSTPROCESS}


def finished(rows):
    table = stages.finish(pa.Table.from_pylist(rows), carry=["id"], outputs={"label": ""})
    return table.column_names, table.to_pylist()


def test_finish_gives_every_row_one_schema_and_its_stage():
    columns, rows = finished([
        {"id": 1, "label": "A", "num_input_tokens": 9, "num_generated_tokens": 1, "request_digest": "d",
         "error": "", STAGE: "", INFERENCE_ERROR: "", "image": [1, 2]},
        {"id": 2, INFERENCE_ERROR: "truncated file", STAGE: REJECTED},
        {"id": 3, INFERENCE_ERROR: "VLLMValidationError: too long", STAGE: "", "prompt": "x" * 10},
        {"id": 4, "error": "postprocess failed: KeyError: 'x'", STAGE: POSTPROCESS, INFERENCE_ERROR: ""},
    ])
    assert columns == ["id", "label", *outputs.ENGINE_COLUMNS, "error", STAGE]
    assert [(r["id"], r[STAGE]) for r in rows] == [(1, ""), (2, REJECTED), (3, ENGINE), (4, POSTPROCESS)]
    assert rows[0]["label"] == "A" and rows[0]["num_input_tokens"] == 9 and rows[0]["error"] == ""
    assert rows[1] == {"id": 2, "label": "", "num_input_tokens": 0, "num_generated_tokens": 0,
                       "request_digest": "", "error": "truncated file", STAGE: REJECTED}
    assert rows[2]["error"].startswith("VLLMValidationError") and rows[2]["label"] == ""
    # A batch of rejected rows only has none of the answer columns: they still come out, with defaults.
    columns, rows = finished([{"id": 5, INFERENCE_ERROR: "empty value", STAGE: REJECTED}])
    assert columns == ["id", "label", *outputs.ENGINE_COLUMNS, "error", STAGE] and rows[0]["num_input_tokens"] == 0


def test_carried_values_ray_pickled_come_back_typed_and_row_hash_as_the_source_has_it(local_ray, tmp_path):
    """A row map (your postprocess) hands values over as Python objects; ints past int64 (half of Ray's
    uint64 row_hash values) have no Arrow type then, and Ray pickled them: pandas then failed on every
    table read from the results. ``finish`` writes them typed: row_hash as uint64 in every block (also
    one whose hashes all fit int64, which Ray's row map makes int64), other big ints as uint64, mixed
    values as text; tables written from them read back as they are, with Ray's types registered."""
    import ray

    from helpers.data import ROW_HASH

    hashes = [2**63 + 5, 2**64 - 1, 7, 8]
    source = ray.data.from_arrow(pa.table({ROW_HASH: pa.array(hashes, pa.uint64()),
                                           "other": pa.array(hashes, pa.uint64()), "mixed": ["a", "b", "c", "d"]}))
    rows = source.repartition(2).map(lambda r: {**r, "mixed": 1 if r["mixed"] == "a" else r["mixed"]})
    types = rows.map_batches(lambda t: pa.table({"type": [str(t.schema.field(ROW_HASH).type)]}),
                             batch_format="pyarrow", batch_size=None).take_all()
    assert any(stages.PICKLED in t["type"] for t in types)  # what Ray makes of big hashes
    assert {"type": "int64"} in types  # a block of small hashes: int64
    done = rows.map_batches(stages.finish, batch_format="pyarrow", fn_kwargs={
        "carry": [ROW_HASH, "other", "mixed"], "outputs": {"caption": ""}})
    done.write_parquet(str(tmp_path / "parts"))
    table = pd.read_parquet(tmp_path / "parts")
    assert str(table[ROW_HASH].dtype) == "uint64" and sorted(table[ROW_HASH]) == sorted(hashes)
    for part in (tmp_path / "parts").iterdir():  # other big ints: uint64 in their file; mixed values as text
        written = pd.read_parquet(part)
        assert all(str(written[c].dtype) in ("uint64", "int64") for c in ("other", ROW_HASH))
        assert str(written[ROW_HASH].dtype) == "uint64"
    assert sorted(table["mixed"]) == ["1", "b", "c", "d"]
    answered, errors = pipeline.collect(tmp_path, "captions.parquet", table.assign(stage="", error=""))
    assert len(answered) == 4 and errors.empty and str(errors[ROW_HASH].dtype) == "uint64"


def test_collect_splits_answered_rows_from_errors(tmp_path):
    parts = tmp_path / outputs.PARTS / pipeline.RESULTS
    parts.mkdir(parents=True)
    pd.DataFrame({"row_id": ["1", "2", "3"], "label": ["A", "", ""], "error": ["", "too long", "empty value"],
                  STAGE: ["", ENGINE, REJECTED]}).to_parquet(parts / "a.parquet")
    answered, errors = pipeline.collect(tmp_path, "predictions.parquet")
    assert answered["row_id"].tolist() == ["1"] and "error" not in answered and STAGE not in answered
    assert errors["reason"].tolist() == ["too long", "empty value"]
    assert len(pd.read_parquet(tmp_path / "predictions.parquet")) == 1 and len(pd.read_parquet(tmp_path / "errors.parquet")) == 2


def test_steady_state_is_the_rate_the_result_files_came_at():
    files = [(100.0 + 5 * i, 20) for i in range(6)]  # 20 rows every 5 s
    rate, basis = run_stats.steady_state(files, seconds=60)
    assert rate == pytest.approx(4.0) and basis == "fitted over 6 result files written in 25.0 s"
    t = run_stats.Throughput(rows=120, seconds=60, steady=rate, steady_basis=basis)
    assert t.end_to_end == 2 and t.steady == pytest.approx(4.0)


def test_steady_state_fits_waves_of_files():
    # Two waves of 4 blocks (40 rows each) that end together, 50 s apart: 160 rows per 50 s. From the
    # first file to the last (7 files' rows over 50 s) it would read 5.6 rows/s instead of 3.2.
    waves = [(100.0 + 0.1 * i, 40) for i in range(4)] + [(150.0 + 0.1 * i, 40) for i in range(4)]
    rate, _ = run_stats.steady_state(waves, seconds=160)
    assert rate == pytest.approx(160 / 50, rel=0.01)


def test_steady_state_is_not_claimed_from_a_burst_or_a_handful_of_files():
    # 600 images in 4 blocks on a 2-core CPU: 4 files within 1.2 s of an 85 s pipeline.
    rate, basis = run_stats.steady_state([(180.0, 150), (180.4, 150), (180.9, 150), (181.2, 150)], seconds=85)
    assert math.isnan(rate) and basis == "not measured: 4 result files, fewer than 5"
    burst = [(180.0 + 0.2 * i, 50) for i in range(12)]  # 12 files, all within 2.2 s
    rate, basis = run_stats.steady_state(burst, seconds=85)
    assert math.isnan(rate) and basis == "not measured: 12 files came within 2.2 s of 85 s"
    assert math.isnan(run_stats.steady_state([], seconds=10)[0])


class Op:
    def __init__(self, name, rows):
        self.operator_name, self.output_num_rows = name, (type("S", (), {"sum": rows})() if rows is not None else None)


class Stats:
    def __init__(self, ops, parents=()):
        self.operators_stats, self.parents = ops, list(parents)


class Executed:
    def __init__(self, summary):
        self.summary = summary

    def get_stats_summary(self):
        return self.summary


def test_rows_are_counted_where_they_enter_the_processor():
    entering = f"MapBatches({run_stats.rows_entering.__name__})"
    read = Stats([Op("ReadCSV->SplitBlocks(8)", 309)])
    # A resumed run: Ray's checkpoint filter drops the rows an interrupted run finished.
    filtered = Stats([Op("CheckpointFilter->SplitBlocks(8)", 301)], [read])
    kit = Stats([Op(f"MapBatches(add_row_ids_and_rejects)->{entering}->Map(_preprocess)", 301)], [filtered])
    top = Stats([Op("Map(_postprocess)->Write", 2)], [Stats([Op("MapBatches(vLLMEngineStageUDF)", 301)], [kit])])
    assert run_stats.rows_entered(Executed(top)) == 301
    limited = Stats([Op(f"{entering}->Map(_preprocess)", 24)], [Stats([Op("limit=24", 24)], [read])])
    assert run_stats.rows_entered(Executed(Stats([Op("Write", 1)], [limited]))) == 24
    # Fused with the write, the operator's output is a row per file; no marker, no count.
    assert run_stats.rows_entered(Executed(Stats([Op(f"ReadCSV->{entering}->Write", 3)]))) is None
    assert run_stats.rows_entered(Executed(Stats([Op("Write", 1)], [read]))) is None
    assert run_stats.rows_entered(Executed(Stats([Op("Write", 1)], [Stats([Op(entering, None)])]))) is None
    assert run_stats.rows_entered(object()) is None


class Kernel:
    def __init__(self, allow_stdin):
        self._allow_stdin = allow_stdin


class Shell:
    def __init__(self, allow_stdin):
        self.kernel = Kernel(allow_stdin)


def test_progress_shows_when_a_person_steps_through_not_under_papermill(monkeypatch):
    import IPython

    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell(allow_stdin=True))
    assert progress.interactive()  # a Jupyter frontend lets the kernel ask for input
    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell(allow_stdin=False))
    assert not progress.interactive()  # papermill, nbclient, nbconvert --execute do not
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    assert not progress.interactive()  # plain Python
    monkeypatch.setenv(progress.PROGRESS_ENV, "1")
    assert progress.interactive()
    monkeypatch.setenv(progress.PROGRESS_ENV, "0")
    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell(allow_stdin=True))
    assert not progress.interactive()


@pytest.mark.slow
def test_one_pass_writes_every_row_once_and_counts_them_where_they_enter(local_ray, tmp_path):
    import ray

    csv = tmp_path / "in.csv"
    pd.DataFrame({"id": [str(i) for i in range(60)], "text": ["x"] * 45 + [""] * 15}).to_csv(csv, index=False)
    ds = ray.data.read_csv(str(csv), override_num_blocks=5).limit(50).map_batches(
        lambda b: b.assign(**{REJECT_REASON: ["" if t == "x" else "empty" for t in b["text"].fillna("")]}),
        batch_format="pandas")
    guarded = pipeline.guard_preprocess(lambda r: {"prompt": r["text"]}, {"text": "x"})
    answer = pipeline.guard_postprocess(lambda r: {"label": "A"}, carry=["id"])

    class Engine:  # an actor stage, as in the processor: it keeps the write apart from the steps before
        def __call__(self, batch):
            return batch

    def processor(rows):
        return rows.map(lambda r: {**r, **guarded(r)}).map_batches(Engine, concurrency=1).map(
            lambda r: {k: v for k, v in r.items() if k not in ("text", "prompt")} if r[INFERENCE_ERROR]
            else {**answer(r), INFERENCE_ERROR: ""})

    out = output_dir.prepare_output_dir(str(tmp_path / "out"), resume=True, settings={})
    started = time.perf_counter()
    session = cluster.Session(cluster={}, budget=None, engine_env={}, threads_bind=None, progress=False,
                               stage_cpus=0.1, startup_timeout_s=120)
    result = pipeline.run(processor, ds, out, session, carry=["id"], outputs={"label": ""}, id_column="id",
                          answered_name="predictions.parquet")
    assert result.throughput.seconds <= time.perf_counter() - started
    assert result.rows_entered_now == 50 and result.rows_written_now == 50 and result.rows_read == 50
    assert len(result.answered) == 45 and set(result.errors[STAGE]) == {REJECTED} and len(result.errors) == 5
    assert result.throughput.answered_rows == 45 and "Write" in result.stats
    assert not (out.root / outputs.PARTS / "rejected").exists()  # one write, one folder


def test_rows_per_file_aims_at_64_files_between_a_batch_and_10000_rows():
    assert pipeline.rows_per_file(16, 2000) == 32  # 2,000 images: 63 files as they come
    assert pipeline.rows_per_file(256, 2000) == 256  # never less than a batch
    assert pipeline.rows_per_file(16, 5_000_000) == 10_000  # 500 files, not 312,500
    assert pipeline.rows_per_file(256, None) == 1024  # unknown size


def _light_stages_around(guarded, engine, answer):
    """A processor of the shape Ray Data LLM builds: the light stages at the session's 0.1 CPU, as Ray
    Data LLM's are given them, around a stand-in ``engine`` taking batches of 8 on one actor."""
    def processor(rows):
        return rows.map(lambda r: {**r, **guarded(r)}, num_cpus=0.1).map_batches(
            engine, concurrency=1, batch_size=8).map(answer, num_cpus=0.1)

    return processor


def _stand_in_session():
    """The session those stand-in runs get: a local Ray, stages at 0.1 CPU, batches of 8, no live line."""
    return cluster.Session(cluster={}, budget=None, engine_env={}, threads_bind=None, progress=False,
                           stage_cpus=0.1, startup_timeout_s=120, batch_size=8)


@pytest.mark.slow
def test_rows_enter_the_engine_a_batch_at_a_time_and_results_are_written_as_they_come(local_ray, tmp_path):
    """Read blocks of 48 rows, batches of 8: without the kit's repartition each engine task would
    take a whole block and its rows would come back together; with it, a file comes per batch."""
    import ray

    ds = ray.data.from_items([{"id": str(i), "text": "x", REJECT_REASON: ""} for i in range(96)],
                             override_num_blocks=2)
    guarded = pipeline.guard_preprocess(lambda r: {"prompt": r["text"]}, {"text": "x"})
    answer = pipeline.guard_postprocess(lambda r: {"label": "A", "rows_in_task": r["rows_in_task"]},
                                        carry=["id"])

    class Engine:  # an engine stage: one batch at a time, 0.3 s each
        def __call__(self, batch):
            time.sleep(0.3)
            return {**batch, "rows_in_task": [len(batch["id"])] * len(batch["id"])}

    processor = _light_stages_around(guarded, Engine, answer)
    out = output_dir.prepare_output_dir(str(tmp_path / "out"), resume=False, settings={})
    session = _stand_in_session()
    result = pipeline.run(processor, ds, out, session, carry=["id"], outputs={"label": "", "rows_in_task": 0},
                          id_column=None, answered_name="predictions.parquet", input_size=InputSize(96, "counted: the test's rows"))
    assert len(result.answered) == 96 and set(result.answered["rows_in_task"]) == {8}
    assert len(result.files) == 12  # rows_per_file(8, 96) == 8: a file per batch, as it was answered
    times = sorted(mtime for _, mtime in out.parts(pipeline.RESULTS).files())
    assert times[-1] - times[0] > 1.5  # written over the run (12 batches x 0.3 s), not together at the end


def test_a_file_is_due_at_its_rows_or_when_the_last_was_due_file_every_s_ago():
    """Ray's write asks its bundler, as each block comes, whether the rows gathered make a file: with
    RowsOrTime, also when the last file was due that long ago (the first: since the write began).
    Pickled for Ray's write tasks it is the plain number."""
    import copy
    import pickle

    from ray.data._internal.execution.bundle_queue.bundler import EstimateSize, PendingBundleState
    from ray.data._internal.util import _validate_rows_per_file_args

    rows = outputs.RowsOrTime(100, 0.3)
    assert _validate_rows_per_file_args(min_rows_per_file=rows) == (100, None)  # Ray's checks pass it
    due = EstimateSize(rows).can_build_ready_bundle

    def comes(pending: int) -> bool:
        return due(PendingBundleState(num_rows=pending, size_bytes=0))

    assert not comes(8) and not comes(16)  # the first blocks of a file of 100 rows
    time.sleep(0.35)
    assert comes(24)  # the write began 0.35 s ago: due with 24 rows
    assert not comes(8)  # the next file, 0.3 s from now
    assert comes(100)  # or at its rows, whatever the time
    assert type(pickle.loads(pickle.dumps(rows))) is int and copy.deepcopy(rows) is rows


@pytest.mark.slow
def test_a_slow_run_writes_a_result_file_at_least_every_file_every_s(local_ray, tmp_path, monkeypatch):
    """A run of about 100,000 rows gathers 1,563 rows a file (rows_per_file): on a 2-core CPU at ~14
    rows/s that is almost two minutes between files (3,157 rows for about 200,000 rows: almost four).
    A file is also written when the last was due FILE_EVERY_S ago (here 2 s stands for the minute): an
    interrupt loses at most that, and every row is written once, resumably."""
    import ray

    monkeypatch.setattr(outputs, "FILE_EVERY_S", 2.0)
    ds = ray.data.from_items([{"id": f"{i:04d}", "text": "x", REJECT_REASON: ""} for i in range(200)],
                             override_num_blocks=2)
    guarded = pipeline.guard_preprocess(lambda r: {"prompt": r["text"]}, {"text": "x"})
    answer = pipeline.guard_postprocess(lambda r: {"label": "A"}, carry=["id"])

    class Engine:  # a slow engine: a batch of 8 every 0.25 s, 32 rows/s
        def __call__(self, batch):
            time.sleep(0.25)
            return batch

    processor = _light_stages_around(guarded, Engine, answer)
    out = output_dir.prepare_output_dir(str(tmp_path / "out"), resume=True, settings={})
    session = _stand_in_session()
    about = InputSize(100_000, "estimated: the test's stand-in for a big input")
    assert pipeline.rows_per_file(8, about.rows) == 1_563  # more than the 200 rows this run has
    result = pipeline.run(processor, ds, out, session, carry=["id"], outputs={"label": ""}, id_column="id",
                          answered_name="predictions.parquet", input_size=about)
    assert result.rows_written_now == 200 and sorted(result.answered["id"]) == [f"{i:04d}" for i in range(200)]
    times = sorted(mtime for _, mtime in out.parts(pipeline.RESULTS).files())
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) >= 3, times  # without the time: one file of all 200 rows, at the end
    assert max(gaps) < 2.0 + 1.5, gaps  # the time, and the next batches' wait


def test_a_run_that_writes_nothing_stops_after_the_startup_timeout(tmp_path):
    folder = tmp_path / "parts"
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no results were written within STARTUP_TIMEOUT_S=2 s"):
        with progress.first_results_within(folder, 2):
            time.sleep(60)  # an engine that never starts
    assert time.monotonic() - started < 10


def test_the_startup_timeout_ends_with_the_first_result_file(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    with progress.first_results_within(folder, 2):
        pd.DataFrame({"x": [1]}).to_parquet(folder / "a.parquet")  # the first results
        time.sleep(4)  # the rest of a long run
    with pytest.raises(KeyboardInterrupt):  # a person's Ctrl-C stays a Ctrl-C
        with progress.first_results_within(folder, 60):
            raise KeyboardInterrupt


def test_the_startup_timeout_works_where_sigint_is_ignored(tmp_path):
    # A process started in the background (nohup, `&`, some CI runners) inherits an ignored SIGINT.
    import signal

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            with progress.first_results_within(tmp_path / "parts", 2):
                time.sleep(60)
        assert time.monotonic() - started < 10
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # put back as it was
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_headless_run_logs_its_progress_outside_the_report(tmp_path):
    """A 1M-row job printed its settings and then nothing for an hour: the heartbeat writes a line
    per interval (rows, rate, time left) to the process's own stderr, never into the notebook."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "parts"
    folder.mkdir()
    pq.write_table(pa.table({"x": list(range(5))}), folder / "resumed.parquet")  # an interrupted run's rows
    log = io.StringIO()
    with progress.heartbeat(folder, 0.3, total=30, stream=log):
        for i in range(3):
            time.sleep(0.35)
            pq.write_table(pa.table({"x": list(range(10))}), folder / f"part-{i}.parquet")
        time.sleep(0.5)
    lines = log.getvalue().splitlines()
    assert len(lines) >= 3 and all(line.startswith("[llm-batch-kit] ") for line in lines)
    assert " 30 of 30 rows written" in lines[-1]  # this run's rows only, of the total it was given
    assert "rows/s over the last" in lines[0] and "min left" in " ".join(lines[:-1])
    log = io.StringIO()
    with progress.heartbeat(folder, 0, stream=log):
        time.sleep(0.2)
    assert log.getvalue() == ""
    assert progress._progress_line(2.0, 100, None, 5.0, 60) == \
        "[llm-batch-kit] 2.0 min: 100 rows written, 5.0 rows/s over the last 60 s"


def test_progress_says_about_where_the_rows_to_come_are_an_estimate():
    estimated = InputSize(101_982, "estimated: 950 rows in the first 1,048,576 bytes of the first of 4 files")
    counted = InputSize(100_000, "counted: the footers of 4 parquet files")
    assert pipeline.rows_planned(None, estimated) == (101_982, True)
    assert pipeline.rows_planned(None, counted) == (100_000, False)
    assert pipeline.rows_planned(1_000, estimated) == (1_000, False)  # a LIMIT below it: that many
    assert pipeline.rows_planned(200_000, estimated) == (101_982, True)
    assert pipeline.rows_planned(None, InputSize(None, "an http(s) URL does not say")) == (None, False)
    assert pipeline.rows_planned(50, None) == (50, False)
    assert " 10 of about 101,982 rows written" in progress._progress_line(1.0, 10, 101_982, 2.0, 60, about=True)
    assert " 10 of 1,000 rows written" in progress._progress_line(1.0, 10, 1_000, 2.0, 60)
    line = progress._live_line(30, 10, 101_982, 2.0, about=True)
    assert "10 of about 101,982 rows written, 2.0 rows/s, about " in line and "min left" in line


def _stand_in_processor(engine_cls, batch_size: int = 8):
    """A processor of the kit's shape around ``engine_cls`` (an actor stage, as Ray Data LLM's engine)."""
    guarded = pipeline.guard_preprocess(lambda r: {"prompt": r["text"]}, {"text": "x"})
    answer = pipeline.guard_postprocess(lambda r: {"label": "A"}, carry=["id"])

    def processor(rows):
        return rows.map(lambda r: {**r, **guarded(r)}).map_batches(engine_cls, concurrency=1, batch_size=batch_size).map(
            lambda r: {k: v for k, v in r.items() if k not in ("text", "prompt")} if r[INFERENCE_ERROR]
            else {**answer(r), INFERENCE_ERROR: ""})

    return processor


@pytest.mark.slow
def test_limit_runs_the_first_rows_of_the_input_even_when_the_first_file_arrives_last(local_ray, tmp_path):
    """Ray's limit keeps the first rows to arrive: with the first file's blocks made slow, a LIMIT=25
    run took rows of the later files. data.first_rows keeps the input's order: the first 25 ids,
    and the ids checked and the sample taken are those rows."""
    import ray

    from helpers import data

    folder = tmp_path / "in"
    folder.mkdir()
    for name, start in (("a.csv", 0), ("b.csv", 20), ("c.csv", 40), ("d.csv", 60)):
        pd.DataFrame({"id": [f"{i:03d}" for i in range(start, start + 20)], "text": ["x"] * 20}).to_csv(
            folder / name, index=False)
    def slow_first_file(batch):  # the step right after the read, 4 s slower for the first file's blocks
        if (batch["id"] < "020").any():
            time.sleep(4)
        return batch.assign(**{REJECT_REASON: ""})

    def read():
        return ray.data.read_csv(str(folder), override_num_blocks=8, convert_options=data.string_columns("id")
                                 ).map_batches(slow_first_file, batch_format="pandas")

    first_25 = [f"{i:03d}" for i in range(25)]
    assert sorted(r["id"] for r in read().limit(25).take_all()) != first_25  # Ray's own limit: what came first
    ds = data.first_rows(read(), 25)
    sample = data.check_and_sample(ds, "id", sample=10)
    assert [r["id"] for r in sample] == first_25[:10]

    class Engine:
        def __call__(self, batch):
            return batch

    out = output_dir.prepare_output_dir(str(tmp_path / "out"), resume=True, settings={})
    session = _stand_in_session()
    result = pipeline.run(_stand_in_processor(Engine), ds, out, session, carry=["id"], outputs={"label": ""},
                          id_column="id", answered_name="predictions.parquet", limit=25)
    assert sorted(result.answered["id"]) == first_25


@pytest.mark.slow
def test_an_engine_that_dies_after_its_first_batch_fails_the_checked_cell(local_ray, tmp_path):
    """With should_continue_on_error, a dead engine returns every later row as an engine error: each row
    is accounted for, and the old checks printed True. The checked cell's require() now fails."""
    import ray

    from helpers import report

    ds = ray.data.from_items([{"id": str(i), "text": "x", REJECT_REASON: ""} for i in range(64)],
                             override_num_blocks=8)

    class Engine:  # answers its first batch, then every request fails as vLLM's dead engine does
        def __init__(self):
            self.batches = 0

        def __call__(self, batch):
            self.batches += 1
            if self.batches > 1:
                batch[INFERENCE_ERROR] = ["EngineDeadError: EngineCore encountered an issue"] * len(batch["id"])
            return batch

    out = output_dir.prepare_output_dir(str(tmp_path / "out"), resume=False, settings={})
    session = _stand_in_session()
    result = pipeline.run(_stand_in_processor(Engine), ds, out, session, carry=["id"], outputs={"label": ""},
                          id_column=None, answered_name="predictions.parquet", input_size=InputSize(64, "counted: the test's rows"))
    summary = report.run_summary(result, prediction_column="label", labels=["A"])
    assert (summary["classified"], summary["engine errors"], summary["all rows accounted for"]) == (8, 56, True)
    with pytest.raises(report.RunCheckError, match="the model answered"):
        report.require(summary)


def _hold_cpus(ray, cpus: float):
    """An actor that holds ``cpus`` of the local Ray's 2 for as long as it lives."""
    @ray.remote(num_cpus=cpus)
    class Hold:
        def ready(self):
            return True

    holder = Hold.remote()
    ray.get(holder.ready.remote())
    return holder


def test_rows_are_cut_into_batches_by_tasks_as_light_as_the_other_stages(local_ray):
    """Ray's streaming repartition takes its default 1 CPU a task: on two nodes of 2 CPUs, each with an
    engine (1) and a light actor (0.1), no node had a whole CPU free and the run never wrote a row.
    With half a CPU free here, the kit's repartition still runs (its tasks hold the stages' 0.1)."""
    import threading

    holder = _hold_cpus(local_ray, 1.5)
    try:
        ds = stages.batches_of(local_ray.data.from_items([{"n": i} for i in range(50)]), 8, 0.1)
        done: list = []
        worker = threading.Thread(target=lambda: done.append(
            ds.map_batches(lambda b: b, batch_format="pyarrow", num_cpus=0.1).take_all()), daemon=True)
        worker.start()
        worker.join(120)
        assert done and sorted(r["n"] for r in done[0]) == list(range(50))
        assert ds._logical_plan.dag.ray_remote_args["num_cpus"] == 0.1
    finally:
        local_ray.kill(holder)


def test_rows_reach_the_engine_in_blocks_of_one_batch_after_the_notebooks_map_batches(local_ray, tmp_path):
    """The notebooks give rows their ids in a map_batches right after the read, and the light steps
    after the cut run in tasks too: Ray fused the repartition and all of them into one task a read
    block, which merged its output again, and each read block reached the engine whole (200,000 rows
    in 8 blocks: engine tasks of 25,000 rows, no result in 10 minutes on a 2-core CPU)."""
    csv = tmp_path / "in.csv"
    pd.DataFrame({"id": [str(i) for i in range(160)], "text": ["x"] * 160}).to_csv(csv, index=False)
    ds = local_ray.data.read_csv(str(csv), override_num_blocks=2, ray_remote_args={"num_cpus": 0.1}).map_batches(
        lambda b: b.assign(**{REJECT_REASON: ""}), batch_format="pandas", num_cpus=0.1)  # as the notebooks' ids
    cut = stages.batches_of(ds, 8, 0.1).map_batches(run_stats.rows_entering, batch_format="pyarrow",
                                                      zero_copy_batch=True, num_cpus=0.1).map(lambda r: r, num_cpus=0.1)
    sizes = [m.num_rows for bundle in cut.iter_internal_ref_bundles() for m in bundle.metadata]
    assert sum(sizes) == 160 and set(sizes) == {8}, sizes  # not [80, 80]
    # Each block from one read block: Ray's strict repartition joined a block of same-size images (a
    # tensor column) with one of rows without an image, and Arrow refused ("both objects and tensors").
    import numpy as np

    def images(b):
        return b.assign(image=[np.zeros((2, 2, 3), np.uint8) if b["n"].iloc[0] < 12 else None] * len(b))

    mixed = local_ray.data.from_items([{"n": i} for i in range(24)], override_num_blocks=2).map_batches(
        images, batch_format="pandas", num_cpus=0.1)
    bundles = stages.batches_of(mixed, 8, 0.1).iter_internal_ref_bundles()
    assert sorted(m.num_rows for bundle in bundles for m in bundle.metadata) == [4, 4, 8, 8]


def test_a_request_no_node_can_hold_stops_the_run_saying_what_was_asked_and_what_is_free(local_ray, tmp_path):
    """A task that asks for more than any node has free waits for good: the start-up watchdog stops the
    run once such a request has waited (here 3 s; a minute in a run) with no result written, naming the
    request and each node's free CPUs, instead of a timeout that blames the engine."""
    from helpers import autoscale

    def one() -> int:
        return 1

    holder = _hold_cpus(local_ray, 1.5)
    stuck = local_ray.remote(num_cpus=1)(one).remote()
    started = time.monotonic()
    try:
        with pytest.raises(progress.UnplaceableError) as err:
            with progress.first_results_within(tmp_path / "parts", 600, autoscale.unplaceable, unplaceable_s=3):
                time.sleep(120)
        assert time.monotonic() - started < 60
        assert "Ray is waiting to place 1 x {CPU: 1}, which no node has room for (free now: node " in str(err.value)
        assert "CPU 0.5)" in str(err.value) and "with no result written" in str(err.value)
    finally:
        local_ray.cancel(stuck, force=True)
        local_ray.kill(holder)


def test_unplaceable_reads_the_gcs_requests_against_each_nodes_free_resources():
    from ray.core.generated import autoscaler_pb2 as pb

    from helpers import autoscale

    reply = pb.GetClusterStatusReply()
    for n, free in enumerate((0.9, 0.9)):
        node = reply.cluster_resource_state.node_states.add(node_id=bytes([n]) * 28, status=pb.NodeStatus.RUNNING)
        node.available_resources["CPU"] = free
    dead = reply.cluster_resource_state.node_states.add(node_id=b"\x09" * 28, status=pb.NodeStatus.DEAD)
    dead.available_resources["CPU"] = 8.0
    pending = reply.cluster_resource_state.pending_resource_requests.add(count=1)
    pending.request.resources_bundle["CPU"] = 1.0
    said = autoscale.unplaceable(reply)
    assert said.startswith("Ray is waiting to place 1 x {CPU: 1}, which no node has room for (free now: node 00000000: "
                           "CPU 0.9; node 01010101: CPU 0.9)")
    pending.request.resources_bundle["CPU"] = 0.5  # fits either node: nothing to say
    assert autoscale.unplaceable(reply) == ""


def test_the_startup_watchdog_ends_at_the_engines_first_batch_not_the_first_result_file(local_ray, tmp_path):
    """The first result file waits for up to a file's rows (10,000): a slow model on a big input was
    stopped by STARTUP_TIMEOUT_S while it worked. ``finish`` marks the first batch out of the engine
    in Ray's key-value store (once per worker process), and the watchdog ends there."""
    key = f"{stages.FIRST_BATCH}test-{time.time_ns()}"
    assert not stages.first_batch_out(key)
    rows = local_ray.data.from_items([{"id": str(i), "stage": "", "__inference_error__": ""} for i in range(4)])
    rows.map_batches(stages.finish, batch_format="pyarrow", fn_kwargs={
        "carry": ["id"], "outputs": {"label": ""}, "marker": key}).take_all()
    assert stages.first_batch_out(key)
    with progress.first_results_within(tmp_path / "parts", 2, first_batch=lambda: stages.first_batch_out(key)):
        time.sleep(4)  # no result file: without the mark this is a TimeoutError after 2 s
    stages.forget_first_batch(key)
    assert not stages.first_batch_out(key)
