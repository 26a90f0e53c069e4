"""The input layer (core/inputs.py): token ids, text files, encoding with vocabulary and context
checks; and its users (the CLI, AppState's tokenize_and_trace, task tokenizers)."""
from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from desktop_app.cli import main
from desktop_app.core.checkpoints import LoadedModel, load_model_folder, new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.inputs import InputError, check_ids, encode, parse_token_ids, read_text_file, text_file_ids
from desktop_app.core.tokenizer import Tokenizer, char_tokenizer
from desktop_app.core.training.tasks import make_task
from tiny_models import tiny_model_on


def _old_motif_tokenizer() -> Tokenizer:
    """A motif task's tokenizer as saved before it had [UNK]: A, B, C, D and nothing else."""
    hf = HFTokenizer(models.WordLevel({w: i for i, w in enumerate("ABCD")}, unk_token=None))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokenizer(hf)


def _model(tokenizer, vocab_size: int, context_length: int = 16) -> LoadedModel:
    return tiny_model_on(tokenizer, vocab_size=vocab_size, d_model=8, n_layers=1, n_heads=2, d_ff=16,
                         context_length=context_length, name="tiny-model")


# -- token ids -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["1,2,3,4", "1 2 3 4", "1, 2, 3, 4", " 1,2 3 ,4 ", "1\t2\n3,,4"])
def test_token_ids_take_spaces_and_or_commas(text):
    assert parse_token_ids(text) == [1, 2, 3, 4]


def test_a_bad_token_id_is_named():
    with pytest.raises(InputError, match=r"^--ids: 'x' is not a token id; give integers separated by spaces or commas$"):
        parse_token_ids("1, x, 3", "--ids")


def test_ids_outside_the_vocabulary_are_a_sentence():
    with pytest.raises(InputError, match=r"^token id 300 is out of range, outside the vocabulary of 300 tokens "
                                         r"\(0\.\.299\)$"):
        check_ids([1, 300], vocab_size=300)
    with pytest.raises(InputError, match=r"token ids -1, 301 are out of range"):
        check_ids([-1, 301, 2], vocab_size=300)


def test_a_tokenizer_bigger_than_the_model_is_said(tmp_path):
    tok = char_tokenizer("abcdef")  # 6 tokens, the model has 4: 'e' and 'f' have no embedding
    with pytest.raises(InputError, match=r"token id 4 is out of range.*tokenizer has 6 tokens, the model 4.*'e'"):
        encode(_model(tok, vocab_size=4), "abe")


# -- text files ------------------------------------------------------------------------------


def test_text_files_read_as_utf8_with_one_message_naming_the_file(tmp_path):
    good = tmp_path / "good.txt"
    good.write_bytes("\ufeffcafé au lait".encode("utf-8"))
    assert read_text_file(good) == "café au lait"  # a byte-order mark is not text
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    cases = [(latin, "latin1.txt: not UTF-8 text (byte 3); save it as UTF-8"),
             (tmp_path / "missing.txt", "missing.txt: no such text file"),
             (tmp_path, f"{tmp_path.name}: not a file")]
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n")
    cases.append((empty, "empty.txt: the file is empty"))
    for path, message in cases:
        with pytest.raises(InputError) as info:
            read_text_file(path)
        assert str(info.value).endswith(message) and str(path) in str(info.value)


def test_text_file_ids_keep_every_token_and_check_the_vocabulary(tmp_path):
    tok = char_tokenizer("abc ")
    text = tmp_path / "t.txt"
    text.write_text("abc " * 10)
    assert len(text_file_ids(_model(tok, vocab_size=4, context_length=8), text)) == 40  # no context cut
    with pytest.raises(InputError, match=r"t\.txt: token id 3 is out of range"):
        text_file_ids(_model(tok, vocab_size=3), text)
    with pytest.raises(InputError, match="no tokenizer.json"):
        text_file_ids(_model(None, vocab_size=4), text)


# -- encoding --------------------------------------------------------------------------------


def test_an_unknown_word_is_named_not_a_wordlevel_error():
    loaded = _model(_old_motif_tokenizer(), vocab_size=4)
    assert encode(loaded, "A B D").ids == [0, 1, 3]
    with pytest.raises(InputError) as info:
        encode(loaded, "A B hello")
    assert str(info.value) == "'hello' is not in this model's vocabulary (A, B, C, D)"


def test_text_longer_than_the_context_is_cut_and_said():
    loaded = _model(char_tokenizer("ab"), vocab_size=2, context_length=16)
    enc = encode(loaded, "ab" * 10)
    assert enc.ids == [0, 1] * 8 and enc.total == 20
    assert enc.notice == "the text has 20 tokens; only the first 16 (the model's context length) are used"
    assert encode(loaded, "ab").notice == ""
    with pytest.raises(InputError, match="20 tokens exceed the model's context length 16"):
        encode(loaded, "ab" * 10, cut=False)


