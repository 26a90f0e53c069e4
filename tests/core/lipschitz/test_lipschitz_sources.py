"""The input-source registry: one declaration makes a source known to run_sweep, the CLI's --data
choices and the panel's combos; build_sweep_spec and sweep_label are the one way to describe and name a sweep."""
import argparse

import pytest
import torch

from desktop_app.core import lipschitz as lip


def test_declared_sources_and_what_they_feed():
    assert lip.source_names(lip.MODEL) == ("real", "adversarial", "search", "image")
    assert lip.source_names(lip.SYNTHETIC) == ("random", "adversarial")
    assert lip.data_kinds() == ("real", "adversarial", "search", "image", "synthetic")
    assert [s.label for s in lip.sources_for(lip.SYNTHETIC)] == ["random in B_R", "adversarial"]


def test_the_cli_offers_the_registrys_model_sources():
    from desktop_app.commands import lipschitz as command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    sub = parser._subparsers._group_actions[0].choices["lipschitz"]
    data = next(a for a in sub._actions if a.dest == "data")
    assert tuple(data.choices) == lip.source_names(lip.MODEL)


@pytest.fixture
def constant_source():
    """A new source declared the documented way: every token is R e_1."""
    def inputs(ctx):
        def at(n):
            X = torch.zeros(ctx.spec.samples, n, ctx.fmap.d)
            X[..., 0] = ctx.radius
            return ctx.cast(X), None
        return at

    source = lip.register_source(lip.InputSource("constant", "constant tokens", (lip.SYNTHETIC,), inputs,
                                                 uses_radius=True))
    yield source
    del lip.INPUT_SOURCES["constant"]


def test_a_new_source_needs_one_declaration(constant_source):
    assert "constant" in lip.source_names(lip.SYNTHETIC)
    spec = lip.build_sweep_spec({"function": "synthetic", "data": "constant", "d": 4, "radius": 2.0,
                                 "lengths": [4, 8], "samples": 2})
    result = lip.run_sweep(spec)
    assert [r.n for r in result.lengths] == [4, 8]
    assert all((r.radius == 2.0).all() for r in result.lengths)
    assert lip.sweep_label(spec) == "synthetic softmax d=4 constant"
    with pytest.raises(ValueError, match="already exists"):
        lip.register_source(constant_source)


def test_build_sweep_spec_matches_a_hand_made_spec():
    built = lip.build_sweep_spec({"function": "synthetic", "data": "adversarial", "d": None, "norm_A": 2.0,
                                  "norm_V": None, "lengths": [4, 8], "samples": 1, "masked": None})
    assert (built.data, built.synthetic_adversarial, built.d, built.norm_A, built.norm_V, built.masked) == \
        ("synthetic", True, 16, 2.0, 1.0, False)
    assert (built.tol, built.seed, built.search_steps) == (lip.DEFAULT_TOL, lip.DEFAULT_SEED, lip.DEFAULT_SEARCH_STEPS)
    hand = lip.SweepSpec(data="synthetic", synthetic_adversarial=True, norm_A=2.0, lengths=[4, 8], samples=1)
    assert lip.run_sweep(built).rows() == lip.run_sweep(hand).rows()


def test_build_sweep_spec_takes_d_from_the_users_matrices():
    A, V = torch.eye(3, dtype=torch.float64), torch.eye(3, dtype=torch.float64)
    spec = lip.build_sweep_spec({"function": "synthetic", "matrices": (A, V), "matrices_name": "av.npz", "d": None})
    assert spec.d == 3 and spec.source_name == "random"


@pytest.mark.parametrize("options, message", [
    ({"function": "synthetic", "data": "real"}, "unknown input source 'real' for a synthetic function"),
    ({"function": "model", "data": "random"}, "unknown input source 'random' for a model function"),
    ({"function": "nothing"}, "unknown function"),
    ({"function": "model", "tolerance": 1e-3}, "unknown sweep option"),
])
def test_build_sweep_spec_refuses_what_it_cannot_run(options, message):
    with pytest.raises(ValueError, match=message):
        lip.build_sweep_spec(options)


class _Cfg:
    causal = True


class _Model:
    cfg = _Cfg()


def test_one_label_form_for_the_cli_and_the_panel():
    spec = lip.SweepSpec(data="real", model=_Model(), layer=0, head=1, masked=None)
    assert lip.sweep_label(spec) == "L0 H1 real masked"  # the model's own mask (causal)
    spec.masked = False
    assert lip.sweep_label(spec) == "L0 H1 real"
    assert lip.sweep_label(spec, model_name="demo-model") == "demo-model L0 H1 real"
    synthetic = lip.SweepSpec(data="synthetic", d=8, attention="l2", seed=3, masked=True,
                              matrices=(torch.eye(8), torch.eye(8)), matrices_name="av.npz",
                              synthetic_adversarial=True)
    assert lip.sweep_label(synthetic) == "synthetic l2 d=8 av.npz adversarial seed 3 masked"
    assert lip.sweep_label(synthetic, model_name="m") == lip.sweep_label(synthetic)  # no model in it
