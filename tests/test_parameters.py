"""Every parameter is checked by the notebook's own check cell before anything starts (no model, no
Ray), and a bad one is named with what to do."""

import nbformat
import pytest
from conftest import load_script, notebook_cells, run_cells

from helpers import parameters, plans
from helpers.parameters import ParameterError

NOTEBOOKS = ("text_classification", "vlm_captioning")
CHECK_CELL = "plans.fit("  # the notebooks' first cell of checks ends with the fit


def parameters_cell(name: str) -> str:
    return next(c.source for c in notebook_cells(name) if "parameters" in c.metadata.get("tags", []))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_parameters_are_literals_with_a_comment_each_on_short_lines_and_at_most_18(name):
    found = load_script("run_notebooks").parse_cell(parameters_cell(name))
    assert len(found) == len({p.name for p in found}) <= 18
    assert all(p.name.isupper() and p.comment for p in found), [p.name for p in found if not p.comment]
    assert not [line for line in parameters_cell(name).splitlines() if len(line) > 100]
    assert [p.name for p in found][:5] == (["INPUT_PATH", "TEXT_COLUMN", "MODEL_SOURCE", "PRESET", "OUTPUT_DIR"]
                                           if name == "text_classification" else
                                           ["INPUT_PATH", "IMAGE_COLUMN", "MODEL_SOURCE", "PRESET", "OUTPUT_DIR"])


def test_the_parameters_parser_takes_multi_line_literals_and_refuses_code():
    cell = 'A = 1  # one\nLABELS = [  # the labels\n    "x", "y",\n]\nB = None  # none'
    assert [(p.name, p.value, p.source, p.comment) for p in load_script("run_notebooks").parse_cell(cell)] == [
        ("A", 1, "1", "one"), ("LABELS", ["x", "y"], '["x", "y"]', "the labels"), ("B", None, "None", "none")]
    with pytest.raises(ValueError, match="only NAME = literal"):
        load_script("run_notebooks").parse_cell("import os")
    with pytest.raises(ValueError):
        load_script("run_notebooks").parse_cell("A = os.getcwd()  # not a literal")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_defaults_pass_the_check_cell_and_fit_the_cpu_preset(name, tmp_path):
    ns = run_cells(name, CHECK_CELL, OUTPUT_DIR=str(tmp_path / "out"))
    assert ns["plan"].name.endswith("cpu-offline") and ns["plan"].accelerator_type is None
    assert ns["plan"].model_path.startswith("/")
    assert not (tmp_path / "out").exists()  # checked, not touched


@pytest.mark.parametrize("name, parameter, value, message", [
    ("text_classification", "LIMIT", 0, "LIMIT must be a positive integer"),
    ("text_classification", "PRESET", "text-llama8b-l5", "PRESET must be one of ['auto', 'text-cpu-offline'"),
    ("text_classification", "PRESET", "vision-qwen3b-l4", "PRESET must be one of"),  # the other notebook's
    ("vlm_captioning", "PRESET", "text-cpu-offline", "PRESET must be one of ['auto', 'vision-cpu-offline'"),
    ("text_classification", "MODEL_SOURCE", "", "MODEL_SOURCE must be a non-empty string"),
    ("text_classification", "CONFIDENCE", "true", "CONFIDENCE must be True or False, got 'true' (a string"),
    ("text_classification", "REVIEW_BELOW", 0, "REVIEW_BELOW must be a number from"),
    ("text_classification", "REVIEW_BELOW", True, "REVIEW_BELOW must be a number from"),
    ("text_classification", "LABELS", ["Only one"], "LABELS must be a list of at least two"),
    ("text_classification", "LABELS", ["A", "B", "A"], "LABELS has duplicates: ['A']"),
    ("text_classification", "USER_TEMPLATE", "Company: {name}", "USER_TEMPLATE must contain '{text}'"),
    ("text_classification", "TEMPERATURE", 3, "TEMPERATURE must be a number from 0 to 2"),
    ("text_classification", "TASK", " ", "TASK must be a non-empty string"),
    ("text_classification", "ID_COLUMN", 3, "ID_COLUMN must be a non-empty string or None"),
    ("text_classification", "TEXT_COLUMN", "Compnay", "TEXT_COLUMN='Compnay' is not a column of"),
    ("text_classification", "OUTPUT_DIR", "", "OUTPUT_DIR must be a non-empty string"),
    ("text_classification", "RESUME", "yes", "RESUME must be True or False"),
    ("vlm_captioning", "START_OVER", "false", "START_OVER must be True or False, got 'false' (a string"),
    ("vlm_captioning", "INPUT_FORMAT", "zip", "INPUT_FORMAT must be auto, webdataset, parquet or images"),
    ("vlm_captioning", "ID_COLUMN", "key", "ID_COLUMN='key' applies to parquet input only"),
    ("vlm_captioning", "IMAGE_TOKENS", 0, "IMAGE_TOKENS must be a number from 1 to 16384"),
    ("vlm_captioning", "IMAGE_TOKENS", 100_000, "IMAGE_TOKENS must be a number from 1 to 16384"),
    ("vlm_captioning", "MAX_PIXELS", None, "MAX_PIXELS must be a positive integer"),
    ("vlm_captioning", "MAX_TOKENS", 0, "MAX_TOKENS must be a positive integer"),
    ("vlm_captioning", "PROMPT", " ", "PROMPT must be a non-empty string"),
    ("vlm_captioning", "KEEP_ASPECT", "yes", "KEEP_ASPECT must be True or False"),
    ("text_classification", "ENGINE", {"batch_sise": 64}, "ENGINE['batch_sise'] is not a setting: did you mean batch_size?"),
    ("text_classification", "ENGINE", {"batch_size": 0}, "ENGINE['batch_size']=0 is not a valid value"),
    ("text_classification", "ENGINE", {"concurrency": (4, 2)}, "ENGINE['concurrency']=(4, 2) is not a valid value"),
    ("text_classification", "ENGINE", {"concurrency": True}, "ENGINE['concurrency']=True is not a valid value"),
    ("vlm_captioning", "ENGINE", {"replicas_per_gpu": 0.5}, "ENGINE['replicas_per_gpu']=0.5 is not a valid value"),
    ("text_classification", "ENGINE", {"trust_remote_code": "false"}, "ENGINE['trust_remote_code']='false'"),
    ("text_classification", "ENGINE", {"enforce_eager": True, "torch_compile": True}, "both to compile"),
    ("text_classification", "ENGINE", {"startup_timeout_s": 1}, "ENGINE['startup_timeout_s']=1"),
    ("text_classification", "ENGINE", {"kv_cache_gib": 1.5}, "ENGINE['kv_cache_gib']=1.5"),
    ("text_classification", "ENGINE", "concurrency=2", "ENGINE must be a dict of settings"),
])
def test_each_bad_parameter_is_named_before_anything_starts(name, parameter, value, message, tmp_path):
    with pytest.raises(ParameterError, match="Invalid parameters") as caught:
        run_cells(name, CHECK_CELL, **{"OUTPUT_DIR": str(tmp_path / "out"), parameter: value})
    assert message in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_every_problem_of_one_concept_is_listed_at_once(tmp_path):
    with pytest.raises(ParameterError) as caught:
        run_cells("text_classification", CHECK_CELL, OUTPUT_DIR=str(tmp_path), TEMPERATURE=9, LABELS=["x"], TASK="")
    assert str(caught.value).count("\n  - ") == 3


