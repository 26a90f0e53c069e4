"""`python -m desktop_app lipschitz`: both forms, CSV contents, the final JSON line, bad input."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from desktop_app.cli import main
from desktop_app.core import lipschitz as lip
from desktop_app.core.checkpoints import load_model_folder

CUDA = torch.cuda.is_available()
# each device test once on the CPU and once on CUDA (marked `cuda`: packaging/gpu_check.sh runs those on the card)
DEVICES = pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", id="cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="needs a CUDA device: torch.cuda.is_available() is False")])])


def _read(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_model_real_data(char_gpt2_dir, tmp_path, capsys):
    out = tmp_path / "real.csv"
    rc = main(["lipschitz", str(char_gpt2_dir), "--layer", "1", "--data", "real", "--text-file",
               str(char_gpt2_dir.parent / "text.txt"), "--lengths", "4,8,16", "--samples", "3", "--csv", str(out)])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    rows = _read(out)
    assert list(rows[0]) == list(lip.CSV_COLUMNS) and len(rows) == 9
    assert [int(r["n"]) for r in rows] == [4] * 3 + [8] * 3 + [16] * 3
    # the values are the local constants of the model's layer-1 sublayer at those windows (exact Jacobian)
    loaded = load_model_folder(char_gpt2_dir)
    ids = loaded.tokenizer.encode((char_gpt2_dir.parent / "text.txt").read_text(encoding="utf-8"))
    starts = lip.window_starts(len(ids), 16, 3)
    X = lip.real_inputs(loaded.model, ids, 1, 8, 3, starts)
    exact = lip.exact_jacobian_norm(lip.module_function(loaded.model, 1), X).numpy()
    got = np.array([float(r["lipschitz"]) for r in rows if r["n"] == "8"])
    np.testing.assert_allclose(got, exact, rtol=2e-4)
    np.testing.assert_allclose([float(r["radius"]) for r in rows if r["n"] == "8"],
                               X.norm(dim=-1).amax(-1).numpy(), rtol=1e-6)
    a, ci, _ = lip.fit_exponent([int(r["n"]) for r in rows], [float(r["lipschitz"]) for r in rows])
    assert summary["exponent"] == pytest.approx(a) and summary["exponent_ci"] == pytest.approx(list(ci))
    assert len(summary["exponent_ci"]) == 2


def test_model_adversarial_head(char_gpt2_dir, tmp_path, capsys):
    out = tmp_path / "adv.csv"
    rc = main(["lipschitz", str(char_gpt2_dir), "--layer", "0", "--head", "1", "--no-masked", "--data", "adversarial",
               "--radius", "2.5", "--lengths", "4,8", "--samples", "2", "--csv", str(out)])
    assert rc == 0
    rows = _read(out)
    assert len(rows) == 2 and all(float(r["radius"]) == pytest.approx(2.5) for r in rows)
    model = load_model_folder(char_gpt2_dir).model
    f = lip.layer_map(model, 0, head=1, masked=False)
    X = lip.adversarial_input(f.A[0], 8, 2.5)[None].float()
    assert float(rows[1]["lipschitz"]) == pytest.approx(float(lip.exact_jacobian_norm(f, X)[0]), rel=2e-4)
    captured = capsys.readouterr()
    assert "exponent" in json.loads(captured.out.strip().splitlines()[-1])
    # issue 41: "over 1 inputs" at every length with --samples 2, without a word why
    assert "one construction per n, so --samples 2 gives one input at each length" in captured.err


def test_synthetic(tmp_path, capsys):
    out = tmp_path / "syn.csv"
    rc = main(["lipschitz", "--synthetic", "--d", "5", "--attention", "l2", "--norm-a", "2", "--norm-v", "0.5",
               "--radius", "1.5", "--lengths", "3,6", "--samples", "2", "--csv", str(out)])
    assert rc == 0
    rows = _read(out)
    f = lip.random_single_head(5, 2.0, 0.5, "l2", False, seed=0)
    X = lip.ball_inputs(2, 6, 5, 1.5, seed=0 + 6)
    np.testing.assert_allclose([float(r["lipschitz"]) for r in rows if r["n"] == "6"],
                               lip.exact_jacobian_norm(f, X).numpy(), rtol=2e-4)
    assert all(r["upper_bound"] == "nan" for r in rows)  # Theorem 3.1 is about softmax attention
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["exponent_ci"]


def test_synthetic_softmax_has_bounds(tmp_path, capsys):
    out = tmp_path / "s.csv"
    assert main(["lipschitz", "--synthetic", "--d", "4", "--adversarial", "--radius", "2", "--lengths", "4,8",
                 "--samples", "1", "--csv", str(out)]) == 0
    for r in _read(out):
        assert float(r["lower_bound"]) <= float(r["lipschitz"]) <= float(r["upper_bound"])
        assert int(r["iterations"]) >= 1


def test_bad_input(char_gpt2_dir, tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00bad")
    assert main(["lipschitz", str(char_gpt2_dir), "--text-file", str(bad), "--lengths", "4", "--csv",
                 str(tmp_path / "x.csv")]) == 2
    assert "bad.txt" in capsys.readouterr().err
    assert main(["lipschitz", str(char_gpt2_dir), "--lengths", "4,x", "--csv", str(tmp_path / "x.csv")]) == 2
    assert main(["lipschitz", str(char_gpt2_dir), "--layer", "7", "--lengths", "4", "--text-file",
                 str(char_gpt2_dir.parent / "text.txt"), "--csv", str(tmp_path / "x.csv")]) == 2
    assert "layer 7" in capsys.readouterr().err
    assert main(["lipschitz", str(tmp_path / "nope"), "--lengths", "4", "--csv", str(tmp_path / "x.csv")]) == 2
    assert not (tmp_path / "x.csv").exists()


def test_model_search(char_gpt2_dir, tmp_path, capsys):
    """Gradient ascent on the sphere of radius R: every input keeps radius R and ends with a local
    constant at least that of its random starting point (recomputed here with the exact Jacobian)."""
    out = tmp_path / "search.csv"
    assert main(["lipschitz", str(char_gpt2_dir), "--layer", "0", "--head", "0", "--no-masked", "--data", "search",
                 "--radius", "2.0", "--search-steps", "3", "--lengths", "4", "--samples", "2",
                 "--csv", str(out)]) == 0
    rows = _read(out)
    assert len(rows) == 2 and all(float(r["radius"]) == pytest.approx(2.0) for r in rows)
    model = load_model_folder(char_gpt2_dir).model
    f = lip.layer_map(model, 0, head=0, masked=False)
    g = torch.Generator().manual_seed(0 + 4)
    X0 = torch.randn(2, 4, model.cfg.d_model, generator=g)
    X0 = X0 * (2.0 / X0.norm(dim=-1, keepdim=True))
    start = lip.exact_jacobian_norm(f, X0).numpy()
    assert (np.array([float(r["lipschitz"]) for r in rows]) >= start * (1 - 1e-4)).all()


def _strict_json(line: str):
    """json.loads that refuses the non-standard NaN / Infinity tokens."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(line, parse_constant=refuse)


