"""Shakespeare loader: tiny gzip plays written here, plus the real texts when present."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from fedgmr.data import load_dataset
from fedgmr.data.shakespeare import PAD, UNK, VOCAB_SIZE, decode_ids, encode_text, parse_play, read_roles, windows
from fedgmr.errors import DatasetFormatError

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "shakespeare"

ABBREVIATED = """THE TRAGEDY OF TESTING

by William Shakespeare


PERSONS REPRESENTED.

Hamlet, Prince of Denmark.
Horatio, his friend.

SCENE. Elsinore.


ACT I.

Scene I. A platform.

[Enter Horatio, Hamlet and Oswald.]

Hor.
Who's there?

Osw.
I will, madam.

Ham.
Nay, answer me: stand,
  and unfold yourself.

[Exit Horatio.]

Hor. [Within.] Farewell.

Ham.
Alone. [Aside.] At last.

[Exit.]

Peace, break thee off.

Ham. and Hor.
Together now.

Osw. Ay, madam.
"""

CAPITALS = """A PLAY IN CAPITALS

Persons Represented.

THESEUS, Duke of Athens.

SCENE: Athens.

ACT I.

SCENE I. A room.

THESEUS
Now, fair Hippolyta,
our nuptial hour.

FIRST FAIRY.
Over hill, over dale.

CHORUS.

O for a Muse of fire.

SCENE II. Elsewhere.

Westminster Abbey.

[Dead March.]

THESEUS. Go, Philostrate.
"""

POEM = """THE SONNETS

I

