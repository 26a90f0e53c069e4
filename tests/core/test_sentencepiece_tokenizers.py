"""SentencePiece tokenizers as model folders ship them (issue 28): spiece.model (T5), source.spm /
target.spm + vocab.json (Marian), tokenizer.model alone (Llama): ids, special tokens and decoded text
checked against `transformers`' own tokenizers (test-only) on 1,000 generated sentences.

The SentencePiece models are trained here (a few seconds, once per session) with the settings of the
models they stand for: T5's unigram model (pad 0, eos 1, unk 2, no bos: T5Tokenizer's layout), Llama's
BPE with byte fallback, split digits, no normalisation and no whitespace removal, Marian's unigram or
BPE source and target models with one vocab.json over both. Folders are written by transformers' own
save_pretrained, as transformers 4 left them (the model file, tokenizer_config.json, no tokenizer.json)."""
from __future__ import annotations

import json
import random
import shutil
import warnings

import pytest

from desktop_app.core.inputs import encode, encode_text_file
from desktop_app.core.sentencepiece_tokenizer import SentencePieceBackend
from desktop_app.core.tokenizer import TokenizerError, load_tokenizer_folder

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

WORDS = ("the dog cat runs away black small house quickly and of le chien noir court maison école café naïve "
         "Zürich über façade garçon élève".split())
ODD = ["€", "☃", "漢字", "🙂", "\u00a0", "\t", "Ω", "ß"]  # rare characters of the training text
UNSEEN = ["ʬ", "ꙮ", "𝄞", "ǂ", "ʬʬ"]  # never in the training text: unknown pieces (or bytes for Llama)
TYPED_SPECIALS = {"t5": ["</s>", "<extra_id_0>", "<extra_id_7>", "<pad>"], "llama": ["</s>", "<s>", "<unk>"],
                  "gemma": ["<eos>", "<bos>", "<mask>", "<pad>"], "marian": ["</s>", "<unk>", "<pad>"]}


def sentence(rng: random.Random, specials: list[str] = (), unseen: list[str] = ()) -> str:
    """Mixed case, digits, punctuation, accents, repeated and leading/trailing spaces, unknown characters."""
    parts = []
    for _ in range(rng.randint(1, 14)):
        w = rng.choice(WORDS)
        r = rng.random()
        w = w.upper() if r < 0.15 else w.capitalize() if r < 0.35 else w
        if rng.random() < 0.15:
            w = str(rng.randint(0, 10**rng.randint(1, 7)))
        if rng.random() < 0.2:
            w += rng.choice(",.!?;:'\"()-")
        if rng.random() < 0.07:
            w = rng.choice([w + rng.choice(ODD), rng.choice(ODD) + w])
        if unseen and rng.random() < 0.05:
            w = rng.choice([w + rng.choice(unseen), rng.choice(unseen) + w, rng.choice(unseen)])
        if specials and rng.random() < 0.03:
            w = rng.choice([w + rng.choice(specials), rng.choice(specials) + " " + w])
        parts.append(w)
    text = parts[0]
    for p in parts[1:]:
        text += rng.choice([" "] * 6 + ["  ", "   ", "\t"]) + p
    if rng.random() < 0.1:
        text = rng.choice([" ", "  "]) + text
    if rng.random() < 0.1:
        text += rng.choice([" ", "  "])
    return text


def sentences(style: str, n: int = 1000, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [sentence(rng, TYPED_SPECIALS[style], UNSEEN) for _ in range(n)] + ["", " ", "x", "ʬʬ ǂ", "▁x"]


def _train(corpus, prefix, **settings):
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(prefix), character_coverage=0.995,
                                   minloglevel=2, num_threads=1, **settings)
    return prefix.with_suffix(".model")


