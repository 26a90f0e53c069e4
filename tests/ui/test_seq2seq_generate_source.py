"""An encoder-decoder's Generate box starts with the whole text of the Model panel, its source (a translation
of the sentence typed there, not of its first six words, as a decoder's continuation prompt is cut)."""
from __future__ import annotations

from translate_models import save_translate_model

from .walkthrough import click_panel_tab, open_window

SOURCE = "the black dog sees a white cow and the small cat runs"


def test_the_generate_source_is_the_model_panels_whole_text(qtbot, tmp_path, isolated_user_files, error_watch):
    folder = tmp_path / "marian"
    save_translate_model(folder, d_model=16, n_layers=1, n_decoder_layers=1, n_heads=2, d_ff=32, context_length=24)
    w, state = open_window(qtbot, folder, text=SOURCE, watch=error_watch)
    panel = click_panel_tab(qtbot, w, "Generate")
    assert panel.prompt.text() == SOURCE
    error_watch.assert_clean()
    w.close()


def test_a_source_longer_than_the_context_starts_the_box_with_its_first_words(qtbot, tmp_path, isolated_user_files,
                                                                             error_watch):
    folder = tmp_path / "marian"
    save_translate_model(folder, d_model=16, n_layers=1, n_decoder_layers=1, n_heads=2, d_ff=32, context_length=8)
    w, state = open_window(qtbot, folder, text=SOURCE, watch=error_watch)  # 12 words > 8 positions
    panel = click_panel_tab(qtbot, w, "Generate")
    assert panel.prompt.text() == " ".join(SOURCE.split()[:6])  # a start that fits, as before
    error_watch.assert_clean()
    w.close()
