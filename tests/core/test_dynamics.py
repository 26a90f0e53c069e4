"""Issue 18: tokens as particles (core.dynamics), against known answers."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from desktop_app.core import dynamics as dy


def run_to(cfg: dy.DynamicsConfig, steps: int, head: dy.Head | None = None, record_every: int = 1) -> dy.Simulation:
    sim = dy.Simulation(cfg, head)
    sim.advance(steps, record_every)
    return sim


@pytest.mark.parametrize("kind", dy.ATTENTION_KINDS)
@pytest.mark.parametrize("integrator", dy.INTEGRATORS)
def test_v_zero_nothing_moves(kind, integrator):
    d = 3
    head = dy.random_head(d, norm_qk=1.5, norm_v=1.0, seed=3)
    head = dy.Head(V=torch.zeros(d, d, dtype=torch.float64), A=head.A, Q=head.Q, K=head.K, name="V = 0")
    sim = dy.Simulation(dy.DynamicsConfig(attention=kind, d=d, n=20, init="gaussian", integrator=integrator, dt=0.2,
                                          perturbation=0), head)
    x0 = sim.x.clone()
    sim.advance(10)
    assert torch.equal(sim.x, x0)
    assert sim.records[-1].radius == pytest.approx(sim.records[0].radius, abs=0)


@pytest.mark.parametrize("kind", ["softmax", "l2"])
def test_a_zero_every_particle_moves_toward_the_v_mapped_mean(kind):
    d, n = 3, 12
    X = dy.initial_positions("gaussian", n, d, seed=1)
    V = dy.random_head(d, norm_v=2.0, seed=5).V
    zero = torch.zeros(d, d, dtype=torch.float64)
    head = dy.Head(V=V, A=zero, Q=zero, K=zero)  # l2: Q = K = 0 gives a constant score, the same thing
    G = dy.velocity(X, 0.0, head, kind)
    expected = (X.mean(0) @ V.T).expand(n, d)
    torch.testing.assert_close(G, expected, rtol=1e-12, atol=1e-12)


def test_a_zero_v_identity_closed_form_and_renormalised_collapse():
    """A = 0, V = I: x_i(t) = x_i(0) + (e^t - 1) xbar(0), so z_i = e^-t x_i -> xbar(0): one cluster."""
    d, n = 2, 10
    zero = torch.zeros(d, d, dtype=torch.float64)
    head = dy.Head(V=torch.eye(d, dtype=torch.float64), A=zero)
    cfg = dy.DynamicsConfig(d=d, n=n, init="ball", integrator="rk4", dt=0.01, renormalise=True, perturbation=0, seed=2)
    sim = dy.Simulation(cfg, head)
    x0 = sim.x.clone()
    assert sim.records[0].clusters > 1
    sim.advance(600, record_every=100)  # t = 6
    t = sim.t
    torch.testing.assert_close(sim.x, x0 + (math.exp(t) - 1) * x0.mean(0), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(sim.shown(), math.exp(-t) * x0 + (1 - math.exp(-t)) * x0.mean(0), rtol=1e-9, atol=1e-9)
    assert sim.records[-1].clusters == 1


@pytest.mark.parametrize("d", [2, 3])
def test_sphere_identity_parameters_reach_one_cluster(d):
    """Geshkovski et al.: on the sphere with Q = K = V = I the particles gather into a single cluster."""
    cfg = dy.DynamicsConfig(d=d, n=32, init="sphere", sphere=True, integrator="euler", dt=0.1, seed=0, perturbation=0)
    sim = dy.Simulation(cfg)
    assert sim.records[0].clusters > 1
    sim.advance(300, record_every=100)  # t = 30
    last = sim.records[-1]
    assert last.clusters == 1
    assert last.mean_cosine > 0.9999
    assert torch.allclose(sim.x.norm(dim=1), torch.ones(32, dtype=torch.float64))


@pytest.mark.parametrize("kind", dy.ATTENTION_KINDS)
@pytest.mark.parametrize("integrator", dy.INTEGRATORS)
def test_support_radius_never_exceeds_the_bound(kind, integrator):
    cfg = dy.DynamicsConfig(attention=kind, d=3, n=24, init="ball", qkv="random", norm_qk=2.0, norm_v=1.5,
                            integrator=integrator, dt=0.05, seed=4, perturbation=0)
    sim = run_to(cfg, 40)
    ratios = [r.radius / r.radius_bound for r in sim.records]
    assert max(ratios) <= 1 + 1e-12
    assert sim.records[-1].radius > sim.records[0].radius  # it did grow: the check is not vacuous
    assert sim.records[-1].radius_bound == pytest.approx(sim.r0 * math.exp(1.5 * sim.t), rel=1e-9)


def test_time_dependent_bound_uses_the_integral_of_the_norm():
    m = dy.Modulation(amplitude=0.5, omega=2.0)
    s = np.linspace(0, 3.0, 30001)
    numeric = np.trapezoid([m.v(x) for x in s], s) if hasattr(np, "trapezoid") else np.trapz([m.v(x) for x in s], s)
    assert m.v_integral(3.0) == pytest.approx(numeric, rel=1e-7)
    cfg = dy.DynamicsConfig(d=3, n=20, init="ball", qkv="random", norm_v=1.0, amplitude=0.5, omega=2.0,
                            integrator="rk4", dt=0.02, seed=1, perturbation=0)
    sim = run_to(cfg, 150)
    assert max(r.radius / r.radius_bound for r in sim.records) <= 1 + 1e-6


def test_sinkhorn_kernel_is_doubly_stochastic_to_the_tolerance():
    X = dy.initial_positions("gaussian", 50, 4, seed=7)
    head = dy.random_head(4, norm_qk=1.0, seed=8)
    for tol in (1e-3, 1e-8):
        P, iters = dy.sinkhorn_kernel(X, head.Q, head.K, tol=tol)
        assert iters > 1
        torch.testing.assert_close(P.sum(1), torch.ones(50, dtype=torch.float64), rtol=0, atol=1e-12)
        assert float((P.sum(0) - 1).abs().max()) <= tol * (1 + tol)
        assert bool((P > 0).all())
    # one row normalisation alone is not doubly stochastic here: the iterations did the work
    P1 = dy.l2_kernel(X, head.Q, head.K)
    assert float((P1.sum(0) - 1).abs().max()) > 1e-2


def _error_at(integrator: str, dt: float, reference: torch.Tensor, T: float = 1.0) -> float:
    cfg = dy.DynamicsConfig(d=2, n=5, init="gaussian", qkv="random", norm_qk=1.0, norm_v=1.0, integrator=integrator,
                            dt=dt, seed=11, perturbation=0)
    sim = run_to(cfg, round(T / dt), record_every=10**6)
    return float((sim.x - reference).norm())


def test_rk4_converges_at_order_4_and_euler_at_order_1():
    ref_cfg = dy.DynamicsConfig(d=2, n=5, init="gaussian", qkv="random", norm_qk=1.0, norm_v=1.0, integrator="rk4",
                                dt=1 / 640, seed=11, perturbation=0)
    reference = run_to(ref_cfg, 640, record_every=10**6).x
    e = [_error_at("euler", dt, reference) for dt in (1 / 20, 1 / 40, 1 / 80)]
    r = [_error_at("rk4", dt, reference) for dt in (1 / 5, 1 / 10, 1 / 20)]
    euler_orders = [math.log2(e[i] / e[i + 1]) for i in range(2)]
    rk4_orders = [math.log2(r[i] / r[i + 1]) for i in range(2)]
    assert all(0.9 < p < 1.1 for p in euler_orders), euler_orders
    assert all(3.7 < p < 4.3 for p in rk4_orders), rk4_orders


def test_measures_on_known_configurations():
    P = np.array([[0, 0], [0.01, 0], [0.02, 0], [1, 0], [1.01, 0], [5, 5]])
    # threshold 0.01 * max |p| = 0.0707: chains {0, 1, 2}, {3, 4}, {5}
    assert dy.count_clusters(P, 0.01) == 3
    assert dy.count_clusters(P, 1.0) == 1
    assert dy.count_clusters(np.eye(4), 0.05) == 4
    assert dy.mean_cosine(np.eye(3)) == pytest.approx(0.0, abs=1e-15)
    assert dy.mean_cosine(np.array([[1.0, 0], [-2.0, 0]])) == pytest.approx(-1.0)
    assert dy.mean_cosine(np.array([[1.0, 1], [2.0, 2], [3.0, 3]])) == pytest.approx(1.0)
    assert dy.support_radius(np.array([[3.0, 4.0], [0, 1]])) == 5.0


def test_twin_run_w2_starts_at_the_perturbation_and_stays_bounded():
    cfg = dy.DynamicsConfig(d=3, n=40, init="sphere", sphere=True, dt=0.1, perturbation=1e-4, seed=3)
    sim = run_to(cfg, 100, record_every=10)
    w = [r.w2 for r in sim.records]
    assert 0 < w[0] < 1e-3
    assert max(w) < 100 * w[0]  # Wasserstein stability: no blow-up of nearby starts over t <= 10


def test_initial_conditions(tmp_path):
    X = dy.initial_positions("sphere", 100, 3, seed=0, radius=2.0)
    torch.testing.assert_close(X.norm(dim=1), torch.full((100,), 2.0, dtype=torch.float64))
    B = dy.initial_positions("ball", 2000, 3, seed=0)
    assert float(B.norm(dim=1).max()) <= 1.0
    assert float((B.norm(dim=1) < 0.5).double().mean()) == pytest.approx(0.125, abs=0.03)  # volume fraction 1/8
    C = np.diag([4.0, 1.0])
    G = dy.initial_positions("gaussian", 20000, 2, seed=0, covariance=C).numpy()
    np.testing.assert_allclose(np.cov(G.T), C, atol=0.15)
    K = dy.initial_positions("clusters", 60, 3, seed=0, n_clusters=3, spread=1e-3)
    assert dy.count_clusters(K, 0.05) == 3
    with pytest.raises(ValueError, match="positive semi-definite"):
        dy.initial_positions("gaussian", 5, 2, covariance=np.array([[1.0, 2.0], [2.0, 1.0]]))


def test_load_head_from_npz_and_bad_files(tmp_path):
    Q, K, V = np.eye(3), 2 * np.eye(3), 0.5 * np.eye(3)
    good = tmp_path / "qkv.npz"
    np.savez(good, Q=Q, K=K, V=V)
    head = dy.load_head(good)
    np.testing.assert_allclose(head.A.numpy(), K.T @ Q / math.sqrt(3))
    av = tmp_path / "av.npz"
    np.savez(av, A=np.eye(3), V=V)
    with pytest.raises(ValueError, match="l2 attention needs Q and K"):
        dy.load_head(av).check("l2")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    missing = tmp_path / "missing.npz"
    np.savez(missing, V=V)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, A=np.eye(2), V=V)
    for path, words in ((bad, "not a NumPy .npz"), (missing, "needs arrays V and either Q and K or A"),
                        (wrong, "A has shape (2, 2) but V is 3x3")):
        with pytest.raises(ValueError) as err:
            dy.load_head(path)
        msg = str(err.value)
        assert msg.startswith(str(path)) and words in msg and "\n" not in msg
    with pytest.raises(FileNotFoundError, match="no such file"):
        dy.load_head(tmp_path / "nope.npz")
    with pytest.raises(ValueError, match="V is 3x3 but the particles live in dimension 2"):
        dy.Simulation(dy.DynamicsConfig(d=2, n=4), head)


def test_model_layer_curves_and_tokens_from_a_trace():
    from desktop_app.core.checkpoints import new_model
    from desktop_app.core.config import ModelConfig

    cfg = ModelConfig.gpt2(vocab_size=20, d_model=16, n_layers=3, n_heads=2, d_ff=32, context_length=32)
    model = new_model(cfg, seed=0).eval()
    _, trace = model.run_with_trace(torch.arange(12)[None])
    curves = dy.layer_curves(trace, cluster_tol=0.05)
    assert curves.names == ["embed", "blocks.0.resid_mid", "blocks.1.resid_mid", "blocks.2.resid_mid"]
    X = trace["blocks.1.resid_mid"][0].double().numpy()
    assert curves.mean_cosine[2] == pytest.approx(dy.mean_cosine(X))
    assert curves.radius[2] == pytest.approx(np.linalg.norm(X, axis=1).max())
    assert curves.clusters[2] == dy.count_clusters(X, 0.05)
    # a model head drives the same flow, started from those tokens
    head = dy.model_head(model, 1, 0)
    assert head.d == 16 and head.Q.shape == (8, 16)
    sim = dy.Simulation(dy.DynamicsConfig(init="tokens", attention="l2", dt=0.1, perturbation=0), head,
                        tokens=dy.trace_tokens(trace, "blocks.0.resid_mid"))
    assert sim.config.n == 12 and sim.config.d == 16
    sim.advance(3)
    assert sim.records[-1].radius <= sim.records[-1].radius_bound


def test_projection_and_rotation():
    X = np.random.default_rng(0).normal(size=(200, 5)) * np.array([10, 5, 1, 0.1, 0.1])
    B = dy.projection_basis(X, 3)
    np.testing.assert_allclose(np.abs(B.T @ np.eye(5)[:, :3]), np.eye(3), atol=0.05)  # the wide axes first
    np.testing.assert_allclose(dy.projection_basis(np.zeros((3, 2)), 3), np.eye(2, 3))
    R = dy.rotation(0.3, -0.7)
    np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-12)
    xy, depth = dy.view_3d(np.array([[0, 0, 1.0]]), math.pi / 2, 0.0)
    np.testing.assert_allclose(xy, [[1.0, 0.0]], atol=1e-12)  # yaw 90 degrees brings +z to +x


@pytest.mark.parametrize("kind", ["softmax", "l2"])
def test_fast_kernel_means_equal_the_kernel_times_positions(kind):
    X = dy.initial_positions("gaussian", 60, 3, seed=2, radius=2.0)
    head = dy.random_head(3, norm_qk=1.5, seed=9)
    P = dy.softmax_kernel(X, head.A * 0.49) if kind == "softmax" else dy.l2_kernel(X, head.Q * 0.7, head.K * 0.7)
    torch.testing.assert_close(dy.kernel_means(X, head, kind, qk_scale=0.7), P @ X, rtol=1e-12, atol=1e-12)
    # scores so large that every shifted exponential underflows: the exact path takes over
    big = dy.Head(V=head.V, A=head.A * 1e4, Q=head.Q * 100, K=head.K * 100)
    P = dy.softmax_kernel(X, big.A) if kind == "softmax" else dy.l2_kernel(X, big.Q, big.K)
    means = dy.kernel_means(X, big, kind)
    assert bool(torch.isfinite(means).all())
    torch.testing.assert_close(means, P @ X, rtol=1e-9, atol=1e-9)


def test_parse_covariance_diagonal_rows_and_one_line_errors():
    np.testing.assert_array_equal(dy.parse_covariance("2", 3), 2 * np.eye(3))
    np.testing.assert_array_equal(dy.parse_covariance("4, 1, 0.25", 3), np.diag([4, 1, 0.25]))
    np.testing.assert_array_equal(dy.parse_covariance("2 0.5; 0.5 1", 2), [[2, 0.5], [0.5, 1]])
    for text, words in (("1 2; 3 4", "symmetric"), ("1 2; 2 1", "positive semi-definite"), ("1; 2; 3", "3 rows of 3"),
                        ("a, b", "give numbers"), ("-1", "negative")):
        with pytest.raises(ValueError, match=words) as info:
            dy.parse_covariance(text, 2 if ";" in text and text.count(";") == 1 else 3)
        assert "\n" not in str(info.value)


def test_cluster_sample_counts_a_fixed_subset_and_finds_separated_clusters():
    cfg = dy.DynamicsConfig(init="clusters", n=3000, n_clusters=4, cluster_spread=0.001, perturbation=0,
                            cluster_sample=300)
    sim = dy.Simulation(cfg)
    assert len(sim.cluster_index) == 300 and len(set(sim.cluster_index.tolist())) == 300
    assert sim.records[0].clusters == 4 == dy.count_clusters(sim.x, cfg.cluster_tol)
    again = dy.Simulation(cfg)
    assert torch.equal(sim.cluster_index, again.cluster_index)  # the same particles at every record


def test_the_fused_float32_path_matches_the_exact_kernel_means():
    X = dy.initial_positions("sphere", 500, 3, seed=4).float()
    for kind in ("softmax", "l2"):
        head = dy.random_head(3, norm_qk=2.0, seed=1, dtype=torch.float32)
        exact = (dy.softmax_kernel(X.double(), head.A.double()) if kind == "softmax"
                 else dy.l2_kernel(X.double(), head.Q.double(), head.K.double())) @ X.double()
        torch.testing.assert_close(dy.kernel_means(X, head, kind).double(), exact, rtol=1e-5, atol=1e-5)


def test_sinkhorn_and_scores_come_from_core_attention():
    from desktop_app.core import attention

    X = dy.initial_positions("gaussian", 9, 3, seed=2)
    head = dy.random_head(3, seed=3)
    torch.testing.assert_close(dy.l2_scores(X, head.Q, head.K),
                               attention.attention_scores(X @ head.Q.T, X @ head.K.T, "l2", scale=1.0))
    log_p, rounds = attention.sinkhorn_to_tolerance(dy.l2_scores(X, head.Q, head.K), tol=1e-9)
    P = log_p.exp()
    torch.testing.assert_close(P.sum(1), torch.ones(9, dtype=P.dtype), rtol=0, atol=1e-12)
    assert (P.sum(0) - 1).abs().max() < 1e-8 and rounds > 1
    # many rounds of the fixed-round normaliser reach the same doubly stochastic matrix
    torch.testing.assert_close(torch.softmax(attention.sinkhorn_log_normalise(dy.l2_scores(X, head.Q, head.K), 500), -1),
                               P, rtol=1e-6, atol=1e-8)


def test_an_a_and_v_archive_reads_the_same_in_the_lipschitz_lab(tmp_path):
    from desktop_app.core.lipschitz.files import load_matrices

    path = tmp_path / "av.npz"
    rng = np.random.default_rng(0)
    np.savez(path, A=rng.normal(size=(3, 3)), V=rng.normal(size=(3, 3)))
    A, V = load_matrices(path)
    head = dy.load_head(path)
    assert torch.equal(head.A, A) and torch.equal(head.V, V)


def test_strict_json_lives_in_core_files_and_the_lab_re_exports_it():
    from desktop_app.core import files
    from desktop_app.core.lipschitz import files as lab_files

    assert lab_files.strict_json is files.strict_json
    assert files.strict_json({"a": float("nan"), "b": [1.0, float("inf")], "c": (2, "x")}) == {"a": None, "b": [1.0, None],
                                                                                             "c": [2, "x"]}