@pytest.fixture(scope="session")
def spm_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("spm")
    rng = random.Random(0)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(sentence(rng) for _ in range(3000)), encoding="utf-8")
    french = root / "french.txt"
    french.write_text("\n".join(sentence(rng).replace("the", "le").replace("dog", "chien") for _ in range(3000)),
                      encoding="utf-8")
    return {
        "t5": _train(corpus, root / "t5", vocab_size=300, model_type="unigram", pad_id=0, eos_id=1, unk_id=2,
                     bos_id=-1),
        "llama": _train(corpus, root / "llama", vocab_size=420, model_type="bpe", byte_fallback=True,
                        split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
                        allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1),
        "gemma": _train(corpus, root / "gemma", vocab_size=420, model_type="bpe", byte_fallback=True,
                        split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
                        add_dummy_prefix=False, allow_whitespace_only_pieces=True, pad_id=0, eos_id=1, bos_id=2,
                        unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
                        user_defined_symbols=["<mask>"]),
        **{f"marian-{kind}-{side}": _train(text, root / f"marian-{kind}-{side}", vocab_size=250, model_type=kind,
                                           unk_id=1, eos_id=0, bos_id=-1, pad_id=-1)
           for kind in ("unigram", "bpe") for side, text in (("source", corpus), ("target", french))},
    }


def _quiet():
    warnings.filterwarnings("ignore")  # MarianTokenizer: "Recommended: pip install sacremoses."


def t5_folder(models, folder):
    """What T5Tokenizer writes, with the spiece.model transformers 4 saved beside it (no tokenizer.json)."""
    _quiet()
    src = folder.parent / f"{folder.name}-src"
    src.mkdir(parents=True)
    shutil.copy(models["t5"], src / "spiece.model")
    transformers.T5Tokenizer.from_pretrained(src).save_pretrained(folder)
    (folder / "tokenizer.json").unlink()
    shutil.copy(models["t5"], folder / "spiece.model")
    return folder


def llama_folder(models, folder, add_bos=True, family="llama"):
    """What LlamaTokenizer (GemmaTokenizer) writes, tokenizer.json deleted: only tokenizer.model remains;
    add_bos_token in tokenizer_config.json as Llama 2 and Gemma folders have it (transformers 5 leaves
    it out: no BOS then)."""
    _quiet()
    src = folder.parent / f"{folder.name}-src"
    src.mkdir(parents=True)
    shutil.copy(models[family], src / "tokenizer.model")
    cls = transformers.GemmaTokenizer if family == "gemma" else transformers.LlamaTokenizer
    cls.from_pretrained(src).save_pretrained(folder)
    (folder / "tokenizer.json").unlink()
    shutil.copy(models[family], folder / "tokenizer.model")
    if add_bos:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": True}))
    return folder


def marian_folder(models, folder, kind="unigram"):
    """What MarianTokenizer writes: source.spm, target.spm, one vocab.json over both models' pieces
    (Marian's ids: </s> 0, <unk> 1, ..., <pad> last)."""
    _quiet()
    source, target = models[f"marian-{kind}-source"], models[f"marian-{kind}-target"]
    vocab: dict[str, int] = {}
    for path in (source, target):
        sp = spm.SentencePieceProcessor(model_file=str(path))
        for i in range(sp.get_piece_size()):
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    vocab_file = folder.parent / f"{folder.name}-vocab.json"
    vocab_file.write_text(json.dumps(vocab), encoding="utf-8")
    transformers.MarianTokenizer(str(source), str(target), str(vocab_file)).save_pretrained(folder)
    return folder


def reference(folder):
    _quiet()
    return transformers.AutoTokenizer.from_pretrained(folder)


def assert_same_as_transformers(ours, ref, texts, target=False):
    """ids with and without special tokens (as the model reads the text: encode_for_model), and
    decoding with and without them, equal to `ref`'s."""
    side = ours.target if target else ours
    for text in texts:
        expected = ref(text_target=text)["input_ids"] if target else ref(text)["input_ids"]
        assert side.encode_for_model(text, True)[0] == expected, text
        if not target:
            assert side.encode(text) == ref(text, add_special_tokens=False)["input_ids"], text
        for skip in (False, True):
            kwargs = {"use_source_tokenizer": False} if target else {}
            assert side.decode(expected, skip_special_tokens=skip) == ref.decode(
                expected, skip_special_tokens=skip, **kwargs), (text, skip)


