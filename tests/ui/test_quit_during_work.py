"""Issue 13 defect 9: quitting while work runs. A Lipschitz sweep in flight is cancelled and waited for,
so nothing reaches the closed window (it used to print "Signal source has been deleted" tracebacks
after the window closed); a training run in flight is not stopped without asking."""
from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, Qt
from PySide6.QtWidgets import QMessageBox

from desktop_app.ui import workers

from .walkthrough import click_panel_tab, open_window, set_tiny_sort_run, type_into






def test_quit_during_a_sweep_cancels_it_cleanly(qtbot, model_dirs, isolated_user_files, error_watch, capfd):
    window, _state = open_window(qtbot, model_dirs["demo"], name="demo", watch=error_watch)
    panel = click_panel_tab(qtbot, window, "Lipschitz")
    qtbot.keyClicks(panel.source, "Synthetic")
    type_into(qtbot, panel.d, "64")
    type_into(qtbot, panel.lengths, "4,256,512,1024,2048")  # tens of seconds of work
    type_into(qtbot, panel.samples, "8")
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    job = panel._job
    qtbot.waitUntil(lambda: panel.table.rowCount() >= 8, timeout=30_000)  # n = 4 is in: the sweep is under way
    assert not job.done

    window.quit_action.trigger()
    assert not window.isVisible()
    assert job.done  # cancelled and waited for before the window went away
    window.deleteLater()  # as the application's end deletes it
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    qtbot.wait(300)  # anything still queued for the deleted panels would arrive now
    assert not workers.active_jobs()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "has been deleted" not in err, err
    error_watch.assert_clean()


def test_quit_during_training_asks_first(qtbot, model_dirs, isolated_user_files, error_watch, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the run's process: one thread for a tiny model
    window, _state = open_window(qtbot, model_dirs["demo"], name="demo", watch=error_watch)
    panel = click_panel_tab(qtbot, window, "Train")
    set_tiny_sort_run(panel, steps=100_000, eval_every=5, checkpoint_every=100_000)
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: any(e["event"] == "step" for e in panel.events), timeout=90_000)

    answers, asked = [QMessageBox.StandardButton.No, QMessageBox.StandardButton.Yes], []

    def question(parent, title, text, *args, **kwargs):
        asked.append(text)
        return answers.pop(0)

    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    window.quit_action.trigger()
    assert len(asked) == 1 and "training run is in progress" in asked[0]
    assert window.isVisible() and panel.running  # No: nothing stopped, nothing closed

    window.quit_action.trigger()
    assert len(asked) == 2 and not window.isVisible()
    qtbot.waitUntil(lambda: not panel.running, timeout=30_000)
    assert any(e["event"] == "stopped" for e in panel.events)  # stopped as Stop does: with its checkpoint
    error_watch.assert_clean()
