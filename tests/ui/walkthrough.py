"""The four models every clicked walkthrough runs on (issue 13), made once per test session.

- ``demo``: the embedded demo model (GPT-2 style, byte-level BPE tokenizer).
- ``bert``: a BERT-style encoder with an MLM head and a WordPiece ``tokenizer.json`` that carries
  the padding ("Fixed 128") and truncation (128) settings sentence-embedding BERTs ship with.
- ``llama``: a LLaMA-style decoder with grouped-query attention (4 query heads, 2 key/value heads)
  and a byte-level BPE tokenizer.
- ``noktok``: a GPT-2 style decoder with no tokenizer at all (the text box takes token ids).

Use ``model_dirs`` (a dict name -> folder) and ``open_window(qtbot, folder)`` to get a MainWindow
with that model open and its text traced. ``ErrorWatch`` fails a test when an error dialog or an
unexpected-error log line appears.
"""
from __future__ import annotations

import logging
from pathlib import Path

from desktop_app.core.checkpoints import new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.tokenizer import Tokenizer, train_bpe
from desktop_app.paths import demo_model_dir

WALKTHROUGH_MODELS = ("demo", "bert", "llama", "notok")

# Text each model can encode: what a person would type for that model.
TEXTS = {
    "demo": "Alice was beginning to get very tired of sitting by her sister on the bank.",
    "bert": "the cat sat on the mat and the dog sat on the log .",
    "llama": "the cat sat on the mat and the dog sat on the log.",
    "notok": "1 2 3 4 5 6 7 8 9 10 11 12",
}

_WORDS = "the cat sat on mat and dog log a . , is was in it".split()


def bert_wordpiece_tokenizer(pad_to: int = 128) -> Tokenizer:
    """A small WordPiece tokenizer as a sentence-embedding BERT ships it: [CLS]/[SEP]/[MASK]/[PAD]/
    [UNK], padding to a fixed length and truncation at the same length switched on in the file."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {s: i for i, s in enumerate(specials)}
    for w in _WORDS:
        vocab.setdefault(w, len(vocab))
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab.setdefault(c, len(vocab))
        vocab.setdefault("##" + c, len(vocab))
    tok = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.add_special_tokens(specials)
    tok.enable_padding(length=pad_to, pad_id=vocab["[PAD]"], pad_token="[PAD]")
    tok.enable_truncation(max_length=pad_to)
    return Tokenizer(tok)


def make_model_dirs(root: Path) -> dict[str, Path]:
    """Write the three made models under `root` (the demo model ships); returns name -> folder."""
    dirs = {"demo": Path(demo_model_dir())}

    bert_tok = bert_wordpiece_tokenizer()
    cfg = ModelConfig.bert(vocab_size=bert_tok.vocab_size, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                           context_length=512, init_std=0.2)
    dirs["bert"] = root / "bert-encoder"
    save_model_folder(new_model(cfg, seed=0), dirs["bert"], tokenizer=bert_tok)

    llama_tok = train_bpe([TEXTS["llama"] * 20, "Alice and the rabbit hole."], vocab_size=300)
    cfg = ModelConfig.llama(vocab_size=llama_tok.vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                            d_ff=64, context_length=128, init_std=0.2)
    dirs["llama"] = root / "llama-gqa"
    save_model_folder(new_model(cfg, seed=1), dirs["llama"], tokenizer=llama_tok)

    cfg = ModelConfig.gpt2(vocab_size=300, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=64,
                           init_std=0.2)
    dirs["notok"] = root / "gpt2-no-tokenizer"
    save_model_folder(new_model(cfg, seed=2), dirs["notok"])
    return dirs


class ErrorWatch(logging.Handler):
    """Collects every ERROR log record and every error dialog the app tries to show.

    Install with ``ErrorWatch.install(monkeypatch)``; ``watch.assert_clean()`` fails the test with
    what was seen."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(f"log: {record.getMessage()}")

    @classmethod
    def install(cls, monkeypatch) -> "ErrorWatch":
        from PySide6.QtWidgets import QMessageBox

        watch = cls()
        logging.getLogger().addHandler(watch)
        monkeypatch.setattr(logging.getLogger(), "level", logging.DEBUG, raising=False)

        def dialog(kind):
            def show(parent, title, text, *args, **kwargs):
                watch.seen.append(f"{kind} dialog: {title}: {text}")
                return QMessageBox.StandardButton.Ok
            return show

        monkeypatch.setattr(QMessageBox, "critical", staticmethod(dialog("critical")))
        monkeypatch.setattr(QMessageBox, "warning", staticmethod(dialog("warning")))
        return watch

    def watch_state(self, state) -> None:
        """Errors the app reports through AppState.error (shown in the status bar) count too."""
        state.error.connect(lambda message: self.seen.append(f"state error: {message}"))
        state.model_load_failed.connect(lambda message: self.seen.append(f"load failed: {message}"))

    def remove(self) -> None:
        logging.getLogger().removeHandler(self)

    def assert_clean(self) -> None:
        assert not self.seen, "errors appeared during the walkthrough:\n" + "\n".join(self.seen)


def open_window(qtbot, folder: Path, text: str | None = None, name: str | None = None,
                watch: ErrorWatch | None = None):
    """A shown MainWindow with `folder` open and `text` (default: the model's walkthrough text)
    traced. Returns (window, state). With `watch`, the state's errors are collected from the start."""
    from desktop_app.ui.main_window import MainWindow
    from desktop_app.ui.state import AppState

    state = AppState()
    if watch is not None:
        watch.watch_state(state)
    window = MainWindow(state)
    qtbot.addWidget(window)
    window.show()
    if text is None and name is not None:
        text = TEXTS[name]
    if text is not None:
        state.text = text
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(folder)
    # Not `_trace_job.done`: that is set in the worker before its result reaches the UI thread.
    # The result (or error) callback clears the job, so None means the trace was shown.
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    return window, state