From fairest creatures we desire increase,
"""


def _gz(path: Path, text: str) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(text)


@pytest.fixture()
def plays(tmp_path: Path) -> Path:
    _gz(tmp_path / "testing_gut.txt.gz", ABBREVIATED)
    (tmp_path / "capitals_gut.txt").write_text(CAPITALS)
    _gz(tmp_path / "sonnets_gut.txt.gz", POEM)
    (tmp_path / "COPYING.txt").write_text("Licence.\n\nHam.\nnot a speech\n")
    (tmp_path / "metadata.txt").write_text("[x]\nurl = nowhere\n")
    return tmp_path


def test_speeches_in_abbreviated_style() -> None:
    roles = {r.name: r.text for r in parse_play(ABBREVIATED, "testing")}
    assert roles == {
        "HOR": "Who's there? Farewell.",
        "OSW": "I will, madam. Ay, madam.",
        "HAM": "Nay, answer me: stand, and unfold yourself. Alone. At last. Peace, break thee off.",
        "HAM. AND HOR": "Together now.",
    }


def test_speeches_in_capitals_style() -> None:
    roles = {r.name: r.text for r in parse_play(CAPITALS, "capitals")}
    assert roles == {
        "THESEUS": "Now, fair Hippolyta, our nuptial hour. Go, Philostrate.",
        "FIRST FAIRY": "Over hill, over dale.",
        "CHORUS": "O for a Muse of fire.",
    }
    assert parse_play(POEM, "sonnets") == []


def test_read_roles_order_and_files(plays: Path) -> None:
    roles = read_roles(plays)
    assert [(r.play, r.name) for r in roles] == [
        ("capitals_gut", "THESEUS"), ("capitals_gut", "FIRST FAIRY"), ("capitals_gut", "CHORUS"),
        ("testing_gut", "HOR"), ("testing_gut", "OSW"), ("testing_gut", "HAM"),
        ("testing_gut", "HAM. AND HOR"),
    ]


def test_char_vocabulary() -> None:
    ids = encode_text("Az ~\x07")
    assert ids.tolist()[:4] == [2 + ord("A") - 32, 2 + ord("z") - 32, 2, 2 + ord("~") - 32]
    assert ids[-1] == UNK and VOCAB_SIZE == 97
    assert decode_ids(np.array([2 + ord("H") - 32, 2 + ord("i") - 32, PAD])) == "Hi"


def test_windows_shift_stride_and_padding() -> None:
    ids = np.arange(2, 12)  # 10 characters
    x, y = windows(ids, seq_len=4, stride=4)
    assert x.tolist() == [[2, 3, 4, 5], [6, 7, 8, 9], [10, 0, 0, 0]]
    assert y.tolist() == [[3, 4, 5, 6], [7, 8, 9, 10], [11, 0, 0, 0]]
    x, y = windows(ids, seq_len=4, stride=2)
    assert x[:, 0].tolist() == [2, 4, 6, 8]
    x, y = windows(ids[:3], seq_len=4, stride=4)
    assert x.tolist() == [[2, 3, 0, 0]] and y.tolist() == [[3, 4, 0, 0]]
    assert windows(ids[:1], 4, 4)[0].shape == (0, 4)


def test_loader_on_tiny_plays(plays: Path) -> None:
    data = load_dataset("shakespeare", root=str(plays), seq_len=8, test_fraction=0.25)
    assert data.task == "next_token" and data.pad_index == 0 and data.num_classes == VOCAB_SIZE
    assert data.train.x.shape[1:] == (8,) and data.train.y.shape == data.train.x.shape
    assert data.train.x.dtype == torch.long
    assert len(data.natural_clients) == 7
    assert sum(len(c) for c in data.natural_clients) == len(data.train)
    inside = data.train.x[:, 1:] != PAD  # y is x shifted by one wherever x is not padding
    assert torch.equal(data.train.x[:, 1:][inside], data.train.y[:, :-1][inside])
    assert torch.all(data.train.y[data.train.x == PAD] == PAD)
    theseus = "".join(decode_ids(data.train.x[i]) for i in data.natural_clients[0])
    assert theseus == "Now, fair Hippolyta, our nuptial hour. Go,"[:len(theseus)]
    assert 0.15 < len(data.test) / (len(data.train) + len(data.test)) < 0.45


def test_loader_options(plays: Path) -> None:
    small = load_dataset("shakespeare", root=str(plays), seq_len=4, stride=2, min_chars_per_client=25,
                         max_clients=2, max_samples_per_client=3)
    assert small.meta["clients"] == [("capitals_gut", "THESEUS"), ("testing_gut", "HAM")]
    assert [len(c) for c in small.natural_clients] == [3, 3]
    assert len(small.test) <= 2


@pytest.mark.parametrize("breakage, fragment", [
    ("missing", "not a directory"),
    ("empty", "no *.txt"),
    ("no_speech", "found no speeches"),
    ("corrupt_gzip", "cannot read"),
])
def test_broken_folders(tmp_path: Path, plays: Path, breakage: str, fragment: str) -> None:
    root = plays
    if breakage == "missing":
        root = tmp_path / "absent"
    elif breakage == "empty":
        root = tmp_path / "empty"
        root.mkdir()
    elif breakage == "no_speech":
        root = tmp_path / "poems"
        root.mkdir()
        _gz(root / "sonnets_gut.txt.gz", POEM)
    elif breakage == "corrupt_gzip":
        (plays / "testing_gut.txt.gz").write_bytes(b"\x1f\x8b\x08 truncated")
    with pytest.raises(DatasetFormatError) as err:
        load_dataset("shakespeare", root=str(root))
    assert fragment in str(err.value) and "speaker's name" in str(err.value)


@pytest.mark.data
def test_real_texts() -> None:
    if not REAL.is_dir():
        pytest.skip(f"real Shakespeare texts not found at {REAL} (../shared/data is absent in a fresh clone)")
    roles = read_roles(REAL)
    pairs = {(r.play, r.name): len(r.text) for r in roles}
    assert 1_200 <= len(pairs) <= 1_500
    assert 3_800_000 <= sum(pairs.values()) <= 4_600_000
    assert pairs[("hamlet_gut", "HAM")] > 50_000
    for key in [("macbeth_gut", "LADY MACBETH"), ("midsummer_nights_dream_gut", "PUCK"),
                ("henry_v_gut", "CHORUS"), ("romeo_and_juliet_gut", "NURSE")]:
        assert pairs[key] > 1_000, key
    assert not any(r.play.startswith(("sonnets", "rape_of_lucrece")) for r in roles)
    data = load_dataset("shakespeare", root=str(REAL), min_chars_per_client=1_000, max_clients=50)
    assert len(data.natural_clients) == 50 and data.train.x.shape[1] == 80
    assert int((data.train.x == UNK).sum()) == 0
