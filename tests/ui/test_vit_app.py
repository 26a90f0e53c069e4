"""A ViT as a whole-app citizen: opening one traces an image (never the text box), the Image panel's
digit is the input Attention and Layers show ([CLS] + patch tokens), and the Model panel says where
to give an image."""
from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt

pytest.importorskip("sklearn")

from desktop_app.core.checkpoints import new_model, save_model_folder  # noqa: E402
from desktop_app.core.families.vit import preset  # noqa: E402
from desktop_app.core.training.image_tasks import pixel_settings, preprocessor_config  # noqa: E402

from .walkthrough import ErrorWatch, click_panel_tab, open_window  # noqa: E402


@pytest.fixture
def vit_dir(tmp_path):
    """A small untrained digit ViT folder (8 x 8, one channel, patch 2 -> 16 patches, 2 layers x 3 heads)."""
    cfg = preset(d_model=24, n_layers=2, n_heads=3, d_ff=48, image_size=8, patch_size=2, num_channels=1,
                 vocab_size=10, lm_head=True, extra={"id2label": {str(i): f"digit {i}" for i in range(10)}})
    folder = tmp_path / "vit"
    save_model_folder(new_model(cfg, seed=0), folder, extra_files={
        "preprocessor_config.json": json.dumps(preprocessor_config(pixel_settings(8, 1))).encode()})
    return folder


def test_open_vit_pick_digit_attention_shows_patches(qtbot, vit_dir, monkeypatch):
    watch = ErrorWatch.install(monkeypatch)
    try:
        window, state = open_window(qtbot, vit_dir, text="The cat sat on the mat.", watch=watch)
        # the Model panel: the text box is not this model's input, and it says where to give an image
        model_panel = click_panel_tab(qtbot, window, "Model")
        assert "reads images" in model_panel.message_label.text() and "Image panel" in model_panel.message_label.text()
        assert model_panel.text_edit.isReadOnly()

        image_panel = click_panel_tab(qtbot, window, "Image")
        qtbot.waitUntil(lambda: image_panel.result is not None, timeout=20_000)
        image_panel.digit.setFocus()
        qtbot.keyClick(image_panel.digit, Qt.Key.Key_Up)  # held-out digit #1
        qtbot.waitUntil(lambda: "#1" in state.image_source and state.trace is not None
                        and state.trace_source == "image", timeout=20_000)
        assert state.token_strings()[:3] == ["[CLS]", "p0", "p1"] and len(state.token_ids) == 17

        attention = click_panel_tab(qtbot, window, "Attention")
        qtbot.waitUntil(lambda: attention.data is not None, timeout=20_000)
        assert attention.data.patterns[0].shape[-2:] == (17, 17) and len(attention.data.row_labels) == 17  # 1 + 16 patches
        assert attention.data.col_labels[:2] == ["[CLS]", "p0"] and attention.data.col_labels[-1] == "p15"
        qtbot.wait(200)
        window.grab().save("/tmp/vit_app_attention.png")

        layers = click_panel_tab(qtbot, window, "Layers")
        qtbot.waitUntil(lambda: layers.data is not None, timeout=20_000)
        assert layers.labels[0] == "[CLS]" and len(layers.labels) == 17
        watch.assert_clean()
    finally:
        watch.remove()
