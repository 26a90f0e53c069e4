"""Task generators against hand-checked samples and independent re-derivations."""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.training.tasks import (IGNORE, InductionTask, ModAddTask, MotifTask, SequenceTask, TaskError,
                                             TextTask, heldout, make_task, motif_label, read_text_file)


def letters(row) -> str:
    return "".join("ABCD"[int(t)] for t in row)


def test_motif_label_hand_checked():
    enc = lambda s: ["ABCD".index(c) for c in s]  # noqa: E731
    assert motif_label(enc("BACAD")) == 3  # last A at index 3, then D
    assert motif_label(enc("ABBBB")) == 1  # the only A is first: B follows
    assert motif_label(enc("BCDBA")) is None  # the last A is the final letter: no label
    assert motif_label(enc("BCDBC")) is None  # no A at all
    assert motif_label(enc("AAAAC")) == 2


def test_motif_batches_label_the_letter_after_the_last_a():
    task = MotifTask()
    batch = task.train_batch(200, torch.Generator().manual_seed(1))
    assert batch.inputs.shape == (200, 20)
    assert (batch.targets[:, :-1] == IGNORE).all()
    for row, label in zip(batch.inputs, batch.targets[:, -1]):
        s = letters(row)
        i = s.rfind("A")  # an independent re-derivation with string search
        assert 0 <= i < 19
        assert "ABCD"[int(label)] == s[i + 1]
    assert set(batch.targets[:, -1].tolist()) <= {1, 2, 3}  # never A, by definition
    assert task.tokenizer.token_strings([0, 1, 2, 3]) == ["A", "B", "C", "D"]


@pytest.mark.parametrize("name, answer", [("copy", [3, 1, 2]), ("reverse", [2, 1, 3]), ("sort", [1, 2, 3])])
def test_sequence_tasks_hand_checked(name, answer):
    task = SequenceTask(name, length=3, symbols=5)
    b = task._encode(torch.tensor([[3, 1, 2]]))
    sep = 5
    assert b.inputs.tolist() == [[3, 1, 2, sep] + answer[:2]]
    assert b.targets.tolist() == [[IGNORE, IGNORE, IGNORE] + answer]


def test_sequence_tasks_random_batches_match_python():
    gen = torch.Generator().manual_seed(0)
    for name, f in (("copy", list), ("reverse", lambda s: s[::-1]), ("sort", sorted)):
        task = SequenceTask(name, length=6, symbols=7)
        b = task.train_batch(50, gen)
        for x, y in zip(b.inputs, b.targets):
            src = x[:6].tolist()
            assert y[6:].tolist() == list(f(src))
            assert (y[:6] == IGNORE).all()


def test_modadd_hand_checked_and_split_disjoint():
    task = ModAddTask(p=7, train_fraction=0.5)
    b = task._encode(torch.tensor([[5, 4], [0, 6]]))
    assert b.inputs.tolist() == [[5, 7, 4, 8], [0, 7, 6, 8]]  # '5 + 4 =' with + = 7, = = 8
    assert b.targets[:, -1].tolist() == [2, 6]  # 9 mod 7 = 2, 6 mod 7 = 6
    assert task.tokenizer.decode(b.inputs[0].tolist()) == "5 + 4 ="
    train = {tuple(p) for p in task.train_pairs.tolist()}
    val = {tuple(p) for p in task.val_pairs.tolist()}
    assert not train & val and len(train | val) == 49


def test_induction_second_copy_is_the_target():
    task = InductionTask(length=5, symbols=9)
    inst = torch.tensor([[4, 0, 8, 8, 2]])
    b = task._encode(inst)
    assert b.inputs.tolist() == [[4, 0, 8, 8, 2, 4, 0, 8, 8]]
    assert b.targets.tolist() == [[IGNORE] * 4 + [4, 0, 8, 8, 2]]


def test_induction_with_a_length_range_needs_an_induction_head():
    """min_length: each sequence repeats a half of its own length after random tokens; a scored target is
    always the token right after the earlier occurrence of the current position's copy, and no fixed
    look-back distance predicts the targets of all sequences (issue 30: a fixed-offset head solved the
    fixed-length task)."""
    task = make_task("induction", {"length": 10, "symbols": 50, "min_length": 3})
    assert task.seq_len == 19 and task.describe()["min_length"] == 3
    b = task.train_batch(400, torch.Generator().manual_seed(0))
    periods = set()
    for x, y in zip(b.inputs, b.targets):
        seq = torch.cat([x, y[-1:]])  # the whole sequence: the inputs and the last target
        scored = (y != IGNORE).nonzero().flatten()
        p = len(scored) + 1  # the repeat's tokens after its first
        assert 3 <= p <= 10 and scored.tolist() == list(range(20 - p, 19))
        assert torch.equal(seq[20 - p:], seq[20 - 2 * p: 20 - p])  # the last p tokens repeat the p before
        assert torch.equal(y[scored], x[scored - p + 1])  # target = the token after the earlier occurrence
        periods.add(p)
    assert periods == set(range(3, 11))
    scored = b.targets != IGNORE
    for offset in range(0, 19):  # a head copying the token `offset` back is right on few of the targets
        hits = b.inputs[:, : 19 - offset] == b.targets[:, offset:]
        assert hits[scored[:, offset:]].sum() < 0.3 * scored.sum(), offset
    with pytest.raises(TaskError, match="min_length"):
        make_task("induction", {"length": 10, "min_length": 11})


