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


def test_require_columns_says_the_input_is_empty():
    with pytest.raises(data.EmptyInputError, match="'s3://b/x.csv' holds no rows"):
        data.require_columns(None, ["Company"], path="s3://b/x.csv")


def test_id_report_names_the_problem_and_the_fix():
    assert data.IdReport(rows=5, empty=0, repeated_values=0, examples=()).problem("id") == ""
    message = data.IdReport(rows=5, empty=3, repeated_values=7, examples=(("a", 2), ("b", 2))).problem("id")
    assert "3 of 5 rows have no 'id' value" in message and "'a' (2 rows), 'b' (2 rows) and 5 more" in message
    assert "set ID_COLUMN=None" in message


def test_users_csvs_as_they_come(local_ray, tmp_path):
    """A header-only CSV stopped with a TypeError in require_columns (Ray's columns() is None); an
    id column of digits with text further down failed the run mid-way (types inferred per block);
    duplicate and empty ids were classified and then reported as lost rows."""
    import pyarrow.csv as pacsv

    ray = local_ray
    (tmp_path / "empty.csv").write_text("Customer Id,Company,Industry\n")
    empty = ray.data.read_csv(str(tmp_path / "empty.csv"))
    with pytest.raises(data.EmptyInputError, match="holds no rows"):
        data.require_columns(empty.columns(), ["Company"], path=str(tmp_path / "empty.csv"))

    rows = ["Customer Id,Company,Industry"] + [f"{i},{i},Retail" for i in range(3000)] + ["C-17,Acme,Retail"]
    (tmp_path / "late.csv").write_text("\n".join(rows) + "\n")
    small_blocks = pacsv.ReadOptions(block_size=4096)  # what a big file's first block is to a 1 MB file
    with pytest.raises(Exception, match="Failed to read CSV file"):
        ray.data.read_csv(str(tmp_path / "late.csv"), read_options=small_blocks).take_all()
    typed = ray.data.read_csv(str(tmp_path / "late.csv"), read_options=small_blocks,
                              convert_options=data.string_columns("Company", "Customer Id", None, "Not there"))
    read = typed.take_all()
    assert len(read) == 3001 and read[-1]["Customer Id"] == "C-17" and read[0]["Company"] == "0"
    assert data.check_ids(typed, "Customer Id").rows == 3001

    frame = pd.DataFrame({"Customer Id": ["a", "b", "a", "", None, "c", " "], "Company": list("ABCDEFG")})
    frame.to_csv(tmp_path / "ids.csv", index=False)
    ds = ray.data.read_csv(str(tmp_path / "ids.csv"), convert_options=data.string_columns("Customer Id"))
    with pytest.raises(data.IdColumnError) as err:
        data.check_ids(ds, "Customer Id")
    assert "3 of 7 rows have no 'Customer Id' value" in str(err.value)
    assert "1 'Customer Id' value is shared by several rows: 'a' (2 rows)." in str(err.value)


def test_every_files_encoding_is_checked_before_the_pipeline_naming_the_file_and_the_byte(tmp_path):
    """The encoding came from the first MiB of the first file: cp1252 bytes past it, or a second file
    in another encoding, failed the whole read in Ray with its raw error (or, a UTF-8 file read as
    cp1252, gave wrong text silently). The plan's checks now decode every file whole."""
    from helpers import inputs

    defaults = load_script("run_notebooks").defaults("text_classification")
    header = "Customer Id,Company,Industry\n"
    ascii_rows = "".join(f"c{i},Company number {i},Retail\n" for i in range(40_000))  # past the first MiB
    late = tmp_path / "late"
    late.mkdir()
    (late / "a.csv").write_bytes((header + ascii_rows + "c-x,Nestlé,Retail\n").encode("cp1252"))
    where = len((header + ascii_rows + "c-x,Nestl").encode("ascii"))
    assert where > inputs.HEAD_BYTES
    with pytest.raises(ValueError) as err:
        inputs.check_text({**defaults, "INPUT_PATH": str(late), "OUTPUT_DIR": str(tmp_path / "o1")})
    assert f"a.csv is not utf8 at byte {where:,} (e9; it reads as cp1252 there)" in str(err.value)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "1.csv").write_bytes((header + "c1,Société Générale,Finance\n").encode("cp1252"))
    (mixed / "2.csv").write_bytes((header + "c2,Nestlé,Retail\n").encode("utf-8"))
    with pytest.raises(ValueError) as err:
        inputs.check_text({**defaults, "INPUT_PATH": str(mixed), "OUTPUT_DIR": str(tmp_path / "o2")})
    assert "2.csv is UTF-8, but the first file is cp1252" in str(err.value)
    (mixed / "2.csv").write_bytes((header + "c2,Nestle,Retail\n").encode("utf-8"))  # ASCII: the same in both
    assert inputs.check_text({**defaults, "INPUT_PATH": str(mixed), "OUTPUT_DIR": str(tmp_path / "o3")}).encoding == "cp1252"
