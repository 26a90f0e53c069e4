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


# -- training: teacher forcing, exact match, and what the cross-attention reads ----------------------


def _cross_attention(model, batch, layer: int) -> torch.Tensor:
    """[B, H, T, S]: decoder layer `layer`'s cross-attention on a teacher-forced batch."""
    mask = batch.src != s2s.PAD_ID
    name = f"decoder.blocks.{layer}.cross_attn.pattern"
    _, trace = model.run_with_trace(batch.src, batch.inputs, names=(name,), src_mask=mask)
    return trace[name].float()


def _train(tmp_path, task, task_options, model, steps, **run):
    """A Marian run (the original Transformer: post-LN, sinusoidal, ReLU) into tmp_path/run, keeping its
    model as initialised (checkpoints/step-000000) and at the end."""
    from desktop_app.core.training import TrainConfig, train

    cfg = TrainConfig(task=task, task_options=task_options, family="marian", model={"activation": "relu", **model},
                      steps=steps, keep_every=steps, **{"warmup_steps": 50, "batch_size": 64, "eval_every": steps,
                                                        "checkpoint_every": steps, "log_every": 50, **run})
    events: list[dict] = []
    summary = train(cfg, tmp_path / "run", on_event=events.append)
    return summary, events


def _anti_diagonal_mass(model, batch, length: int) -> tuple[float, float]:
    """(mean weight on the mirrored source position, share of positions whose largest weight is there) of
    the last decoder layer's cross-attention averaged over heads, for the target's symbols (not [END])."""
    p = _cross_attention(model, batch, model.cfg.n_decoder_layers - 1).mean(1)[:, :length]  # [B, length, length]
    mirrored = torch.arange(length).flip(0)
    mass = p.gather(-1, mirrored.expand(len(p), length)[..., None]).squeeze(-1)
    return float(mass.mean()), float((p.argmax(-1) == mirrored).float().mean())


def test_reverse_trains_a_cross_attention_that_reads_the_source_backwards(tmp_path):
    """Marian (post-LN, sinusoidal, ReLU), 2 + 2 layers, 2 heads, width 64, 300 steps of 64 sequences of 6
    symbols from 8: every held-out sequence reversed exactly, and the decoder writing target token i reads
    source token 5 - i (the anti-diagonal), where the model as initialised spreads its attention evenly."""
    from desktop_app.core.checkpoints import load_model_folder

    length = 6
    summary, events = _train(tmp_path, "reverse", {"length": length, "symbols": 8},
                             {"n_layers": 2, "n_heads": 2, "d_model": 64, "d_ff": 128}, steps=300, lr=1e-3)
    assert summary["val_exact_match"] >= 0.95, summary
    print("reverse:", summary, f"{events[-1]['elapsed']:.1f} s of training")
    val = make_task("reverse", {"length": length, "symbols": 8}, encoder_decoder=True).val_set(0).rows(slice(0, 256))
    initial = load_model_folder(tmp_path / "run" / "checkpoints" / "step-000000").model
    trained = load_model_folder(tmp_path / "run").model
    mass, hits = _anti_diagonal_mass(trained, val, length)
    assert mass > 0.8 and hits > 0.95, (mass, hits)
    mass, hits = _anti_diagonal_mass(initial, val, length)
    assert mass < 0.3 and hits < 0.5, (mass, hits)  # before training: nothing like it


