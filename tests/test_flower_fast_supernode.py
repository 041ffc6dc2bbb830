"""The fast-polling SuperNode (fedgmr.flower.fast_supernode), without a deployment: the
sleeps of Flower's SuperNode loop are capped through a ``time`` of its own, its object
pulls back off at most the cap, and everything is put back afterwards - the ``time``
module, ``time.sleep`` and other modules never change. The loopback deployment test
(tests/distributed/test_flower_deployment.py) runs it against a real SuperLink."""

from __future__ import annotations

import time
import types

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install 'fedgmr[flower]'")

import flwr.supernode.start_client_internal as sic  # noqa: E402

from fedgmr.flower import fast_supernode as fs  # noqa: E402


def test_capped_time_caps_sleep_and_passes_everything_else_through():
    slept = []
    real = types.SimpleNamespace(sleep=slept.append, monotonic=lambda: 42.0, time=time.time)
    capped = fs.CappedTime(0.15, real)
    capped.sleep(3)
    capped.sleep(0.5)
    capped.sleep(0.05)
    assert slept == [0.15, 0.15, 0.05]
    assert capped.monotonic() == 42.0 and capped.time is time.time
    with pytest.raises(ValueError, match="positive"):
        fs.CappedTime(0)


def test_capped_sleeps_patch_only_flowers_module_and_restore_it():
    real_sleep = time.sleep
    before_time, before_pull = sic.time, sic.pull_objects
    assert before_time is time
    with fs.capped_sleeps(0.1) as capped:
        # what Flower's loop calls: its module-level `time.sleep(3)` now sleeps 0.1 s at most
        assert sic.time is capped and isinstance(sic.time, fs.CappedTime) and sic.time.cap == 0.1
        t0 = time.perf_counter()
        sic.time.sleep(3)
        assert time.perf_counter() - t0 < 2.5  # not the 3 s it asked for (generous: a busy machine)
        assert sic.pull_objects is not before_pull and sic.pull_objects.__wrapped_pull__ is before_pull
        # no global side effect: the time module and its sleep are the real ones everywhere else
        assert time.sleep is real_sleep and sic.time.sleep is not real_sleep
        import flwr.supercore.superexec.run_superexec as rs

        assert rs.time is time
    assert sic.time is before_time is time and sic.pull_objects is before_pull
    assert time.sleep is real_sleep


def test_capped_sleeps_restore_on_errors():
    before_time, before_pull = sic.time, sic.pull_objects
    with pytest.raises(SystemExit):
        with fs.capped_sleeps(0.2):
            raise SystemExit(0)  # as flwr_exit ends the SuperNode
    assert sic.time is before_time and sic.pull_objects is before_pull


def test_capped_backoff_starts_and_stays_at_the_cap_unless_told():
    calls = []

    def pull(ids, fn, *, max_time=7200, max_tries_per_object=500, initial_backoff=1, backoff_cap=10):
        calls.append((initial_backoff, backoff_cap, max_time, max_tries_per_object))
        return "pulled"

    capped = fs.capped_backoff(pull, 0.2)
    assert capped(["a"], None) == "pulled"
    assert capped(["a"], None, initial_backoff=0.5, max_tries_per_object=7) == "pulled"
    assert fs.capped_backoff(pull, 5)(["a"], None) == "pulled"  # a cap above Flower's start keeps its 1 s
    # 500 tries at 0.2 s would give up on a slow upload within 2 minutes: Flower's 2 h time bound stays alone
    assert calls == [(0.2, 0.2, 7200, None), (0.5, 0.2, 7200, 7), (1.0, 5, 7200, None)]


def test_capped_backoff_on_flowers_pull_objects_retries_sooner():
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError, pull_objects

    tries = []

    def pull_object(object_id):
        tries.append(time.perf_counter())
        if len(tries) < 3:
            raise ObjectUnavailableError(object_id)
        return b"content"

    t0 = time.perf_counter()
    assert fs.capped_backoff(pull_objects, 0.05)(["x"], pull_object) == {"x": b"content"}
    assert len(tries) == 3
    # Flower's own back-off would wait 1 s, then 2 s (3 s in all) before the third try
    assert time.perf_counter() - t0 < 2.5


def test_the_installed_flower_has_the_internals():
    assert fs.check_flower_internals() is sic


def test_a_flower_without_the_internals_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(sic, "time", None)
    with pytest.raises(RuntimeError, match="has no module-level `time`: the fast-polling SuperNode supports "
                        "Flower 1.42; use flower-supernode"):
        fs.check_flower_internals()
    monkeypatch.undo()

    def _push_messages(*args):  # a Flower whose reply wait no longer sleeps through `time`
        return None

    monkeypatch.setattr(sic, "_push_messages", _push_messages)
    with pytest.raises(RuntimeError, match="does not call time.sleep in _push_messages"):
        fs.check_flower_internals()


def test_cli_refuses_a_flower_without_the_internals(monkeypatch):
    from typer.testing import CliRunner

    from fedgmr.cli import app

    def missing():
        raise RuntimeError("the fast-polling SuperNode needs Flower 1.42's SuperNode internals (no module x)")

    monkeypatch.setattr(fs, "check_flower_internals", missing)
    res = CliRunner().invoke(app, ["flower", "supernode", "--", "--insecure"])
    assert res.exit_code == 2
    assert "error: the fast-polling SuperNode needs Flower 1.42's SuperNode internals" in res.output
    res = CliRunner().invoke(app, ["flower", "supernode", "--poll-interval", "0", "--", "--insecure"])
    assert res.exit_code == 2 and "--poll-interval must be positive" in res.output


