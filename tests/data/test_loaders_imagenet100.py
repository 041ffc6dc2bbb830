"""ImageNet-100 loader on a tiny image folder written here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedgmr.data import load_dataset
from fedgmr.errors import DatasetFormatError

Image = pytest.importorskip("PIL.Image", reason="the imagenet100 loader needs Pillow")

COLOURS = {"n01": (255, 0, 0), "n02": (0, 255, 0), "n03": (0, 0, 255)}


def _image(path: Path, colour: tuple[int, int, int], size: tuple[int, int] = (20, 12)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    for split, count in (("train", 3), ("val", 1)):
        for wnid, colour in COLOURS.items():
            for i in range(count):
                _image(tmp_path / split / wnid / f"{wnid}_{i}.png", colour)
    _image(tmp_path / "train" / "n02" / "extra.JPEG", COLOURS["n02"], (16, 16))
    (tmp_path / "train" / "n02" / "notes.txt").write_text("not an image")
    (tmp_path / "classes.txt").write_text("n02\nn01\n")
    return tmp_path


def test_listed_classes_in_line_order(folder: Path) -> None:
    data = load_dataset("imagenet100", root=str(folder), image_size=8, normalize=False)
    assert data.num_classes == 2 and data.meta["classes"] == ["n02", "n01"]
    assert data.train.x.shape == (7, 3, 8, 8) and data.train.x.dtype == torch.float32
    assert data.test.x.shape == (2, 3, 8, 8)
    assert data.train.y.tolist() == [0, 0, 0, 0, 1, 1, 1]
    green, red = data.train.x[0], data.train.x[-1]
    assert torch.allclose(green[1], torch.ones(8, 8)) and torch.allclose(green[0], torch.zeros(8, 8))
    assert torch.allclose(red[0], torch.ones(8, 8))
    jpeg = data.train.x[0:4][:, 1].mean(dim=(1, 2))  # n02 includes one lossy JPEG
    assert torch.all(jpeg > 0.9)


def test_max_per_class_fallback_classes_and_normalisation(folder: Path) -> None:
    (folder / "classes.txt").unlink()
    data = load_dataset("imagenet100", root=str(folder), image_size=4, num_classes=3, max_per_class=2,
                        num_workers=1)
    assert data.meta["classes"] == ["n01", "n02", "n03"]
    assert data.train.y.tolist() == [0, 0, 1, 1, 2, 2]
    assert float(data.train.x[0, 0].mean()) > 2.0  # red channel standardised: (1 - 0.485) / 0.229
    custom = folder / "my_classes.txt"
    custom.write_text("n03 some comment\n")
    assert load_dataset("imagenet100", root=str(folder), image_size=4, classes_file="my_classes.txt").num_classes == 1


@pytest.mark.parametrize("breakage, fragment", [
    ("no_train", "train"),
    ("no_val_class", "missing class folder"),
    ("corrupt", "cannot decode"),
    ("bad_classes_file", "class file"),
    ("empty_class", "holds no"),
])
def test_broken_folders(folder: Path, breakage: str, fragment: str) -> None:
    options: dict = {}
    if breakage == "no_train":
        (folder / "train").rename(folder / "training")
    elif breakage == "no_val_class":
        for f in (folder / "val" / "n01").iterdir():
            f.unlink()
        (folder / "val" / "n01").rmdir()
    elif breakage == "corrupt":
        (folder / "train" / "n01" / "n01_0.png").write_bytes(b"not a png at all")
    elif breakage == "bad_classes_file":
        options["classes_file"] = "missing.txt"
    elif breakage == "empty_class":
        for f in (folder / "val" / "n02").iterdir():
            f.unlink()
    with pytest.raises(DatasetFormatError) as err:
        load_dataset("imagenet100", root=str(folder), image_size=4, **options)
    assert fragment in str(err.value) and "root/train/<wnid>" in str(err.value)
