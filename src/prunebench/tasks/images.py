"""Where a task's images are (`image_dir`): a folder in the benchmark's published layout (an HF
`imagefolder` is one), a .zip of it as the benchmarks ship it (VizWiz's val.zip holds val/<name>),
or a Hugging Face dataset saved with `save_to_disk` or written as parquet, whose image column holds
the pictures and whose key column (or the file name each picture was stored under) names them.

Each store answers which names it holds without opening a picture, and reads the header of each
picture in a folder or zip (`problems`): every document's image is checked before any model loads;
its pixels are read only when its batch is built (`open_image`)."""

from __future__ import annotations

import functools
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


def header_problem(handle, size: int) -> str | None:
    """Why a picture cannot be read, from its size and header alone: PIL's `Image.open` reads the
    header and leaves the pixels, so checking thousands of images costs milliseconds each."""
    from PIL import Image, UnidentifiedImageError

    if size == 0:
        return "0 bytes"
    try:
        with Image.open(handle) as img:
            img.size  # noqa: B018  (the header parsed)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        return f"not an image PIL can read: {err}"
    return None


def file_problem(path: Path) -> str | None:
    """`header_problem` of a file, read once per process while its size and modification time stay:
    every job of a sweep checks the same thousands of pictures before its model loads."""
    stat = path.stat()
    return checked_file(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2**20)  # a reason or None per picture: ~100 bytes each
def checked_file(path: str, mtime_ns: int, size: int) -> str | None:
    return header_problem(path, size)


class ImageFolder:
    def __init__(self, root: Path):
        self.root = root

    def has(self, name: str) -> bool:
        return (self.root / name).is_file()

    def ref(self, name: str) -> Path:
        return self.root / name

    def problems(self, names: list[str]) -> dict[str, str]:
        """{file: why it cannot be read} for the named pictures (all present)."""
        found = {str(self.root / name): file_problem(self.root / name) for name in names}
        return {path: why for path, why in found.items() if why}


@dataclass(frozen=True)
class ZipMember:
    """One picture inside a zip archive, read when its batch is built."""

    archive: str
    member: str

    def open_image(self):
        from PIL import Image

        with zipfile.ZipFile(self.archive) as archive:
            data = archive.read(self.member)
        with Image.open(io.BytesIO(data)) as img:
            return img.convert("RGB")


class ImageZip:
    """Names are found as they are, or under the archive's one top-level folder (val.zip's val/)."""

    def __init__(self, path: Path):
        self.path = path
        with zipfile.ZipFile(path) as archive:
            self.members = {name for name in archive.namelist() if not name.endswith("/")}
        tops = {PurePosixPath(name).parts[0] for name in self.members if "/" in name}
        self.prefixes = ["", f"{tops.pop()}/"] if len(tops) == 1 else [""]

    def member(self, name: str) -> str | None:
        return next((p + name for p in self.prefixes if p + name in self.members), None)

    def has(self, name: str) -> bool:
        return self.member(name) is not None

    def ref(self, name: str) -> ZipMember:
        return ZipMember(str(self.path), self.member(name))

    def problems(self, names: list[str]) -> dict[str, str]:
        """Each member's header, read through the archive (the member's first bytes are inflated)."""
        out = {}
        with zipfile.ZipFile(self.path) as archive:
            for name in names:
                member = self.member(name)
                with archive.open(member) as handle:
                    why = header_problem(handle, archive.getinfo(member).file_size)
                if why:
                    out[f"{self.path}:{member}"] = why
        return out


@dataclass(frozen=True, eq=False)
class DatasetRow:
    """One row's picture of an HF dataset, decoded when its batch is built."""

    store: "ImageDataset"
    row: int

    def open_image(self):
        return self.store.dataset[self.row][self.store.column].convert("RGB")


class ImageDataset:
    """`column`: the image feature; `key`: the column naming each picture, or None for the file
    name the image feature stored with it (its `path`, as `datasets` keeps it)."""

    def __init__(self, path: Path, column: str = "image", key: str | None = None):
        import datasets

        if path.is_dir():
            self.dataset = datasets.load_from_disk(str(path))
        else:
            self.dataset = datasets.load_dataset("parquet", data_files=str(path), split="train")
        if isinstance(self.dataset, datasets.DatasetDict):
            raise ValueError(f"image_dir={str(path)!r} holds several splits {list(self.dataset)}; "
                             f"point it at one split's folder")
        columns = self.dataset.column_names
        for option, name in (("image_column", column), ("image_key", key)):
            if name is not None and name not in columns:
                raise ValueError(f"image_dir={str(path)!r}: {option}={name!r} is not a column; its columns: {columns}")
        self.path, self.column = path, column
        if key is not None:
            names = [str(v) for v in self.dataset[key]]
        else:
            stored = self.dataset.cast_column(column, datasets.Image(decode=False))[column]
            names = [PurePosixPath(value["path"] or "").name for value in stored]
        self.rows = {name: row for row, name in enumerate(names)}

    def has(self, name: str) -> bool:
        return name in self.rows or PurePosixPath(name).name in self.rows

    def ref(self, name: str) -> DatasetRow:
        return DatasetRow(self, self.rows.get(name, self.rows.get(PurePosixPath(name).name)))

    def problems(self, names: list[str]) -> dict[str, str]:
        """None looked for: the pictures are cells of the dataset's own files, which `datasets` wrote."""
        return {}


def is_saved_dataset(path: Path) -> bool:
    """A folder `Dataset.save_to_disk` wrote (its state file and dataset info beside the arrow files)."""
    return (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


def image_store(image_dir: str, column: str = "image", key: str | None = None):
    """The store behind `image_dir`, chosen by what the path is."""
    path = Path(image_dir).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"image_dir={image_dir!r} does not exist (a folder of images, a .zip of one, "
                                f"or an HF dataset: a save_to_disk folder or a .parquet file)")
    if path.is_dir():
        return ImageDataset(path, column, key) if is_saved_dataset(path) else ImageFolder(path)
    if path.suffix == ".zip":
        return ImageZip(path)
    if path.suffix == ".parquet":
        return ImageDataset(path, column, key)
    raise FileNotFoundError(f"image_dir={image_dir!r} is a file prunebench cannot read images from; "
                            f"use a folder, a .zip, or an HF dataset (save_to_disk folder or .parquet)")
