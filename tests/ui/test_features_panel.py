"""The Features panel (issue 29), driven through its real widgets on the demo model: a dictionary opened
from File > Open Sparse Features... and by a drop (several, one per hook; one for another model refused in
one line naming its folder), the lens for the typed text against core.features, a clicked feature
colouring the text, a dashboard run cancelled while its worker is held and one completed (then read back
from the on-disk cache), a feature edit from the right-click menu changing Generate's next-token
distribution, the attribution bars, and the attached dictionaries through a workspace round trip."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from desktop_app.core.features import SparseDictionary, attach, feature_activations, load_dictionary, save_dictionary

from .walkthrough import click_panel_tab, click_tab, open_window

TEXT = "Alice was beginning to get very tired of sitting by her sister on the bank."


def _dictionary(folder: Path, hook: str = "blocks.2.hook_resid_post", d_in: int = 128, d_sae: int = 64,
                seed: int = 0) -> Path:
    g = torch.Generator().manual_seed(seed)
    d = SparseDictionary(torch.randn(d_in, d_sae, generator=g) * 0.1, torch.randn(d_sae, generator=g) * 0.1,
                         torch.randn(d_sae, d_in, generator=g) * 0.1, torch.randn(d_in, generator=g) * 0.1, hook=hook)
    save_dictionary(d, folder)
    return folder


@pytest.fixture
def demo_window(qtbot, model_dirs, isolated_user_files, error_watch):
    w, state = open_window(qtbot, model_dirs["demo"], text=TEXT, watch=error_watch)
    return w, state


def _click_row(qtbot, table, row: int, column: int = 0) -> None:
    rect = table.visualRect(table.model().index(row, column))
    qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def _open_from_menu(qtbot, w, state, monkeypatch, folder: Path) -> None:
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(folder)))
    with qtbot.waitSignal(state.dictionaries_changed, timeout=20_000):
        w.open_features_action.trigger()


def _lens_shown(qtbot, panel, n_dictionaries: int = 1) -> None:
    qtbot.waitUntil(lambda: panel.lens is not None and len(panel.lens) == n_dictionaries, timeout=20_000)


def _reference(state, folder: Path):
    """core.features on the same model and text, computed here (not through the panel)."""
    a = attach(load_dictionary(folder), state.loaded.config)
    return feature_activations(state.loaded.model, state.token_ids, [a])[0]


def _drop(w, *folders: Path) -> QDropEvent:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(f)) for f in folders])
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    w.dropEvent(event)
    return event


def test_open_from_the_menu_the_lens_and_a_clicked_feature(qtbot, demo_window, tmp_path, monkeypatch, error_watch):
    w, state = demo_window
    folder = _dictionary(tmp_path / "sae-l2")
    _open_from_menu(qtbot, w, state, monkeypatch, folder)
    panel = w.slot("Features").panel
    assert w.current_slot().title == "Features" and panel.isVisible()
    assert [a.dictionary.path for a in state.dictionaries] == [str(folder)]
    assert panel.dict_list.count() == 1 and "blocks.2.hook_resid_post" in panel.dict_list.item(0).text()
    _lens_shown(qtbot, panel)

    ref = _reference(state, folder)
    T = len(state.token_ids)
    assert panel.tokens_table.rowCount() == T
    header = [panel.tokens_table.horizontalHeaderItem(c).text() for c in range(panel.tokens_table.columnCount())]
    l0_col = header.index("L0")
    assert [int(panel.tokens_table.item(t, l0_col).text()) for t in range(T)] == ref.l0.tolist()
    fve_col = header.index("var. expl.")
    assert float(panel.tokens_table.item(3, fve_col).text()) == pytest.approx(
        float(ref.token_variance_explained[3]), abs=1e-3)
    # the last token is selected: its top features, in order, as core.features reads them
    top = ref.top(T - 1, panel.TOP_FEATURES)
    assert top, "the random dictionary should fire on the last token"
    assert [int(panel.features_table.item(r, 1).text()) for r in range(panel.features_table.rowCount())] == \
        [k for k, _ in top]
    # another token clicked on the strip
    strip = panel.strip
    qtbot.mouseClick(strip.canvas, Qt.MouseButton.LeftButton, pos=strip.chip_center(2))
    assert panel.token == 2 and "Token 2" in panel.token_label.text()
    assert [int(panel.features_table.item(r, 1).text()) for r in range(panel.features_table.rowCount())] == \
        [k for k, _ in ref.top(2, panel.TOP_FEATURES)]

    # click a feature: the text is coloured by its activation
    assert strip.canvas.values is None
    _click_row(qtbot, panel.features_table, 1)
    k = ref.top(2, panel.TOP_FEATURES)[1][0]
    assert panel.feature[1] == k
    assert strip.canvas.values == pytest.approx(ref.acts[:, k].tolist(), abs=1e-5)
    assert f"feature {k}" in panel.colour_label.text()
    # its decoder direction through the unembedding
    qtbot.waitUntil(lambda: panel.dashboard.promoted_table.rowCount() == 10, timeout=20_000)
    error_watch.assert_clean()


def test_a_dictionary_for_another_model_is_refused_in_one_line(qtbot, demo_window, tmp_path, monkeypatch):
    w, state = demo_window
    warned = []
    monkeypatch.setattr(QMessageBox, "warning", staticmethod(lambda parent, title, text: warned.append(text)))
    folder = _dictionary(tmp_path / "other-width", d_in=64)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(folder)))
    with qtbot.waitSignal(state.dictionary_failed, timeout=20_000):
        w.open_features_action.trigger()
    assert state.dictionaries == []
    assert len(warned) == 1 and "\n" not in warned[0]
    assert warned[0].startswith(str(folder)) and "d_in is 64" in warned[0] and "width 128" in warned[0]
    assert w.slot("Features").panel.status.text() == f"Cannot attach: {warned[0]}"


def test_dropped_dictionary_folders_attach_one_per_hook(qtbot, demo_window, tmp_path, error_watch):
    w, state = demo_window
    l1 = _dictionary(tmp_path / "l1", hook="blocks.1.hook_resid_post", seed=1)
    l2 = _dictionary(tmp_path / "l2", hook="blocks.2.hook_resid_post", seed=2)
    with qtbot.waitSignals([state.dictionaries_changed] * 2, timeout=20_000):
        event = _drop(w, l1, l2 / "cfg.json")  # a folder, and a file in one (as file managers hand over)
    assert event.isAccepted()
    qtbot.waitUntil(lambda: len(state.dictionaries) == 2, timeout=20_000)
    assert {a.dictionary.path for a in state.dictionaries} == {str(l1), str(l2)}
    assert state.loaded.path is not None and Path(state.loaded.path) == Path(w.state.loaded.path)  # no model opened
    panel = w.slot("Features").panel
    _lens_shown(qtbot, panel, 2)
    # the lens has each hook's columns
    header = [panel.tokens_table.horizontalHeaderItem(c).text() for c in range(panel.tokens_table.columnCount())]
    assert "blocks.1.hook_resid_post: top features" in header and "blocks.2.hook_resid_post: top features" in header
    # another dictionary at layer 2's hook replaces the first one there
    again = _dictionary(tmp_path / "l2-again", hook="blocks.2.hook_resid_post", seed=3)
    with qtbot.waitSignal(state.dictionaries_changed, timeout=20_000):
        _drop(w, again)
    assert sorted(a.dictionary.path for a in state.dictionaries) == sorted([str(l1), str(again)])
    # Detach: one left
    panel.dict_list.setCurrentRow(0)
    qtbot.mouseClick(panel.detach_button, Qt.MouseButton.LeftButton)
    assert len(state.dictionaries) == 1 and panel.dict_list.count() == 1
    error_watch.assert_clean()


@pytest.fixture
def text_file(tmp_path):
    from desktop_app.paths import demo_text_path

    path = tmp_path / "alice.txt"
    path.write_text(Path(demo_text_path()).read_text(encoding="utf-8")[:6000], encoding="utf-8")
    return path


def _dashboard_of_first_feature(qtbot, w, state, monkeypatch, folder: Path, text_file: Path):
    """The dictionary at `folder` opened from the menu, the lens shown, its first feature clicked, the Dashboard
    tab on show and `text_file` chosen by its Text file... button: (panel, dashboard)."""
    _open_from_menu(qtbot, w, state, monkeypatch, folder)
    panel = w.slot("Features").panel
    _lens_shown(qtbot, panel)
    _click_row(qtbot, panel.features_table, 0)
    click_tab(qtbot, panel.tabs, "Dashboard")
    dash = panel.dashboard
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(text_file), "")))
    qtbot.mouseClick(dash.file_button, Qt.MouseButton.LeftButton)
    return panel, dash


def _held_dashboard(monkeypatch, on_start=None):
    """The Features panel's dashboard job held in its worker until released (on_start(job) first): the real
    function, the started and release events."""
    from desktop_app.ui.panels import features as features_module

    real = features_module.cached_dashboard
    started, release = threading.Event(), threading.Event()

    def held(*args, job=None, **kwargs):
        if on_start is not None:
            on_start(job)
        started.set()
        release.wait(30)
        return real(*args, job=job, **kwargs)

    monkeypatch.setattr(features_module, "cached_dashboard", held)
    return real, started, release


def test_a_dashboard_run_cancelled_then_completed_and_cached(qtbot, demo_window, tmp_path, monkeypatch, text_file,
                                                             error_watch):
    from desktop_app.app.features import dashboard_cache_dir
    from desktop_app.core.features import top_contexts
    from desktop_app.core.files import is_own_folder
    from desktop_app.ui.panels import features as features_module

    w, state = demo_window
    folder = _dictionary(tmp_path / "sae")
    _open_from_menu(qtbot, w, state, monkeypatch, folder)
    panel = w.slot("Features").panel
    _lens_shown(qtbot, panel)
    _click_row(qtbot, panel.features_table, 0)
    k = panel.feature[1]
    click_tab(qtbot, panel.tabs, "Dashboard")
    dash = panel.dashboard
    assert f"Feature {k}" in dash.header.text()
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(text_file), "")))
    qtbot.mouseClick(dash.file_button, Qt.MouseButton.LeftButton)
    assert dash.file_label.text() == str(text_file)

    # held in the worker: Cancel, then let it go on to its first check
    real, started, release = _held_dashboard(monkeypatch)
    qtbot.mouseClick(dash.run_button, Qt.MouseButton.LeftButton)
    assert started.wait(20)
    assert dash.cancel_button.isEnabled() and not dash.run_button.isEnabled() and dash.progress.isVisible()
    qtbot.mouseClick(dash.cancel_button, Qt.MouseButton.LeftButton)
    release.set()
    qtbot.waitUntil(lambda: dash.run_button.isEnabled(), timeout=20_000)
    assert dash.status.text() == "Cancelled." and dash.contexts is None
    assert not any(dashboard_cache_dir().iterdir()) if dashboard_cache_dir().exists() else True

    # a completed run: the contexts core.features finds, the histogram, and the cache on disk
    monkeypatch.setattr(features_module, "cached_dashboard", real)
    qtbot.mouseClick(dash.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dash.contexts is not None, timeout=60_000)
    ref = top_contexts(state.loaded, state.dictionaries[0], text_file, k)
    assert dash.contexts_table.rowCount() == len(ref.rows) > 0
    assert [float(dash.contexts_table.item(r, 1).text()) for r in range(len(ref.rows))] == \
        pytest.approx([r[1] for r in ref.rows], rel=1e-3)
    assert dash.contexts_table.item(0, 3).text() == ref.rows[0][3].replace("\n", "\u21b5")
    assert "read from the cache" not in dash.status.text()
    bars = [i for i in dash.histogram.getPlotItem().items if type(i).__name__ == "BarGraphItem"]
    assert len(bars) == 1 and f"{ref.active_tokens:,} of {ref.tokens_seen:,}" in dash.fires_label.text()
    entries = list(dashboard_cache_dir().iterdir())
    assert len(entries) == 1 and is_own_folder(entries[0])
    qtbot.waitUntil(lambda: dash.run_button.isEnabled(), timeout=20_000)
    qtbot.mouseClick(dash.run_button, Qt.MouseButton.LeftButton)  # again: read back
    qtbot.waitUntil(lambda: "read from the cache" in dash.status.text(), timeout=20_000)
    assert [r[1:] for r in dash.contexts.rows] == [r[1:] for r in ref.rows] or \
        [round(r[1], 5) for r in dash.contexts.rows] == [round(r[1], 5) for r in ref.rows]
    error_watch.assert_clean()


def test_a_dashboard_run_shows_its_time_left_on_the_progress_bar(qtbot, demo_window, tmp_path, monkeypatch, text_file,
                                                                 error_watch):
    """As the CLI's progress lines (core.jobs.TimeLeft): the bar and the status line say about how long is left."""
    from desktop_app.core.jobs import TimeLeft

    w, state = demo_window
    panel, dash = _dashboard_of_first_feature(qtbot, w, state, monkeypatch, _dictionary(tmp_path / "sae"), text_file)

    # the job's clock: 4 s after its start it has read a quarter of the windows, so 12 s are left
    now = [1000.0]
    monkeypatch.setattr(TimeLeft, "clock", staticmethod(lambda: now[0]))

    def quarter_done(job) -> None:
        now[0] += 4.0
        job.progress(10, 40, "")

    _real, reported, release = _held_dashboard(monkeypatch, quarter_done)
    qtbot.mouseClick(dash.run_button, Qt.MouseButton.LeftButton)
    assert reported.wait(20)
    qtbot.waitUntil(lambda: dash.progress.value() == 10, timeout=10_000)
    assert dash.progress.isVisible() and dash.progress.maximum() == 40
    assert dash.progress.text() == "25% · about 12 s left"
    assert dash.status.text() == "Reading the text file: 10/40 windows, about 12 s left"
    release.set()
    qtbot.waitUntil(lambda: dash.contexts is not None and dash.run_button.isEnabled(), timeout=60_000)
    assert not dash.progress.isVisible()
    error_watch.assert_clean()


