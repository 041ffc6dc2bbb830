"""`fedgmr data clients`: what each client of a config holds, exactly as a run of it draws it."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import run_cli, tiny_config
from fedgmr.data.client_summary import client_csv, format_client_table, summarise_clients
from fedgmr.data.partition import Partition


def _partition(clients: list[list[int]], val: list[list[int]] | None = None) -> Partition:
    arr = [np.asarray(c, dtype=np.int64) for c in clients]
    return Partition(arr, [np.asarray(v, dtype=np.int64) for v in (val or [[] for _ in clients])],
                     np.zeros(0, dtype=np.int64))


def test_counts_shares_and_their_order_are_exact():
    labels = np.array([0, 0, 1, 2, 2, 2, 1, 3])
    s = summarise_clients(labels, _partition([[0, 1, 2, 6], [3, 4, 5, 7]], [[7], []]), num_classes=5)
    assert [c.samples for c in s] == [4, 4] and [c.val_samples for c in s] == [1, 0]
    assert s[0].label_counts.tolist() == [2, 2, 0, 0, 0] and s[1].label_counts.tolist() == [0, 0, 3, 1, 0]
    assert s[0].label_shares() == [(0, 0.5), (1, 0.5)]  # a tie: the lower class first
    assert s[1].label_shares() == [(2, 0.75), (3, 0.25)]  # classes it lacks are left out
    assert s[1].labels_at_least(0.25) == 2 and s[1].labels_at_least(0.3) == 1


def test_the_markdown_and_csv_forms_print_those_counts():
    labels = np.array([0, 0, 1, 2, 2, 2, 1, 3])
    s = summarise_clients(labels, _partition([[0, 1, 2, 6], [3, 4, 5, 7]]), num_classes=4)
    assert format_client_table(s, [1.0, 0.05], top=1, threshold=0.3) == (
        "| client | start density | samples | val | labels ≥ 30 % | largest label shares (class: share, top 1) |\n"
        "|---|---|---|---|---|---|\n"
        "| 0 | 1 | 4 | 0 | 2 | 0: 50 % |\n"
        "| 1 | 0.05 | 4 | 0 | 1 | 2: 75 % |\n")
    rows = list(csv.reader(io.StringIO(client_csv(s))))
    assert rows == [["client", "samples", "val_samples", "test_samples", "label_0", "label_1", "label_2", "label_3"],
                    ["0", "4", "0", "0", "2", "2", "0", "0"], ["1", "4", "0", "0", "0", "0", "3", "1"]]


def test_sequence_targets_give_sample_counts_only():
    s = summarise_clients(np.zeros((6, 5), dtype=np.int64), _partition([[0, 1], [2, 3, 4, 5]]))
    assert [c.samples for c in s] == [2, 4] and all(c.label_counts is None for c in s)
    assert format_client_table(s).splitlines()[2] == "| 0 | 2 | 0 |"


def test_a_label_outside_the_classes_is_refused():
    with pytest.raises(ValueError, match="outside the 2 classes"):
        summarise_clients(np.array([0, 1, 2]), _partition([[0, 1, 2]]), num_classes=2)


def _csv_counts(text: str) -> tuple[np.ndarray, list[float]]:
    rows = list(csv.DictReader(io.StringIO(text)))
    counts = np.array([[int(r[f"label_{c}"]) for c in range(10)] for r in rows])
    return counts, [float(r["start_density"]) for r in rows]


def test_the_cli_shows_the_partition_a_run_of_the_config_trains_on(tmp_path: Path):
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    raw = tiny_config(data={"name": "digits", "partition": "dirichlet", "alpha": 0.1}, seed=3)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = run_cli(["data", "clients", str(path), "--format", "csv"], tmp_path)
    assert out.returncode == 0, out.stderr
    counts, densities = _csv_counts(out.stdout)
    exp = build_experiment(resolve_config(raw))
    try:  # the run's own client shards, class by class
        y = exp.data.train.y.numpy()
        trained = np.array([np.bincount(y[idx], minlength=10) for idx in exp.partition.clients])
        assert np.array_equal(counts, trained)
        assert densities == [1.0, 0.5, 0.2, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05]  # High heterogeneity's tiers
    finally:
        exp.executor.close()
    # the seed decides the partition: another seed, other counts; the same seed, the same table
    other = run_cli(["data", "clients", str(path), "--format", "csv", "--set", "seed=4"], tmp_path)
    assert not np.array_equal(_csv_counts(other.stdout)[0], counts)
    assert run_cli(["data", "clients", str(path), "--format", "csv"], tmp_path).stdout == out.stdout


def test_the_cli_table_names_the_skew_it_shows(tmp_path: Path):
    skewed = run_cli(["data", "clients", "quickstart", "--set", "data.alpha=0.05", "--top", "1"], tmp_path)
    iid = run_cli(["data", "clients", "quickstart", "--set", "data.partition=iid", "--top", "1"], tmp_path)
    assert skewed.returncode == 0 and iid.returncode == 0, skewed.stderr + iid.stderr
    assert skewed.stdout.startswith("digits, seed 0: 10 clients, Dirichlet(α = 0.05) over labels; ")
    assert iid.stdout.startswith("digits, seed 0: 10 clients, IID; ")

    def largest(text: str) -> list[int]:  # each client's largest label share, in %
        return [int(line.split("|")[6].split(": ")[1].rstrip(" %")) for line in text.splitlines()
                if line.startswith("| ") and line[2].isdigit()]

    assert len(largest(iid.stdout)) == 10 and max(largest(iid.stdout)) < 25
    assert min(largest(skewed.stdout)) > max(largest(iid.stdout))  # under α = 0.05 each client leans to a class


@pytest.mark.parametrize("args,code,message", [
    (["--format", "json"], 2, "--format must be markdown or csv"),
    (["--set", "data.partitoin=iid"], 2, "partitoin"),
])
def test_bad_options_are_one_line_errors(tmp_path: Path, args: list[str], code: int, message: str):
    out = run_cli(["data", "clients", "quickstart", *args], tmp_path)
    assert out.returncode == code and message in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_the_output_docs_data_md_shows_is_what_the_command_prints(tmp_path: Path):
    doc = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text(encoding="utf-8")
    start = doc.index("digits, seed 0: 10 clients, Dirichlet(α = 0.1)")  # the output block under the commands
    shown = doc[start:doc.index("```", start)]
    lines = [line for line in shown.splitlines() if line and line != "..."]
    out = run_cli(["data", "clients", "quickstart", "--set", "data.alpha=0.1"], tmp_path)
    assert out.returncode == 0 and len(lines) == 5, (out.stderr, lines)
    assert all(line in out.stdout.splitlines() for line in lines), out.stdout
