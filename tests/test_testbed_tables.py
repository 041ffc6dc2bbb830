"""The testbed tables of docs/distributed.md ("Measured again") re-print from the runs'
printed output kept in measured/testbed_v2/: every figure of the method rows and of the
per-tier ratio table is read from the logs here, and the rows must be in the page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "measured" / "testbed_v2"
PAGE = (REPO / "docs" / "distributed.md").read_text()
METHODS = {"fedgmr": "FedGMR", "fedasync": "FedAsync", "fedavg": "FedAvg"}


def _log(method: str) -> str:
    return (RUNS / f"{method}.log").read_text()


def _one(pattern: str, text: str) -> re.Match:
    found = re.search(pattern, text, re.M)
    assert found, pattern
    return found


@pytest.mark.parametrize("method", list(METHODS))
def test_the_method_row_re_prints_from_its_log(method: str):
    log = _log(method)
    dep = _one(r"^deployed: (\d+) steps in ([\d.]+) s wall, final accuracy ([\d.]+)%", log)
    sim = _one(r"^simulated: (\d+) steps in [\d.]+ s virtual, final accuracy ([\d.]+)%", log)
    app = _one(r"^simulated with the measured ClientApp time \(([\d.]+) s per message, median of \d+\): steps (\d+), "
               r"accuracy ([\d.]+)%", log)
    byt = _one(r"^simulated with the ClientApp time and ([\d,]+) bytes per message \(network.message_bytes, measured\): "
               r"steps (\d+), accuracy ([\d.]+)%, uploads per client \[([\d, ]+)\]", log)
    ups = _one(r"^uploads per client, deployed \(on the links\): \[([\d, ]+)\]", log)
    row = (f"| {METHODS[method]} | {dep[1]} / {dep[3]} % ({dep[2]} s) | {sim[1]} / {sim[2]} % | ({app[1]} s) {app[2]} / "
           f"{app[3]} % | ({byt[1]} B) {byt[2]} / {byt[3]} % | {ups[1]} | {byt[4]} |")
    assert row in PAGE, row


def test_the_per_tier_ratio_table_re_prints_from_the_logs():
    per_method = {}
    for method in METHODS:
        line = _one(r"^  measured/predicted with those bytes, median per tier/direction: (.*)$", _log(method))[1]
        per_method[method] = {(float(t), d): v for t, d, v in re.findall(r"([\d.]+) (down|up) ([\d.]+)", line)}
    for tier in (1.0, 0.5, 0.2, 0.1, 0.05):
        cells = [f"{per_method[m][(tier, 'down')]} / {per_method[m][(tier, 'up')]}" for m in METHODS]
        row = f"| {tier} | " + " | ".join(cells) + " |"
        assert row in PAGE, row


def test_each_run_left_no_namespace_behind():
    for method in METHODS:
        tail = _log(method).rstrip().splitlines()[-1]
        assert tail == "rc=0", (method, tail)  # `ip netns list`, run after each, printed nothing


#: the rerun with every transfer and message recorded and the latency fitted ("Measured with the records")
RUNS_V4 = REPO / "measured" / "testbed_v4"


def _comparison_table(log: str) -> str:
    """The Markdown comparison table a testbed run prints (four predictions beside the deployment)."""
    lines = log.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| | deployed |"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[first:end])


@pytest.mark.parametrize("run", [*METHODS, *(f"fast-{m}" for m in METHODS)])
def test_the_v4_comparison_tables_are_what_the_runs_printed(run: str):
    """Flower's own SuperNodes (``fedgmr``, ...) and the fast-polling ones (``fast-fedgmr``, ...)."""
    log = (RUNS_V4 / f"{run}.log").read_text()
    table = _comparison_table(log)
    assert table.count("\n") >= 14 and "(4) reported training time + bytes + latency per message" in table
    assert table in PAGE, f"{run}: the page's table is not what measured/testbed_v4/{run}.log printed"
    fit = _one(r"^per-message latency .*network\.message_latency = ([\d.]+) s", log)[1]
    assert f"/ {fit} |" in table  # the fitted latency is the one prediction (4) used
    assert ("--poll-interval 0.2" in log) == run.startswith("fast-")
