"""The notebooks run for real (Ray + vLLM + the offline model) with other parameters than their defaults.

nbval runs each notebook with its defaults (see pyproject.toml); these runs go through
scripts/run_notebooks.py, the same path as the job, and assert on what the run wrote.
"""

import json
import time

import pandas as pd
import papermill
import pytest

from conftest import load_script


@pytest.fixture(scope="module")
def runner():
    return load_script("run_notebooks")


@pytest.mark.slow
def test_text_notebook_on_any_csv_with_overrides(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_kit_test_secret_4242")  # must reach no report
    csv = tmp_path / "firms.csv"
    pd.DataFrame({
        "name": ["Walmart", "Pfizer", "", "Goldman Sachs", "Kirkland & Ellis", "Zillow", "Siemens", "   ",
                 "Accenture", "Apple", "Shell", "Target"],
        "truth": ["Retail", "Healthcare", "", "Finance", "Law Firm", "Real Estate", "Manufacturing", "",
                  "Consulting", "Technology", "Other", "Retail"],
    }).to_csv(csv, index=False)
    out = runner.run("text_classification", tmp_path / "results", {
        "INPUT_PATH": str(csv), "TEXT_COLUMN": "name", "ID_COLUMN": None, "LABEL_COLUMN": "truth",
        "LIMIT": 10, "NUM_BLOCKS": 3, "BATCH_SIZE": 4,
    })
    for name in ("text_classification.ipynb", "text_classification.html", "predictions.parquet",
                 "errors.parquet", "confusion_matrix.png", "label_counts.png", "summary.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows read"] == 10
    assert summary["rejected before the model"] == 2 and summary["engine errors"] == 0
    assert summary["classified"] == 8 and summary["all rows accounted for"]
    predictions = pd.read_parquet(out / "predictions.parquet")
    assert predictions["row_id"].is_unique and len(predictions["row_id"].iloc[0]) == 16  # content-hash ids
    assert set(predictions["predicted_label"]) <= {"Law Firm", "Healthcare", "Technology", "Retail", "Consulting",
                                                   "Manufacturing", "Finance", "Real Estate", "Other"}
    assert set(predictions["name"]) <= {"Walmart", "Pfizer", "Goldman Sachs", "Kirkland & Ellis", "Zillow",
                                        "Siemens", "Accenture", "Apple"}
    errors = pd.read_parquet(out / "errors.parquet")
    assert sorted(errors["reason"]) == ["blank value (only whitespace)", "empty value"]
    html = (out / "text_classification.html").read_text()
    assert "accuracy:" in html and "all rows accounted for" in html
    for report_file in ("text_classification.html", "text_classification.ipynb", "summary.json"):
        assert "hf_kit_test_secret_4242" not in (out / report_file).read_text()

    # A second run into the same folder replaces the first run's results instead of adding to them.
    runner.run("text_classification", tmp_path / "results", {
        "INPUT_PATH": str(csv), "TEXT_COLUMN": "name", "ID_COLUMN": None, "LABEL_COLUMN": None, "LIMIT": 4,
    })
    assert len(pd.read_parquet(out / "predictions.parquet")) + len(pd.read_parquet(out / "errors.parquet")) == 4
    assert not (out / "confusion_matrix.png").exists()


@pytest.mark.slow
def test_missing_column_fails_fast_naming_the_columns(runner, tmp_path):
    csv = tmp_path / "people.csv"
    pd.DataFrame({"first": ["Ada"], "employer": ["IBM"]}).to_csv(csv, index=False)
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "results", {"INPUT_PATH": str(csv), "ID_COLUMN": None,
                                                                   "LABEL_COLUMN": None})
    assert "has no column 'Company'" in str(err.value) and "'first', 'employer'" in str(err.value)


@pytest.mark.slow
def test_bad_parameter_fails_before_anything_runs(runner, tmp_path):
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "results", {"BATCH_SIZE": 0, "LABELS": ["Only"]})
    assert "BATCH_SIZE must be a positive integer" in str(err.value)
    assert "LABELS must be a list of at least two" in str(err.value)


@pytest.mark.slow
def test_captioning_notebook_on_hf_parquet_layout(runner, tmp_path):
    from helpers import image_data

    files = image_data.sample_files()
    keys = ["astronaut", "coffee_cmyk", "rocket_transparent_png", "broken_truncated", "broken_bomb", "animated_gif"]
    (tmp_path / "pq").mkdir()
    pd.DataFrame({"key": keys, "jpg": [{"bytes": files[k], "path": f"{k}.jpg"} for k in keys]}).to_parquet(
        tmp_path / "pq" / "train-0000.parquet")
    out = runner.run("vlm_captioning", tmp_path / "results", {
        "INPUT_PATH": str(tmp_path / "pq"), "ID_COLUMN": "key", "IMAGE_TOKENS": 16, "MAX_TOKENS": 8,
        "BATCH_SIZE": 2, "NUM_BLOCKS": 2, "KEEP_ASPECT": False,
    })
    for name in ("vlm_captioning.ipynb", "vlm_captioning.html", "captions.parquet", "errors.parquet",
                 "captions.png", "summary.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["images read"] == 6 and summary["captioned"] == 4
    assert summary["rejected before the model"] == 2 and summary["all images accounted for"]
    captions = pd.read_parquet(out / "captions.parquet")
    assert sorted(captions["row_id"]) == sorted(["astronaut", "coffee_cmyk", "rocket_transparent_png", "animated_gif"])
    assert set(captions.columns) == {"row_id", "source", "key", "width", "height", "vision_tokens", "caption",
                                     "num_input_tokens", "num_generated_tokens"}  # never the image
    assert (captions["width"] == captions["height"]).all() and (captions["vision_tokens"] <= 16).all()
    assert (captions["num_generated_tokens"] >= 1).all() and (captions["num_generated_tokens"] <= 8).all()
    errors = pd.read_parquet(out / "errors.parquet").set_index("row_id")
    assert errors.loc["broken_truncated", "reason"] == "truncated file"
    assert errors.loc["broken_bomb", "reason"].startswith("too many pixels")
    assert "all images accounted for" in (out / "vlm_captioning.html").read_text()


@pytest.mark.slow
def test_unschedulable_request_fails_fast_instead_of_hanging(runner, tmp_path):
    started = time.monotonic()
    with pytest.raises(papermill.PapermillExecutionError) as err:
        runner.run("text_classification", tmp_path / "results", {"ACCELERATOR_TYPE": "L4", "LIMIT": 5})
    assert "cannot be scheduled and would wait forever" in str(err.value)
    assert "need 1 GPUs, but the cluster has 0" in str(err.value)
    assert time.monotonic() - started < 180
