"""`bench streamed`: its checkpoint writer (tensor by tensor into shards, for the 8B shape that never fits
in memory whole) writes what transformers reads, and a run on the tiny shape prints its figures, the
capped process inside a memory cgroup where this machine lets one be made."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from desktop_app.benchmarks.scale import write_checkpoint_by_tensor  # noqa: E402
from desktop_app.benchmarks.streamed import main, memory_cgroup  # noqa: E402
from desktop_app.core.checkpoints import load_model_folder  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_checkpoint_written_tensor_by_tensor_is_what_transformers_reads(tmp_path):
    count = write_checkpoint_by_tensor("tiny", tmp_path, shard_gib=40_000 / 2**30)  # several shards
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    model, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True,
                                                                    dtype=torch.float32)
    assert not any(info.values()), info  # nothing missing, unexpected or mismatched
    assert count == sum(p.numel() for p in model.parameters())
    norms = [p for n, p in model.named_parameters() if "norm" in n]
    assert norms and all(torch.equal(p, torch.ones_like(p)) for p in norms)
    ids = torch.tensor([[1, 5, 9, 200, 3]])
    ours = load_model_folder(tmp_path, dtype="float32", streamed=True)
    with torch.no_grad():
        assert torch.allclose(ours.model(ids).logits, model(ids).logits, atol=1e-5)


def test_bench_streamed_on_the_tiny_shape():
    result = main(["--shape", "tiny", "--tokens", "12", "--new", "1", "--memory-cap-gb", "1"])
    assert result["max_abs_logit_diff"] == 0.0 and result["same_generated_ids"]
    assert json.loads(json.dumps(result)) == result  # one JSON line
    with memory_cgroup(2**30) as cgroup:
        made = cgroup is not None
    assert result["cap"].startswith("cgroup") == made
    assert (result["cgroup_peak_gib"] is not None) == made
