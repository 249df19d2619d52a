import pandas as pd
import pytest

from helpers import data
from conftest import load_script

EXPECTED_COLUMNS = ["Index", "Customer Id", "First Name", "Last Name", "Company", "City", "Country",
                    "Phone 1", "Phone 2", "Email", "Subscription Date", "Website", "Industry"]


def test_sample_has_seed_schema_real_companies_and_balanced_labels():
    df = pd.read_csv(data.sample_customers_path(), keep_default_na=False)
    assert list(df.columns) == EXPECTED_COLUMNS
    assert 250 <= len(df) <= 500
    assert df["Customer Id"].is_unique
    good = df[df["Company"].str.strip() != ""]
    good = good[good["Company"].str.len() < 1000]
    counts = good["Industry"].value_counts()
    assert set(counts.index) == {"Law Firm", "Healthcare", "Technology", "Retail", "Consulting",
                                 "Manufacturing", "Finance", "Real Estate", "Other"}
    assert counts.max() - counts.min() <= 3
    assert {"Walmart", "Mayo Clinic", "Goldman Sachs", "McKinsey & Company"} <= set(good["Company"])
    # The deliberately bad rows that show the reject and engine-error paths.
    assert (df["Company"].str.strip() == "").sum() == 2
    assert (df["Company"].str.len() >= 60_000).sum() == 1


def test_committed_sample_matches_its_generator():
    generator = load_script("make_sample_customers")
    assert data.sample_customers_path().read_text(encoding="utf-8") == generator.render()


def test_resolve_input_path(tmp_path):
    assert data.resolve_input_path(None) == str(data.sample_customers_path())
    assert data.resolve_input_path("https://example.com/customers.csv") == "https://example.com/customers.csv"
    assert data.resolve_input_path("s3://bucket/x.csv") == "s3://bucket/x.csv"
    f = tmp_path / "x.csv"
    f.write_text("a\n1\n")
    assert data.resolve_input_path(str(f)) == str(f.resolve())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.resolve_input_path(str(tmp_path / "missing.csv"))


def test_require_columns_names_what_exists():
    data.require_columns(["a", "b"], ["a", None])
    with pytest.raises(ValueError) as err:
        data.require_columns(["Name", "City"], ["Company"])
    assert "'Company'" in str(err.value) and "'Name', 'City'" in str(err.value)


@pytest.mark.parametrize("value, reason", [
    ("Apple", ""), ("", "empty value"), ("   ", "blank value (only whitespace)"),
    (None, "missing value"), (float("nan"), "missing value"), (42, ""),
])
def test_reject_reason(value, reason):
    assert data.reject_reason(value) == reason


def test_row_ids_from_column_and_from_content():
    batch = pd.DataFrame({"id": [7, 8, 9], "name": ["Apple", "", None]})
    out = data.add_row_ids_and_rejects(batch, "name", "id")
    assert out[data.ROW_ID].tolist() == ["7", "8", "9"]
    assert out[data.REJECT_REASON].tolist() == ["", "empty value", "missing value"]
    hashed = data.add_row_ids_and_rejects(batch, "name", None)[data.ROW_ID]
    again = data.add_row_ids_and_rejects(batch.iloc[::-1].reset_index(drop=True), "name", None)[data.ROW_ID]
    assert hashed.is_unique and len(hashed[0]) == 16
    assert sorted(hashed) == sorted(again)  # stable whatever the order rows arrive in
    assert data.ROW_ID not in batch.columns  # the input batch is not modified