# -- task tokenizers -------------------------------------------------------------------------


def test_new_task_tokenizers_map_unknown_words_to_unk():
    for name in ("motif", "copy", "modadd", "induction"):
        tok = make_task(name).tokenizer
        unk = tok.special_id("unk")
        assert unk == tok.vocab_size - 1, name  # last: the task's own ids are unchanged
    motif = make_task("motif").tokenizer
    assert motif.encode("A B hello D") == [0, 1, 4, 3] and motif.vocab_size == 5


def test_text_task_char_tokenizer_has_unk(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abcabc " * 100)
    tok = make_task("text", {"text_file": str(text), "seq_len": 16}).tokenizer
    assert tok.encode("abz") == tok.encode("ab") + [tok.special_id("unk")]


def test_a_resumed_task_keeps_the_saved_tokenizer():
    old = _old_motif_tokenizer()
    task = make_task("motif", tokenizer=old)
    assert task.tokenizer is old and task.vocab_size == 4


# -- users: the CLI and the UI's tokenize_and_trace --------------------------------------------


@pytest.fixture()
def motif_dir(tmp_path):
    cfg = ModelConfig.gpt2(vocab_size=4, d_model=8, n_layers=1, n_heads=2, d_ff=16, context_length=20)
    folder = tmp_path / "motif model"
    save_model_folder(new_model(cfg, seed=0), folder, tokenizer=_old_motif_tokenizer())
    return folder


def test_cli_names_the_unknown_word_and_takes_spaced_ids(motif_dir, tmp_path, capsys):
    out = tmp_path / "t.npz"
    for command in (["trace", str(motif_dir), "--text", "A B hello", "--out", str(out)],
                    ["generate", str(motif_dir), "--prompt", "A B hello", "--max-new", "1"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.strip() == "error: 'hello' is not in this model's vocabulary (A, B, C, D)"
    assert main(["trace", str(motif_dir), "--ids", "0 1 2", "--out", str(out)]) == 0
    assert main(["trace", str(motif_dir), "--ids", "0 1 4", "--out", str(out), "--overwrite"]) == 2
    assert "token id 4 is out of range, outside the vocabulary of 4 tokens (0..3)" in capsys.readouterr().err
    assert main(["generate", str(motif_dir), "--prompt-ids", "0 1", "--stop-ids", "2 3", "--max-new", "1"]) == 0


def test_tokenize_and_trace_cuts_long_text_with_a_notice_and_names_bad_input(motif_dir):
    from desktop_app.app.tracing import tokenize_and_trace, trace_input

    loaded = load_model_folder(motif_dir)
    enc, trace = trace_input(loaded, " ".join("ABCD" * 6), None)
    assert len(enc.ids) == 20 and enc.total == 24 and "first 20" in enc.notice
    assert trace.pattern(0).shape[-1] == 20
    ids, trace = tokenize_and_trace(loaded, "A B C", None)
    assert ids == [0, 1, 2] and trace.pattern(0).shape[-1] == 3
    with pytest.raises(InputError, match="'hello' is not in this model's vocabulary"):
        tokenize_and_trace(loaded, "A hello", None)
    with pytest.raises(InputError, match="token id 7 is out of range"):
        tokenize_and_trace(loaded, "", [0, 7])  # an id the vocabulary lacks: not "index out of range in self"
    notok = LoadedModel(loaded.model, loaded.config, None, None, motif_dir)
    assert tokenize_and_trace(notok, "0, 1 2", None)[0] == [0, 1, 2]
    with pytest.raises(InputError, match="no tokenizer.json, so the text box takes token ids: 'A' is not"):
        tokenize_and_trace(notok, "A B", None)
    assert torch.is_tensor(trace.pattern(0))


def test_a_text_box_without_a_tokenizer_takes_checked_token_ids():
    """encode_text_or_ids: what every text box (Model, What if, the resample text) hands the model."""
    from types import SimpleNamespace

    from desktop_app.core.inputs import encode_text_or_ids

    loaded = SimpleNamespace(tokenizer=None, config=SimpleNamespace(vocab_size=10, context_length=4))
    assert encode_text_or_ids(loaded, "1, 2 3").ids == [1, 2, 3]
    cut = encode_text_or_ids(loaded, "1 2 3 4 5")
    assert cut.ids == [1, 2, 3, 4] and cut.notice  # longer than the context: its start, and said
    with pytest.raises(InputError, match="12"):
        encode_text_or_ids(loaded, "1 12")  # outside the vocabulary
    with pytest.raises(InputError, match="no tokenizer"):
        encode_text_or_ids(loaded, "hello")
