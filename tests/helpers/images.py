"""Image datasets written in each one's real on-disk layout (ImageFolder, CIFAR-100's pickles,
Fashion-MNIST's idx files, Food-101's folders), of random pixels."""

from __future__ import annotations

import json
import pickle
import struct

import numpy as np
from PIL import Image

CLASSES = 10


def pixels(n: int, size: int = 40, channels: int = 3, seed: int = 0) -> np.ndarray:
    shape = (n, size, size, channels) if channels > 1 else (n, size, size)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def image_folder(root, n_per_class: int = 2):
    for c in range(CLASSES):
        (root / f"n{c:08d}").mkdir(parents=True)
        for i, array in enumerate(pixels(n_per_class, seed=c)):
            Image.fromarray(array).save(root / f"n{c:08d}" / f"ILSVRC2012_val_{c}{i}.JPEG", format="JPEG")
    return root


def cifar100(root, n: int = 12):
    """The archive was pickled by Python 2: its str keys load as str with encoding latin1."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    data = pixels(n, 32).transpose(0, 3, 1, 2).reshape(n, -1)
    labels = [i % 100 for i in range(n)]
    with open(folder / "test", "wb") as f:
        pickle.dump({"data": data, "fine_labels": labels, "coarse_labels": labels}, f)
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)]}, f)
    return root


def fashion_mnist(root, n: int = 12):
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / "t10k-images-idx3-ubyte").write_bytes(struct.pack(">iiii", 2051, n, 28, 28) + pixels(n, 28, 1).tobytes())
    (raw / "t10k-labels-idx1-ubyte").write_bytes(struct.pack(">ii", 2049, n) + bytes(i % 10 for i in range(n)))
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        (raw / name).write_bytes(b"")
    return root


def food101(root, classes=("apple_pie", "baby_back_ribs")):
    base = root / "food-101"
    (base / "meta").mkdir(parents=True)
    test = {}
    for c in classes:
        (base / "images" / c).mkdir(parents=True)
        for i, array in enumerate(pixels(3, seed=len(c))):
            Image.fromarray(array).save(base / "images" / c / f"{i}.jpg")
        test[c] = [f"{c}/{i}" for i in range(3)]
    (base / "meta" / "test.json").write_text(json.dumps(test))
    (base / "meta" / "classes.txt").write_text("\n".join(classes))
    return root
