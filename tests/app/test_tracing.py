"""app/tracing.py: the one record-name policy, and the CLI's trace file equal to the app's trace.

`trace --out x.npz` records FILE_NAMES, the GUI's AppState workers record VIEWS; both go through
trace_input / trace_image, and the file's arrays are what file_arrays reads from the GUI's trace."""
from __future__ import annotations

import numpy as np
import torch
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


# -- a trace arriving layer by layer (issue 27) -------------------------------------------------


def _six_layers(tmp_path):
    folder = tmp_path / "six"
    cfg = ModelConfig.gpt2(vocab_size=30, d_model=16, n_layers=6, n_heads=2, d_ff=32, context_length=32)
    save_model_folder(new_model(cfg, seed=3), folder)
    return load_model_folder(folder)


IDS6 = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]


@pytest.mark.parametrize("ablate", [None, "2.1"])
def test_each_layer_arrives_in_order_and_equals_the_one_shot_trace(tmp_path, ablate):
    from desktop_app.core.jobs import JobControl

    loaded = _six_layers(tmp_path)
    edits = parse_ablations(ablate, loaded.config) if ablate else None
    _, whole = trace_input(loaded, "", IDS6, edits)
    arrived, progress = [], []

    def on_layer(ready):
        blocks = {int(n.split(".")[1]) for n in ready.trace.tensors if n.startswith("blocks.")}
        assert blocks == set(range(ready.done)) and ready.total == 6 and ready.enc.ids == IDS6  # no layer ahead
        layer = ready.done - 1
        arrived.append((layer, {n: t.clone() for n, t in ready.trace.tensors.items()
                                if n.startswith(f"blocks.{layer}.")}))

    job = JobControl(on_progress=lambda d, t, m: progress.append((d, t, m)))
    enc, pieces = trace_input(loaded, "", IDS6, edits, on_layer=on_layer, job=job)
    assert [layer for layer, _ in arrived] == list(range(6))
    assert progress == [(k, 6, f"layer {k} / 6") for k in range(7)]
    for layer, records in arrived:  # what each layer handed back is exactly the one-shot trace's
        expected = {n for n in whole.tensors if n.startswith(f"blocks.{layer}.")}
        assert set(records) == expected and expected
        for name, tensor in records.items():
            assert torch.equal(tensor, whole[name]), name
    assert set(pieces.tensors) == set(whole.tensors)
    for name in whole.tensors:
        assert torch.equal(pieces[name], whole[name]), name


@pytest.mark.parametrize("ablate,host,dtype", [(None, False, torch.float32), ("2.1", True, torch.float32),
                                                (None, False, torch.bfloat16)])
def test_logits_after_the_blocks_are_the_whole_forwards(tmp_path, ablate, host, dtype):
    """trace_input(logits=False): the trace stops after the final norm, without logits, and its add_logits
    records the logits into it that one whole forward records (the GUI paints the blocks first)."""
    loaded = _six_layers(tmp_path)
    loaded.model.to(dtype)
    edits = parse_ablations(ablate, loaded.config) if ablate else None
    _, whole = trace_input(loaded, "", IDS6, edits, host_records=host)
    enc, blocks, add_logits = trace_input(loaded, "", IDS6, edits, host_records=host, logits=False,
                                          on_layer=lambda ready: None)
    assert enc.ids == IDS6 and "logits" not in blocks and "final_norm.out" in blocks
    add_logits()
    assert list(blocks.tensors) == list(whole.tensors)  # the same records, in the same order
    for name in whole.tensors:
        assert torch.equal(blocks[name], whole[name]), name
    empty = trace_input(loaded, "", [], logits=False)
    assert empty[1] is None and empty[2]() is None


def test_a_cancelled_trace_stops_at_the_next_layer(tmp_path):
    from desktop_app.core.jobs import Cancelled, JobControl

    loaded = _six_layers(tmp_path)
    job, seen = JobControl(), []

    def on_layer(ready):
        seen.append(ready.done)
        if ready.done == 2:
            job.cancel()

    with pytest.raises(Cancelled):
        trace_input(loaded, "", IDS6, on_layer=on_layer, job=job)
    assert seen == [1, 2]  # block 2 ran (the cancel is seen after it), never handed back


def test_a_layer_range_in_the_refusal_and_on_the_command_line(tmp_path, capsys):
    from desktop_app.app.tracing import check_trace_memory, estimated_trace_bytes, layer_range, parse_layers
    from desktop_app.core import devices

    loaded = _six_layers(tmp_path)
    have = (estimated_trace_bytes(loaded, 10, layers=2) + estimated_trace_bytes(loaded, 10, layers=3)) // 2
    with pytest.raises(devices.MemoryEstimateError) as exc:
        check_trace_memory(loaded, 10, available=have)
    msg = str(exc.value)
    assert "\n" not in msg and "the first 2 of 6 layers, or any range of 2 (layers A:B, e.g. 4:6)" in msg, msg
    assert check_trace_memory(loaded, 10, layers=parse_layers("4:6"), available=have) <= have

    assert parse_layers("2:4") == (2, 4) and parse_layers("3:") == (3, None) and parse_layers(":2") == (0, 2)
    assert layer_range((3, None), 6) == range(3, 6) and layer_range(2, 6) == range(2)
    for bad in ("3", "4:2", "a:b", "-1:2"):
        with pytest.raises(ValueError, match="layer range"):
            parse_layers(bad)
    with pytest.raises(ValueError, match="layer range 2:9: the model has 6 layers"):
        layer_range((2, 9), 6)

    folder = tmp_path / "six"
    ids = ",".join(map(str, IDS6))
    whole = _cli_arrays(folder, "--ids", ids, "--out", tmp_path / "all.npz")
    part = _cli_arrays(folder, "--ids", ids, "--out", tmp_path / "part.npz", "--layers", "2:4")
    assert sorted(part) == ["attn.2", "attn.3", "hidden.0", "hidden.3", "hidden.4", "logits", "tokens"]
    for key, value in part.items():  # (unrecorded blocks take the fused attention kernel: a few ulps)
        np.testing.assert_allclose(value, whole[key], rtol=1e-5, atol=1e-6, err_msg=key)
    last = _cli_arrays(folder, "--ids", ids, "--out", tmp_path / "last.npz", "--layers", "5:")
    assert sorted(last) == ["attn.5", "hidden.0", "hidden.6", "logits", "tokens"]
    np.testing.assert_allclose(last["hidden.6"], whole["hidden.6"], rtol=1e-5, atol=1e-6)  # after the final norm
    assert main(["trace", str(folder), "--ids", ids, "--out", str(tmp_path / "x.npz"), "--layers", "2:9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: layer range 2:9: the model has 6 layers (0:6 is all of them)", err
