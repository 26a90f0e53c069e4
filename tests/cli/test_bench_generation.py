"""`bench generation --host`: the step's host overhead on models of real depth and tiny width, against
transformers' generate in the same process (the figures themselves are not asserted)."""
from __future__ import annotations

import json

import pytest

from desktop_app.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.mark.parametrize("argv, named", [
    (["--host", "--new", "0"], "--new"),
    (["--host", "--repeat", "0"], "--repeat"),
    (["--host", "--dtype", "float64"], "--dtype"),
    (["--hosts"], "--hosts"),
])
def test_bad_arguments_are_one_line_naming_the_argument(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "generation", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and "bench generation" in err[0]


def test_host_overhead_at_a_tiny_size_prints_both_models_against_transformers(capsys):
    pytest.importorskip("transformers")
    assert main(["bench", "generation", "--host", "--new", "3", "--prompt", "2", "--repeat", "1"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["name"] == "generation_host" and r["new_tokens"] == 3 and r["recording"] is True
    assert set(r["models"]) == {"qwen2.5-0.5b-depth", "gpt2-depth"}
    assert [m["layers"] for m in r["models"].values()] == [24, 12]
    for m in r["models"].values():
        assert m["same_ids_as_reference"] is True
        for side in ("ours", "reference"):
            for key in ("ms_per_token", "aten_ops_per_token", "python_calls_per_token", "python_ms_per_token"):
                assert m[f"{side}_{key}"] > 0, (side, key)
        assert m["speedup"] == pytest.approx(m["reference_ms_per_token"] / m["ours_ms_per_token"], rel=0.02)
        # a 24-layer (12-layer) step dispatches ops in every layer: at least a few per layer on each side
        assert m["ours_aten_ops_per_token"] > 4 * m["layers"] and m["reference_aten_ops_per_token"] > 4 * m["layers"]
    assert r["speedup"] == min(m["speedup"] for m in r["models"].values())


def test_the_bandwidth_bound_can_be_measured_in_huge_pages_where_the_steps_weights_are(monkeypatch):
    """bench generation keeps the faster of 4 KB and huge pages: the float32 steps stream from huge pages
    (Transformer.pack_for_decoding), and a bound measured in 4 KB pages alone is one they can beat."""
    from desktop_app.benchmarks.generation import measure_bandwidth
    from desktop_app.core import model as model_module

    made = []
    real = model_module.huge_page_buffer

    def counting(numel, dtype):
        made.append(real(numel, dtype))
        return made[-1]
    monkeypatch.setattr(model_module, "huge_page_buffer", counting)
    assert measure_bandwidth(4 << 20, repeat=1) > 0
    assert made == []  # 4 KB pages: the default
    assert measure_bandwidth(4 << 20, repeat=1, huge_pages=True) > 0
    expected = 2 if model_module.huge_pages_for(4 << 20) else 1  # source and destination, or none to be had
    assert len(made) == expected and (expected == 1) == (made[0] is None)
