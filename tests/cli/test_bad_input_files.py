"""Bad input files a person gives a command (the edge-case audit, edges6): each is one line naming the file
and what is wrong with it, exit 2, no traceback, and nothing written. A folder where a file was asked for is
called a folder (it was "no such file"); a .npy that is empty or not NumPy's (numpy.load took it for a pickle,
or raised EOFError as a traceback) says so; a file that is not a dictionary's, given as --sae, is named
(the message named its folder)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_refusals import refused as _refused
from desktop_app.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("command", ["lipschitz", "dynamics"])
def test_a_folder_given_as_the_matrices_file_is_called_a_folder(command, tmp_path, capsys):
    folder = tmp_path / "matrices.npz"
    folder.mkdir()
    out = tmp_path / "x.csv"
    argv = (["lipschitz", "--synthetic", "--matrices", folder, "--lengths", "2,3", "--samples", "1", "--csv", out]
            if command == "lipschitz" else ["dynamics", "--matrices", folder, "--steps", "1", "--csv", out])
    line = _refused(argv, capsys)
    assert f"{folder}: is a folder, not a file" in line and not out.exists()
    # a missing one is still "no such file"
    assert f"{tmp_path / 'nope.npz'}: no such file" in _refused([a if a != folder else tmp_path / "nope.npz"
                                                                 for a in argv], capsys)


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
    from digit_vit import save_digit_vit

    return save_digit_vit(tmp_path_factory.mktemp("vit") / "vit")


def _written(path, data: bytes):
    path.write_bytes(data)
    return path


def _npy_cut(path, keep: int):
    np.save(path, np.zeros((8, 8), np.uint8))
    path.write_bytes(path.read_bytes()[:keep])
    return path


@pytest.mark.parametrize("make,expected", [
    (lambda p: _written(p, b""), "not a .npy array (it does not start with NumPy's header"),  # was EOFError
    (lambda p: _written(p, b"hello"), "not a .npy array (it does not start with NumPy's header"),  # was "pickled"
    (lambda p: _npy_cut(p, 140), "not a readable .npy array, truncated or damaged"),
    (lambda p: p.mkdir() or p, "is a folder, not a file"),
], ids=["empty", "text", "truncated", "folder"])
def test_a_bad_npy_image_is_one_line_naming_it(make, expected, vit_dir, tmp_path, capsys):
    image = make(tmp_path / "image.npy")
    out = tmp_path / "x.npz"
    line = _refused(["trace", vit_dir, "--image", image, "--out", out], capsys)
    assert f"{image}: {expected}" in line and not out.exists()


def test_the_image_folder_task_reads_npy_images_the_same_way(tmp_path):
    from desktop_app.core.training.image_tasks import load_image_folder
    from desktop_app.core.training.tasks import TaskError

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(2):
            np.save(tmp_path / name / f"{i}.npy", np.zeros((4, 4), np.uint8))
    (tmp_path / "b" / "2.npy").write_bytes(b"")  # an empty file among the images: was an EOFError traceback
    with pytest.raises(TaskError, match=r"2\.npy: not a \.npy array"):
        load_image_folder(tmp_path, channels=1)


def test_a_file_that_is_not_a_dictionarys_given_as_sae_is_named(one_layer_gpt2_dir, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("not weights")
    line = _refused(["features", one_layer_gpt2_dir, "--sae", notes, "--ids", "1,2", "--out", tmp_path / "f.npz"],
                    capsys)
    assert line.startswith(f"error: {notes}: not a dictionary") and "cfg.json" in line


@pytest.mark.parametrize("command", ["export", "train"])
def test_an_output_folder_that_is_a_link_to_a_folder_is_called_a_link(command, one_layer_gpt2_dir, tmp_path, capsys):
    """A folder command's --out that is a symbolic link to a folder is refused as a link (it was "exists and is
    not a folder", which it seems to be), and the folder it points to is left as it was."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "mine.txt").write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(real)
    argv = (["export", one_layer_gpt2_dir, "--format", "hf", "--out", link, "--overwrite"] if command == "export" else
            ["train", "--task", "modadd", "--p", "3", "--layers", "1", "--heads", "1", "--d-model", "4", "--steps", "1",
             "--batch-size", "2", "--device", "cpu", "--out", link, "--overwrite"])
    line = _refused(argv, capsys)
    assert f"{link}: is a symbolic link; the app never writes through one" in line
    assert sorted(p.name for p in real.iterdir()) == ["mine.txt"] and link.is_symlink()


@pytest.mark.parametrize("variances", ["0", "0,0", "0 0; 0 0"])
def test_an_all_zero_covariance_is_refused_not_a_division_by_zero(variances, tmp_path, capsys):
    """--init gaussian --variances 0 started every particle at the origin, and the summary's radius over its bound
    R(t) = 0 was a ZeroDivisionError traceback after the run; one direction of zero variance is a real start."""
    out = tmp_path / "x.csv"
    line = _refused(["dynamics", "--n", "3", "--d", "2", "--steps", "1", "--init", "gaussian", "--variances", variances,
                     "--csv", out], capsys)
    assert "all zero, so every particle starts at the origin" in line and not out.exists()
    assert main(["dynamics", "--n", "3", "--d", "2", "--steps", "1", "--init", "gaussian", "--variances", "1,0",
                 "--csv", str(out)]) == 0


