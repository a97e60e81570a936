"""A task's images from a folder, a zip of it (with the archive's top folder, as VizWiz's val.zip),
an HF dataset saved with save_to_disk or written as parquet (named by a key column or by the file
name the image feature stored), or the documents' own image column: every store gives the same
pixels and the same generations, and a missing picture fails validation naming the first few,
before any model loads."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from PIL import Image

from conftest import compose_cfg
from prunebench.api.errors import ConfigError
from prunebench.models.vlm import open_image
from prunebench.tasks.build import build_tasks
from prunebench.tasks.generate_until import GenerateUntilTask
from prunebench.tasks.sources import JsonSource

NAMES = ["VizWiz_val_00000000.jpg", "VizWiz_val_00000001.jpg", "VizWiz_val_00000002.jpg"]


@pytest.fixture
def pictures(tmp_path):
    """Three random PNG-encoded pictures under VizWiz-like names, and their questions."""
    folder = tmp_path / "val"
    folder.mkdir()
    rng = np.random.RandomState(0)
    for name in NAMES:
        Image.fromarray(rng.randint(0, 255, (20, 24, 3), dtype=np.uint8)).save(folder / name, format="PNG")
    docs = [{"question": f"What is {i}?", "image": name, "answers": ["red"] * 10} for i, name in enumerate(NAMES)]
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return tmp_path


def zipped(root, name="val.zip"):
    with zipfile.ZipFile(root / name, "w") as archive:
        for image in NAMES:
            archive.write(root / "val" / image, f"val/{image}")
    return root / name


def saved_dataset(root, key: str | None):
    import datasets

    rows = {"image": [str(root / "val" / n) for n in NAMES], "file": NAMES}
    ds = datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())
    if key is None:
        ds = ds.remove_columns("file")
    ds.save_to_disk(str(root / "saved"))
    ds.to_parquet(str(root / "images.parquet"))
    return ds


def task(root, image_dir, **options) -> GenerateUntilTask:
    return GenerateUntilTask("pictures", JsonSource(str(root / "val.jsonl")), "question", "",
                             doc_to_image="image", image_dir=str(image_dir), max_gen_toks=6, until=[], **options)


def pixels(t: GenerateUntilTask) -> list[np.ndarray]:
    return [np.asarray(open_image(r.requests[0].images[0])) for r in t.instances()]


@pytest.mark.parametrize("store", ["zip", "saved_by_key", "saved_by_file_name", "parquet_by_key"])
def test_every_store_gives_the_folders_pixels(pictures, store):
    want = pixels(task(pictures, pictures / "val"))
    if store == "zip":
        where, options = zipped(pictures), {}
    else:
        key = None if store == "saved_by_file_name" else "file"
        saved_dataset(pictures, key)
        where = pictures / ("images.parquet" if store.startswith("parquet") else "saved")
        options = {"image_key": key}
    t = task(pictures, where, **options)
    t.check()
    got = pixels(t)
    assert len(got) == 3 and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert not np.array_equal(got[0], got[1])


def test_documents_that_carry_their_pictures_need_no_image_dir(pictures):
    """An HF dataset whose rows hold the image column (lmms-lab's parquet layout) is read as it is."""
    from prunebench.tasks.sources import HFSource

    ds = saved_dataset(pictures, "file").rename_column("file", "question")
    ds.to_parquet(str(pictures / "with_images.parquet"))
    source = HFSource("parquet", split="train", data_files=str(pictures / "with_images.parquet"))
    assert isinstance(source.load()[0]["image"], Image.Image)
    t = GenerateUntilTask("pictures", source, "question", "", doc_to_image="image")
    t.check()
    want = pixels(task(pictures, pictures / "val"))
    assert all(np.array_equal(a, b) for a, b in zip(pixels(t), want))


def test_a_zip_feeds_the_model_as_the_folder_does(pictures):
    from prunebench.evaluation.generation.engine import GenerationDataModule, GenerationModule
    from prunebench.models.cache import get_model

    model = get_model(compose_cfg(["model=tiny-llava"]).model)

    def replies(t):
        data, module = GenerationDataModule(t, model), GenerationModule(model, t)
        data.setup()
        for i, batch in enumerate(data.test_dataloader()):
            module.test_step(batch, i)
        return [r["response"] for r in sorted(module.records, key=lambda r: r["doc_id"])]

    assert replies(task(pictures, zipped(pictures))) == replies(task(pictures, pictures / "val"))


@pytest.mark.parametrize("store", ["folder", "zip", "saved_by_key"])
def test_missing_pictures_fail_validation_naming_the_first_few(pictures, store, monkeypatch):
    (pictures / "val" / NAMES[1]).unlink()
    (pictures / "val" / NAMES[2]).unlink()
    options = []
    if store == "zip":
        where = pictures / "val.zip"
        with zipfile.ZipFile(where, "w") as archive:
            archive.write(pictures / "val" / NAMES[0], f"val/{NAMES[0]}")
    elif store == "saved_by_key":
        import datasets

        datasets.Dataset.from_dict({"image": [str(pictures / "val" / NAMES[0])], "file": [NAMES[0]]}).cast_column(
            "image", datasets.Image()).save_to_disk(str(pictures / "saved"))
        where, options = pictures / "saved", ["task.tasks.vizwiz_vqa.image_key=file"]
    else:
        where = pictures / "val"

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("prunebench.models.cache.get_model", no_loading)
    cfg = compose_cfg(["model=tiny-llava", "task=vizwiz_vqa", f"task.tasks.vizwiz_vqa.source.path={pictures / 'val.jsonl'}",
                       f"task.tasks.vizwiz_vqa.image_dir={where}", *options])
    with pytest.raises(ConfigError, match=rf"2 image\(s\) missing in image_dir=.*{NAMES[1]}.*{NAMES[2]}"):
        build_tasks(cfg)


def test_an_image_dir_that_cannot_hold_images_is_refused(pictures):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        task(pictures, pictures / "nowhere").check()
    (pictures / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="cannot read images from"):
        task(pictures, pictures / "notes.txt").check()
    saved_dataset(pictures, "file")
    with pytest.raises(ValueError, match="image_key='name' is not a column; its columns: \\['image', 'file'\\]"):
        task(pictures, pictures / "saved", image_key="name").check()


def test_a_picture_checked_once_is_checked_again_when_it_changes(pictures):
    """A sweep's jobs read each picture's header once per process; a picture written since is read again."""
    checked = task(pictures, pictures / "val")
    checked.check_images()
    (pictures / "val" / NAMES[1]).write_bytes(b"not a picture")
    with pytest.raises(ValueError, match=rf"1 image\(s\) cannot be read, first: .*{NAMES[1]} \(not an image PIL"):
        task(pictures, pictures / "val").check_images()