def _edit_config(folder, **changes):
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize("saved_by", ["transformers 5", "transformers 4"])
def test_t5_spiece_model_tokenizes_as_t5_tokenizer(spm_models, tmp_path, saved_by):
    folder = t5_folder(spm_models, tmp_path / "t5")
    if saved_by == "transformers 4":  # its tokenizer_config.json lists every added token with its id
        added = reference(folder).added_tokens_decoder
        _edit_config(folder, added_tokens_decoder={str(i): {"content": t.content, "special": t.special, "lstrip": False,
                                                            "rstrip": False, "normalized": False, "single_word": False}
                                                   for i, t in added.items()})
    ours, ref = load_tokenizer_folder(folder), reference(folder)
    assert isinstance(ours.tok, SentencePieceBackend) and ours.source == folder / "spiece.model"
    assert ours.tok.token_to_id("<extra_id_0>") == len(ref) - 1 == ref.convert_tokens_to_ids("<extra_id_0>")
    assert type(ref).__name__ == "T5Tokenizer"
    assert_same_as_transformers(ours, ref, sentences("t5"))
    assert ours.vocab_size == len(ref)  # the pieces and the 100 <extra_id_N> sentinels after them
    assert (ours.eos_token_id, ours.special_id("pad"), ours.special_id("unk"), ours.bos_token_id) == (
        ref.eos_token_id, ref.pad_token_id, ref.unk_token_id, None)
    assert ours.target is None
    ids = ref("the dog ʬ runs")["input_ids"]
    assert ref.unk_token_id in ids and ids[-1] == ref.eos_token_id  # the sentences reach <unk> and </s>


@pytest.mark.parametrize("add_bos", [True, False])
def test_llama_tokenizer_model_alone_tokenizes_as_llama_tokenizer(spm_models, tmp_path, add_bos):
    folder = llama_folder(spm_models, tmp_path / "llama", add_bos)
    ours, ref = load_tokenizer_folder(folder), reference(folder)
    assert isinstance(ours.tok, SentencePieceBackend) and ours.source == folder / "tokenizer.model"
    assert type(ref).__name__ == "LlamaTokenizer"
    assert_same_as_transformers(ours, ref, sentences("llama"))
    assert ours.vocab_size == len(ref) and ours.bos_prepended == add_bos
    assert (ours.bos_token_id, ours.eos_token_id, ours.special_id("unk")) == (
        ref.bos_token_id, ref.eos_token_id, ref.unk_token_id)
    ids = ref("ʬ Zürich")["input_ids"]
    assert any(ref.convert_ids_to_tokens(i).startswith("<0x") for i in ids)  # byte fallback is exercised
    assert ours.decode(ids, skip_special_tokens=True) == "ʬ Zürich"


@pytest.mark.parametrize("add_bos", [True, False])
def test_gemma_tokenizer_model_alone_tokenizes_as_gemma_tokenizer(spm_models, tmp_path, add_bos):
    folder = llama_folder(spm_models, tmp_path / "gemma", add_bos, family="gemma")
    ours, ref = load_tokenizer_folder(folder), reference(folder)
    assert type(ref).__name__ == "GemmaTokenizer"
    assert_same_as_transformers(ours, ref, sentences("gemma"))
    assert ours.vocab_size == len(ref) and ours.bos_prepended == add_bos
    assert (ours.bos_token_id, ours.eos_token_id, ours.mask_token_id, ours.special_id("pad")) == (
        ref.bos_token_id, ref.eos_token_id, ref.mask_token_id, ref.pad_token_id)
    assert ours.decode(ref(" ʬ Zürich")["input_ids"], skip_special_tokens=True) == " ʬ Zürich"  # no space dropped


@pytest.mark.parametrize("kind, clean_up", [("unigram", False), ("bpe", False), ("unigram", True)])
def test_marian_source_and_target_tokenize_as_marian_tokenizer(spm_models, tmp_path, kind, clean_up):
    folder = marian_folder(spm_models, tmp_path / "marian", kind)
    if clean_up:  # as some folders ask: "a ." decodes as "a."
        _edit_config(folder, clean_up_tokenization_spaces=True)
    assert not (folder / "tokenizer.json").exists() and (folder / "vocab.json").exists()
    ours, ref = load_tokenizer_folder(folder), reference(folder)
    assert type(ref).__name__ == "MarianTokenizer"
    texts = sentences("marian") + [">>fr<< the dog", ">>xx<<"]
    assert_same_as_transformers(ours, ref, texts)
    assert_same_as_transformers(ours, ref, texts, target=True)
    # the two sides cut the same text apart (their models differ), into the one vocabulary's ids
    assert any(ref(text_target=t)["input_ids"] != ref(t)["input_ids"] for t in texts)
    assert ours.source == folder / "source.spm" and ours.target.source == folder / "target.spm"
    assert ours.eos_token_id == ref.eos_token_id == 0 and ours.special_id("pad") == ref.pad_token_id
    assert ours.vocab_size == len(ref)
    dot = ref("the dog .", add_special_tokens=False)["input_ids"]
    assert ours.decode(dot) == ("the dog." if clean_up else "the dog .")