@pytest.mark.parametrize("name", ["motif", "copy", "sort", "induction"])
def test_heldout_split_never_leaks_into_training(name):
    task = make_task(name)
    val = task.val_set(0)
    assert torch.equal(val.inputs, task.val_set(0).inputs)  # fixed
    train = task.train_batch(300, torch.Generator().manual_seed(3))
    n_inst = {"motif": 20, "copy": task.seq_len // 2, "sort": task.seq_len // 2,
              "induction": getattr(task, "length", 0)}[name]
    val_set = {tuple(r[:n_inst].tolist()) for r in val.inputs}
    assert all(heldout(r[:n_inst]) for r in val.inputs)
    assert not any(heldout(r[:n_inst]) for r in train.inputs)
    assert not val_set & {tuple(r[:n_inst].tolist()) for r in train.inputs}


TEXT = "the cat sat on the mat. " * 40


def test_text_clm_targets_are_the_next_tokens():
    task = TextTask(TEXT, tokenizer="char", seq_len=16)
    b = task.train_batch(4, torch.Generator().manual_seed(0))
    assert torch.equal(b.inputs[:, 1:], b.targets[:, :-1])
    decoded = task.tokenizer.decode(b.inputs[0].tolist())
    assert decoded in TEXT
    # the held-out tokens are the last 10% of the text, never inside the training part
    assert len(task.val_ids) + len(task.train_ids) == len(TEXT)
    assert task.tokenizer.decode(task.val_ids.tolist()) == TEXT[len(task.train_ids):]


def test_text_mlm_masks_about_fifteen_percent():
    task = TextTask(TEXT * 5, tokenizer="char", seq_len=64, objective="mlm")
    b = task.train_batch(64, torch.Generator().manual_seed(0))
    scored = b.targets != IGNORE
    assert 0.12 < scored.float().mean().item() < 0.18
    assert (b.inputs[~scored] != task.mask_id).all()  # only chosen positions are masked
    assert (b.inputs[scored] == task.mask_id).float().mean().item() > 0.7  # 80% of them
    # targets hold the original tokens: unmasked positions plus targets rebuild a real window
    rebuilt = torch.where(scored, b.targets, b.inputs)[0]
    assert task.tokenizer.decode(rebuilt.tolist()) in TEXT * 5


def test_text_bpe_tokenizer_has_the_asked_vocabulary():
    task = TextTask(TEXT * 3, tokenizer="bpe", vocab_size=300, seq_len=16)
    assert 257 < task.vocab_size <= 300


def test_bad_text_files_name_the_file(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(TaskError, match="empty.txt.*empty"):
        read_text_file(empty)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    with pytest.raises(TaskError, match="latin1.txt.*UTF-8"):
        read_text_file(latin)
    short = tmp_path / "short.txt"
    short.write_text("tiny")
    with pytest.raises(TaskError, match="short.txt.*too few"):
        make_task("text", {"text_file": str(short), "seq_len": 64})
    with pytest.raises(TaskError, match="unknown task"):
        make_task("chess")


class RotateTask(SequenceTask):
    """seq | seq rotated right by one (the README's example of adding a task)."""

    def answer(self, inst: torch.Tensor) -> torch.Tensor:
        return inst.roll(1, dims=-1)


@pytest.fixture
def declared_rotate():
    """The README's declaration of the rotate task, for one test (the registry is left as it was)."""
    from desktop_app.core.training import tasks

    @tasks.declare_task("rotate", options=("length", "symbols"))
    def make_rotate(options, causal, tokenizer):
        return RotateTask("rotate", **options)

    yield
    del tasks.DECLARED_TASKS["rotate"]


def test_a_declared_task_is_offered_by_the_cli_and_the_train_panel(qtbot, declared_rotate):
    from desktop_app.cli import build_parser
    from desktop_app.core.training import tasks
    from desktop_app.ui.panels.training import TrainingPanel
    from desktop_app.ui.state import AppState

    assert "rotate" in tasks.task_names() and "rotate" not in tasks.image_task_names()
    task = make_task("rotate", {"length": 3, "symbols": 5})
    batch = task.train_batch(4, torch.Generator().manual_seed(0))
    assert torch.equal(batch.targets[:, 3:], batch.inputs[:, :3].roll(1, dims=-1))  # the answer follows "|"
    assert tasks.task_dimensions("rotate", {"length": 3, "symbols": 5}) == (task.vocab_size, 6)

    args = build_parser().parse_args(["train", "--task", "rotate", "--steps", "5", "--out", "runs/x"])
    assert args.task == "rotate"
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.task.setCurrentText("rotate")
    assert panel.task.currentText() == "rotate"
    shown = [name for name, box in panel.form._task_rows.items() if panel.task_form.isRowVisible(box)]
    assert shown == ["length", "symbols"]  # the declaration's option boxes
    assert panel.config().task == "rotate"
