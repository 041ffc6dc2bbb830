"""`fedgmr flower new-app`: the Flower app project written from the command line, its run
config checked by the ServerApp's own schema before anything is written."""

from __future__ import annotations

import tomllib
from pathlib import Path

from conftest import run_cli


def test_new_app_writes_the_project_with_a_typed_run_config(tmp_path: Path):
    (tmp_path / "fedgmr.yaml").write_text("method: fedgmr\nrun: {max_steps: 4}\n")
    proc = run_cli(["flower", "new-app", "app", "--config", "fedgmr.yaml", "--set", "num-server-steps=20",
                    "--set", "reply-timeout=45.5", "--set", "out-dir=out"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    project = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    assert project["tool"]["flwr"]["app"]["components"] == {"serverapp": "fedgmr.flower.server_app:app",
                                                             "clientapp": "fedgmr.flower.client_app:app"}
    assert project["tool"]["flwr"]["app"]["config"] == {
        "num-server-steps": 20, "reply-timeout": 45.5, "out-dir": "out",
        "config": str((tmp_path / "fedgmr.yaml").resolve())}


def test_new_app_refuses_bad_keys_values_and_an_existing_project(tmp_path: Path):
    (tmp_path / "endless.yaml").write_text("method: fedgmr\nrun: {executor: serial}\n")
    for args, line in ((["--set", "k=0"], "invalid run-config value for 'k'"),
                       (["--set", "bogus=1"], "unknown run-config key 'bogus'"),
                       (["--set", "k"], "--set expects key=value"),
                       (["--config", "missing.yaml"], "--config missing.yaml: no such file"),
                       # a config the apps could not build (no end): refused now, not at `flwr run`
                       (["--config", "endless.yaml"], "set max_steps or max_time")):
        proc = run_cli(["flower", "new-app", "app", *args], tmp_path)
        assert proc.returncode == 2 and line in proc.stderr, (args, proc.stderr)
        assert not (tmp_path / "app").exists()  # nothing written before the check
    assert run_cli(["flower", "new-app", "app"], tmp_path).returncode == 0
    before = (tmp_path / "app" / "pyproject.toml").read_text()
    again = run_cli(["flower", "new-app", "app", "--set", "k=2"], tmp_path)
    assert again.returncode == 2 and "exists: pass --overwrite" in again.stderr
    assert (tmp_path / "app" / "pyproject.toml").read_text() == before
    assert run_cli(["flower", "new-app", "app", "--set", "k=2", "--overwrite"], tmp_path).returncode == 0
    assert "k = 2" in (tmp_path / "app" / "pyproject.toml").read_text()