def test_engine_from_the_command_line_is_read_as_the_literal_it_spells():
    """``papermill -p ENGINE "{'concurrency': 2}"`` passes text; so does ``-p ... "(2, 2)"``."""
    assert plans.check_engine("{'concurrency': [2, 2], 'batch_size': 8}") == []
    assert parameters.literal("(2, 2)") == (2, 2) and parameters.literal("plain") == "plain"


def test_stall_timeout_is_an_engine_setting_of_ten_seconds_or_more():
    assert plans.check_engine({"stall_timeout_s": 600}) == []
    assert plans.check_engine({"stall_timeout_s": 5}) == ["ENGINE['stall_timeout_s']=5 is not a valid value"]


def test_a_name_that_is_not_a_parameter_is_named_with_the_closest_one():
    known = {"LIMIT", "INPUT_PATH", "ENGINE"}
    assert load_script("run_notebooks").unknown_names(["LIMT", "LIMIT"], known, "text_classification") == [
        "LIMT is not a parameter of text_classification (not in its parameters cell): did you mean LIMIT?"]
    assert "known: ENGINE, INPUT_PATH, LIMIT" in load_script("run_notebooks").unknown_names(["QQQQQQ"], known, "nb")[0]


def test_papermill_reads_every_parameter(repo):
    import papermill

    for name in NOTEBOOKS:
        inferred = papermill.inspect_notebook(str(repo / "notebooks" / f"{name}.ipynb"))
        assert set(inferred) == {p.name for p in load_script("run_notebooks").parse_cell(parameters_cell(name))}


#: What the notebooks call the objects the kit's helpers return.
RETURNED = {"source", "folder", "plan", "functions", "kept", "run", "written"}


def test_a_notebook_calls_at_most_24_helpers_and_never_globals(repo):
    """The notebooks show the flow (Ray Data's read, your functions, the engines, the write) and the kit's helpers
    wrap around it: at most 24 uses of a helper (a module's function, called or handed to Ray, or a method of what
    one returned; the engines' start, wait, run and free took the place of Ray Data LLM's processor), no ``globals()``."""
    import ast

    for name in NOTEBOOKS:
        code = "\n".join(c.source for c in nbformat.read(repo / "notebooks" / f"{name}.ipynb", as_version=4).cells
                         if c.cell_type == "code")
        tree = ast.parse(code)
        modules = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "helpers"
                   for a in n.names}
        functions = [f"{n.value.id}.{n.attr}" for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                     and isinstance(n.value, ast.Name) and n.value.id in modules and not n.attr.isupper()]
        methods = [f"{n.func.value.id}.{n.func.attr}" for n in ast.walk(tree) if isinstance(n, ast.Call)
                   and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id in RETURNED]
        assert len(functions) + len(methods) <= 24, (name, functions, methods)
        assert "globals()" not in code and "processor(ds)" in code
        assert "pipeline.write(" in code
