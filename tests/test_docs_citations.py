"""Citations of documentation in docstrings and comments resolve inside the repository.

The form (docs/design.md, "Citations"): a path from the repository root, optionally with
the heading's anchor as GitHub spells it, e.g. ``docs/sessions.md#resume``. A citation of
a file that is not in the repository, of a heading that file does not have, or of a
section by number (``§3.4``, the form of notes kept outside the repository) fails here,
so whoever clones rtserve can follow every pointer a docstring gives.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("rtserve", "tests", "benchmarks")

# A ``*.md`` path, not part of a URL or of a longer path, with an optional ``#anchor``.
MD_CITATION = re.compile(r"(?<![\w/.:-])([\w.-]+(?:/[\w.-]+)*\.md)(?:#([\w-]+))?")
# A section number (§3.4) with no document in the repository to look it up in; RFCs are
# public and cited by number ("RFC 6455 §7.4.1").
BARE_SECTION = re.compile(r"(?<!RFC \d{4} )(?<!RFC \d{3} )§\s*[\w.]+")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
DOC_LINK = re.compile(r"\]\(([^)\s:]+?\.md)?(?:#([\w-]+))?\)")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (outside fenced code), duplicates numbered."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is None:
            continue
        slug = github_anchor(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def python_files() -> list[Path]:
    """Every module scanned; this one is left out, since its examples cite nothing."""
    me = Path(__file__).resolve()
    return sorted(
        p for top in SCANNED for p in (ROOT / top).rglob("*.py") if ".venv" not in p.parts and p.resolve() != me
    )


def comments_and_strings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and string literal (docstrings included) of a module."""
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            yield token.start[0], token.string


def check_citation(target: str, anchor: str | None) -> str | None:
    """Why ``target#anchor`` does not resolve, or None."""
    path = ROOT / target
    if not path.is_file():
        return f"{target} is not a file of the repository (cite it from the root, e.g. docs/design.md)"
    if anchor is not None and anchor not in anchors(path):
        return f"{target} has no heading with the anchor #{anchor}"
    return None


def citation_problems() -> tuple[int, list[str]]:
    cited = 0
    problems: list[str] = []
    for path in python_files():
        where = path.relative_to(ROOT)
        for line, text in comments_and_strings(path):
            for match in MD_CITATION.finditer(text):
                cited += 1
                problem = check_citation(match.group(1), match.group(2))
                if problem is not None:
                    problems.append(f"{where}:{line}: {problem}")
            for match in BARE_SECTION.finditer(text):
                problems.append(
                    f"{where}:{line}: {match.group(0)!r} cites a section by number; cite docs/FILE.md#anchor"
                )
    return cited, problems


def test_github_anchor() -> None:
    assert github_anchor("Processes, threads and time") == "processes-threads-and-time"
    assert github_anchor("`WS /v1/realtime` errors") == "ws-v1realtime-errors"
    assert github_anchor("Moshi engine") == "moshi-engine"


def test_citations_in_code_resolve() -> None:
    cited, problems = citation_problems()
    assert cited >= 50, "the scanner found almost no citations: is the pattern still right?"
    assert not problems, "unresolved documentation citations:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_links_between_docs_resolve(doc: Path) -> None:
    """Relative links inside docs/ (``[text](sessions.md#resume)``, ``[x](#journal)``)."""
    problems = []
    for match in DOC_LINK.finditer(doc.read_text(encoding="utf-8")):
        target, anchor = match.group(1), match.group(2)
        path = (doc.parent / target).resolve() if target else doc
        if not path.is_file():
            problems.append(f"{match.group(0)}: no such file")
        elif anchor is not None and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"{match.group(0)}: no such heading")
    assert not problems, f"{doc.name}: " + "; ".join(problems)


def test_readme_lists_the_docs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in readme]
    assert not missing, f"README's Documentation list lacks {missing}"
