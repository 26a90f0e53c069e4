"""The Python API a script calls checks its numbers where they are declared, as the command line does (edges7).

A script's `lip.run_sweep(lip.SweepSpec(samples=0))` was a reshape error deep in the estimator, d=0 a
ZeroDivisionError, radius=inf or norm_A=nan numpy's "SVD did not converge", lengths=[-3] "negative dimension",
tol=nan ran to the end on a meaningless tolerance. SweepSpec checks each number against sweep.LIMITS, the ranges
the lipschitz command's options take as their types (one declaration).
"""
from __future__ import annotations

import numpy as np
import pytest

from desktop_app.core import lipschitz as lip
from desktop_app.core.lipschitz.sweep import LIMITS


def _spec(**change):
    return lip.build_sweep_spec({"function": "synthetic", "data": "random", "lengths": [2, 3], "samples": 1,
                                 "d": 4, **change})


@pytest.mark.parametrize("name,value,expected", [
    ("samples", 0, "samples: must be an integer from 1 to 1,000,000, got 0"),
    ("samples", 2.5, "samples: must be an integer from 1 to 1,000,000, got 2.5"),
    ("samples", True, "samples: must be an integer from 1 to 1,000,000, got True"),
    ("d", 0, "d: must be an integer from 1 to 16,384, got 0"),
    ("radius", float("inf"), "radius: must be in (0, 1e+06], got inf"),
    ("norm_A", float("nan"), "norm_A: must be in [0, 1e+06], got nan"),
    ("norm_V", 0.0, "norm_V: must be in (0, 1e+06], got 0.0"),
    ("tol", float("nan"), "tol: must be in (0, 1), got nan"),
    ("search_steps", -1, "search_steps: must be an integer from 0 to 1,000,000, got -1"),
    ("seed", -1, "seed: must be an integer from 0 to 9,223,372,036,854,775,807, got -1"),
    ("lengths", [-3], "lengths: each must be an integer from 2 to 1,000,000,000, got -3"),
    ("lengths", [2, 2.5], "lengths: each must be an integer from 2 to 1,000,000,000, got 2.5"),
    ("lengths", [], "lengths: give at least one length"),
])
def test_a_sweep_refuses_a_number_out_of_its_range_by_name(name, value, expected):
    with pytest.raises(ValueError) as exc:
        _spec(**{name: value})
    assert str(exc.value) == expected


def test_the_model_side_numbers_are_checked_too():
    for name, value in (("layer", -1), ("head", -2)):
        with pytest.raises(ValueError, match=f"^{name}: must be an integer from 0 to 1,000,000, got {value}$"):
            lip.SweepSpec(data="real", **{name: value})


def test_numpy_integers_and_the_panels_values_pass():
    spec = _spec(samples=np.int64(2), lengths=np.array([2, 3]), seed=np.int32(7), norm_A=0.0)
    assert spec.samples == 2 and type(spec.samples) is int and spec.seed == 7 and spec.norm_A == 0.0
    result = lip.run_sweep(spec)
    assert [r.n for r in result.lengths] == [2, 3] and all(np.isfinite(r.lipschitz).all() for r in result.lengths)


def test_the_command_line_takes_the_same_ranges(capsys):
    """lipschitz's options are argparse types of the same Ranges: one declaration, one message."""
    from desktop_app.cli import build_parser
    from desktop_app.commands.args import Number

    parser = build_parser(only="lipschitz")
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices
    types = {a.dest: a.type for a in sub["lipschitz"]._actions if isinstance(a.type, Number)}
    for name, limit in LIMITS.items():
        kind = types[name.lower()]  # norm_A: --norm-a
        assert (kind.kind, kind.lo, kind.hi, kind.lo_open, kind.hi_open) == (limit.kind, limit.lo, limit.hi,
                                                                             limit.lo_open, limit.hi_open), name


# -- the dynamics: DynamicsConfig checks its numbers against dynamics.LIMITS, the command's option types --------


