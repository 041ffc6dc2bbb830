"""The `fedgmr` commands shown in README.md and docs/ parse and resolve as written.

Listing commands (`methods`, `presets`, `config ...`) run exactly as written; a `sweep`
runs with `--dry-run` (its file is read and every cell resolved); a `table` or a `plot`
runs exactly as written on small run directories made where it names them, or on the
repository's own cells where it names `measured/...` (two seeds of
one experiment under each, or one run for `plot --levels` / `--clients` / `--classes` / `--coverage`). A `run`
command is checked by resolving the same preset/file and `--set` overrides with
`fedgmr config` (a full run of a preset takes minutes), with its `--import` modules;
`fedgmr --version` runs as written; an `evaluate` runs as written on a tiny finished run made where it names one; `fedgmr flower keys|commands` run exactly as written,
in order in one directory (the keys a `keys` line writes are there for the lines after
it); a `fedgmr flower superexec` or `fedgmr flower supernode` line (a server) is parsed with the command's own options. Placeholders such as `/path/to/...` and `runs/...` directories that need an earlier
run are skipped.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
# the tables over measured/ parse each kept cell once per test process, not once a table
pytestmark = pytest.mark.usefixtures("measured_read_once")


def _commands() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        in_block = False
        for line in doc.read_text().splitlines():
            if line.lstrip().startswith("```"):  # fences indented under a list item too
                in_block = line.strip() in ("```bash", "```sh", "```console") and not in_block
                continue
            text = line.strip().removeprefix("$ ")
            if in_block and text.startswith("fedgmr "):
                cmd = text.split(" #")[0].strip()
                for part in cmd.split(" | "):  # `fedgmr methods | fedgmr presets | ...`
                    found.append((f"{doc.relative_to(REPO)}: {part}", part.strip()))
    return found


COMMANDS = _commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 10


#: the documented commands that stay long when checked (whole runs): marked slow
SLOW = ("fedgmr demo",)


@pytest.mark.parametrize("where,cmd", [pytest.param(w, c, id=w, marks=[pytest.mark.slow] if c.startswith(SLOW) else [])
                                       for w, c in COMMANDS])
def test_documented_command_parses_and_resolves(where: str, cmd: str, tmp_path: Path):
    args = shlex.split(cmd)[1:]
    if any("/path/to" in a or "$" in a or re.match(r"\[(-|[A-Z])", a) for a in args):
        pytest.skip("placeholder, shell variable or optional-argument syntax ([--flag], [RUN...])")
    sub = args[0]
    if sub in ("methods", "presets", "config", "--version") or args[:2] == ["data", "list"]:
        check = args
    elif args[:2] == ["data", "fetch"]:  # as written, from a server on 127.0.0.1 serving ../shared/data
        _fetch_from_local_mirror(args, tmp_path)
        return
    elif args[:2] == ["data", "clients"]:  # as written, from the repository root (a kept cell's config reads
        # the real data set where the presets look: skipped where ../shared/data is absent)
        if args[2].startswith("measured/") and not (REPO.parent / "shared" / "data").is_dir():
            pytest.skip("a kept cell's config: its data set is not on this machine")
        out = _in_repo(args, where)
        assert out.startswith("client,start_density,samples,") if "csv" in args else "| client | start density" in out
        return
    elif sub == "sweep":  # every cell resolves; nothing runs
        check = args + ([] if "--dry-run" in args else ["--dry-run"])
    elif sub == "table":  # exactly as written, on small run directories made where it names them
        dirs = _positional(args[1:])
        if _reads_measured(args):
            out = _in_repo(args, where)
            assert ("per_seed" in out.splitlines()[0]) if args[-2:] == ["--format", "csv"] else \
                "mean ± sample std (ddof = 1) across seeds" in out, out
            return
        groups = _excluded(args)
        kept = _kept_overrides(groups)  # the documented runs, matching no --exclude/--drop group
        for i, d in enumerate(dirs):  # several directories: more seeds of one experiment
            _fake_runs(tmp_path / d, "docs" if len(dirs) > 1 else None, first_seed=2 * i, overrides=kept)
        for g, dropped in enumerate(groups):  # runs matching an --exclude or --drop group beside them:
            for d in dirs:                    # the table must leave them out
                _fake_runs(tmp_path / d / f"excluded-{g}", "docs", overrides=dropped)
        proc = run_cli(args, tmp_path)
        assert proc.returncode == 0, f"{where}\n{proc.stderr}"
        assert "mean ± sample std (ddof = 1) across seeds" in proc.stdout
        assert f"{2 * len(dirs)} seeds per cell" in proc.stdout
        for dropped in groups:
            assert dropped.get("method", "fedgmr") == "fedgmr" or f"| {dropped['method']} " not in proc.stdout
        return
    elif sub == "plot":  # exactly as written, on small run directories made where it names them
        if _reads_measured(args):  # drawn into tmp_path, not docs/img
            out = args.index("--out") + 1
            proc = run_cli([*args[:out], str(tmp_path / "p.png"), *args[out + 1:]], REPO)
            assert proc.returncode == 0, f"{where}\n{proc.stderr}"
            assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG", where
            return
        one_run = any(flag in args for flag in ("--levels", "--clients", "--classes", "--coverage"))
        for d in _positional(args[1:]):
            (_fake_run if one_run else _fake_runs)(tmp_path / d)
        proc = run_cli(args, tmp_path)
        assert proc.returncode == 0, f"{where}\n{proc.stderr}"
        png = tmp_path / args[args.index("--out") + 1]
        assert png.read_bytes()[:4] == b"\x89PNG", where
        return
    elif sub == "flower" and args[1] == "testbed":  # needs root and minutes: its line parses with the options
        import typer.main

        from fedgmr.cli import app

        command = typer.main.get_command(app)
        ctx = command.make_context("fedgmr", args[:2])
        params = command.get_command(ctx, "flower").get_command(ctx, "testbed").make_context(
            "testbed", args[2:]).params
        assert params["config"] and params["scale"] > 0, where
        return
    elif sub == "flower" and args[1] == "superexec":  # a server: its line parses with the command's options
        import typer.main

        from fedgmr.cli import app

        command = typer.main.get_command(app)
        ctx = command.make_context("fedgmr", args[:2])
        params = command.get_command(ctx, "flower").get_command(ctx, "superexec").make_context(
            "superexec", args[2:]).params
        assert params["runtime_api_address"], where
        return
    elif sub == "flower" and args[1] == "supernode":  # a server: its line parses with the command's options
        import typer.main

        from fedgmr.cli import app

        command = typer.main.get_command(app)
        ctx = command.make_context("fedgmr", args[:2])
        params = command.get_command(ctx, "flower").get_command(ctx, "supernode").make_context(
            "supernode", args[2:]).params
        assert params["poll_interval"] > 0 and "--superlink" in params["flower_args"], where
        return
    elif args[:2] == ["flower", "new-app"]:  # as written, in an empty directory (with the --config it names)
        if "--config" in args:
            (tmp_path / args[args.index("--config") + 1]).write_text("method: fedgmr\nrun: {max_steps: 4}\n")
        proc = run_cli(args, tmp_path)
        assert proc.returncode == 0, f"{where}\n{proc.stderr}"
        text = (tmp_path / args[2] / "pyproject.toml").read_text()
        assert 'serverapp = "fedgmr.flower.server_app:app"' in text, text
        for s in (a for i, a in enumerate(args) if args[i - 1] == "--set"):
            assert s.split("=")[0] + " = " in text, (s, text)
        return
    elif sub == "flower":  # exactly as written, after the doc's earlier `fedgmr flower` lines, in one directory
        doc = where.split(": ")[0]
        earlier = [c for w, c in COMMANDS if w.split(": ")[0] == doc and c.startswith("fedgmr flower ")
                   and not c.startswith(("fedgmr flower superexec", "fedgmr flower new-app",
                                         "fedgmr flower testbed", "fedgmr flower supernode"))]
        for c in earlier[: earlier.index(cmd) + 1]:
            proc = run_cli(shlex.split(c)[1:], tmp_path)
            assert proc.returncode == 0, f"{where}\n{c}\n{proc.stderr}"
        out = proc.stdout
        assert "flower-superlink " in out and "--enable-supernode-auth" in out and "flwr run " in out, out
        assert "PRIVATE KEY" not in out + proc.stderr
        if args[1] == "keys":
            folder = tmp_path / _positional(args[2:])[0]
            assert {"ca.crt", "server.pem", "server.key", "node-0.key", "node-0.pub"} <= {
                q.name for q in folder.iterdir()}, where
        return
    elif sub == "compare":  # exactly as written, on small run directories made where it names them
        import json

        for d in _positional(args[1:]):  # one run each; their summaries agree on t* = 400 s
            _fake_run(tmp_path / d)
            (tmp_path / d / "summary.json").write_text(json.dumps({"method": "fedgmr", "t_star": 400.0}))
        proc = run_cli(args, tmp_path)
        assert proc.returncode == 0, f"{where}\n{proc.stderr}"
        if "--json" in args:
            assert len(json.loads(proc.stdout)["runs"]) == len(_positional(args[1:])), where
        else:
            assert "MRI of" in proc.stdout and "Acc@t*" in proc.stdout, where
        if "--plot" in args:
            assert (tmp_path / args[args.index("--plot") + 1]).read_bytes()[:4] == b"\x89PNG", where
        return
    elif sub == "evaluate":  # exactly as written, on a tiny finished run made where it names one
        if "--saved" in args and _reads_measured(args):  # the evaluations kept in the cells
            out = _in_repo(args, where)
            assert "accuracy (%)" in out, out
            return
        from conftest import tiny_config
        from fedgmr.experiment.runner import run_experiment
        from fedgmr.methods import resolve_config

        for d in _positional(args[1:]):
            run_experiment(resolve_config(tiny_config(run={"max_steps": 6, "eval_every": 3})), tmp_path / d)
        if "--saved" in args:  # what an earlier `--save` kept, then the checkpoint gone
            saving = run_cli([a if a != "--saved" else "--save" for a in args], tmp_path)
            assert saving.returncode == 0, f"{where}\n{saving.stderr}"
            for d in _positional(args[1:]):
                shutil.rmtree(tmp_path / d / "checkpoint")
        proc = run_cli(args, tmp_path)
        assert proc.returncode == 0, f"{where}\n{proc.stderr}"
        if "--blind" in args:  # kept, not shown: each named run now holds its evaluation.json
            assert "saved the evaluation of" in proc.stdout and "accuracy" not in proc.stdout, proc.stdout
            assert all((tmp_path / d / "evaluation.json").is_file() for d in _positional(args[1:])), where
            return
        assert "accuracy (%)" in proc.stdout and "| yes" in proc.stdout, proc.stdout
        assert ("@0.5" in proc.stdout) == ("--no-levels" not in args), proc.stdout  # the level columns
        if "--classes" in args:  # one row per model: the full one, then each level's
            assert "Test accuracy per class (%)" in proc.stdout and "| full " in proc.stdout, proc.stdout
            assert ("| @0.5 " in proc.stdout) == ("--no-levels" not in args), proc.stdout
        return
    elif sub == "tiers":  # exactly as written, on a tiny fixed-time run made where it names one
        if _reads_measured(args):
            out = _in_repo(args, where)
            assert "uploads/step after" in out, out
            return
        from conftest import tiny_config
        from fedgmr.experiment.runner import run_experiment
        from fedgmr.methods import resolve_config

        for d in _positional(args[1:]):
            run_experiment(resolve_config(tiny_config(method="fedgmr_fixed_time", run={
                "max_steps": None, "max_time": 200.0, "eval_every": None, "eval_interval": 10.0})), tmp_path / d)
        proc = run_cli(args, tmp_path)
        assert proc.returncode == 0, f"{where}\n{proc.stderr}"
        assert "| 0.05x" in proc.stdout and "uploads/step after" in proc.stdout, proc.stdout
        return
    elif sub == "demo":  # as written, its three quickstart runs shortened to 60 virtual seconds; in this
        # process (conftest.run_cli: the command, without an interpreter and PyTorch start-up)
        out = tmp_path / "demo-out"
        proc = run_cli([*args, "--out", str(out), "-q", "--set", "run.max_time=60", "--set", "run.t_star=50"],
                       tmp_path)
        assert proc.returncode == 0, f"{where}\n{proc.stderr}"
        assert "MRI of fedgmr over fedavg, fedgmr_wo_gmr: " in proc.stdout and "n/a" not in proc.stdout, proc.stdout
        assert {p.name for p in out.iterdir()} >= {"fedgmr", "fedavg", "fedgmr_wo_gmr", "compare.png"}
        return
    elif sub == "masks":  # as written, from the repository root (a kept cell's config needs its data set)
        if any(a.startswith("measured/") for a in args) and not (REPO.parent / "shared" / "data").is_dir():
            pytest.skip("the kept cell's data set is not beside the repository")
        out = _in_repo(args, where)
        assert (out.startswith("level,layer,shape,kept,of,kept_pct\n") if "csv" in args
                else "| level   | layer" in out) and "(model)" in out, out
        return
    elif sub == "run" and "--resume" not in args and not (args[1].endswith((".yaml", ".toml"))
                                                          and not (REPO / args[1]).exists()):
        sets = [a for i, a in enumerate(args) if i > 0 and args[i - 1] in ("--set", "-s")]
        imports = [a for i, a in enumerate(args) if i > 0 and args[i - 1] == "--import"]
        check = ["config", args[1], *[x for s in sets for x in ("--set", s)],
                 *[x for m in imports for x in ("--import", m)]]
    else:
        pytest.skip(f"'{sub}' needs earlier run directories")
    if "--import" in check:  # your code goes into the registries: a process of its own
        proc = subprocess.run([sys.executable, "-m", "fedgmr", *check], capture_output=True, text=True, env=ENV,
                              cwd=REPO, timeout=300)
    else:
        proc = run_cli(check, REPO)
    assert proc.returncode == 0, f"{where}\n{proc.stderr}"
    if sub == "config":
        assert ("method:" in proc.stdout) if "--explain" not in args else \
            all(proc.stdout.count(k + ":") for k in (a for i, a in enumerate(args) if args[i - 1] == "--explain"))
    if sub == "--version":
        assert proc.stdout.startswith("fedgmr ")


def _fetch_from_local_mirror(args: list[str], tmp_path: Path) -> None:
    """Run a documented `fedgmr data fetch` as written, but with `--root` in tmp_path and
    `--mirror` a server on 127.0.0.1 serving the shared copies (skips where they are absent)."""
    from test_data_fetch import SHARED, _Server
    from typer.testing import CliRunner

    from fedgmr.cli import app
    from fedgmr.download import SOURCES

    names = _positional(args[2:])
    for name in names:
        if name not in SOURCES or name == "shakespeare" or not (SHARED / SOURCES[name].folder).is_dir():
            pytest.skip(f"no local copy of {name} to serve (tests/test_data_fetch.py covers the download)")
    options = [a for i, a in enumerate(args[2:], 2) if a not in names and a not in ("--root", "--mirror")
               and args[i - 1] not in ("--root", "--mirror")]
    for name in names:  # one mirror per data set: their files share names
        served = {p.name: p.read_bytes() for p in (SHARED / SOURCES[name].folder).glob("*.gz")}
        with _Server(served) as server:
            result = CliRunner().invoke(app, ["data", "fetch", name, *options, "--root", str(tmp_path),
                                              "--mirror", server.url])
        assert result.exit_code == 0, result.output


#: options that take no value
FLAGS = frozenset({"--json", "--dry-run", "--quiet", "-q", "--overwrite", "--bands", "--no-bands", "--levels",
                   "--clients", "--classes", "--coverage", "--no-levels",
                   "--save", "--saved"})


def _reads_measured(args: list[str]) -> bool:
    """The command reads only the cells kept in the repository (``measured/...``)."""
    return all(d.startswith("measured/") for d in _positional(args[1:]))


def _in_repo(args: list[str], where: str) -> str:
    """Run the command as written from the repository root; its stdout (a pasted table's output
    itself is compared by test_measured_tables)."""
    proc = run_cli(args, REPO)
    assert proc.returncode == 0, f"{where}\n{proc.stderr}"
    return proc.stdout


def _positional(args: list[str]) -> list[str]:
    """The arguments that are not options or option values."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a.startswith("-"):
            skip = a not in FLAGS
        else:
            out.append(a)
    return out


