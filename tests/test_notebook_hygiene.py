"""Committed notebooks are tutorials, not run logs: outputs cleared except the cells CI checks."""

import re

import nbformat
import pytest

from conftest import REPO, load_script

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_cleared_except_checked_cells(path):
    clear = load_script("clear_outputs")
    nb = nbformat.read(path, as_version=4)
    assert nbformat.writes(clear.cleaned(nb)) == nbformat.writes(nb), \
        f"run: python scripts/clear_outputs.py {path.relative_to(REPO)}"
    checked = [c for c in nb.cells if clear.is_checked(c)]
    assert checked and all(c.outputs for c in checked), "the checked cells keep their expected output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_conventions(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for banned in ("sys.path", "!pip", "%pip", "autoreload"):
        assert banned not in code, f"{path.name} uses {banned}"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")


USER_FACING = [*NOTEBOOKS, REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "job.yaml",
               REPO / "deploy" / "rayjob.yaml",
               REPO / "helpers" / "presets.py", REPO / "benchmarks" / "RESULTS.md",
               *sorted((REPO / "templates").rglob("*.jinja")), REPO / "templates" / "README.md"]


@pytest.mark.parametrize("path", USER_FACING, ids=lambda p: str(p.relative_to(REPO)))
def test_no_internal_vocabulary_in_what_users_read(path):
    import re

    # "seed" was the team's word for the tutorials the kit follows; users read "Ray's tutorial".
    # Random-number seeds ("seed 0", "seeded", "manual_seed") are what the word means to them.
    text = path.read_text()
    hits = [m.group(0) for m in re.finditer(r"[^\n]{0,30}\bseeds?('s|s')?\b(?! ?[0=(])[^\n]{0,30}", text, re.I)
            if not re.search(r"manual_seed|seeded|random", m.group(0), re.I)]
    assert not hits, f"{path.name}: {hits}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_run_is_ray_data_llms_processor_on_the_kept_engines(path):
    """The flow of Ray's tutorials in plain sight: Ray's own ``vLLMEngineProcessorConfig`` in a cell of its own,
    ``build_processor(config, preprocess=..., postprocess=...)``, ``processor(ds)``, the write; the kit's
    ``build_processor`` one import line away from Ray's, the line that switches said beside it; the last
    cell frees the engines. With ``CONFIDENCE`` the text request asks vLLM not to decode each step's 20
    candidates (``"detokenize": False``: the engines decode the answer alone) and to keep them in flat lists
    (frontend CPU per row with confidence 2.34 -> 2.09 ms on a 2-core CPU, without it 1.20;
    benchmarks/bench_logprobs.py)."""
    code = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    assert "from ray.data.llm import vLLMEngineProcessorConfig" in code[0]
    assert "from helpers.engines import build_processor  # Ray's own, new engines each run: from ray.data.llm import " \
           "build_processor" in code[0]
    assert sum(c.count("vLLMEngineProcessorConfig(") for c in code) == 1
    config = next(c for c in code if "vLLMEngineProcessorConfig(" in c)
    assert config.split("\n")[1].startswith("config = vLLMEngineProcessorConfig(") and "build_processor(" not in config
    assert any(c.startswith("processor = build_processor(config, preprocess=functions.preprocess, "
                            "postprocess=functions.postprocess") for c in code)
    run = next(c for c in code if "pipeline.write(" in c)
    assert "results = processor(ds)" in run and "pipeline.write(run, results" in run
    assert code[-1].startswith("engines.free()")
    if path.name.startswith("text"):
        text = path.read_text().replace('\\"', '"')
        assert '"detokenize": not CONFIDENCE' in text and '"flat_logprobs": CONFIDENCE' in text


def helper_calls(path) -> list[str]:
    """The calls a notebook makes into ``helpers``: ``module.name(...)`` of a helpers module it imports, and
    names it imports from one (methods of what they return are the objects' own, as pandas' are)."""
    import ast

    tree = ast.parse("\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"))
    modules = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "helpers"
               for a in n.names}
    names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             and (n.module or "").startswith("helpers.") for a in n.names}
    return [ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id in modules)
        or (isinstance(n.func, ast.Name) and n.func.id in names))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_makes_at_most_fifteen_calls_into_helpers(path):
    """What a reader must look up outside the notebook stays small (19 and 17 before Ray's processor API)."""
    calls = helper_calls(path)
    assert "build_processor" in calls and len(calls) <= 15, calls


# A newcomer reads a notebook in 15 minutes: at most 26 cells and 1,200 words of prose before
# "Going further"; the first parameters are the ones people change (data, columns, model, preset, output).
MAX_CELLS, MAX_WORDS = 26, 1_200
FIRST_PARAMETERS = {
    "text_classification.ipynb": ["INPUT_PATH", "TEXT_COLUMN", "MODEL_SOURCE", "PRESET", "OUTPUT_DIR"],
    "vlm_captioning.ipynb": ["INPUT_PATH", "IMAGE_COLUMN", "MODEL_SOURCE", "PRESET", "OUTPUT_DIR"],
}


