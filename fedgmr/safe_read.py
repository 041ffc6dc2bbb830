"""Reading a file without surprises: a regular file only (a FIFO, a device such as
``/dev/zero`` behind a link, a directory or a socket is a one-line error, never a hang),
at most a given number of bytes. A foundation module (it imports only
:mod:`fedgmr.errors`): the config reader and the run-directory code both use it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fedgmr.errors import RunDirError

#: the largest JSON/YAML file read whole by default
SMALL_FILE_BYTES = 64 << 20

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def read_run_file(path: str | Path, limit: int = SMALL_FILE_BYTES, prefix: bool = False,
                  follow: bool = True) -> bytes:
    """The bytes of a run-directory file: a regular file only (a FIFO, a device such as
    ``/dev/zero`` behind a link, a directory or a socket is a one-line ``RunDirError``,
    never a hang), at most ``limit`` bytes (more is refused; with ``prefix``, the first
    ``limit`` bytes are returned). ``follow=False`` refuses a symbolic link too.
    ``FileNotFoundError`` passes through for the caller to word."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow else _NOFOLLOW))
    except FileNotFoundError:
        raise
    except OSError as exc:
        st = _lstat(path)
        if st is not None and stat.S_ISLNK(st.st_mode) and not follow:
            raise RunDirError(f"{path} is a symbolic link: fedgmr does not read run-directory files of its own "
                              f"through links") from None
        raise RunDirError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RunDirError(f"cannot read {path}: it is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit and not prefix:
            raise RunDirError(f"cannot read {path}: {st.st_size:,} bytes, more than the {limit:,} a run-directory "
                              f"file may hold")
        chunks, size = [], 0
        while size <= limit:
            # no larger a buffer than the file needs (os.read allocates what it is asked for)
            chunk = os.read(fd, min(1 << 20, limit + 1 - size, max(st.st_size - size, 0) + 4096))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise RunDirError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        if not prefix:
            raise RunDirError(f"cannot read {path}: more than the {limit:,} bytes a run-directory file may hold")
        data = data[:limit]
    return data


__all__ = ["SMALL_FILE_BYTES", "read_run_file"]