def _known_matrices(d=3):
    g = torch.Generator().manual_seed(21)
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    V = torch.randn(d, d, generator=g, dtype=torch.float64)
    return A, V


def test_synthetic_user_matrices(tmp_path, capsys):
    A, V = _known_matrices()
    npz = tmp_path / "av.npz"
    np.savez(npz, A=A.numpy(), V=V.numpy())
    for kind in ("softmax", "l2"):
        out = tmp_path / f"user_{kind}.csv"
        assert main(["lipschitz", "--synthetic", "--matrices", str(npz), "--attention", kind, "--radius", "1.5",
                     "--lengths", "3,6", "--samples", "2", "--seed", "4", "--csv", str(out)]) == 0
        summary = _strict_json(capsys.readouterr().out.strip().splitlines()[-1])
        assert "av.npz" in summary["function"] and "av.npz" in summary["label"]
        rows = _read(out)
        assert len(rows) == 4
        f = lip.single_head(A, V, kind)
        for n in (3, 6):
            X = lip.ball_inputs(2, n, 3, 1.5, seed=4 + n)  # the inputs: seeded by --seed + n
            got = np.array([float(r["lipschitz"]) for r in rows if r["n"] == str(n)])
            np.testing.assert_allclose(got, lip.exact_jacobian_norm(f, X).numpy(), rtol=2e-4)
            if kind == "softmax":  # Theorem 3.1 with the file's ||A||, ||V||, sigma_min(V)
                R = np.array([float(r["radius"]) for r in rows if r["n"] == str(n)])
                up = lip.upper_bound(n, R, float(torch.linalg.matrix_norm(A, 2)), float(torch.linalg.matrix_norm(V, 2)))
                lo = float(torch.linalg.svdvals(V)[-1]) * lip.lower_bound(n, R, lip.gamma_of(A))
                np.testing.assert_allclose([float(r["upper_bound"]) for r in rows if r["n"] == str(n)], up, rtol=1e-9)
                np.testing.assert_allclose([float(r["lower_bound"]) for r in rows if r["n"] == str(n)], lo, rtol=1e-9)


