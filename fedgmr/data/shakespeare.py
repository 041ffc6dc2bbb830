"""Shakespeare next-character prediction, one natural client per (play, speaking role).

Reads the plays as plain Project Gutenberg texts (``*.txt`` or ``*.txt.gz``, one work per
file) and splits them into speeches: a speech starts with a line holding the speaker's name
(``Ham.``, ``FIRST WITCH.``, or an upper-case name without a period such as ``THESEUS``) and
runs to the next blank line. Everything before the first ``ACT``/``SCENE`` line (title,
dramatis personae) is skipped; stage directions in brackets, scene headings and
``Enter``/``Exit`` lines are dropped; text after a stage direction belongs to the speaker
who was talking. Files without act or scene headings (sonnets, narrative poems) have no
roles and are skipped.

Each role's speech (lines joined by single spaces) becomes a character sequence, split LEAF
style: the first ``1 - test_fraction`` of the text is training data, the rest test data.
Both parts are cut into windows: ``x`` holds ``seq_len`` character ids and ``y`` the same
window shifted by one character (next-character targets at every position, ``pad`` where
the text ran out).
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedgmr.data.base import ArrayDataset, FederatedData
from fedgmr.data.registry import DATASETS
from fedgmr.errors import DatasetFormatError
from fedgmr.options import float_option, int_option

PAD, UNK = 0, 1
CHARS = "".join(chr(c) for c in range(32, 127))  # printable ASCII, space first
VOCAB_SIZE = 2 + len(CHARS)
_CHAR_IDS = np.full(256, UNK, dtype=np.int64)
_CHAR_IDS[[ord(c) for c in CHARS]] = np.arange(2, VOCAB_SIZE)

_LAYOUT = (
    "expected a directory of Project Gutenberg play texts (*.txt or *.txt.gz, one play per file) "
    "in which the play proper starts at an 'ACT ...' or 'SCENE ...' line and every speech starts "
    "with a line holding the speaker's name ('Ham.', 'FIRST WITCH.' or 'THESEUS'), followed by "
    "the speech and a blank line"
)

_START = re.compile(r"^(ACT|Act|SCENE|Scene)\b")
_HEADING = re.compile(r"^(ACT|Act|SCENE|Scene)\b|^(THE END|FINIS)\b")
_DIRECTION_LINE = re.compile(r"^(Enter|Re-enter|Exit|Exeunt)\b[^,;:!?]*\.?$")
_BRACKETS = re.compile(r"[\[{][^\]}]*[\]}]")  # [stage direction]; one text closes '{...]'
_CONNECTORS = {"and", "of", "&", "&c", "&C"}
_CAPS = re.compile(r"^[A-Z0-9][A-Z0-9'\-]*$")
_TITLE = re.compile(r"^[A-Z0-9][a-z'\-]*$")
_INLINE = re.compile(r"^(.{1,40}?\.)\s+(\S.*)$")


@dataclass
class Role:
    """One (play, role) client: its speech as one string."""

    play: str
    name: str
    text: str


def encode_text(text: str) -> np.ndarray:
    """Character ids (``pad`` = 0, ``unk`` = 1, printable ASCII from 2)."""
    raw = np.frombuffer(text.encode("latin-1", errors="replace"), dtype=np.uint8)
    return _CHAR_IDS[raw]


def decode_ids(ids: np.ndarray | torch.Tensor) -> str:
    """Inverse of :func:`encode_text` (``pad`` dropped, ``unk`` shown as ``?``)."""
    out = []
    for i in np.asarray(ids).tolist():
        if i >= 2:
            out.append(CHARS[i - 2])
        elif i == UNK:
            out.append("?")
    return "".join(out)


def _name_style(line: str) -> str | None:
    """``caps``/``title`` when ``line`` can be a speaker's name, else ``None``."""
    if not line or line != line.strip() or len(line) > 40:
        return None
    words = [w for w in re.split(r"[\s,]+", line) if w]
    styles = set()
    for word in words:
        bare = word.rstrip(".")
        if bare in _CONNECTORS:
            continue
        if _CAPS.match(bare) and any(c.isalpha() for c in bare):
            styles.add("caps")
        elif _TITLE.match(bare) and any(c.isalpha() for c in bare):
            styles.add("title")
        elif bare.isdigit():
            continue
        else:
            return None
    if not styles:
        return None
    if "title" in styles:
        return "title" if line.endswith(".") else None
    return "caps"


def _normalise(name: str) -> str:
    return " ".join(name.replace(",", " ").split()).rstrip(".").upper()


