"""LipschitzPanel with pytest-qt: a tiny sweep fills the plot and the table with the core's numbers,
a longer one is cancelled, runs overlay, and the exports write real files."""
from __future__ import annotations

import csv
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from desktop_app.core import lipschitz as lip
from desktop_app.ui.panels.lipschitz import LipschitzPanel
from desktop_app.ui.state import AppState
from tiny_models import tiny_model

TEXT = "a rose is a rose is a rose, said the gardener to the queen of hearts. " * 3


def lipschitz_panel(qtbot, text: str, n_layers: int) -> LipschitzPanel:
    """The panel, shown, on a tiny model of `text`'s characters with `text` in the box."""
    state = AppState()
    state.loaded = tiny_model(text, seed=1, d_model=16, n_layers=n_layers, n_heads=2, d_ff=32, context_length=128,
                              init_std=0.3)
    state.text = text
    p = LipschitzPanel(state)
    qtbot.addWidget(p)
    p._on_model_changed(state.loaded)
    p.resize(1100, 700)
    p.show()
    return p


@pytest.fixture
def panel(qtbot):
    return lipschitz_panel(qtbot, TEXT, n_layers=2)


def _curves(p):
    return [item for item in p.plot.getPlotItem().listDataItems()]


def test_tiny_sweep_fills_plot_and_table(panel, qtbot):
    assert "Theorem 3.1" in panel.help_text and "D<sub>X</sub>f" in panel.help_text
    panel.data.setCurrentText("real")
    panel.layer.setValue(1)
    panel.lengths.setText("4,8")
    panel.samples.setValue(2)
    panel.run_button.click()
    qtbot.waitUntil(lambda: not panel.is_running() and panel.run_button.isEnabled(), timeout=30_000)
    assert panel.table.rowCount() == 4
    assert "exponent" in panel.status.text()
    run = panel.runs[0]
    # the table shows the core's numbers for the same windows
    ids = panel.state.loaded.tokenizer.encode(TEXT)
    X = lip.real_inputs(panel.state.loaded.model, ids, 1, 8, 2, lip.window_starts(len(ids), 8, 2))
    exact = lip.exact_jacobian_norm(lip.module_function(panel.state.loaded.model, 1), X).numpy()
    shown = [float(panel.table.item(r, 3).text()) for r in range(2, 4)]
    np.testing.assert_allclose(shown, exact, rtol=1e-4)
    assert run.result.exponent == pytest.approx(lip.fit_exponent(
        [r[0] for r in run.result.rows()], [r[2] for r in run.result.rows()])[0])
    names = [item.name() for item in _curves(panel) if item.name()]
    assert any("exponent" in n for n in names) and "C n^1/4" in names and "C n^1/2" in names

    # a second run (synthetic, adversarial: Theorem 3.1 bounds apply) overlays the first
    panel.source.setCurrentIndex(1)
    panel.synthetic_data.setCurrentIndex(1)
    panel.masked.setChecked(False)  # Theorem 3.1's lower bound is stated for unmasked attention
    panel.radius.setValue(2.0)
    panel.lengths.setText("4,8,16")
    panel.samples.setValue(1)
    panel.run_button.click()
    qtbot.waitUntil(lambda: not panel.is_running() and panel.run_button.isEnabled(), timeout=30_000)
    assert len(panel.runs) == 2 and panel.table.rowCount() == 7
    names = [item.name() for item in _curves(panel) if item.name()]
    assert sum("exponent" in n for n in names) == 2
    assert any("Thm 3.1 upper" in n for n in names) and any("Thm 3.1 lower" in n for n in names)
    for n, _s, L, _R, up, lo, _it in panel.runs[1].result.rows():
        assert lo <= L <= up


