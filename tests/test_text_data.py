"""The text notebook's input, as users' CSVs come: encodings, a header only, ids of digits, empty and
repeated ids, a file behind a URL."""

import pandas as pd
import pytest

from conftest import load_script
from helpers import pipeline, text_data as data
from helpers.parameters import ParameterError

COLUMNS = ["Index", "Customer Id", "First Name", "Last Name", "Company", "City", "Country", "Phone 1", "Phone 2",
           "Email", "Subscription Date", "Website", "Industry"]


def test_the_sample_has_the_tutorials_columns_real_companies_balanced_labels_and_three_bad_rows():
    df = pd.read_csv(data.sample_path(), keep_default_na=False)
    assert list(df.columns) == COLUMNS and 250 <= len(df) <= 500 and df["Customer Id"].is_unique
    good = df[(df["Company"].str.strip() != "") & (df["Company"].str.len() < 1000)]
    counts = good["Industry"].value_counts()
    assert len(counts) == 9 and counts.max() - counts.min() <= 3
    assert {"Walmart", "Mayo Clinic", "Goldman Sachs", "McKinsey & Company"} <= set(good["Company"])
    assert (df["Company"].str.strip() == "").sum() == 2 and (df["Company"].str.len() >= 60_000).sum() == 1


def test_the_committed_sample_matches_its_generator():
    assert data.sample_path().read_text(encoding="utf-8") == load_script("make_sample_customers").render()


def test_the_input_is_checked_counted_and_its_columns_named(tmp_path):
    sample = data.csv_input(None, "Company", "Customer Id", "Industry")
    assert sample.columns == COLUMNS and sample.rows == 309 and sample.rows_basis == "counted: 309 rows"
    with pytest.raises(ParameterError) as err:
        data.csv_input(None, "Compnay", "Id", None)
    assert "TEXT_COLUMN='Compnay' is not a column" in str(err.value) and "ID_COLUMN='Id'" in str(err.value)
    assert "'Customer Id'" in str(err.value)  # the columns there are
    with pytest.raises(ParameterError, match="does not exist"):
        data.csv_input(str(tmp_path / "missing.csv"), "Company", None, None)
    (tmp_path / "empty.csv").write_text("Customer Id,Company,Industry\n")
    with pytest.raises(ParameterError, match="holds no rows"):
        data.csv_input(str(tmp_path / "empty.csv"), "Company", None, None)
    big = tmp_path / "big.csv"
    big.write_text("Company\n" + "".join(f"Company number {i}\n" for i in range(100_000)))
    rows = data.csv_input(str(big), "Company", None, None)
    assert rows.rows_basis.startswith("estimated") and abs(rows.rows - 100_000) / 100_000 < 0.02


def test_the_first_rows_with_a_text_to_send_come_with_the_input_for_the_prompt_cell(tmp_path):
    """The prompt cell measures your requests before Ray starts, so the engines start fitted while the data
    is read: on the first file's first rows as Ray reads them (ids of digits as text), none without a text."""
    first = pd.read_csv(data.sample_path(), dtype=str, keep_default_na=False).head(203)
    sent = first[first["Company"].str.strip() != ""].head(200)
    sample = data.csv_input(None, "Company", "Customer Id", "Industry").sample
    assert [r["Customer Id"] for r in sample] == list(sent["Customer Id"]) and len(sample) == 200
    assert [r["Company"] for r in sample] == list(sent["Company"]) and all(type(r["Index"]) is int for r in sample)
    (tmp_path / "ids.csv").write_text("Customer Id,Company\n007,Acme\n008,\n")
    assert data.csv_input(str(tmp_path / "ids.csv"), "Company", "Customer Id", None).sample == ({"Customer Id": "007", "Company": "Acme"},)
    sent.to_csv(tmp_path / "c.csv.gz", index=False)
    assert data.csv_input(str(tmp_path / "c.csv.gz"), "Company", None, None).sample == ()  # compressed: not apart


