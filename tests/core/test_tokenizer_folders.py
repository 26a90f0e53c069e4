"""Tokenizers as models ship them: vocab.txt (WordPiece), vocab.json + merges.txt (byte-level BPE),
tokenizer_config.json / special_tokens_map.json; ids checked against `transformers` (test-only)."""
from __future__ import annotations

import json

import pytest

from desktop_app.core.tokenizer import Tokenizer, TokenizerError, load_tokenizer_folder, train_bpe

transformers = pytest.importorskip("transformers")

BERT_WORDS = ["the", "cat", "sat", "on", "mat", "un", "##known", "##s", "cafe", "caf", "##e", "re", "##sume",
              "hello", "world", "!", ",", ".", "'", "s", "naive", "na", "##ive", "中", "文", "zurich", "a", "##b"]
BERT_CASED_EXTRA = ["The", "Café", "Zürich", "Hello", "café", "é"]
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SENTENCES = [
    "The cat sat on the mat.",
    "The cats sat on the unknown mat!",
    "Café, résumé and naïve in Zürich",       # accents: stripped when lowercasing
    "hello [MASK] world",                      # a special token typed in the text stays one token
    "xyzzy qwerty 中文 cat's",                  # unknown words, Chinese characters, an apostrophe
    "  spaces   and\ttabs\nnewline ",
]


def _write_vocab_txt(folder, words):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(BERT_SPECIALS + words) + "\n", encoding="utf-8")
    return folder


def _no_network(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.mark.parametrize("lower", [True, False])
def test_wordpiece_vocab_txt_matches_transformers_bert_tokenizers(tmp_path, monkeypatch, lower):
    _no_network(monkeypatch)
    folder = _write_vocab_txt(tmp_path / "bert", BERT_WORDS + ([] if lower else BERT_CASED_EXTRA))
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))
    tok = load_tokenizer_folder(folder)
    assert tok is not None and tok.source == folder / "vocab.txt"
    pure_python = transformers.BertTokenizerLegacy(vocab_file=str(folder / "vocab.txt"), do_lower_case=lower)
    backed = transformers.BertTokenizer(vocab=str(folder / "vocab.txt"), do_lower_case=lower)
    for text in SENTENCES:
        ours = tok.encode(text)
        assert ours == pure_python(text, add_special_tokens=False)["input_ids"], text
        assert ours == backed(text, add_special_tokens=False)["input_ids"], text
        assert tok.encode(text, add_special_tokens=True) == pure_python(text)["input_ids"], text  # [CLS] ... [SEP]
    unk = tok.special_id("unk")
    assert unk == 1 and unk in tok.encode("xyzzy")
    assert tok.mask_token_id == 4 and tok.encode("[MASK]") == [4]
    cafe = tok.encode("Café")
    assert (cafe == [tok.tok.token_to_id("cafe")]) if lower else (cafe == [tok.tok.token_to_id("Café")])


def _bpe_files(folder):
    """vocab.json + merges.txt as GPT-2 ships them, from a byte-level BPE trained here."""
    trained = train_bpe(["the cat sat on the mat. café au lait, naïve résumé! " * 5, "Hello world\\n"] * 10,
                        vocab_size=300)
    folder.mkdir(parents=True, exist_ok=True)
    trained.tok.model.save(str(folder))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}))
    return folder


BPE_SENTENCES = SENTENCES + ["café au lait<|endoftext|>The end", "emoji 🙂 and ŝ€", " leading space", ""]


