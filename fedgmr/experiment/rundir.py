"""The run directory as a unit: its layout, an exclusive lock, durable writes.

A run directory holds only what one run wrote (see :data:`RUN_ENTRIES`). While a run
or a resume works on it, ``.fedgmr.lock`` is locked with ``flock``: a second writer is
refused with :class:`~fedgmr.errors.RunDirError` (exit code 3) before it reads or
writes anything. The lock belongs to the open file, so it is released by the kernel
when the process dies, however it dies; the lock file itself stays (deleting it would
let two processes lock two different files of the same name).

Every problem with the directory (a file where a directory should be, no permission,
a full disk, a locked or damaged run) is a ``RunDirError`` whose message names the path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import IO, Any, Iterator

import yaml

from fedgmr.errors import RunDirError

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "accuracy_density.png"
CHECKPOINT_DIR = "checkpoint"
LOCK_FILE = ".fedgmr.lock"

#: everything fedgmr writes into a run directory (``--overwrite`` removes these, and
#: nothing else): results, the checkpoint, and the temporaries of atomic writes
RUN_ENTRIES: tuple[str, ...] = (
    CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, PLOT_FILE, CHECKPOINT_DIR,
    f".{CHECKPOINT_DIR}.tmp", f".{CHECKPOINT_DIR}.old",
    f".{CONFIG_FILE}.tmp", f".{SUMMARY_FILE}.tmp",
    # the trackers' files (fedgmr.experiment.loggers.LOGGER_ENTRIES)
    "loggers.json", ".loggers.json.tmp", "tensorboard", "mlruns", "wandb",
)
#: entries that only a run writes: their presence makes a directory a fedgmr run directory
RUN_MARKERS: tuple[str, ...] = (METRICS_FILE, SUMMARY_FILE, CHECKPOINT_DIR, f".{CHECKPOINT_DIR}.old")


def io_error(path: str | Path, exc: OSError) -> RunDirError:
    """One line naming ``path`` for an OS error (no permission, disk full, ...)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return RunDirError(f"cannot write the run directory at {path}: {reason}")


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Turn an ``OSError`` raised inside the block into a one-line ``RunDirError``."""
    try:
        yield
    except OSError as exc:
        raise io_error(exc.filename or path, exc) from None


def fsync_dir(path: str | Path) -> None:
    """Make renames and new entries in directory ``path`` durable (POSIX only)."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(fh: IO[Any]) -> None:
    """Flush ``fh`` and push its data to the disk."""
    fh.flush()
    os.fsync(fh.fileno())


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write ``path`` through a temporary file, fsync it, rename it into place and
    fsync the directory: a reader sees the old content or the new, never a mix."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path):
        with open(tmp, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fsync_file(fh)
        os.replace(tmp, path)
        fsync_dir(path.parent)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def config_digest(config: Any) -> str:
    """sha256 of a config's values (a resolved ``ExperimentConfig`` or the dict read from
    a ``config.yaml``). Formatting and comments do not count; every value does."""
    if hasattr(config, "model_dump"):
        from fedgmr.config import dump_config

        config = yaml.safe_load(dump_config(config))
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return sha256_bytes(text.encode("utf-8"))


def prepare(out: Path, must_exist: bool) -> bool:
    """Check that ``out`` can be a run directory and create it; True if created here."""
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out} is a file, not a run directory")
    if must_exist:
        if not out.is_dir():
            raise RunDirError(f"{out} does not exist: nothing to resume")
        return False
    if out.is_dir():
        return False
    try:
        out.mkdir(parents=True)
    except FileExistsError:  # created meanwhile by someone else: the lock decides
        if not out.is_dir():
            raise RunDirError(f"{out} is a file, not a run directory") from None
        return False
    except OSError as exc:
        raise io_error(out, exc) from None
    return True


def is_run_dir(out: Path) -> bool:
    """Whether fedgmr has run in ``out`` (it holds a metrics file, summary or checkpoint)."""
    return any((out / name).exists() for name in RUN_MARKERS)


def holds_run(out: Path) -> bool:
    """Whether ``out`` holds results a new run would destroy."""
    metrics = out / METRICS_FILE
    return ((metrics.exists() and metrics.stat().st_size > 0) or (out / SUMMARY_FILE).exists()
            or (out / CHECKPOINT_DIR).exists() or (out / f".{CHECKPOINT_DIR}.old").exists())


def clear(out: Path) -> None:
    """Remove what a previous run wrote into ``out`` (only :data:`RUN_ENTRIES`)."""
    with writing(out):
        for name in RUN_ENTRIES:
            path = out / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        fsync_dir(out)


class RunLock:
    """An exclusive, non-blocking lock on a run directory (``flock`` on ``.fedgmr.lock``).

    Held by an open file: the kernel drops it when the process exits or is killed.
    Child processes forked while it is held (process-pool workers) share it until they
    exit; they are made to die with their parent (:mod:`fedgmr.sim.executors`).
    Where ``fcntl`` is missing (Windows), the directory is not locked and a warning
    says so.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            log.warning("run directory locking needs fcntl (POSIX): %s is not locked; do not run two fedgmr "
                        "processes on it at once", self.path.parent)
            return
        try:
            fh = open(self.path, "a+", encoding="utf-8")
        except OSError as exc:
            raise io_error(self.path, exc) from None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            owner = fh.read().strip()
            fh.close()
            who = f" (process {owner})" if owner.isdigit() else ""
            raise RunDirError(f"{self.path.parent} is in use by another fedgmr run{who}; wait for it to end "
                              f"or use another directory") from None
        except OSError as exc:
            fh.close()
            raise io_error(self.path, exc) from None
        with writing(self.path):
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is None:
            return
        import fcntl

        try:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
        finally:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
