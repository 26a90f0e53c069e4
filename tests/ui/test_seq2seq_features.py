"""The Features panel on an encoder-decoder (issue 28), clicked: a dictionary at an encoder hook shows the lens on
the source's tokens, one at a decoder hook on [start] + the Model panel's target, each as core.features reads
it; "Lens on" switches between them; the logit attribution is refused in one line."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from desktop_app.core.features import attach, feature_activations, load_dictionary

from .test_features_panel import _dictionary, _lens_shown, _open_from_menu
from .test_seq2seq_whatif_lab import _folder, _window
from .walkthrough import choose_item, click_tab


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    return _folder(tmp_path_factory, "marian")


@pytest.fixture
def window(qtbot, marian_dir, isolated_user_files, error_watch):
    win, state = _window(qtbot, marian_dir, error_watch)  # a source and the target "le chien noir voit"
    yield win, state
    win.close()


def _l0_column(panel) -> list[int]:
    table = panel.tokens_table
    header = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    col = header.index("L0")
    return [int(table.item(r, col).text()) for r in range(table.rowCount())]


def test_the_lens_reads_the_source_at_encoder_hooks_and_the_target_at_decoder_hooks(qtbot, window, tmp_path,
                                                                                   monkeypatch, error_watch):
    win, state = window
    enc_dir = _dictionary(tmp_path / "enc", hook="encoder.blocks.1.resid_post", d_in=16, d_sae=24, seed=1)
    dec_dir = _dictionary(tmp_path / "dec", hook="decoder.blocks.0.resid_post", d_in=16, d_sae=24, seed=2)
    _open_from_menu(qtbot, win, state, monkeypatch, enc_dir)
    panel = win.slot("Features").panel
    assert panel.isVisible() and panel.isEnabled() and getattr(win.slot("Features"), "banner", None) is None
    assert panel.side.isVisible() and panel.side.currentData() == "encoder"
    _lens_shown(qtbot, panel)
    model, source, target = state.loaded.model, list(state.token_ids), list(state.decoder_ids)
    enc = attach(load_dictionary(enc_dir), state.loaded.config)
    ref = feature_activations(model, source, [enc])[0]
    assert panel.tokens_table.rowCount() == len(source)
    assert _l0_column(panel) == ref.l0.tolist() and sum(ref.l0.tolist()) > 0
    assert panel.strip.canvas.ids == source  # the strip shows the source

    # a decoder hook: the lens turns to the target, [start] + the Model panel's target
    _open_from_menu(qtbot, win, state, monkeypatch, dec_dir)
    assert panel.side.currentData() == "decoder" and len(state.dictionaries) == 2
    qtbot.waitUntil(lambda: panel.lens is not None and panel.lens_ids == target, timeout=20_000)
    dec = attach(load_dictionary(dec_dir), state.loaded.config)
    ref = feature_activations(model, source, [dec], decoder_ids=target)[0]
    assert panel.tokens_table.rowCount() == len(target) == ref.acts.shape[0]
    assert _l0_column(panel) == ref.l0.tolist() and panel.strip.canvas.ids == target
    assert [a.dictionary.hook for a, _run, _t in panel.lens] == ["decoder.blocks.0.resid_post"]

    # back to the source, clicked
    choose_item(qtbot, panel.side, "Source (encoder hooks)")
    qtbot.waitUntil(lambda: panel.lens is not None and panel.lens_ids == source, timeout=20_000)
    assert [a.dictionary.hook for a, _run, _t in panel.lens] == ["encoder.blocks.1.resid_post"]

    # the logit attribution says in one line that it is for one-stack models
    click_tab(qtbot, panel.tabs, "Attribution")
    qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "one-stack models" in panel.attr_status.text(), timeout=20_000)
    assert "\n" not in panel.attr_status.text()
    error_watch.assert_clean()


def test_the_train_panels_dictionary_mode_offers_an_encoder_decoders_encoder_hooks_only(qtbot, window):
    """Training a dictionary reads a text file as sources, so only encoder hooks can be trained (a decoder
    hook is refused by the trainer): the Train panel offers those, starting on the middle encoder layer's
    residual stream (it started on 'blocks.L.hook_resid_post', which an encoder-decoder does not have)."""
    win, state = window
    click_tab(qtbot, win.tabs, "Train")
    panel = win.slot("Train").panel
    panel.mode.setFocus()
    qtbot.keyClick(panel.mode, Qt.Key.Key_Down)  # a sparse dictionary
    hooks = [panel.dictionary.form.hook.itemText(i) for i in range(panel.dictionary.form.hook.count())]
    n = state.loaded.config.n_layers
    assert hooks and all(h.startswith("encoder.") for h in hooks)
    assert f"encoder.blocks.{n - 1}.resid_post" in hooks
    assert panel.dictionary.form.hook.currentText() == f"encoder.blocks.{n // 2}.resid_post"