def test_byte_level_bpe_vocab_json_merges_txt_matches_transformers_gpt2_tokenizer(tmp_path, monkeypatch):
    _no_network(monkeypatch)
    folder = _bpe_files(tmp_path / "gpt2")
    assert (folder / "merges.txt").read_text().startswith("#version")
    tok = load_tokenizer_folder(folder)
    reference = transformers.GPT2Tokenizer(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"))
    from_folder = transformers.GPT2Tokenizer.from_pretrained(str(folder))
    for text in BPE_SENTENCES:
        ours = tok.encode(text)
        assert ours == reference(text)["input_ids"] == from_folder(text)["input_ids"], text
        assert tok.decode(ours) == text  # byte-level: nothing is unknown, everything comes back
    eot = tok.tok.token_to_id("<|endoftext|>")
    assert eot in tok.encode("a<|endoftext|>b") and tok.eos_token_id == eot == tok.bos_token_id
    assert not tok.bos_prepended and tok.with_bos([5, 6]) == [5, 6]


def test_vocab_files_tokenizer_saves_as_tokenizer_json_and_reloads_the_same(tmp_path):
    tok = load_tokenizer_folder(_write_vocab_txt(tmp_path / "bert", BERT_WORDS))
    tok.save(tmp_path / "tokenizer.json")
    again = Tokenizer.from_file(tmp_path / "tokenizer.json")
    for text in SENTENCES:
        assert again.encode(text) == tok.encode(text)


def test_tokenizer_json_wins_and_config_decides_bos_and_specials(tmp_path):
    folder = tmp_path / "llama-like"
    folder.mkdir()
    trained = train_bpe(["Alice and the rabbit hole. " * 20], vocab_size=280,
                        specials=("<unk>", "<s>", "</s>", "<extra_mask>"))
    trained.save(folder / "tokenizer.json")
    _write_vocab_txt(folder, BERT_WORDS)  # ignored: tokenizer.json is the tokenizer
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False,
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False}, "eos_token": "</s>"}))
    (folder / "special_tokens_map.json").write_text(json.dumps({"mask_token": "<extra_mask>", "eos_token": "<unk>"}))
    tok = load_tokenizer_folder(folder)
    assert tok.source == folder / "tokenizer.json"
    assert tok.encode("Alice") == trained.encode("Alice")
    assert tok.bos_prepended and tok.bos_token_id == 1
    assert tok.eos_token_id == 2  # tokenizer_config.json wins over special_tokens_map.json
    assert tok.mask_token_id == 3  # a mask token no usual spelling would find
    ids = tok.encode("Alice")
    assert tok.with_bos(ids) == [1, *ids] and tok.with_bos([1, *ids]) == [1, *ids]


def test_a_bare_tokenizer_json_gets_what_it_got_before(tmp_path):
    trained = train_bpe(["the cat sat"] * 10, vocab_size=270)
    trained.save(tmp_path / "tokenizer.json")
    tok = load_tokenizer_folder(tmp_path)
    assert tok.declared_specials == {} and not tok.bos_prepended
    assert tok.eos_token_id == trained.eos_token_id == tok.tok.token_to_id("<|endoftext|>")
    assert tok.encode("the cat") == trained.encode("the cat")


def test_folder_without_tokenizer_files_has_none(tmp_path):
    (tmp_path / "vocab.json").write_text("{}")  # vocab.json alone is not a tokenizer (no merges.txt)
    assert load_tokenizer_folder(tmp_path) is None


@pytest.mark.parametrize("name, content, problem", [
    ("tokenizer_config.json", "{not json", "malformed JSON at line 1, column 2"),
    ("special_tokens_map.json", "[1, 2]", "expected a JSON object"),
    ("merges.txt", "#version: 0.2\nno_such_token another\n", "not a readable BPE vocabulary"),
])
def test_broken_files_name_the_file(tmp_path, name, content, problem):
    _bpe_files(tmp_path)
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(TokenizerError) as err:
        load_tokenizer_folder(tmp_path)
    assert str(err.value).startswith(str(tmp_path)) and problem in str(err.value)
    assert err.value.path is not None and err.value.path.name in (name, "merges.txt")


# -- folders whose tokenizer or architecture the app does not read (issue 25 §6): said by name --------


def _tokenizerless_model(folder):
    from desktop_app.core.checkpoints import new_model, save_model_folder
    from desktop_app.core.config import ModelConfig
    cfg = ModelConfig.gpt2(vocab_size=40, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=16)
    save_model_folder(new_model(cfg, seed=0), folder)
    return folder


def test_a_broken_sentencepiece_only_folder_names_the_file(tmp_path):
    """tokenizer.model is read since issue 28 (a valid one: tests/core/test_sentencepiece_tokenizers.py)."""
    from desktop_app.core.checkpoints import ModelLoadError, load_model_folder

    folder = _tokenizerless_model(tmp_path / "sp")
    (folder / "tokenizer.model").write_bytes(b"\x0a\x05hello")  # not a SentencePiece model
    with pytest.raises(ModelLoadError) as err:
        load_model_folder(folder)
    assert str(err.value).startswith(f"{folder / 'tokenizer.model'}: ") and "SentencePiece" in str(err.value)


