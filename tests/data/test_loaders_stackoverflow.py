"""StackOverflow loader on tiny JSON and sqlite exports written here."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import torch

from fedgmr.data import load_dataset
from fedgmr.data.stackoverflow import BOS, EOS, OOV, PAD, parse_example_bytes
from fedgmr.errors import DatasetFormatError

TRAIN = {
    "u1": ["how do i sort a list", {"tokens": "sort a dict"}, "a a a"],
    "u2": [{"tokens": ["python", "list", "sort"]}],
    "u3": ["why", "why not"],
}
TEST = {"t1": ["sort a banana"], "t2": []}


@pytest.fixture()
def json_root(tmp_path: Path) -> Path:
    (tmp_path / "stackoverflow_train.json").write_text(json.dumps(TRAIN))
    (tmp_path / "stackoverflow_test.json").write_text(json.dumps(TEST))
    return tmp_path


def test_vocab_sequences_padding_and_users(json_root: Path) -> None:
    data = load_dataset("stackoverflow", root=str(json_root), vocab_size=4, seq_len=6)
    vocab = data.meta["vocab"]
    assert vocab[:4] == ["<pad>", "<oov>", "<bos>", "<eos>"]
    assert vocab[4:] == ["a", "sort", "list", "why"]  # by frequency, ties in order of appearance
    assert data.num_classes == 8 and data.task == "next_token" and data.pad_index == PAD == 0
    assert data.train.x.shape == (6, 5) and data.train.y.shape == (6, 5)
    ids = {w: i for i, w in enumerate(vocab)}
    # "how do i sort a list": bos how do i sort (cut at 6 tokens incl. bos)
    assert data.train.x[0].tolist() == [BOS, OOV, OOV, OOV, ids["sort"]]
    assert data.train.y[0].tolist() == [OOV, OOV, OOV, ids["sort"], ids["a"]]
    # "sort a dict": bos sort a dict eos pad
    assert data.train.x[1].tolist() == [BOS, ids["sort"], ids["a"], OOV, EOS]
    assert data.train.y[1].tolist() == [ids["sort"], ids["a"], OOV, EOS, PAD]
    assert torch.equal(data.train.x[:, 1:], data.train.y[:, :-1])
    assert [c.tolist() for c in data.natural_clients] == [[0, 1, 2], [3], [4, 5]]
    assert data.meta["users"] == ["u1", "u2", "u3"]
    assert data.test.x.shape == (1, 5)  # t2 has no examples
    assert data.test.x[0].tolist() == [BOS, ids["sort"], ids["a"], OOV, EOS]


def test_caps_and_user_subsets(json_root: Path) -> None:
    data = load_dataset("stackoverflow", root=str(json_root), max_samples_per_user=1, max_users=2, seed=3)
    assert len(data.natural_clients) == 2 and all(len(c) == 1 for c in data.natural_clients)
    assert data.train.x.shape[1] == 127  # default seq_len 128
    again = load_dataset("stackoverflow", root=str(json_root), max_samples_per_user=1, max_users=2, seed=3)
    assert again.meta["users"] == data.meta["users"]


def test_leaf_style_json_and_vocab_file(json_root: Path, tmp_path: Path) -> None:
    leaf = {"users": list(TRAIN), "user_data": {u: {"tokens": ex} for u, ex in TRAIN.items()}}
    (json_root / "stackoverflow_train.json").write_text(json.dumps(leaf))
    counts = tmp_path / "word_count.txt"
    counts.write_text("zebra 5\nwhy 9\n")
    data = load_dataset("stackoverflow", root=str(json_root), vocab_file=str(counts))
    assert data.meta["vocab"][4:] == ["why", "zebra"] and len(data.train) == 6


# --- a hand-written tf.train.Example encoder (protobuf wire format) for the sqlite export
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _example(tokens: str, score: int = 7) -> bytes:
    bytes_feature = _field(1, _field(1, tokens.encode()))  # Feature{bytes_list{value}}
    int_feature = _field(3, _field(1, _varint(score)))  # Feature{int64_list{packed value}}
    entries = [_field(1, b"tokens") + _field(2, bytes_feature), _field(1, b"score") + _field(2, int_feature),
               _field(1, b"title") + _field(2, _field(1, _field(1, b"a title")))]
    return _field(1, b"".join(_field(1, e) for e in entries))


def test_protobuf_reader() -> None:
    parsed = parse_example_bytes(_example("x y z"))
    assert parsed["tokens"] == [b"x y z"] and parsed["title"] == [b"a title"] and parsed["score"] == []


def test_sqlite_export(tmp_path: Path) -> None:
    db = tmp_path / "stackoverflow.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE examples (split_name TEXT, client_id TEXT, serialized_example_proto BLOB)")
    con.execute("CREATE TABLE client_metadata (client_id TEXT, split_name TEXT, num_examples INTEGER)")
    rows = [("train", "00b", "sort a list"), ("train", "00a", "a b"), ("train", "00b", "a"),
            ("test", "00c", "sort b"), ("heldout", "00d", "zzz")]
    con.executemany("INSERT INTO examples VALUES (?, ?, ?)", [(s, c, _example(t)) for s, c, t in rows])
    con.commit()
    con.close()
    data = load_dataset("stackoverflow", root=str(tmp_path), seq_len=5)
    assert data.meta["users"] == ["00a", "00b"]
    assert data.meta["vocab"][4] == "a"
    assert [c.tolist() for c in data.natural_clients] == [[0], [1, 2]]
    assert len(data.test) == 1
    direct = load_dataset("stackoverflow", root=str(db), seq_len=5, test_split="heldout", max_samples_per_user=1)
    assert [len(c) for c in direct.natural_clients] == [1, 1] and direct.test.x[0, 1].item() == OOV


@pytest.mark.parametrize("breakage, fragment", [
    ("no_files", "no StackOverflow files"),
    ("no_test", "missing"),
    ("bad_json", "cannot read"),
    ("not_mapping", "not a mapping"),
    ("bad_example", "user 'u1'"),
    ("bad_sqlite", "examples"),
])
def test_malformed_exports(tmp_path: Path, breakage: str, fragment: str) -> None:
    train, test = tmp_path / "stackoverflow_train.json", tmp_path / "stackoverflow_test.json"
    if breakage != "no_files":
        train.write_text(json.dumps(TRAIN))
    if breakage not in ("no_files", "no_test"):
        test.write_text(json.dumps(TEST))
    if breakage == "bad_json":
        train.write_text("{oops")
    elif breakage == "not_mapping":
        train.write_text("[1, 2]")
    elif breakage == "bad_example":
        train.write_text(json.dumps({"u1": [42]}))
    elif breakage == "bad_sqlite":
        train.unlink()
        test.unlink()
        sqlite3.connect(tmp_path / "stackoverflow.sqlite").execute("CREATE TABLE other (a TEXT)").connection.close()
    with pytest.raises(DatasetFormatError) as err:
        load_dataset("stackoverflow", root=str(tmp_path))
    assert fragment in str(err.value) and "stackoverflow_train.json" in str(err.value)
