"""`bench scale` output contract on the tiny shape (the figures themselves are not asserted): a random
bfloat16 checkpoint made by transformers, our GUI trace and generation against transformers' forward and
generate(), each side in its own process."""
from __future__ import annotations

import json

import pytest

from desktop_app.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.mark.slow  # three processes importing torch (two transformers too): ~30 s on a busy 2-core machine
def test_bench_scale_on_the_tiny_shape_prints_every_figure_as_one_json_line(capsys):
    pytest.importorskip("transformers")
    assert main(["bench", "scale", "--shape", "tiny", "--tokens", "24", "--new", "3", "--repeat", "1",
                 "--threads", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    r = json.loads(out[-1])
    assert r["name"] == "scale" and r["shape"] == "tiny" and r["tokens"] == 24 and r["device"] == "cpu"
    assert r["params"] > 0 and r["new_tokens"] == 3
    assert r["torch_threads"] == r["reference_torch_threads"] == 2  # both measured processes, as asked
    for key in ("ours_load_s", "ours_trace_s", "reference_load_s", "reference_forward_s", "ours_first_layer_s",
                "ours_peak_mb", "reference_peak_mb", "ours_ms_per_token", "reference_ms_per_token"):
        assert r[key] > 0, key
    assert r["ours_first_layer_s"] <= r["ours_trace_s"]
    assert r["trace_speedup"] == pytest.approx(r["reference_total_s"] / r["ours_total_s"], rel=0.02, abs=2e-3)
    assert r["memory_ratio"] == pytest.approx(r["ours_peak_mb"] / r["reference_peak_mb"], rel=0.02, abs=2e-3)
    assert r["generation_speedup"] == pytest.approx(r["reference_ms_per_token"] / r["ours_ms_per_token"], rel=0.02, abs=2e-3)
    assert r["first_layer_over_reference_forward"] > 0
    # the compute dtype is the one that suits the machine, said with its reason; same ids at that dtype
    assert r["ours_dtype"] in ("float32", "bfloat16") and r["ours_dtype_reason"]
    assert r["same_ids_as_reference_at_same_dtype"] is True
    assert "fraction_of_bandwidth_bound" not in r  # CUDA only


def test_bench_scale_refuses_a_bad_shape_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "scale", "--shape", "gpt-5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "--shape" in err[0]
