"""walk3: a person's walk through a sparse dictionary's feature edits in What if, and what Generate's Data
button writes when the panel shows two things side by side (the distribution with and without the edits;
an encoder-decoder's step beside its cross-attention)."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog, QInputDialog

from desktop_app.core.features import SparseDictionary, save_dictionary

from .walkthrough import click_panel_tab, open_window

TEXT = "Alice was beginning to get very tired of sitting by her sister on the bank."


def _dictionary(folder: Path, hook: str = "blocks.2.hook_resid_post") -> Path:
    g = torch.Generator().manual_seed(0)
    save_dictionary(SparseDictionary(torch.randn(128, 64, generator=g) * 0.1, torch.randn(64, generator=g) * 0.1,
                                     torch.randn(64, 128, generator=g) * 0.1, torch.randn(128, generator=g) * 0.1,
                                     hook=hook), folder)
    return folder


@pytest.fixture
def demo_window(qtbot, model_dirs, isolated_user_files, error_watch):
    w, state = open_window(qtbot, model_dirs["demo"], text=TEXT, watch=error_watch)
    yield w, state
    error_watch.assert_clean()


def _clamp_a_feature(qtbot, w, state, monkeypatch, tmp_path, value: float = 40.0) -> int:
    """Open a dictionary from File > Open Sparse Features..., clamp the selected token's top feature from the
    lens' right-click menu; returns the feature's id."""
    folder = _dictionary(tmp_path / "sae")
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(folder)))
    with qtbot.waitSignal(state.dictionaries_changed, timeout=20_000):
        w.open_features_action.trigger()
    panel = w.slot("Features").panel
    qtbot.waitUntil(lambda: panel.lens is not None, timeout=20_000)
    table = panel.features_table
    k = int(table.item(0, 1).text())
    table.customContextMenuRequested.emit(table.visualRect(table.model().index(0, 1)).center())
    monkeypatch.setattr(QInputDialog, "getDouble", staticmethod(lambda *a: (value, True)))
    with qtbot.waitSignal(state.interventions_changed, timeout=20_000):
        next(a for a in panel.last_feature_menu.actions() if a.text().startswith("Clamp")).trigger()
    panel.last_feature_menu.close()  # as a click on its action does; the window's keys reach it again:
    w.activateWindow()  # (the offscreen platform leaves the focus on the closed menu's window)
    qtbot.waitUntil(lambda: QGuiApplication.focusWindow() is w.windowHandle(), timeout=5_000)
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=20_000)  # the text traced again with the edit
    return k


def _save_data(qtbot, monkeypatch, bar, path: Path) -> tuple[list[str], list[list[str]]]:
    """Click an export bar's Data button, the save dialog answering `path`; the CSV read back."""
    from desktop_app.ui.widgets import export

    monkeypatch.setattr(export, "ask_save_path", lambda *a, **k: str(path))
    qtbot.mouseClick(bar.buttons["Data"], Qt.MouseButton.LeftButton)
    with open(path, newline="") as f:
        header, *rows = list(csv.reader(f))
    return header, rows


def test_generates_csv_has_the_distribution_with_and_without_the_edits_as_shown(qtbot, demo_window, monkeypatch,
                                                                             tmp_path):
    """A clamped feature: Generate shows the edited model's bars beside the model as trained's; Data writes both,
    named (before: only the edited one, as p / p_model)."""
    from desktop_app.core.generation import GenerationSession, GenerationSettings, process_logits

    w, state = demo_window
    _clamp_a_feature(qtbot, w, state, monkeypatch, tmp_path)
    gen = click_panel_tab(qtbot, w, "Generate")
    qtbot.mouseClick(gen.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: gen.session is not None and not gen.busy and "log p" in gen.plain_label.text(),
                    timeout=20_000)
    assert gen.plain_box.isVisible()
    header, rows = _save_data(qtbot, monkeypatch, gen.export_bar, tmp_path / "generate.csv")
    assert header == ["section", "rank_or_step", "token_id", "token", "p_with_edits", "p_model_with_edits", "kept",
                      "picked", "p_without_edits", "p_model_without_edits"]
    dist = [r for r in rows if r[0] == "distribution"]
    vocab = state.loaded.config.vocab_size
    assert len(dist) == vocab and all(len(r) == len(header) for r in rows)
    ids = gen.session.ids(gen.session.current)
    plain = process_logits(GenerationSession(state.loaded, ids, GenerationSettings()).root.next_logits)
    edited = process_logits(GenerationSession(state.loaded, ids, GenerationSettings(),
                                              interventions=list(state.interventions)).root.next_logits)
    by_id = {int(r[2]): r for r in dist}
    got_plain = np.array([float(by_id[t][8]) for t in range(vocab)])
    got_edited = np.array([float(by_id[t][4]) for t in range(vocab)])
    np.testing.assert_allclose(got_plain, plain.probs.numpy(), atol=1e-5)
    np.testing.assert_allclose(got_edited, edited.probs.numpy(), atol=1e-5)
    assert not np.allclose(got_plain, got_edited, atol=1e-3)  # the edit changes the distribution
    step = [r for r in rows if r[0] == "step"]
    assert len(step) == 1 and step[0][8:] == ["", ""]
    from desktop_app.ui.widgets.export import export_view

    export_view(gen, tmp_path / "generate.npz")  # (Data's other format: the same two distributions)
    arrays = np.load(tmp_path / "generate.npz")
    np.testing.assert_allclose(arrays["probs_without_edits"], plain.probs.numpy(), atol=1e-6)
    np.testing.assert_allclose(arrays["probs"], edited.probs.numpy(), atol=1e-5)