@pytest.mark.parametrize("option", ["--layer", "--head"])
def test_a_model_head_out_of_range_is_one_line(option, one_layer_gpt2_dir, tmp_path, capsys):
    """dynamics --model M --layer 99 was an IndexError traceback, --head 99 a ZeroDivisionError (an empty head's
    d_head ** -0.25): Transformer.head_matrices now checks both, as EncoderDecoder.head_matrices did."""
    out = tmp_path / "x.csv"
    line = _refused(["dynamics", "--model", one_layer_gpt2_dir, option, "99", "--steps", "1", "--csv", out], capsys)
    assert line == f"error: the model has {'layers 0..0' if option == '--layer' else 'heads 0..1'}, not 99"
    assert not out.exists()


def _cli_that_cannot_read(argv, cwd) -> subprocess.CompletedProcess:
    """The CLI where a file of mode 000 cannot be read: as a user, or as root (who reads everything) without
    the capabilities that let it (setpriv drops them from the bounding set)."""
    cmd = [sys.executable, "-m", "desktop_app", *map(str, argv)]
    if os.geteuid() == 0:
        drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all"]
        if shutil.which("setpriv") is None or subprocess.run([*drop, "true"]).returncode != 0:
            pytest.skip("root here reads every file, and setpriv cannot drop that")
        cmd = drop + cmd
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


@pytest.mark.parametrize("unreadable", ["model.safetensors", "tokenizer.json", "matrices.npz", "sae_weights"])
def test_an_unreadable_file_is_said_to_be_unreadable(unreadable, one_layer_gpt2_dir, tmp_path):
    """safetensors called an unreadable weights file "corrupt or truncated ... (No such file or directory)",
    numpy an unreadable .npz "not a NumPy .npz archive", tokenizers "not a valid tokenizer.json": each is now
    "cannot be read (Permission denied)", naming the file (core.files.file_problem, asked before them)."""
    model = shutil.copytree(one_layer_gpt2_dir, tmp_path / "model")
    out = tmp_path / "out.npz"
    if unreadable == "matrices.npz":
        target = tmp_path / unreadable
        np.savez(target, A=np.eye(2), V=np.eye(2))
        argv = ["dynamics", "--matrices", target, "--steps", "1", "--csv", tmp_path / "x.csv"]
    elif unreadable == "sae_weights":
        import torch

        from desktop_app.core.features import SparseDictionary, save_dictionary
        save_dictionary(SparseDictionary(torch.ones(8, 4), torch.zeros(4), torch.ones(4, 8), torch.zeros(8),
                                         hook="blocks.0.hook_resid_post"), tmp_path / "sae")
        target = tmp_path / "sae" / "sae_weights.safetensors"
        argv = ["features", model, "--sae", tmp_path / "sae", "--ids", "1,2", "--out", out]
    else:
        target = model / unreadable
        argv = ["trace", model, "--ids", "1,2", "--out", out]
    target.chmod(0)
    r = _cli_that_cannot_read(argv, tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{target}: " in lines[0] and "cannot be read (Permission denied)" in lines[0], lines[0]
    assert not out.exists()


def _sae_folder(tmp_path):
    import torch

    from desktop_app.core.features import SparseDictionary, save_dictionary
    save_dictionary(SparseDictionary(torch.ones(8, 4), torch.zeros(4), torch.ones(4, 8), torch.zeros(8),
                                     hook="blocks.0.hook_resid_post"), tmp_path / "sae")
    return tmp_path / "sae"


def _as_folder(path):
    path.unlink()
    path.mkdir()
    return path


@pytest.mark.parametrize("which,given", [("sae_weights.safetensors", "folder"), ("cfg.json", "folder"),
                                         ("sae_weights.safetensors", "file")])
def test_a_folder_where_a_dictionarys_file_should_be_is_called_a_folder(which, given, one_layer_gpt2_dir, tmp_path,
                                                                      capsys):
    """--sae whose weights file is a folder said "holds neither sae_weights.safetensors (SAELens) nor ..."; its
    cfg.json a folder said "cfg.json: missing"; each is now file_problem's "is a folder, not a file", naming it
    (also when that folder is what --sae names)."""
    sae = _sae_folder(tmp_path)
    bad = _as_folder(sae / which)
    out = tmp_path / "f.npz"
    line = _refused(["features", one_layer_gpt2_dir, "--sae", sae if given == "folder" else bad, "--ids", "1,2",
                     "--out", out], capsys)
    assert line == f"error: {bad}: is a folder, not a file" and not out.exists()


@pytest.mark.parametrize("kind,which", [("clt", "W_enc_0.safetensors"), ("clt", "W_dec_0.safetensors"),
                                        ("clt", "config.yaml"), ("plt", "layer_0.safetensors")])
def test_a_folder_where_a_transcoders_file_should_be_is_called_a_folder(kind, which, one_layer_gpt2_dir, tmp_path,
                                                                       capsys):
    """graph --transcoders: a folder named like one of its files said "missing" (or "holds neither config.yaml
    nor W_enc_0.safetensors")."""
    from desktop_app.core.graphs.transcoders import random_transcoders

    folder = tmp_path / "tc"
    random_transcoders(folder, n_layers=1, d_model=8, n_features=4, cross_layer=kind == "clt")
    bad = _as_folder(folder / which)
    out = tmp_path / "g.json"
    line = _refused(["graph", one_layer_gpt2_dir, "--transcoders", folder, "--ids", "1,2", "--out", out], capsys)
    assert line == f"error: {bad}: is a folder, not a file" and not out.exists()