def test_a_feature_edit_from_the_menu_changes_generate(qtbot, demo_window, tmp_path, monkeypatch, error_watch):
    from desktop_app.core.generation import GenerationSession, GenerationSettings, process_logits

    w, state = demo_window
    folder = _dictionary(tmp_path / "sae")
    _open_from_menu(qtbot, w, state, monkeypatch, folder)
    panel = w.slot("Features").panel
    _lens_shown(qtbot, panel)
    table = panel.features_table
    k = int(table.item(0, 1).text())
    pos = table.visualRect(table.model().index(0, 1)).center()
    table.customContextMenuRequested.emit(pos)
    menu = panel.last_feature_menu
    assert menu.isVisible()
    assert [a.text() for a in menu.actions()] == [f"Zero feature {k}", f"Clamp feature {k} to…",
                                                 f"Scale feature {k} by…", f"Add feature {k}'s direction (steer)…"]
    asked = []

    def get_double(parent, title, label, value, *rest):
        asked.append((title, value))
        return 40.0, True

    monkeypatch.setattr(QInputDialog, "getDouble", staticmethod(get_double))
    with qtbot.waitSignal(state.interventions_changed, timeout=20_000):
        next(a for a in menu.actions() if a.text().startswith("Clamp")).trigger()
    assert asked and asked[0][0] == f"Clamp feature {k}"
    iv = state.interventions[0]
    assert iv.how == "features" and f"clamp f{k}=40" in iv.label
    strip = w.intervention_strip
    assert strip.isVisible() and len(strip.chips) == 1
    # the lens follows the edited model: the dictionary reads the edited activation
    edited_acts = feature_activations(state.loaded.model, state.token_ids, state.dictionaries,
                                      interventions=list(state.interventions))[0].acts
    assert not torch.allclose(edited_acts, _reference(state, folder).acts, atol=1e-3)
    qtbot.waitUntil(lambda: panel.lens is not None and torch.allclose(panel.lens[0][1].acts, edited_acts, atol=1e-5),
                    timeout=20_000)

    gen = click_panel_tab(qtbot, w, "Generate")
    qtbot.mouseClick(gen.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: gen.session is not None and not gen.busy and bool(gen.plain_bars.token_ids),
                    timeout=20_000)
    qtbot.waitUntil(lambda: "log p" in gen.plain_label.text(), timeout=20_000)
    assert gen.plain_box.isVisible() and gen.edited_title.isVisible()
    node = gen.session.current
    plain = GenerationSession(state.loaded, gen.session.ids(node), GenerationSettings())
    edited = GenerationSession(state.loaded, gen.session.ids(node), GenerationSettings(),
                               interventions=list(state.interventions))
    assert torch.allclose(node.next_logits, edited.root.next_logits, atol=1e-4)  # the bars: the edited model
    assert not torch.allclose(process_logits(plain.root.next_logits).model_probs,
                              process_logits(node.next_logits).model_probs, atol=1e-3)
    assert gen.plain_bars.token_ids[0] == int(plain.root.next_logits.argmax())

    # detaching the dictionary takes its edit away
    panel = click_panel_tab(qtbot, w, "Features")
    with qtbot.waitSignal(state.interventions_changed, timeout=20_000):
        qtbot.mouseClick(panel.detach_button, Qt.MouseButton.LeftButton)
    assert state.interventions == [] and state.dictionaries == []
    error_watch.assert_clean()


