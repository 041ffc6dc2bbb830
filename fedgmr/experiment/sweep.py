"""Grids of runs: ``fedgmr sweep SWEEP.yaml --out DIR``.

A sweep file names a base config (a preset or a config file), overrides for every cell,
and a grid of config keys; each point of the grid is a *cell*, an ordinary run directory
``DIR/<cell name>``. The sweep keeps an index, ``DIR/sweep.json``, with every cell's
overrides, status and headline figures, rewritten atomically as cells finish.

Cells run as ``fedgmr run`` processes (``jobs`` at a time), or as Ray tasks on a cluster.
A rerun skips finished cells, resumes interrupted ones from their checkpoints and starts
the rest; a failing cell is recorded with its error and does not stop the others.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import re
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedgmr.config import ExperimentConfig, dump_config, parse_value, read_config_file, set_dotted
from fedgmr.errors import ConfigError, FedGMRError, RunDirError

log = logging.getLogger(__name__)

INDEX_FILE = "sweep.json"
CONFIG_DIR = "configs"
LOG_DIR = "logs"
#: environment variable naming the sweep's pid: a cell process dies with its sweep
PARENT_ENV = "FEDGMR_PARENT_PID"

Status = Literal["pending", "running", "done", "failed"]

#: the most cells a sweep expands to unless asked for more (``--max-cells``): counted from
#: the grid's sizes before any cell is made, so a typo'd grid of 10^9 points costs nothing
MAX_CELLS = 10_000
#: the longest cell name, in bytes: a cell is a directory and ``configs/<name>.yaml``, and
#: a file name has at most 255 bytes on common file systems
MAX_NAME_BYTES = 255 - len(".yaml")


def is_case_axis(axis: str) -> bool:
    """Whether a sweep axis name can be a case axis: not the base (``preset``) and not a
    config key (dotted, or a top-level field), which are the other axes a cell has."""
    return axis != "preset" and "." not in axis and axis not in ExperimentConfig.model_fields


class CaseSpec(BaseModel):
    """One named set of overrides: a value of the sweep's ``cases`` axis."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1)
    set: dict[str, Any] = Field(default_factory=dict)