@pytest.mark.slow
def test_translation_reaches_95_percent_and_its_cross_attention_swaps_adjective_and_noun(tmp_path):
    """Marian (post-LN, sinusoidal, ReLU), 2 + 2 layers, 4 heads, width 64 (243,712 parameters), lr 3e-3,
    600 steps of 64 sentences: >= 95% of the held-out sentences translated exactly by greedy decoding.

    What the cross-attention shows, on the held-out sentences that start "det adj noun" ("the black dog
    ..." -> "le chien noir ..."): the decoder position that writes the noun (its input is the determiner)
    reads the source noun, which comes AFTER the adjective in the source, and the next position, which
    writes the adjective, reads the source adjective. In the last decoder layer a head does both: its
    largest weight is on the source noun while the noun is written and on the source adjective while the
    adjective is written, each for >= 95% of the sentences, with most of its weight there (measured: heads 2
    and 3, weight 1.00 on the noun and 0.997 on the adjective, the largest for every sentence). Averaged over
    the layer's heads, the weight on the word being written is above 0.5 for the noun (measured 0.91) and
    above 1/3 for the adjective (measured 0.50; a uniform spread gives about 0.18, as every head of the model
    as initialised does). Not the heads' average's largest weight: while the adjective is written the other
    two heads read the word that comes next (the verb), so the average puts about 0.5 on each and rounding
    picks the largest (the adjective for 69% of the sentences here). That measure passed (100%) until two
    rounding changes of the training step, both right (q, k, v in one product, 6053cb0: 87%; the clipping
    factor multiplied as a Python number, cd27f14: 69%); this one holds for all three runs (heads 2 and 3
    swap in each) and for seeds 1 to 4 (2 or 3 swapping heads each, the heads' mean weight on the adjective
    0.52 to 0.98)."""
    from desktop_app.core.checkpoints import load_model_folder

    summary, events = _train(tmp_path, "translate", {}, {"n_layers": 2, "n_heads": 4, "d_model": 64, "d_ff": 256},
                             steps=600, lr=3e-3)
    print("translate:", summary, f"{events[-1]['elapsed']:.1f} s of training")
    assert summary["val_exact_match"] >= 0.95, summary

    task = make_task("translate", encoder_decoder=True)
    val = task.val_set(0)
    adjectives = {task.tokenizer.encode(e)[0] for e, *_ in s2s.ADJECTIVES}
    with_adjective = val.rows(torch.tensor([int(w) in adjectives for w in val.src[:, 1]]))
    assert len(with_adjective) > 100

    def reads(model) -> dict[str, tuple[float, list[tuple[float, float]]]]:
        """word -> (the heads' mean weight on it, each head's (mean weight, share of sentences whose largest
        weight is on it)) while the decoder writes it."""
        p = _cross_attention(model, with_adjective, model.cfg.n_decoder_layers - 1)  # [B, H, T, S]
        # decoder input [START] det noun adj ...: position 1 writes the noun, position 2 the adjective
        return {what: (float(p[:, :, query, source].mean()),
                       [(float(p[:, h, query, source].mean()),
                         float((p[:, h, query].argmax(-1) == source).float().mean())) for h in range(p.shape[1])])
                for what, query, source in (("noun", 1, 2), ("adjective", 2, 1))}

    def swapping_heads(read) -> list[int]:
        """The heads that read the noun while writing it and the adjective while writing it."""
        return [h for h in range(len(read["noun"][1]))
                if all(read[w][1][h][0] > 0.5 and read[w][1][h][1] >= 0.95 for w in ("noun", "adjective"))]

    trained = reads(load_model_folder(tmp_path / "run").model)
    print("cross-attention (heads' mean weight, [(each head's mean weight, share argmax)]) trained:", trained)
    assert trained["noun"][0] > 0.5 and trained["adjective"][0] > 1 / 3, trained
    assert swapping_heads(trained), trained
    initial = reads(load_model_folder(tmp_path / "run" / "checkpoints" / "step-000000").model)
    print("as initialised:", initial)
    assert not swapping_heads(initial), initial
    for what, (_, heads) in initial.items():
        assert all(mass < 0.3 for mass, _ in heads), (what, initial)  # about 0.18: spread evenly


def test_the_model_takes_the_task_s_specials():
    from desktop_app.core.training import TrainConfig, model_config_for

    task = make_task("translate", encoder_decoder=True)
    for family in ("marian", "t5"):  # their presets' own ids (Marian: pad 0, eos 1, start 0) give way
        cfg = model_config_for(TrainConfig(task="translate", family=family, model={"d_model": 48}), task)
        assert cfg.is_encoder_decoder and cfg.vocab_size == task.vocab_size
        assert (cfg.pad_token_id, cfg.decoder_start_token_id, cfg.eos_token_id) == (0, 1, 2)
        assert [task.tokenizer.tok.id_to_token(i) for i in (0, 1, 2)] == ["<pad>", "[START]", "[END]"]


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_a_resumed_seq2seq_run_equals_the_straight_one(tmp_path, family):
    """Half the steps, then a resume to the end, gives the straight run's weights bit for bit (the task is
    rebuilt as its encoder-decoder version from the loaded model's config)."""
    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.core.training import TrainConfig, checkpoint_step, train

    base = dict(task="translate", family=family, model={"n_layers": 1, "n_heads": 2, "d_model": 32, "d_ff": 64,
                                                         "dropout": 0.1},
                schedule="constant", warmup_steps=0, lr=3e-3, batch_size=16, log_every=4, eval_every=8,
                checkpoint_every=8)
    summary = train(TrainConfig(**base, steps=8), tmp_path / "straight")
    train(TrainConfig(**base, steps=4), tmp_path / "split")
    resumed = train(TrainConfig(**base, steps=8), tmp_path / "split", resume=True)
    assert checkpoint_step(tmp_path / "split") == 8
    for key in ("val_loss", "val_accuracy", "val_exact_match", "train_loss"):  # (train_accuracy: since the resume)
        assert resumed[key] == summary[key], key
    a, b = (load_model_folder(tmp_path / d).model.state_dict() for d in ("straight", "split"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_decoder_layers_are_an_encoder_decoders_only():
    """--decoder-layers (model.n_decoder_layers) sizes an encoder-decoder's decoder; given for a family with one
    stack it is refused in one line instead of being dropped silently."""
    from desktop_app.core.training.trainer import TrainConfig, model_config_for

    cfg = model_config_for(TrainConfig(task="sort", family="marian", model={"n_layers": 3, "n_decoder_layers": 1}))
    assert (cfg.n_layers, cfg.n_decoder_layers) == (3, 1)
    with pytest.raises(ValueError, match=r"^decoder layers .* the gpt2 family has one stack") as exc:
        model_config_for(TrainConfig(task="sort", family="gpt2", model={"n_layers": 2, "n_decoder_layers": 2}))
    assert "\n" not in str(exc.value)
