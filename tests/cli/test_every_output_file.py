"""The output-file rule in the writers test_output_files.py does not walk (edges7): features --out and its
top-contexts --csv, scrub --csv, graph --out and --raw, export --format gguf --out, render's .svg / .csv / .npz.

Each: an existing file is kept byte for byte without --overwrite (one line) and replaced with it; a symbolic link
is refused with or without --overwrite and its target kept; the replacement is atomic (no temporary left beside it).
"""
from __future__ import annotations

import os

import pytest
import torch

from desktop_app.cli import EXIT_INPUT, main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MINE = b"the user's own file\n"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, one_layer_gpt2_dir):
    """What the writers read: a dictionary, transcoders, a text, a training run that kept steps, a llama."""
    from desktop_app.core.features import SparseDictionary, save_dictionary
    from desktop_app.core.graphs.transcoders import random_transcoders
    from desktop_app.core.training import TrainConfig, train
    from tiny_models import save_tiny_model

    root = tmp_path_factory.mktemp("inputs")
    save_dictionary(SparseDictionary(torch.randn(8, 4), torch.zeros(4), torch.randn(4, 8), torch.zeros(8),
                                     hook="blocks.0.hook_resid_post"), root / "sae")
    random_transcoders(root / "tc", n_layers=1, d_model=8, n_features=4)
    (root / "text.txt").write_text("abc defg hab cdef " * 4, encoding="utf-8")
    train(TrainConfig(task="induction", task_options={"length": 6, "symbols": 6},
                      model={"n_layers": 1, "n_heads": 2, "d_model": 8, "d_ff": 16}, steps=2, batch_size=4,
                      eval_every=2, checkpoint_every=100, log_every=1, keep_every=1), root / "run")
    save_tiny_model(root / "llama", "abcdefgh ", "llama", d_model=8, n_layers=1, n_heads=2, d_ff=16, context_length=16)
    return root


def _writers(model, root) -> dict[str, list[str]]:
    """Each writer's arguments, its output last."""
    return {
        "features --out": ["features", model, "--sae", root / "sae", "--ids", "1,2", "--out"],
        "features --csv": ["features", model, "--sae", root / "sae", "--top-contexts", root / "text.txt", "--feature",
                           "0", "--top", "2", "--csv"],
        "scrub --csv": ["scrub", root / "run", "--metric", "entropy", "--sequences", "1", "--csv"],
        "graph --out": ["graph", model, "--transcoders", root / "tc", "--ids", "1,2", "--out"],
        "graph --raw": ["graph", model, "--transcoders", root / "tc", "--ids", "1,2", "--out", "{tmp}/g.json",
                        "--raw"],
        "export gguf": ["export", root / "llama", "--format", "gguf", "--out"],
        "render .svg": ["render", model, "--ids", "1,2", "--view", "attention", "--size", "200x150", "--out"],
        "render .csv": ["render", model, "--ids", "1,2", "--view", "attention", "--out"],
        "render .npz": ["render", model, "--ids", "1,2", "--view", "attention", "--out"],
    }


NAMES = {"features --out": "f.npz", "features --csv": "c.csv", "scrub --csv": "s.csv", "graph --out": "g.json",
         "graph --raw": "r.safetensors", "export gguf": "m.gguf", "render .svg": "r.svg", "render .csv": "r.csv",
         "render .npz": "r.npz"}


def _run(writer, out, one_layer_gpt2_dir, inputs, tmp_path, *extra) -> int:
    argv = [str(a).replace("{tmp}", str(tmp_path)) for a in _writers(one_layer_gpt2_dir, inputs)[writer]]
    return main([*argv, str(out), *extra])


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("writer", NAMES)
def test_an_existing_output_is_kept_unless_overwrite(writer, one_layer_gpt2_dir, inputs, tmp_path, capsys):
    out = tmp_path / NAMES[writer]
    out.write_bytes(MINE)
    assert _run(writer, out, one_layer_gpt2_dir, inputs, tmp_path) == EXIT_INPUT
    assert _one_line(capsys.readouterr().err) == f"error: {out} exists; pass --overwrite to replace it"
    assert out.read_bytes() == MINE and sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    assert _run(writer, out, one_layer_gpt2_dir, inputs, tmp_path, "--overwrite") == 0, capsys.readouterr().err
    assert out.read_bytes() != MINE and out.stat().st_size > 0 and not out.is_symlink()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # atomic: nothing left beside it


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("writer", NAMES)
def test_a_link_is_never_written_through(writer, overwrite, one_layer_gpt2_dir, inputs, tmp_path, capsys):
    target = tmp_path / "precious.txt"
    target.write_bytes(MINE)
    out = tmp_path / NAMES[writer]
    out.symlink_to(target)
    code = _run(writer, out, one_layer_gpt2_dir, inputs, tmp_path, *(["--overwrite"] if overwrite else []))
    line = _one_line(capsys.readouterr().err)
    assert code == EXIT_INPUT and line.startswith(f"error: {out} is a symbolic link"), line
    assert out.is_symlink() and os.readlink(out) == str(target) and target.read_bytes() == MINE
