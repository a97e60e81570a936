"""Image classification: ImageNet's val folder, torchvision datasets in their own on-disk layout
under a local root (never downloaded), and HF image datasets; images go through the model's own
eval transform (timm's data config), as timm's validate script does."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path

import torch

from prunebench.tasks.classification import ClassificationTask

TORCHVISION = {  # dataset -> (torchvision class, keyword arguments selecting the evaluated split)
    "fashion_mnist": ("FashionMNIST", {"train": False}),
    "food101": ("Food101", {"split": "test"}),
}


class ImageSource:
    """`dataset()` -> a sequence of (PIL image, class index); `classes` in index order."""

    root: str

    def check(self) -> None:
        if not Path(self.root).expanduser().exists():
            raise FileNotFoundError(f"task.source.root: {self.root!r} does not exist")

    def describe(self) -> str:
        return str(Path(self.root).expanduser().resolve())


class ImageFolderSource(ImageSource):
    """A class-per-folder tree (ImageNet's val/<wnid>/*.JPEG): sorted folder names are the class
    order, which is the order of ImageNet-1k checkpoints' logits."""

    def __init__(self, root: str):
        self.root = root

    def dataset(self):
        from torchvision.datasets import ImageFolder

        return ImageFolder(str(Path(self.root).expanduser()))


class TorchvisionSource(ImageSource):
    """A torchvision dataset already on disk under `root` in its own layout (download stays off)."""

    def __init__(self, dataset: str, root: str):
        if dataset not in TORCHVISION:
            raise ValueError(f"task.source.dataset={dataset!r} is not one of {sorted(TORCHVISION)}")
        self.dataset_name, self.root = dataset, root

    def dataset(self):
        import torchvision.datasets

        cls, split = TORCHVISION[self.dataset_name]
        return getattr(torchvision.datasets, cls)(str(Path(self.root).expanduser()), download=False, **split)


class _ArraysOnly(pickle.Unpickler):
    """CIFAR's files are pickles of dicts, lists, strings and numpy arrays; a pickle naming anything
    else (a function to call, a class to build) is refused, so a crafted file in a user's data folder
    cannot run code. No library reads the format without unpickling, hence this short allow-list."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{getattr(self, 'path', 'a CIFAR file')}: refuses {module}.{name}; "
                                         f"CIFAR-100's files hold only arrays, lists and strings")
        return super().find_class(module, name)


def load_cifar_pickle(path: Path):
    with open(path, "rb") as handle:
        unpickler = _ArraysOnly(handle, encoding="latin1")
        unpickler.path = path
        return unpickler.load()


class Cifar100Test(Sequence):
    """`cifar-100-python/test` (pickled uint8 rows, fine labels) and `meta` (label names), read
    without unpickling anything but arrays. torchvision's reader also checks the archive's md5 sums,
    which only the published files pass."""

    def __init__(self, folder: Path):
        data = load_cifar_pickle(folder / "test")
        self.classes = load_cifar_pickle(folder / "meta")["fine_label_names"]
        self.images = data["data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        self.targets = list(data["fine_labels"])

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i):
        from PIL import Image

        return Image.fromarray(self.images[i]), self.targets[i]


class Cifar100Source(ImageSource):
    def __init__(self, root: str):
        self.root = root

    def check(self) -> None:
        folder = Path(self.root).expanduser() / "cifar-100-python"
        if not (folder / "test").is_file():
            raise FileNotFoundError(f"task.source.root: {str(folder / 'test')!r} does not exist (CIFAR-100's "
                                    f"python archive extracted under root)")

    def dataset(self):
        return Cifar100Test(Path(self.root).expanduser() / "cifar-100-python")


class HFImages(Sequence):
    def __init__(self, rows, image_field: str, label_field: str):
        self.rows, self.image_field, self.label_field = rows, image_field, label_field
        feature = rows.features[label_field]
        self.classes = list(getattr(feature, "names", None) or sorted(set(rows[label_field])))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        return row[self.image_field], row[self.label_field]


class HFImageSource(ImageSource):
    """`datasets.load_dataset(path, name, split=split, data_files=...)`: a hub id, a local folder, or
    a builder (`parquet`) with local `data_files`; the label feature's names are the classes."""

    def __init__(self, path: str, split: str, name: str | None = None, data_files=None,
                 image_field: str = "image", label_field: str = "label"):
        self.root, self.split, self.name, self.data_files = path, split, name, data_files
        self.image_field, self.label_field = image_field, label_field

    def check(self) -> None:
        for file in [self.data_files] if isinstance(self.data_files, str) else (self.data_files or []):
            if not Path(file).expanduser().exists():
                raise FileNotFoundError(f"task.source.data_files: {file!r} does not exist")

    def dataset(self):
        import datasets

        rows = datasets.load_dataset(self.root, self.name, split=self.split, data_files=self.data_files)
        return HFImages(rows, self.image_field, self.label_field)

    def describe(self) -> str:
        return f"hf:{self.root}/{self.name or ''}:{self.split}:{self.data_files or ''}"


class ImageClassificationTask(ClassificationTask):
    families = frozenset({"vision"})

    def __init__(self, name: str, source: ImageSource, metrics: Sequence[str] = ("top1", "top5"),
                 primary: str = "top1", batch_size: int = 64):
        super().__init__(name, source, metrics, primary, batch_size)
        self._dataset = None

    def dataset(self):
        if self._dataset is None:
            self._dataset = self.source.dataset()
        return self._dataset

    @property
    def num_labels(self) -> int:
        return len(self.dataset().classes)

    def examples(self, limit: int | None = None) -> Sequence:
        data = self.dataset()
        return torch.utils.data.Subset(data, range(min(limit, len(data)))) if limit else data

    def check_model(self, loaded) -> None:
        super().check_model(loaded)
        outputs = getattr(loaded.model, "num_classes", None)
        if outputs != self.num_labels:
            raise ValueError(f"task {self.name} has {self.num_labels} classes but model {loaded.name!r} outputs "
                             f"{outputs}; load it with model.num_classes={self.num_labels} and a checkpoint "
                             f"trained on this dataset")

    def collate(self, loaded):
        from timm.data import create_transform, resolve_model_data_config

        transform = create_transform(**resolve_model_data_config(loaded.model))
        dtype = next(loaded.model.parameters()).dtype

        def batch(examples):
            images = torch.stack([transform(image.convert("RGB")) for image, _ in examples]).to(dtype)
            return {"pixel_values": images, "labels": torch.tensor([label for _, label in examples])}

        return batch
