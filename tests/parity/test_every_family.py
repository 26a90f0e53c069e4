"""Every family in the registry against `transformers`, generated over core/families' REGISTRY (issue 36):
each family's cases live in family_cases/<model_type>.py (CASES: case id -> a function building a tiny
random transformers model) and run through family_parity.check_family (logits 1e-4, every attention
pattern 1e-5, greedy ids as `generate`'s, the round trip back into transformers). A family registered
without a case file, or with no cases in it, fails here: adding a family means adding its case.

The per-family files (test_family_*.py, test_seq2seq_parity.py) keep what is special to one family:
more configurations, refusals, windows, the Lipschitz lab.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from family_parity import check_family  # noqa: E402

from desktop_app.core.families import REGISTRY  # noqa: E402

CASES_DIR = Path(__file__).parent / "family_cases"


def family_cases(registry=REGISTRY) -> list[tuple[str, str, object]]:
    """(model_type, case id, builder) for every case of every registered family, in registry order; a
    family without a case file, or whose CASES is empty, gives one (model_type, "missing", a problem
    line) entry, which the test fails on."""
    out = []
    for model_type in registry:
        if not (CASES_DIR / f"{model_type}.py").is_file():
            out.append((model_type, "missing", f"family {model_type!r} is in the registry but has no parity case "
                                               f"file tests/parity/family_cases/{model_type}.py"))
            continue
        cases = getattr(importlib.import_module(f"family_cases.{model_type}"), "CASES", None)
        if not cases:
            out.append((model_type, "missing", f"tests/parity/family_cases/{model_type}.py defines no CASES"))
            continue
        out.extend((model_type, case_id, builder) for case_id, builder in cases.items())
    return out


def _params():
    """Each family's first case runs by default; its further cases (other layouts and options, a few seconds
    each) with -m slow, so the default run stays within a minute on a busy machine."""
    seen = set()
    for case in family_cases():
        first = case[0] not in seen
        seen.add(case[0])
        yield pytest.param(*case, id=f"{case[0]}-{case[1]}", marks=() if first else pytest.mark.slow)


@pytest.mark.parametrize("model_type, case_id, builder", list(_params()))
def test_family_matches_transformers(model_type, case_id, builder, tmp_path):
    assert callable(builder), builder  # a problem line: the family has no parity case
    loaded = check_family(builder, tmp_path)
    assert loaded.config.family == model_type


def test_a_family_registered_without_a_parity_case_is_reported(monkeypatch):
    monkeypatch.setitem(REGISTRY, "no_such_family", REGISTRY["gpt2"])
    cases = family_cases()
    assert ("no_such_family", "missing") in [(m, c) for m, c, _ in cases]
    problem = next(b for m, _, b in cases if m == "no_such_family")
    assert not callable(problem) and "family_cases/no_such_family.py" in problem
    assert {m for m, c, _ in cases if c == "missing"} == {"no_such_family"}  # every real family has its cases
