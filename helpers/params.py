"""Check notebook parameters up front, so a typo fails in a second with a clear message
instead of minutes later inside a Ray worker."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from helpers import presets
from helpers.errors import Explained


class ParameterError(Explained, ValueError):
    """One or more notebook parameters are invalid; the message lists every problem."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _concurrency_ok(value: Any) -> bool:
    from helpers.engine import concurrency_arg

    value = concurrency_arg(value)  # "(2, 2)" and "[2, 2]" from papermill's -p, [2, 2] from YAML
    if _is_int(value):
        return value >= 1
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_int(v) for v in value):
        return 1 <= value[0] <= value[1]
    return False


def _flag_problem(name: str, value: Any, *, optional: bool = False) -> list[str]:
    """A True/False parameter (``optional``: or None) given anything else. On the command line a
    user types ``-p TRUST_REMOTE_CODE false``: papermill passes the string ``'false'``, which Python
    reads as true, so strings are refused here, with how to write the value instead."""
    if isinstance(value, bool) or (optional and value is None):
        return []
    allowed = "True, False or None (from PRESET)" if optional else "True or False"
    hint = " (a string; on the command line write True or False, capitalised)" if isinstance(value, str) else ""
    return [f"{name} must be {allowed}, got {value!r}{hint}"]


def common_problems(p: Mapping[str, Any], task: str) -> list[str]:
    """Problems with the parameters both notebooks share (``task``: "text" or "vision")."""
    problems = []
    for name in ("TRUST_REMOTE_CODE", "VERBOSE", "RESUME", "START_OVER"):
        problems += _flag_problem(name, p[name])
    problems += _flag_problem("ENFORCE_EAGER", p["ENFORCE_EAGER"], optional=True)
    problems += _flag_problem("TORCH_COMPILE", p["TORCH_COMPILE"], optional=True)
    if p["ENFORCE_EAGER"] is True and p["TORCH_COMPILE"] is True:
        problems.append("TORCH_COMPILE=True asks vLLM to compile, ENFORCE_EAGER=True to run without compiling: "
                        "set one of them to None")
    if p["LIMIT"] is not None and not (_is_int(p["LIMIT"]) and p["LIMIT"] >= 1):
        problems.append(f"LIMIT must be a positive integer or None (all rows), got {p['LIMIT']!r}")
    if p["PRESET"] not in presets.names(task):
        problems.append(f"PRESET must be one of {presets.names(task)}, got {p['PRESET']!r}")
    # The preset-backed parameters: None takes the value from PRESET.
    for name in ("NUM_BLOCKS", "BATCH_SIZE", "MAX_MODEL_LEN", "MAX_CONCURRENT_BATCHES"):
        if p[name] is not None and not (_is_int(p[name]) and p[name] >= 1):
            problems.append(f"{name} must be a positive integer or None (from PRESET), got {p[name]!r}")
    if p.get("REPLICAS_PER_GPU") is not None and not (_is_int(p["REPLICAS_PER_GPU"]) and 1 <= p["REPLICAS_PER_GPU"] <= 8):
        problems.append(f"REPLICAS_PER_GPU must be an integer from 1 to 8 or None (from PRESET), "
                        f"got {p['REPLICAS_PER_GPU']!r}")
    if p["CONCURRENCY"] is not None and not _concurrency_ok(p["CONCURRENCY"]):
        problems.append(f"CONCURRENCY must be n >= 1, a pair (min, max) with 1 <= min <= max, or None (from PRESET), "
                        f"got {p['CONCURRENCY']!r}")
    if p["MODEL_SOURCE"] is not None and (not isinstance(p["MODEL_SOURCE"], str) or not p["MODEL_SOURCE"].strip()):
        problems.append(f"MODEL_SOURCE must be 'offline', a Hugging Face id, a folder or None (from PRESET), "
                        f"got {p['MODEL_SOURCE']!r}")
    if p["ACCELERATOR_TYPE"] is not None and not (isinstance(p["ACCELERATOR_TYPE"], str) and p["ACCELERATOR_TYPE"]):
        problems.append(f"ACCELERATOR_TYPE must be a GPU type such as 'L4' or None (from PRESET; the CPU presets "
                        f"run on the CPU), got {p['ACCELERATOR_TYPE']!r}")
    if not isinstance(p["OUTPUT_DIR"], str) or not p["OUTPUT_DIR"].strip():
        problems.append(f"OUTPUT_DIR must be a folder path, got {p['OUTPUT_DIR']!r}")
    if not (isinstance(p["TEMPERATURE"], (int, float)) and 0 <= p["TEMPERATURE"] <= 2):
        problems.append(f"TEMPERATURE must be between 0 and 2, got {p['TEMPERATURE']!r}")
    stage_cpus = p["CPU_STAGE_CPUS"]
    if stage_cpus is not None and not (isinstance(stage_cpus, (int, float)) and not isinstance(stage_cpus, bool)
                                       and 0 < stage_cpus <= 8):
        problems.append(f"CPU_STAGE_CPUS must be None or in (0, 8], got {stage_cpus!r}")
    if not (_is_int(p["STARTUP_TIMEOUT_S"]) and p["STARTUP_TIMEOUT_S"] >= 10):
        problems.append(f"STARTUP_TIMEOUT_S must be a whole number of seconds >= 10, got {p['STARTUP_TIMEOUT_S']!r}")
    if p["KV_CACHE_GIB"] is not None and not (isinstance(p["KV_CACHE_GIB"], (int, float)) and p["KV_CACHE_GIB"] > 0):
        problems.append(f"KV_CACHE_GIB must be a positive number or None, got {p['KV_CACHE_GIB']!r}")
    return problems


