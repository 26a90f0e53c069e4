"""Sequence-to-sequence training (issue 28): the tasks (copy, reverse, sort, translation from a grammar),
teacher forcing, held-out exact match by greedy decoding, and what the trained cross-attention reads."""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.training import seq2seq_tasks as s2s
from desktop_app.core.training.tasks import IGNORE, SequenceTask, TaskError, heldout, make_task

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# -- the grammar ---------------------------------------------------------------------------------


@pytest.mark.parametrize("english, french", [
    ("the black dog runs", "le chien noir court"),
    ("a white cow sees the red fox", "une vache blanche voit le renard rouge"),
    ("this happy girl chases a lazy pig quickly", "cette fille heureuse chasse un cochon paresseux vite"),
    ("the queen sleeps today", "la reine dort aujourd'hui"),
    ("a cat likes this green house", "un chat aime cette maison verte"),
])
def test_translate_moves_the_adjective_after_its_noun_and_agrees_it(english, french):
    assert s2s.translate(english) == french


@pytest.mark.parametrize("sentence, where", [("dog the runs", "word 1"), ("the black runs", "word 3"),
                                             ("the dog runs the cat", "word 4"), ("the dog", "word 3")])
def test_a_sentence_outside_the_grammar_is_refused_in_one_line(sentence, where):
    with pytest.raises(TaskError, match=where) as info:
        s2s.translate(sentence)
    assert "\n" not in str(info.value) and sentence in str(info.value)


def test_every_word_has_one_role_and_no_noun_elides():
    listed = [e for table in (s2s.DETERMINERS, s2s.ADJECTIVES, s2s.NOUNS, s2s.VERBS, s2s.TRANSITIVE_VERBS,
                              s2s.ADVERBS) for e, *_ in table]
    assert len(listed) == len(set(listed)) == len(s2s.ENGLISH_WORDS)  # translate() reads a word's role from it
    assert 20 <= len(s2s.NOUNS) and 10 <= len(s2s.ADJECTIVES)  # a few dozen words each side
    assert {g for *_, g in s2s.NOUNS} == {"m", "f"}
    assert not [f for _, f, _ in s2s.NOUNS if f[0] in "aeiouhéè"]  # "le"/"la" never become "l'"


def test_random_sentences_cover_the_grammar_and_translate():
    gen = torch.Generator().manual_seed(0)
    sentences = [s2s.random_sentence(gen) for _ in range(2000)]
    lengths = {len(s.split()) for s in sentences}
    assert lengths == set(range(3, s2s.MAX_SOURCE_WORDS + 1))
    assert len(set(sentences)) > 1900  # millions of sentences: almost no repeats
    for s in sentences:
        french = s2s.translate(s).split()
        assert len(french) == len(s.split()) <= s2s.MAX_TARGET_WORDS  # word for word, reordered


# -- the tasks -------------------------------------------------------------------------------------


def _unpadded(row):
    return [t for t in row.tolist() if t != s2s.PAD_ID]


def test_translation_batches_are_teacher_forced_pairs():
    task = make_task("translate", encoder_decoder=True)
    tok = task.tokenizer
    assert [tok.tok.id_to_token(i) for i in range(3)] == ["<pad>", "[START]", "[END]"]
    batch = task.train_batch(64, torch.Generator().manual_seed(1))
    assert batch.src.shape == (64, s2s.MAX_SOURCE_WORDS) and batch.inputs.shape == batch.targets.shape
    for src, inputs, targets in zip(batch.src, batch.inputs, batch.targets):
        scored = targets != IGNORE
        target = targets[scored].tolist()
        assert target[-1] == s2s.END_ID and s2s.END_ID not in target[:-1]
        assert tok.decode(target[:-1]) == s2s.translate(tok.decode(_unpadded(src)))
        # the decoder reads [START] and the target's first i - 1 tokens to predict token i
        assert inputs[scored].tolist() == [s2s.START_ID] + target[:-1]
        assert not scored[len(target):].any() and (inputs[len(target):] == s2s.PAD_ID).all()


def test_the_held_out_split_is_deterministic_and_disjoint_from_training():
    task = make_task("translate", encoder_decoder=True)
    val = task.val_set(seed=0)
    again = make_task("translate", encoder_decoder=True).val_set(seed=0)
    assert torch.equal(val.src, again.src) and torch.equal(val.targets, again.targets)
    assert all(heldout(r) for r in val.src)
    held = {tuple(r.tolist()) for r in val.src}
    assert len(held) > 0.95 * len(val)
    gen = torch.Generator().manual_seed(3)
    trained = {tuple(r.tolist()) for _ in range(40) for r in task.train_batch(64, gen).src}
    assert not held & trained and len(trained) > 2000


@pytest.mark.parametrize("name, answer", [("copy", lambda s: s), ("reverse", lambda s: s[::-1]),
                                          ("sort", sorted)])
def test_copy_reverse_and_sort_have_a_sequence_to_sequence_version(name, answer):
    task = make_task(name, {"length": 5, "symbols": 7}, encoder_decoder=True)
    assert isinstance(task, s2s.SymbolTask) and task.vocab_size == 3 + 7 + 1  # specials, symbols, [UNK]
    batch = task.train_batch(16, torch.Generator().manual_seed(0))
    assert batch.src.shape == (16, 5) and batch.targets.shape == (16, 6)
    for src, inputs, targets in zip(batch.src.tolist(), batch.inputs.tolist(), batch.targets.tolist()):
        assert targets == list(answer(src)) + [s2s.END_ID] and inputs == [s2s.START_ID] + targets[:-1]
    # the decoder-only task of the same name is unchanged
    assert isinstance(make_task(name, {"length": 5, "symbols": 7}), SequenceTask)


def test_translate_for_a_decoder_and_motif_for_an_encoder_decoder_are_refused_in_one_line():
    with pytest.raises(TaskError, match="encoder-decoder family"):
        make_task("translate")
    with pytest.raises(TaskError, match="encoder-decoder tasks: copy, reverse, sort, translate"):
        make_task("motif", encoder_decoder=True)