def test_generates_csv_has_an_encoder_decoders_cross_attention_as_shown(qtbot, monkeypatch, tmp_path):
    """An encoder-decoder's step: the bars beside the step's cross-attention over the source; Data writes the
    map on show (the layer chosen, each head and their mean, per source token) after the distribution."""
    from tiny_models import tiny_model

    from .walkthrough import show_generation_panel

    loaded = tiny_model("the cat sat on the mat and the dog sat on the log. ", "marian",
                        specials=["<pad>", "[START]", "[END]"], name="marian-test", n_decoder_layers=2,
                        context_length=32, init_std=0.3, pad_token_id=0, decoder_start_token_id=1, eos_token_id=2)
    p = show_generation_panel(qtbot, loaded, size=(1200, 700))
    p.prompt.selectAll()
    qtbot.keyClicks(p.prompt, "the cat sat")
    qtbot.mouseClick(p.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: p.session is not None and p.session.current.depth == 1 and not p.busy, timeout=15_000)
    p.cross_view.layer.setCurrentIndex(0)  # decoder layer 0, as a person picks it
    header, rows = _save_data(qtbot, monkeypatch, p.export_bar, tmp_path / "generate.csv")
    assert header[:8] == ["section", "rank_or_step", "token_id", "token", "p", "p_model", "kept", "picked"]
    assert header[8:] == ["cross_layer", "cross_head", "source_position", "source_token", "cross_attention"]
    src = p.session.source
    cross = [r for r in rows if r[0] == "cross_attention"]
    assert len(cross) == 5 * len(src) and all(len(r) == len(header) for r in rows)
    assert {r[8] for r in cross} == {"decoder layer 0"}
    want = p.session.cross_attention()[0].numpy()  # [H, S] of the step on show, layer 0
    got = np.array([[float(r[12]) for r in cross if r[9] == str(h)] for h in range(4)])
    np.testing.assert_allclose(got, want, atol=1e-5)
    mean = [float(r[12]) for r in cross if r[9] == "mean"]
    np.testing.assert_allclose(mean, want.mean(0), atol=1e-5)
    assert [r[11] for r in cross[:len(src)]] == p.state.token_strings(src)
    assert len([r for r in rows if r[0] == "distribution"]) == loaded.config.vocab_size
    from desktop_app.ui.widgets.export import export_view

    export_view(p, tmp_path / "generate.npz")
    np.testing.assert_allclose(np.load(tmp_path / "generate.npz")["cross_attention"][:4], want, atol=1e-6)


CTRL = Qt.KeyboardModifier.ControlModifier


def _press_ctrl_return(qtbot, w) -> None:
    """Ctrl+Return where the focus is, as a person presses it (the window active)."""
    qtbot.keyClick(w.focusWidget() or w, Qt.Key.Key_Return, CTRL)