#: where `--exclude KEY=VALUE`'s (and `--drop`'s) short keys sit in a fake run's config
_FAKE_KEYS = {"method": ("method",), "heterogeneity": ("clients", "heterogeneity"),
              "partition": ("data", "partition")}


def _excluded(args: list[str]) -> list[dict[str, str]]:
    """A documented command's groups of left-out runs: its ``--exclude KEY=VALUE`` pairs
    together, then each ``--drop 'KEY=VALUE ...'`` (the first value of each key)."""
    def group(items: list[str]) -> dict[str, str]:
        return {key: values.split(",")[0] for key, _, values in (item.partition("=") for item in items)}

    excluded = group([args[i + 1] for i, a in enumerate(args[:-1]) if a == "--exclude"])
    drops = [group(args[i + 1].split()) for i, a in enumerate(args[:-1]) if a == "--drop"]
    return [g for g in (excluded, *drops) if g]


def _kept_overrides(groups: list[dict[str, str]]) -> dict[str, str]:
    """Overrides that give the fake runs a heterogeneity no left-out group matches (a
    documented ``--drop 'method=fedgmr heterogeneity=high'`` names the fakes' defaults)."""
    defaults = {"method": "fedgmr", "heterogeneity": "high", "partition": "dirichlet"}
    for kept in ({}, {"heterogeneity": "low"}, {"heterogeneity": "medium"}):
        run = {**defaults, **kept}
        if not any(all(run.get(k) == v for k, v in g.items()) for g in groups):
            return kept
    raise AssertionError(f"every fake heterogeneity is left out by {groups}")


