"""`generate` on an encoder-decoder (issue 28): the prompt is the source; `ids` are the target tokens after
the decoder's start token (through the end token when it comes), as transformers' generate gives them
(greedy and beam, tiny random Marian and T5 folders, test-only reference); `text` is their decoding
with the target side's tokenizer (a Marian folder's target.spm, as MarianTokenizer decodes)."""
from __future__ import annotations

import json
import random
import warnings

import pytest
import torch

from desktop_app.cli import main

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

WORDS = {"the": "le", "dog": "chien", "cat": "chat", "black": "noir", "small": "petit", "runs": "court",
         "sleeps": "dort", "red": "rouge", "bird": "oiseau", "sees": "voit", "a": "un", "house": "maison"}


def _json(capsys, *args) -> dict:
    assert main(["generate", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _spm(text: str, prefix) -> str:
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(prefix), vocab_size=40, model_type="unigram",
                                   unk_id=1, eos_id=0, bos_id=-1, pad_id=-1, minloglevel=2, num_threads=1,
                                   hard_vocab_limit=False)
    return str(prefix) + ".model"


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    """A Marian folder as MarianTokenizer and MarianMTModel write it: source.spm, target.spm, one vocab.json
    (</s> 0, ..., <pad> last, the decoder's start token) and random weights large enough for varied tokens,
    the end token made likely enough for some beams to end early."""
    root = tmp_path_factory.mktemp("marian")
    rng = random.Random(0)
    english = [" ".join(rng.choice(list(WORDS)) for _ in range(rng.randint(3, 8))) for _ in range(400)]
    (root / "en.txt").write_text("\n".join(english), encoding="utf-8")
    (root / "fr.txt").write_text("\n".join(" ".join(WORDS[w] for w in s.split()) for s in english), encoding="utf-8")
    source, target = _spm(root / "en.txt", root / "source"), _spm(root / "fr.txt", root / "target")
    vocab: dict[str, int] = {}
    for path in (source, target):
        sp = spm.SentencePieceProcessor(model_file=path)
        for i in range(sp.get_piece_size()):
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (root / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    folder = root / "model"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses."
        tok = transformers.MarianTokenizer(source, target, str(root / "vocab.json"))
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    pad = len(vocab) - 1
    hf = transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=40,
        scale_embedding=True, dropout=0.0, attention_dropout=0.0, init_std=0.3, pad_token_id=pad,
        decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=None))
    with torch.no_grad():
        hf.final_logits_bias[0, 0] = 4.0
    hf.eval()
    hf.save_pretrained(folder)
    return folder, hf, tok


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("t5")
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=60, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="relu",
        dropout_rate=0.0, decoder_start_token_id=0, eos_token_id=1, pad_token_id=0, initializer_factor=8.0))
    hf.eval()
    hf.save_pretrained(folder)
    return folder, hf


def reference(hf, src: list[int], max_new: int, beams: int) -> list[int]:
    eos = hf.config.eos_token_id
    with torch.no_grad():
        out = hf.generate(torch.tensor([src]), max_new_tokens=max_new, num_beams=beams, do_sample=False,
                          eos_token_id=eos, early_stopping=False, length_penalty=1.0, forced_eos_token_id=None,
                          bad_words_ids=None, pad_token_id=hf.config.pad_token_id,
                          decoder_start_token_id=hf.config.decoder_start_token_id)[0, 1:].tolist()
    return out[:out.index(eos) + 1] if eos in out else out


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_source_text_generates_generates_ids_and_the_target_tokenizers_text(marian_dir, capsys, strategy):
    folder, hf, tok = marian_dir
    lengths = set()
    for text in ("the black dog runs", "a small cat sees the red bird", "the house sleeps"):
        out = _json(capsys, folder, "--prompt", text, "--max-new", 12, "--strategy", strategy, "--beams", 3)
        src = tok(text)["input_ids"]
        assert out["source_ids"] == src and out["prompt_length"] == len(src)
        want = reference(hf, src, 12, 3 if strategy == "beam" else 1)
        assert out["ids"] == want
        assert out["text"] == tok.decode(want)  # MarianTokenizer decodes with target.spm
        assert len(out["probs"]) == len(want)
        lengths.add(len(want))
    assert len(lengths) > 1  # some ended at the end token before --max-new


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_source_ids_on_a_t5_folder_give_generates_ids(t5_dir, capsys, strategy):
    folder, hf = t5_dir
    for seed in range(3):
        src = torch.randint(2, 60, (8,), generator=torch.Generator().manual_seed(seed)).tolist()
        out = _json(capsys, folder, "--prompt-ids", ",".join(map(str, src)), "--max-new", 10, "--strategy",
                    strategy, "--beams", 4)
        assert out["ids"] == reference(hf, src, 10, 4 if strategy == "beam" else 1)
        assert out["source_ids"] == src and "text" not in out


def test_steering_an_encoder_decoder_is_refused_in_one_line(t5_dir, capsys):
    folder, _ = t5_dir
    assert main(["generate", str(folder), "--prompt-ids", "3,4", "--steer-towards", "3", "--steer-away", "4",
                 "--steer-layer", "0", "--steer-scale", "1"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {folder}: steering") and "this is an encoder-decoder" in err[0]
