"""Sparse dictionaries and transcoders whose files lie (edges7's audit of the SAELens and circuit-tracer readers):
each is one line naming the file, exit 2, nothing written, and nothing large allocated first.

Before: a cfg.json giving a key twice was read as its last value; "d_in": "8" said "says d_in '8' but ... holds 8";
a hook named with Arabic-Indic digits (blocks.٠.hook_resid_post) ran; a config.yaml of nested YAML aliases (a few
lines) made a message of millions of characters (gigabytes at depth 9); a safetensors header's shape [4.0, 8] was a
TypeError traceback, [-4, -8] passed the byte count and said "b_enc_0 has shape [4], expected [-4]"; a header that
is a JSON list was, and stays, one line."""
from __future__ import annotations

import json

import pytest
import torch

from cli_refusals import refused as _refused

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _sae(tmp_path):
    from desktop_app.core.features import SparseDictionary, save_dictionary

    folder = tmp_path / "sae"
    save_dictionary(SparseDictionary(torch.ones(8, 4), torch.zeros(4), torch.ones(4, 8), torch.zeros(8),
                                     hook="blocks.0.hook_resid_post"), folder)
    return folder


def _cfg_text(cfg: dict, change: str) -> str:
    if change == "huge":
        return json.dumps(cfg) + " " * (1 << 24)  # read whole before: now refused unread
    if change == "twice":
        return json.dumps(cfg)[:-1] + ', "d_in": 9}'
    if change == "string":
        return json.dumps({**cfg, "d_in": "8"})
    return json.dumps({**cfg, "metadata": {**cfg["metadata"], "hook_name": "blocks.٠.hook_resid_post"}})


@pytest.mark.parametrize("change,expected", [
    ("twice", "the key 'd_in' appears twice in one object"),
    ("huge", "bytes, not a settings file (at most 16,777,216 are read)"),
    ("string", "d_in must be an integer, got '8'"),
    ("digits", "hook 'blocks.٠.hook_resid_post' is not an activation the app records"),
])
def test_a_dictionarys_cfg_json_that_lies_is_one_line(change, expected, one_layer_gpt2_dir, tmp_path, capsys):
    sae = _sae(tmp_path)
    cfg = json.loads((sae / "cfg.json").read_text())
    (sae / "cfg.json").write_text(_cfg_text(cfg, change), encoding="utf-8")
    out = tmp_path / "f.npz"
    line = _refused(["features", one_layer_gpt2_dir, "--sae", sae, "--ids", "1,2", "--out", out], capsys)
    assert line.startswith(f"error: {sae / 'cfg.json'}: ") and expected in line, line
    assert not out.exists()


def _transcoders(tmp_path):
    from desktop_app.core.graphs.transcoders import random_transcoders

    folder = tmp_path / "tc"
    random_transcoders(folder, n_layers=1, d_model=8, n_features=4, cross_layer=True)
    return folder


def _edit_header(path, change):
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = change(json.loads(data[8:8 + n]))
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])


def _bomb(depth: int = 9) -> str:
    """YAML's billion laughs: 9**depth strings from a few lines."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, depth)]
    return "\n".join(lines) + f"\nmodel_kind: cross_layer_transcoder\nfeature_input_hook: *a{depth - 1}\n"


@pytest.mark.parametrize("case,expected", [
    ("aliases", "config.yaml: line 2: a YAML alias (*name), which is not read here: write the value itself"),
    ("large", "config.yaml: is 1,048,612 bytes; a transcoders' config.yaml is a few kB"),
    ("malformed", "config.yaml: cannot be read as YAML (while parsing a flow sequence in"),  # was several lines
    ("float shape", "W_enc_0.safetensors: not a readable safetensors file (tensor 'W_enc_0': shape [4.0, 8] and "
                    "offsets [0, 128] must be non-negative integers)"),
    ("negative shape", "W_enc_0.safetensors: not a readable safetensors file (tensor 'W_enc_0': shape [-4, -8]"),
    ("list header", "W_enc_0.safetensors: not a readable safetensors file"),
])
def test_transcoder_files_that_lie_are_one_line(case, expected, one_layer_gpt2_dir, tmp_path, capsys):
    import tracemalloc

    folder = _transcoders(tmp_path)
    if case == "aliases":
        (folder / "config.yaml").write_text(_bomb(), encoding="utf-8")
    elif case == "malformed":
        (folder / "config.yaml").write_text("model_kind: cross_layer_transcoder\nscan: [1, 2\n", encoding="utf-8")
    elif case == "large":
        (folder / "config.yaml").write_text("model_kind: cross_layer_transcoder\n" + "#" * (1 << 20) + "\n")
    elif case == "list header":
        _edit_header(folder / "W_enc_0.safetensors", lambda h: [h])
    else:
        shape = [4.0, 8] if case == "float shape" else [-4, -8]
        _edit_header(folder / "W_enc_0.safetensors", lambda h: {**h, "W_enc_0": {**h["W_enc_0"], "shape": shape}})
    out = tmp_path / "g.json"
    tracemalloc.start()
    try:
        line = _refused(["graph", one_layer_gpt2_dir, "--transcoders", folder, "--ids", "1,2", "--out", out], capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert line.startswith(f"error: {folder}/") and expected in line, line
    assert len(line) < 400 and peak < 64 << 20 and not out.exists()
