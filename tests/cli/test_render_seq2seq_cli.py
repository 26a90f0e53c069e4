"""`render` on an encoder-decoder (T5, BART, Marian) is refused in one line that says where its views are;
before, it crashed with a traceback (run_with_trace() missing 'tgt_ids')."""
from __future__ import annotations

import pytest

from desktop_app.cli import main
from desktop_app.core.checkpoints import new_model, save_model_folder
from desktop_app.core.families import REGISTRY

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("view", ["attention", "residual-norms"])
def test_render_of_an_encoder_decoder_is_refused_in_one_line(tmp_path, capsys, view):
    cfg = REGISTRY["marian"].preset(vocab_size=40, d_model=16, n_layers=1, n_decoder_layers=1, n_heads=2, d_ff=32,
                                    context_length=16, pad_token_id=0, eos_token_id=2, decoder_start_token_id=1)
    folder = tmp_path / "marian"
    save_model_folder(new_model(cfg, seed=0), folder)
    out = tmp_path / "x.png"
    try:
        code = main(["render", str(folder), "--ids", "3,4,5", "--view", view, "--out", str(out)])
    except TypeError as exc:  # what it did before
        pytest.fail(f"render crashed: {exc}")
    err = capsys.readouterr().err.strip()
    assert code != 0 and "encoder-decoder" in err and "trace --target-text" in err and "\n" not in err, err
    assert not out.exists()