class SweepSpec(BaseModel):
    """A sweep file.

    base: a preset name or a config file (relative to the sweep file); a list makes the
        base config one more axis of the grid (``preset``).
    set: overrides applied to every cell (dotted keys).
    grid: the axes: dotted config keys, each with a list of values; the cells are the
        product of the axes in the order written.
    cases: optional named override sets, one more axis (``case``), for variants that change
        several keys at once (e.g. an ablation); or a mapping of axis names to such lists,
        one axis each (``{tier: [...], policy: [...]}``), applied in the order written.
    imports: your code, imported before the cells are resolved and by every cell: module
        names (importable from the current directory or ``sys.path``) or ``.py`` files
        (relative to the sweep file).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = "sweep"
    base: str | list[str] = "quickstart"
    set: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    cases: list[CaseSpec] | dict[str, list[CaseSpec]] = Field(default_factory=list)
    imports: list[str] = Field(default_factory=list)

    @field_validator("cases")
    @classmethod
    def _cases(cls, v: list[CaseSpec] | dict[str, list[CaseSpec]]) -> list[CaseSpec] | dict[str, list[CaseSpec]]:
        for axis, specs in (v.items() if isinstance(v, dict) else [("case", v)]):
            if isinstance(v, dict) and not (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", axis) and is_case_axis(axis)):
                raise ValueError(f"case axis {axis!r} must be a plain name (letters, digits, _) and not 'preset' "
                                 f"or a top-level config key")
            if isinstance(v, dict) and not specs:
                raise ValueError(f"case axis '{axis}' has no cases")
            labels = [c.label for c in specs]
            if len(set(labels)) != len(labels):
                raise ValueError(f"case axis '{axis}' repeats a label")
        return v

    def case_axes(self) -> dict[str, list[CaseSpec]]:
        """The named case axes (``case`` for a plain list), in the order written."""
        if isinstance(self.cases, dict):
            return dict(self.cases)
        return {"case": list(self.cases)} if self.cases else {}

    @field_validator("grid")
    @classmethod
    def _axes(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if not values:
                raise ValueError(f"axis '{key}' has no values")
            if len({json.dumps(x, sort_keys=True) for x in values}) != len(values):
                raise ValueError(f"axis '{key}' repeats a value")
        return v

    @field_validator("base")
    @classmethod
    def _base(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and (not v or len(set(v)) != len(v)):
            raise ValueError("a list of base configs must be non-empty and without repeats")
        return v


#: the headline values a ``--blind`` pass keeps out of sweep.json (the cell's own records keep them)
BLIND_KEYS = ("final_accuracy", "acc_at_t_star")


@dataclass
class Cell:
    """One run of the sweep."""

    name: str
    base: str
    overrides: dict[str, Any]
    config: ExperimentConfig | None = None
    status: Status = "pending"
    error: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    #: the cell's value on each axis of the grid (``preset``, ``case`` and the grid's keys)
    point: dict[str, Any] = field(default_factory=dict)
    #: whether this sweep process decides the cell's status in ``sweep.json`` (a cell it
    #: runs or skips); the others' entries are merged from the index on disk, where another
    #: sweep into the same directory may have recorded them
    mine: bool = field(default=False, repr=False)
    #: the process (pid; 0 when unknown) of another sweep that runs this cell: it is left to it
    elsewhere: int | None = field(default=None, repr=False)
    #: a cell of a ``--blind`` pass: it runs as ``fedgmr run --blind``, and its index entry
    #: leaves out the accuracies (they stay in the cell's summary.json), so that a look at
    #: sweep.json, or at its diff, reads none
    blind: bool = field(default=False, repr=False)
    #: the wall seconds this cell should take, from finished cells like it
    #: (:func:`expected_wall_times`; None: none like it has finished), for a progress estimate
    expected_s: float | None = field(default=None, repr=False)

    def index_entry(self) -> dict[str, Any]:
        result = {k: v for k, v in self.result.items() if not (self.blind and k in BLIND_KEYS)}
        entry = {"name": self.name, "base": self.base, "overrides": self.overrides, "point": self.point,
                 "status": self.status, "error": self.error, **result}
        if self.elsewhere is not None:
            entry["note"] = "running in another process" + (f" ({self.elsewhere})" if self.elsewhere else "")
        return entry


#: the paper's tables as sweep files, shipped with the package (``fedgmr sweep table1``)
SHIPPED = Path(__file__).resolve().parents[1] / "sweeps"


def shipped_sweeps() -> list[str]:
    """Names of the shipped sweep files (``table1``, ``paper/table1_femnist``, ...)."""
    return sorted(str(p.relative_to(SHIPPED).with_suffix("")) for p in SHIPPED.rglob("*.yaml"))


def load_sweep(path: str | Path, overrides: Iterable[str] = (),
               imports: Iterable[str] = ()) -> tuple[SweepSpec, Path]:
    """Read and validate a sweep file (a path, or the name of a shipped one); ConfigError
    naming the key on a bad file. ``overrides`` (``key=value`` strings, e.g. from
    ``--set``) join the file's ``set``; ``imports`` (e.g. from ``--import``, files relative
    to the current directory) join the file's ``imports`` (files relative to the sweep
    file). Files become absolute paths; nothing is imported yet (:func:`import_sweep_code`)."""
    path = Path(path)
    if not path.is_file() and str(path) in shipped_sweeps():
        path = SHIPPED / f"{path}.yaml"
    if not path.is_file() and not (os.path.lexists(path) and not path.is_dir()):
        raise ConfigError(f"sweep file {path} does not exist (shipped sweeps: {', '.join(shipped_sweeps())})")
    raw = read_config_file(path)  # a FIFO or a device (a link to /dev/zero): one line, never read
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep file {path}: the top level must be a mapping (name, base, set, grid, cases, "
                          "imports)")
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "<root>"
        if first["type"] == "extra_forbidden":
            raise ConfigError(f"sweep file {path}: unknown key '{key}' (keys: name, base, set, grid, cases, "
                              "imports)") from None
        raise ConfigError(f"sweep file {path}: invalid '{key}': {first['msg'].removeprefix('Value error, ')}") from None
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got '{item}'")
        key, value = item.split("=", 1)
        if key.strip() in spec.grid:
            raise ConfigError(f"--set {key.strip()}: it is an axis of the sweep's grid")
        spec.set[key.strip()] = parse_value(value)
    from fedgmr.plugins import normalize_import

    listed = [normalize_import(s, path.parent) for s in spec.imports] + [normalize_import(s) for s in imports]
    spec.imports = list(dict.fromkeys(listed))
    return spec, path.parent


def import_sweep_code(spec: SweepSpec, root: Path | None = None) -> None:
    """Import the sweep's ``imports`` in this process (files relative to ``root``, the
    sweep file's folder), so its cells can be resolved; PluginError on a failure."""
    from fedgmr.plugins import import_all, normalize_import

    spec.imports = list(dict.fromkeys(normalize_import(s, root) for s in spec.imports))
    import_all(spec.imports)


def _short(key: str, keys: Iterable[str]) -> str:
    """The last component of a dotted key, or the whole key where that is ambiguous."""
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key