def test_every_files_encoding_is_checked_naming_the_file_and_the_byte(tmp_path):
    """Ray reads every file with one encoding: cp1252 bytes past the first MiB, or a second file in
    another encoding, failed the whole read with Ray's raw error (or read wrong text silently)."""
    header = "Customer Id,Company,Industry\n"
    rows = "".join(f"c{i},Company number {i},Retail\n" for i in range(40_000))  # past the first MiB
    late = tmp_path / "late"
    late.mkdir()
    (late / "a.csv").write_bytes((header + rows + "c-x,Nestlé,Retail\n").encode("cp1252"))
    where = len((header + rows + "c-x,Nestl").encode("ascii"))
    assert where > data.HEAD_BYTES
    with pytest.raises(ParameterError, match=f"a.csv is not utf8 at byte {where:,} .e9; it reads as cp1252 there."):
        data.csv_input(str(late), "Company", "Customer Id", None)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "1.csv").write_bytes((header + "c1,Société Générale,Finance\n").encode("cp1252"))
    (mixed / "2.csv").write_bytes((header + "c2,Nestlé,Retail\n").encode("utf-8"))
    with pytest.raises(ParameterError, match="2.csv is UTF-8, but the first file is cp1252"):
        data.csv_input(str(mixed), "Company", None, None)
    (mixed / "2.csv").write_bytes((header + "c2,Nestle,Retail\n").encode("utf-8"))  # ASCII reads the same in both
    assert data.csv_input(str(mixed), "Company", None, None).encoding == "cp1252"


def test_a_csv_behind_a_url_is_checked_before_anything_runs(http_folder):
    root, url = http_folder
    (root / "c.csv").write_bytes("Customer Id,Company\n1,Nestlé\n".encode("cp1252"))
    found = data.csv_input(f"{url}/c.csv", "Company", "Customer Id", None)
    assert found.encoding == "cp1252" and found.columns == ["Customer Id", "Company"] and found.rows is None
    with pytest.raises(ParameterError, match="LABEL_COLUMN='Industry' is not a column"):
        data.csv_input(f"{url}/c.csv", "Company", None, "Industry")


@pytest.mark.parametrize("value, reason", [("Apple", ""), ("", "empty value"), ("   ", "blank value (only whitespace)"),
                                           (None, "missing value"), (float("nan"), "missing value"), (42, "")])
def test_reject_reason(value, reason):
    assert data.reject_reason(value) == reason


def test_row_ids_come_from_the_id_column_or_the_rows_content():
    batch = pd.DataFrame({"id": [7, 8, 9], "name": ["Apple", "", None]})
    out = data.add_row_ids(batch, "name", "id")
    assert out[pipeline.ROW_ID].tolist() == ["7", "8", "9"]
    assert out[pipeline.REJECT_REASON].tolist() == ["", "empty value", "missing value"]
    hashed = data.add_row_ids(batch, "name", None)[pipeline.ROW_ID]
    again = data.add_row_ids(batch.iloc[::-1].reset_index(drop=True), "name", None)[pipeline.ROW_ID]
    assert hashed.is_unique and len(hashed[0]) == 16 and sorted(hashed) == sorted(again)
    assert pipeline.ROW_ID not in batch.columns


def test_users_csvs_as_they_come(local_ray, tmp_path):
    """An id column of digits with text further down failed a run mid-way (types inferred per block);
    empty and repeated ids were classified and then reported as lost rows."""
    import pyarrow.csv as pacsv

    ray = local_ray
    rows = ["Customer Id,Company,Industry"] + [f"{i},{i},Retail" for i in range(3000)] + ["C-17,Acme,Retail"]
    (tmp_path / "late.csv").write_text("\n".join(rows) + "\n")
    source = data.csv_input(str(tmp_path / "late.csv"), "Company", "Customer Id", "Industry")
    small_blocks = pacsv.ReadOptions(block_size=4096)  # what a big file's first block is to a 1 MB one
    with pytest.raises(Exception, match="Failed to read CSV file"):
        ray.data.read_csv(source.path, read_options=small_blocks).take_all()
    typed = ray.data.read_csv(source.path, read_options=small_blocks, convert_options=source.convert_options)
    assert len(pipeline.check_ids(typed, "Customer Id")) == 200 and typed.take_all()[-1]["Customer Id"] == "C-17"
    frame = pd.DataFrame({"Customer Id": ["a", "b", "a", "", None, "c", " "], "Company": list("ABCDEFG")})
    frame.to_csv(tmp_path / "ids.csv", index=False)
    ids = data.csv_input(str(tmp_path / "ids.csv"), "Company", "Customer Id", None)
    with pytest.raises(pipeline.IdColumnError) as err:
        pipeline.check_ids(ray.data.read_csv(ids.path, convert_options=ids.convert_options), "Customer Id")
    assert "3 of 7 rows have no 'Customer Id' value" in str(err.value) and "'a' (2 rows)" in str(err.value)
    assert "set ID_COLUMN=None" in str(err.value)