def test_attribution_bars_sum_to_the_hooks_direct_contribution(qtbot, demo_window, tmp_path, monkeypatch,
                                                               error_watch):
    w, state = demo_window
    folder = _dictionary(tmp_path / "sae")
    _open_from_menu(qtbot, w, state, monkeypatch, folder)
    panel = w.slot("Features").panel
    _lens_shown(qtbot, panel)
    click_tab(qtbot, panel.tabs, "Attribution")
    qtbot.waitUntil(lambda: panel.attr_chart.attribution is not None, timeout=20_000)
    fa = panel.attr_chart.attribution
    assert sum(panel.attr_chart.values) == pytest.approx(fa.direct, abs=1e-4)
    logits = state.loaded.model(torch.tensor([state.token_ids])).logits
    assert fa.token_id == int(logits[0, -1].argmax()) and fa.position == len(state.token_ids) - 1
    assert "sum to" in panel.attr_status.text()
    assert all(b.isEnabled() for b in panel.export_bar.buttons.values())  # the bars on show can be exported
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(tmp_path / "bars.npz"), "")))
    qtbot.mouseClick(panel.export_bar.buttons["Data"], Qt.MouseButton.LeftButton)
    saved = np.load(tmp_path / "bars.npz")
    assert sorted(saved.files) == sorted(panel.attr_chart.bars.arrays)
    for name, values in panel.attr_chart.bars.arrays.items():
        np.testing.assert_array_equal(saved[name], values)
    error_watch.assert_clean()


