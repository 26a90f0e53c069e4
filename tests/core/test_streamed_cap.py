"""`bench streamed`'s memory cap (benchmarks/streamed.memory_cap): the capped process must open the model
streamed (the cap below the weights) and then pass its own checks (the resident set and the trace of
--tokens within the cap). 95% of the weights was too little for the trace of 1,024 tokens at the
Llama-3.2-1B shape; the rule now reads what the run needs from the checkpoint's config, and refuses in one
line, before any weights are made, what no cap can run."""
from __future__ import annotations

import re

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

from desktop_app.benchmarks.scale import shape_config  # noqa: E402
from desktop_app.benchmarks.streamed import main, memory_cap, needs  # noqa: E402
from desktop_app.core import devices  # noqa: E402
from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.devices import MemoryEstimateError  # noqa: E402
from desktop_app.core.streamed import streamed_of  # noqa: E402

GIB = 2**30


def config_folder(tmp_path, shape: str):
    config = shape_config(shape)
    config.dtype = torch.bfloat16
    config.save_pretrained(tmp_path)
    return tmp_path


def test_the_default_cap_fits_the_trace_it_runs_at_the_1b_shape(tmp_path):
    weights, resident, trace = needs(config_folder(tmp_path, "llama-3.2-1b"), "bfloat16")
    assert 2.29 * GIB < weights < 2.31 * GIB  # 1.24 B parameters in bfloat16
    assert trace(1024) > 0.95 * weights > resident  # what the old rule (95% of the weights) refused
    cap = memory_cap(weights, resident, trace, 1024, None) * GIB
    assert trace(1024) < cap < weights
    assert memory_cap(weights, resident, trace, 64, None) * GIB == pytest.approx(0.95 * weights)  # short: as before
    # a length no cap below the weights lets run: the most tokens that can
    with pytest.raises(SystemExit, match=r"^bench streamed: a trace of 2048 tokens needs about .*--tokens \d+ or "
                                         r"fewer$") as refused:
        memory_cap(weights, resident, trace, 2048, None)
    most = int(re.search(r"--tokens (\d+)", str(refused.value)).group(1))
    assert trace(most) < weights <= trace(most + 1)
    # a cap asked for below what the trace needs: the range to pass
    with pytest.raises(SystemExit, match=r"^bench streamed: --memory-cap-gb 2.2 is less than") as refused:
        memory_cap(weights, resident, trace, 1024, 2.2)
    lo, hi = map(float, re.search(r"from ([\d.]+) to ([\d.]+)", str(refused.value)).groups())
    assert trace(1024) <= lo * GIB < hi * GIB < weights
    assert memory_cap(weights, resident, trace, 1024, 2.27) == 2.27  # one that fits is taken as is


def test_the_default_cap_passes_the_capped_processs_own_checks(tmp_path, monkeypatch):
    """On a small real checkpoint, at a length whose trace needs more than 95% of the weights: under the
    default cap the model opens streamed and its trace passes app.tracing's check; under 95% it did not."""
    from desktop_app.app.tracing import check_trace_memory

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512)).save_pretrained(tmp_path)
    weights, resident, trace = needs(tmp_path, "float32")
    tokens = next(t for t in range(1, 512) if trace(t) > 0.95 * weights)
    assert trace(tokens) < weights
    for cap, fits in ((memory_cap(weights, resident, trace, tokens, None) * GIB, True), (0.95 * weights, False)):
        monkeypatch.setattr(devices, "available_memory", lambda device="cpu", cap=cap: int(cap))  # as the child is told
        loaded = load_model_folder(tmp_path, dtype="float32")
        assert streamed_of(loaded.model) is not None
        if fits:
            check_trace_memory(loaded, tokens)
        else:
            with pytest.raises(MemoryEstimateError):
                check_trace_memory(loaded, tokens)


def test_bench_streamed_refuses_what_no_cap_runs_before_making_the_weights(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    config_folder(tmp_path / "model", "llama-3.2-1b")
    with pytest.raises(SystemExit, match=r"--tokens \d+ or fewer$"):  # (the folder holds no weights: never read)
        main(["--folder", str(tmp_path / "model"), "--tokens", "4096"])
    with pytest.raises(SystemExit, match="--memory-cap-gb 1 is less than"):
        main(["--folder", str(tmp_path / "model"), "--memory-cap-gb", "1"])
