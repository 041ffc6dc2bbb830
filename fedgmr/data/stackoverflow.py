"""StackOverflow next-word prediction from a user-split JSON export or TFF's sqlite file.

Accepted layouts (``root`` is a directory, or the ``.sqlite`` file itself):

* JSON: ``root/stackoverflow_train.json`` and ``root/stackoverflow_test.json``, each
  ``{user_id: [example, ...]}`` where an example is a string of space-separated tokens or
  ``{"tokens": "space separated text"}`` (``tokens`` may also be a list of strings). A
  LEAF-style ``{"users": [...], "user_data": {user_id: [...] or {"tokens": [...]}}}`` also works.
* sqlite: ``root/stackoverflow.sqlite`` as written by TensorFlow Federated (decompressed):
  table ``examples(split_name, client_id, serialized_example_proto)`` whose protos are
  ``tf.train.Example`` messages with a bytes feature ``tokens``. They are decoded here with
  a small protobuf wire-format reader; neither TensorFlow nor protobuf is needed.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from fedgmr.data.base import ArrayDataset, FederatedData
from fedgmr.data.registry import DATASETS
from fedgmr.errors import DatasetFormatError
from fedgmr.options import int_option, str_option

PAD, OOV, BOS, EOS = 0, 1, 2, 3
SPECIALS = ("<pad>", "<oov>", "<bos>", "<eos>")
_LAYOUT = (
    "expected either root/stackoverflow_train.json and root/stackoverflow_test.json, each mapping "
    "user id -> list of examples (a string of space-separated tokens or {'tokens': ...}), or the "
    "TensorFlow Federated sqlite file root/stackoverflow.sqlite with table examples(split_name, "
    "client_id, serialized_example_proto) holding tf.train.Example protos with a 'tokens' feature"
)

UserExamples = dict[str, list[list[str]]]


# --------------------------------------------------------------------------- protobuf wire format
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """Yield ``(field_number, wire_type, value)``; length-delimited values are bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("truncated length-delimited field")
            yield number, wire, buf[pos:pos + size]
            pos += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > len(buf):
                raise ValueError("truncated fixed-width field")
            yield number, wire, int.from_bytes(buf[pos:pos + width], "little")
            pos += width
        else:
            raise ValueError(f"unsupported wire type {wire}")


def parse_example_bytes(buf: bytes) -> dict[str, list[bytes]]:
    """The bytes features of a serialized ``tf.train.Example`` (other feature kinds skipped)."""
    out: dict[str, list[bytes]] = {}
    for number, wire, features in _fields(buf):
        if number != 1 or wire != 2:  # Example.features
            continue
        for fnum, fwire, entry in _fields(features):  # Features.feature map entries
            if fnum != 1 or fwire != 2:
                continue
            key, values = "", []
            for enum, ewire, item in _fields(entry):
                if enum == 1 and ewire == 2:
                    key = item.decode("utf-8")
                elif enum == 2 and ewire == 2:  # Feature
                    for knum, kwire, lst in _fields(item):
                        if knum == 1 and kwire == 2:  # BytesList
                            values += [v for n, w, v in _fields(lst) if n == 1 and w == 2]
            out[key] = values
    return out


# --------------------------------------------------------------------------- readers
def _tokens(example: object) -> list[str]:
    if isinstance(example, dict):
        example = example["tokens"]
    if isinstance(example, str):
        return example.split()
    if isinstance(example, list) and all(isinstance(t, str) for t in example):
        return example
    raise TypeError(f"an example must be a string, a list of strings or {{'tokens': ...}}, got {example!r:.80}")


def _read_json(path: Path) -> dict[str, list]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetFormatError(f"stackoverflow: cannot read {path} as json ({exc}); {_LAYOUT}") from None
    if isinstance(data, dict) and "user_data" in data and "users" in data:
        data = data["user_data"]
    if not isinstance(data, dict):
        raise DatasetFormatError(f"stackoverflow: {path} is not a mapping user -> examples; {_LAYOUT}")
    out: dict[str, list] = {}
    for user, examples in data.items():
        if isinstance(examples, dict) and "tokens" in examples:
            examples = examples["tokens"]
        if not isinstance(examples, list):
            raise DatasetFormatError(f"stackoverflow: {path}: user {user!r} has no example list; {_LAYOUT}")
        out[str(user)] = examples
    return out


def _choose(users: list[str], limit: int | None, rng: np.random.Generator) -> list[str]:
    if limit is None or limit >= len(users):
        return users
    picked = np.sort(rng.choice(len(users), size=limit, replace=False))
    return [users[i] for i in picked]