def test_results_typed_over_say_they_are_out_of_date(qtbot, demo_window, monkeypatch, tmp_path):
    """A clamped feature's attribution, then a token typed in the box: the bars are still the old token's, and the
    line says so (before: it kept the old result's line, as if it were the typed token's); Ctrl+Return attributes
    the typed one. The same for activation patching's texts; typed back, the result's line comes back."""
    from .walkthrough import type_into

    w, state = demo_window
    w.activateWindow()
    k = _clamp_a_feature(qtbot, w, state, monkeypatch, tmp_path)
    panel = click_panel_tab(qtbot, w, "What if")
    qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None and not panel._dla_running(), timeout=20_000)
    first = panel.dla_chart.attribution
    line = panel.dla_status.text()
    assert line.startswith("logit") and f"edits: sae: clamp f{k}=40" in line and "ablated" not in line
    top = state.token_strings([first.token_id])[0]
    type_into(qtbot, panel.token_edit, " the")
    assert panel.dla_chart.attribution is first
    assert panel.dla_status.text() == (f"Out of date: the bars are for token {top!r} (#{first.token_id}) at position "
                                       f"{first.position}; Attribute (Ctrl+Return) for the position and token typed.")
    panel.token_edit.setFocus()
    _press_ctrl_return(qtbot, w)
    qtbot.waitUntil(lambda: panel.dla_chart.attribution is not first and not panel._dla_running(), timeout=20_000)
    (the,) = state.loaded.tokenizer.encode(" the")
    assert panel.dla_chart.attribution.token_id == the and panel.dla_status.text().startswith("logit")

    click_panel_tab(qtbot, w, "What if")
    from .walkthrough import click_tab
    click_tab(qtbot, panel.tabs, "Activation patching")
    type_into(qtbot, panel.clean_edit, "The cat sat on the mat")
    type_into(qtbot, panel.corrupted_edit, "The dog sat on the mat")
    type_into(qtbot, panel.answer_edit, "#5")
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.patching is not None and panel.run_button.isEnabled(), timeout=30_000)
    result = panel.patch_status.text()
    assert result.startswith("clean ") and f"edits: sae: clamp f{k}=40" in result
    type_into(qtbot, panel.clean_edit, "The cow sat on the mat")
    assert panel.patch_status.text() == ("Out of date: the maps are for clean 'The cat sat on the mat', corrupted "
                                         "'The dog sat on the mat', answer '#5'; Run (Ctrl+Return) for the texts "
                                         "typed.")
    type_into(qtbot, panel.clean_edit, "The cat sat on the mat")
    assert panel.patch_status.text() == result


def test_ctrl_return_applies_the_steer_and_ablates_on_their_tabs(qtbot, demo_window):
    """Steer's Apply and Ablate's Ablate take Ctrl+Return like Attribute and Run (before: nothing happened), each
    while its tab is on show; Help > Keyboard Shortcuts lists them."""
    from .walkthrough import click_tab, type_into

    w, state = demo_window
    w.activateWindow()
    qtbot.waitUntil(lambda: QGuiApplication.focusWindow() is w.windowHandle(), timeout=5_000)
    panel = click_panel_tab(qtbot, w, "What if")
    click_tab(qtbot, panel.tabs, "Ablate")
    qtbot.waitUntil(panel.ablate_button.isVisible, timeout=5_000)  # (a panel built at its tab's click: shown next)
    panel.ablate_kind.setFocus()  # (a kind chosen)
    with qtbot.waitSignal(state.interventions_changed, timeout=5_000):
        _press_ctrl_return(qtbot, w)
    assert [iv.target for iv in state.interventions] == ["blocks.0.attn.head.0"]
    click_tab(qtbot, panel.tabs, "Steer")
    type_into(qtbot, panel.towards_edit, "Love")
    type_into(qtbot, panel.away_edit, "Hate")
    panel.scale_slider.setFocus()
    with qtbot.waitSignal(state.interventions_changed, timeout=20_000):
        _press_ctrl_return(qtbot, w)
    assert any(iv.label.startswith("steer L2") for iv in state.interventions)
    assert len(state.interventions) == 2  # (the ablation stays: Ctrl+Return on the Steer tab did not ablate again)
    from desktop_app.ui.dialogs import ShortcutsDialog

    dialog = ShortcutsDialog(w.shortcut_actions(), w, w.panel_shortcuts())
    rows = {(dialog.table.item(r, 0).text(), dialog.table.item(r, 1).text()) for r in range(dialog.table.rowCount())}
    dialog.deleteLater()
    assert {("What if: Apply the steer", "Ctrl+Return"), ("What if: Ablate", "Ctrl+Return")} <= rows, sorted(rows)


def test_the_features_attribution_tab_clicked_while_the_lens_is_read_fills_when_it_comes(qtbot, demo_window,
                                                                                         monkeypatch, tmp_path):
    """A feature clamped, the Features panel reads the lens again (held here in its worker); its Attribution tab
    clicked meanwhile: the bars come once the lens does (before: empty axes and no line until Attribute)."""
    import threading

    from desktop_app.ui.panels import features as features_module

    from .walkthrough import click_tab

    w, state = demo_window
    real, release, calls = features_module.lens_on, threading.Event(), []

    def held(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:  # (the first lens, before the edit, runs through)
            release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(features_module, "lens_on", held)
    try:
        k = _clamp_a_feature(qtbot, w, state, monkeypatch, tmp_path)
        panel = w.slot("Features").panel
        qtbot.waitUntil(lambda: len(calls) == 2, timeout=20_000)  # the edited model's lens, held
        assert panel.lens is None
        click_tab(qtbot, panel.tabs, "Attribution")
        assert panel.attr_chart.attribution is None
    finally:
        release.set()  # (the worker never waits past the test)
    qtbot.waitUntil(lambda: panel.attr_chart.attribution is not None, timeout=20_000)
    assert panel.attr_status.text().startswith("The ") and "active features" in panel.attr_status.text() and panel.lens is not None
    assert k in panel.attr_chart.attribution.features.tolist()  # clamped to 40 at every position: active