def _clean_block(lines: list[str]) -> list[str]:
    text = _BRACKETS.sub("", "\n".join(lines))
    if "[" in text:  # an unclosed direction runs to the end of the block
        text = text[:text.index("[")]
    kept = []
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped and not _DIRECTION_LINE.match(stripped):
            kept.append(line.rstrip())
    return kept


def _blocks(lines: list[str]) -> list[list[str]]:
    blocks, current = [], []
    for line in lines:
        if line.strip():
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return blocks


def parse_play(text: str, play: str) -> list[Role]:
    """Split one play into roles (in order of first speech); empty for non-dramatic texts."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = next((i for i, line in enumerate(lines) if _START.match(line)), None)
    if start is None:
        return []
    blocks = []
    for raw in _blocks(lines[start:]):
        if _HEADING.match(raw[0]):
            blocks.append(("heading", []))
            continue
        cleaned = _clean_block(raw)
        if cleaned:
            blocks.append(("text", cleaned))
        elif raw[0].lstrip().startswith(("[", "{")):
            blocks.append(("direction", []))

    # Pass 1: the play's naming style, from name lines that head a speech.
    votes = {"caps": 0, "title": 0}
    for kind, block in blocks:
        if kind == "text" and len(block) > 1:
            style = _name_style(block[0])
            if style:
                votes[style] += 1
    style = "title" if votes["title"] > votes["caps"] else "caps"

    def is_name(line: str) -> bool:
        found = _name_style(line)
        return found == "caps" or (found == "title" and style == "title")

    known = {_normalise(b[0]) for k, b in blocks if k == "text" and len(b) > 1 and is_name(b[0])}

    # Pass 2: attribute speech to speakers.
    speeches: dict[str, list[str]] = {}
    speaker: str | None = None
    pending: str | None = None
    for kind, block in blocks:
        if kind != "text":
            pending = None
            if kind == "heading":
                speaker = None
            continue
        first = block[0]
        body = block[1:]
        inline = _INLINE.match(first)
        inline_name, inline_text = (inline.group(1), inline.group(2)) if inline else ("", "")
        inline_known = bool(inline_name) and is_name(inline_name) and _normalise(inline_name) in known
        if is_name(first) and body:
            speaker = _normalise(first)
        elif is_name(first) and (_normalise(first) in known or not inline_known):
            pending = _normalise(first)  # a name alone: its speech follows after a blank line
            continue
        elif inline_known:  # "NAME. speech" on one line
            speaker = _normalise(inline_name)
            body = [inline_text] + body
        else:  # text after a stage direction continues the current speech
            if pending is not None:
                speaker = pending
            body = block
        pending = None
        if speaker is not None and body:
            speeches.setdefault(speaker, []).append(" ".join(" ".join(body).split()))
    return [Role(play, name, " ".join(parts)) for name, parts in speeches.items()]


def _read_text(path: Path) -> str:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                raw = fh.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:  # a corrupt or truncated gzip stream included
        raise DatasetFormatError(f"shakespeare: cannot read {path} ({exc}); {_LAYOUT}") from None
    return raw.decode("utf-8", errors="replace")


def read_roles(root: str | Path) -> list[Role]:
    """Every (play, role) of the texts under ``root``, in file order."""
    path = Path(root)
    if not path.is_dir():
        raise DatasetFormatError(f"shakespeare: {path} is not a directory; {_LAYOUT}")
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith((".txt", ".txt.gz"))
                   and not p.name.upper().startswith(("COPYING", "LICENSE", "README")))
    if not files:
        raise DatasetFormatError(f"shakespeare: {path} holds no *.txt or *.txt.gz file; {_LAYOUT}")
    roles: list[Role] = []
    for file in files:
        play = file.name.split(".")[0]
        roles += parse_play(_read_text(file), play)
    if not roles:
        raise DatasetFormatError(f"shakespeare: found no speeches in the {len(files)} texts under {path}; {_LAYOUT}")
    return roles


def windows(ids: np.ndarray, seq_len: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Next-character windows over one text: ``x`` (n, seq_len), ``y`` = x shifted by one.

    Full windows start every ``stride`` characters; a final window padded with ``pad`` covers
    the tail when full windows leave targets uncovered.
    """
    n = len(ids)
    if n < 2:
        return np.zeros((0, seq_len), np.int64), np.zeros((0, seq_len), np.int64)
    starts = list(range(0, n - seq_len, stride))
    if not starts:
        starts = [0]
    elif starts[-1] + seq_len < n - 1 and starts[-1] + stride < n - 1:
        starts.append(starts[-1] + stride)
    padded = np.concatenate([np.asarray(ids, dtype=np.int64), np.full(seq_len, PAD, dtype=np.int64)])
    chunks = np.lib.stride_tricks.sliding_window_view(padded, seq_len + 1)[starts]
    x, y = chunks[:, :-1].copy(), chunks[:, 1:].copy()
    x[y == PAD] = PAD  # no input position without a target
    return x, y


