"""app/tracing.py: the one record-name policy, and the CLI's trace file equal to the app's trace.

`trace --out x.npz` records FILE_NAMES, the GUI's AppState workers record VIEWS; both go through
trace_input / trace_image, and the file's arrays are what file_arrays reads from the GUI's trace."""
from __future__ import annotations

import numpy as np
import pytest

from desktop_app.app.images import image_pixel_values
from desktop_app.app.tracing import (FILE, FILE_NAMES, TRACE_ALL_BELOW, VIEW_NAMES, file_arrays,
                                     trace_image, trace_image_or_digit, trace_input, trace_names)
from desktop_app.cli import main
from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.interventions import parse_ablations

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_trace_everything_below_the_size_rule():
    small = ModelConfig.gpt2(vocab_size=100, d_model=8, n_layers=2, n_heads=2, d_ff=16, context_length=64)
    assert trace_names(small, 64) == ["*"]
    big = ModelConfig.gpt2(vocab_size=50_000, d_model=8, n_layers=10, n_heads=2, d_ff=16, context_length=1024)
    assert 50_000 * 100 * 10 == TRACE_ALL_BELOW and trace_names(big, 100) == ["*"]
    names = trace_names(big, 101)
    assert "*" not in names and "logits" in names and "blocks.*.attn.*" in names
    assert "logits" not in trace_names(big, 101, final_logits=False)


def test_a_file_records_its_names_whatever_the_size_and_a_vit_never_everything(tmp_path):
    small = ModelConfig.gpt2(vocab_size=100, d_model=8, n_layers=2, n_heads=2, d_ff=16, context_length=64)
    assert trace_names(small, 64, purpose=FILE) == list(FILE_NAMES)
    assert "logits" not in trace_names(small, 64, final_logits=False, purpose=FILE)
    vit = load_model_folder(_vit_dir(tmp_path)).config
    assert trace_names(vit, 17) == list(VIEW_NAMES)  # its recorded logit lens would read [CLS] alone
    with pytest.raises(ValueError, match="trace purpose 'npz': one of views, file"):
        trace_names(small, 4, purpose="npz")


def _text_dir(tmp_path):
    folder = tmp_path / "gpt2"
    cfg = ModelConfig.gpt2(vocab_size=20, d_model=16, n_layers=2, n_heads=2, d_ff=32, context_length=16)
    save_model_folder(new_model(cfg, seed=0), folder)
    return folder


def _vit_dir(tmp_path):
    import json

    from desktop_app.core.families.vit import preset
    from desktop_app.core.training.image_tasks import pixel_settings, preprocessor_config

    folder = tmp_path / "vit"
    if not folder.exists():
        cfg = preset(d_model=24, n_layers=2, n_heads=3, d_ff=48, image_size=8, patch_size=2, num_channels=1,
                     vocab_size=10, lm_head=True)
        save_model_folder(new_model(cfg, seed=0), folder, extra_files={
            "preprocessor_config.json": json.dumps(preprocessor_config(pixel_settings(8, 1))).encode()})
    return folder


def _cli_arrays(*args) -> dict:
    out = args[args.index("--out") + 1]
    assert main(["trace", *map(str, args)]) == 0
    with np.load(out) as f:
        return dict(f)


def _assert_same(file: dict, app: dict) -> None:
    assert sorted(app) == sorted(k for k in file if k not in ("tokens", "pixel_values", "attention_distance"))
    for key, value in app.items():
        np.testing.assert_allclose(file[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("ablate", [None, "1.0"])
def test_the_cli_file_holds_what_the_app_traces_for_a_text_model(tmp_path, ablate):
    folder, ids = _text_dir(tmp_path), [3, 1, 4, 1, 5, 9]
    extra = ["--ablate", ablate] if ablate else []
    file = _cli_arrays(folder, "--ids", ",".join(map(str, ids)), "--out", tmp_path / "t.npz", *extra)
    loaded = load_model_folder(folder)
    edits = parse_ablations(ablate, loaded.config) if ablate else []
    enc, shown = trace_input(loaded, "", ids, edits)  # what AppState's worker runs for the text box
    assert enc.ids == ids and file["tokens"].tolist() == ids
    _, recorded = trace_input(loaded, "", ids, edits, purpose=FILE)
    assert set(recorded.tensors) <= set(shown.tensors)  # a file records no name the app's trace lacks
    assert {"logits", "blocks.1.attn.pattern", "blocks.1.resid_post"} <= set(recorded.tensors)
    _assert_same(file, file_arrays(shown, loaded.config.n_layers))


def test_the_cli_file_holds_what_the_app_traces_for_a_vit(tmp_path):
    folder = _vit_dir(tmp_path)
    image = tmp_path / "digit.npy"
    np.save(image, np.random.default_rng(0).integers(0, 256, size=(8, 8, 1), dtype=np.uint8))
    file = _cli_arrays(folder, "--image", image, "--out", tmp_path / "v.npz", "--ablate", "0.mlp")
    loaded = load_model_folder(folder)
    pixels = image_pixel_values(loaded, image)
    np.testing.assert_array_equal(file["pixel_values"], pixels)
    edits = parse_ablations("0.mlp", loaded.config)
    _, _, ids, shown = trace_image_or_digit(loaded, pixels, image.name, edits)  # AppState's image worker
    assert ids == list(range(17)) and file["attn.0"].shape == (3, 17, 17)
    _, recorded = trace_image(loaded, pixels, edits, purpose=FILE)
    assert set(recorded.tensors) <= set(shown.tensors)
    _assert_same(file, file_arrays(shown, loaded.config.n_layers))
    assert file["attention_distance"].shape == (2, 3)