def test_a_folder_with_no_tokenizer_at_all_says_no_tokenizer_json(tmp_path, capsys):
    from desktop_app import cli
    from desktop_app.core.checkpoints import load_model_folder

    folder = _tokenizerless_model(tmp_path / "none")
    assert load_model_folder(folder).tokenizer_missing == "no tokenizer.json"
    assert cli.main(["info", str(folder)]) == 0
    assert f"note: {folder}: no tokenizer.json; the model opens with token ids" in capsys.readouterr().err


# (t5, bart and marian open since issue 28: tests/parity/test_seq2seq_parity.py)
@pytest.mark.parametrize("config", [{"model_type": "mbart"}, {"model_type": "pegasus"}, {"model_type": "m2m_100"},
                                    {"model_type": "my-seq2seq", "is_encoder_decoder": True},
                                    {"model_type": "bert", "is_encoder_decoder": True}],
                         ids=lambda c: c["model_type"])
def test_an_encoder_decoder_is_said_to_be_unsupported_not_listed_against(tmp_path, capsys, config):
    from desktop_app import cli
    from desktop_app.core.checkpoints import ModelLoadError, load_model_folder

    folder = tmp_path / "seq2seq"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**config, "d_model": 16, "vocab_size": 40}))
    expected = f"{folder / 'config.json'}: encoder-decoder models ({config['model_type']}) are not supported yet"
    with pytest.raises(ModelLoadError) as err:
        load_model_folder(folder)
    assert str(err.value) == expected
    assert cli.main(["info", str(folder)]) == cli.EXIT_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "supported:" not in lines[0]


def test_a_bart_folders_vocab_json_merges_txt_puts_s_around_a_text_as_bart_tokenizer_does(tmp_path, monkeypatch):
    """Issue 41: a BART folder with vocab.json + merges.txt (no tokenizer.json) was read as GPT-2's (no
    specials); BartTokenizer, like RobertaTokenizer, writes <s> ... </s>."""
    _no_network(monkeypatch)
    folder = _bpe_files(tmp_path / "bart")
    (folder / "special_tokens_map.json").unlink()
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    for special in ("<s>", "<pad>", "</s>", "<unk>", "<mask>"):
        vocab.setdefault(special, len(vocab))
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps({"model_type": "bart"}))
    tok = load_tokenizer_folder(folder)
    reference = transformers.BartTokenizer.from_pretrained(str(folder))
    for text in ["The cat sat on the mat.", "café au lait", " leading space"]:
        want = reference(text)["input_ids"]
        assert want[0] == vocab["<s>"] and want[-1] == vocab["</s>"]
        assert tok.encode(text, add_special_tokens=True) == want == tok.encode_for_model(text)[0], text
        assert tok.encode(text) == reference(text, add_special_tokens=False)["input_ids"], text


@pytest.mark.parametrize("name", ["tokenizer_config.json", "special_tokens_map.json"])
def test_a_tokenizer_settings_file_beyond_read_jsons_cap_is_refused_unread(tmp_path, name):
    """tokenizer_config.json and special_tokens_map.json were read whole (read_text, then json.loads): a file of
    gigabytes took gigabytes. They go through files.read_json's cap (16 MB): one line naming the file and its
    size, before reading it."""
    import tracemalloc

    _bpe_files(tmp_path)
    with open(tmp_path / name, "wb") as fh:
        fh.truncate(20 << 20)  # sparse: 20 MB, beyond the cap
    tracemalloc.start()
    try:
        with pytest.raises(TokenizerError) as err:
            load_tokenizer_folder(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value) == (f"{tmp_path / name}: is 20,971,520 bytes, not a settings file (at most 16,777,216 "
                              "are read)") and err.value.path == tmp_path / name
    assert peak < 8 << 20, peak


def test_a_tokenizer_config_with_a_key_twice_still_loads_its_last_value(tmp_path):
    """Capped, not made strict: a key given twice keeps its last value, as transformers reads these files (read_json
    refuses it in a config.json; a tokenizer file another tool wrote so still opens)."""
    _bpe_files(tmp_path)
    (tmp_path / "special_tokens_map.json").write_text('{"eos_token": "the", "eos_token": "<|endoftext|>"}')
    tok = load_tokenizer_folder(tmp_path)
    assert tok.declared_specials["eos"] == "<|endoftext|>"
