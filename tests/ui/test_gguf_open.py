"""A GGUF file opens as a person opens one: File > Open GGUF File… (the dialog filters *.gguf), a drop,
Open Recent; the Model panel lists its tensor types per kind and its chat template, and the status bar
says the model shown is dequantized."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

pytest.importorskip("gguf")

from desktop_app.core.checkpoints import new_model  # noqa: E402
from desktop_app.core.config import ModelConfig  # noqa: E402
from desktop_app.core.formats.gguf_export import save_gguf  # noqa: E402
from desktop_app.core.tokenizer import train_bpe  # noqa: E402
from desktop_app.ui import main_window  # noqa: E402
from desktop_app.ui import settings as app_settings  # noqa: E402
from desktop_app.ui.main_window import MainWindow, model_folder_from_mime  # noqa: E402
from desktop_app.ui.state import AppState  # noqa: E402

TEXT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-q8.gguf"
    tok = train_bpe([TEXT, "a dog ran in the park", "hello world"] * 20, 300)
    cfg = ModelConfig.llama(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96,
                            context_length=64)
    save_gguf(new_model(cfg, seed=0), path, tok, kind="q8_0")
    return path


@pytest.fixture
def window(qtbot, isolated_user_files):
    w = MainWindow(AppState())
    qtbot.addWidget(w)
    w.show()
    return w


def test_file_open_gguf_shows_types_and_says_dequantized(qtbot, window, gguf_file, monkeypatch, tmp_path):
    asked = {}

    def get_open_file_name(parent, title, start, filters):
        asked["filters"] = filters
        return str(gguf_file), filters.split(";;")[0]

    monkeypatch.setattr(main_window.QFileDialog, "getOpenFileName", get_open_file_name)
    window.state.set_text(TEXT)
    with qtbot.waitSignal(window.state.trace_changed, timeout=20000):
        window.open_gguf_action.trigger()
    assert "*.gguf" in asked["filters"]
    assert window.state.loaded.path == gguf_file
    assert "dequantized from MOSTLY_Q8_0" in window.model_label.text()
    assert "attention: Q8_0 x 8" in window.model_label.toolTip()
    panel = window.panel("Model")
    assert panel.summary_value("File") == "GGUF MOSTLY_Q8_0, dequantized to the dtype above"
    assert panel.summary_value("Tensor types").splitlines() == [
        "embeddings: Q8_0 x 1", "attention: Q8_0 x 8", "MLP: Q8_0 x 6", "norms: F32 x 5", "output: Q8_0 x 1"]
    window.grab().save(str(tmp_path / "gguf-open.png"))
    # Open Recent lists the file, enabled
    window._fill_recent_menu()
    recent = [a for a in window.recent_menu.actions() if a.text() == str(gguf_file.resolve())]
    assert recent and recent[0].isEnabled()
    assert app_settings.recent_models()[0] == str(gguf_file.resolve())


def test_dropping_a_gguf_file_opens_it(qtbot, window, gguf_file):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(gguf_file))])
    assert model_folder_from_mime(mime) == str(gguf_file)
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(window.state.model_changed, timeout=20000) as sig:
        window.dropEvent(event)
    assert Path(sig.args[0].path) == gguf_file and event.isAccepted()
    assert sig.args[0].gguf.dequantized


def test_a_gguf_beyond_float16s_range_is_refused_in_float16_and_the_model_shown_stays(qtbot, window, tmp_path,
                                                                                       monkeypatch):
    """Device > Compute dtype > float16 on a float32 GGUF holding 1e5: the dialog names the file and the tensor
    in one line, and the float32 model stays open (checkpoints.range_problem, as for a model folder)."""
    import gguf as gguf_lib
    import numpy as np
    import torch
    from PySide6.QtWidgets import QMessageBox

    tok = train_bpe([TEXT, "a dog ran in the park"] * 20, 280)
    cfg = ModelConfig.llama(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96,
                            context_length=64)
    path = tmp_path / "tiny-f32.gguf"
    save_gguf(new_model(cfg, seed=0), path, tok, kind="f32")
    reader = gguf_lib.GGUFReader(path)
    start = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight").data_offset
    del reader
    data = bytearray(path.read_bytes())
    data[start:start + 4] = np.float32(1e5).tobytes()
    path.write_bytes(bytes(data))
    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append((title, text)))
    window.state.set_text(TEXT)
    with qtbot.waitSignal(window.state.model_changed, timeout=20000):
        window.state.open_model(path)
    assert window.state.loaded.model.dtype == torch.float32
    with qtbot.waitSignal(window.state.model_load_failed, timeout=20000):
        window.dtype_actions["float16"].trigger()  # the menu item, as a click on it does
    (title, text), = shown
    first_line = text.split("\n\n")[0]
    assert first_line.startswith(str(path)) and "\n" not in first_line, text
    assert "'blk.1.ffn_down.weight' holds values beyond float16's range" in first_line
    assert "stays open" in text
    assert window.state.loaded.path == path and window.state.loaded.model.dtype == torch.float32
    assert window.state.loaded.model.blocks[1].mlp.down.weight[0, 0] == 1e5
    # the setting is the model's on show again, and the menu says so (float16 was left checked, and asked of
    # every model opened next)
    assert window.state.dtype is None and window.dtype_actions["auto"].isChecked()
    assert not window.dtype_actions["float16"].isChecked()
    assert window.isVisible()