def test_cli_runs_flowers_entry_point_with_the_arguments_and_the_cap(monkeypatch):
    from typer.testing import CliRunner

    import flwr.supernode.cli as flower_cli
    from fedgmr.cli import app

    seen = {}

    def fake_flower_supernode():
        import sys

        seen["argv"] = list(sys.argv)
        seen["cap"] = sic.time.cap
        seen["backoff"] = sic.pull_objects.__wrapped_pull__ is not None
        raise SystemExit(0)

    monkeypatch.setattr(flower_cli, "flower_supernode", fake_flower_supernode)
    res = CliRunner().invoke(app, ["flower", "supernode", "--poll-interval", "0.1", "--", "--insecure",
                                   "--superlink", "127.0.0.1:1", "--isolation", "process"])
    assert res.exit_code == 0, res.output
    assert seen == {"argv": ["flower-supernode", "--insecure", "--superlink", "127.0.0.1:1", "--isolation",
                             "process"], "cap": 0.1, "backoff": True}
    assert sic.time is time  # put back when the SuperNode ended


def test_the_serverapps_grid_pull_backoff_is_capped_until_the_link_closes(monkeypatch):
    import sys

    from fedgmr.errors import ConfigError
    from fedgmr.flower.adapter import GridLink
    from fedgmr.flower.run_config import parse_run_config

    calls = []

    def pull_objects(object_ids, pull_object_fn, *, max_tries_per_object=500, initial_backoff=1, backoff_cap=10):
        calls.append((initial_backoff, backoff_cap))
        return {}

    module = types.ModuleType("fake_http_grid")
    module.pull_objects = pull_objects
    grid_cls = type("HttpGrid", (), {"__module__": "fake_http_grid"})
    monkeypatch.setitem(sys.modules, "fake_http_grid", module)
    link = GridLink(grid_cls(), pull_workers=0)
    assert link.cap_pull_backoff(0.2)
    module.pull_objects(["x"], None)  # as HttpGrid.pull_messages calls it
    assert calls == [(0.2, 0.2)]
    link.close()
    assert module.pull_objects is pull_objects  # put back when the run ends
    # a grid whose module does not pull through pull_objects (the in-memory grid) is left alone
    plain = types.ModuleType("fake_inmemory_grid")
    monkeypatch.setitem(sys.modules, "fake_inmemory_grid", plain)
    assert not GridLink(type("InMemoryGrid", (), {"__module__": "fake_inmemory_grid"})(), pull_workers=0) \
        .cap_pull_backoff(0.2)
    assert parse_run_config({"pull-backoff": 0.25}).pull_backoff == 0.25
    assert parse_run_config({}).pull_backoff is None
    for bad in (0, -1, float("inf"), True):
        with pytest.raises(ConfigError, match="'pull-backoff'"):
            parse_run_config({"pull-backoff": bad})


def test_flowers_http_grid_pulls_through_its_module_pull_objects():
    from flwr.superlink.grid import http_grid

    from fedgmr.flower.fast_supernode import _uses

    assert callable(http_grid.pull_objects) and _uses(http_grid.HttpGrid.pull_messages.__code__, "pull_objects")


def test_warm_superexec_pull_backoff_is_checked_and_put_back(monkeypatch):
    import flwr.supernode.runtime.run_clientapp as rc

    from fedgmr.flower import warm_exec

    original = rc.pull_and_inflate_object_from_tree
    assert warm_exec.check_pull_internals() is rc
    seen = {}

    def fake_loop(**kwargs):
        seen["patched"] = rc.pull_and_inflate_object_from_tree.__wrapped_pull__ is original
        raise SystemExit(0)

    import flwr.supercore.superexec.run_superexec as rs

    monkeypatch.setattr(rs, "run_superexec", fake_loop)
    monkeypatch.setattr(rs, "get_executor", rs.get_executor)  # restored after the test
    monkeypatch.setattr(warm_exec, "warm_up", lambda *a, **k: None)
    monkeypatch.delenv(warm_exec.POLL_ENV, raising=False)
    with pytest.raises(SystemExit):
        warm_exec.run_warm_superexec("127.0.0.1:1", insecure=True, pull_backoff=0.2)
    assert seen == {"patched": True}
    assert rc.pull_and_inflate_object_from_tree is original


def test_nonpositive_intervals_are_refused_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from fedgmr.cli import app

    def one_line(res) -> bool:
        return (res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
                and res.output.startswith("error:") and "Traceback" not in res.output)

    res = CliRunner().invoke(app, ["flower", "superexec", "--insecure", "--pull-backoff", "0"])
    assert one_line(res) and "--pull-backoff must be positive" in res.output, res.output
    res = CliRunner().invoke(app, ["flower", "keys", str(tmp_path / "keys"), "--nodes", "1", "--fast-poll", "-1"])
    assert one_line(res) and "--fast-poll must be positive" in res.output, res.output
    assert not (tmp_path / "keys").exists()  # refused before any key was written
    res = CliRunner().invoke(app, ["flower", "supernode", "--poll-interval", "-0.5", "--", "--insecure"])
    assert one_line(res) and "--poll-interval must be positive" in res.output, res.output