def prose_words_before_going_further(nb) -> int:
    """Words of the markdown cells before "Going further", counted as a reader's word counter does:
    ``OUTPUT_DIR/earlier/`` and ``one-sentence`` are two words each (a reader counted 1,213 words in
    a notebook where whitespace alone counted 1,186)."""
    words = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            if cell.source.startswith("## Going further"):
                return words
            words += len([w for w in re.split(r"[\s/\-\u2013\u2014]+", cell.source) if re.search(r"\w", w)])
    raise AssertionError("no '## Going further' section")


def test_prose_words_are_counted_as_a_reader_counts_them():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("A one-sentence caption in `OUTPUT_DIR/earlier/` \u2013 done."),
                nbformat.v4.new_markdown_cell("## Going further\n\nnot counted")]
    assert prose_words_before_going_further(nb) == 8


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_reads_in_fifteen_minutes(path):
    nb = nbformat.read(path, as_version=4)
    assert len(nb.cells) <= MAX_CELLS, f"{path.name}: {len(nb.cells)} cells"
    assert prose_words_before_going_further(nb) <= MAX_WORDS
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert [p.name for p in load_script("run_notebooks").parse_cell(cell.source)][:5] == FIRST_PARAMETERS[path.name]


def test_each_notebook_stands_alone():
    for path in NOTEBOOKS:
        other = ({p.stem for p in NOTEBOOKS} - {path.stem}).pop()
        prose = " ".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
        for phrase in ("text notebook", "captioning notebook", other, "as for text", "as in the"):
            assert phrase not in prose, f"{path.name} leans on the other notebook: {phrase!r}"


def test_helpers_import_graph_has_no_circles():
    """Modules import downward only: every ``helpers`` import, at the top or inside a function."""
    import ast
    import graphlib

    graph = {}
    for module in sorted((REPO / "helpers").glob("*.py")):
        deps = set()
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("helpers"):
                deps |= {node.module.split(".")[1]} if "." in node.module else {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[1] for a in node.names if a.name.startswith("helpers.")}
        graph[module.stem] = deps - {module.stem}
    assert graph["plans"] >= {"presets", "cluster", "models"}  # the graph is really read
    list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a circle


#: A helper package a reader can finish: at most this many lines in all, in at most this many modules,
#: none longer than this; a project copied from one use case carries at most this many (3,000 until the engines
#: kept between runs, ``engines``, took the place of Ray Data LLM's processor; 3,200 until the engines of a
#: killed kernel, which held a cluster's GPUs, were freed by the next start: 13 lines; 3,215 until two kernels
#: starting Serve at once no longer failed one of them: 3 lines; 3,218 until a run survived a lost node or a killed
#: engine, its batches sent again and a replacement engine kept out of its stages' room, and stopped, saying why,
#: where it could not go on: 62 lines; 3,280 until the kit's build_processor took Ray's own config and arguments,
#: refusing what it cannot honour, with public APIs only, and stopped the kernel's Ray in the last cell: 146 lines;
#: and the captioning notebook read a Hugging Face ``datasets`` dataset: 61 more lines there, and images.py past
#: 500). Issue 78 asks for 3,400 and 3,000: the cut is still to make; a first pass (imports once at the top,
#: code used once folded in) took 63 lines off, and the caps follow it down: 3,937 in all (7 of them keep
#: the planner out of ``labels``' imports, which Ray's workers run), 3,447 copied; 3,945 since a CPU's KV-cache
#: blocks let prompts share their start (2 lines) and a kernel's next run takes back its own lock (5).
MAX_LINES, MAX_MODULES, MAX_MODULE_LINES, MAX_PROJECT_LINES = 3_945, 15, 555, 3_456
#: The most helpers modules a notebook imports: the plumbing sits behind a few well-named calls (``engines``
#: took the place of Ray Data LLM's processor, imported from ``ray.data.llm`` before).
MAX_NOTEBOOK_HELPERS = 8


def test_helpers_are_a_few_small_modules_each_listed_with_its_job(tmp_path):
    import ast

    import helpers

    listed = {name for pair in re.findall(r"``(\w+)``", helpers.__doc__) for name in [pair]}
    files = sorted((REPO / "helpers").glob("*.py"))
    modules = {p.stem for p in files if p.stem != "__init__"}
    assert modules <= listed, f"helpers/__init__.py does not list {sorted(modules - listed)}"
    lines = {p.stem: len(p.read_text().splitlines()) for p in files}
    assert len(files) <= MAX_MODULES and sum(lines.values()) <= MAX_LINES, (len(files), sum(lines.values()))
    assert max(lines.values()) <= MAX_MODULE_LINES, {k: v for k, v in lines.items() if v > MAX_MODULE_LINES}
    for module in files:
        assert ast.get_docstring(ast.parse(module.read_text())), f"{module.name} has no docstring saying its job"
    new_project = load_script("new_project")
    for use_case in ("text_classification", "vlm_captioning"):  # the helpers a copied project carries
        project = new_project.create(use_case, tmp_path / use_case, "a-job")
        carried = sum(len(p.read_text().splitlines()) for p in (project / "helpers").glob("*.py"))
        assert carried <= MAX_PROJECT_LINES, (use_case, carried)


