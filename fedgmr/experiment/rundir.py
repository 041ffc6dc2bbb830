"""The run directory as a unit: its layout, what a run owns in it, an exclusive lock,
durable writes that never go through a link, and bounded reads.

**Ownership.** A run writes and deletes only what it created. Before it creates anything
it records the names it may write in ``.fedgmr.manifest.json`` (:func:`claim`); a name that
already exists and is not in the manifest (a folder of yours called ``mlruns``, a file
``tensorboard``, your own ``config.yaml``) is refused with a one-line
:class:`~fedgmr.errors.RunDirError` instead of being replaced, and ``--overwrite`` or a
fresh start removes the manifest's entries only (:func:`remove_owned`). A run directory
written before the manifest existed is adopted: the files an older fedgmr wrote
(:data:`CORE_ENTRIES`) and the folders of the loggers its ``config.yaml`` names.

**Links and special files.** Every file a run opens for writing in its directory is
opened with ``O_NOFOLLOW`` and checked to be a regular file with one link
(:func:`open_for_write`); temporaries are created with ``O_EXCL``. A symbolic link, a
FIFO, a device or a hard-linked file at one of the run's names is refused, never
written through. Reading a run's files (:func:`read_run_file`) takes regular files only,
up to a size bound, without blocking on a FIFO.

**The lock.** While a run or a resume works on a directory, ``.fedgmr.lock`` is locked
with ``flock``: a second writer is refused (exit code 3) before it reads or writes
anything. The lock belongs to the open file, so it is released by the kernel when the
process dies, however it dies; the lock file itself stays (deleting it would let two
processes lock two different files of the same name).

Every problem with the directory (a file where a directory should be, no permission,
a full disk, a locked or damaged run, a link) is a ``RunDirError`` whose message names
the path.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

import yaml

from fedgmr.errors import RunDirError
from fedgmr.safe_read import (_CLOEXEC, _NOFOLLOW, _NONBLOCK, SMALL_FILE_BYTES, _kind, _lstat,  # noqa: F401
                              read_run_file)

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "accuracy_density.png"
CHECKPOINT_DIR = "checkpoint"
LOCK_FILE = ".fedgmr.lock"
#: the names a run owns in its directory (JSON: ``{"format": 1, "entries": [...]}``)
MANIFEST_FILE = ".fedgmr.manifest.json"
MANIFEST_FORMAT = 1


def tmp_name(name: str) -> str:
    """The temporary of an atomic write of ``name`` (:func:`write_atomic`)."""
    return f".{name}.tmp"


#: what every simulator run writes: results, the checkpoint, and the temporaries of atomic writes
CORE_ENTRIES: tuple[str, ...] = (
    CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, PLOT_FILE, CHECKPOINT_DIR,
    f".{CHECKPOINT_DIR}.tmp", f".{CHECKPOINT_DIR}.old",
    tmp_name(CONFIG_FILE), tmp_name(SUMMARY_FILE), tmp_name(PLOT_FILE),
)
#: the trackers' names (fedgmr.experiment.loggers): a run claims those of its loggers only
LOGGER_DIRS: dict[str, tuple[str, ...]] = {"tensorboard": ("tensorboard",), "mlflow": ("mlruns",),
                                           "wandb": ("wandb",)}
LOGGER_STATE: tuple[str, ...] = ("loggers.json", ".loggers.json.tmp")
#: every name fedgmr's own writers may use in a run directory (a run claims the subset it
#: writes; ``--overwrite`` removes only what the directory's manifest lists)
RUN_ENTRIES: tuple[str, ...] = (*CORE_ENTRIES, *LOGGER_STATE, *(n for d in LOGGER_DIRS.values() for n in d))
#: entries that only a run writes: their presence makes a directory a fedgmr run directory
RUN_MARKERS: tuple[str, ...] = (METRICS_FILE, SUMMARY_FILE, CHECKPOINT_DIR, f".{CHECKPOINT_DIR}.old")
#: the largest run-directory file read whole (metrics.jsonl); JSON and YAML files: SMALL_FILE_BYTES
MAX_FILE_BYTES = 1 << 30



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


def _refuse_write(path: Path, what: str) -> RunDirError:
    return RunDirError(f"{path} is {what}: fedgmr writes only regular files it created in a run directory and "
                       f"never through a link; remove it or choose another directory")


def refuse_link(path: str | Path) -> None:
    """``RunDirError`` when ``path`` is a symbolic link (a name a run writes must not be one)."""
    st = _lstat(Path(path))
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise _refuse_write(Path(path), "a symbolic link")


def open_for_write(path: str | Path, flags: int, exclusive: bool = False) -> int:
    """Open a file of the run directory for writing, never through a link: a file
    descriptor (``flags``: ``os.O_WRONLY`` / ``O_RDWR`` plus e.g. ``O_APPEND``, ``O_TRUNC``;
    the file is created when missing, and must be missing when ``exclusive``).

    A symbolic link, a FIFO, a device or a directory at ``path`` is refused, and so is a
    file with other hard links (writing it would change another path's file)."""
    path = Path(path)
    truncate = bool(flags & os.O_TRUNC)  # only once the file is known to be one the run may write
    flags = (flags & ~os.O_TRUNC) | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC | (os.O_EXCL if exclusive else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        st = _lstat(path)
        if st is not None and not stat.S_ISREG(st.st_mode) and exc.errno in (errno.ELOOP, errno.EEXIST, errno.ENXIO,
                                                                              errno.EISDIR, errno.EMLINK):
            raise _refuse_write(path, _kind(st.st_mode)) from None
        raise io_error(path, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse_write(path, _kind(st.st_mode))
        if st.st_nlink > 1:
            raise _refuse_write(path, f"a file with {st.st_nlink} hard links")
        if _NONBLOCK:
            import fcntl

            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
        if truncate:
            os.ftruncate(fd, 0)
    except OSError as exc:
        os.close(fd)
        raise io_error(path, exc) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_run_text(path: str | Path, limit: int = SMALL_FILE_BYTES) -> str:
    """:func:`read_run_file` as UTF-8 text (``RunDirError`` when it is not)."""
    try:
        return read_run_file(path, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise RunDirError(f"{path} is damaged: not UTF-8 text") from None


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


def create_new(path: str | Path) -> IO[bytes]:
    """A new file at ``path``, open for writing (``O_EXCL``, never through a link); a
    leftover regular file of an interrupted write is replaced, anything else refused."""
    path = Path(path)
    try:
        fd = open_for_write(path, os.O_WRONLY, exclusive=True)
    except RunDirError:
        st = _lstat(path)
        if st is None or not stat.S_ISREG(st.st_mode):
            raise
        with writing(path):
            path.unlink()  # a temporary a killed run left behind
        fd = open_for_write(path, os.O_WRONLY, exclusive=True)
    return os.fdopen(fd, "wb")


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write ``path`` through a temporary file (created new, never through a link), fsync
    it, rename it into place and fsync the directory: a reader sees the old content or the
    new, never a mix. The rename replaces a link at ``path`` itself, not its target."""
    path = Path(path)
    tmp = path.with_name(tmp_name(path.name))
    with writing(path):
        with create_new(tmp) as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fsync_file(fh)
        os.replace(tmp, path)
        fsync_dir(path.parent)


def remove_entry(path: str | Path) -> None:
    """Remove one entry without following links: a link or file is unlinked, a real
    directory removed with its content."""
    path = Path(path)
    st = _lstat(path)
    if st is None:
        return
    with writing(path):
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            path.unlink()


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
    return any(os.path.lexists(out / name) for name in RUN_MARKERS)


def holds_run(out: Path) -> bool:
    """Whether ``out`` holds results a new run would destroy."""
    metrics = out / METRICS_FILE
    st = _lstat(metrics)
    return ((st is not None and (not stat.S_ISREG(st.st_mode) or st.st_size > 0))
            or any(os.path.lexists(out / name) for name in (SUMMARY_FILE, CHECKPOINT_DIR, f".{CHECKPOINT_DIR}.old")))


def refuse_held_run(out: Path, hint: str) -> None:
    """The one refusal of every writer (simulator, sweep cell, Flower ServerApp) that
    starts a new run where results of another are."""
    if holds_run(out):
        raise RunDirError(f"{out} already holds a run; {hint}")


# ---------------------------------------------------------------------------- ownership
def _valid_name(name: Any) -> bool:
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\0" not in name)


def read_manifest(out: Path) -> set[str] | None:
    """The names the manifest of ``out`` lists (None when there is no manifest)."""
    path = out / MANIFEST_FILE
    try:
        raw = read_run_file(path, SMALL_FILE_BYTES, follow=False)
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RunDirError(f"{path} is damaged: not valid JSON; remove it only if nothing in {out} is a run's")
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(_valid_name(e) for e in entries):
        raise RunDirError(f"{path} is damaged: 'entries' must be a list of names in {out}")
    return set(entries)


def _legacy_loggers(out: Path) -> list[str]:
    """The loggers a run directory's ``config.yaml`` names (for a directory without a manifest)."""
    try:
        cfg = yaml.safe_load(read_run_text(out / CONFIG_FILE))
    except (OSError, RunDirError, yaml.YAMLError):
        return []
    run = cfg.get("run") if isinstance(cfg, dict) else None
    loggers = run.get("loggers") if isinstance(run, dict) else None
    names = [n for n in loggers if isinstance(n, str)] if isinstance(loggers, list) else []
    if "mlflow" in names and isinstance(run, dict) and run.get("mlflow_uri"):
        names.remove("mlflow")  # its store was elsewhere: no mlruns/ of the run's
    return names


def owned_entries(out: Path) -> set[str]:
    """What runs in ``out`` created: its manifest's names, or, in a run directory an older
    fedgmr wrote (no manifest), :data:`CORE_ENTRIES` and the folders of the loggers its
    ``config.yaml`` names. Nothing in a directory that is not a run's."""
    owned = read_manifest(out)
    if owned is not None:
        return owned
    if not is_run_dir(out):
        return set()
    owned = set(CORE_ENTRIES)
    loggers = _legacy_loggers(out)
    for name in loggers:
        owned.update(LOGGER_DIRS.get(name, ()))
    if loggers:
        owned.update(LOGGER_STATE)
    return owned


def write_manifest(out: Path, entries: Iterable[str]) -> None:
    write_atomic(out / MANIFEST_FILE, json.dumps({"format": MANIFEST_FORMAT, "entries": sorted(set(entries))},
                                                 indent=1) + "\n")


def claim(out: Path, names: Iterable[str], owned: set[str]) -> set[str]:
    """Record ``names`` as the run's in the manifest of ``out`` before anything is created
    under them; returns everything the directory's runs own now. A name that exists but
    is not owned (not fedgmr's, or not this run's) is refused, and so is a symbolic link
    at any name the run will write."""
    names = set(names)
    foreign = sorted(n for n in names - owned if os.path.lexists(out / n))
    if foreign:
        path = out / foreign[0]
        where = (f"{out} is not a fedgmr run directory" if not owned
                 else f"it is not a file of the fedgmr run in {out}")
        raise RunDirError(f"{path} exists but {where}; fedgmr will not overwrite it: move it or choose another "
                          f"--out")
    for name in sorted(names):
        refuse_link(out / name)
    owned = owned | names
    write_manifest(out, owned)
    return owned


def remove_owned(out: Path, owned: Iterable[str], keep: Iterable[str] = ()) -> None:
    """Remove what a previous run wrote into ``out``: the ``owned`` entries (but ``keep``),
    never anything else, and never through a link."""
    keep = set(keep) | {MANIFEST_FILE, LOCK_FILE}
    for name in sorted(set(owned) - keep):
        remove_entry(out / name)
    with writing(out):
        fsync_dir(out)


def begin_run(out: Path, names: Iterable[str], keep: Iterable[str] = ()) -> set[str]:
    """A new run in ``out``: claim ``names`` (refusing names that are not the directory's
    runs'), remove what earlier runs there owned (but ``keep``) and leave the manifest
    listing ``names`` and ``keep``. Call it holding the lock."""
    names, keep = set(names), set(keep)
    owned = owned_entries(out)
    owned = claim(out, names, owned)  # first: a crash below leaves nothing unlisted
    remove_owned(out, owned, keep)
    current = names | (keep & owned)
    write_manifest(out, current)
    return current


class RunLock:
    """An exclusive, non-blocking lock on a run directory (``flock`` on ``.fedgmr.lock``).

    Held by an open file: the kernel drops it when the process exits or is killed.
    Child processes forked while it is held (process-pool workers) share it until they
    exit; they are made to die with their parent (:mod:`fedgmr.sim.executors`).
    Where ``fcntl`` is missing (Windows), the directory is not locked and a warning
    says so. The lock file is opened without following links: a link there is refused.
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
        fh = os.fdopen(open_for_write(self.path, os.O_RDWR), "r+", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            owner = fh.read(64).strip()
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


def open_new_run(out: Path, names: Iterable[str], hint: str) -> RunLock:
    """The run-directory guard of a writer that starts a new run (the Flower ServerApp;
    ``fedgmr run`` and sweep cells go through the same steps in
    :func:`fedgmr.experiment.runner.run_experiment`): create ``out``, lock it (a second
    writer is refused), refuse a directory that holds a run (``hint``: what to do
    instead), claim ``names`` and remove what an unfinished start of a run left there.
    Returns the held lock: release it when the run ends."""
    prepare(out, must_exist=False)
    lock = RunLock(out)
    lock.acquire()
    try:
        refuse_held_run(out, hint)
        begin_run(out, names)
    except BaseException:
        lock.release()
        raise
    return lock
