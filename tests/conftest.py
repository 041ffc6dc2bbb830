"""Shared fixtures: tiny configs that run in a second or two."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    # tests run in parallel on 2 cores; oversubscribed BLAS threads only slow them down
    torch.set_num_threads(1)


def timeout_scale() -> float:
    """How much longer than on an idle machine every wait in the tests may take.

    ``FEDGMR_TEST_TIMEOUT_SCALE`` (default 1) times the machine's current load per core
    (at least 1, at most 8): a test that waits on a process or a server never fails only
    because the machine is busy, e.g. with another test suite running beside it."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # pragma: no cover - platforms without a load average
        load = 1.0
    return float(os.environ.get("FEDGMR_TEST_TIMEOUT_SCALE", "1")) * min(8.0, max(1.0, load))


def scaled(seconds: float) -> float:
    """``seconds`` scaled by :func:`timeout_scale`: use for every timeout a test waits on."""
    return seconds * timeout_scale()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Keep each phase's report on the test item, so fixtures can tell a failed test
    (and, for example, print the logs of the servers it started)."""
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def tiny_config(**sections: Any) -> dict[str, Any]:
    """A raw config dict for a seconds-long digits run; keyword sections are merged in."""
    cfg: dict[str, Any] = {
        "name": "tiny",
        "method": "fedgmr",
        "seed": 0,
        "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.5},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "clients": {"num_clients": 10, "heterogeneity": "high"},
        "training": {"lr": 0.1, "local_steps": 2},
        "restoration": {"check_interval": 2, "patience": 1},
        "network": {"model_size_mb": 2.0},
        # the CPU: these runs' bit-exact comparisons are CPU guarantees (tests/gpu: the GPU)
        "run": {"max_steps": 30, "eval_every": 2, "device": "cpu"},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def tiny_text_config(name: str, **sections: Any) -> dict[str, Any]:
    """A raw config like :func:`tiny_config` for a next-character task with no classes to
    report: registers data set ``name`` (12 short sequences over 5 characters) and a one-layer
    char-LSTM on two clients; keyword sections are merged in."""
    from fedgmr.data import DATASETS, ArrayDataset, FederatedData

    @DATASETS.register(name, replace=True)
    def load(root: Any = None) -> FederatedData:
        seq = torch.arange(12 * 8).reshape(12, 8) % 5 + 1
        return FederatedData("tiny_text", ArrayDataset(seq[:10, :-1], seq[:10, 1:]), ArrayDataset(seq[10:, :-1],
                             seq[10:, 1:]), num_classes=6, task="next_token", pad_index=0)

    text = {"data": {"name": name, "partition": "iid"}, "clients": {"num_clients": 2, "heterogeneity": "none"},
            "model": {"name": "char_lstm", "options": {"embed_dim": 4, "hidden": 8, "layers": 1}}}
    return tiny_config(**{**text, **sections})


PROTOCOL_RESULTS = Path(__file__).resolve().parents[1] / "docs" / "protocol_results.md"


def page_section(heading: str, page: Path = PROTOCOL_RESULTS) -> str:
    """The text of ``page`` from ``heading`` (a whole heading line) to the next ``## `` heading:
    what the tests of hand-quoted numbers read from a results page."""
    text = page.read_text(encoding="utf-8")
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def simulate(raw: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """Build ``raw`` (a raw config dict), run it to its end, and return (records, the
    experiment); the executor is closed on every path."""
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    records: list[dict[str, Any]] = []
    cfg = resolve_config(raw)
    exp = build_experiment(cfg, on_record=records.append)
    try:
        exp.simulator.run(cfg.run.max_steps, cfg.run.max_time)
        exp.simulator.finish()
    finally:
        exp.executor.close()
    return records, exp


@pytest.fixture
def tiny() -> Any:
    return tiny_config


#: the warning filters of a fresh interpreter (pytest installs its own around each test)
_INTERPRETER_WARNING_FILTERS = list(warnings.filters)


def _warning_to_stderr(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                       line: str | None = None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


class _StderrHandler(logging.StreamHandler):
    """A logging handler that writes to ``sys.stderr`` as it is when a record is emitted
    (the command's, inside :func:`run_cli`)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class CliResult:
    """What :func:`run_cli` returns: the fields of a finished subprocess that tests read."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None, warnings_on_stderr: bool = False
            ) -> CliResult:
    """Run ``fedgmr ARGS`` in this process, in directory ``cwd`` (restored after), as the
    console script would: its exit code, stdout and stderr; ``env``: environment variables
    set for the command's duration. A tenth of a subprocess's cost (no interpreter or
    PyTorch start-up); keep true subprocesses for the installed entry point, for commands
    that ``--import`` code into the registries and for signals (kill -9, Ctrl-C).

    ``warnings_on_stderr``: the command's stderr also holds what the installed command
    prints there beyond its own output: logged warnings (``fedgmr.cli.main`` configures
    logging) and Python warnings (a fresh interpreter's filters), so a check that stderr
    is one line sees them as it would in a subprocess."""
    from typer.testing import CliRunner

    from fedgmr.cli import app

    old = os.getcwd()
    os.chdir(cwd)
    root = logging.getLogger()
    handler = _StderrHandler()  # what main()'s logging.basicConfig prints, on the command's stderr
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.WARNING)
    if warnings_on_stderr:
        root.addHandler(handler)
    try:
        with warnings.catch_warnings():
            if warnings_on_stderr:  # Python's warnings as a fresh interpreter shows them, on its stderr
                warnings.filters[:] = _INTERPRETER_WARNING_FILTERS
                warnings.showwarning = _warning_to_stderr
            result = CliRunner().invoke(app, [str(a) for a in args], prog_name="fedgmr", env=env)
    finally:
        root.removeHandler(handler)
        os.chdir(old)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return CliResult(result.exit_code, result.stdout, result.stderr)


#: the measured cells kept in the repository (docs/reproduction.md's tables read them)
MEASURED = Path(__file__).resolve().parents[1] / "measured"


def _signature(path: Path) -> tuple:
    """What a run directory's reading depends on: its files' (and its sweep index's) size and mtime."""
    out = []
    for f in (path / "config.yaml", path / "metrics.jsonl", path / "summary.json", path.parent / "sweep.json"):
        try:
            st = f.stat()
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


@pytest.fixture(scope="session")
def measured_read_once() -> Iterator[None]:
    """``fedgmr table`` on ``measured/...`` reads each cell once per test process: the
    measured cells' :func:`fedgmr.experiment.table.read_run` results are kept (by path,
    metric and the files' size and mtime) and handed out as copies, so the dozens of
    documented tables over the same few hundred cells parse them once, not once a table.
    Run directories elsewhere (a test's own, made or damaged in tmp_path) are read as always."""
    import copy

    from fedgmr.experiment import table

    read_run = table.read_run
    kept: dict[tuple, Any] = {}

    def cached(path: Path, metric: str = "accuracy") -> Any:
        path = Path(path)
        if not path.resolve().is_relative_to(MEASURED):
            return read_run(path, metric)
        key = (str(path.resolve()), str(path), metric, _signature(path))
        if key not in kept:
            kept[key] = read_run(path, metric)
        return copy.deepcopy(kept[key])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(table, "read_run", cached)
        yield


def fedgmr_in_process(*args: str, cwd: Path | None = None, check: bool = False,
                      env: dict[str, str] | None = None) -> CliResult:
    """``fedgmr ARGS`` as the tests' subprocess helpers ran it (``FEDGMR_PROGRESS=0``, in
    ``cwd`` or the current directory, logged and Python warnings on its stderr), in this
    process (:func:`run_cli`); ``check``: a non-zero exit fails the test with its stderr."""
    proc = run_cli(list(args), Path.cwd() if cwd is None else cwd, env={"FEDGMR_PROGRESS": "0", **(env or {})},
                   warnings_on_stderr=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"fedgmr {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def _ray_for_this_process() -> Iterator[Any]:
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'fedgmr[ray]'")
    yield ray
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def ray_session(_ray_for_this_process: Any) -> Any:
    """One local Ray instance per test process, shared by the tests that run on Ray: an
    ``executor: ray`` run uses the instance it finds and leaves it running (it shuts down
    only a Ray it started), so Ray starts once, not once a test. A test that needs Ray
    stopped may shut it down: the next test that asks for this fixture starts it again.
    Skips where Ray is not installed."""
    ray = _ray_for_this_process
    if not ray.is_initialized():
        # log_to_driver off: the driver's log thread prints Ray's worker and raylet lines to
        # whatever sys.stderr is at that moment, and in this shared process that is often an
        # in-process CLI test's captured stderr (a raylet's late "Connection reset by peer" once
        # failed a one-line-error check in tests/test_compare_errors.py)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return ray


@contextlib.contextmanager
def no_hang(seconds: int = 120) -> Iterator[None]:
    """Fail (instead of hanging the suite) if the block blocks, e.g. on a FIFO."""
    def alarm(*_: Any) -> None:
        raise AssertionError("blocked: the read hung")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


#: the capabilities by which root ignores permission bits: CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
_DAC_CAPABILITIES = (1, 2, 3)


def _drop_root_file_permissions() -> None:
    """In this process and every process it starts: root without the capabilities that let it
    ignore permission bits (capability bounding set, then the permitted and effective sets),
    so a file's mode binds root as it binds an ordinary user; still uid 0, so what root owns
    (the interpreter, the virtual environment) stays readable through the owner's bits."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in _DAC_CAPABILITIES:  # PR_CAPBSET_DROP: a program this process execs cannot regain them
        if libc.prctl(24, cap, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            if err == errno.EPERM:  # no CAP_SETPCAP (a restricted container): this process still drops them
                break
            raise OSError(err, f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(err)}")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3: two words
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    keep = ~sum(1 << cap for cap in _DAC_CAPABILITIES) & 0xFFFFFFFF
    for field in ("effective", "permitted", "inheritable"):
        setattr(data[0], field, getattr(data[0], field) & keep)
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def as_an_ordinary_user(body: Callable[[Path], None], tmp_path: Path, timeout: int = 300) -> None:
    """Run ``body(tmp_path)`` where permission bits bind, as they bind an ordinary user.

    Not root: in this process. Root (CI runs as root): root ignores permission bits, so a
    refused read or write can only be seen once it gives that power up, which it cannot
    take back: ``body`` runs in a forked child that drops it (:func:`_drop_root_file_permissions`,
    then checks that a mode-000 file is unreadable), and a failure there (its traceback)
    fails the test here; a child that hangs is killed after ``timeout`` seconds (SIGALRM)
    rather than hang the suite."""
    if os.geteuid() != 0:
        body(tmp_path)
        return
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(timeout)
            _drop_root_file_permissions()
            probe = tmp_path / ".mode-000-probe"
            probe.write_text("x")
            probe.chmod(0)
            try:
                probe.read_text()
            except PermissionError:
                pass
            else:
                raise AssertionError("root still reads a mode-000 file: the capabilities were not dropped")
            finally:
                probe.unlink()
            body(tmp_path)
        except BaseException:  # noqa: BLE001 - every failure, pytest's outcomes too, goes to the parent
            code = 1
            with contextlib.suppress(BaseException):
                os.write(write, traceback.format_exc().encode())
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        report = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise AssertionError(f"the child without root's file powers was killed by signal {os.WTERMSIG(status)}"
                             f" (a hang?)\n{report}")
    assert os.WEXITSTATUS(status) == 0, f"without root's power over permission bits:\n{report}"


def fifo(path: Path) -> None:
    """Make ``path`` a FIFO (a file whose read blocks forever: what a safe reader must refuse)."""
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def dev_zero(path: Path) -> None:
    """Make ``path`` a link to ``/dev/zero`` (an endless read: what a safe reader must refuse)."""
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")
