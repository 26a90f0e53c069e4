"""The tokenizer's special tokens, clicked: a BERT folder's text shows [CLS] ... [SEP] chips and the
Model panel says which special tokens were added; unticking "Add the tokenizer's special tokens"
takes them away (remembered for the next start); the Generate panel fills the [MASK] that sits one
position further on, between [CLS] and [SEP]."""
from __future__ import annotations

from PySide6.QtCore import Qt

from desktop_app.core.generation import MaskedFillSession
from desktop_app.ui import settings as app_settings

from .walkthrough import click_panel_tab, open_window

LEFT = Qt.MouseButton.LeftButton
TEXT = "the dog sat on a log"


def chips(panel) -> list[str]:
    return list(panel.token_strip.canvas.strings)


def type_text(qtbot, state, panel, text: str) -> None:
    panel.text_edit.setFocus()
    panel.text_edit.selectAll()
    qtbot.keyClicks(panel.text_edit, text)
    qtbot.waitUntil(lambda: state.text == text, timeout=30_000)
    qtbot.waitUntil(lambda: (state._trace_job is None) and state.trace is not None,
                    timeout=30_000)


def test_special_tokens_shown_and_switched_off_in_the_model_panel(qtbot, model_dirs, isolated_user_files):
    window, state = open_window(qtbot, model_dirs["bert"], text="the cat")
    panel = click_panel_tab(qtbot, window, "Model")
    tok = state.loaded.tokenizer
    bare = tok.encode(TEXT)
    assert panel.special_check.isChecked() and panel.special_check.isEnabled()

    type_text(qtbot, state, panel, TEXT)
    qtbot.waitUntil(lambda: bool(chips(panel)) and chips(panel)[0] == "[CLS]", timeout=30_000)
    assert state.token_ids == [tok.special_id("cls"), *bare, tok.special_id("sep")]
    assert chips(panel) == ["[CLS]", *tok.token_strings(bare), "[SEP]"]
    assert panel.special_label.text() == ("Special tokens added: [CLS] (start), [SEP] (end) — the tokenizer's "
                                          "post-processor")
    assert panel.count_label.text().startswith(f"{len(bare) + 2} tokens")

    qtbot.mouseClick(panel.special_check, LEFT, pos=panel.special_check.rect().center())
    assert not panel.special_check.isChecked()
    qtbot.waitUntil(lambda: state.token_ids == bare, timeout=30_000)
    assert chips(panel) == tok.token_strings(bare) and "[CLS]" not in chips(panel) and "[SEP]" not in chips(panel)
    assert panel.special_label.text() == "Special tokens: off (the text as typed)"
    assert state.trace is not None and state.trace["logits"].shape[1] == len(bare)
    assert app_settings.special_tokens_on() is False  # remembered

    # the saved choice is applied at the next start (MainWindow.apply_preferences)
    window2, state2 = open_window(qtbot, model_dirs["bert"], text=TEXT)
    window2.apply_preferences(app_settings.Preferences.load())
    qtbot.waitUntil(lambda: state2.token_ids == bare, timeout=30_000)
    panel2 = click_panel_tab(qtbot, window2, "Model")
    assert not panel2.special_check.isChecked() and chips(panel2) == tok.token_strings(bare)

    qtbot.mouseClick(panel.special_check, LEFT, pos=panel.special_check.rect().center())
    qtbot.waitUntil(lambda: bool(chips(panel)) and chips(panel)[0] == "[CLS]", timeout=30_000)
    assert app_settings.special_tokens_on() is True


def test_generate_fills_the_mask_between_the_special_tokens(qtbot, model_dirs, isolated_user_files):
    window, state = open_window(qtbot, model_dirs["bert"], text="the cat sat on the mat")
    bar = window.tabs.tabBar()
    index = next(i for i in range(bar.count()) if bar.tabText(i) == "Generate")
    qtbot.mouseClick(bar, LEFT, pos=bar.tabRect(index).center())
    panel = window.panel("Generate")
    qtbot.waitUntil(lambda: panel.start_button.isVisible() and panel.start_button.isEnabled(), timeout=20_000)
    tok = state.loaded.tokenizer
    panel.prompt.setFocus()
    panel.prompt.selectAll()
    qtbot.keyClicks(panel.prompt, "the cat [MASK] on the mat")
    qtbot.mouseClick(panel.start_button, LEFT)
    qtbot.waitUntil(lambda: isinstance(panel.session, MaskedFillSession), timeout=20_000)
    qtbot.waitUntil(lambda: not panel.busy, timeout=20_000)
    ids = panel.session.ids()
    assert ids[0] == tok.special_id("cls") and ids[-1] == tok.special_id("sep")
    assert panel.session.masked == [3]  # [CLS] the cat [MASK]: one position further than in the bare text
    assert ids[3] == tok.mask_token_id
    qtbot.mouseClick(panel.step_button, LEFT)
    qtbot.waitUntil(lambda: len(panel.session.history) == 1, timeout=20_000)
    qtbot.waitUntil(lambda: not panel.busy, timeout=20_000)
    assert panel.session.history[0].position == 3
    filled = panel.session.ids()
    assert filled[:3] == ids[:3] and filled[4:] == ids[4:] and filled[3] != tok.mask_token_id
