"""Sweep grids are bounded and a sweep directory that cannot be one is one line (issue 42,
items 6 and 7): the cells are counted from the axis sizes before any is made, a grid above
``--max-cells`` (10,000 by default) is refused unless that flag raises the bound; an
``--out`` that is a file, below a file or on a read-only file system, and a cell name too
long for a file name, are refused before anything runs. In-process (typer's CliRunner)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import tiny_config
from fedgmr.cli import app
from fedgmr.errors import ConfigError, RunDirError
from fedgmr.experiment import sweep as sweep_mod
from fedgmr.experiment.sweep import (MAX_CELLS, SweepSpec, count_cells, expand, load_sweep, run_sweep,
                                     shipped_sweeps)


def _sweep_file(tmp_path: Path, grid: dict, **extra) -> Path:
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 6, "eval_every": 2})))
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "base": "base.yaml", "grid": grid, **extra}))
    return path


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def _no_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    """Making any cell fails the test: a refusal must come from the count alone."""
    def boom(*a, **kw):
        raise AssertionError("a cell was made")

    monkeypatch.setattr(sweep_mod, "Cell", boom)


def test_cells_are_counted_from_the_axis_sizes_without_expanding(monkeypatch):
    spec = SweepSpec.model_validate({"base": ["quickstart", "mnist"],
                                     "cases": [{"label": "a"}, {"label": "b"}, {"label": "c"}],
                                     "grid": {"seed": list(range(1000)), "training.lr": [0.1 * i for i in
                                                                                         range(1, 1001)]}})
    _no_cells(monkeypatch)
    assert count_cells(spec) == 2 * 3 * 1000 * 1000
    with pytest.raises(ConfigError, match=r"has 6,000,000 cells \(2 \(preset\) x 3 \(case\) x 1,000 \(seed\) x "
                                          r"1,000 \(training.lr\)\), more than the bound of 10,000") as err:
        expand(spec, Path("."))
    assert "--max-cells 6000000" in str(err.value) and "\n" not in str(err.value)


def test_a_grid_of_a_billion_cells_is_refused_from_its_sizes(monkeypatch):
    spec = SweepSpec.model_validate({"grid": {f"k{i}": list(range(1000)) for i in range(3)}})
    _no_cells(monkeypatch)
    with pytest.raises(ConfigError, match="1,000,000,000 cells"):
        expand(spec, Path("."))


def test_the_bound_is_inclusive_and_a_flag_raises_it(tmp_path):
    spec = SweepSpec.model_validate({"grid": {"seed": list(range(4)), "training.lr": [0.1, 0.2, 0.3]}})
    assert len(expand(spec, tmp_path, max_cells=12)) == 12
    with pytest.raises(ConfigError, match="12 cells"):
        expand(spec, tmp_path, max_cells=11)
    assert len(expand(spec, tmp_path, max_cells=None)) == 12


def test_the_cli_refuses_above_the_default_bound_and_max_cells_asks_for_more(tmp_path, monkeypatch):
    path = _sweep_file(tmp_path, {"seed": list(range(MAX_CELLS + 1))})
    out = tmp_path / "out"
    code, text = _cli("sweep", str(path), "--out", str(out), "--dry-run")
    assert code == 2 and text.startswith("error: sweep t has 10,001 cells") and "--max-cells 10001" in text
    assert len(text.strip().splitlines()) == 1 and not out.exists()
    small = _sweep_file(tmp_path, {"seed": [0, 1, 2], "training.lr": [0.1, 0.2]})
    code, text = _cli("sweep", str(small), "--out", str(out), "--dry-run", "--max-cells", "5")
    assert code == 2 and "6 cells" in text and "bound of 5" in text
    code, text = _cli("sweep", str(small), "--out", str(out), "--dry-run", "--max-cells", "6")
    assert code == 0 and text.strip().splitlines()[-1] == f"6 cells -> {out}"


def test_every_shipped_sweep_is_within_the_bound():
    for name in shipped_sweeps():
        spec, _ = load_sweep(name)
        assert count_cells(spec) <= MAX_CELLS, name


def test_a_cell_name_longer_than_a_file_name_is_refused(tmp_path):
    spec = SweepSpec.model_validate({"grid": {"name": ["a" * 300, "b"], "seed": [0, 1]}})
    with pytest.raises(ConfigError, match=r"is 312 bytes, more than the 250 a file name can take"):
        expand(spec, tmp_path)
    cases = SweepSpec.model_validate({"cases": [{"label": "x" * 251}, {"label": "y"}]})  # a case label too
    with pytest.raises(ConfigError, match="is 256 bytes, more than the 250"):
        expand(cases, tmp_path)
    assert len(expand(SweepSpec.model_validate({"cases": [{"label": "x" * 245}, {"label": "y"}]}), tmp_path)) == 2


@pytest.mark.parametrize("where", ["file", "below-file"])
def test_out_that_is_a_file_or_below_one_is_one_line(tmp_path, where):
    path = _sweep_file(tmp_path, {"seed": [0, 1]})
    afile = tmp_path / "afile"
    afile.write_text("keep")
    out = afile if where == "file" else afile / "sweep"
    for dry in ([], ["--dry-run"]):
        code, text = _cli("sweep", str(path), "--out", str(out), "-q", *dry)
        assert code == 3 and text.startswith("error:") and "is a file" in text
        assert len(text.strip().splitlines()) == 1
    assert afile.read_text() == "keep"


def test_an_empty_out_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _sweep_file(tmp_path, {"seed": [0, 1]})
    code, text = _cli("sweep", str(path), "--out", "", "-q")
    assert code == 2 and "--out is empty" in text
    assert not (tmp_path / "sweep.json").exists() and not (tmp_path / "configs").exists()


def test_a_read_only_or_full_file_system_is_one_line_before_any_cell_runs(tmp_path, monkeypatch):
    path = _sweep_file(tmp_path, {"seed": [0, 1]})
    spec, root = load_sweep(path)
    started = []
    monkeypatch.setattr(sweep_mod, "_run_local", lambda *a, **kw: started.append(a))

    def read_only(self: Path, *a, **kw):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    with monkeypatch.context() as m:
        m.setattr(Path, "mkdir", read_only)
        with pytest.raises(RunDirError, match="cannot make the sweep directory .*: Read-only file system"):
            run_sweep(spec, path, root, tmp_path / "out")

    def full(self: Path, *a, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    def full_new(path, *a, **kw):  # the sweep's own files are written new and renamed into place
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    from fedgmr.experiment import rundir

    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", full)
        m.setattr(rundir, "create_new", full_new)
        with pytest.raises(RunDirError, match="cannot write .*: No space left on device"):
            run_sweep(spec, path, root, tmp_path / "out2")
    assert not started
