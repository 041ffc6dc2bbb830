"""The measured tables in docs/reproduction.md and docs/protocol_results.md are what
`fedgmr table` (and `fedgmr tiers`) prints on the cells kept in the repository under
``measured/``.

Wherever a page shows a ``fedgmr table measured/...`` (or ``fedgmr tiers measured/...``,
``fedgmr evaluate measured/... --saved``, or, where the data sets are beside the repository,
``fedgmr masks measured/...`` and ``fedgmr data clients measured/...``) command in a ``bash`` block followed by an output
block, the command is run from the repository root and its output must equal the pasted
block, character for character: a table edited by hand, or cells changed or
lost after the table was pasted, fail here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from conftest import run_cli

REPO = Path(__file__).resolve().parents[1]
#: the pages whose pasted tables are re-derived here
PAGES = [REPO / "docs" / "reproduction.md", REPO / "docs" / "protocol_results.md"]
# the tables over measured/ parse each kept cell once per test process, not once a table
pytestmark = pytest.mark.usefixtures("measured_read_once")
#: the commands whose pasted output is a table of runs
TABLE_COMMANDS = ("fedgmr table ", "fedgmr tiers ")
#: ... and those re-derived here when they read measured/ (a saved evaluation's table too)
TABLE_COMMANDS_ON_MEASURED = tuple(c + "measured/" for c in (*TABLE_COMMANDS, "fedgmr evaluate ", "fedgmr masks ",
                                                                "fedgmr data clients "))
#: the real data sets, beside the repository (``fedgmr masks`` builds a kept cell's model from its data)
SHARED_DATA = REPO.parent / "shared" / "data"


def pasted_tables(text: str) -> list[tuple[str, str]]:
    """``(command, pasted output)`` for each bash block ending in a ``fedgmr table measured/``
    (or ``fedgmr tiers measured/``) line that is followed (after blank lines only) by a plain
    output block."""
    # fences may be indented under a list item: the block's lines carry the same indent
    blocks = list(re.finditer(r"^([ \t]*)```(\w*)\n(.*?)^\1```\n", text, flags=re.M | re.S))
    found = []
    for block, after in zip(blocks, blocks[1:]):
        lines = block.group(3).strip().splitlines()
        if block.group(2) != "bash" or not lines or not lines[-1].strip().startswith(TABLE_COMMANDS_ON_MEASURED):
            continue
        if after.group(2) == "" and not text[block.end():after.start()].strip():
            indent = after.group(1)
            found.append((lines[-1].strip(), "".join(line.removeprefix(indent)
                                                     for line in after.group(3).splitlines(keepends=True))))
    return found


TABLES = [t for page in PAGES for t in pasted_tables(page.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_each_page_shows_measured_tables(page: Path):
    assert pasted_tables(page.read_text(encoding="utf-8")), f"{page.name} pastes no fedgmr table output"


def test_pasted_tables_are_found_only_after_their_command():
    text = ("```bash\nfedgmr table measured/x --t-star 1\n```\n\n```\nOUT\n```\n"
            "```bash\nfedgmr table measured/y --t-star 1\n```\nprose between\n```\nnot its output\n```\n")
    assert pasted_tables(text) == [("fedgmr table measured/x --t-star 1", "OUT\n")]
    indented = "- a list item:\n\n  ```bash\n  fedgmr table measured/z --t-star 1\n  ```\n\n  ```\n  A\n\n  B\n  ```\n"
    assert pasted_tables(indented) == [("fedgmr table measured/z --t-star 1", "A\n\nB\n")]
    tiers = "```bash\nfedgmr tiers measured/t --only method=m\n```\n\n```\nT\n```\n"
    assert pasted_tables(tiers) == [("fedgmr tiers measured/t --only method=m", "T\n")]
    saved = "```bash\nfedgmr evaluate measured/e --saved\n```\n\n```\nE\n```\n"
    assert pasted_tables(saved) == [("fedgmr evaluate measured/e --saved", "E\n")]
    masks = "```bash\nfedgmr masks measured/c/configs/a.yaml\n```\n\n```\nM\n```\n"
    assert pasted_tables(masks) == [("fedgmr masks measured/c/configs/a.yaml", "M\n")]


@pytest.mark.parametrize("cmd,pasted", TABLES, ids=[c for c, _ in TABLES])
def test_pasted_table_is_what_fedgmr_table_prints(cmd: str, pasted: str):
    args = shlex.split(cmd)[1:]
    if args[0] in ("masks", "data") and not SHARED_DATA.is_dir():
        pytest.skip(f"{cmd} reads the cell's data set, which is not at {SHARED_DATA}")
    proc = run_cli(args, REPO)  # in-process: the same command, without a PyTorch start-up per table
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == pasted.strip(), f"{cmd} now prints:\n{proc.stdout}"


#: the visible label of a pasted table whose cells the repository does not hold
UNKEPT = "**Not re-derivable from a clone:**"


def pasted_tables_anywhere(text: str) -> list[tuple[str, bool]]:
    """``(command, labelled)`` for every bash block ending in a ``fedgmr table`` line that is
    followed (after blank lines only) by a plain output block; ``labelled``: the block is
    preceded, within three lines, by the :data:`UNKEPT` label."""
    blocks = list(re.finditer(r"^([ \t]*)```(\w*)\n(.*?)^\1```\n", text, flags=re.M | re.S))
    found = []
    for block, after in zip(blocks, blocks[1:]):
        lines = block.group(3).strip().splitlines()
        if block.group(2) != "bash" or not lines or not lines[-1].strip().startswith(TABLE_COMMANDS):
            continue
        if after.group(2) == "" and not text[block.end():after.start()].strip():
            before = text[:block.start()].rstrip("\n").splitlines()[-3:]
            found.append((lines[-1].strip(), any(UNKEPT in line for line in before)))
    return found


def _table_dirs(cmd: str) -> list[str]:
    """The run or sweep directories a ``fedgmr table`` command reads (its positional arguments)."""
    args = shlex.split(cmd)[2:]
    dirs = []
    for a in args:
        if a.startswith("-"):
            break
        dirs.append(a)
    return dirs


def test_pasted_tables_anywhere_are_found_and_their_labels_read():
    text = ("Intro.\n\n```bash\nfedgmr table runs/x --t-star 1\n```\n\n```\nOUT\n```\n\n"
            f"{UNKEPT} the cells were not kept.\n\n```bash\nfedgmr table runs/y measured/z --t-star 1\n```\n\n"
            "```\nOUT\n```\n")
    assert pasted_tables_anywhere(text) == [("fedgmr table runs/x --t-star 1", False),
                                            ("fedgmr table runs/y measured/z --t-star 1", True)]
    assert _table_dirs("fedgmr table runs/y measured/z --t-star 1 --cols a") == ["runs/y", "measured/z"]


def test_every_pasted_table_reads_cells_the_repository_holds():
    """A table pasted with its output on any page reads directories kept in the repository
    (measured/...), or says plainly above it that it cannot be re-derived from a clone."""
    missing = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for cmd, labelled in pasted_tables_anywhere(doc.read_text(encoding="utf-8")):
            absent = [d for d in _table_dirs(cmd) if not (REPO / d).is_dir()]
            if absent and not labelled:
                missing.append(f"{doc.relative_to(REPO)}: {cmd} (absent: {', '.join(absent)})")
    assert not missing, "pasted tables read directories the repository does not hold:\n" + "\n".join(missing)


#: the heading of protocol_results.md's summaries of verdicts (the current one, "## Verdicts so
#: far", and earlier readings kept as read): each a grid of words read off one paired table
VERDICT_GRID = "## Verdicts"


def verdict_grid(section: str) -> dict[str, list[str]]:
    """``{method: [verdict, ...]}`` from a summary grid's rows (``| `m` (= `n`) | a / b | ... | counts |``):
    each row's methods (a duplicate named in ``(= ...)`` too) with its verdict words in column order,
    the last column (the counts) left out."""
    grid = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        words = [w.strip("* ") for cell in cells[1:-1] for w in cell.split(" / ")]
        for name in re.findall(r"`([^`]+)`", cells[0]):
            grid[name] = words
    return grid


def paired_verdicts(output: str) -> dict[str, list[str]]:
    """``{method: [verdict, ...]}``: the last word of each cell of the seed-paired table that
    ``fedgmr table --paired-against`` prints after its Acc@t* table."""
    paired = output.split("Seed-paired differences", 1)[1]
    rows = {}
    for line in paired.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] not in ("method",) and not cells[0].startswith(":"):
            rows[cells[0]] = [c.split()[-1] for c in cells[1:]]
    return rows


def test_verdict_grid_helpers_read_rows_and_duplicates():
    section = ("| row | A | B | of 4 |\n|---|---|---|---|\n| `x` (= `y`) | ahead / **behind** | level / level | n |\n")
    assert verdict_grid(section) == {"x": ["ahead", "behind", "level", "level"],
                                     "y": ["ahead", "behind", "level", "level"]}
    out = ("Acc table\n\nSeed-paired differences against m: ...\n\n| method | c1 | c2 |\n|:--|:--|:--|\n"
           "| x | +1.00 [+0.50, +1.50] p=0.010 ahead | -0.10 [-1.00, +0.80] p=0.700 level |\n")
    assert paired_verdicts(out) == {"x": ["ahead", "level"]}


def test_the_verdict_grid_is_the_paired_table_it_summarises():
    """protocol_results.md's grids of verdicts (FedGMR against each row, column by column, at
    both readings: the current one and those kept as read) are typed by hand: every word of
    each must be the verdict the paired table pasted below it prints (that table is itself
    re-derived from the cells), and every row of that table must be in the grid."""
    text = (REPO / "docs" / "protocol_results.md").read_text(encoding="utf-8")
    sections = [part.split("\n## ", 1)[0] for part in text.split("\n" + VERDICT_GRID)[1:]]
    assert text.count("\n## Verdicts so far") == 1 and len(sections) >= 2, len(sections)
    for section in sections:
        _check_verdict_grid(section)


def _check_verdict_grid(section: str) -> None:
    (cmd, output), = [t for t in pasted_tables(section) if "--paired-against fedgmr" in t[0]]
    grid, paired = verdict_grid(section.split("```bash", 1)[0]), paired_verdicts(output)
    assert set(grid) == set(paired), (sorted(set(grid) ^ set(paired)), cmd)
    wrong = {m: (grid[m], paired[m]) for m in grid if grid[m] != paired[m]}
    assert not wrong, wrong
    for line in section.split("```bash", 1)[0].splitlines():  # the last column counts the row's words
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            words = grid[re.findall(r"`([^`]+)`", cells[0])[0]]
            counts = ", ".join(f"{words.count(v)} {v}" for v in ("ahead", "level", "behind") if v in words)
            assert cells[-1] == counts, line
