"""The Train panel's image-folder task: its folder field shows (the text file's hides), the family list is
vit, a missing or bad folder is said beside the task, and a folder of PNGs gives the run's own settings
and parameter count."""
from __future__ import annotations

import numpy as np
import pytest

from desktop_app.app.images import read_image_file
from desktop_app.core.model import Transformer
from desktop_app.core.training.image_tasks import set_image_decoder
from desktop_app.core.training.tasks import make_task
from desktop_app.core.training.trainer import model_config_for
from desktop_app.ui.panels.training import TrainingPanel
from desktop_app.ui.state import AppState



def stripes_folder(root, n: int = 5):
    """horizontal/ and vertical/ stripes, 8 x 8 grey PNGs written with QImage."""
    from PySide6.QtGui import QImage

    line = np.arange(8) % 2 * 200 + 20
    for name, grey in (("horizontal", np.broadcast_to(line[:, None], (8, 8))),
                       ("vertical", np.broadcast_to(line[None, :], (8, 8)))):
        (root / name).mkdir(parents=True)
        data = np.ascontiguousarray(grey, dtype=np.uint8).tobytes()
        for i in range(n):
            assert QImage(data, 8, 8, 8, QImage.Format.Format_Grayscale8).save(str(root / name / f"{i}.png"))
    return root


@pytest.fixture
def qt_decoder():
    set_image_decoder(read_image_file)
    yield
    set_image_decoder(None)


def said(panel) -> str:
    return panel.task_error.text().replace("\u200b", "")  # the label breaks long paths at zero-width spaces


def test_image_folder_task_in_the_train_panel(qtbot, tmp_path, qt_decoder):
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.show()
    panel.task.setCurrentText("image-folder")
    assert panel.image_folder_row.isVisible() and panel.channels.isVisible() and panel.image_size.isVisible()
    assert not panel.text_row.isVisible()
    assert [panel.family.itemText(i) for i in range(panel.family.count())] == ["vit"]
    assert said(panel) == "Choose a folder of images, one sub-folder per class."
    assert panel.param_label.text() == "—"
    one = tmp_path / "one"
    (one / "cats").mkdir(parents=True)
    panel.image_folder.setText(str(one))
    assert said(panel).startswith(f"{one}: 1 class sub-folder(s)")

    root = stripes_folder(tmp_path / "stripes", n=5)
    panel.image_folder.setText(str(root))
    panel.channels.setCurrentText("1")
    assert said(panel) == ""
    cfg = panel.config()
    assert cfg.task_options == {"image_folder": str(root), "channels": 1}
    task = make_task(cfg.task, cfg.task_options)  # what the run builds (every image decoded)
    assert int(panel.param_label.text().replace(",", "")) == Transformer(model_config_for(cfg, task)).num_parameters()
    panel.image_size.setValue(4)
    panel.patch_size.setValue(3)
    assert said(panel) == "the images are 4 x 4: patch size 3 does not divide it"
    panel.patch_size.setValue(2)
    assert panel.config().task_options == {"image_folder": str(root), "channels": 1, "image_size": 4}
    args = panel.cli_args(tmp_path / "run")  # the run as train flags
    assert args[args.index("--task") + 1] == "image-folder" and args[args.index("--image-folder") + 1] == str(root)
    assert args[args.index("--image-size") + 1] == "4" and args[args.index("--channels") + 1] == "1"

    panel.image_size.setValue(0)
    panel.channels.setCurrentText("3")
    panel.set_config(cfg.__class__(**{**cfg.to_dict(), "task_options": {"image_folder": str(one), "channels": 1,
                                                                         "image_size": 4}}))
    assert (panel.image_folder.text(), panel.channels.currentText(), panel.image_size.value()) == (str(one), "1", 4)