def test_special_tokens_in_the_apps_inputs(spm_models, tmp_path):
    """What every panel reads (core.inputs.encode): T5 and Marian end the text with </s>, Llama starts it
    with <s>, each listed as the tokenizer's; the input setting turns them off."""
    t5 = load_tokenizer_folder(t5_folder(spm_models, tmp_path / "t5"))
    out = encode(t5, "the dog runs")
    assert out.ids[-1] == t5.eos_token_id and out.specials == [(len(out.ids) - 1, "</s>")]
    assert "post-processor" in out.specials_source  # said beside the chips
    assert encode(t5, "the dog runs", special_tokens=False).ids == out.ids[:-1]
    llama = load_tokenizer_folder(llama_folder(spm_models, tmp_path / "llama"))
    out = encode(llama, "the dog runs")
    assert out.ids[0] == llama.bos_token_id and out.specials == [(0, "<s>")]
    assert "add_bos_token" in out.specials_source
    strings = llama.token_strings(out.ids)  # token chips: each id readable on its own, a lone "▁" too
    assert len(strings) == len(out.ids) and all(strings) and strings[0] == "<s>"
    assert llama.decode(out.ids, skip_special_tokens=True) == "the dog runs"


def test_a_text_file_is_tokenized_as_the_whole_text(spm_models, tmp_path):
    """encode_text_file (Lipschitz windows, a feature's top contexts) reads a long file in pieces: with a
    SentencePiece tokenizer it gives the ids of the whole text."""
    tokenizer = load_tokenizer_folder(llama_folder(spm_models, tmp_path / "llama"))
    text = " ".join(sentences("llama", 300, seed=5)[:300])
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    assert list(encode_text_file(tokenizer, path)) == tokenizer.with_bos(tokenizer.encode(text))