def _bad_npz(tmp_path, case):
    path = tmp_path / f"{case}.npz"
    A, V = _known_matrices()
    A, V = A.numpy(), V.numpy()
    if case == "missing_V":
        np.savez(path, A=A)
    elif case == "not_square":
        np.savez(path, A=A[:, :2], V=V)
    elif case == "different_d":
        np.savez(path, A=A, V=np.eye(4))
    elif case == "vector":
        np.savez(path, A=A, V=V[0])
    elif case == "nan":
        V[1, 2] = np.nan
        np.savez(path, A=A, V=V)
    elif case == "inf":
        A[0, 0] = np.inf
        np.savez(path, A=A, V=V)
    elif case == "complex":
        np.savez(path, A=A + 1j, V=V)
    elif case == "text":
        path.write_text("not an archive", encoding="utf-8")
    elif case == "npy":
        with open(path, "wb") as fh:
            np.save(fh, A)
    elif case == "absent":
        pass
    return path


BAD_CASES = {"missing_V": "no array named V", "not_square": "square", "different_d": "same d", "vector": "square",
             "nan": "non-finite", "inf": "non-finite", "complex": "real numbers", "text": "not a NumPy .npz",
             "npy": "not an .npz", "absent": "no such file"}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_matrices_file(tmp_path, capsys, case):
    path = _bad_npz(tmp_path, case)
    out = tmp_path / "x.csv"
    assert main(["lipschitz", "--synthetic", "--matrices", str(path), "--lengths", "4", "--csv", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{case}.npz" in err and BAD_CASES[case] in err
    assert not out.exists()


def test_matrices_option_conflicts(tmp_path, capsys):
    A, V = _known_matrices()
    npz = tmp_path / "av.npz"
    np.savez(npz, A=A.numpy(), V=V.numpy())
    csv_out = str(tmp_path / "x.csv")
    assert main(["lipschitz", "--matrices", str(npz), "--lengths", "4", "--csv", csv_out]) == 2
    assert "--synthetic" in capsys.readouterr().err
    assert main(["lipschitz", "--synthetic", "--matrices", str(npz), "--norm-a", "2", "--lengths", "4",
                 "--csv", csv_out]) == 2
    assert "--norm-a" in capsys.readouterr().err
    assert main(["lipschitz", "--synthetic", "--matrices", str(npz), "--d", "5", "--lengths", "4", "--csv", csv_out]) == 2
    assert "av.npz" in capsys.readouterr().err


def test_final_json_is_strict_when_the_fit_is_undefined(tmp_path, capsys):
    """Two points: no CI; one length: no exponent. The JSON says null, never the bare token NaN."""
    out = str(tmp_path / "x.csv")
    assert main(["lipschitz", "--synthetic", "--d", "3", "--lengths", "4,8", "--samples", "1", "--csv", out]) == 0
    summary = _strict_json(capsys.readouterr().out.strip().splitlines()[-1])
    assert isinstance(summary["exponent"], float) and summary["exponent_ci"] == [None, None]
    assert main(["lipschitz", "--synthetic", "--d", "3", "--lengths", "4", "--samples", "2", "--csv", out,
                 "--overwrite"]) == 0
    summary = _strict_json(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["exponent"] is None and summary["exponent_ci"] == [None, None] and summary["prefactor"] is None


@DEVICES
def test_lipschitz_on_a_device_gives_the_cpu_values(char_gpt2_dir, tmp_path, capsys, device):
    """lipschitz --device: the sweep runs on that device and gives the CPU's values (issue 31)."""
    rows = {}
    for dev in ("cpu", device):
        out = tmp_path / f"{dev}.csv"
        assert main(["lipschitz", str(char_gpt2_dir), "--layer", "1", "--data", "real", "--text-file",
                     str(char_gpt2_dir.parent / "text.txt"), "--lengths", "4,8", "--samples", "2", "--csv", str(out),
                     "--device", dev, "--overwrite"]) == 0
        rows[dev] = np.array([float(r["lipschitz"]) for r in _read(out)])
    capsys.readouterr()
    assert len(rows[device]) == 4
    np.testing.assert_allclose(rows[device], rows["cpu"], rtol=2e-3)


@DEVICES
def test_bench_lipschitz_smoke(capsys, device):
    """`python -m desktop_app bench lipschitz` on the demo model with tiny settings: strict JSON with
    the agreed keys, and our estimates agree with the reference (the paper's power iteration); all three
    on --device, named in the JSON."""
    from desktop_app.paths import demo_model_dir

    assert main(["bench", "lipschitz", str(demo_model_dir()), "--lengths", "8,16", "--samples", "2",
                 "--repeat", "1", "--device", device]) == 0  # one round of the three timings: a smoke test
    result = _strict_json(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["name"] == "lipschitz" and result["inputs"] == 4 and result["lengths"] == [8, 16]
    assert result["device"] == device
    assert result["device_name"] == (torch.cuda.get_device_name(0) if device == "cuda" else "cpu")
    assert result["vs_tight"]["whole_run"]["max_rel"] < 1e-3  # the whole-run command's values too
    for key in ("ours_s", "reference_s", "speedup", "max_rel_diff"):
        assert isinstance(result[key], float) and result[key] >= 0, key
    assert result["max_rel_diff"] < 1e-3
    assert result["exact_checked_inputs"] == 4 and result["exact_max_rel_err_ours"] < 1e-3
    assert 2 <= result["reference_mean_iterations"] <= 100
    # the whole run's floor, a process that only imports torch, timed beside it: a bound on its speedup
    assert len(result["import_torch_s"]) == 1 and 0 < result["import_torch_s"][0]
    assert result["speedup_whole_run_bound"]["median"] == pytest.approx(
        result["reference_s"] / result["import_torch_s"][0], rel=1e-2)


def test_the_label_names_the_text_file(char_gpt2_dir, tmp_path, capsys):
    """Runs on different texts get different labels (issue 25 §6): the JSON label names the text file
    the windows were read from, as the panel's legend does (sweep_label)."""
    other = tmp_path / "other.txt"
    other.write_text((char_gpt2_dir.parent / "text.txt").read_text(encoding="utf-8")[::-1], encoding="utf-8")
    labels = []
    for name, text in (("text.txt", char_gpt2_dir.parent / "text.txt"), ("other.txt", other)):
        rc = main(["lipschitz", str(char_gpt2_dir), "--layer", "0", "--data", "real", "--text-file", str(text),
                   "--lengths", "4,8", "--samples", "2", "--csv", str(tmp_path / f"{name}.csv")])
        assert rc == 0
        labels.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["label"])
    assert labels == ["L0 real text.txt masked", "L0 real other.txt masked"]  # (a causal layer: masked)
