"""`bench scale` output contract on the tiny shape (the figures themselves are not asserted): a random
bfloat16 checkpoint made by transformers, our GUI trace and generation against transformers' forward and
generate(), each side in its own process."""
from __future__ import annotations

import json

import pytest
import torch

from desktop_app.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.mark.slow  # three processes importing torch (two transformers too): ~30 s on a busy 2-core machine
def test_bench_scale_on_the_tiny_shape_prints_every_figure_as_one_json_line(capsys):
    pytest.importorskip("transformers")
    assert main(["bench", "scale", "--shape", "tiny", "--tokens", "24", "--new", "3", "--repeat", "1",
                 "--gen-runs", "2", "--threads", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    r = json.loads(out[-1])
    assert r["name"] == "scale" and r["shape"] == "tiny" and r["tokens"] == 24 and r["device"] == "cpu"
    assert r["params"] > 0 and r["new_tokens"] == 3 and r["generation_runs"] == 2
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
    # the checkpoint drawn where the bench runs, its time said; no memory cap
    assert r["checkpoint_drawn_on"] == "cpu" and r["make_checkpoint_s"] > 0
    assert r["memory_cap_gib"] is None and r["reference_capped"] is False and r["reference_cap_error"] is None
    assert r["ours_capped"] is False and r["ours_cap_error"] is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: torch.cuda.is_available() is False")
def test_bench_scale_on_cuda_under_a_memory_cap_caps_both_processes(capsys):
    """--memory-cap-gb on CUDA: the checkpoint drawn on the card, both measured processes capped (the
    fraction of the card each set), the bandwidth bound reported (issue 31)."""
    pytest.importorskip("transformers")
    assert main(["bench", "scale", "--shape", "tiny", "--tokens", "24", "--new", "3", "--repeat", "1",
                 "--device", "cuda", "--memory-cap-gb", "2"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    total = torch.cuda.get_device_properties(0).total_memory
    assert r["device"] == "cuda" and r["checkpoint_drawn_on"].startswith("cuda")
    assert r["memory_cap_gib"] == 2 and r["ours_memory_cap_fraction"] == pytest.approx(2 * 2**30 / total, abs=1e-4)
    assert r["reference_capped"] is True and r["reference_cap_error"] is None
    assert r["ours_capped"] is True and r["ours_cap_error"] is None
    assert 0 < r["ours_gpu_peak_mb"] < 2048 and 0 < r["reference_gpu_peak_mb"] < 2048
    assert r["device_name"] == torch.cuda.get_device_name(0) and r["fraction_of_bandwidth_bound"] > 0


def test_a_side_out_of_memory_under_the_cap_is_reported_and_run_again_without_it(monkeypatch, capsys):
    """The CUDA-only fallback of --memory-cap-gb, with the measured processes faked: the failing side's
    line is kept, its cap dropped for the rest of the run, and it runs again uncapped; any other failure
    is raised."""
    from desktop_app.benchmarks import scale

    calls = []

    def child(kind, *args, threads=None):
        calls.append((kind, args[-1]))
        if args[-1] is not None:
            error = RuntimeError(f"bench scale: the {kind} process failed:\nTraceback (most recent call last):\n"
                                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
            error.out_of_memory = True
            raise error
        return {"kind": kind}

    monkeypatch.setattr(scale, "_run_child", child)
    caps, errors = {"ours": 24.0, "reference": 24.0}, {"ours": None, "reference": None}
    assert scale._run_capped("reference", ("folder",), caps, errors, None) == {"kind": "reference"}
    assert calls == [("reference", 24.0), ("reference", None)]
    assert caps == {"ours": 24.0, "reference": None} and errors["ours"] is None
    assert errors["reference"] == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert "reference did not fit under the 24 GiB cap" in capsys.readouterr().err
    scale._run_capped("reference", ("folder",), caps, errors, None)  # the next repeat: uncapped at once
    assert calls[-1] == ("reference", None) and len(calls) == 3

    def broken(kind, *args, threads=None):
        error = RuntimeError("bench scale: the ours process failed:\nValueError: something else")
        error.out_of_memory = False
        raise error

    monkeypatch.setattr(scale, "_run_child", broken)
    with pytest.raises(RuntimeError, match="something else"):
        scale._run_capped("ours", ("folder",), caps, errors, None)
    assert caps["ours"] == 24.0 and errors["ours"] is None


def test_generation_keeps_the_least_time_per_token_of_its_runs(monkeypatch):
    """One slow step decided a single timed generation (bench quick's figure spread 0.59-1.34x on unchanged
    code): each measured process times --gen-runs generations and keeps the least, on a fake clock here;
    runs whose greedy ids differ are an error, not a figure."""
    from desktop_app.benchmarks import scale

    clock = [0.0]
    step_seconds = iter([0.040, 0.010, 0.025])  # the first run hit by a neighbour

    def generate(n):
        clock[0] += next(step_seconds) * n
        return [7] * n

    monkeypatch.setattr(scale.time, "perf_counter", lambda: clock[0])
    ids, per_token = scale.least_per_token(generate, 8, 3)
    assert ids == [7] * 8 and per_token == pytest.approx(0.010)

    answers = iter([[1, 2], [1, 3]])
    with pytest.raises(AssertionError, match="ids differ"):
        scale.least_per_token(lambda n: next(answers), 2, 2)


def test_the_two_sides_generations_alternate_and_each_keeps_its_least_time():
    """Ours and the reference timed once each in turn, seconds apart: a neighbour's burst decided the figure.
    Both processes stay with their models loaded and are asked for generations in turn (ours, reference,
    ours, ...); each keeps its least time per token, and its ids must not change between runs."""
    from desktop_app.benchmarks import scale

    asked = []

    class Side:
        def __init__(self, kind, seconds, ids):
            self.kind, self.result, self.seconds, self.ids = kind, {}, iter(seconds), iter(ids)

        def generate(self):
            asked.append(self.kind)
            return {"ids": next(self.ids), "s_per_token": next(self.seconds)}

    ours = Side("ours", [0.004, 0.002, 0.003], [[5, 6]] * 3)
    ref = Side("reference", [0.003, 0.009, 0.0025], [[5, 6]] * 3)
    scale.generation_rounds([ours, ref], 3)
    assert asked == ["ours", "reference"] * 3
    assert ours.result == {"generated_ids": [5, 6], "generate_s_per_token": 0.002}
    assert ref.result == {"generated_ids": [5, 6], "generate_s_per_token": 0.0025}

    changing = Side("ours", [0.1, 0.1], [[5, 6], [5, 7]])
    with pytest.raises(AssertionError, match="ours: greedy ids differ"):
        scale.generation_rounds([changing], 2)


def test_bench_scale_refuses_a_memory_cap_on_the_cpu_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "scale", "--shape", "tiny", "--memory-cap-gb", "24"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "--memory-cap-gb" in err[0] and "CUDA" in err[0], err


def test_bench_scale_refuses_a_bad_shape_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "scale", "--shape", "gpt-5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "--shape" in err[0]


def test_a_measured_process_reports_its_own_peak_not_the_bench_processes():
    """Linux carries getrusage's ru_maxrss across exec from the parent (subprocess spawns with vfork): the
    8B run's two sides both read the bench's own 16 GB. The peak must be the child's."""
    import subprocess
    import sys

    held = bytearray(768 << 20)
    held[::4096] = b"\1" * (len(held) // 4096)  # touch every page: the parent's peak is now above 768 MB
    code = "from desktop_app.benchmarks.scale import _peak_mb; print(_peak_mb())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    del held
    assert float(out.stdout) < 700  # the child imports torch, nothing near the parent's 768 MB


# the published config.json values (EleutherAI/pythia-1.4b, google/gemma-3-1b-pt), not derived from scale.py
STUDY_SHAPES = {
    "pythia-1.4b": dict(family="gpt_neox", vocab_size=50_304, d_model=2048, n_layers=24, n_heads=16, d_head=128,
                        d_ff=8192, context_length=2048, rotary_fraction=0.25, rope_theta=10_000.0,
                        parallel_residual=True, tie_embeddings=False, norm_eps=1e-5),
    "gemma-3-1b": dict(family="gemma3_text", vocab_size=262_144, d_model=1152, n_layers=26, n_heads=4, n_kv_heads=1,
                       d_head=256, d_ff=6912, context_length=32_768, sliding_window=512, rope_theta=1e6,
                       rope_local_theta=10_000.0, attn_scale=256 ** -0.5, final_logit_softcap=None,
                       tie_embeddings=True, norm_eps=1e-6,
                       layer_types=tuple("full_attention" if i in (5, 11, 17, 23) else "sliding_attention"
                                         for i in range(26))),
    # issue 36's MoE speed shape: Mixtral-8x7B's proportions (not a published checkpoint) at hidden 1024
    "mixtral-1024": dict(family="mixtral", vocab_size=32_000, d_model=1024, n_layers=8, n_heads=8, n_kv_heads=2,
                         d_head=128, d_ff=3584, num_experts=8, experts_per_token=2, router_norm="renormalised"),
}


@pytest.mark.parametrize("shape", list(STUDY_SHAPES))
def test_the_study_shapes_open_as_the_real_checkpoints_config(shape, tmp_path):
    """bench scale's Pythia-1.4B and Gemma-3-1B shapes, as transformers writes their config.json (no
    weights drawn), read by the app as the published checkpoints' configs read."""
    pytest.importorskip("transformers")
    from desktop_app.benchmarks import scale
    from desktop_app.core.checkpoints import read_config

    scale.shape_config(shape).save_pretrained(tmp_path)
    cfg = read_config(tmp_path)
    got = {key: tuple(v) if isinstance(v, list) else v for key in STUDY_SHAPES[shape] for v in [getattr(cfg, key)]}
    assert got == STUDY_SHAPES[shape]


def test_a_measured_process_that_never_answers_is_killed_and_named(monkeypatch):
    """A side that hangs (no figures, no exit) ends the benchmark with one error, not a wait forever."""
    import subprocess
    import sys
    import tempfile

    from desktop_app.benchmarks import scale

    monkeypatch.setattr(scale.Measured, "ANSWER_TIMEOUT_S", 0.5)
    side = scale.Measured.__new__(scale.Measured)
    side.kind, side.stderr = "ours", tempfile.TemporaryFile("w+")
    side.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                    stdout=subprocess.PIPE, stderr=side.stderr, text=True)
    try:
        with pytest.raises(RuntimeError, match=r"the ours process failed:\n+\(killed: no answer in 0.5 s\)"):
            side._read()
        assert side.process.poll() is not None
    finally:
        side.close()
