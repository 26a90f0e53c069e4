"""A target longer than an encoder-decoder's decoder context is refused in one line by the commands that
read one (`trace`, `attribute`, `patch`), as a source longer than the context is: before, it was cut to
the context without a word, and the file or table silently described another target."""
from __future__ import annotations

import pytest
import torch

from desktop_app.cli import main

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 40
POSITIONS = 12  # the decoder reads [start] + at most 11 target tokens


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    """A T5 whose config gives it a context of 12 positions (n_positions); pre-norm, so `attribute` runs."""
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, n_positions=POSITIONS,
        decoder_start_token_id=0))
    folder = tmp_path_factory.mktemp("t5")
    hf.save_pretrained(folder)
    return folder


SRC = "3,1,4,1,5"


def _commands(folder, out, target):
    return {
        "trace": ["trace", str(folder), "--ids", SRC, "--target-ids", target, "--out", str(out / "t.npz")],
        "attribute": ["attribute", str(folder), "--ids", SRC, "--target-ids", target, "--token-id", "3",
                      "--csv", str(out / "a.csv")],
        "patch": ["patch", str(folder), "--clean-ids", SRC, "--corrupted-ids", "3,1,4,1,6", "--target-ids", target,
                  "--answer-id", "3", "--wrong-id", "4", "--csv", str(out / "p.csv")],
    }


@pytest.mark.parametrize("command", ["trace", "attribute", "patch"])
def test_a_target_longer_than_the_decoder_context_is_refused_in_one_line(t5_dir, tmp_path, capsys, command):
    too_long = ",".join(str(5 + i % 20) for i in range(POSITIONS))  # 12 tokens + the start token: 13 > 12
    code = main(_commands(t5_dir, tmp_path, too_long)[command])
    err = capsys.readouterr().err.strip()
    assert code != 0, f"{command} accepted a target longer than the decoder's context"
    assert "target" in err and f"{POSITIONS} tokens exceed" in err and "\n" not in err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("command", ["trace", "attribute", "patch"])
def test_a_target_that_fills_the_decoder_context_is_read_whole(t5_dir, tmp_path, capsys, command):
    fits = ",".join(str(5 + i % 20) for i in range(POSITIONS - 1))  # [start] + 11 = 12 positions
    assert main(_commands(t5_dir, tmp_path, fits)[command]) == 0, capsys.readouterr().err
    if command == "trace":
        import numpy as np

        assert np.load(tmp_path / "t.npz")["decoder_tokens"].tolist() == [0] + [5 + i % 20 for i in range(POSITIONS - 1)]
