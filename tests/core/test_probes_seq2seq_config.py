"""Issue 41: nonsense in an encoder-decoder's config.json is refused in one line naming the file, as
transformers refuses it (or where it would end in an IndexError at the embedding): a decoder start token
or pad token outside the vocabulary, T5 with no relative position buckets."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from desktop_app.core.checkpoints import ModelLoadError, load_model_folder  # noqa: E402


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    folder = tmp_path_factory.mktemp("t5") / "base"
    config = transformers.T5Config(vocab_size=120, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                   relative_attention_num_buckets=8, decoder_start_token_id=0)
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("change, says", [
    ({"decoder_start_token_id": 500}, "decoder_start_token_id 500 is not a token of the 120-token vocabulary"),
    ({"decoder_start_token_id": -3}, "decoder_start_token_id -3 is not a token"),
    ({"pad_token_id": 10**6}, "pad_token_id 1,000,000 is not a token"),
    ({"relative_attention_num_buckets": 0}, "relative_buckets (relative_attention_num_buckets) must be at least 1"),
])
def test_nonsense_is_refused_in_one_line(t5, tmp_path, change, says):
    folder = tmp_path / "bad"
    shutil.copytree(t5, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ModelLoadError) as info:
        load_model_folder(folder)
    message = str(info.value)
    assert says in message and "config.json" in message and "\n" not in message
    load_model_folder(t5)  # the folder as saved opens
