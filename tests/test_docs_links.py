"""The documentation is self-contained.

* Every relative link in README.md and docs/**/*.md points to a file or folder of the
  repository, and an anchor (``file.md#heading``) to a heading of that file.
* No doc, code or shipped config cites material that does not ship with the package: the
  team's planning notes (SPEC, BASELINES.md, TESTS.md) or other ``../shared/`` paths. The
  one exception is ``../shared/data/...``, the default location of the offline data sets.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def _without_code(text: str) -> str:
    """The text with fenced code blocks and inline code removed (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").replace("\\", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not in_code:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def _links() -> list[tuple[str, Path, str]]:
    out = []
    for doc in DOCS:
        text = _without_code(doc.read_text(encoding="utf-8"))
        for target in LINK.findall(text) + IMAGE.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            out.append((f"{doc.relative_to(REPO)} -> {target}", doc, target))
    return out


LINKS = _links()


def test_the_docs_have_links():
    assert len(LINKS) > 20
    assert any("reference.md#" in t for _, _, t in LINKS)


@pytest.mark.parametrize("where,doc,target", LINKS, ids=[w for w, _, _ in LINKS])
def test_relative_link_resolves(where: str, doc: Path, target: str):
    path, _, anchor = target.partition("#")
    dest = (doc.parent / path).resolve() if path else doc
    assert dest.exists(), f"{where}: {dest} does not exist"
    assert REPO in dest.parents or dest == REPO, f"{where}: points outside the repository"
    if anchor and dest.suffix == ".md":
        assert anchor in anchors(dest), f"{where}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}"


# ------------------------------------------------------------------ no external citations

CITATION = re.compile(r"\bSPEC\b(?!IALS)|BASELINES\.md|TESTS\.md|STYLE\.md")
SHARED = re.compile(r"\.\./shared/(?!data\b)")


def _checked_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for ext in ("*.py", "*.yaml", "*.yml", "*.toml", "*.md"):
        files += sorted((REPO / "fedgmr").rglob(ext))
    return files


@pytest.mark.parametrize("path", _checked_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_citation_of_material_that_does_not_ship(path: Path):
    bad = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
           for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
           if CITATION.search(line) or SHARED.search(line)]
    assert not bad, "cite docs/reference.md instead:\n" + "\n".join(bad)


def test_the_citation_check_catches_what_it_should():
    for line in ("Masked training (SPEC 3.4).", "see BASELINES.md", "TESTS.md vectors", "../shared/SPEC.md"):
        assert CITATION.search(line) or SHARED.search(line), line
    for line in ("SPECIALS = ('<pad>',)", "root: ../shared/data/mnist", "(docs/reference.md §3.4)"):
        assert not (CITATION.search(line) or SHARED.search(line)), line