def _label(value: Any) -> str:
    if isinstance(value, list):
        text = "+".join(_label(v) for v in value)
    elif isinstance(value, dict):
        text = "+".join(f"{k}-{_label(v)}" for k, v in value.items())
    else:
        text = str(value)
    return re.sub(r"[^A-Za-z0-9._+-]", "-", text)


def axis_sizes(spec: SweepSpec) -> dict[str, int]:
    """The number of values on each axis of the grid (``preset``, the case axes, the
    grid's keys), in order; the sweep has their product of cells."""
    bases = spec.base if isinstance(spec.base, list) else [spec.base]
    sizes = {"preset": len(bases)} if len(bases) > 1 else {}
    sizes.update({axis: len(specs) for axis, specs in spec.case_axes().items()})
    sizes.update({key: len(values) for key, values in spec.grid.items()})
    return sizes


def count_cells(spec: SweepSpec) -> int:
    """How many cells the sweep has, from the axis sizes alone (nothing is expanded)."""
    return math.prod(axis_sizes(spec).values())


def check_size(spec: SweepSpec, max_cells: int | None = MAX_CELLS) -> int:
    """The sweep's cell count; ConfigError when it is above ``max_cells`` (None: no bound)."""
    total = count_cells(spec)
    if max_cells is not None and total > max_cells:
        sizes = " x ".join(f"{n:,} ({axis})" for axis, n in axis_sizes(spec).items())
        raise ConfigError(f"sweep {spec.name} has {total:,} cells ({sizes}), more than the bound of {max_cells:,}; "
                          f"shrink the grid, or pass --max-cells {total} to run it anyway")
    return total


def expand(spec: SweepSpec, root: Path, max_cells: int | None = MAX_CELLS) -> list[Cell]:
    """The sweep's cells, in grid order, each with its overrides and a readable name
    built from the axes that take more than one value (``method=fedgmr,seed=0``).

    The cells are counted first (:func:`check_size`): above ``max_cells`` (None: no
    bound) it is a ConfigError and nothing is expanded."""
    check_size(spec, max_cells)
    bases = spec.base if isinstance(spec.base, list) else [spec.base]
    axes: list[tuple[str, list[Any]]] = []
    if len(bases) > 1:
        axes.append(("preset", bases))
    case_axes = spec.case_axes()
    clash = sorted(set(case_axes) & set(spec.grid))
    if clash:
        raise ConfigError(f"sweep axis '{clash[0]}' is both a case axis and a grid key")
    for axis, specs in case_axes.items():
        axes.append((axis, [c.label for c in specs]))
    axes.extend(spec.grid.items())
    named = [k for k, values in axes if len(values) > 1]
    cases = {axis: {c.label: c.set for c in specs} for axis, specs in case_axes.items()}
    cells = []
    for point in itertools.product(*(values for _, values in axes)):
        chosen = dict(zip((k for k, _ in axes), point))
        base = chosen.pop("preset", bases[0])
        overrides = dict(spec.set)
        for axis, sets in cases.items():
            overrides.update(sets[chosen.pop(axis)])
        overrides.update(chosen)
        parts = [f"{_short(k, named)}={_label(v)}" for k, v in zip((k for k, _ in axes), point) if k in named]
        cells.append(Cell(",".join(parts) or "run", _resolve_base(base, root), overrides,
                          point=dict(zip((k for k, _ in axes), point))))
    if len({c.name for c in cells}) != len(cells):
        raise ConfigError("two cells of the sweep would share a directory name: make the axis values distinct")
    long = next((c.name for c in cells if len(c.name.encode("utf-8")) > MAX_NAME_BYTES), None)
    if long is not None:
        raise ConfigError(f"sweep cell name {long[:60]}... is {len(long.encode('utf-8'))} bytes, more than the "
                          f"{MAX_NAME_BYTES} a file name can take: shorten the axis values (or use cases, whose "
                          f"labels name the cells)")
    return cells


def parse_only(items: Iterable[str], flag: str = "--only") -> dict[str, list[str]]:
    """``--only`` (or ``--exclude``) arguments (``heterogeneity=high``, ``seed=0,1``) as
    axis -> values; ``flag`` names the option in the error."""
    only: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise ConfigError(f"{flag} expects axis=value[,value...], got '{item}'")
        only.setdefault(key.strip(), []).extend(v.strip() for v in values.split(",") if v.strip())
    return only


