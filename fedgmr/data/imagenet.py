"""ImageNet-100 (or any class subset of ImageNet) from an image-folder layout."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from fedgmr.data.base import ArrayDataset, FederatedData
from fedgmr.data.registry import DATASETS
from fedgmr.errors import DatasetFormatError
from fedgmr.options import bool_option, int_option, str_option

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
EXTENSIONS = (".jpeg", ".jpg", ".png")
_LAYOUT = (
    "expected an image folder: root/train/<wnid>/*.JPEG and root/val/<wnid>/*.JPEG (also .jpg/.png; "
    "validation images sorted into one folder per class) plus root/classes.txt listing one wnid per "
    "line (label = line number; option classes_file); without a class file the first num_classes "
    "wnid folders of train/ in sorted order are used"
)


def _read_classes(root: Path, classes_file: str | None, num_classes: int) -> tuple[list[str], str]:
    if classes_file is not None:
        path = Path(classes_file)
        path = path if path.is_absolute() else root / path
        if not path.is_file():
            raise DatasetFormatError(f"imagenet100: class file {path} not found; {_LAYOUT}")
    else:
        path = root / "classes.txt"
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DatasetFormatError(f"imagenet100: cannot read {path} ({exc}); {_LAYOUT}") from None
        classes = [line.split()[0] for line in text.splitlines() if line.strip()]
        if len(set(classes)) != len(classes):
            raise DatasetFormatError(f"imagenet100: {path} lists a class twice; {_LAYOUT}")
        source = str(path)
    else:
        classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())[:num_classes]
        source = f"first {num_classes} folders of {root / 'train'}"
    if not classes:
        raise DatasetFormatError(f"imagenet100: no classes found ({source}); {_LAYOUT}")
    return classes, source


def _list_images(folder: Path, max_per_class: int | None) -> list[Path]:
    if not folder.is_dir():
        raise DatasetFormatError(f"imagenet100: missing class folder {folder}; {_LAYOUT}")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in EXTENSIONS and p.is_file())
    if not files:
        raise DatasetFormatError(f"imagenet100: {folder} holds no .JPEG/.jpg/.png image; {_LAYOUT}")
    return files[:max_per_class] if max_per_class else files


def load_image(path: Path, size: int) -> np.ndarray:
    """Decode one image as RGB: shorter side resized to ``size``, centre-cropped, uint8 (3, S, S)."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
            w, h = img.size
            scale = size / min(w, h)
            nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
            img = img.resize((nw, nh), Image.Resampling.BILINEAR)
            left, top = (nw - size) // 2, (nh - size) // 2
            img = img.crop((left, top, left + size, top + size))
            return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise DatasetFormatError(f"imagenet100: cannot decode image {path} ({exc}); {_LAYOUT}") from None


def _load_split(root: Path, split: str, classes: list[str], size: int, max_per_class: int | None,
                normalize: bool, num_workers: int) -> ArrayDataset:
    folder = root / split
    if not folder.is_dir():
        raise DatasetFormatError(f"imagenet100: {root} has no {split}/ folder; {_LAYOUT}")
    files: list[Path] = []
    labels: list[int] = []
    for label, wnid in enumerate(classes):
        found = _list_images(folder / wnid, max_per_class)
        files += found
        labels += [label] * len(found)
    out = np.empty((len(files), 3, size, size), dtype=np.uint8)
    with ThreadPoolExecutor(max_workers=max(1, num_workers)) as pool:
        for i, img in enumerate(pool.map(lambda p: load_image(p, size), files)):
            out[i] = img
    x = torch.from_numpy(out).float().div_(255.0)
    if normalize:
        x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    return ArrayDataset(x, torch.tensor(labels, dtype=torch.long))


@DATASETS.register("imagenet100")
def load_imagenet100(root: str | None = None, image_size: int = 64, classes_file: str | None = None,
                     num_classes: int = 100, max_per_class: int | None = None, normalize: bool = True,
                     num_workers: int = 8) -> FederatedData:
    """ImageNet-100: the listed ImageNet classes, images resized to ``image_size``.

    Parameters
    ----------
    root: folder with ``train/<wnid>/``, ``val/<wnid>/`` and ``classes.txt``.
    image_size: side of the square images (shorter side resized, centre crop). The paper
        trains on 168 px crops; 64 keeps the in-memory float tensor manageable
        (100 classes x 1,300 images x 3 x 64 x 64 float32 is about 6.4 GB).
    classes_file: class list (one wnid per line; default ``root/classes.txt``; relative
        paths are relative to ``root``).
    num_classes: without a class file, use the first ``num_classes`` wnid folders of
        ``train/`` in sorted order.
    max_per_class: keep the first images (sorted file names) of each class, per split.
    normalize: standardise channels with the ImageNet mean and std.
    num_workers: decoding threads.
    """
    image_size = int_option("data.options.image_size", image_size)
    classes_file = str_option("data.options.classes_file", classes_file, optional=True)
    num_classes = int_option("data.options.num_classes", num_classes)
    max_per_class = int_option("data.options.max_per_class", max_per_class, optional=True)
    normalize = bool_option("data.options.normalize", normalize)
    num_workers = int_option("data.options.num_workers", num_workers)
    if root is None:
        raise DatasetFormatError(f"imagenet100 needs data.root pointing to a directory; {_LAYOUT}")
    path = Path(root)
    if not (path / "train").is_dir():
        raise DatasetFormatError(f"imagenet100: {path / 'train'} is not a directory; {_LAYOUT}")
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise ImportError("imagenet100 decodes images with Pillow: pip install pillow") from None
    classes, source = _read_classes(path, classes_file, num_classes)
    train = _load_split(path, "train", classes, image_size, max_per_class, normalize, num_workers)
    test = _load_split(path, "val", classes, image_size, max_per_class, normalize, num_workers)
    return FederatedData(name="imagenet100", train=train, test=test, num_classes=len(classes),
                         meta={"classes": classes, "class_source": source, "normalized": normalize})