@DATASETS.register("shakespeare")
def load_shakespeare(root: str | None = None, seq_len: int = 80, stride: int | None = None,
                     test_fraction: float = 0.2, min_chars_per_client: int = 0,
                     max_clients: int | None = None, max_samples_per_client: int | None = None) -> FederatedData:
    """Shakespeare by (play, role): next-character prediction (``task='next_token'``).

    Parameters
    ----------
    root: directory of Gutenberg play texts (e.g. ``../shared/data/shakespeare``).
    seq_len: characters per window (LEAF: 80).
    stride: characters between window starts (default ``seq_len``: no overlap; LEAF's
        one-window-per-character corresponds to ``stride=1``).
    test_fraction: the last part of each role's text that goes to the test split.
    min_chars_per_client: drop roles with fewer characters of speech. Roles left with no
        training window (fewer than 2 characters in their training part) are dropped too, so
        no natural client is empty.
    max_clients: keep the roles with the most speech (ties in file order), in file order.
    max_samples_per_client: keep each role's first training windows (test windows are
        capped in proportion).

    Returns
    -------
    FederatedData with ``x``/``y`` of shape (N, seq_len), ``num_classes`` = 97 (pad, unk and
    95 printable ASCII characters), ``pad_index`` 0 and one natural client per kept role.
    """
    seq_len = int_option("data.options.seq_len", seq_len)
    stride = int_option("data.options.stride", stride, optional=True)
    test_fraction = float_option("data.options.test_fraction", test_fraction, 0.0, 1.0, low_open=True,
                                 high_open=True)
    min_chars_per_client = int_option("data.options.min_chars_per_client", min_chars_per_client, minimum=0)
    max_clients = int_option("data.options.max_clients", max_clients, optional=True)
    max_samples_per_client = int_option("data.options.max_samples_per_client", max_samples_per_client, optional=True)
    if root is None:
        raise DatasetFormatError(f"shakespeare needs data.root pointing to a directory; {_LAYOUT}")
    stride = seq_len if stride is None else stride
    def train_chars(role: Role) -> int:
        return len(role.text) - int(round(len(role.text) * test_fraction))

    roles = [r for r in read_roles(root) if len(r.text) >= min_chars_per_client and train_chars(r) >= 2]
    if max_clients is not None and max_clients < len(roles):
        order = sorted(range(len(roles)), key=lambda i: -len(roles[i].text))
        keep = set(order[:max_clients])
        roles = [r for i, r in enumerate(roles) if i in keep]
    if not roles:
        raise DatasetFormatError(f"shakespeare: no role under {root} has {min_chars_per_client}+ characters")

    xs, ys, txs, tys, natural, count = [], [], [], [], [], 0
    for role in roles:
        ids = encode_text(role.text)
        cut = len(ids) - int(round(len(ids) * test_fraction))
        x, y = windows(ids[:cut], seq_len, stride)
        tx, ty = windows(ids[cut:], seq_len, stride)
        if max_samples_per_client is not None:
            cap_test = max(1, int(round(max_samples_per_client * test_fraction / max(1e-9, 1 - test_fraction))))
            x, y, tx, ty = x[:max_samples_per_client], y[:max_samples_per_client], tx[:cap_test], ty[:cap_test]
        xs.append(x)
        ys.append(y)
        txs.append(tx)
        tys.append(ty)
        natural.append(np.arange(count, count + len(x), dtype=np.int64))
        count += len(x)

    def cat(parts: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros((0, seq_len), dtype=torch.long)

    train = ArrayDataset(cat(xs), cat(ys))
    test = ArrayDataset(cat(txs), cat(tys))
    if len(test) == 0:
        raise DatasetFormatError(f"shakespeare: the {len(roles)} kept roles under {root} leave 0 test windows "
                                 f"(each role's last {test_fraction:g} of text is too short); {_LAYOUT}")
    meta = {"clients": [(r.play, r.name) for r in roles], "chars": CHARS,
            "num_characters": int(sum(len(r.text) for r in roles))}
    return FederatedData(name="shakespeare", train=train, test=test, num_classes=VOCAB_SIZE,
                         task="next_token", natural_clients=natural, pad_index=PAD, meta=meta)