def select(cells: list[Cell], only: dict[str, list[str]]) -> list[Cell]:
    """The cells whose value on each named axis is one of the listed values. Axes are
    named as in the cell names (``heterogeneity``, ``preset``, ``case``) or by their
    dotted key; values as they are written in the cell names. ConfigError naming the
    axes or the values there are, for a name that matches nothing."""
    if not only or not cells:
        return list(cells)
    axes = list(cells[0].point)
    chosen: list[tuple[str, set[str]]] = []
    for name, values in only.items():
        matches = [k for k in axes if k == name] or [k for k in axes if k.rsplit(".", 1)[-1] == name]
        if len(matches) != 1:
            what = "is ambiguous" if matches else "is not an axis of this sweep"
            raise ConfigError(f"--only {name}: {what} (axes: {', '.join(axes)})")
        axis = matches[0]
        present = list(dict.fromkeys(_label(c.point[axis]) for c in cells))
        unknown = [v for v in values if v not in present]
        if unknown:
            raise ConfigError(f"--only {name}: no cell has {', '.join(unknown)} (values: {', '.join(present)})")
        chosen.append((axis, set(values)))
    return [c for c in cells if all(_label(c.point[a]) in vs for a, vs in chosen)]


def _resolve_base(base: str, root: Path) -> str:
    """A config file relative to the sweep file, or a preset name."""
    candidate = root / base
    return str(candidate.resolve()) if candidate.is_file() else base


def resolve_cells(cells: list[Cell]) -> None:
    """Validate every cell's config up front: a bad cell is a ConfigError naming it,
    before anything runs."""
    from fedgmr.presets import load_raw_config
    from fedgmr.methods import resolve_config

    for cell in cells:
        try:
            raw = load_raw_config(cell.base)
            for key, value in cell.overrides.items():
                set_dotted(raw, key, value)
            cell.config = resolve_config(raw, cell.overrides)
        except ConfigError as exc:
            raise ConfigError(f"sweep cell {cell.name}: {exc}") from None


# ---------------------------------------------------------------------- the run loop
@dataclass
class SweepOutcome:
    """What a sweep pass did."""

    cells: list[Cell]
    skipped: list[str]
    resumed: list[str]
    wall_s: float

    @property
    def failed(self) -> list[Cell]:
        return [c for c in self.cells if c.status == "failed"]

    @property
    def elsewhere(self) -> list[Cell]:
        """Cells another sweep into the same directory was running: left to it."""
        return [c for c in self.cells if c.elsewhere is not None and c.status != "done"]


def check_out(out: Path) -> None:
    """Refuse a sweep directory that cannot be one (a file, below a file, an empty name),
    in one line, before anything is written."""
    if not str(out).strip():
        raise ConfigError("--out is empty: name the sweep directory")
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out} is a file, not a sweep directory")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise RunDirError(f"cannot make the sweep directory {out}: {above} is a file, not a directory")


