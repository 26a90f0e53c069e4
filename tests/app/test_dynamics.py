"""app.dynamics.dynamics_setup: the one set-up the Dynamics panel and `dynamics` share (its checks
and one-line messages, and the config it builds)."""
from __future__ import annotations

import numpy as np
import pytest

from desktop_app.app.dynamics import dynamics_setup
from desktop_app.core import dynamics as dy


def test_a_radius_bound_that_would_overflow_is_refused_in_one_line():
    with pytest.raises(ValueError, match="overflows") as info:
        dynamics_setup("softmax", 3, 8, "sphere", qkv="random", norm_v=2.0, steps=10**5, dt=0.01)
    assert "--steps 100000" in str(info.value) and "\n" not in str(info.value)
    # the same set-up with no fixed length (the panel plays on) or fewer steps is fine
    dynamics_setup("softmax", 3, 8, "sphere", qkv="random", norm_v=2.0, dt=0.01)
    dynamics_setup("softmax", 3, 8, "sphere", qkv="random", norm_v=2.0, steps=100, dt=0.01)


def test_the_time_dependence_and_the_file_head_enter_the_bound(tmp_path):
    path = tmp_path / "qkv.npz"
    np.savez(path, Q=np.eye(2), K=np.eye(2), V=5 * np.eye(2))  # ||V|| = 5: 5 x 100 x 1 = 500 < 700
    cfg, head = dynamics_setup("softmax", None, 8, "sphere", matrices=str(path), steps=100, dt=1.0)
    assert cfg.d == 2 and head is not None and head.d == 2
    with pytest.raises(ValueError, match=r"\|\|V\|\| 5 "):
        dynamics_setup("softmax", None, 8, "sphere", matrices=str(path), steps=100, dt=1.0, amplitude=0.5)


def test_d_that_disagrees_with_the_files_v_names_the_file(tmp_path):
    path = tmp_path / "av.npz"
    np.savez(path, A=np.eye(2), V=np.eye(2))
    with pytest.raises(ValueError, match=r"av\.npz: V is 2x2 but --d is 3"):
        dynamics_setup("softmax", 3, 8, "sphere", matrices=str(path))
    assert dynamics_setup("softmax", 2, 8, "sphere", matrices=str(path))[0].d == 2


def test_a_covariance_needs_the_gaussian_start():
    with pytest.raises(ValueError, match="--variances sets the covariance of --init gaussian"):
        dynamics_setup("softmax", 3, 8, "sphere", variances="4,1,1")
    cfg, head = dynamics_setup("softmax", 3, 8, "gaussian", variances="4,1,1")
    assert head is None and np.array_equal(cfg.covariance, np.diag([4.0, 1.0, 1.0]))
    assert dynamics_setup("softmax", None, 8, "gaussian")[0].covariance is None  # no text: no covariance, d 3
    with pytest.raises(ValueError, match="covariance"):
        dynamics_setup("softmax", 3, 8, "gaussian", variances="1 2")  # neither 1 nor d numbers


def test_particles_whose_attention_matrices_cannot_fit_are_refused():
    with pytest.raises(ValueError, match=r"--n 10000000 needs about .* for the n x n attention matrices"):
        dynamics_setup("softmax", 3, 10**7, "sphere")


def test_the_other_options_reach_the_config():
    cfg, _ = dynamics_setup("l2", 4, 16, "clusters", n_clusters=5, sphere=True, seed=7, integrator="rk4",
                            dt=0.25, perturbation=0.0, cluster_sample=10)
    assert (cfg.attention, cfg.d, cfg.n, cfg.init, cfg.n_clusters, cfg.sphere, cfg.seed, cfg.integrator, cfg.dt,
            cfg.perturbation, cfg.cluster_sample) == ("l2", 4, 16, "clusters", 5, True, 7, "rk4", 0.25, 0.0, 10)
    assert isinstance(cfg, dy.DynamicsConfig)