def test_the_attached_dictionaries_come_back_with_the_workspace(qtbot, model_dirs, isolated_user_files, tmp_path,
                                                                 monkeypatch):
    from desktop_app.ui.main_window import MainWindow
    from desktop_app.ui.state import AppState
    from desktop_app.ui.workspace import load_workspace, save_workspace

    w1, s1 = open_window(qtbot, model_dirs["demo"], text=TEXT)
    l1 = _dictionary(tmp_path / "l1", hook="blocks.1.hook_resid_post", seed=1)
    l2 = _dictionary(tmp_path / "l2", hook="blocks.2.hook_resid_post", seed=2)
    with qtbot.waitSignals([s1.dictionaries_changed] * 2, timeout=20_000):
        _drop(w1, l1, l2)
    qtbot.waitUntil(lambda: len(s1.dictionaries) == 2, timeout=20_000)
    path = tmp_path / "ws.json"
    save_workspace(path, w1.capture_workspace())
    assert sorted(load_workspace(path).dictionaries) == sorted([str(l1), str(l2)])

    s2 = AppState()
    w2 = MainWindow(s2)
    qtbot.addWidget(w2)
    w2.show()
    assert w2.open_workspace(path)  # the model opens in a worker; the dictionaries attach once it is there
    qtbot.waitUntil(lambda: len(s2.dictionaries) == 2, timeout=30_000)
    assert sorted(a.dictionary.path for a in s2.dictionaries) == sorted([str(l1), str(l2)])
    assert Path(s2.loaded.path) == Path(model_dirs["demo"])