def _make_out(out: Path) -> None:
    """Create the sweep directory and its folders; an OSError (read-only, full disk,
    permissions) is one line."""
    check_out(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / CONFIG_DIR).mkdir(exist_ok=True)
        (out / LOG_DIR).mkdir(exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot make the sweep directory {out}: {exc.strerror or exc}") from None


#: the lock of ``sweep.json``'s read-merge-write (``flock``): two sweeps into one directory
INDEX_LOCK = ".sweep.lock"
#: the longest wait for the index lock (the other sweep holds it for one read and write)
INDEX_LOCK_WAIT = 60.0
#: the keys of a ``sweep.json`` entry that describe the cell (the others record its outcome)
_CELL_KEYS = ("name", "base", "overrides", "point")


@contextlib.contextmanager
def _index_lock(out: Path) -> Iterator[None]:
    """Hold ``out/.sweep.lock`` (exclusive ``flock``, never through a link) while the index
    is read, merged and written; POSIX only (elsewhere: no lock)."""
    from fedgmr.experiment.rundir import open_for_write

    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = open_for_write(out / INDEX_LOCK, os.O_RDWR)
    try:
        deadline = time.monotonic() + INDEX_LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RunDirError(f"{out / INDEX_LOCK} stayed locked for {INDEX_LOCK_WAIT:g} s: another sweep "
                                      f"into {out} is stuck writing {INDEX_FILE}") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_index(out: Path, spec: SweepSpec, sweep_file: Path, cells: list[Cell]) -> None:
    """Write ``sweep.json`` for ``cells``, merged under :data:`INDEX_LOCK` with the index on
    disk: a cell this process does not decide (:attr:`Cell.mine` false: outside this pass,
    or run by another sweep) keeps the status another sweep recorded for it, unless this
    process saw it finished. Two sweeps into one directory never undo each other's cells."""
    from fedgmr.experiment.rundir import write_atomic

    with _index_lock(out):
        disk = _read_json(out / INDEX_FILE) or {}
        recorded = {e.get("name"): e for e in disk.get("cells", []) if isinstance(e, dict)} \
            if isinstance(disk.get("cells"), list) else {}
        entries = []
        for cell in cells:
            entry = cell.index_entry()
            old = recorded.get(cell.name)
            if (not cell.mine and cell.status != "done" and isinstance(old, dict)
                    and old.get("overrides") == entry["overrides"] and old.get("status") not in (None, "pending")):
                entry = {**{k: entry[k] for k in _CELL_KEYS}, **{k: v for k, v in old.items() if k not in _CELL_KEYS}}
            entries.append(entry)
        data = {"name": spec.name, "sweep_file": str(sweep_file), "spec": spec.model_dump(mode="json"),
                "cells": entries}
        write_atomic(out / INDEX_FILE, json.dumps(data, indent=2) + "\n")


def _lock_holder(cell_dir: Path) -> int | None:
    """The process holding the run lock of ``cell_dir`` (a cell another sweep runs), 0 when
    it is held by a process that cannot be named; None when it is free. Read from
    ``/proc/locks`` on Linux (nothing is locked to ask); elsewhere by trying the lock."""
    from fedgmr.experiment.rundir import LOCK_FILE

    path = cell_dir / LOCK_FILE
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            table = fh.read(1 << 22)
    except OSError:
        table = None
    if table is not None:
        for line in table.splitlines():
            fields = line.split()
            if "FLOCK" not in fields:
                continue
            i = fields.index("FLOCK")
            try:
                pid, (major, minor, ino) = int(fields[i + 3]), fields[i + 4].split(":")
                if (int(major, 16), int(minor, 16), int(ino)) == (os.major(st.st_dev), os.minor(st.st_dev),
                                                                   st.st_ino):
                    return pid
            except (IndexError, ValueError):
                continue
        return None
    try:  # pragma: no cover - not Linux: try the lock (shared, released at once)
        import fcntl

        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except (ImportError, OSError):
        return None
    try:  # pragma: no cover
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except BlockingIOError:  # pragma: no cover
        return 0
    finally:
        os.close(fd)


def _leave_to_other(cell: Cell, pid: int) -> None:
    """Mark ``cell`` as run by another process: not this pass's to run, not failed."""
    cell.status, cell.error, cell.mine, cell.elsewhere = "running", None, False, pid
    log.warning("sweep cell %s is running in another process%s: left to it (rerun the sweep once it ends to "
                "collect it)", cell.name, f" ({pid})" if pid else "")


def _what_it_computes(cfg: ExperimentConfig) -> dict[str, Any]:
    """The config as dotted keys, without the keys that only say how a run executes
    (the seed stays: it is part of what a cell computes)."""
    from fedgmr.experiment.metrics import EXECUTION_KEYS, flatten_config

    return {k: v for k, v in flatten_config(cfg.model_dump(mode="json")).items()
            if k == "seed" or k not in EXECUTION_KEYS}


def same_experiment(saved: Path, cfg: ExperimentConfig) -> bool:
    """Whether the run directory's config.yaml computes the same experiment as ``cfg``
    (keys added to the library since, with their defaults, and execution keys aside)."""
    from fedgmr.config import parse_config

    try:
        return _what_it_computes(parse_config(read_config_file(saved))) == _what_it_computes(cfg)
    except FedGMRError:
        return False


def _cell_state(cell_dir: Path, cfg: ExperimentConfig) -> Literal["new", "done", "resume", "restart", "changed"]:
    """What a rerun must do with a cell's directory."""
    if not cell_dir.exists() or not any(cell_dir.iterdir()):
        return "new"
    saved = cell_dir / "config.yaml"
    if saved.exists() and not same_experiment(saved, cfg):
        return "changed"
    if os.path.lexists(cell_dir / "summary.json") and saved.exists():
        summary = _read_json(cell_dir / "summary.json")
        if summary is not None and summary.get("status", "completed") != "failed":
            return "done"
        return "restart"  # a run that failed (exit 5) starts again rather than resuming
    if (cell_dir / "checkpoint" / "state.json").exists():
        return "resume"
    return "restart"


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object of a sweep or run directory (None: missing, damaged, or not a regular
    file - a FIFO or a link to /dev/zero is never read)."""
    from fedgmr.experiment.rundir import read_run_text

    try:
        data = json.loads(read_run_text(path))
    except (OSError, ValueError, FedGMRError):
        return None
    return data if isinstance(data, dict) else None


def _headline(cell_dir: Path) -> dict[str, Any]:
    summary = _read_json(cell_dir / "summary.json") or {}
    keys = ("final_accuracy", "acc_at_t_star", "t_star", "time", "steps", "wall_time_s", "rejected_updates")
    return {k: summary.get(k) for k in keys if k in summary}


#: the axes a cell's estimate must share with the finished cells it is taken from (where it has them)
SAME_KIND_AXES = ("preset", "case", "method")


def expected_wall_times(cells: Iterable[Cell], known: Iterable[Cell]) -> None:
    """Set each cell's :attr:`Cell.expected_s`: the mean ``wall_time_s`` of the finished cells
    of ``known`` most like it. Those taken agree with it on every axis of
    :data:`SAME_KIND_AXES` it has (the same task and method) and, among those, on the most
    other axes but the seed (the same column first); None where no such cell has finished.
    A progress display sums these for the cells left, rather than assuming every cell
    costs what the first ones did (a column's fast methods often run first)."""
    done = [k for k in known if k.status == "done" and isinstance(k.result.get("wall_time_s"), (int, float))]
    for cell in cells:
        must = {a: cell.point[a] for a in SAME_KIND_AXES if a in cell.point}
        alike = [k for k in done if k.name != cell.name and all(k.point.get(a) == v for a, v in must.items())]
        if not must or not alike:
            cell.expected_s = None
            continue
        rest = [a for a in cell.point if a not in must and a != "seed"]
        score = {k.name: sum(k.point.get(a) == cell.point[a] for a in rest) for k in alike}
        best = max(score.values())
        times = [float(k.result["wall_time_s"]) for k in alike if score[k.name] == best]
        cell.expected_s = sum(times) / len(times)


def cell_command(cell: Cell, out: Path, state: str, imports: Iterable[str] = ()) -> list[str]:
    """The ``fedgmr run`` command line for a cell in the given state (``imports``: the
    sweep's, each passed on as ``--import``; a cell of a blind pass, ``cell.blind``, runs
    ``--blind``: its log shows no accuracy)."""
    cell_dir = out / cell.name
    extra = [arg for spec in imports for arg in ("--import", spec)] + (["--blind"] if cell.blind else [])
    if state == "resume":
        return [sys.executable, "-m", "fedgmr", "run", "--resume", str(cell_dir), "-q", *extra]
    cmd = [sys.executable, "-m", "fedgmr", "run", str(out / CONFIG_DIR / f"{cell.name}.yaml"),
           "--out", str(cell_dir), "-q", *extra]
    return cmd + (["--overwrite"] if state == "restart" else [])


def _module_path(imports: Iterable[str]) -> list[str]:
    """Folders a cell needs on PYTHONPATH to import the sweep's module names the way the
    sweep did (from its current directory); files need none."""
    from fedgmr.plugins import is_path

    return [os.getcwd()] if any(not is_path(s) for s in imports) else []


def _with_path(env: dict[str, str], folders: list[str]) -> dict[str, str]:
    if folders:
        env["PYTHONPATH"] = os.pathsep.join([*folders, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _last_error(log_path: Path) -> str:
    """The last ``error:`` line of a cell's log, else its last line."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors or lines or ["exited without output"])[-1]


def run_sweep(spec: SweepSpec, sweep_file: Path, root: Path, out: Path, jobs: int | None = None,
              executor: Literal["local", "ray"] = "local", ray_address: str | None = None,
              on_event: Callable[[str, Cell, int, int], None] | None = None,
              only: dict[str, list[str]] | None = None, max_cells: int | None = MAX_CELLS,
              blind: bool = False) -> SweepOutcome:
    """Run (or continue) the sweep into ``out``; returns what this pass did.

    ``only`` (axis -> values, :func:`select`) runs part of the grid: the other cells keep
    their names and places in the index (``pending`` until a pass runs them).
    ``ray_address`` defaults to the base config's ``run.ray_address``.
    ``on_event(kind, cell, finished, total)`` is told of ``queued`` (each cell this pass
    will run, once, before any starts; its ``expected_s`` set), ``start``, ``skip``, ``done``,
    ``fail`` and ``left`` (a queued or started cell that another sweep into ``out`` runs:
    left to it) events, for a progress display. ``max_cells``: the bound on the grid's size
    (:data:`MAX_CELLS`; None: none). ``blind``: each cell runs as ``fedgmr run --blind``, its
    log showing no accuracy, and its entry in sweep.json leaves the accuracies out
    (:data:`BLIND_KEYS`; the run's own records do not change): one flag on each cell of
    the pass, ``Cell.blind``, that the command line and the index entry both read."""
    import_sweep_code(spec, root)
    check_out(out)
    every = expand(spec, root, max_cells)
    cells = select(every, only or {})
    for cell in cells:
        cell.blind = blind
    resolve_cells(cells)
    if executor == "ray" and ray_address is None:
        ray_address = cells[0].config.run.ray_address  # type: ignore[union-attr]
    _make_out(out)
    notify = on_event or (lambda *a: None)
    t0 = time.perf_counter()
    todo: list[tuple[Cell, str]] = []
    skipped: list[str] = []
    resumed: list[str] = []
    for cell in cells:
        try:
            from fedgmr.experiment.rundir import write_atomic  # never through a link or special file

            with _index_lock(out):  # two sweeps into one directory share the temporary's name
                write_atomic(out / CONFIG_DIR / f"{cell.name}.yaml", dump_config(cell.config))  # type: ignore[arg-type]
        except OSError as exc:
            raise RunDirError(f"cannot write {out / CONFIG_DIR / f'{cell.name}.yaml'}: {exc.strerror or exc}") from None
        holder = _lock_holder(out / cell.name)
        if holder is not None:  # another sweep into this directory runs it now
            _leave_to_other(cell, holder)
            continue
        cell.mine = True
        state = _cell_state(out / cell.name, cell.config)  # type: ignore[arg-type]
        if state == "done":
            cell.status, cell.result = "done", _headline(out / cell.name)
            skipped.append(cell.name)
        elif state == "changed":
            cell.status = "failed"
            cell.error = (f"{out / cell.name} holds a run with a different config: remove it to rerun this cell "
                          "with the sweep file's settings")
        else:
            if state == "resume":
                resumed.append(cell.name)
            todo.append((cell, state))
    finished = len(cells) - len(todo)
    for cell in cells:
        if cell.elsewhere is not None:
            notify("left", cell, finished, len(cells))
        elif cell.status in ("done", "failed"):
            notify("skip" if cell.status == "done" else "fail", cell, finished, len(cells))
    this_pass = {c.name: c for c in cells}
    for cell in every:  # the cells this pass leaves alone: as a full pass would find them
        if cell.name not in this_pass and (out / cell.name / "summary.json").is_file():
            cell.status, cell.result = "done", _headline(out / cell.name)
    # the index lists the whole grid; the cells of this pass are the objects updated below
    index = [this_pass.get(e.name, e) for e in every]
    _write_index(out, spec, sweep_file, index)
    expected_wall_times([c for c, _ in todo], index)
    for cell, _ in todo:  # the cells this pass will run, each with its expected wall time
        notify("queued", cell, finished, len(cells))
    if executor == "ray":
        _run_ray(todo, out, ray_address, cells, spec, sweep_file, notify, index)
    else:
        _run_local(todo, out, jobs or os.cpu_count() or 1, cells, spec, sweep_file, notify, index)
    return SweepOutcome(cells, skipped, resumed, time.perf_counter() - t0)


def _finish(cell: Cell, out: Path, rc: int, error: str | None) -> None:
    """Record how the cell's process ended. A cell refused because another sweep runs it
    (its directory is locked) is left to that sweep, and one that another sweep finished
    meanwhile (this process was refused: it already holds a run) is done, not failed."""
    cell_dir = out / cell.name
    if rc == 0 and (cell_dir / "summary.json").exists():
        cell.status, cell.error, cell.result = "done", None, _headline(cell_dir)
        return
    if rc == RunDirError.exit_code:
        holder = _lock_holder(cell_dir)
        if holder is not None:
            _leave_to_other(cell, holder)
            return
        if cell.config is not None and _cell_state(cell_dir, cell.config) == "done":
            log.warning("sweep cell %s was finished by another process meanwhile: its result is kept", cell.name)
            cell.status, cell.error, cell.result = "done", None, _headline(cell_dir)
            return
    cell.status, cell.error = "failed", error or f"exit code {rc}"


def _claim_at_start(cell: Cell, out: Path, state: str) -> str | None:
    """Just before a queued cell starts: its state again (another sweep into the same
    directory may have run it since this pass looked); None when it is not to start here
    (running in another process, or finished meanwhile)."""
    if cell.config is None:
        return state
    holder = _lock_holder(out / cell.name)
    if holder is not None:
        _leave_to_other(cell, holder)
        return None
    now = _cell_state(out / cell.name, cell.config)
    if now == "done":
        cell.status, cell.error, cell.result = "done", None, _headline(out / cell.name)
        return None
    return state if now == "changed" else now


def _run_local(todo: list[tuple[Cell, str]], out: Path, jobs: int, cells: list[Cell], spec: SweepSpec,
               sweep_file: Path, notify: Callable[[str, Cell, int, int], None], index: list[Cell]) -> None:
    env = _with_path({**os.environ, PARENT_ENV: str(os.getpid()), "FEDGMR_PROGRESS": "0"},
                     _module_path(spec.imports))
    queue = list(todo)
    running: dict[subprocess.Popen, tuple[Cell, Any]] = {}
    finished = len(cells) - len(todo)
    try:
        while queue or running:
            while queue and len(running) < jobs:
                cell, state = queue.pop(0)
                started = _claim_at_start(cell, out, state)
                if started is None:  # run elsewhere, or finished there meanwhile
                    finished += 1
                    notify("skip" if cell.status == "done" else "left", cell, finished, len(cells))
                    continue
                from fedgmr.experiment.rundir import open_for_write

                fh = os.fdopen(open_for_write(out / LOG_DIR / f"{cell.name}.log", os.O_WRONLY | os.O_APPEND), "a")
                proc = subprocess.Popen(cell_command(cell, out, started, spec.imports), stdout=fh,
                                        stderr=subprocess.STDOUT, env=env)
                running[proc] = (cell, fh)
                cell.status = "running"
                notify("start", cell, finished, len(cells))
            _write_index(out, spec, sweep_file, index)
            if not running:
                continue
            while not any(p.poll() is not None for p in running):
                time.sleep(0.2)
            for proc in [p for p in running if p.poll() is not None]:
                cell, fh = running.pop(proc)
                fh.close()
                _finish(cell, out, proc.returncode, _last_error(out / LOG_DIR / f"{cell.name}.log")
                        if proc.returncode else None)
                finished += 1
                notify("left" if cell.elsewhere is not None else "done" if cell.status == "done" else "fail",
                       cell, finished, len(cells))
            _write_index(out, spec, sweep_file, index)
    finally:
        # an interrupted sweep stops its cells (each resumes from its checkpoint next time)
        for proc, (cell, fh) in running.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, (cell, fh) in running.items():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            fh.close()
            if cell.status == "running" and cell.elsewhere is None:
                cell.status = "pending"
        _write_index(out, spec, sweep_file, index)


def _ray_cell(cmd: list[str], log_path: str, pythonpath: list[str] | None = None) -> tuple[int, str | None]:
    """Run one cell's command on a Ray worker (the run directory, and the sweep's imports,
    must be on storage every node shares; ``pythonpath`` joins the worker's PYTHONPATH)."""
    from fedgmr.experiment.rundir import open_for_write

    with os.fdopen(open_for_write(log_path, os.O_WRONLY | os.O_APPEND), "a") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env=_with_path({**os.environ, "FEDGMR_PROGRESS": "0"}, pythonpath or [])).returncode
    return rc, (_last_error(Path(log_path)) if rc else None)


def _run_ray(todo: list[tuple[Cell, str]], out: Path, address: str | None, cells: list[Cell], spec: SweepSpec,
             sweep_file: Path, notify: Callable[[str, Cell, int, int], None], index: list[Cell]) -> None:
    from fedgmr.sim.executors import _import_ray

    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(_ray_cell)
    finished = len(cells) - len(todo)
    refs = {}
    try:
        for cell, state in todo:
            started = _claim_at_start(cell, out, state)
            if started is None:  # run elsewhere, or finished there meanwhile
                finished += 1
                notify("skip" if cell.status == "done" else "left", cell, finished, len(cells))
                continue
            refs[remote.remote(cell_command(cell, out, started, spec.imports), str(out / LOG_DIR / f"{cell.name}.log"),
                               _module_path(spec.imports))] = cell
            cell.status = "running"
            notify("start", cell, finished, len(cells))
        _write_index(out, spec, sweep_file, index)
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                cell = refs.pop(ref)
                try:
                    rc, error = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a lost worker fails its cell only
                    rc, error = 1, f"ray task failed: {str(exc).splitlines()[0]}"
                _finish(cell, out, rc, error)
                finished += 1
                notify("left" if cell.elsewhere is not None else "done" if cell.status == "done" else "fail",
                       cell, finished, len(cells))
            _write_index(out, spec, sweep_file, index)
    finally:
        for ref, cell in refs.items():
            ray.cancel(ref, force=True)
            cell.status = "pending"
        _write_index(out, spec, sweep_file, index)
        if started:
            ray.shutdown()


def read_index(out: str | Path) -> dict[str, Any]:
    """A sweep directory's index (``sweep.json``)."""
    data = _read_json(Path(out) / INDEX_FILE)
    if data is None:
        raise FedGMRError(f"{out} has no readable {INDEX_FILE}: not a sweep directory")
    return data


def die_with_parent() -> None:
    """In a cell process: exit when the sweep that started it dies (Linux: the kernel's
    parent-death signal; elsewhere a check at start). Called by the CLI at start-up."""
    parent = os.environ.pop(PARENT_ENV, None)  # not inherited by this process's own children
    if not parent:
        return
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - no prctl
            pass
    if str(os.getppid()) != parent:  # the sweep died before we could ask
        raise SystemExit(143)


__all__ = ["SHIPPED", "shipped_sweeps", "SweepSpec", "CaseSpec", "Cell", "SweepOutcome", "load_sweep",
           "import_sweep_code", "expand", "resolve_cells", "run_sweep", "MAX_CELLS", "count_cells", "check_size",
           "check_out",
           "read_index", "cell_command", "die_with_parent", "INDEX_FILE"]
