"""The Flower deployment's run config goes through a typed schema like a config file
(issue 42, item 4): every bad value is refused with one line naming the key, before the
ServerApp builds anything or touches the network, and the values it accepts are the
ones the run uses."""

from __future__ import annotations

import errno
import math
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

import pytest
import yaml

from conftest import as_an_ordinary_user, tiny_config
from fedgmr.config import parse_config, set_dotted
from fedgmr.errors import ConfigError
from fedgmr.flower.loop import DEFAULT_NORM_MULTIPLE, bound_influence
from fedgmr.flower.run_config import KEYS, parse_run_config

# the probe's cases (issue 42, item 4) and a few more of each kind
BAD = [
    ("max-update-norm", -1), ("max-samples", -1), ("update-norm-multiple", math.nan),
    ("update-norm-multiple", "nan"), ("num-server-steps", 0), ("num-server-steps", -3), ("max-wall", -5),
    ("k", 0), ("k", -1), ("eval-every", 0), ("reply-timeout", -1), ("reply-timeout", math.nan),
    ("step-timeout", math.inf), ("t-star", -1), ("seed", -2), ("min-nodes", 0), ("node-wait", -1),
    ("k", True), ("k", 2.5), ("num-server-steps", "ten"), ("max-wall", math.inf), ("quarantine-after", -1),
    ("quarantine-seconds", -5), ("eval-every", False), ("out-dir", "   "),
]