def click_tab(qtbot, tabs, title: str):
    """Click the tab `title` of a QTabWidget on its tab bar, as a person does; returns its page."""
    from PySide6.QtCore import Qt

    bar = tabs.tabBar()
    index = next(i for i in range(bar.count()) if bar.tabText(i) == title)
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(index).center())
    assert tabs.currentIndex() == index
    return tabs.widget(index)


def shown_tab_titles(tabs) -> list[str]:
    """The titles of a QTabWidget's tabs a person can see (a hidden tab has no place on the bar to click)."""
    return [tabs.tabText(i) for i in range(tabs.count()) if tabs.isTabVisible(i)]


def click_panel_tab(qtbot, window, title: str):
    """Click the main window's tab `title` on its tab bar, as a person does; returns the panel."""
    click_tab(qtbot, window.tabs, title)
    return window.slot(title).panel


def type_into(qtbot, field, text: str) -> None:
    """Replace a line edit's or spin box's text as a person does: select all, type, Tab away."""
    from PySide6.QtCore import Qt

    field.setFocus()
    qtbot.keyClick(field, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(field, text)
    qtbot.keyClick(field, Qt.Key.Key_Tab)


def choose_item(qtbot, combo, text: str) -> None:
    """Pick a combo box's item as a person does: open the popup, then click the item."""
    from PySide6.QtCore import Qt

    combo.showPopup()
    view = combo.view()
    index = combo.model().index(combo.findText(text), 0)
    assert index.isValid(), (text, [combo.itemText(i) for i in range(combo.count())])
    view.scrollTo(index)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=view.visualRect(index).center())
    assert combo.currentText() == text


def show_generation_panel(qtbot, loaded, size=(1000, 700)):
    """A Generate panel alone, on its own AppState with `loaded` open, shown at `size`."""
    from desktop_app.ui.panels.generation import GenerationPanel
    from desktop_app.ui.state import AppState

    state = AppState()
    state.loaded = loaded
    panel = GenerationPanel(state)
    qtbot.addWidget(panel)
    panel.resize(*size)
    panel.show()
    state.model_changed.emit(loaded)
    return panel


def run_app_main(main, drive, seen: dict, timeout_ms: int = 60_000) -> int:
    """main() (ui.app.main, run in this process) while drive() is called every 50 ms until it returns
    True (it finds the window main built, looks at it, closes it); after timeout_ms a watchdog ends
    main's app.exec() with 99, noting seen["watchdog"] and the visible windows, so a start that never
    settles fails its test instead of hanging it. The poll and the watchdog end with main: a watchdog
    left running once fired in a later test, outside app.exec() (conftest.event_loops_run says what
    that breaks)."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    def watchdog() -> None:
        seen["watchdog"] = True
        seen["visible windows"] = [type(w).__name__ for w in QApplication.topLevelWidgets() if w.isVisible()]
        QApplication.instance().exit(99)

    def poll() -> None:
        if not drive():  # (stopped meanwhile: drive may run a nested loop, waitUntil, that would call it again)
            poller.start()

    watch = QTimer(singleShot=True, interval=timeout_ms)
    watch.timeout.connect(watchdog)
    poller = QTimer(singleShot=True, interval=50)
    poller.timeout.connect(poll)
    watch.start()
    poller.start(0)
    try:
        return main()
    finally:
        watch.stop()
        poller.stop()


def graph_with_its_top_feature_clicked(qtbot, window, tmp_path, monkeypatch):
    """The Graph panel of `window` (the demo model, a text typed) over random cross-layer transcoders (File dialog
    answered with them), computed by its button, its most influential feature node clicked: (panel, node)."""
    import numpy as np
    from PySide6.QtCore import QPointF, Qt
    from PySide6.QtWidgets import QFileDialog

    from desktop_app.core.graphs.transcoders import random_transcoders

    random_transcoders(tmp_path / "clt", 4, 128, 64, cross_layer=True, seed=2)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(tmp_path / "clt")))
    panel = click_panel_tab(qtbot, window, "Graph")
    qtbot.mouseClick(panel.compute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.layout_data is not None and panel.compute_button.isEnabled(), timeout=120_000)
    d = panel.full_layout
    top = next(int(i) for i in np.argsort(-d.size) if d.kind[i] == 0)
    view = panel.plot.getPlotItem().vb
    pos = panel.plot.mapFromScene(view.mapViewToScene(QPointF(d.x[top], d.y[top])))
    qtbot.mouseClick(panel.plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    return panel, top


def set_tiny_sort_run(panel, steps: int, eval_every: int, checkpoint_every: int | None = None) -> None:
    """The Train panel's form set for a tiny sorting run (1 layer, 2 heads, width 32), as a person fills it."""
    panel.task.setCurrentText("sort")
    panel.length.setValue(5)
    panel.layers.setValue(1)
    panel.heads.setValue(2)
    panel.d_model.setValue(32)
    panel.d_ff.setValue(64)
    panel.context.setValue(16)
    panel.steps.setValue(steps)
    panel.eval_every.setValue(eval_every)
    if checkpoint_every is not None:
        panel.checkpoint_every.setValue(checkpoint_every)
