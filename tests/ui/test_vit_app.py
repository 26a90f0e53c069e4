"""A ViT as a whole-app citizen: opening one traces an image (never the text box), the Image panel's
digit is the input Attention and Layers show ([CLS] + patch tokens), and the Model panel says where
to give an image."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from digit_vit import skip_without_digits  # noqa: E402

skip_without_digits()

from digit_vit import save_digit_vit  # noqa: E402

from .walkthrough import ErrorWatch, click_panel_tab, open_window, type_into  # noqa: E402


@pytest.fixture
def vit_dir(tmp_path):
    """A small untrained digit ViT folder (8 x 8, one channel, patch 2 -> 16 patches, 2 layers x 3 heads)."""
    return save_digit_vit(tmp_path / "vit")


def test_open_vit_pick_digit_attention_shows_patches(qtbot, vit_dir, monkeypatch):
    watch = ErrorWatch.install(monkeypatch)
    try:
        window, state = open_window(qtbot, vit_dir, text="The cat sat on the mat.", watch=watch)
        # the Model panel: the text box is not this model's input, and it says where to give an image
        model_panel = click_panel_tab(qtbot, window, "Model")
        placeholder = model_panel.text_edit.placeholderText()
        assert "reads images" in placeholder and "Image panel" in placeholder
        assert model_panel.text_edit.isReadOnly() and model_panel.text_edit.toPlainText() == ""
        assert state.text == "The cat sat on the mat."  # kept for the next text model
        qtbot.waitUntil(lambda: "[CLS] + 16 patches of held-out digit #0" in model_panel.count_label.text(),
                        timeout=20_000)
        assert model_panel.message_label.text() == ""

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

        layers = click_panel_tab(qtbot, window, "Layers")
        qtbot.waitUntil(lambda: layers.data is not None, timeout=20_000)
        assert layers.labels[0] == "[CLS]" and len(layers.labels) == 17
        watch.assert_clean()
    finally:
        watch.remove()


def test_train_panel_offers_digits_with_vit_only(qtbot, vit_dir, monkeypatch, isolated_user_files):
    from desktop_app.app.training import families_for_task

    window, state = open_window(qtbot, vit_dir)
    panel = click_panel_tab(qtbot, window, "Train")
    families = lambda: [panel.family.itemText(i) for i in range(panel.family.count())]  # noqa: E731
    qtbot.waitUntil(panel.isVisible, timeout=10_000)  # the tab shows the built panel once events run
    assert families() == families_for_task("motif") and not panel.patch_size.isVisible()
    panel.task.setFocus()
    qtbot.keyClick(panel.task, Qt.Key.Key_End)  # the last task: digits (typing its name races the search timeout)
    assert panel.task.currentText() == "digits"
    assert families() == ["vit"] and panel.family.currentText() == "vit"
    assert panel.patch_size.isVisible() and not panel.context.isVisible() and not panel.positions.isVisible()
    assert not panel.model_error.isVisible() and not panel.task_error.isVisible()
    assert panel.param_label.text().replace(",", "").isdigit()
    cfg = panel.config()
    assert cfg.family == "vit" and cfg.model["patch_size"] == 2 and "context_length" not in cfg.model
    type_into(qtbot, panel.patch_size, "3")  # 8 x 8 images: 3 does not divide 8
    assert panel.task_error.isVisible() and not panel.start_button.isEnabled()
    type_into(qtbot, panel.patch_size, "2")
    panel.task.setFocus()
    qtbot.keyClick(panel.task, Qt.Key.Key_Home)  # back to a text task (motif): the text families again
    assert panel.task.currentText() == "motif"
    assert families() == families_for_task("motif") and panel.family.currentText() != "vit"


@pytest.mark.slow
def test_train_digits_use_model_image_panel_predicts(qtbot, vit_dir, monkeypatch, isolated_user_files):
    """A few steps of the digits task from the Train panel, Use this model, the Image panel's prediction (~20 s)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    watch = ErrorWatch.install(monkeypatch)
    try:
        window, state = open_window(qtbot, vit_dir, watch=watch)
        panel = click_panel_tab(qtbot, window, "Train")
        panel.task.setFocus()
        qtbot.keyClick(panel.task, Qt.Key.Key_End)  # digits
        for field, value in ((panel.layers, "1"), (panel.heads, "2"), (panel.d_model, "16"), (panel.d_ff, "32"),
                             (panel.batch_size, "32"), (panel.steps, "20"), (panel.eval_every, "10"),
                             (panel.checkpoint_every, "10")):
            type_into(qtbot, field, value)
        assert panel.start_button.isEnabled(), panel.start_button.toolTip()
        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not panel.running, timeout=180_000)
        assert panel.use_button.isEnabled(), panel.status_label.text()
        with qtbot.waitSignal(state.model_changed, timeout=30_000):
            qtbot.mouseClick(panel.use_button, Qt.MouseButton.LeftButton)
        assert state.loaded.config.input_kind == "patches" and state.loaded.config.n_layers == 1
        image_panel = click_panel_tab(qtbot, window, "Image")
        qtbot.waitUntil(lambda: image_panel.result is not None and bool(image_panel.prediction.text()), timeout=30_000)
        assert len(image_panel.prediction.text().splitlines()) == 5 and "%" in image_panel.prediction.text()
        qtbot.waitUntil(lambda: state.trace is not None and len(state.token_ids) == 17, timeout=30_000)
        watch.assert_clean()
    finally:
        watch.remove()


