"""The notebooks run for real (Ray + vLLM + the offline model) with other parameters than their defaults.

nbval runs each notebook with its defaults (see pyproject.toml); these runs go through
scripts/run_notebooks.py, the same path as the job, and assert on what the run wrote. (A spreadsheet's
CSV behind a presigned URL, with other columns and settings: the Ray job in tests/test_autoscaler.py.)
"""

import json
import time
from pathlib import Path

import pandas as pd
import papermill
import pytest

from conftest import BUCKET, load_script


@pytest.fixture(scope="module")
def runner():
    return load_script("run_notebooks")


@pytest.mark.slow
def test_text_notebook_stops_before_the_pipeline_on_repeated_or_missing_ids_and_on_an_empty_csv(runner, tmp_path,
                                                                                               s3):
    """Repeated and empty ids were classified, then reported as lost rows (and resuming by them would
    skip a finished row's twin); a header-only CSV stopped with a TypeError. The first CSV is read
    from a bucket (moto's S3 server), as a job on a cluster reads its input: the id check reads it
    all there, through the same filesystem as the pipeline's read."""
    ids = tmp_path / "ids.csv"
    pd.DataFrame({"Customer Id": ["c1", "c2", "c1", "", "c4"],
                  "Company": ["Walmart", "Pfizer", "Shell", "Apple", "Zillow"]}).to_csv(ids, index=False)
    s3.upload_file(str(ids), BUCKET, "ids/part-0.csv")
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "ids", {"INPUT_PATH": f"s3://{BUCKET}/ids/", "LABEL_COLUMN": None})
    assert err.value.ename == "IdColumnError"
    assert "1 of 5 rows have no 'Customer Id' value" in err.value.evalue and "'c1' (2 rows)" in err.value.evalue
    assert not (tmp_path / "ids" / "text_classification" / "parts").exists()  # stopped before the pipeline
    empty = tmp_path / "empty.csv"
    empty.write_text("Customer Id,Company,Industry\n")
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "empty", {"INPUT_PATH": str(empty)})
    assert err.value.ename == "ParameterError" and "holds no rows" in err.value.evalue


def _failed_in_the_check_cell(err, out: Path) -> str:
    """The error, after asserting it came from the notebook's first check, before the model or Ray."""
    executed = json.loads((out / f"{out.name}.ipynb").read_text())
    failed = [c for c in executed["cells"] if c["cell_type"] == "code" and any(
        o.get("output_type") == "error" for o in c.get("outputs", []))]
    assert len(failed) == 1 and "".join(failed[0]["source"]).startswith("source = "), failed
    assert err.value.ename in ("ParameterError", "NotTheKitsFolderError")
    return err.value.evalue


@pytest.mark.slow
def test_missing_column_fails_fast_naming_the_columns(runner, tmp_path):
    csv = tmp_path / "people.csv"
    pd.DataFrame({"first": ["Ada"], "employer": ["IBM"]}).to_csv(csv, index=False)
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "results", {"INPUT_PATH": str(csv), "ID_COLUMN": None,
                                                                   "LABEL_COLUMN": None})
    message = _failed_in_the_check_cell(err, tmp_path / "results" / "text_classification")
    assert "TEXT_COLUMN='Company' is not a column of" in message and "'first', 'employer'" in message


def test_bad_inputs_and_outputs_stop_both_notebooks_before_the_model(runner, tmp_path):
    """INPUT_PATH was resolved after the model's conversion and Ray's start; a wrong parquet ID_COLUMN
    surfaced as Ray's error, ID_COLUMN on a webdataset was ignored; a folder that is not the kit's was
    refused only after a pass over the ids. Now the first cell after the parameters names each, one
    concept at a time (the input's problems, then the output folder's), before the model or Ray."""
    training = tmp_path / "training"
    training.mkdir()
    (training / "model.ckpt").write_text("weights")
    csv = tmp_path / "customers.csv"
    pd.DataFrame({"Customer Id": ["c1"], "Company": ["IBM"]}).to_csv(csv, index=False)
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "text", {"INPUT_PATH": str(tmp_path / "missing.csv"),
                                                             "OUTPUT_DIR": str(training)})
    message = _failed_in_the_check_cell(err, tmp_path / "text" / "text_classification")
    assert "missing.csv" in message and "does not exist" in message
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "text1", {"INPUT_PATH": str(csv), "OUTPUT_DIR": str(training),
                                                               "LABEL_COLUMN": None})
    assert "not written by this kit" in _failed_in_the_check_cell(err, tmp_path / "text1" / "text_classification")
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "text2", {"INPUT_PATH": str(csv), "ID_COLUMN": "customer_id",
                                                              "LABEL_COLUMN": None})
    assert "ID_COLUMN='customer_id' is not a column of" in _failed_in_the_check_cell(err, tmp_path / "text2" / "text_classification")
    # Captioning: ID_COLUMN on the bundled webdataset sample, a folder that is not the kit's.
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("vlm_captioning", tmp_path / "caption", {"ID_COLUMN": "id", "OUTPUT_DIR": str(training)})
    message = _failed_in_the_check_cell(err, tmp_path / "caption" / "vlm_captioning")
    assert "ID_COLUMN='id' applies to parquet input only; this input is webdataset" in message
    parquet = tmp_path / "images.parquet"
    pd.DataFrame({"key": ["a"], "image": [b"not an image"]}).to_parquet(parquet)
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("vlm_captioning", tmp_path / "caption2", {"INPUT_PATH": str(parquet), "ID_COLUMN": "id"})
    message = _failed_in_the_check_cell(err, tmp_path / "caption2" / "vlm_captioning")
    assert "ID_COLUMN='id' is not a column of" in message and "'key', 'image'" in message
    assert (training / "model.ckpt").read_text() == "weights" and sorted(p.name for p in training.iterdir()) == [
        "model.ckpt"]


