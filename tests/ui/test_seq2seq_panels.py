"""Encoder-decoders in the app (issue 28), clicked: the Model panel's Target box and coloured chips, the
Attention panel's three kinds of attention (encoder self-attention, causal decoder self-attention,
cross-attention) in its views and exports, a result computed for an old target never shown, and every
other tab safe with a Marian model open."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from desktop_app.core.checkpoints import new_model, save_model_folder
from desktop_app.ui.panels import PANELS
from translate_models import save_translate_model

from .walkthrough import ErrorWatch, click_panel_tab, open_window, shown_tab_titles

SOURCE = "the black dog sees a white cow"
TARGET = "le chien noir voit une vache blanche"


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    """A tiny Marian model (random weights) with the translate task's word tokenizer."""
    folder = tmp_path_factory.mktemp("marian") / "m"
    save_translate_model(folder, d_model=16, n_layers=2, n_decoder_layers=1, n_heads=2, d_ff=32, context_length=24,
                         init_std=0.2)
    return folder


@pytest.fixture
def window(qtbot, marian_dir, isolated_user_files):
    win, state = open_window(qtbot, marian_dir, text=SOURCE)
    yield win, state
    win.close()


def _type_target(qtbot, panel, state, text: str) -> None:
    """Click into the Model panel's Target box, replace its text by typing, wait for the new trace."""
    edit = panel.target_edit
    qtbot.mouseClick(edit.viewport(), Qt.MouseButton.LeftButton)
    qtbot.keyClick(edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    with qtbot.waitSignal(state.trace_changed, timeout=30_000):
        qtbot.keyClicks(edit, text)
    qtbot.waitUntil(lambda: state._trace_job is None and state.target == text, timeout=30_000)


def test_typing_a_target_shows_both_sequences_with_the_target_coloured(qtbot, window):
    win, state = window
    panel = click_panel_tab(qtbot, win, "Model")
    assert panel.target_edit.isVisible() and panel.target_strip.isVisible()
    assert panel.summary_value("Encoder layers").startswith("2") and panel.summary_value("Decoder layers").startswith("1")
    _type_target(qtbot, panel, state, TARGET)
    tok = state.loaded.tokenizer
    assert state.token_ids == tok.encode(SOURCE)
    assert state.decoder_ids == [1] + tok.encode(TARGET)
    # the source's chips, and the decoder's input: the start token (no colour), then each target token
    # coloured by softmax(logits row i)[target token i]
    assert panel.token_strip.canvas.strings == state.token_strings(state.token_ids)
    assert panel.target_strip.canvas.strings == state.token_strings(state.decoder_ids)
    logits = state.trace["logits"][0].double()
    p = logits.softmax(-1)
    expected = [p[i, t].item() for i, t in enumerate(state.decoder_ids[1:])]
    values = panel.target_strip.canvas.values
    assert np.isnan(values[0]) and np.allclose(values[1:], expected, atol=1e-6)
    assert "perplexity" in panel.target_count.text()
    # the table exported holds both sequences
    head, rows = panel.tokens_view.csv_table()
    assert head[0] == "sequence" and [r[0] for r in rows].count("decoder input") == len(state.decoder_ids)


def test_a_result_computed_for_the_old_target_is_never_shown(qtbot, window):
    import threading

    win, state = window
    panel = click_panel_tab(qtbot, win, "Model")
    _type_target(qtbot, panel, state, "le chien")
    old_key, old_decoder = state.key, list(state.decoder_ids)
    release, got = threading.Event(), []

    def slow():
        release.wait(30)
        return "for the old target"

    job = state.run(slow, on_result=got.append)
    try:
        _type_target(qtbot, panel, state, TARGET)
    finally:
        release.set()
    qtbot.waitUntil(lambda: job.done, timeout=30_000)
    qtbot.wait(50)  # (any queued delivery would arrive now)
    assert got == [] and not state.is_current(old_key)
    assert state.key.model == old_key.model and state.key.input > old_key.input
    assert state.decoder_ids != old_decoder and panel.target_strip.canvas.strings == state.token_strings(state.decoder_ids)


KINDS = {"encoder": ("source", "source"), "decoder": ("decoder", "decoder"), "cross": ("decoder", "source")}


def test_each_attention_kind_is_picked_on_the_combo_and_every_view_shows_its_own_tokens(qtbot, window, tmp_path,
                                                                                        monkeypatch):
    import desktop_app.ui.widgets.export as export_module

    win, state = window
    _type_target(qtbot, click_panel_tab(qtbot, win, "Model"), state, TARGET)
    panel = click_panel_tab(qtbot, win, "Attention")
    combo = panel.kind_combo
    qtbot.waitUntil(combo.isVisible, timeout=10_000)  # (the panel shows once its tab's page is laid out)
    asked = []
    monkeypatch.setattr(export_module, "ask_save_path",
                        lambda parent, title, name, filters: asked.append(name) or str(tmp_path / name))
    seqs = {"source": state.token_strings(state.token_ids), "decoder": state.token_strings(state.decoder_ids)}
    combo.setFocus()
    qtbot.keyClick(combo, Qt.Key.Key_Home)
    for i, (kind, (rows_of, cols_of)) in enumerate(KINDS.items()):
        if i:
            qtbot.keyClick(combo, Qt.Key.Key_Down)  # the next kind, as the keyboard picks it
        assert combo.currentData() == kind
        qtbot.waitUntil(lambda: panel.screenshot_ready() and panel.data is not None and panel.data.aggregated,
                        timeout=30_000)
        rows, cols = seqs[rows_of], seqs[cols_of]
        # the heatmap: one head of layer 0, its rows and columns the kind's sequences
        panel.show_view("attention")
        hm = panel.heatmap
        qtbot.waitUntil(lambda: hm.values.shape == (len(rows), len(cols)), timeout=10_000)
        name = f"{'encoder' if kind == 'encoder' else 'decoder'}.blocks.0.{'cross_attn' if kind == 'cross' else 'attn'}"
        np.testing.assert_allclose(hm.values, state.trace[name + ".pattern"][0, 0].float().numpy(), atol=1e-6)
        assert hm.row_labels == rows and hm.col_labels == cols
        assert panel.data.causal == (kind == "decoder") and panel.data.n_layers == (2 if kind == "encoder" else 1)
        assert (panel.data.mask is not None) == (kind == "decoder")  # the causal mask, drawn as such
        assert panel.tokens.canvas.strings == rows  # a selection picks a query
        # the model view: a row of thumbnails per layer of that stack
        panel.show_view("model-view")
        qtbot.waitUntil(lambda: panel.model_view.filled_layers() == panel.data.n_layers, timeout=10_000)
        # the head view: queries on the left, keys on the right (cross: target tokens to source tokens)
        panel.show_view("head-view")
        hv = panel.head_view
        assert hv.pattern.shape == (2, len(rows), len(cols)) and hv.offset == 0
        assert hv.left_axis.labels[:len(rows)] == rows and hv.right_axis.labels == cols
        # rollout: none for cross-attention, and the view says so
        panel.show_view("rollout")
        if kind == "cross":
            assert "no rollout" in panel.rollout_map.plot.titleLabel.text
        else:
            assert panel.rollout_map.values.shape == (len(rows), len(rows))
        panel.show_view("head-stats")
        assert panel.stats_map.values.shape == panel.data.stats.entropy.shape
        # export: the buttons write files named after the kind
        panel.show_view("attention")
        for text in ("PNG", "SVG", "Data"):
            qtbot.mouseClick(panel.export_bar.buttons[text], Qt.MouseButton.LeftButton)
        assert asked[-3:] == [f"{kind}-attention-L0-H0.{x}" for x in ("png", "svg", "csv")]
        assert all((tmp_path / n).stat().st_size > 100 for n in asked[-3:])


def _shown_text(panel) -> str:
    from PySide6.QtWidgets import QLabel

    return " ".join(w.text() for w in panel.findChildren(QLabel) if w.isVisible())


def test_every_tab_is_safe_with_an_encoder_decoder_open(qtbot, marian_dir, isolated_user_files, monkeypatch):
    """Open a Marian folder, click every tab: no panel fails or reports an error, and each one shows the model
    (every panel reads encoder-decoders: Layers, What if, Lipschitz in tests/ui/test_seq2seq_lipschitz_layers.py;
    Dynamics, Features in tests/ui/test_seq2seq_dynamics.py, test_seq2seq_features.py)."""
    watch = ErrorWatch.install(monkeypatch)
    win, state = open_window(qtbot, marian_dir, text=SOURCE, watch=watch)
    try:
        titles = shown_tab_titles(win.tabs)
        assert titles == [title for title, _, _ in PANELS if title != "Image"]  # (Image: a model that takes images)
        for title in titles:
            panel = click_panel_tab(qtbot, win, title)
            slot = win.slot(title)
            assert slot.error is None, f"{title} panel failed to build:\n{slot.error}"
            qtbot.waitUntil(panel.isVisible, timeout=10_000)
            qtbot.wait(200)  # (a worker started by showing it reports meanwhile)
            assert panel.isEnabled() and _shown_text(panel).strip()
        watch.assert_clean()
        # another kind of model: the Target box goes
        from desktop_app.core.config import ModelConfig
        from desktop_app.core.tokenizer import char_tokenizer

        tok = char_tokenizer("abcdefghijklmnopqrstuvwxyz ")
        cfg = ModelConfig.gpt2(vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=64)
        save_model_folder(new_model(cfg, seed=0), isolated_user_files / "gpt2", tokenizer=tok)
        with qtbot.waitSignal(state.model_changed, timeout=30_000):
            win.open_model(isolated_user_files / "gpt2")
        assert not win.slot("Model").panel.target_edit.isVisibleTo(win.slot("Model").panel)
    finally:
        win.close()


def test_the_target_comes_back_with_the_workspace(qtbot, window, tmp_path):
    """Issue 41: the target typed in the Model panel is saved with the workspace (and the last session) and
    brought back, shown in the Target box and traced; before, last-session.json had no target."""
    from desktop_app.ui.workspace import load_workspace, save_workspace

    win, state = window
    panel = click_panel_tab(qtbot, win, "Model")
    _type_target(qtbot, panel, state, TARGET)
    path = tmp_path / "ws.json"
    save_workspace(path, win.capture_workspace())
    assert load_workspace(path).target == TARGET
    from desktop_app.ui.main_window import MainWindow
    from desktop_app.ui.state import AppState

    state2 = AppState()
    win2 = MainWindow(state2)
    qtbot.addWidget(win2)
    win2.show()
    with qtbot.waitSignal(state2.model_changed, timeout=30_000):
        assert win2.open_workspace(path)
    qtbot.waitUntil(lambda: state2.trace is not None and state2.decoder_ids == state.decoder_ids, timeout=30_000)
    assert state2.target == TARGET
    assert click_panel_tab(qtbot, win2, "Model").target_edit.toPlainText() == TARGET
    win2.close()


def test_the_what_if_strip_names_each_heads_stack(qtbot, window):
    """Issue 41: a zeroed cross-attention head read "zero L1H2", like a self-attention head; the chips name
    the stack and a cross-attention head as What if's bars do (L0xH1)."""
    from PySide6.QtWidgets import QLabel

    from desktop_app.core.interventions import Intervention

    win, state = window
    ivs = [Intervention("decoder.blocks.0.cross_attn.head.1"), Intervention("decoder.blocks.0.attn.head.1"),
           Intervention("encoder.blocks.1.attn.head.0")]
    with qtbot.waitSignal(state.interventions_changed, timeout=10_000):
        state.set_interventions(ivs)
    strip = win.intervention_strip
    texts = [chip.findChild(QLabel).text() for chip in strip.chips]
    assert texts == ["zero dec L0xH1", "zero dec L0H1", "zero enc L1H0"]
    with qtbot.waitSignal(state.interventions_changed, timeout=10_000):
        qtbot.mouseClick(strip.remove_buttons[0], Qt.MouseButton.LeftButton)
    assert [chip.findChild(QLabel).text() for chip in strip.chips] == ["zero dec L0H1", "zero enc L1H0"]


def test_what_if_says_why_attribution_is_off_for_marian(qtbot, window):
    """Issue 41: on BART / Marian (post-norm) the attribution is disabled, but the line under it still said
    "Choose a position ... then Attribute" (the reason was only in the disabled button's tooltip)."""
    from desktop_app.paths import resources_dir

    win, state = window
    marian = state.loaded.path
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        win.open_model(resources_dir() / "demo-model")  # a model attribution is for, then Marian again
    panel = click_panel_tab(qtbot, win, "What if")
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None, timeout=30_000)  # the demo model's bars
    axis, view = panel.dla_chart.plot_item.getAxis("bottom"), panel.dla_chart.plot_item.getViewBox()
    assert axis.labels and view.viewRange()[0][1] > 10  # its component labels, over its 20-odd bars
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        win.open_model(marian)
    qtbot.waitUntil(lambda: state._trace_job is None and state.trace is not None, timeout=30_000)
    assert not panel.attribute_button.isEnabled()
    # the empty chart keeps nothing of the previous model's: no component labels, not its range (issue 41)
    # (no numbers either: an empty chart hides its axes, widgets.empty_plot)
    assert panel.dla_chart.attribution is None and axis.labels == [] and not axis.isVisible()
    assert view.viewRange()[0][1] <= 1.5, view.viewRange()
    panel.dla_chart.grab().save("/tmp/edges2_whatif_marian.png")
    text = panel.dla_status.text()
    problem = panel.attribute_button.toolTip().removeprefix("Not for this model: ")
    assert "then Attribute" not in text and text.lower().startswith(problem[:30].lower())