def _json_split(path: Path, limit: int | None, per_user: int, rng: np.random.Generator) -> UserExamples:
    data = _read_json(path)
    out: UserExamples = {}
    for user in _choose(list(data), limit, rng):
        try:
            out[user] = [_tokens(e) for e in data[user][:per_user]]
        except (KeyError, TypeError) as exc:
            raise DatasetFormatError(f"stackoverflow: {path}: user {user!r}: {exc}; {_LAYOUT}") from None
    return out


def _sqlite_split(path: Path, split: str, limit: int | None, per_user: int,
                  rng: np.random.Generator) -> UserExamples:
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise DatasetFormatError(f"stackoverflow: cannot open {path} ({exc}); {_LAYOUT}") from None
    try:
        columns = {row[1] for row in con.execute("PRAGMA table_info(examples)")}
        if not {"split_name", "client_id", "serialized_example_proto"} <= columns:
            raise DatasetFormatError(f"stackoverflow: {path} has no suitable 'examples' table; {_LAYOUT}")
        users = [r[0] for r in con.execute(
            "SELECT DISTINCT client_id FROM examples WHERE split_name = ? ORDER BY client_id", (split,))]
        if not users:
            raise DatasetFormatError(f"stackoverflow: {path} has no examples with split_name={split!r}")
        keep = [str(u) for u in _choose(users, limit, rng)]
        con.execute("CREATE TEMP TABLE keep_users (id TEXT PRIMARY KEY)")
        con.executemany("INSERT INTO keep_users VALUES (?)", [(u,) for u in keep])
        out: UserExamples = {u: [] for u in keep}
        rows = con.execute(
            "SELECT e.client_id, e.serialized_example_proto FROM examples e "
            "JOIN keep_users k ON e.client_id = k.id WHERE e.split_name = ? ORDER BY e.rowid", (split,))
        for user, proto in rows:
            bucket = out[str(user)]
            if len(bucket) >= per_user:
                continue
            try:
                tokens = parse_example_bytes(bytes(proto)).get("tokens", [b""])
                bucket.append(b" ".join(tokens).decode("utf-8").split())
            except (ValueError, UnicodeDecodeError) as exc:
                raise DatasetFormatError(
                    f"stackoverflow: {path}: malformed tf.train.Example for user {user!r} ({exc}); {_LAYOUT}"
                ) from None
        return out
    except sqlite3.Error as exc:
        raise DatasetFormatError(f"stackoverflow: cannot query {path} ({exc}); {_LAYOUT}") from None
    finally:
        con.close()


# --------------------------------------------------------------------------- vocabulary and tensors
def build_vocab(users: UserExamples, vocab_size: int) -> list[str]:
    """Special tokens, then the ``vocab_size`` most frequent words (ties: first seen first)."""
    counts: Counter[str] = Counter()
    for examples in users.values():
        for tokens in examples:
            counts.update(tokens)
    for special in SPECIALS:
        counts.pop(special, None)
    return list(SPECIALS) + [w for w, _ in counts.most_common(vocab_size)]


def _read_vocab_file(path: Path, vocab_size: int) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        pairs = [(ln.split()[0], int(ln.split()[1])) for ln in lines if ln.strip()]
    except (OSError, UnicodeDecodeError, IndexError, ValueError) as exc:
        raise DatasetFormatError(
            f"stackoverflow: cannot read word counts from {path} ({exc}); expected 'word count' per line"
        ) from None
    pairs.sort(key=lambda p: -p[1])
    words = [w for w, _ in pairs if w not in SPECIALS]
    return list(SPECIALS) + words[:vocab_size]


def encode(users: UserExamples, vocab: list[str], seq_len: int) -> tuple[ArrayDataset, list[np.ndarray]]:
    """``[bos] + ids + [eos]`` cut/padded to ``seq_len``; x = seq[:-1], y = seq[1:]."""
    index = {w: i for i, w in enumerate(vocab)}
    rows: list[list[int]] = []
    natural: list[np.ndarray] = []
    for examples in users.values():
        start = len(rows)
        for tokens in examples:
            ids = [BOS] + [index.get(t, OOV) for t in tokens] + [EOS]
            ids = ids[:seq_len]
            rows.append(ids + [PAD] * (seq_len - len(ids)))
        natural.append(np.arange(start, len(rows), dtype=np.int64))
    seqs = torch.from_numpy(np.asarray(rows, dtype=np.int64).reshape(-1, seq_len))
    return ArrayDataset(seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()), natural