def test_another_model_detaches_a_dictionary_that_does_not_fit_and_its_edit(qtbot, demo_window, model_dirs,
                                                                             tmp_path, monkeypatch):
    w, state = demo_window
    folder = _dictionary(tmp_path / "sae", hook="blocks.1.hook_resid_post")  # a layer the llama model has
    _open_from_menu(qtbot, w, state, monkeypatch, folder)
    panel = w.slot("Features").panel
    _lens_shown(qtbot, panel)
    k = int(panel.features_table.item(0, 1).text())
    panel.features_table.customContextMenuRequested.emit(
        panel.features_table.visualRect(panel.features_table.model().index(0, 1)).center())
    with qtbot.waitSignal(state.interventions_changed, timeout=20_000):
        next(a for a in panel.last_feature_menu.actions() if a.text() == f"Zero feature {k}").trigger()
    assert len(state.interventions) == 1
    notices = []
    state.notice.connect(notices.append)
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        w.open_model(model_dirs["llama"])  # width 32: the demo's dictionary (128) does not fit
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    assert state.dictionaries == [] and state.interventions == [] and panel.dict_list.count() == 0
    assert any(n.startswith("Detached sae: ") and str(folder) in n and "d_in is 128" in n for n in notices), notices
    assert panel.lens is None and "Attach a sparse dictionary" in panel.status.text()


