"""The files fedgmr writes for `flwr run`, read back by Flower 1.42's own parsers: the app's
pyproject (its dependencies, no warnings) and the SuperLink connections (no deprecated
``options`` table; a simulation's settings go to ``flwr run --federation-config``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install 'fedgmr[flower]'")

from fedgmr.flower.project import federation_config_args, write_app, write_flower_config  # noqa: E402


def test_the_app_depends_on_fedgmr_flower_and_flower_accepts_it(tmp_path: Path) -> None:
    from flwr.cli.config_utils import load_and_validate

    app = write_app(tmp_path / "app", {"config": "/abs/fedgmr.yaml", "num-server-steps": 3, "t-star": 60.0})
    config, warnings = load_and_validate(app / "pyproject.toml")
    assert warnings == []
    assert config["project"]["dependencies"] == ["fedgmr[flower]"]
    assert config["tool"]["flwr"]["app"]["components"]["serverapp"] == "fedgmr.flower.server_app:app"
    assert config["tool"]["flwr"]["app"]["config"] == {"config": "/abs/fedgmr.yaml", "num-server-steps": 3,
                                                      "t-star": 60.0}


def test_connections_have_no_options_table_and_settings_go_to_flwr_run(tmp_path: Path, monkeypatch) -> None:
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.run.run import _parse_federation_config_overrides

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    write_flower_config(tmp_path / "home", {"sim": {"address": "127.0.0.1:9093", "insecure": True}})
    conn = read_superlink_connection("sim")
    assert (conn.address, conn.insecure, conn.options) == ("127.0.0.1:9093", True, None)
    sim = _parse_federation_config_overrides(federation_config_args({"num-supernodes": 7, "verbose": True})[1:], conn)
    assert (sim.num_supernodes, sim.verbose) == (7, True)
    with pytest.raises(ValueError, match="federation_config_args"):
        write_flower_config(tmp_path / "other", {"sim": {"address": "x:1", "options": {"num-supernodes": 2}}})
    assert federation_config_args({}) == []