def text_problems(p: Mapping[str, Any]) -> list[str]:
    """Problems with the text-classification notebook's parameters."""
    problems = common_problems(p, "text")
    labels = p["LABELS"]
    if not (isinstance(labels, (list, tuple)) and len(labels) >= 2 and all(isinstance(x, str) and x.strip() for x in labels)):
        problems.append(f"LABELS must be a list of at least two non-empty strings, got {labels!r}")
    elif len(set(labels)) != len(labels):
        dupes = sorted({x for x in labels if list(labels).count(x) > 1})
        problems.append(f"LABELS has duplicates: {dupes}")
    if not isinstance(p["TEXT_COLUMN"], str) or not p["TEXT_COLUMN"]:
        problems.append(f"TEXT_COLUMN must name a column, got {p['TEXT_COLUMN']!r}")
    for name in ("ID_COLUMN", "LABEL_COLUMN"):
        if p[name] is not None and not (isinstance(p[name], str) and p[name]):
            problems.append(f"{name} must name a column or be None, got {p[name]!r}")
    problems += _flag_problem("TOKENIZE_STAGE", p["TOKENIZE_STAGE"], optional=True)
    problems += _flag_problem("CONFIDENCE", p["CONFIDENCE"])
    below = p["REVIEW_BELOW"]
    if below is not None and not (isinstance(below, (int, float)) and not isinstance(below, bool) and 0 < below <= 1):
        problems.append(f"REVIEW_BELOW must be a confidence in (0, 1] or None (no review table), got {below!r}")
    elif below is not None and p["CONFIDENCE"] is False:
        problems.append("REVIEW_BELOW needs CONFIDENCE = True: without it no row has a confidence")
    if not isinstance(p["TASK"], str) or not p["TASK"].strip():
        problems.append(f"TASK must be a non-empty instruction, got {p['TASK']!r}")
    if not isinstance(p["USER_TEMPLATE"], str) or "{text}" not in p["USER_TEMPLATE"]:
        problems.append(f"USER_TEMPLATE must contain '{{text}}', got {p['USER_TEMPLATE']!r}")
    return problems


def caption_problems(p: Mapping[str, Any]) -> list[str]:
    """Problems with the captioning notebook's parameters."""
    # MAX_MODEL_LEN is derived from the image and caption budgets in this notebook, not a parameter.
    problems = common_problems({**p, "MAX_MODEL_LEN": None}, "vision")
    if p["INPUT_FORMAT"] not in ("auto", "webdataset", "parquet", "images"):
        problems.append(f"INPUT_FORMAT must be auto, webdataset, parquet or images, got {p['INPUT_FORMAT']!r}")
    for name in ("IMAGE_TOKENS", "MAX_TOKENS", "MAX_PIXELS"):
        if not (_is_int(p[name]) and p[name] >= 1):
            problems.append(f"{name} must be a positive integer, got {p[name]!r}")
    if _is_int(p["IMAGE_TOKENS"]) and p["IMAGE_TOKENS"] > 16384:
        problems.append(f"IMAGE_TOKENS={p['IMAGE_TOKENS']} is more than any image needs (16384 is 3584x3584 pixels)")
    for name in ("SYSTEM_PROMPT", "PROMPT", "IMAGE_COLUMN"):
        if not isinstance(p[name], str) or not p[name].strip():
            problems.append(f"{name} must be a non-empty string, got {p[name]!r}")
    problems += _flag_problem("KEEP_ASPECT", p["KEEP_ASPECT"])
    if p["ID_COLUMN"] is not None and not (isinstance(p["ID_COLUMN"], str) and p["ID_COLUMN"]):
        problems.append(f"ID_COLUMN must name a column or be None, got {p['ID_COLUMN']!r}")
    return problems


def validate(problems: list[str]) -> None:
    """Raise :class:`ParameterError` listing every problem, or return quietly."""
    if problems:
        raise ParameterError("Invalid parameters:\n  - " + "\n  - ".join(problems))


@dataclass(frozen=True)
class Parameter:
    """One assignment of a notebook's ``parameters`` cell."""

    name: str
    value: Any
    source: str  # the literal as written (a long list may span lines)
    comment: str  # the comment on its first line


def parse_cell(source: str) -> list[Parameter]:
    """Read a ``parameters`` cell: ``NAME = literal  # comment``, a literal may span lines (a long
    list), its comment on the first line. Raises ``ValueError`` naming anything else in the cell."""
    import ast
    import io
    import tokenize

    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    comments = {t.start[0]: t.string.lstrip("#").strip() for t in tokens}
    found = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            raise ValueError(f"line {node.lineno}: only NAME = literal assignments belong in the parameters cell")
        text = ast.get_source_segment(source, node.value) or ""
        for t in tokens:  # comments inside a multi-line literal are not part of its value
            text = text.replace(t.string, "")
        text = " ".join(text.split()).replace("[ ", "[").replace(", ]", "]").replace(" ]", "]")
        found.append(Parameter(node.targets[0].id, ast.literal_eval(node.value), text,
                               comments.get(node.lineno, "")))
    return found


def unknown_names(given: Iterable[str], known: Collection[str], notebook: str) -> list[str]:
    """A problem for each name in ``given`` that is not a parameter of ``notebook`` (``known``: the
    names in its ``parameters`` cell), naming the closest one. Papermill only warns about such a
    name and runs on, so ``-p LIMT 10000`` would run the whole input."""
    import difflib

    problems = []
    by_upper = {name.upper(): name for name in known}
    for name in given:
        if name in known:
            continue
        close = difflib.get_close_matches(name.upper(), list(by_upper), n=1, cutoff=0.6)
        hint = f"did you mean {by_upper[close[0]]}?" if close else f"its parameters are {', '.join(sorted(known))}"
        problems.append(f"{name} is not a parameter of {notebook} (not in its parameters cell): {hint}")
    return problems