@pytest.mark.parametrize("name,value,expected", [
    ("init_radius", float("nan"), "init_radius: must be in (0, 1e+06], got nan"),  # ran on NaN positions
    ("n", 10**12, "n: must be an integer from 1 to 1,000,000,000, got 1000000000000"),  # asked torch for 24 TB
    ("n", 2.0, "n: must be an integer from 1 to 1,000,000,000, got 2.0"),
    ("norm_qk", float("inf"), "norm_qk: must be in [0, 1e+06], got inf"),
    ("cluster_tol", 0.0, "cluster_tol: must be in (0, 1], got 0.0"),
    ("sinkhorn_tol", -1.0, "sinkhorn_tol: must be in (0, 1), got -1.0"),
    ("omega", float("nan"), "omega: must be in [-1e+06, 1e+06], got nan"),
])
def test_a_dynamics_config_refuses_a_number_out_of_its_range_by_name(name, value, expected):
    from desktop_app.core import dynamics as dy

    with pytest.raises(ValueError) as exc:
        dy.DynamicsConfig(**{"d": 2, "n": 4, name: value})
    assert str(exc.value) == expected


def test_the_dynamics_command_takes_the_same_ranges():
    from desktop_app.cli import build_parser
    from desktop_app.commands.args import Number
    from desktop_app.core import dynamics as dy

    parser = build_parser(only="dynamics")
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices
    types = {a.dest: a.type for a in sub["dynamics"]._actions if isinstance(a.type, Number)}
    option = {"n_clusters": "clusters_k", "amplitude": "time_dependent"}
    shared = [name for name in dy.LIMITS if option.get(name, name) in types]
    assert len(shared) == 11, shared
    for name in shared:
        kind, limit = types[option.get(name, name)], dy.LIMITS[name]
        assert (kind.kind, kind.lo, kind.hi, kind.lo_open, kind.hi_open) == (limit.kind, limit.lo, limit.hi,
                                                                             limit.lo_open, limit.hi_open), name
    sim = dy.run(dy.DynamicsConfig(d=2, n=np.int64(5), init="ball", seed=np.int64(1)), 2)
    assert sim.config.n == 5 and np.isfinite(sim.records[-1].radius)


def test_token_ids_from_a_script_are_integers():
    """check_ids took int() of each id: 1.5 became token 1 and "3" token 3 without a word; numpy's and torch's
    integers still pass."""
    import torch

    from desktop_app.core.inputs import InputError, check_ids

    assert check_ids([1, np.int64(2), torch.tensor(3)], 9).ids == [1, 2, 3]
    assert check_ids(torch.tensor([4, 5]), 9).ids == [4, 5] and check_ids(np.array([6]), 9).ids == [6]
    for bad in ([1.5], [True], ["3"], torch.tensor([1.0])):
        with pytest.raises(InputError, match="is not a token id \\(an integer\\)"):
            check_ids(bad, 9)


def test_a_sweep_too_large_for_memory_is_refused_before_it_starts():
    """run_sweep estimates the attention Jacobians' memory at the longest length itself (the command did, a
    script's lengths=[10**6] asked torch for terabytes)."""
    from desktop_app.core.devices import MemoryEstimateError

    with pytest.raises(MemoryEstimateError, match=r"^lengths up to 1000000 needs about .* for the attention "
                                                  r"Jacobians; this machine has .* available$"):
        lip.run_sweep(_spec(lengths=[2, 10**6]))


# -- generation: generate() and GenerationSettings check their numbers against core.numbers.GENERATION (api2) ------


def _tiny_gpt2():
    from desktop_app.core.checkpoints import new_model
    from desktop_app.core.config import ModelConfig

    cfg = ModelConfig.gpt2(vocab_size=31, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=16)
    return new_model(cfg, seed=0).eval()


@pytest.mark.parametrize("max_new,expected", [
    (-1, "max_new: must be an integer from 0 to 1,000,000,000, got -1"),  # generated nothing, silently
    (2.5, "max_new: must be an integer from 0 to 1,000,000,000, got 2.5"),  # a TypeError deep in the run
    (True, "max_new: must be an integer from 0 to 1,000,000,000, got True"),
])
def test_generate_refuses_a_bad_max_new_by_name(max_new, expected):
    from desktop_app.core.generation import generate

    with pytest.raises(ValueError) as exc:
        generate(_tiny_gpt2(), [1, 2], max_new)
    assert str(exc.value) == expected


