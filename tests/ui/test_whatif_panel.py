"""The What if panel, driven through its real widgets: direct logit attribution of the current
text, activation patching with progress, Cancel and the length check, and the exports."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from desktop_app.ui.widgets.export import export_view

from .walkthrough import click_panel_tab, click_tab, open_window, type_into


@pytest.fixture
def window(qtbot, model_dirs, isolated_user_files, error_watch):
    w, state = open_window(qtbot, model_dirs["llama"], text="Alice and the rabbit hole.", watch=error_watch)
    yield w, state
    error_watch.assert_clean()


def test_a_first_look_attributes_the_top_next_token(qtbot, window):
    """Opening the tab shows the default attribution (the last position, the model's top next token),
    not empty axes; nothing else needs clicking."""
    import torch

    w, state = window
    panel = click_panel_tab(qtbot, w, "What if")
    qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None, timeout=20_000)
    with torch.no_grad():
        top = int(state.loaded.model(torch.tensor([state.token_ids])).logits[0, -1].argmax())
    assert panel.dla_chart.attribution.token_id == top and panel.dla_status.text().startswith("logit")


def test_attribution_bars_add_up_to_the_logit_and_export(qtbot, window, tmp_path):
    w, state = window
    panel = click_panel_tab(qtbot, w, "What if")
    qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None, timeout=20_000)
    attr = panel.dla_chart.attribution
    cfg = state.loaded.config
    assert attr.position == len(state.token_ids) - 1  # "last"
    assert attr.sum == pytest.approx(attr.logit, abs=1e-3)
    assert attr.head_table.shape == (cfg.n_layers, cfg.n_heads)
    assert "logit" in panel.dla_status.text()
    for suffix in (".png", ".svg", ".csv"):
        export_view(panel.dla_chart, tmp_path / f"dla{suffix}")
        assert (tmp_path / f"dla{suffix}").stat().st_size > 100
    header, *rows = (tmp_path / "dla.csv").read_text().splitlines()
    assert header == "label,component,layer,head,contribution" and rows[-1].startswith("logit,")

    # a token typed that is several tokens: one clear line, no dialog
    type_into(qtbot, panel.token_edit, "Alice and the rabbit")
    qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.dla_status.text().startswith("Cannot attribute"), timeout=20_000)
    assert "one token" in panel.dla_status.text()


def test_the_export_buttons_follow_the_attribution_on_show(qtbot, window, tmp_path, monkeypatch):
    """The first look's bars are there: PNG (clicked) saves them; a refused attribution clears the
    chart and the buttons say there is nothing to export."""
    from desktop_app.ui.widgets import export

    w, state = window
    panel = click_panel_tab(qtbot, w, "What if")
    qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None, timeout=20_000)
    assert all(b.isEnabled() for b in panel.dla_export.buttons.values())
    monkeypatch.setattr(export, "ask_save_path", lambda *a, **k: str(tmp_path / "bars.png"))
    qtbot.mouseClick(panel.dla_export.buttons["PNG"], Qt.MouseButton.LeftButton)
    assert (tmp_path / "bars.png").stat().st_size > 100

    type_into(qtbot, panel.token_edit, "Alice and the rabbit")  # several tokens: refused, the chart cleared
    qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.dla_status.text().startswith("Cannot attribute"), timeout=20_000)
    assert panel.dla_chart.attribution is None
    assert not any(b.isEnabled() for b in panel.dla_export.buttons.values())


def test_the_patching_maps_are_made_when_their_tab_is_first_clicked(qtbot, window):
    """The panel's first show is the attribution's tab: the patching maps (two pyqtgraph heatmaps) wait for their
    tab's first click, then fill it, laid out, and the File menu's export bar follows the residual-stream map."""
    w, state = window
    panel = click_panel_tab(qtbot, w, "What if")
    qtbot.waitUntil(panel.isVisible, timeout=5_000)  # (a panel built at its tab's click is shown by a queued call)
    assert not panel.patching_maps.made  # (before: made at the panel's build)
    click_tab(qtbot, panel.tabs, "Activation patching")
    assert panel.patching_maps.made
    for hm in (panel.resid_map, panel.heads_map):
        assert hm.isVisible() and hm.width() > 100 and hm.height() > 100
    assert panel.current_view() is panel.resid_map
    assert not any(b.isEnabled() for b in panel.export_bar.buttons.values())  # nothing patched yet


def test_patching_runs_with_progress_checks_lengths_and_exports(qtbot, window, tmp_path):
    w, state = window
    panel = click_panel_tab(qtbot, w, "What if")
    panel.tabs.setCurrentIndex(1)
    tok = state.loaded.tokenizer
    type_into(qtbot, panel.clean_edit, "Alice and the rabbit")
    type_into(qtbot, panel.corrupted_edit, "Alice and the")
    answer = tok.token_strings(tok.encode(" hole"))[0] if len(tok.encode(" hole")) == 1 else "#5"
    type_into(qtbot, panel.answer_edit, answer)
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.patch_status.text().startswith("Cannot patch"), timeout=20_000)
    assert "same length in tokens" in panel.patch_status.text()

    n = len(tok.encode("Alice and the rabbit"))
    other = "Alice and the hole"
    assert len(tok.encode(other)) == n
    type_into(qtbot, panel.corrupted_edit, other)
    seen = []
    panel.run_button.clicked.connect(lambda: panel._patch_job.signals.progress.connect(
        lambda d, t, m: seen.append((d, t))))
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    assert panel.cancel_button.isEnabled() and not panel.run_button.isEnabled()
    qtbot.waitUntil(lambda: panel.patching is not None or panel.run_button.isEnabled(), timeout=30_000)
    assert panel.patching is not None, panel.patch_status.text()
    qtbot.waitUntil(lambda: panel.run_button.isEnabled(), timeout=5_000)
    cfg = state.loaded.config
    res = panel.patching
    assert res.resid.shape == (cfg.n_layers + 1, n) and res.heads.shape == (cfg.n_layers, cfg.n_heads)
    assert seen and seen[-1][0] == seen[-1][1] == (cfg.n_layers + 1) * n + cfg.n_layers * cfg.n_heads
    # patching the last layer's output at the last position restores the clean run exactly
    assert res.resid[-1, -1] == pytest.approx(1.0, abs=1e-4)
    np.testing.assert_allclose(panel.heads_map.values, res.heads, atol=1e-6)
    for name, view in (("resid", panel.resid_map), ("heads", panel.heads_map)):
        for suffix in (".png", ".svg", ".csv"):
            export_view(view, tmp_path / f"{name}{suffix}")
            assert (tmp_path / f"{name}{suffix}").stat().st_size > 100


def test_patching_cancel_stops_the_run(qtbot, window, monkeypatch):
    w, state = window
    panel = click_panel_tab(qtbot, w, "What if")
    panel.tabs.setCurrentIndex(1)
    import desktop_app.core.interventions as iv_mod

    real = iv_mod._metric
    calls = []

    def slow_metric(*args):  # each patched forward waits a little, so Cancel arrives mid-run
        import time
        calls.append(1)
        time.sleep(0.05)
        return real(*args)

    monkeypatch.setattr(iv_mod, "_metric", slow_metric)
    tok = state.loaded.tokenizer
    n = len(tok.encode("Alice and the rabbit"))
    other = "Alice and the hole"
    assert len(tok.encode(other)) == n
    type_into(qtbot, panel.clean_edit, "Alice and the rabbit")
    type_into(qtbot, panel.corrupted_edit, other)
    type_into(qtbot, panel.answer_edit, "#5")
    # the job's clock: each patched forward takes 50 ms (core.jobs.TimeLeft reads it at the start and at each report)
    from desktop_app.core.jobs import TimeLeft
    monkeypatch.setattr(TimeLeft, "clock", staticmethod(lambda: 0.05 * panel.progress.value()))
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(calls) > 4 and panel.progress.value() > 4, timeout=20_000)
    done, total = panel.progress.value(), panel.progress.maximum()
    left = f"about {(total - done) * 0.05:.0f} s left"  # the bar and the status line say the time left
    assert panel.progress.text().endswith(f"% · {left}") and panel.patch_status.text().endswith(f", {left}")
    qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    # the job's "cancelled" and "finished" signals arrive as two queued events: wait for the second
    qtbot.waitUntil(lambda: panel.patch_status.text() == "Patching cancelled." and not panel.cancel_button.isEnabled(),
                    timeout=20_000)
    assert panel.patching is None and panel.run_button.isEnabled() and not panel.progress.isVisible()


# -- issue 25 §6 -----------------------------------------------------------------------------


def test_a_model_without_a_language_model_head_says_so_and_disables_attribution(qtbot, tmp_path,
                                                                               isolated_user_files):
    """A sentence-embedding BERT (no MLM head): one clear line and disabled controls that say why,
    never "'NoneType' object is not subscriptable"."""
    from desktop_app.core.checkpoints import new_model, save_model_folder
    from desktop_app.core.config import ModelConfig

    from .walkthrough import TEXTS, bert_wordpiece_tokenizer

    tok = bert_wordpiece_tokenizer()
    cfg = ModelConfig.bert(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                           context_length=512, lm_head=False)
    folder = tmp_path / "sentence-bert"
    save_model_folder(new_model(cfg, seed=0), folder, tokenizer=tok)
    w, state = open_window(qtbot, folder, text=TEXTS["bert"])
    panel = click_panel_tab(qtbot, w, "What if")
    assert state.token_ids and not state.loaded.config.lm_head
    assert not panel.attribute_button.isEnabled() and not panel.token_edit.isEnabled()
    assert "no language-model head" in panel.attribute_button.toolTip()
    assert "no language-model head: direct logit attribution needs one" in panel.dla_status.text()
    qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)  # disabled: nothing happens
    qtbot.keyClick(panel.token_edit, Qt.Key.Key_Return)
    assert "NoneType" not in panel.dla_status.text() and panel.dla_chart.attribution is None
    assert not panel.run_button.isEnabled() and "no language-model head" in panel.run_button.toolTip()
    assert "no language-model head" in panel.patch_status.text()


def test_attribution_labels_never_overlap(qtbot, model_dirs, isolated_user_files):
    """The demo model's 26 bars at 900 pixels: the labels drawn do not run into each other (fewer of them; the
    named bars' on a second line where they would touch), and all come back when the window is wide enough."""
    from .test_features_attribution_labels import _drawn_labels

    w, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    w.resize(900, 600)
    panel = click_panel_tab(qtbot, w, "What if")
    qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None and (panel._dla_job is None or panel._dla_job.done), timeout=30_000)

    def apart(drawn) -> bool:
        return all(not a.intersects(b) for i, (a, _) in enumerate(drawn) for b, _ in drawn[i + 1:])

    qtbot.waitUntil(lambda: len(_drawn_labels(panel.dla_chart)) > 1, timeout=10_000)
    drawn = _drawn_labels(panel.dla_chart)
    assert len(panel.dla_chart.labels) >= 12 and len(drawn) < len(panel.dla_chart.labels)
    assert apart(drawn), drawn
    w.resize(2400, 800)
    qtbot.waitUntil(lambda: len(_drawn_labels(panel.dla_chart)) == len(panel.dla_chart.labels), timeout=10_000)
    assert apart(_drawn_labels(panel.dla_chart))