def test_lipschitz_panel_measures_a_vit_layer_on_image_patches(qtbot, vit_dir, monkeypatch):
    watch = ErrorWatch.install(monkeypatch)
    try:
        window, state = open_window(qtbot, vit_dir, watch=watch)
        panel = click_panel_tab(qtbot, window, "Lipschitz")
        labels = [panel.data.itemText(i) for i in range(panel.data.count())]
        assert "image patches" in labels
        panel.data.setCurrentIndex(labels.index("image patches"))
        type_into(qtbot, panel.lengths, "2,5,9,17")
        type_into(qtbot, panel.samples, "2")
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: bool(panel.runs) and panel.runs[-1].finished, timeout=60_000)
        result = panel.runs[-1].result
        assert [r.n for r in result.lengths] == [2, 5, 9, 17] and "image" in result.label
        watch.assert_clean()
    finally:
        watch.remove()


def test_ablations_apply_to_the_image_trace(qtbot, vit_dir, monkeypatch):
    """The Attention panel's ablations edit a ViT's image trace as they edit a text's."""
    import torch

    from desktop_app.app.tracing import trace_image

    watch = ErrorWatch.install(monkeypatch)
    try:
        window, state = open_window(qtbot, vit_dir, watch=watch)
        qtbot.waitUntil(lambda: state.trace is not None and state.image is not None, timeout=20_000)
        clean = state.trace
        attention = click_panel_tab(qtbot, window, "Attention")
        menu = attention.ablation_menu(0, 1)  # what a right-click on head 0.1 opens
        head_menu = next(a.menu() for a in menu.actions() if a.menu() and "head 0.1" in a.text())
        zero = next(a for a in head_menu.actions() if "zero" in a.text().lower())
        zero.trigger()
        qtbot.waitUntil(lambda: state.trace is not clean and state.trace is not None, timeout=20_000)
        assert state.trace_source == "image" and len(state.token_ids) == 17
        assert torch.count_nonzero(state.trace["blocks.0.attn.z"][0, 1]) == 0  # head 1's output is gone
        assert not torch.equal(state.trace["blocks.1.resid_post"], clean["blocks.1.resid_post"])
        watch.assert_clean()
    finally:
        watch.remove()
    # mean-ablation over the image's own positions; resampling (from another text) is one clear line
    from desktop_app.core.interventions import Intervention
    _, mean = trace_image(state.loaded, state.image, [Intervention("blocks.0.mlp.out", "mean")])
    _, plain = trace_image(state.loaded, state.image)
    expected = plain["blocks.0.mlp.out"][0].mean(0, keepdim=True).expand(17, -1)
    assert torch.allclose(mean["blocks.0.mlp.out"][0], expected, atol=1e-6)  # every position: the image's mean
    with pytest.raises(ValueError, match="an image model has none"):
        trace_image(state.loaded, state.image, [Intervention("blocks.0.mlp.out", "resample", source_ids=(1, 2))])


def test_every_tab_opens_on_a_vit_without_errors(qtbot, vit_dir, monkeypatch):
    watch = ErrorWatch.install(monkeypatch)
    try:
        window, state = open_window(qtbot, vit_dir, watch=watch)
        qtbot.waitUntil(lambda: state.trace is not None, timeout=20_000)
        bar = window.tabs.tabBar()
        for title in [bar.tabText(i) for i in range(bar.count())]:
            click_panel_tab(qtbot, window, title)
            qtbot.wait(300)
        watch.assert_clean()
    finally:
        watch.remove()


def test_generate_and_what_if_say_what_a_vit_cannot_do(qtbot, vit_dir, monkeypatch):
    watch = ErrorWatch.install(monkeypatch)
    try:
        window, _state = open_window(qtbot, vit_dir, text="The cat sat on the mat.", watch=watch)
        generate = click_panel_tab(qtbot, window, "Generate")
        assert "vision transformer" in generate.status.text() and "Image panel" in generate.status.text()
        assert not generate.step_button.isEnabled()
        whatif = click_panel_tab(qtbot, window, "What if")
        assert "vision transformer" in whatif.dla_status.text()
        assert not whatif.attribute_button.isEnabled() and not whatif.run_button.isEnabled()
        watch.assert_clean()
    finally:
        watch.remove()
