"""Weights holding NaN or infinity are refused with one line naming the file and the tensor, by one check
(checkpoints._check_finite, deciding by checkpoints.range_problem on the stored bits), whether the model is
loaded whole (before the cast allocates anything) or read layer by layer (each block's tensors at their
first read, before their copy): every stored float type, float8 included."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

from desktop_app.core.checkpoints import _EXPONENT, _TORCH_FLOAT, ModelLoadError, load_model_folder, range_problem  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
STORED = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
          "F8_E5M2": torch.float8_e5m2, "F8_E4M3": torch.float8_e4m3fn}


@pytest.mark.parametrize("stored", sorted(STORED))
def test_the_check_finds_nan_or_infinity_anywhere_and_passes_the_largest_finite_values(stored):
    """range_problem on the bits as they are stored, against torch's isfinite on every value of the type:
    each bit pattern of the 8- and 16-bit types, NaN and infinity of either sign in the wider ones."""
    dtype, as_int = _TORCH_FLOAT[stored]
    assert STORED[stored] == dtype
    into = torch.float32 if dtype != torch.float64 else torch.float64  # no overflow on the cast
    signed = np.dtype(_EXPONENT[stored][0])
    if signed.itemsize <= 2:  # every value the type has, one at a time
        bits = torch.arange(-2 ** (8 * signed.itemsize - 1), 2 ** (8 * signed.itemsize - 1), dtype=torch.int32)
        values = bits.to(as_int)
        finite = torch.isfinite(values.view(dtype).to(torch.float32))
        for value, ok in zip(values.numpy().astype(signed), finite.tolist()):
            row = np.array([0, value, 0], dtype=signed)
            assert (range_problem("w", row, stored, into) is None) == ok, (stored, hex(int(value)))
    else:
        t = torch.randn(301, 67, generator=torch.Generator().manual_seed(0)).to(dtype)
        assert range_problem("w", t.view(as_int).numpy(), stored, into) is None
        biggest = torch.full((2,), torch.finfo(dtype).max, dtype=dtype) * torch.tensor([1, -1], dtype=dtype)
        assert range_problem("w", biggest.view(as_int).numpy(), stored, into) is None
        for at in (0, 1, 4097, t.numel() - 1):
            for bad in (float("nan"), -float("nan"), float("inf"), float("-inf")):
                damaged = t.clone()
                damaged.view(-1)[at] = bad
                assert "holds NaN or infinite" in range_problem("w", damaged.view(as_int).numpy(), stored, into)


def float8_folder(folder: Path, dtype: torch.dtype, damaged: bool) -> Path:
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2)).save_pretrained(folder)
    sd = {k: v.to(dtype) for k, v in load_file(folder / "model.safetensors").items()}
    w = sd["model.layers.1.mlp.up_proj.weight"]
    w[0, 0], w[0, 1] = torch.finfo(dtype).max, torch.finfo(dtype).min  # the edge: finite
    if damaged:  # a NaN: e4m3's all-ones pattern (it has no infinity), e5m2's exponent all set
        sd["model.layers.1.mlp.up_proj.weight"].view(torch.uint8)[3, 4] = 0x7F if dtype == torch.float8_e4m3fn else 0x7E
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_a_nan_in_float8_weights_is_refused_by_name(tmp_path, dtype, streamed):
    folder = float8_folder(tmp_path / "f8", dtype, damaged=True)
    with pytest.raises(ModelLoadError) as refused:
        loaded = load_model_folder(folder, streamed=streamed)  # whole: refused here, before the cast
        assert streamed
        with torch.no_grad():  # streamed: when layer 1 is read, before its copy
            loaded.model(torch.tensor([[1, 2, 3]]))
    msg = str(refused.value)
    assert refused.value.path == folder / "model.safetensors" and msg.count("\n") == 0
    assert "'model.layers.1.mlp.up_proj.weight' holds NaN or infinite values" in msg


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_weights_load_whole_or_streamed_alike(tmp_path, dtype):
    """Undamaged, the largest finite values of either sign included (e4m3's 448 is 0x7E, one below its NaN)."""
    folder = float8_folder(tmp_path / "f8", dtype, damaged=False)
    whole, streamed = load_model_folder(folder), load_model_folder(folder, streamed=True)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        logits = whole.model(ids).logits
        assert torch.isfinite(logits).all() and torch.equal(logits, streamed.model(ids).logits)
