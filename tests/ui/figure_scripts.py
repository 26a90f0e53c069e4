"""What the tests of the figure scripts (packaging/make_*figure*.py) share: the script as a module, and what a
figure it wrote must be (a PNG of the size the README shows, with something drawn on it)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from PySide6.QtGui import QImage

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"
NOT_THE_SCRIPTS = "notes.txt"  # a file of someone else's in the script's output folder


def load_script(name: str):
    """packaging/NAME.py as a module (its main() and the functions it makes the figures with)."""
    spec = importlib.util.spec_from_file_location(name, PACKAGING / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def pixels(path: Path) -> np.ndarray:
    """The PNG at `path` as height x width x RGB."""
    image = QImage(str(path))
    assert not image.isNull(), f"{path}: not a PNG Qt reads"
    image = image.convertToFormat(QImage.Format.Format_RGB32)
    a = np.frombuffer(image.constBits(), np.uint8, image.sizeInBytes())
    return a.reshape(image.height(), image.bytesPerLine() // 4, 4)[:, :image.width(), :3].copy()


def assert_drawn(path: Path, size: tuple[int, int]) -> np.ndarray:
    """The PNG at `path` is width x height `size` and not blank: many colours, over much of it (a grab of an
    empty or not yet painted widget is one flat colour; a plot is mostly its background). Its pixels."""
    rgb = pixels(path)
    assert (rgb.shape[1], rgb.shape[0]) == size, f"{path.name}: {rgb.shape[1]} x {rgb.shape[0]}, not {size}"
    colours = np.unique(rgb.reshape(-1, 3), axis=0)
    background = np.all(rgb == np.median(rgb.reshape(-1, 3), axis=0), axis=2).mean()
    assert len(colours) > 50 and background < 0.99, f"{path.name}: {len(colours)} colours, {background:.0%} one colour"
    return rgb


def someone_elses_file(folder: Path) -> Path:
    """A file the script did not write, in its output folder before it runs."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / NOT_THE_SCRIPTS
    path.write_text("not the script's\n", encoding="utf-8")
    return path


def assert_only_wrote(folder: Path, names: set[str], theirs: Path) -> None:
    """`folder` holds the figures `names` beside the file of someone else's, kept as it was."""
    assert {p.name for p in folder.iterdir()} == names | {theirs.name}
    assert theirs.read_text(encoding="utf-8") == "not the script's\n"