def test_the_dashboard_cache_removes_only_its_own_folders(tmp_path):
    import os

    from desktop_app.app.features import prune_dashboard_cache
    from desktop_app.core.files import atomic_write_dir

    root = tmp_path / "cache"
    names = [f"{i:032x}" for i in range(5)]
    for i, name in enumerate(names):
        atomic_write_dir(root / name, lambda tmp: (tmp / "dashboard.json").write_text("{}", encoding="utf-8"))
        os.utime(root / name, ns=(i * 10**9, i * 10**9))  # oldest first
    mine_with_a_user_file = root / names[0]
    (mine_with_a_user_file / "notes.txt").write_text("the user's", encoding="utf-8")
    users = root / f"{99:032x}"  # named like an entry, but without the app's manifest
    users.mkdir()
    (users / "dashboard.json").write_text("{}", encoding="utf-8")
    os.utime(users, ns=(0, 0))
    removed = prune_dashboard_cache(root, keep=2)
    assert sorted(p.name for p in removed) == sorted(names[1:3])  # the oldest of the app's own, beyond 2
    assert sorted(p.name for p in root.iterdir()) == sorted([names[0], names[3], names[4], users.name])
    assert (mine_with_a_user_file / "notes.txt").is_file() and (users / "dashboard.json").is_file()


def test_a_lens_computed_for_the_previous_dictionaries_is_never_shown(qtbot, demo_window, tmp_path, monkeypatch,
                                                                     error_watch):
    """The lens of one dictionary, still running when a second is attached, is dropped (InputKey's
    dictionaries part): only the lens of both is ever shown."""
    from desktop_app.ui.panels import features as features_module

    w, state = demo_window
    real, release, calls = features_module.lens_on, threading.Event(), []

    def held(*args, **kwargs):
        calls.append(len(args[2]))
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(features_module, "lens_on", held)
    _open_from_menu(qtbot, w, state, monkeypatch, _dictionary(tmp_path / "l1", hook="blocks.1.hook_resid_post"))
    panel = w.slot("Features").panel
    shown = []
    show = panel._show_lens
    monkeypatch.setattr(panel, "_show_lens", lambda dictionaries, ids, result: (shown.append(len(result)),
                                                                                 show(dictionaries, ids, result)))
    qtbot.waitUntil(lambda: calls == [1], timeout=20_000)  # held in the worker
    first = panel._lens_job
    with qtbot.waitSignal(state.dictionaries_changed, timeout=20_000):
        _drop(w, _dictionary(tmp_path / "l2", hook="blocks.2.hook_resid_post"))
    qtbot.waitUntil(lambda: calls == [1, 2], timeout=20_000)
    release.set()
    _lens_shown(qtbot, panel, 2)
    qtbot.waitUntil(lambda: first.done and panel._lens_job.done, timeout=20_000)
    qtbot.wait(200)  # what the first job emitted has reached the UI thread (and was dropped there)
    assert first is not panel._lens_job and not first.detached
    assert shown == [2]
    error_watch.assert_clean()