def test_cancel_and_export(panel, qtbot, tmp_path):
    panel.source.setCurrentIndex(1)
    panel.d.setValue(32)
    panel.attention.setCurrentText("sinkhorn")
    panel.lengths.setText("4,256,512,1024,2048")
    panel.samples.setValue(8)
    panel.run_button.click()
    assert panel.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: panel.table.rowCount() >= 8, timeout=30_000)  # n = 4 streamed in
    panel.cancel_button.click()
    qtbot.waitUntil(lambda: not panel.is_running() and panel.run_button.isEnabled(), timeout=60_000)
    assert "cancelled" in panel.status.text()
    assert panel.runs and panel.runs[0].result.lengths[-1].n < 2048  # stopped early, partial results kept

    panel.export(tmp_path / "l.csv")
    panel.export(tmp_path / "l.png")
    panel.export(tmp_path / "l.svg")
    with open(tmp_path / "l.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["run", *lip.CSV_COLUMNS] and len(rows) - 1 == panel.table.rowCount()
    assert (tmp_path / "l.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ET.parse(tmp_path / "l.svg")  # well-formed vector file
    panel.clear_button.click()
    assert panel.runs == [] and panel.table.rowCount() == 0


def test_bad_lengths_message(panel):
    panel.lengths.setText("4,abc")
    panel.run_button.click()
    assert "lengths" in panel.status.text() and not panel.is_running()


def _wait(panel, qtbot):
    qtbot.waitUntil(lambda: not panel.is_running() and panel.run_button.isEnabled(), timeout=30_000)


def test_no_lower_bound_curve_for_one_head_of_the_model(panel, qtbot):
    """One head of a model has V = W_O W_V of rank d_head < d: no lower bound, so no curve (a
    ~1e-12 'bound' used to be drawn and squashed the log axis); the upper bound is still drawn."""
    panel.source.setCurrentIndex(0)
    panel.layer.setValue(0)
    panel.head.setCurrentIndex(2)  # head 1
    panel.data.setCurrentText("adversarial")
    panel.masked.setChecked(False)
    panel.radius.setValue(2.0)
    panel.lengths.setText("4,8")
    panel.samples.setValue(1)
    panel.run_button.click()
    _wait(panel, qtbot)
    rows = panel.runs[0].result.rows()
    assert len(rows) == 2 and all(np.isnan(r[5]) and np.isfinite(r[4]) for r in rows)
    assert [panel.table.item(r, 6).text() for r in range(2)] == ["", ""]  # undefined: an empty cell
    names = [item.name() for item in _curves(panel) if item.name()]
    assert any("Thm 3.1 upper" in n for n in names) and not any("Thm 3.1 lower" in n for n in names)
    # every curve drawn stays within a few decades of the data (the log axis is not squashed)
    lows = [float(np.min(item.getData()[1])) for item in _curves(panel) if item.getData()[1] is not None
            and len(item.getData()[1])]
    assert min(lows) > 1e-3 * min(r[2] for r in rows)


def test_load_matrices_and_seed(panel, qtbot, tmp_path, monkeypatch):
    import torch

    from desktop_app.ui.panels import lipschitz as panel_module

    g = torch.Generator().manual_seed(8)
    A = torch.randn(3, 3, generator=g, dtype=torch.float64)
    V = torch.randn(3, 3, generator=g, dtype=torch.float64)
    good = tmp_path / "mine.npz"
    np.savez(good, A=A.numpy(), V=V.numpy())
    panel.source.setCurrentIndex(1)
    assert panel.matrices_button.isVisible() and panel.seed.isVisible()
    # the button opens a file dialog (stubbed here: no modal dialog in tests) and loads what it returns
    monkeypatch.setattr(panel_module.QFileDialog, "getOpenFileName", lambda *a, **k: (str(good), ""))
    panel.matrices_button.click()
    assert "mine.npz" in panel.matrices_button.text() and not panel.d.isEnabled() and not panel.norm_A.isEnabled()

    panel.seed.setValue(7)
    panel.masked.setChecked(False)
    panel.synthetic_data.setCurrentIndex(0)
    panel.radius.setValue(1.5)
    panel.lengths.setText("3,5")
    panel.samples.setValue(2)
    panel.run_button.click()
    _wait(panel, qtbot)
    assert panel.table.rowCount() == 4 and "mine.npz" in panel.runs[0].label and "seed 7" in panel.runs[0].label
    f = lip.single_head(A, V)
    for row0, n in ((0, 3), (2, 5)):
        X = lip.ball_inputs(2, n, 3, 1.5, seed=7 + n)  # the panel's seed drives the inputs
        shown = [float(panel.table.item(r, 3).text()) for r in (row0, row0 + 1)]
        np.testing.assert_allclose(shown, lip.exact_jacobian_norm(f, X).numpy(), rtol=1e-4)

    # bad files: a clear message naming the file and the problem; the loaded matrices stay in use
    missing = tmp_path / "onlyA.npz"
    np.savez(missing, A=A.numpy())
    nonfinite = tmp_path / "nan.npz"
    np.savez(nonfinite, A=A.numpy(), V=np.full((3, 3), np.nan))
    wrong = tmp_path / "shape.npz"
    np.savez(wrong, A=A.numpy(), V=np.eye(4))
    for path, problem in ((missing, "no array named V"), (nonfinite, "non-finite"), (wrong, "same d"),
                          (tmp_path / "absent.npz", "no such file")):
        assert panel.set_matrices_file(str(path)) is False
        assert path.name in panel.status.text() and problem in panel.status.text()
        assert "mine.npz" in panel.matrices_button.text() and panel._matrices is not None
    # cancelling the dialog goes back to random matrices
    monkeypatch.setattr(panel_module.QFileDialog, "getOpenFileName", lambda *a, **k: ("", ""))
    panel.matrices_button.click()
    assert panel._matrices is None and panel.d.isEnabled() and panel.norm_V.isEnabled()
    spec = panel.spec()
    assert spec.matrices is None and spec.seed == 7 and spec.d == panel.d.value()


def test_screenshot_demo_runs_back_to_back_keep_their_own_results(qtbot):
    """Three sweeps started one after the other as soon as each ends (the README figure): every run
    keeps its own numbers, even when a run's last queued results reach the UI after the next began."""
    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.paths import demo_model_dir

    state = AppState()
    state.loaded = load_model_folder(demo_model_dir())
    p = LipschitzPanel(state)
    qtbot.addWidget(p)
    state.model_changed.emit(state.loaded)
    p.screenshot_demo()
    app, deadline = QApplication.instance(), time.time() + 120
    while not p.screenshot_ready() and time.time() < deadline:
        app.processEvents()  # as a script drives it (make_figures.py): the race showed up this way
        time.sleep(0.02)
    labels = [r.label for r in p.runs]
    assert labels == ["demo-model L0 H1 real demo-text.txt", "demo-model L0 H1 adversarial",
                      "demo-model L0 real demo-text.txt masked"]
    real, adversarial, masked = (r.result for r in p.runs)
    for r in (real, adversarial, masked):
        assert [x.n for x in r.lengths] == [4, 8, 16, 32, 64, 128, 256]
    assert abs(adversarial.exponent - 0.5) < 0.1  # the paper's n^(1/2) on adversarial inputs
    assert masked.exponent < 0.4 and real.exponent < 0.4  # real text grows more slowly
    medians = {name: [float(np.median(x.lipschitz)) for x in r.lengths]
               for name, r in (("masked", masked), ("adversarial", adversarial))}
    assert len(masked.lengths[0].lipschitz) == 5 and len(adversarial.lengths[0].lipschitz) == 1
    assert not np.allclose(medians["masked"], medians["adversarial"], rtol=0.05)


# -- issue 13: defaults that succeed, one-sentence errors, what the plot and table say -----------------


def _click_run(panel, qtbot):
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    _wait(panel, qtbot)


@pytest.fixture
def demo_panel(qtbot):
    """The demo model with the text the app starts with (its first paragraph: 51 tokens)."""
    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.paths import demo_model_dir
    from desktop_app.ui.app import demo_text

    state = AppState()
    state.loaded = load_model_folder(demo_model_dir())
    state.text = demo_text()
    p = LipschitzPanel(state)
    qtbot.addWidget(p)
    state.model_changed.emit(state.loaded)
    p.resize(1100, 700)
    p.show()
    return p


def test_defaults_succeed_on_the_demo_model_and_say_what_was_skipped(demo_panel, qtbot):
    """Issue 13 defect 5: Run with the defaults used to fail ("the text has 51 tokens, fewer than the
    window length n = 128"); issue 41: the defaults now fit the text on screen (up to its 51 tokens), so
    the first Run skips nothing."""
    p = demo_panel
    n_tokens = len(p.state.loaded.tokenizer.encode(p.state.text))
    assert 32 <= n_tokens < 64
    _click_run(p, qtbot)
    result = p.runs[0].result
    assert [r.n for r in result.lengths] == [4, 8, 16, 32]
    assert all(len(r.lipschitz) == 5 for r in result.lengths)
    status = p.status.text()
    assert "exponent" in status and "failed" not in status and "#b00" not in status
    assert "skipped" not in status, status


def test_a_text_too_short_for_two_lengths_falls_back_to_the_demo_text(demo_panel, qtbot):
    p = demo_panel
    p.state.text = "Alice"
    _click_run(p, qtbot)
    assert [r.n for r in p.runs[0].result.lengths] == [int(n) for n in p.lengths.text().split(",")]
    assert "real windows come from the bundled demo text" in p.status.text()


def test_samples_reduced_are_said(panel, qtbot):
    """Samples K is never reduced silently: fewer distinct windows than K, and the adversarial
    construction's single input per n, are both said."""
    panel.state.text = TEXT[:60]
    n_tokens = len(panel.state.loaded.tokenizer.encode(panel.state.text))
    panel.lengths.setText(f"4,{n_tokens - 2}")
    panel.samples.setValue(10)
    _click_run(panel, qtbot)
    assert len(panel.runs[0].result.lengths[0].lipschitz) == 3
    assert f"Samples K = 10 reduced to 3: the text has only 3 distinct windows of n = {n_tokens - 2}" \
        in panel.status.text()
    panel.data.setCurrentText("adversarial")
    panel.lengths.setText("4,8")
    _click_run(panel, qtbot)
    assert "Samples K = 10 gives one sample each" in panel.status.text()


@pytest.mark.parametrize("raw", [RuntimeError("linalg.eigh: The algorithm failed to converge because the input "
                                              "matrix is ill-conditioned or has too many repeated eigenvalues "
                                              "(error code: 5)."),
                                 IndexError("index out of range in self")])
def test_raw_library_errors_become_one_sentence(panel, qtbot, monkeypatch, raw):
    """Issue 13 defect 6: a library's own message never reaches the status line; the traceback is logged."""
    def broken(spec, job=None, on_length=None):
        raise raw

    monkeypatch.setattr(lip, "run_sweep", broken)
    panel.lengths.setText("4,8")
    _click_run(panel, qtbot)
    status = panel.status.text()
    assert str(raw) not in status and "self" not in status
    assert "failed: the sweep stopped on an unexpected error" in status and status.count(".") <= 1
    assert panel.runs == [] and panel.run_button.isEnabled()


def test_a_run_error_is_one_sentence(panel, qtbot):
    panel.lengths.setText("4,9999")
    panel.samples.setValue(1)
    _click_run(panel, qtbot)  # beyond the context of 128 tokens: skipped and said
    assert [r.n for r in panel.runs[0].result.lengths] == [4]
    assert "skipped n = 9999: longer than the model's context length 128" in panel.status.text()
    panel.lengths.setText("9999")
    _click_run(panel, qtbot)
    assert "no length fits" in panel.status.text() and "\n" not in panel.status.text()


def test_labels_reference_lines_and_a_long_summary(panel, qtbot):
    """Issue 13 defect 9: runs carry their model's name (legend and table), the n^1/4 and n^1/2 lines
    differ in the legend and in their dashes, and many runs' summary wraps instead of widening the
    window past the screen."""
    window_width = panel.window().width()
    panel.lengths.setText("4,8")
    panel.samples.setValue(1)
    _click_run(panel, qtbot)
    assert panel.table.item(0, 0).text() == "test L0 real \u201ca rose is a\u2026\u201d masked"
    names = [item.name() for item in _curves(panel) if item.name()]
    assert any(n.startswith("test L0 real \u201ca rose is a\u2026\u201d masked: exponent") for n in names)
    refs = {item.name(): item.opts["pen"] for item in _curves(panel) if item.name() in ("C n^1/4", "C n^1/2")}
    assert set(refs) == {"C n^1/4", "C n^1/2"}
    assert refs["C n^1/4"].dashPattern() != refs["C n^1/2"].dashPattern()

    panel.source.setCurrentIndex(1)
    for seed in range(1, 9):
        panel.seed.setValue(1_000_000 + seed)
        _click_run(panel, qtbot)
    assert len(panel.summary.text()) > 600
    assert panel.minimumSizeHint().width() < 900
    assert panel.window().width() == window_width


def test_a_file_that_is_not_an_archive_is_one_sentence(panel, qtbot, tmp_path, monkeypatch):
    from desktop_app.ui.panels import lipschitz as panel_module

    bad = tmp_path / "notes.npz"
    bad.write_text("A and V are in my notebook")
    panel.source.setCurrentIndex(1)
    monkeypatch.setattr(panel_module.QFileDialog, "getOpenFileName", lambda *a, **k: (str(bad), ""))
    qtbot.mouseClick(panel.matrices_button, Qt.MouseButton.LeftButton)
    status = panel.status.text()
    assert "notes.npz: not a NumPy .npz archive" in status
    assert "pickle" not in status.lower()  # numpy's own wording ("allow_pickle=False") stays out


# -- issue 25: the form follows the model; runs on different texts are told apart ------------------


def test_a_vit_after_a_text_model_gets_its_own_mask_and_data_and_long_lengths_are_skipped(
        qtbot, tmp_path, model_dirs, isolated_user_files, monkeypatch):
    """The session's Lipschitz form (masked, real text) was restored when the panel was first shown,
    on the demo model; a ViT then made current (as Train > Use this model does, through set_model):
    the mask follows the ViT (bidirectional), the data is image patches, real text is disabled with a
    reason, and lengths beyond [CLS] + 16 patches are skipped with a note, as real text skips them."""
    from digit_vit import save_digit_vit, skip_without_digits

    skip_without_digits()
    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.core.views import state_to_dict
    from desktop_app.core.views.lipschitz import LipschitzViewState
    from desktop_app.ui.workspace import Workspace

    from .walkthrough import ErrorWatch, click_panel_tab, open_window, type_into

    watch = ErrorWatch.install(monkeypatch)
    try:
        window, state = open_window(qtbot, model_dirs["demo"], name="demo", watch=watch)
        window.apply_workspace(Workspace(views={"Lipschitz": state_to_dict(LipschitzViewState(masked=True))}))
        panel = click_panel_tab(qtbot, window, "Lipschitz")  # built now: the session's form applies
        assert panel.masked.isChecked() and panel.data.currentText() == "real"

        vit = load_model_folder(save_digit_vit(tmp_path / "vit"))
        with qtbot.waitSignal(state.model_changed, timeout=30_000):
            state.set_model(vit)  # what Train > Use this model does with the run's checkpoint
        assert not panel.masked.isChecked()  # a ViT attends both ways
        assert panel.data.currentText() == "image patches"
        real = [s.name for s in panel.model_sources].index("real")
        assert not panel.data.model().item(real).isEnabled()
        assert "reads images" in panel.data.itemData(real, Qt.ItemDataRole.ToolTipRole)

        type_into(qtbot, panel.lengths, "2,9,17,33,65")
        type_into(qtbot, panel.samples, "2")
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: bool(panel.runs) and panel.runs[-1].finished, timeout=60_000)
        _wait(panel, qtbot)
        assert [r.n for r in panel.runs[-1].result.lengths] == [2, 9, 17]
        assert "skipped n = 33, 65: this ViT reads 17 tokens" in panel.status.text()
        assert "exponent" in panel.status.text() and "masked" not in panel.runs[-1].label

        # back to a text model: real text again, image patches disabled
        with qtbot.waitSignal(state.model_changed, timeout=30_000):
            window.open_model(model_dirs["demo"])
        assert panel.masked.isChecked() and panel.data.currentText() == "real"
        image = [s.name for s in panel.model_sources].index("image")
        assert not panel.data.model().item(image).isEnabled()
        watch.assert_clean()
    finally:
        watch.remove()


def test_runs_on_different_texts_have_different_labels(panel, qtbot, tmp_path, monkeypatch):
    """Issue 25 §6: the same layer on the current text and on a text file: two legend entries that say
    which text each run read (the text's first words, the file's name)."""
    from PySide6.QtWidgets import QFileDialog

    panel.lengths.setText("4,8")
    panel.samples.setValue(1)
    _click_run(panel, qtbot)
    other = tmp_path / "queen.txt"
    other.write_text("the queen of hearts said to the gardener, a rose is a rose. " * 4, encoding="utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(other), "")))
    qtbot.mouseClick(panel.text_button, Qt.MouseButton.LeftButton)
    assert panel.text_button.text() == "queen.txt"
    _click_run(panel, qtbot)
    first, second = (run.label for run in panel.runs)
    assert first != second
    assert "\u201ca rose is a\u2026\u201d" in first and "queen.txt" in second
    names = [item.name().split(": exponent")[0] for item in _curves(panel) if "exponent" in (item.name() or "")]
    assert names == [first, second]