class NoLink:
    """Touching the link fails the test: a refusal must come before the network."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the link was used ({name}) before the run config was checked")


def _serve(run_config: dict[str, Any]) -> Any:
    pytest.importorskip("flwr")
    from fedgmr.flower.server_app import serve

    return serve(NoLink(), run_config)  # type: ignore[arg-type]


@pytest.mark.parametrize("key,value", BAD)
def test_each_bad_value_is_refused_in_one_line_naming_the_key_before_anything_is_written(key, value, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as err:
        _serve({key: value, **({} if key == "out-dir" else {"out-dir": str(out)})})
    msg = str(err.value)
    assert f"'{key}'" in msg and "\n" not in msg
    assert not out.exists()  # refused before the run directory was made


def test_an_unknown_key_is_refused_listing_the_known_ones():
    with pytest.raises(ConfigError, match="unknown run-config key 'max-udpate-norm'") as err:
        parse_run_config({"max-udpate-norm": 3})
    assert all(k in str(err.value) for k in ("max-update-norm", "num-server-steps", "quarantine-after"))
    assert set(KEYS) >= {"config", "seed", "num-server-steps", "k", "reply-timeout", "step-timeout", "max-wall",
                         "min-nodes", "node-wait", "eval-every", "out-dir", "t-star", "max-samples",
                         "max-update-norm", "update-norm-multiple", "quarantine-after", "quarantine-window",
                         "quarantine-seconds"}


# run-config keys with a config-file twin: a value one refuses, the other refuses too
TWINS = [
    ("num-server-steps", "run.max_steps", [0, -3, True, 1.5]),
    ("k", "coordination.k", [0, -1, True]),
    ("eval-every", "run.eval_every", [0, -2]),
    ("t-star", "run.t_star", [-1, 0, math.inf, math.nan]),
    ("seed", "seed", [-1, False]),
    ("max-samples", "aggregation.max_samples", [-1, 2.5]),
    ("max-update-norm", "aggregation.max_update_norm", [-1, math.nan, math.inf]),
    ("update-norm-multiple", "aggregation.update_norm_multiple", [-0.5, math.nan]),
]


@pytest.mark.parametrize("run_key,config_key,values", TWINS)
def test_a_key_and_its_config_file_twin_refuse_the_same_values(run_key, config_key, values):
    for value in values:
        with pytest.raises(ConfigError, match=f"'{run_key}'"):
            parse_run_config({run_key: value})
        raw = tiny_config(run={"max_steps": 5, "eval_interval": None, "eval_every": 1})
        set_dotted(raw, config_key, value)
        with pytest.raises(ConfigError, match=config_key.replace(".", r"\.")):
            parse_config(raw)


def test_accepted_values_are_typed_strings_included_and_empty_means_unset():
    rc = parse_run_config({"k": "3", "reply-timeout": "12.5", "num-server-steps": 4.0, "max-wall": "",
                           "out-dir": "", "seed": 7})
    assert (rc.k, rc.reply_timeout, rc.num_server_steps, rc.max_wall, rc.out_dir, rc.seed) == (3, 12.5, 4, None,
                                                                                               None, 7)
    assert isinstance(rc.k, int) and isinstance(rc.num_server_steps, int)
    empty = parse_run_config({})
    assert (empty.reply_timeout, empty.step_timeout, empty.node_wait, empty.quarantine_after) == (60.0, 30.0, 120.0, 3)


def _strategy(**kw: Any) -> SimpleNamespace:
    """A stand-in for a strategy whose influence bounds (``strategy.influence``) are itself."""
    s = SimpleNamespace(client_samples=[1], max_samples=None, max_update_norm=None, norm_multiple=None, **kw)
    s.influence = s
    return s


def test_influence_bounds_take_the_run_config_values_and_zero_turns_a_bound_off():
    s = _strategy()
    bound_influence(s, [30, 50], {})  # defaults: the largest partition, 3 x median
    assert (s.client_samples, s.max_samples, s.max_update_norm, s.norm_multiple) == (None, 50, None,
                                                                                     DEFAULT_NORM_MULTIPLE)
    s = _strategy()
    bound_influence(s, [30, 50], {"max-samples": 40, "max-update-norm": 2.5, "update-norm-multiple": 0})
    assert (s.max_samples, s.max_update_norm, s.norm_multiple) == (40, 2.5, None)
    s = _strategy(max_update_norm_cfg=None)
    bound_influence(s, [30, 50], {"max-update-norm": 0, "update-norm-multiple": 0})
    assert (s.max_update_norm, s.norm_multiple) == (None, None)  # both off, as documented
    with pytest.raises(ConfigError, match="'max-update-norm'"):  # the probe's negative factor
        bound_influence(_strategy(), [30, 50], {"max-update-norm": -1})


def test_an_out_dir_that_is_a_file_or_below_one_is_refused(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep")
    for out in (afile, afile / "run"):
        with pytest.raises(ConfigError, match="'out-dir'.*file, not a directory"):
            _serve({"out-dir": str(out)})
    assert afile.read_text() == "keep"


def test_an_out_dir_in_a_read_only_folder_is_refused(tmp_path):
    pytest.importorskip("flwr")

    def body(where: Path) -> None:  # as root (CI): in a child that dropped to an ordinary user
        ro = where / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            with pytest.raises(ConfigError, match="'out-dir'.*not writable"):
                _serve({"out-dir": str(ro / "run")})
        finally:
            ro.chmod(0o755)

    as_an_ordinary_user(body, tmp_path)


def test_an_out_dir_that_cannot_be_created_is_one_line(tmp_path, monkeypatch):
    """A read-only file system (where even root cannot write) fails the mkdir itself."""
    def read_only(self: Path, *a: Any, **kw: Any) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(ConfigError, match="'out-dir': cannot create .*Read-only file system"):
        _serve({"out-dir": str(tmp_path / "run")})


def _config_file(tmp_path: Path, **coordination: Any) -> str:
    path = tmp_path / "fedgmr.yaml"
    raw = tiny_config(clients={"num_clients": 4, "heterogeneity": "high"},
                      run={"max_steps": 6, "eval_interval": None, "eval_every": 2})
    raw["coordination"] = {**raw.get("coordination", {}), **coordination}
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_k_and_min_nodes_above_the_client_count_are_refused(tmp_path):
    cfg = _config_file(tmp_path, mode="semi_async", trigger="k", k=2)
    with pytest.raises(ConfigError, match=r"'k': 5 is more than the 4 clients"):
        _serve({"config": cfg, "k": 5})
    with pytest.raises(ConfigError, match=r"'min-nodes': 9 is more than the 4 clients"):
        _serve({"config": cfg, "min-nodes": 9})


@dataclass
class _Arrived:
    instruction_id: str
    node_id: int
    fields: dict[str, Any]
    error: str | None
    nbytes: int


class TrainingLink:
    """Four in-process nodes: each push trains at once through the real client handler."""

    def __init__(self, run_config: Mapping[str, Any]) -> None:
        self.run_config, self.replies = run_config, {}

    def wait_for_nodes(self, count: int, timeout: float) -> list[int]:
        return [1, 2, 3, 4]

    def push(self, node_id: int, fields: Mapping[str, Any], ttl: float, group: str) -> str:
        from fedgmr.flower.client import train_handler

        msg_id = uuid.uuid4().hex
        out = train_handler(fields, self.run_config, {"partition-id": node_id - 1}, node_id)
        self.replies[msg_id] = _Arrived(msg_id, node_id, out, None, 0)
        return msg_id

    def pull(self, ids: list[str]) -> list[_Arrived]:
        return [self.replies.pop(i) for i in ids if i in self.replies]


def test_the_run_uses_the_values_it_accepted(tmp_path):
    """num-server-steps, eval-every and k given as strings are the run's: 3 steps of 2
    replies each, evaluated at the start and after every step."""
    pytest.importorskip("flwr")
    from fedgmr.flower.server_app import serve

    run_config = {"config": _config_file(tmp_path, mode="semi_async", trigger="k", k=1), "num-server-steps": "3",
                  "eval-every": "1", "k": "2", "node-wait": 0, "reply-timeout": 600.0, "step-timeout": 600.0}
    result = serve(TrainingLink(run_config), run_config)  # type: ignore[arg-type]
    assert result["status"] == "completed" and result["steps"] == 3 and result["evaluations"] == 4
    assert result["uploads"] >= 6 and result["rejected_updates"] == 0
