"""Issue 25 §2: long text is read and tokenized in pieces, its ids kept compact. The pieces give the same
ids as encoding the whole text at once (multi-byte characters cut across reads included), and memory
grows with the file's ids only (a 50 MB file took 19.9 GB in `train --task text`, 8.2 GB in `lipschitz`)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from desktop_app.core import inputs
from desktop_app.core.inputs import InputError, encode_text_file, iter_text_file, read_text_file
from desktop_app.core.tokenizer import Tokenizer, char_tokenizer, train_bpe
from desktop_app.core.training.tasks import TaskError, TextTask, make_task

ROOT = Path(__file__).resolve().parents[2]
# multi-byte characters (2, 3 and 4 bytes), runs of spaces, tabs and blank lines, a special token's text
TEXT = ("Alice  was beginning   to get very tired\tof sitting by her sister on the bank.\n\n\n"
        "« Café naïve, über — 東京 🐇 » she said;  [MASK] \"and what is the use of a book,\" thought Alice\n"
        "   without pictures or conversations?  \n") * 7


def _bert(text: str) -> Tokenizer:
    words = sorted({w for w in text.replace("\n", " ").split(" ") if w} | set(text) | {"[UNK]"})
    tok = HFTokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return Tokenizer(tok)


def _prefix_space_bpe(text: str) -> Tokenizer:
    tok = train_bpe([text], 300)
    tok.tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)  # as RoBERTa's may say
    return tok


TOKENIZERS = {"char": lambda t: char_tokenizer(t, specials=["[MASK]"], unknown="[UNK]"),
              "bpe": lambda t: train_bpe([t], 300, specials=("<|endoftext|>", "[MASK]")),
              "bpe-prefix-space": _prefix_space_bpe, "bert": _bert}


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
@pytest.mark.parametrize("piece_chars,block_bytes", [(5, 3), (23, 7), (200, 64)])
def test_pieces_give_the_ids_of_the_whole_text(tmp_path, kind, piece_chars, block_bytes):
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbf" + TEXT.encode("utf-8"))  # a byte-order mark is not text
    pieces = list(iter_text_file(path, piece_chars, block_bytes))
    assert len(pieces) > 3 and "".join(pieces) == read_text_file(path) == TEXT
    tok = TOKENIZERS[kind](TEXT)
    ids = encode_text_file(tok, path, pieces=lambda: iter_text_file(path, piece_chars, block_bytes))
    assert ids.typecode == "h" and list(ids) == tok.encode(TEXT)  # 2 bytes an id, as one-shot encoding


def test_a_bpe_vocabulary_trained_on_pieces_is_the_whole_texts(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    whole = train_bpe([TEXT], 300)
    pieced = train_bpe(iter_text_file(path, 11, 5), 300)  # streamed: never a list of the pieces
    assert pieced.tok.get_vocab() == whole.tok.get_vocab()


def test_reading_in_pieces_says_what_read_text_file_says(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes("é".encode() * 20 + b"\xff" + b"abc def " * 10)  # the bad byte far beyond the first read
    with pytest.raises(InputError, match=r"bad\.txt: not UTF-8 text \(byte 40\)"):
        list(iter_text_file(bad, 4, 8))
    cut = tmp_path / "cut.txt"
    cut.write_bytes(b"abc def " * 3 + "é".encode()[:1])  # a truncated last character
    with pytest.raises(InputError, match=r"not UTF-8 text \(byte 24\)"):
        list(iter_text_file(cut, 4, 8))
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\t " * 50)
    with pytest.raises(InputError, match="the file is empty"):
        list(iter_text_file(blank, 4, 8))
    with pytest.raises(InputError, match="no such text file"):
        list(iter_text_file(tmp_path / "missing.txt"))


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_the_text_task_from_a_file_in_pieces_is_the_task_of_the_whole_text(tmp_path, monkeypatch, tokenizer):
    import torch

    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    monkeypatch.setattr(inputs, "TEXT_PIECE_CHARS", 13)
    monkeypatch.setattr(inputs, "TEXT_BLOCK_BYTES", 9)
    opts = {"text_file": str(path), "tokenizer": tokenizer, "vocab_size": 300, "seq_len": 16}
    task = make_task("text", dict(opts), causal=True)
    whole = TextTask(TEXT, tokenizer=tokenizer, vocab_size=300, seq_len=16)
    assert task.tokenizer.tok.get_vocab() == whole.tokenizer.tok.get_vocab()
    assert task.train_ids.dtype == torch.int16  # compact
    assert torch.equal(task.train_ids.long(), torch.tensor(whole.tokenizer.encode(TEXT))[:len(task.train_ids)])
    a, b = task.train_batch(4, torch.Generator().manual_seed(0)), whole.train_batch(4, torch.Generator().manual_seed(0))
    assert a.inputs.dtype == torch.long and torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    mlm = make_task("text", dict(opts), causal=False)
    assert mlm.train_batch(2, torch.Generator().manual_seed(0)).targets.dtype == torch.long
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n  \n")
    with pytest.raises(TaskError, match="the file is empty"):
        make_task("text", {"text_file": str(blank)})


# -- memory: grows with the ids, not with the text's encoding -------------------------------------

# each child's own peak, VmHWM (benchmarks.scale._peak_mb): ru_maxrss carries pytest's across exec, and two
# children both reading pytest's larger peak would show no growth at all
_PEAK = """
import json, sys
what, path = sys.argv[1], sys.argv[2]
import torch
from desktop_app.benchmarks.scale import _peak_mb
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.inputs import text_file_ids
from desktop_app.core.training.tasks import make_task
model = load_model_folder(sys.argv[3])  # loaded (and torch imported) in both runs alike
if what == "train":
    task = make_task("text", {"text_file": path, "seq_len": 32})
    task.train_batch(8, torch.Generator().manual_seed(0)); task.val_set()
    n = len(task.train_ids) + len(task.val_ids)
else:
    n = len(text_file_ids(model, path))
print(json.dumps({"ids": n, "peak": _peak_mb() * 2**20}))
"""


def _text_file(path: Path, megabytes: float) -> Path:
    rnd = random.Random(0)
    words = "alice rabbit queen hatter tea garden door key little bottle café naïve über 東京".split()
    lines, size = [], 0
    while size < megabytes * 1e6:
        line = " ".join(rnd.choice(words) for _ in range(12)) + ".\n"
        lines.append(line)
        size += len(line.encode())
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("what", ["train", "lipschitz"])
def test_memory_grows_with_the_ids_not_the_text(tmp_path, what):
    peaks = {}
    for mb in (2, 20):
        path = _text_file(tmp_path / f"t{mb}.txt", mb)
        r = subprocess.run([sys.executable, "-c", _PEAK, what, str(path), str(ROOT / "resources" / "demo-model")],
                           cwd=ROOT, capture_output=True, text=True, timeout=900,
                           env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, r.stderr
        peaks[mb] = json.loads(r.stdout.strip().splitlines()[-1])
    extra_ids = peaks[20]["ids"] - peaks[2]["ids"]
    growth = peaks[20]["peak"] - peaks[2]["peak"]
    # before: about 400 bytes per character (2.1 GB for 5 MB), i.e. over 7 GB more here; now the ids
    # (2 bytes each) and one piece's encoding at a time
    assert growth < 10 * 2 * extra_ids + 64 * 2**20, (growth / 2**20, extra_ids, peaks)