def test_a_generated_step_clicked_in_generate_shows_its_features(qtbot, demo_window, tmp_path, monkeypatch,
                                                                 error_watch):
    """Generate's step inspected (its chip clicked): the Features lens reads that step's tokens, the new
    token last, as every inspecting panel does."""
    w, state = demo_window
    folder = _dictionary(tmp_path / "sae")
    _open_from_menu(qtbot, w, state, monkeypatch, folder)
    gen = click_panel_tab(qtbot, w, "Generate")
    for steps in (1, 2):
        qtbot.mouseClick(gen.step_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: gen.session is not None and not gen.busy
                        and gen.strip.count() == len(gen.session.prompt) + steps, timeout=20_000)
    n_prompt = len(gen.session.prompt)
    new_token = gen.session.current.path()[1].token  # the first generated token
    # step 2's chip: what the model read to pick it, i.e. the prompt and the first generated token
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        qtbot.mouseClick(gen.strip.canvas, Qt.MouseButton.LeftButton, pos=gen.strip.chip_center(n_prompt + 1))
    assert state.trace_source == "generation" and len(state.token_ids) == n_prompt + 1
    assert state.token_ids[-1] == new_token
    panel = click_panel_tab(qtbot, w, "Features")
    qtbot.waitUntil(lambda: panel.lens is not None and panel.lens_ids == state.token_ids, timeout=20_000)
    ref = _reference(state, folder)
    assert panel.token == n_prompt  # the new token
    assert [int(panel.features_table.item(r, 1).text()) for r in range(panel.features_table.rowCount())] == \
        [k for k, _ in ref.top(n_prompt, panel.TOP_FEATURES)]
    error_watch.assert_clean()


def _zero_first_feature(panel) -> int:
    table = panel.features_table
    k = int(table.item(0, 1).text())
    table.customContextMenuRequested.emit(table.visualRect(table.model().index(0, 1)).center())
    next(a for a in panel.last_feature_menu.actions() if a.text() == f"Zero feature {k}").trigger()
    return k


def test_an_edit_at_a_normalised_input_is_refused_in_one_line(qtbot, demo_window, tmp_path, monkeypatch, error_watch):
    """Issue 29: an SAE of ln1.hook_normalized (what the attention reads after its norm) has features but no edit:
    Zero says why in one line and changes nothing."""
    w, state = demo_window
    _open_from_menu(qtbot, w, state, monkeypatch, _dictionary(tmp_path / "sae", hook="blocks.1.ln1.hook_normalized"))
    panel = w.slot("Features").panel
    _lens_shown(qtbot, panel)
    k = _zero_first_feature(panel)
    line = panel.status.text()
    assert line.startswith(f"Cannot edit feature {k}: ") and "\n" not in line
    assert "blocks.1.ln1.hook_normalized" in line and "cannot be edited" in line and state.interventions == []
    error_watch.assert_clean()


def test_a_transcoder_reading_ln1_hook_normalized_is_edited_from_the_menu(qtbot, demo_window, tmp_path, monkeypatch,
                                                                          error_watch):
    w, state = demo_window
    g = torch.Generator().manual_seed(1)
    transcoder = SparseDictionary(torch.randn(128, 64, generator=g) * 0.1, torch.randn(64, generator=g) * 0.1,
                                  torch.randn(64, 128, generator=g) * 0.1, torch.zeros(128),
                                  hook="blocks.1.ln1.hook_normalized", hook_out="blocks.1.hook_attn_out")
    save_dictionary(transcoder, tmp_path / "transcoder")
    _open_from_menu(qtbot, w, state, monkeypatch, tmp_path / "transcoder")
    panel = w.slot("Features").panel
    _lens_shown(qtbot, panel)
    with qtbot.waitSignal(state.interventions_changed, timeout=20_000):
        k = _zero_first_feature(panel)
    (iv,) = state.interventions
    assert iv.how == "features" and f"zero f{k}" in iv.label and iv.point == "blocks.1.attn.out"
    error_watch.assert_clean()


