"""The image-folder task: a folder of images, one sub-folder per class (class names = sub-folder names,
sorted), decoded outside core (the CLI hands core Qt's QImage decoder), resized to the model's size; a
tiny ViT learns horizontal vs vertical stripes from PNGs; a bad folder is refused in one line naming it."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from desktop_app.commands.trace import read_image_file
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.training import image_tasks
from desktop_app.core.training.image_tasks import load_image_folder, set_image_decoder, stratified_split
from desktop_app.core.training.tasks import TaskError, make_task

QtGui = pytest.importorskip("PySide6.QtGui")

N_PER_CLASS = 20


@pytest.fixture(autouse=True)
def qt_decoder_and_one_thread():
    """The decoder the CLI registers (Qt's QImage), removed afterwards: core holds no decoder of its own."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    set_image_decoder(read_image_file)
    yield
    set_image_decoder(None)
    torch.set_num_threads(n)


def stripes(horizontal: bool, rng: np.random.Generator, size: int = 8) -> np.ndarray:
    """Stripes one pixel wide at a random phase, plus noise: uint8 size x size. (Two pixels wide, a 2 x 2
    patch at an even phase would be one flat grey in both classes: only the patches' arrangement would tell.)"""
    phase = int(rng.integers(0, 2))
    line = (np.arange(size) + phase) % 2 * 200 + 20
    a = np.broadcast_to(line[:, None] if horizontal else line[None, :], (size, size)).astype(np.float64)
    a = a + rng.normal(0, 15, (size, size))
    return np.clip(np.round(a), 0, 255).astype(np.uint8)


def write_png(path: Path, grey: np.ndarray) -> None:
    h, w = grey.shape
    data = np.ascontiguousarray(grey)
    image = QtGui.QImage(data.tobytes(), w, h, w, QtGui.QImage.Format.Format_Grayscale8)
    assert image.save(str(path), "PNG"), path


def stripes_folder(root: Path, n: int = N_PER_CLASS, size: int = 8) -> Path:
    rng = np.random.default_rng(0)
    for name, horizontal in (("vertical", False), ("horizontal", True)):  # written out of order: classes are sorted
        (root / name).mkdir(parents=True)
        for i in range(n):
            write_png(root / name / f"{i:03d}.png", stripes(horizontal, rng, size))
    return root


def test_stripes_are_what_the_test_means():
    rng = np.random.default_rng(1)
    h, v = stripes(True, rng).astype(float), stripes(False, rng).astype(float)
    assert h.std(axis=1).mean() < 30 < h.std(axis=0).mean()  # rows constant (up to noise), columns alternate
    assert v.std(axis=0).mean() < 30 < v.std(axis=1).mean()


def test_folder_loads_sorted_classes_decoded_pixels_and_a_stratified_split(tmp_path):
    root = stripes_folder(tmp_path / "stripes")
    images, labels, classes, files = load_image_folder(root, channels=1)
    assert classes == ["horizontal", "vertical"]
    assert labels.tolist() == [0] * N_PER_CLASS + [1] * N_PER_CLASS
    assert files[0] == root / "horizontal" / "000.png"
    rng = np.random.default_rng(0)
    first_vertical = stripes(False, rng)  # the first image written (vertical/000.png)
    assert np.array_equal(images[N_PER_CLASS][:, :, 0], first_vertical)  # PNG round trip is lossless
    train_idx, held_idx = stratified_split(labels)
    assert len(held_idx) == 8 and np.bincount(labels[held_idx]).tolist() == [4, 4]  # a fifth of each class
    assert not set(train_idx) & set(held_idx) and len(train_idx) + len(held_idx) == 2 * N_PER_CLASS
    task = make_task("image-folder", {"image_folder": str(root), "channels": 1})
    assert task.vocab_size == 2 and task.seq_len == 17  # 8 x 8 in 2 x 2 patches + [CLS]
    assert task.model_settings["extra"]["id2label"] == {"0": "horizontal", "1": "vertical"}
    assert tuple(task.val_set().inputs.shape) == (8, 1, 8, 8)
    # resized to a given size, as RGB
    task = make_task("image-folder", {"image_folder": str(root), "channels": 3, "image_size": 4})
    assert tuple(task.pixels.shape) == (40, 3, 4, 4) and task.model_settings["patch_size"] == 1
    assert torch.equal(task.pixels[:, 0], task.pixels[:, 2])  # grey files as RGB: equal channels


def test_bad_folders_are_refused_in_one_line_naming_the_file(tmp_path):
    def refused(opts) -> str:
        with pytest.raises(TaskError) as info:
            make_task("image-folder", opts)
        message = str(info.value)
        assert "\n" not in message
        return message

    assert "--image-folder" in refused({})
    missing = tmp_path / "nowhere"
    assert refused({"image_folder": str(missing)}).startswith(f"{missing}: not a folder")
    one = tmp_path / "one"
    (one / "cats").mkdir(parents=True)
    assert refused({"image_folder": str(one)}) == (f"{one}: 1 class sub-folder(s); the image-folder task needs at "
                                                   "least 2 (one sub-folder of images per class)")
    root = stripes_folder(tmp_path / "s", n=3)
    for f in list((root / "vertical").iterdir())[1:]:
        f.unlink()
    assert refused({"image_folder": str(root)}).startswith(f"{root / 'vertical'}: 1 image file(s); each class needs at least 2")
    root = stripes_folder(tmp_path / "broken", n=3)
    (root / "vertical" / "001.png").write_bytes(b"not a png at all")
    assert refused({"image_folder": str(root)}) == (f"{root / 'vertical' / '001.png'}: not an image Qt can decode "
                                                    "(PNG, JPEG, BMP, ...): Unsupported image format")  # Qt's own reason after it
    root = stripes_folder(tmp_path / "mixed", n=3)
    write_png(root / "vertical" / "002.png", stripes(False, np.random.default_rng(0), size=12))
    assert refused({"image_folder": str(root)}) == (
        f"{root / 'vertical' / '002.png'}: 12 x 12, but {root / 'horizontal' / '000.png'} is 8 x 8; give an image "
        "size (--image-size) to resize every image to it")
    assert make_task("image-folder", {"image_folder": str(root), "image_size": 8, "channels": 1}).vocab_size == 2
    set_image_decoder(None)  # core alone decodes no PNG
    assert "no image decoder" in refused({"image_folder": str(root)})
    assert image_tasks._image_decoder is None


def test_cli_refuses_a_bad_folder_in_one_line(tmp_path, capsys):
    from desktop_app.cli import main

    code = main(["train", "--task", "image-folder", "--family", "vit", "--steps", "2", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--image-folder" in err and len(err.splitlines()) == 1
    one = tmp_path / "one"
    (one / "a").mkdir(parents=True)
    code = main(["train", "--task", "image-folder", "--image-folder", str(one), "--family", "vit", "--steps", "2",
                 "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"{one}: 1 class sub-folder(s)" in err


@pytest.mark.slow
def test_a_tiny_vit_learns_stripes_from_a_folder_of_pngs_through_the_cli(tmp_path, capsys):
    from desktop_app.cli import main

    root = stripes_folder(tmp_path / "stripes")
    t0 = time.perf_counter()
    code = main(["train", "--task", "image-folder", "--image-folder", str(root), "--channels", "1", "--family", "vit",
                 "--layers", "1", "--heads", "2", "--d-model", "32", "--lr", "3e-3", "--batch-size", "32",
                 "--steps", "300", "--warmup", "20", "--eval-every", "100", "--log-every", "50", "--seed", "0",
                 "--out", str(tmp_path / "run"), "--export", str(tmp_path / "export")])
    seconds = time.perf_counter() - t0
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    summary = json.loads(stdout.strip().splitlines()[-1])
    print(f"\nViT (d 32, 1 layer, 2 heads) on 2 x {N_PER_CLASS} stripe PNGs: held-out accuracy "
          f"{summary['val_accuracy']:.3f} after 300 steps in {seconds:.1f} s")
    assert summary["step"] == 300 and summary["val_accuracy"] == 1.0  # 8 held-out images, a trivial pattern
    loaded = load_model_folder(tmp_path / "export")
    assert loaded.config.extra["id2label"] == {"0": "horizontal", "1": "vertical"}
    assert loaded.config.num_channels == 1 and loaded.config.image_size == 8
    pre = json.loads((tmp_path / "export" / "preprocessor_config.json").read_text())
    assert pre["size"] == {"height": 8, "width": 8} and pre["image_mean"] == [0.5]
    run_config = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert run_config["task_options"] == {"image_folder": str(root), "channels": 1}
