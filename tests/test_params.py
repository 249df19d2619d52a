import nbformat
import pytest

from helpers import fitting, params


def notebook_defaults(repo, name):
    nb = nbformat.read(repo / "notebooks" / f"{name}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    namespace: dict = {}
    exec(cell.source, namespace)
    return cell, {k: v for k, v in namespace.items() if k.isupper()}


PROBLEMS = {"text_classification": params.text_problems, "vlm_captioning": params.caption_problems}


def test_text_defaults_are_valid_and_come_from_the_cpu_preset_without_a_gpu(repo):
    _, defaults = notebook_defaults(repo, "text_classification")
    assert params.text_problems(defaults) == []
    assert defaults["PRESET"] == "auto" and defaults["MODEL_SOURCE"] is None and defaults["BATCH_SIZE"] is None
    config = fitting.from_parameters("text", defaults, cluster={"CPU": 2.0})
    assert config.name == "text-cpu-offline" and config.model_source == "offline" and config.accelerator_type is None
    assert fitting.from_parameters("text", defaults, cluster={"GPU": 4.0, "accelerator_type:L4": 1.0}).name == "auto (4xL4)"


#: Parameter lines fit a notebook cell without scrolling sideways.
MAX_LINE = 100


def test_parameters_are_literals_with_a_comment_each_on_short_lines(repo):
    for path in sorted((repo / "notebooks").glob("*.ipynb")):
        cell, _ = notebook_defaults(repo, path.stem)
        found = params.parse_cell(cell.source)
        assert len(found) == len({p.name for p in found}) >= 20
        for p in found:
            assert p.name.isupper() and p.comment, f"{path.name}: {p.name} needs NAME = literal  # comment"
        long = [line for line in cell.source.splitlines() if len(line) > MAX_LINE]
        assert not long, f"{path.name}: lines over {MAX_LINE} characters: {long}"


def test_the_parameters_parser_takes_multi_line_literals_and_refuses_code():
    cell = 'A = 1  # one\nLABELS = [  # the labels\n    "x", "y",\n]\nB = None  # none'
    assert [(p.name, p.value, p.source, p.comment) for p in params.parse_cell(cell)] == [
        ("A", 1, "1", "one"), ("LABELS", ["x", "y"], '["x", "y"]', "the labels"), ("B", None, "None", "none")]
    with pytest.raises(ValueError, match="only NAME = literal"):
        params.parse_cell("import os")
    with pytest.raises(ValueError):
        params.parse_cell("A = os.getcwd()  # not a literal")


def test_review_below_needs_confidence(repo):
    _, defaults = notebook_defaults(repo, "text_classification")
    problems = PROBLEMS["text_classification"]({**defaults, "REVIEW_BELOW": 0.5, "CONFIDENCE": False})
    assert problems == ["REVIEW_BELOW needs CONFIDENCE = True: without it no row has a confidence"]
    assert not PROBLEMS["text_classification"]({**defaults, "REVIEW_BELOW": 0.5, "CONFIDENCE": True})


@pytest.mark.parametrize("notebook, name, value, message", [
    ("text_classification", "LIMIT", 0, "LIMIT must be a positive integer"),
    ("text_classification", "NUM_BLOCKS", -1, "NUM_BLOCKS must be a positive integer"),
    ("text_classification", "BATCH_SIZE", "64", "BATCH_SIZE must be a positive integer"),
    ("text_classification", "CONCURRENCY", (4, 2), "CONCURRENCY must be"),
    ("text_classification", "CONCURRENCY", True, "CONCURRENCY must be"),
    ("text_classification", "REPLICAS_PER_GPU", 0, "REPLICAS_PER_GPU must be an integer from 1 to 8"),
    ("vlm_captioning", "REPLICAS_PER_GPU", 0.5, "REPLICAS_PER_GPU must be an integer from 1 to 8"),
    ("text_classification", "REPLICAS_PER_GPU", 9, "REPLICAS_PER_GPU must be an integer from 1 to 8"),
    ("text_classification", "PRESET", "text-llama8b-l5", "PRESET must be one of ['auto', 'text-cpu-offline'"),
    ("text_classification", "PRESET", "vision-qwen3b-l4", "PRESET must be one of"),  # the other notebook's
    ("text_classification", "ENFORCE_EAGER", "yes", "ENFORCE_EAGER must be True, False or None"),
    ("vlm_captioning", "TORCH_COMPILE", "true", "TORCH_COMPILE must be True, False or None"),
    ("text_classification", "TOKENIZE_STAGE", 1, "TOKENIZE_STAGE must be True, False or None"),
    ("text_classification", "CONFIDENCE", "true", "CONFIDENCE must be True or False"),
    ("text_classification", "REVIEW_BELOW", 0, "REVIEW_BELOW must be a confidence in (0, 1]"),
    ("text_classification", "REVIEW_BELOW", 1.5, "REVIEW_BELOW must be a confidence in (0, 1]"),
    ("text_classification", "REVIEW_BELOW", True, "REVIEW_BELOW must be a confidence in (0, 1]"),
    ("text_classification", "LABELS", ["Only one"], "LABELS must be a list of at least two"),
    ("text_classification", "LABELS", ["A", "B", "A"], "LABELS has duplicates: ['A']"),
    ("text_classification", "USER_TEMPLATE", "Company: {name}", "USER_TEMPLATE must contain '{text}'"),
    ("text_classification", "TEMPERATURE", 3, "TEMPERATURE must be between 0 and 2"),
    ("text_classification", "MODEL_SOURCE", "", "MODEL_SOURCE must be"),
    ("text_classification", "ACCELERATOR_TYPE", "", "ACCELERATOR_TYPE must be a GPU type"),
    ("text_classification", "ID_COLUMN", 3, "ID_COLUMN must name a column or be None"),
    ("text_classification", "OUTPUT_DIR", "", "OUTPUT_DIR must be a folder path"),
    ("text_classification", "KV_CACHE_GIB", 0, "KV_CACHE_GIB must be a positive number"),
    ("text_classification", "CPU_STAGE_CPUS", 0, "CPU_STAGE_CPUS must be None or in (0, 8]"),
    ("vlm_captioning", "CPU_STAGE_CPUS", True, "CPU_STAGE_CPUS must be None or in (0, 8]"),
    ("text_classification", "RESUME", "yes", "RESUME must be True or False"),
    ("text_classification", "STARTUP_TIMEOUT_S", 0, "STARTUP_TIMEOUT_S must be a whole number of seconds"),
    ("vlm_captioning", "INPUT_FORMAT", "zip", "INPUT_FORMAT must be auto, webdataset, parquet or images"),
    ("vlm_captioning", "IMAGE_TOKENS", 0, "IMAGE_TOKENS must be a positive integer"),
    ("vlm_captioning", "IMAGE_TOKENS", 100_000, "more than any image needs"),
    ("vlm_captioning", "MAX_PIXELS", None, "MAX_PIXELS must be a positive integer"),
    ("vlm_captioning", "PROMPT", " ", "PROMPT must be a non-empty string"),
    ("vlm_captioning", "KEEP_ASPECT", "yes", "KEEP_ASPECT must be True or False"),
    # As a user types them on the command line: papermill passes 'false' as a (truthy) string.
    ("text_classification", "TRUST_REMOTE_CODE", "false", "TRUST_REMOTE_CODE must be True or False, got 'false' (a string"),
    ("vlm_captioning", "TRUST_REMOTE_CODE", "False", "TRUST_REMOTE_CODE must be True or False"),
    ("text_classification", "VERBOSE", "true", "VERBOSE must be True or False"),
    ("vlm_captioning", "VERBOSE", 1, "VERBOSE must be True or False"),
    ("text_classification", "ENFORCE_EAGER", "false", "ENFORCE_EAGER must be True, False or None"),
    ("vlm_captioning", "BATCH_SIZE", 0, "BATCH_SIZE must be a positive integer"),
    ("vlm_captioning", "PRESET", "text-cpu-offline", "PRESET must be one of ['auto', 'vision-cpu-offline'"),
])
def test_each_bad_parameter_is_named(repo, notebook, name, value, message):
    _, defaults = notebook_defaults(repo, notebook)
    problems = PROBLEMS[notebook]({**defaults, name: value})
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
    assert fitting.from_parameters("vision", defaults, cluster={"CPU": 2.0}).model_source == "offline"
    assert defaults["MAX_PIXELS"] > 0



def test_papermill_reads_every_parameter(repo):
    # papermill skips (with a warning) a parameter line holding a second "=", even in its comment.
    import papermill

    for path in sorted((repo / "notebooks").glob("*.ipynb")):
        cell, _ = notebook_defaults(repo, path.stem)
        assert set(papermill.inspect_notebook(str(path))) == {p.name for p in params.parse_cell(cell.source)}


def test_a_flag_typed_in_lower_case_reaches_the_notebook_as_a_string_and_is_refused(repo):
    """Why the flags are checked: papermill's ``-p TRUST_REMOTE_CODE false`` passes the string
    'false', which Python reads as true (a model's own code would run)."""
    from papermill.cli import _resolve_type

    assert _resolve_type("false") == "false" and _resolve_type("False") is False
    for notebook, problems in PROBLEMS.items():
        _, defaults = notebook_defaults(repo, notebook)
        assert problems({**defaults, "TRUST_REMOTE_CODE": _resolve_type("false")}) != []
        assert problems({**defaults, "TRUST_REMOTE_CODE": _resolve_type("False")}) == []


def test_task_and_start_over_are_checked(repo):
    _, defaults = notebook_defaults(repo, "text_classification")
    assert params.text_problems({**defaults, "TASK": "  "}) == ["TASK must be a non-empty instruction, got '  '"]
    assert "START_OVER must be True or False" in params.text_problems({**defaults, "START_OVER": "false"})[0]


def test_a_name_that_is_not_a_parameter_is_named_with_the_closest_one():
    known = ["INPUT_PATH", "LIMIT", "MODEL_SOURCE", "OUTPUT_DIR", "START_OVER"]
    assert params.unknown_names(["LIMIT", "OUTPUT_DIR"], known, "text_classification") == []
    [typo] = params.unknown_names(["LIMT"], known, "text_classification")
    assert typo == "LIMT is not a parameter of text_classification (not in its parameters cell): did you mean LIMIT?"
    [lower] = params.unknown_names(["start_over"], known, "nb")
    assert lower.endswith("did you mean START_OVER?")
    [far] = params.unknown_names(["TEMPERATURE_X"], known, "nb")
    assert "its parameters are INPUT_PATH, LIMIT, MODEL_SOURCE, OUTPUT_DIR, START_OVER" in far


@pytest.mark.parametrize("notebook", ["text_classification", "vlm_captioning"])
def test_compiling_and_running_eagerly_at_once_is_refused(repo, notebook):
    _, defaults = notebook_defaults(repo, notebook)
    problems = PROBLEMS[notebook]({**defaults, "ENFORCE_EAGER": True, "TORCH_COMPILE": True})
    assert any("TORCH_COMPILE=True asks vLLM to compile" in p and "set one of them to None" in p for p in problems)
    assert not PROBLEMS[notebook]({**defaults, "ENFORCE_EAGER": True, "TORCH_COMPILE": False})
