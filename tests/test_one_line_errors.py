"""The smaller hostile inputs of issue 42 (items 7, 8 and 10): each is one line with the
project's exit code (fedgmr/errors.py) or the project's own exception, never a traceback,
a silent clamp or a command that ends having done nothing. In-process (typer's CliRunner
or direct calls)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import yaml
from typer.testing import CliRunner

from conftest import tiny_config
from fedgmr.cli import app
from fedgmr.config import parse_config
from fedgmr.data import DATASETS, load_dataset
from fedgmr.errors import ConfigError, DatasetFormatError, InvalidUpdateError, PluginError
from fedgmr.methods import resolve_config


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def _one_line(text: str) -> bool:
    return len(text.strip().splitlines()) == 1 and text.startswith("error:") and "Traceback" not in text


# ------------------------------------------------------------------ item 7: uncaught errors
@pytest.fixture
def broken_loader():
    @DATASETS.register("broken_for_test", replace=True)
    def load(root=None, size=3):
        raise RuntimeError("my loader has a bug\nsecond line")

    yield "broken_for_test"
    DATASETS.unregister("broken_for_test")


def test_a_registered_loader_that_raises_is_one_data_error(broken_loader, tmp_path):
    with pytest.raises(DatasetFormatError, match="data set 'broken_for_test': its loader raised RuntimeError: my "
                                                 "loader has a bug$") as err:
        load_dataset(broken_loader)
    assert isinstance(err.value.__cause__, RuntimeError)  # the loader's traceback stays reachable
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(data={"name": broken_loader, "partition": "iid"})))
    code, out = _cli("run", str(cfg), "--out", str(tmp_path / "r"), "-q")
    assert code == 4 and _one_line(out) and "its loader raised RuntimeError" in out


@pytest.mark.parametrize("device", ["cuda:99999999999999999999", "cuda:128"])
def test_a_device_index_torch_cannot_hold_is_refused_by_the_config(device):
    with pytest.raises(ConfigError, match=r"'run.device': device index \d+ is out of range: torch numbers devices "
                                          r"0 to 127"):
        parse_config(tiny_config(run={"max_steps": 3, "device": device}))
    assert parse_config(tiny_config(run={"max_steps": 3, "device": "cuda:127"})).run.device == "cuda:127"


def test_flower_commands_for_a_missing_or_incomplete_folder_is_one_line(tmp_path):
    code, out = _cli("flower", "commands", str(tmp_path / "missing"))
    assert code == 2 and _one_line(out) and "does not exist" in out and "flower-superlink" not in out
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "ca.crt").write_text("x")
    code, out = _cli("flower", "commands", str(tmp_path / "keys"), "--nodes", "2")
    assert code == 2 and _one_line(out) and "lacks server.pem, node-0.pub, node-1.pub" in out


def test_flower_superexec_with_a_missing_or_empty_secret_file_is_one_line(tmp_path):
    pytest.importorskip("flwr")
    code, out = _cli("flower", "superexec", "--superexec-auth-secret-file", str(tmp_path / "missing"))
    assert code == 2 and _one_line(out) and "cannot read --superexec-auth-secret-file" in out
    (tmp_path / "empty").write_text("\n")
    code, out = _cli("flower", "superexec", "--superexec-auth-secret-file", str(tmp_path / "empty"))
    assert code == 2 and _one_line(out) and "is empty" in out


# ------------------------------------------------------------------ item 8: silent clamps and endings
def test_k_above_the_clients_is_refused_not_cut_down():
    raw = tiny_config(clients={"num_clients": 4}, coordination={"mode": "semi_async", "trigger": "k", "k": 5})
    with pytest.raises(ConfigError, match=r"coordination.k 5 is more than the 4 clients \(clients.num_clients\)"):
        resolve_config(raw)
    raw["clients"]["concurrency"] = 3
    raw["coordination"]["k"] = 4
    with pytest.raises(ConfigError, match=r"coordination.k 4 is more than the 3 clients training at once"):
        resolve_config(raw)
    raw["coordination"]["k"] = 3
    assert resolve_config(raw).coordination.k == 3
    # the deadline trigger does not count replies: k is not used there and not checked
    assert resolve_config(tiny_config(clients={"num_clients": 2}, coordination={"trigger": "deadline", "k": 5}))


def test_concurrency_above_the_clients_is_refused():
    with pytest.raises(ConfigError, match=r"clients.concurrency 20 is more than the 10 clients"):
        resolve_config(tiny_config(clients={"num_clients": 10, "concurrency": 20}))
    assert resolve_config(tiny_config(clients={"num_clients": 10, "concurrency": 10})).clients.concurrency == 10


@pytest.mark.parametrize("flag", ["--out", "--resume"])
def test_an_empty_out_or_resume_is_refused_not_the_current_directory(flag, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["run", "quickstart", "--out", "", "-q"] if flag == "--out" else ["run", "--resume", "", "-q"]
    code, out = _cli(*args)
    assert code == 2 and _one_line(out) and f"{flag} is empty" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code_", [0, 3, None, "bye"])
def test_a_plugin_that_exits_at_import_is_a_plugin_error(tmp_path, code_):
    plugin = tmp_path / f"exits_{abs(hash(repr(code_)))}.py"
    plugin.write_text(f"import sys\nsys.exit({code_!r})\n")
    from fedgmr.plugins import import_code

    with pytest.raises(PluginError, match=r"called sys.exit\("):
        import_code(str(plugin))
    code, out = _cli("methods", "--import", str(plugin))
    assert code == 6 and _one_line(out)  # not 0 (nothing done) nor 3 (the run-directory code)
    assert plugin.stem not in sys.modules


@pytest.mark.parametrize("uri", [":::not a uri", "http://", "", " file:/x"])
def test_a_junk_mlflow_uri_is_refused(uri):
    with pytest.raises(ConfigError, match="'run.mlflow_uri': must be an MLflow tracking URI"):
        parse_config(tiny_config(run={"max_steps": 3, "mlflow_uri": uri}))


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "file:///tmp/mlruns", "sqlite:///mlflow.db", "databricks",
                                 "runs/mlruns"])
def test_a_tracking_uri_or_folder_is_accepted(uri):
    assert parse_config(tiny_config(run={"max_steps": 3, "mlflow_uri": uri})).run.mlflow_uri == uri


# ------------------------------------------------------------------ item 10: the Python API
@pytest.mark.parametrize("payload", ["x" * 100, None, 5, 1.5, ["a"]])
def test_decode_sparse_of_a_non_bytes_payload_is_an_invalid_update(payload):
    from fedgmr.algorithm.encoding import decode_sparse

    with pytest.raises(InvalidUpdateError, match="payload must be bytes"):
        decode_sparse(payload)  # type: ignore[arg-type]


def _strategy():
    from fedgmr.algorithm.aggregation import RULES
    from fedgmr.algorithm.params import ParamSpace, get_buffers
    from fedgmr.algorithm.policies import MagnitudePolicy
    from fedgmr.algorithm.restoration import DensityLadder
    from fedgmr.algorithm.staleness import Polynomial
    from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    space = ParamSpace(model)
    ladder = [0.25, 0.5, 1.0]
    policy = MagnitudePolicy(space, ladder, space.flatten(model), basis="prunable")
    return MaskedBufferedStrategy(space, space.flatten(model), get_buffers(model), policy,
                                  DensityLadder.from_densities(ladder, [1.0, 0.5]), RULES.get("ma"), Polynomial(0.6))


def test_receive_refuses_a_boolean_client_id_and_an_empty_reported_mask():
    from fedgmr.strategy.messages import Reply

    st = _strategy()
    a = st.assign(1)
    values = torch.full((int(a.mask.sum()),), 0.5)
    assert not st.receive(Reply(True, a.version, values, 10, {}, a.consumes))  # True is not client 1
    empty = torch.zeros_like(a.mask)
    assert not st.receive(Reply(1, a.version, torch.zeros(0), 10, {}, a.consumes, mask=empty))
    assert st.rejected == 2 and st.arrivals == []
    assert st.receive(Reply(1, a.version, values, 10, {}, a.consumes))  # the honest reply still counts
    assert st.arrivals == [1]


def test_load_dataset_with_an_unknown_option_names_it():
    with pytest.raises(ConfigError, match=r"unknown option 'foo' for dataset 'digits' in 'data.options' "
                                          r"\(accepted: "):
        load_dataset("digits", foo=1)
    with pytest.raises(ConfigError, match="unknown dataset 'nope'"):
        load_dataset("nope")
