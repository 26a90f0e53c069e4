"""Issue 18: `python -m desktop_app dynamics` writes the curves as CSV and ends with one JSON line."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from desktop_app.cli import EXIT_INPUT, main
from desktop_app.core import dynamics as dy


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main(["dynamics", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sphere_identity_run_clusters_and_writes_csv_and_positions(tmp_path, capsys):
    out_csv, out_npz = tmp_path / "curves.csv", tmp_path / "pos.npz"
    code, out, err = run_cli(capsys, "--attention", "softmax", "--d", "3", "--n", "32", "--sphere", "--init", "sphere",
                             "--qkv", "identity", "--integrator", "euler", "--dt", "0.1", "--steps", "300",
                             "--record-every", "50", "--seed", "0", "--csv", str(out_csv), "--positions", str(out_npz))
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["final_clusters"] == 1
    assert summary["max_radius_over_bound"] <= 1 + 1e-12
    with open(out_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(dy.CSV_COLUMNS)
    assert [float(r["t"]) for r in rows] == pytest.approx([0, 5, 10, 15, 20, 25, 30])
    assert int(rows[0]["clusters"]) > 1 and int(rows[-1]["clusters"]) == 1
    assert float(rows[-1]["mean_cosine"]) > 0.9999
    saved = np.load(out_npz)
    assert saved["x"].shape == (32, 3) and float(saved["t"]) == pytest.approx(30.0)
    np.testing.assert_allclose(np.linalg.norm(saved["x"], axis=1), 1.0)


def test_same_numbers_as_the_core(tmp_path, capsys):
    out_csv = tmp_path / "c.csv"
    code, out, _ = run_cli(capsys, "--attention", "l2", "--d", "2", "--n", "20", "--init", "ball", "--qkv", "random",
                           "--norm-v", "1.5", "--integrator", "rk4", "--dt", "0.05", "--steps", "20", "--seed", "3",
                           "--csv", str(out_csv))
    assert code == 0
    sim = dy.run(dy.DynamicsConfig(attention="l2", d=2, n=20, init="ball", qkv="random", norm_v=1.5, integrator="rk4",
                                   dt=0.05, seed=3), 20)
    assert out_csv.read_text() == dy.csv_text(sim.records)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["final_clusters"] == sim.records[-1].clusters
    assert summary["max_radius_over_bound"] == pytest.approx(max(r.radius / r.radius_bound for r in sim.records))
    assert summary["max_radius_over_bound"] <= 1


def test_bad_matrices_file_is_one_line_naming_it(tmp_path, capsys):
    bad = tmp_path / "qkv.npz"
    np.savez(bad, Q=np.eye(3))
    code, out, err = run_cli(capsys, "--matrices", str(bad), "--csv", str(tmp_path / "o.csv"))
    assert code == EXIT_INPUT
    assert len(err.strip().splitlines()) == 1 and str(bad) in err and "needs arrays V" in err
    assert not (tmp_path / "o.csv").exists()
    good = tmp_path / "av.npz"
    np.savez(good, A=np.eye(2), V=np.eye(2))
    code, _, err = run_cli(capsys, "--matrices", str(good), "--attention", "sinkhorn", "--csv", str(tmp_path / "o.csv"))
    assert code == EXIT_INPUT and "sinkhorn attention needs Q and K" in err


def test_gaussian_start_with_chosen_variances(tmp_path, capsys):
    out_npz = tmp_path / "p.npz"
    code, _, err = run_cli(capsys, "--init", "gaussian", "--variances", "9,1,0.04", "--n", "4000", "--steps", "0",
                           "--perturbation", "0", "--csv", str(tmp_path / "c.csv"), "--positions", str(out_npz))
    assert code == 0, err
    x0 = np.load(out_npz)["x0"]
    np.testing.assert_allclose(np.cov(x0.T), np.diag([9, 1, 0.04]), atol=0.4, rtol=0.08)
    code, _, err = run_cli(capsys, "--init", "gaussian", "--variances", "4,1", "--csv", str(tmp_path / "c.csv"))
    assert code == EXIT_INPUT and "give 1 number, 3 numbers or 3 rows of 3" in err


def test_gaussian_start_with_a_full_covariance_and_null_w2_without_twin(tmp_path, capsys):
    out_npz = tmp_path / "p.npz"
    C = np.array([[2.0, 0.8, 0.0], [0.8, 1.0, 0.0], [0.0, 0.0, 0.5]])
    rows = "; ".join(" ".join(str(v) for v in r) for r in C)
    code, out, err = run_cli(capsys, "--init", "gaussian", "--variances", rows, "--n", "4000", "--steps", "0",
                             "--perturbation", "0", "--csv", str(tmp_path / "c.csv"), "--positions", str(out_npz))
    assert code == 0, err
    np.testing.assert_allclose(np.cov(np.load(out_npz)["x0"].T), C, atol=0.12)
    summary = json.loads(out.strip().splitlines()[-1])  # strict JSON: no twin run, no W2
    assert summary["final_w2"] is None and "NaN" not in out
    code, _, err = run_cli(capsys, "--init", "gaussian", "--variances", "1 2 0; 2 1 0; 0 0 1", "--csv",
                           str(tmp_path / "c.csv"))
    assert code == EXIT_INPUT and "positive semi-definite" in err and len(err.strip().splitlines()) == 1
