import ast

import nbformat
import pytest

from helpers import params


def notebook_defaults(repo, name):
    nb = nbformat.read(repo / "notebooks" / f"{name}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    namespace: dict = {}
    exec(cell.source, namespace)
    return cell, {k: v for k, v in namespace.items() if k.isupper()}


def test_text_defaults_are_valid(repo):
    _, defaults = notebook_defaults(repo, "text_classification")
    assert params.text_problems(defaults) == []
    assert defaults["MODEL_SOURCE"] == "offline" and defaults["ACCELERATOR_TYPE"] is None


def test_parameters_are_literals_with_a_comment_each(repo):
    for path in sorted((repo / "notebooks").glob("*.ipynb")):
        cell, _ = notebook_defaults(repo, path.stem)
        for line in cell.source.splitlines():
            if not line.strip():
                continue
            code, _, comment = line.partition("  # ")
            name, _, value = code.partition(" = ")
            assert name.isupper() and comment.strip(), f"{path.name}: {line!r} needs NAME = literal  # comment"
            ast.literal_eval(value)


@pytest.mark.parametrize("name, value, message", [
    ("LIMIT", 0, "LIMIT must be a positive integer"),
    ("NUM_BLOCKS", -1, "NUM_BLOCKS must be a positive integer"),
    ("BATCH_SIZE", "64", "BATCH_SIZE must be a positive integer"),
    ("CONCURRENCY", (4, 2), "CONCURRENCY must be"),
    ("CONCURRENCY", True, "CONCURRENCY must be"),
    ("LABELS", ["Only one"], "LABELS must be a list of at least two"),
    ("LABELS", ["A", "B", "A"], "LABELS has duplicates: ['A']"),
    ("USER_TEMPLATE", "Company: {name}", "USER_TEMPLATE must contain '{text}'"),
    ("TEMPERATURE", 3, "TEMPERATURE must be between 0 and 2"),
    ("MODEL_SOURCE", "", "MODEL_SOURCE must be"),
    ("ACCELERATOR_TYPE", "", "ACCELERATOR_TYPE must be None"),
    ("ID_COLUMN", 3, "ID_COLUMN must name a column or be None"),
    ("OUTPUT_DIR", "", "OUTPUT_DIR must be a folder path"),
    ("KV_CACHE_GIB", 0, "KV_CACHE_GIB must be a positive number"),
    ("CPU_STAGE_CPUS", 0, "CPU_STAGE_CPUS must be in (0, 8]"),
    ("RESUME", "yes", "RESUME must be True or False"),
    ("STARTUP_TIMEOUT_S", 0, "STARTUP_TIMEOUT_S must be a whole number of seconds"),
])
def test_each_bad_parameter_is_named(repo, name, value, message):
    _, defaults = notebook_defaults(repo, "text_classification")
    problems = params.text_problems({**defaults, name: value})
    assert any(message in p for p in problems), problems
    with pytest.raises(params.ParameterError, match="Invalid parameters"):
        params.validate(problems)


def test_all_problems_reported_at_once(repo):
    _, defaults = notebook_defaults(repo, "text_classification")
    problems = params.text_problems({**defaults, "LIMIT": -5, "BATCH_SIZE": 0})
    assert len(problems) == 2


def test_concurrency_pair_is_accepted(repo):
    _, defaults = notebook_defaults(repo, "text_classification")
    assert params.text_problems({**defaults, "CONCURRENCY": [2, 4]}) == []


def test_caption_defaults_are_valid(repo):
    _, defaults = notebook_defaults(repo, "vlm_captioning")
    assert params.caption_problems(defaults) == []
    assert defaults["MODEL_SOURCE"] == "offline" and defaults["MAX_PIXELS"] > 0


@pytest.mark.parametrize("name, value, message", [
    ("INPUT_FORMAT", "zip", "INPUT_FORMAT must be auto, webdataset, parquet or images"),
    ("IMAGE_TOKENS", 0, "IMAGE_TOKENS must be a positive integer"),
    ("IMAGE_TOKENS", 100_000, "more than any image needs"),
    ("MAX_PIXELS", None, "MAX_PIXELS must be a positive integer"),
    ("PROMPT", " ", "PROMPT must be a non-empty string"),
    ("KEEP_ASPECT", "yes", "KEEP_ASPECT must be True or False"),
    ("BATCH_SIZE", 0, "BATCH_SIZE must be a positive integer"),
])
def test_each_bad_caption_parameter_is_named(repo, name, value, message):
    _, defaults = notebook_defaults(repo, "vlm_captioning")
    problems = params.caption_problems({**defaults, name: value})
    assert any(message in p for p in problems), problems