def test_a_zeroed_feature_is_shown_inactive_and_what_ifs_bars_still_add_up(qtbot, demo_window, tmp_path, monkeypatch,
                                                                          error_watch):
    """Issue 41: a TopK dictionary at layer 2, its top feature zeroed from the lens' menu: the lens no longer
    lists it (it read 2.988 -> 1.524 before: the edited activation re-encoded), the colouring shows 0 for it,
    the attribution gives it nothing, and What if's direct logit attribution has a bar for the edit so the
    bars sum to the logit."""
    w, state = demo_window
    g = torch.Generator().manual_seed(3)
    topk = SparseDictionary(torch.randn(128, 64, generator=g) * 0.1, torch.randn(64, generator=g) * 0.1,
                            torch.randn(64, 128, generator=g) * 0.1, torch.randn(128, generator=g) * 0.1,
                            architecture="topk", k=8, hook="blocks.2.hook_resid_post")
    save_dictionary(topk, tmp_path / "topk")
    _open_from_menu(qtbot, w, state, monkeypatch, tmp_path / "topk")
    panel = w.slot("Features").panel
    _lens_shown(qtbot, panel)
    before = panel.lens
    _click_row(qtbot, panel.features_table, 0)  # colour by the top feature, then zero it
    with qtbot.waitSignal(state.interventions_changed, timeout=20_000):
        k = _zero_first_feature(panel)
    assert panel.feature[1] == k
    qtbot.waitUntil(lambda: panel.lens is not None and panel.lens is not before, timeout=20_000)
    run = panel.lens[0][1]
    assert float(run.acts[:, k].abs().max()) == 0.0
    shown = [int(panel.features_table.item(r, 1).text()) for r in range(panel.features_table.rowCount())]
    assert shown and k not in shown
    qtbot.waitUntil(lambda: panel.strip.canvas.values is not None, timeout=20_000)
    assert max(abs(v) for v in panel.strip.canvas.values) == 0.0
    click_tab(qtbot, panel.tabs, "Attribution")
    qtbot.waitUntil(lambda: panel.attr_chart.attribution is not None, timeout=20_000)
    fa = panel.attr_chart.attribution
    assert k not in fa.features.tolist() and fa.total == pytest.approx(fa.direct, abs=1e-4)

    whatif = click_panel_tab(qtbot, w, "What if")
    qtbot.mouseClick(whatif.attribute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: whatif.dla_chart.attribution is not None, timeout=20_000)
    attr = whatif.dla_chart.attribution
    assert attr.sum == pytest.approx(attr.logit, abs=1e-3)
    assert "L2 edit resid_post" in whatif.dla_chart.labels
    error_watch.assert_clean()


def test_a_workspace_listing_a_thousand_gone_dictionaries_says_so_once(qtbot, model_dirs, isolated_user_files,
                                                                       tmp_path, monkeypatch):
    """Issue 41: 1,000 dictionary folders deleted since the workspace was saved gave a modal dialog each and
    RecursionErrors in closeEvent; now one line for all of them, the ones still there attach, the window closes."""
    from PySide6.QtWidgets import QMessageBox

    from desktop_app.ui.main_window import MainWindow
    from desktop_app.ui.state import AppState
    from desktop_app.ui.workspace import load_workspace, save_workspace

    w1, _ = open_window(qtbot, model_dirs["demo"], text=TEXT)
    kept = _dictionary(tmp_path / "l1", hook="blocks.1.hook_resid_post", seed=1)
    ws = w1.capture_workspace()
    ws.dictionaries = [str(kept)] + [str(tmp_path / f"gone-{i}") for i in range(1000)]
    save_workspace(tmp_path / "ws.json", ws)
    assert len(load_workspace(tmp_path / "ws.json").dictionaries) == 1001
    shown: list[str] = []
    monkeypatch.setattr(QMessageBox, "warning", lambda _parent, _title, text, *a, **k: shown.append(text))
    s2 = AppState()
    w2 = MainWindow(s2)
    qtbot.addWidget(w2)
    w2.show()
    assert w2.open_workspace(tmp_path / "ws.json")
    qtbot.waitUntil(lambda: len(s2.dictionaries) == 1, timeout=30_000)
    assert len(shown) == 1 and shown[0].startswith("1000 dictionary folder(s)") and "gone-0" in shown[0], shown[:3]
    assert "\n" not in shown[0] and len(shown[0]) < 600
    w2.close()
