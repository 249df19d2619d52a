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
MAX_README_WORDS = 3_500

# Markdown a user reads, whose relative links must resolve.
LINKED = [README, *DOCS, REPO / "benchmarks" / "RESULTS.md", REPO / "templates" / "README.md"]
# Everything a user reads: for benchmark code, only its comments and strings (see ``user_text``).
READ_BY_USERS = [*LINKED, *sorted((REPO / "benchmarks").glob("*.py")), REPO / "benchmarks" / "on_gpu.sh",
                 REPO / "job.yaml", REPO / "deploy" / "rayjob.yaml"]


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_readme_is_one_page():
    words = len(README.read_text(encoding="utf-8").split())
    assert words <= MAX_README_WORDS, f"README.md has {words} words (at most {MAX_README_WORDS}): move detail into docs/"


def test_there_are_docs_pages():
    assert DOCS, "docs/*.md"


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