def _locate(root: Path) -> tuple[str, Path | tuple[Path, Path]]:
    if root.is_file() and root.suffix in (".sqlite", ".db", ".sqlite3"):
        return "sqlite", root
    if root.is_dir():
        train, test = root / "stackoverflow_train.json", root / "stackoverflow_test.json"
        if train.is_file() and test.is_file():
            return "json", (train, test)
        if (root / "stackoverflow.sqlite").is_file():
            return "sqlite", root / "stackoverflow.sqlite"
        if train.is_file() or test.is_file():
            missing = test if train.is_file() else train
            raise DatasetFormatError(f"stackoverflow: missing {missing}; {_LAYOUT}")
    raise DatasetFormatError(f"stackoverflow: no StackOverflow files at {root}; {_LAYOUT}")


@DATASETS.register("stackoverflow")
def load_stackoverflow(root: str | None = None, vocab_size: int = 10_000, seq_len: int = 128,
                       max_samples_per_user: int = 50, max_users: int | None = None,
                       max_test_users: int | None = None, seed: int = 0, vocab_file: str | None = None,
                       train_split: str = "train", test_split: str = "test") -> FederatedData:
    """StackOverflow next-word prediction, one natural client per user.

    Parameters
    ----------
    root: directory with the JSON pair or ``stackoverflow.sqlite``, or the sqlite file.
    vocab_size: most frequent training words kept (paper: 10,000); four special tokens
        (pad=0, oov=1, bos=2, eos=3) come first, so ``num_classes = vocab_size + 4``.
    seq_len: tokens per sequence incl. bos/eos (paper: 128); inputs and targets have
        ``seq_len - 1`` positions and are padded with ``pad`` (ignored by the loss).
    max_samples_per_user: first examples kept per user (paper: 50).
    max_users, max_test_users: random subsets of training / test users drawn with ``seed``
        (paper: 6,000 and 1,500); ``None`` keeps all.
    vocab_file: optional TFF ``stackoverflow.word_count`` file ('word count' per line)
        used instead of counting words in the kept training users.
    train_split, test_split: ``split_name`` values in the sqlite file ('heldout' also exists).
    """
    vocab_size = int_option("data.options.vocab_size", vocab_size)
    seq_len = int_option("data.options.seq_len", seq_len, minimum=2)
    max_samples_per_user = int_option("data.options.max_samples_per_user", max_samples_per_user)
    max_users = int_option("data.options.max_users", max_users, optional=True)
    max_test_users = int_option("data.options.max_test_users", max_test_users, optional=True)
    seed = int_option("data.options.seed", seed, minimum=0)
    vocab_file = str_option("data.options.vocab_file", vocab_file, optional=True)
    train_split = str_option("data.options.train_split", train_split)
    test_split = str_option("data.options.test_split", test_split)
    if root is None:
        raise DatasetFormatError(f"stackoverflow needs data.root; {_LAYOUT}")
    rng = np.random.default_rng(seed)
    kind, where = _locate(Path(root))
    if kind == "json":
        train_path, test_path = where  # type: ignore[misc]
        train_users = _json_split(train_path, max_users, max_samples_per_user, rng)
        test_users = _json_split(test_path, max_test_users, max_samples_per_user, rng)
    else:
        train_users = _sqlite_split(where, train_split, max_users, max_samples_per_user, rng)  # type: ignore[arg-type]
        test_users = _sqlite_split(where, test_split, max_test_users, max_samples_per_user, rng)  # type: ignore[arg-type]
    # a user without examples cannot train: dropped, so no natural client is empty
    train_users = {u: ex for u, ex in train_users.items() if ex}
    if not train_users:
        raise DatasetFormatError(f"stackoverflow: no training examples under {root}; {_LAYOUT}")
    if not any(test_users.values()):
        raise DatasetFormatError(f"stackoverflow: no test examples under {root}; {_LAYOUT}")
    if vocab_file is not None:
        vocab = _read_vocab_file(Path(vocab_file), vocab_size)
    else:
        vocab = build_vocab(train_users, vocab_size)
    train, natural = encode(train_users, vocab, seq_len)
    test, _ = encode(test_users, vocab, seq_len)
    return FederatedData(name="stackoverflow", train=train, test=test, num_classes=len(vocab),
                         task="next_token", natural_clients=natural, pad_index=PAD,
                         meta={"vocab": vocab, "specials": dict(zip(SPECIALS, range(4))),
                               "users": list(train_users)})