def _fake_runs(root: Path, name: str | None = None, first_seed: int = 0,
               overrides: dict[str, str] | None = None) -> None:
    """Two seeds of one FedGMR experiment (named after the directory unless ``name``);
    ``overrides`` sets config keys by their short names (``method``, ``heterogeneity``)."""
    import json

    for seed in (first_seed, first_seed + 1):
        _fake_run(root / f"seed={seed}", name or root.name, seed, overrides)
    # as a sweep writes it: each cell's point on the grid (a table's `--rows case` reads it)
    # (a plain `case` axis, and the named case axes the docs' tables use)
    cells = [{"name": f"seed={s}", "point": {"case": "a", "tier": "a", "policy": "a", "seed": s}}
             for s in (first_seed, first_seed + 1)]
    (root / "sweep.json").write_text(json.dumps({"name": root.name, "cells": cells}))


def _fake_run(d: Path, name: str | None = None, seed: int = 0, overrides: dict[str, str] | None = None) -> None:
    """One FedGMR run evaluated every 10 s up to 3,000 s, with every key `fedgmr plot`
    reads (per-level and per-client accuracy every 100 s)."""
    import json

    import yaml

    d.mkdir(parents=True)
    cfg = {"name": name or d.name, "method": "fedgmr", "seed": seed, "clients": {"heterogeneity": "high"},
           "data": {"partition": "dirichlet", "alpha": 0.6}, "network": {"ims": True},  # keys the tables' --rows/--cols name
           "local": {"algorithm": "sgd", "stragglers": 0.0, "prox_mu": 0.01},
           "submodel": {"layer_costs": None}, "run": {"eval_interval": 10.0}}
    for key, value in (overrides or {}).items():
        *parents, leaf = _FAKE_KEYS[key]
        node = cfg
        for part in parents:
            node = node[part]
        node[leaf] = value
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = [{"time": float(t), "step": t // 10, "wall_time": t / 100, "accuracy": 0.5 + 0.1 * seed,
             "loss": 1.0, "avg_density": 0.5, "min_coverage": 2, "coverage_min": 1, "pruned_energy_mean": 0.5,
             "window_coverage_none": 0.2, "coverage_never": 0.1, "bytes_up": 1e4 * t, "bytes_down": 2e4 * t,
             **({"levels": [0.2, 1.0], "level_accuracy": [0.4, 0.5], "client_accuracy": [0.5, None, 0.7],
                 "class_accuracy": [0.3, None, 0.9], "predicted_share": [0.4, 0.0, 0.6], "coverage_hist": [5, 3, 2],
                 "personal_accuracy": 0.6, "personal_std": 0.1, "personal_worst10": 0.4, "cluster_purity": 0.75,
                 "personal_accuracies": [0.4, 0.6, 0.8]}
                if t % 100 == 0 else {})}
            for t in range(0, 3001, 10)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"method": "fedgmr"}))