#: Ray's internals: names the next Ray release may break without notice.
RAY_INTERNALS = re.compile(r"^\s*(from|import)\s+ray\.(_private|_raylet|experimental|core\.generated|llm\._internal|"
                           r"data\._internal|data\.checkpoint\.checkpoint_filter)|_logical_plan")


def test_rays_internals_are_used_in_one_module_each_use_marked_with_the_version_and_why():
    users = {}
    for module in sorted((REPO / "helpers").glob("*.py")):
        lines = module.read_text().splitlines()
        hits = [i for i, line in enumerate(lines) if RAY_INTERNALS.search(line) and not line.lstrip().startswith("#")]
        if hits:
            users[module.name] = hits
            for i in hits:  # the function that uses it says so, with the version and why
                start = next(j for j in range(i, -1, -1) if re.match(r"\s*(def|class) ", lines[j]))
                assert "Ray 2.60 internal" in "\n".join(lines[start:i + 1]), f"{module.name}:{i + 1}: {lines[i].strip()}"
    assert set(users) <= {"cluster.py"}, users


def test_no_internal_module_of_vllm_or_ray_in_what_a_user_runs_or_copies(tmp_path):
    """Helpers, notebooks, templates and a project copied from each use case name no module of vLLM's or Ray's
    that is not their public API (vLLM's ``v1``, ``entrypoints``, ``engine``, ``executor``; Ray Data LLM's
    ``_internal``), import or class-path string; Ray's ``_private`` only in ``helpers/cluster.py``, each use
    marked (above). A copied project lives through upgrades on public APIs alone."""
    new_project = load_script("new_project")
    files = [*(REPO / "helpers").glob("*.py"), *NOTEBOOKS, *(p for p in (REPO / "templates").rglob("*") if p.is_file())]
    for use_case in ("text_classification", "vlm_captioning"):
        files += [p for p in new_project.create(use_case, tmp_path / use_case, "a-job").rglob("*") if p.is_file()]
    hits = [f"{p}:{i}: {line.strip()}" for p in files if p.suffix not in (".tar", ".safetensors", ".gguf", ".parquet")
            for i, line in enumerate(p.read_text(errors="ignore").splitlines(), 1) if new_project.INTERNALS.search(line)
            and not (p.name == "cluster.py" and "._private" in line and "llm._internal" not in line)]
    assert not hits, hits


def test_no_trick_on_rays_or_pythons_internals_to_hide_a_line_or_save_seconds():
    """An int whose comparison had side effects, file descriptor 2 rerouted through a pipe to hide one
    log line, a frozen object of Ray's mutated, an import thread with a hand-kept list: each gone."""
    text = "\n".join(p.read_text() for p in sorted((REPO / "helpers").glob("*.py")))
    for trick in ("object.__setattr__", "os.dup2", "def __le__", "threading.Thread(target=run", "SHARED_MODULES"):
        assert trick not in text, trick


def test_no_helpers_module_uses_anothers_private_names():
    """A module that needs another's function gets a public one (hf_images once imported six private
    functions of another module): ``from helpers.x import _y`` and ``x._y`` on a helpers module are refused."""
    import ast

    found = []
    for module in sorted((REPO / "helpers").glob("*.py")):
        tree = ast.parse(module.read_text())
        imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module == "helpers" for alias in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("helpers"):
                found += [f"{module.name}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and a.name != "__version__"]
            elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                  and isinstance(node.value, ast.Name) and node.value.id in imported):
                found.append(f"{module.name}: {node.value.id}.{node.attr}")
    assert not found, found


def test_no_package_is_committed_in_the_repository():
    """A pyflakes wheel sat at the root, used by nothing: what a check needs comes from the set-up."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files", "*.whl", "*.tar.gz", "*.egg"], cwd=REPO, capture_output=True,
                             text=True).stdout.split() if (REPO / ".git").exists() else []
    assert not tracked + [p.name for p in REPO.glob("*.whl")], "committed packages: install them in the set-up instead"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_imports_a_few_helpers_modules(path):
    new_project = load_script("new_project")
    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    imported = new_project.helper_imports(code)
    assert 0 < len(imported) <= MAX_NOTEBOOK_HELPERS, sorted(imported)