@pytest.mark.parametrize("name,value,expected", [
    ("temperature", -0.5, "temperature: must be in [0, 1e+06], got -0.5"),
    ("temperature", float("inf"), "temperature: must be in [0, 1e+06], got inf"),
    ("top_k", -1, "top_k: must be an integer from 0 to 1,000,000,000 (0: off), got -1"),
    ("top_k", 2.5, "top_k: must be an integer from 0 to 1,000,000,000 (0: off), got 2.5"),  # was 2.5 kept silently
    ("top_p", 2.0, "top_p: must be in (0, 1], got 2.0"),
    ("top_p", float("nan"), "top_p: must be in (0, 1], got nan"),
    ("beams", 0, "beams: must be an integer from 1 to 1,000,000,000, got 0"),
    ("beams", 2.5, "beams: must be an integer from 1 to 1,000,000,000, got 2.5"),  # a TypeError in the search
    ("length_penalty", 11.0, "length_penalty: must be in [-10, 10], got 11.0"),
    ("length_penalty", "1", "length_penalty: must be in [-10, 10], got '1'"),
])
def test_generation_settings_refuse_a_number_out_of_its_range_by_name(name, value, expected):
    from desktop_app.core.generation import GenerationSettings, generate

    with pytest.raises(ValueError) as exc:
        GenerationSettings("beam", **{name: value})
    assert str(exc.value) == expected
    settings = GenerationSettings("beam")
    setattr(settings, name, value)  # set after it was made: the session's check still names it
    with pytest.raises(ValueError) as exc:
        generate(_tiny_gpt2(), [1, 2], 2, settings)
    assert str(exc.value) == expected


def test_a_sessions_seed_and_run_length_are_checked_by_name():
    """GenerationSession(seed=2.5) was seed 2 without a word, run(-1) ran nothing, run(2.5) a TypeError."""
    from desktop_app.core.generation import GenerationSession

    with pytest.raises(ValueError, match=r"^seed: must be an integer from 0 to 9,223,372,036,854,775,807, got 2.5$"):
        GenerationSession(_tiny_gpt2(), [1, 2], seed=2.5)
    session = GenerationSession(_tiny_gpt2(), [1, 2], seed=np.int64(3))
    assert session.seed == 3 and type(session.seed) is int
    for n in (-1, 2.5):
        with pytest.raises(ValueError, match=f"^n: must be an integer from 0 to 1,000,000,000, got {n}$"):
            list(session.run(n))
    with pytest.raises(ValueError, match=r"^seed: must be an integer .* got -1$"):
        session.reset(seed=-1)
    assert len(list(session.run(2))) == 2


def test_generation_numbers_from_numpy_pass_and_the_command_takes_the_same_ranges():
    from desktop_app.cli import build_parser
    from desktop_app.commands.args import Number
    from desktop_app.core.generation import GenerationSettings, generate
    from desktop_app.core.numbers import GENERATION

    s = GenerationSettings("top-k", temperature=np.float32(0.5), top_k=np.int64(3), beams=np.int32(2))
    assert (s.temperature, s.top_k, s.beams) == (0.5, 3, 2) and type(s.top_k) is int and type(s.temperature) is float
    ids, _ = generate(_tiny_gpt2(), [1, 2], np.int64(3), s)
    assert len(ids) == 5
    parser = build_parser(only="generate")
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices
    types = {a.dest: a.type for a in sub["generate"]._actions if isinstance(a.type, Number)}
    for name, limit in GENERATION.items():
        kind = types[name]
        assert (kind.kind, kind.lo, kind.hi, kind.lo_open, kind.hi_open) == (limit.kind, limit.lo, limit.hi,
                                                                             limit.lo_open, limit.hi_open), name