@pytest.mark.parametrize("name", ["spiece.model", "tokenizer.model", "source.spm", "target.spm"])
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_corrupt_sentencepiece_model_is_named(spm_models, tmp_path, name, damage):
    if name == "spiece.model":
        folder = t5_folder(spm_models, tmp_path / "f")
    elif name == "tokenizer.model":
        folder = llama_folder(spm_models, tmp_path / "f")
    else:
        folder = marian_folder(spm_models, tmp_path / "f")
    path = folder / name
    data = path.read_bytes()
    path.write_bytes({"truncated": data[:len(data) // 3], "garbage": bytes(random.Random(0).randbytes(2000)),
                      "empty": b""}[damage])
    with pytest.raises(TokenizerError) as err:
        load_tokenizer_folder(folder)
    assert err.value.path == path and str(path) in str(err.value)
    assert "SentencePiece" in str(err.value) and "\n" not in str(err.value)


def test_a_marian_folder_missing_a_file_is_named(spm_models, tmp_path):
    folder = marian_folder(spm_models, tmp_path / "marian")
    (folder / "target.spm").unlink()
    with pytest.raises(TokenizerError, match="target.spm") as err:
        load_tokenizer_folder(folder)
    assert err.value.path == folder / "target.spm"
    folder = marian_folder(spm_models, tmp_path / "marian2")
    vocab = json.loads((folder / "vocab.json").read_text())
    del vocab["<unk>"]
    (folder / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(TokenizerError, match="<unk>") as err:
        load_tokenizer_folder(folder)
    assert err.value.path == folder / "vocab.json"


def test_a_sentencepiece_tokenizer_is_not_written_as_tokenizer_json(spm_models, tmp_path):
    tokenizer = load_tokenizer_folder(t5_folder(spm_models, tmp_path / "t5"))
    with pytest.raises(ValueError, match="not written as tokenizer.json .copy spiece.model instead"):
        tokenizer.save(tmp_path / "tokenizer.json")
    assert not (tmp_path / "tokenizer.json").exists()


def test_a_model_folder_with_only_tokenizer_model_opens_with_text(spm_models, tmp_path, capsys):
    """A model folder whose tokenizer is tokenizer.model alone: text in every panel and command."""
    from desktop_app import cli
    from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
    from desktop_app.core.config import ModelConfig
    from desktop_app.core.inputs import encode_text_or_ids

    tok_folder = llama_folder(spm_models, tmp_path / "tok")
    folder = tmp_path / "model"
    cfg = ModelConfig.gpt2(vocab_size=420, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=64)
    save_model_folder(new_model(cfg, seed=0), folder)
    for name in ("tokenizer.model", "tokenizer_config.json"):
        shutil.copy(tok_folder / name, folder / name)
    loaded = load_model_folder(folder)
    assert isinstance(loaded.tokenizer.tok, SentencePieceBackend) and loaded.tokenizer_missing == ""
    ids = encode_text_or_ids(loaded, "the dog runs").ids
    assert ids == reference(tok_folder)("the dog runs")["input_ids"]
    assert cli.main(["info", str(folder)]) == 0
    assert "not supported" not in capsys.readouterr().err


def test_a_sentencepiece_model_linked_from_outside_the_folder_is_refused(spm_models, tmp_path):
    """The rule every file the loader reads by name follows (weights.check_links)."""
    from desktop_app.core.checkpoints import ModelLoadError, load_model_folder, new_model, save_model_folder
    from desktop_app.core.config import ModelConfig

    folder = tmp_path / "model"
    save_model_folder(new_model(ModelConfig.gpt2(vocab_size=420, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                                                 context_length=16), seed=0), folder)
    outside = tmp_path / "elsewhere.model"
    shutil.copy(spm_models["llama"], outside)
    (folder / "tokenizer.model").symlink_to(outside)
    with pytest.raises(ModelLoadError, match="outside the model folder") as err:
        load_model_folder(folder)
    assert str(err.value).startswith(str(folder / "tokenizer.model"))


@pytest.mark.parametrize("kind", ["t5", "marian", "llama"])
def test_a_model_saved_with_a_sentencepiece_tokenizer_reopens_tokenizing_the_same(spm_models, tmp_path, kind):
    """save_model_folder copies the files a SentencePiece tokenizer was read from (it has no
    tokenizer.json form) with their settings: the saved folder tokenizes, source and target, as
    transformers' tokenizer of the original folder does."""
    from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
    from desktop_app.core.config import ModelConfig

    make = {"t5": t5_folder, "marian": marian_folder, "llama": llama_folder}[kind]
    tok_folder = make(spm_models, tmp_path / "tok")
    tokenizer = load_tokenizer_folder(tok_folder)
    cfg = ModelConfig.gpt2(vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                           context_length=64)
    save_model_folder(new_model(cfg, seed=0), tmp_path / "model", tokenizer=tokenizer)
    assert not (tmp_path / "model" / "tokenizer.json").exists()
    reopened = load_model_folder(tmp_path / "model").tokenizer
    texts = sentences(kind, n=50)
    assert_same_as_transformers(reopened, reference(tok_folder), texts)
    if kind == "marian":
        assert_same_as_transformers(reopened, reference(tok_folder), texts, target=True)


def test_a_huge_extra_ids_is_refused_in_one_line_at_once(spm_models, tmp_path):
    """Issue 41: extra_ids 10**9 in a T5 tokenizer_config.json was killed by the kernel at 22.9 GB (10**7: no
    output in 300 s); refused now before any sentinel is made."""
    folder = t5_folder(spm_models, tmp_path / "t5")
    _edit_config(folder, extra_ids=10**9)
    with pytest.raises(TokenizerError, match="extra_ids 1,000,000,000") as info:
        load_tokenizer_folder(folder)
    assert "tokenizer_config.json" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_word_start_piece_keeps_its_space_on_its_own(spm_models, tmp_path):
    """Issue 41: SentencePiece chips dropped the word-start mark ("▁dog" read as a mid-word "dog"); a piece
    that starts a word reads with its space, as GPT-2's do."""
    folder = t5_folder(spm_models, tmp_path / "t5")
    ours = load_tokenizer_folder(folder)
    ids = encode(ours, "the dog runs").ids
    pieces = [ours.tok.id_to_token(i) for i in ids]
    strings = ours.token_strings(ids)
    starts = [s for p, s in zip(pieces, strings) if p and p.startswith("\u2581") and len(p) > 1]
    assert starts and all(s.startswith(" ") for s in starts)
    assert all(not s.startswith(" ") for p, s in zip(pieces, strings) if p and not p.startswith("\u2581"))
