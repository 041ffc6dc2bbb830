"""The `fedgmr` commands shown in README.md and docs/ parse and resolve as written.

Listing commands (`methods`, `presets`, `config ...`) run exactly as written; a `sweep`
runs with `--dry-run` (its file is read and every cell resolved); a `table` runs exactly as
written on small run directories made where it names them. A `run`
command is checked by resolving the same preset/file and `--set` overrides with
`fedgmr config` (a full run of a preset takes minutes); placeholders such as
`/path/to/...` and `runs/...` directories that need an earlier run are skipped.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _commands() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        in_block = False
        for line in doc.read_text().splitlines():
            if line.startswith("```"):
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


@pytest.mark.parametrize("where,cmd", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_parses_and_resolves(where: str, cmd: str, tmp_path: Path):
    args = shlex.split(cmd)[1:]
    if any("/path/to" in a or "$" in a or "[" in a and "=" not in a for a in args):
        pytest.skip("placeholder, shell variable or optional-argument syntax")
    sub = args[0]
    if sub in ("methods", "presets", "config"):
        check = args
    elif sub == "sweep":  # every cell resolves; nothing runs
        check = args + ([] if "--dry-run" in args else ["--dry-run"])
    elif sub == "table":  # exactly as written, on small run directories made where it names them
        for d in _positional(args[1:]):
            _fake_runs(tmp_path / d)
        proc = subprocess.run([sys.executable, "-m", "fedgmr", *args], capture_output=True, text=True, env=ENV,
                              cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, f"{where}\n{proc.stderr}"
        assert "mean ± sample std (ddof = 1) across seeds" in proc.stdout and "2 seeds per cell" in proc.stdout
        return
    elif sub == "run" and "--resume" not in args and not (args[1].endswith((".yaml", ".toml"))
                                                          and not (REPO / args[1]).exists()):
        sets = [a for i, a in enumerate(args) if i > 0 and args[i - 1] in ("--set", "-s")]
        check = ["config", args[1], *[x for s in sets for x in ("--set", s)]]
    else:
        pytest.skip(f"'{sub}' needs earlier run directories")
    proc = subprocess.run([sys.executable, "-m", "fedgmr", *check], capture_output=True, text=True, env=ENV,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, f"{where}\n{proc.stderr}"
    if sub == "config":
        assert "method:" in proc.stdout


def _positional(args: list[str]) -> list[str]:
    """The arguments that are not options or option values."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a.startswith("-"):
            skip = True
        else:
            out.append(a)
    return out


def _fake_runs(root: Path) -> None:
    """Two seeds of one FedGMR experiment (named after the directory), evaluated every
    10 s up to 3,000 s."""
    import json

    import yaml

    for seed in (0, 1):
        d = root / f"seed={seed}"
        d.mkdir(parents=True)
        cfg = {"name": root.name, "method": "fedgmr", "seed": seed, "clients": {"heterogeneity": "high"},
               "submodel": {"layer_costs": None}, "run": {"eval_interval": 10.0}}
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
        rows = [{"time": float(t), "accuracy": 0.5 + 0.1 * seed, "bytes_up": 0.0, "bytes_down": 0.0}
                for t in range(0, 3001, 10)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "summary.json").write_text(json.dumps({"method": "fedgmr"}))
