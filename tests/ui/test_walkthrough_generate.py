"""The Generate panel, clicked as a person would (issue 13), on the four walkthrough models: the tab
bar, Start, Step, Back, the arrow keys, the sliders, a bar, Run N / Stop, Reset, the export bar and
File > Export Current View; for the encoder, a strip chip, Mask and a bar filling the position."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QFileDialog, QToolButton

from desktop_app.core.generation import GenerationSession, MaskedFillSession

from .walkthrough import WALKTHROUGH_MODELS, open_window

LEFT = Qt.MouseButton.LeftButton


def click(qtbot, widget, pos: QPoint | None = None) -> None:
    assert widget.isEnabled() and widget.isVisible(), widget
    qtbot.mouseClick(widget, LEFT, pos=pos) if pos is not None else qtbot.mouseClick(widget, LEFT)


def idle(qtbot, panel) -> None:
    qtbot.waitUntil(lambda: not panel.busy, timeout=20_000)
    qtbot.wait(5)


def open_generate(qtbot, window):
    bar = window.tabs.tabBar()
    index = next(i for i in range(bar.count()) if bar.tabText(i) == "Generate")
    click(qtbot, bar, bar.tabRect(index).center())
    assert window.tabs.currentIndex() == index
    panel = window.panel("Generate")
    qtbot.waitUntil(lambda: panel.start_button.isVisible())  # a panel built on the click shows queued
    return panel


def click_bar(qtbot, panel, index: int) -> int:
    """Click the index-th bar of the distribution; returns its token id."""
    token = panel.bars.token_ids[index]
    pos = panel.bars.plot.mapFromScene(panel.bars.bar_scene_pos(index))
    click(qtbot, panel.bars.plot.viewport(), QPoint(pos.x(), pos.y()))
    return token


def click_slider(qtbot, slider, fraction: float) -> None:
    before = slider.value()
    click(qtbot, slider, QPoint(int(slider.width() * fraction), slider.height() // 2))
    assert slider.value() != before  # a click on the groove moves the handle


def run_then_stop(qtbot, panel) -> None:
    click(qtbot, panel.run_button)
    if panel._running:  # a tiny model may have filled its context already
        assert panel.run_button.text() == "Stop"
        click(qtbot, panel.run_button)
    idle(qtbot, panel)
    assert panel.run_button.text() == "Run N"
    assert panel.status.text().startswith(("Stopped", "Done"))


def depth(panel) -> int:
    return panel.session.current.depth


@pytest.mark.parametrize("name", WALKTHROUGH_MODELS)
def test_generate_walkthrough(qtbot, model_dirs, isolated_user_files, error_watch, name):
    window, state = open_window(qtbot, model_dirs[name], name=name, watch=error_watch)
    window.resize(1200, 800)
    panel = open_generate(qtbot, window)
    assert panel.prompt.text()  # a prompt is there: the defaults work at once
    if state.loaded.config.causal:
        _decoder_walkthrough(qtbot, panel)
    else:
        _encoder_walkthrough(qtbot, panel)
    error_watch.assert_clean()


def _decoder_walkthrough(qtbot, panel) -> None:
    click(qtbot, panel.start_button)  # was: TypeError: 'bool' object is not callable
    qtbot.waitUntil(lambda: isinstance(panel.session, GenerationSession), timeout=20_000)
    idle(qtbot, panel)
    assert panel.status.text().startswith("Ready")
    n_prompt = len(panel.session.prompt)
    for d in (1, 2):
        click(qtbot, panel.step_button)
        qtbot.waitUntil(lambda: depth(panel) == d, timeout=20_000)
        idle(qtbot, panel)
        assert panel.status.text().startswith(f"Step {d}:")
    click(qtbot, panel.back_button)
    qtbot.waitUntil(lambda: depth(panel) == 1, timeout=20_000)
    idle(qtbot, panel)
    qtbot.keyClick(panel, Qt.Key.Key_Right)  # the arrows still step after a click on Back
    qtbot.waitUntil(lambda: depth(panel) == 2, timeout=20_000)
    idle(qtbot, panel)

    click_slider(qtbot, panel.temperature, 0.8)
    click_slider(qtbot, panel.top_k, 0.5)
    assert sum(p > 0 for p in panel.bars.probs) <= panel.top_k.value()
    forced = click_bar(qtbot, panel, 0)
    qtbot.waitUntil(lambda: depth(panel) == 3, timeout=20_000)
    idle(qtbot, panel)
    assert panel.session.current.token == forced and panel.session.current.how == "chosen"

    # select a generated token: the logit lens of that step
    with qtbot.waitSignal(panel.state.trace_changed, timeout=20_000):
        click(qtbot, panel.strip.canvas, panel.strip.chip_center(n_prompt))
    idle(qtbot, panel)
    assert panel.lens_table.rowCount() == panel.state.loaded.config.n_layers + 1

    run_then_stop(qtbot, panel)
    click(qtbot, panel.reset_button)
    qtbot.waitUntil(lambda: depth(panel) == 0, timeout=20_000)
    idle(qtbot, panel)
    assert panel.status.text().startswith("Ready") and "context" not in panel.status.text()
    assert panel.strip.count() == n_prompt and panel.lens_table.rowCount() == 0


def _encoder_walkthrough(qtbot, panel) -> None:
    mask = panel.state.loaded.tokenizer.mask_token_id
    click(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: isinstance(panel.session, MaskedFillSession), timeout=20_000)
    idle(qtbot, panel)
    assert len(panel.session.masked) == 1  # the filled-in prompt has one [MASK]
    # mask a second token: click its chip, then Mask / unmask
    ids = panel.session.ids()
    other = next(i for i, t in enumerate(ids) if t != mask and i > 0)
    click(qtbot, panel.strip.canvas, panel.strip.chip_center(other))
    idle(qtbot, panel)
    click(qtbot, panel.mask_button)
    qtbot.waitUntil(lambda: panel.session is not None and other in panel.session.masked, timeout=20_000)
    idle(qtbot, panel)
    assert len(panel.session.remaining) == 2

    click_slider(qtbot, panel.temperature, 0.8)
    click_slider(qtbot, panel.top_k, 0.5)
    # select that masked position and fill it from its bars
    click(qtbot, panel.strip.canvas, panel.strip.chip_center(other))
    idle(qtbot, panel)
    assert panel.dist_label.text().startswith(f"position {other}:")
    token = click_bar(qtbot, panel, 1)
    qtbot.waitUntil(lambda: len(panel.session.history) == 1, timeout=20_000)
    idle(qtbot, panel)
    assert (panel.session.history[0].position, panel.session.history[0].token) == (other, token)

    click(qtbot, panel.step_button)
    qtbot.waitUntil(lambda: panel.session.finished, timeout=20_000)
    idle(qtbot, panel)
    assert "filled" in panel.status.text()
    assert panel.tree.topLevelItemCount() == 2  # both fills listed, also once nothing is left to fill
    click(qtbot, panel.back_button)
    qtbot.waitUntil(lambda: len(panel.session.history) == 1, timeout=20_000)
    idle(qtbot, panel)
    qtbot.keyClick(panel, Qt.Key.Key_Right)  # the arrows still work after a click
    qtbot.waitUntil(lambda: panel.session.finished, timeout=20_000)
    idle(qtbot, panel)
    click(qtbot, panel.back_button)
    idle(qtbot, panel)
    run_then_stop(qtbot, panel)
    click(qtbot, panel.reset_button)
    qtbot.waitUntil(lambda: not panel.session.history, timeout=20_000)
    idle(qtbot, panel)
    assert len(panel.session.remaining) == 2


def test_generate_export_bar_and_export_current_view(qtbot, model_dirs, isolated_user_files, error_watch,
                                                     tmp_path, monkeypatch):
    """PNG, SVG and CSV from the Generate panel's export bar, and File > Export Current View."""
    window, state = open_window(qtbot, model_dirs["demo"], name="demo", watch=error_watch)
    panel = open_generate(qtbot, window)
    click(qtbot, panel.step_button)
    qtbot.waitUntil(lambda: panel.session is not None and depth(panel) == 1, timeout=20_000)
    idle(qtbot, panel)
    asked = []

    def save_as(name):
        def dialog(parent, title, default, filters, *args, **kwargs):
            asked.append(default)
            return str(tmp_path / name), filters.split(";;")[0]
        monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(dialog))

    buttons = {b.text(): b for b in panel.export_bar.findChildren(QToolButton)}
    for name, button in (("dist.png", "PNG"), ("dist.svg", "SVG"), ("dist.csv", "Data")):
        save_as(name)
        click(qtbot, buttons[button])
        assert (tmp_path / name).stat().st_size > 0
    assert asked[0].startswith("generate-step2")  # the step whose distribution the bars show
    assert (tmp_path / "dist.png").read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in (tmp_path / "dist.svg").read_bytes()
    lines = (tmp_path / "dist.csv").read_text().splitlines()
    assert lines[0].startswith("section,rank_or_step,token_id")
    dist_rows = [r for r in lines[1:] if r.startswith("distribution,")]
    step_rows = [r for r in lines[1:] if r.startswith("step,")]
    assert len(dist_rows) == state.loaded.config.vocab_size and len(step_rows) == 1
    assert f",{panel.session.current.token}," in step_rows[0]

    save_as("view.png")
    window.export_action.trigger()
    assert (tmp_path / "view.png").read_bytes()[:4] == b"\x89PNG"
    error_watch.assert_clean()