@pytest.mark.slow
def test_bad_parameter_fails_before_anything_runs(runner, tmp_path):
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "results", {"ENGINE": {"batch_size": 0}, "LABELS": ["Only"]})
    assert "LABELS must be a list of at least two" in str(err.value)
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "results2", {"ENGINE": "{'batch_size': 0}"})  # as -p passes it
    assert "ENGINE['batch_size']=0 is not a valid value" in str(err.value)


@pytest.mark.slow
def test_unschedulable_request_fails_fast_instead_of_hanging(runner, tmp_path):
    from helpers import cluster

    here = {n["gpu_type"] for n in cluster.visible()["nodes"]}  # a CPU machine (CI) or a GPU one
    wanted = next(t for t in ("L4", "H100") if t not in here)  # a GPU type it does not have
    started = time.monotonic()
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "results", {"PRESET": "text-cpu-offline", "LIMIT": 5,
                                                                   "ENGINE": {"accelerator_type": wanted}})
    assert "cannot be scheduled and would wait forever" in str(err.value)
    assert f"accelerator_type='{wanted}' is not in the cluster" in str(err.value)
    assert time.monotonic() - started < 180


@pytest.mark.slow
@pytest.mark.extended  # the wait itself: test_pipeline's stand-in engines, in CI
def test_an_engine_that_does_not_start_in_time_stops_the_run(runner, tmp_path):
    # 10 s is less than the CPU engine needs to start: the run must stop, not wait.
    started = time.monotonic()
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "results", {"ENGINE": {"startup_timeout_s": 10}, "LIMIT": 5})
    assert "EngineStartError" in str(err.value) and "did not start (not ready in 10 s)" in str(err.value)
    assert time.monotonic() - started < 240


@pytest.mark.slow
@pytest.mark.extended  # its fix: test_pipeline's typing of row_hash and test_image_input's readers, in CI
def test_captioning_parquet_of_good_images_without_an_id_column_runs_to_its_summary(runner, tmp_path):
    """Every image good, no ID_COLUMN, no LIMIT: the run cell failed after the pipeline (pandas'
    IndexError in ``pipeline.collect``) because the results carried Ray's uint64 ``row_hash`` as pickled
    Python objects (a row map turns it into a Python int, and Arrow cannot infer a type for ints past
    int64). The results must carry it as uint64, the type Ray's reader gives it, so that a resume
    compares like with like. Hugging Face rows that name each image's file (the other parquet layouts
    read the same through Ray's reader: test_image_input)."""
    import pyarrow.parquet as pq
    import ray.data  # noqa: F401  (registers Ray's Arrow extension types, as any notebook's kernel has)

    from helpers import images

    from conftest import good_parquet_images

    count = good_parquet_images(tmp_path / "pq", "hf-paths")
    out = runner.run("vlm_captioning", tmp_path / "results", {"INPUT_PATH": str(tmp_path / "pq")})
    summary = json.loads((Path(out) / "summary.json").read_text())
    assert summary["images read"] == summary["captioned"] == count and summary["all images accounted for"], summary
    for table in ("captions.parquet", "errors.parquet"):
        schema = pq.read_schema(Path(out) / table)
        assert schema.field(images.ROW_HASH).type == "uint64", (table, schema)
    captions = pd.read_parquet(Path(out) / "captions.parquet")
    assert captions[images.ROW_ID].is_unique and len(captions) == count
