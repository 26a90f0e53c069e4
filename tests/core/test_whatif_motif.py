"""Issue 19's "done means", on a motif model trained here: zero-ablating the head that matters most
drops the accuracy to near chance, and activation patching's layer x head map recovers the most at
that same head. Also the two gaps of the generation sessions: a step's rebuilt head outputs and
masked filling both follow the interventions."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder, new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.generation import GenerationSession, GenerationSettings, MaskedFillSession
from desktop_app.core.interventions import Intervention, activation_patching
from desktop_app.core.training import TrainConfig, train
from desktop_app.core.training.tasks import MotifTask, motif_label


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_generation_step_trace_shows_the_ablated_head_as_zero():
    cfg = ModelConfig.gpt2(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=32)
    model = new_model(cfg, seed=0).eval()
    ablate = [Intervention("blocks.1.attn.head.3")]
    s = GenerationSession(model, [1, 2, 3, 4, 5], GenerationSettings(), interventions=ablate)
    s.step(), s.step()
    trace, ids = s.step_trace()
    assert trace["blocks.1.attn.head_out"][0, 3].abs().max() == 0
    # the other heads' rebuilt outputs are the edited model's own, recorded in one full forward
    _, full = model.run_with_trace(torch.tensor([ids]), names=["blocks.*.attn.head_out"], interventions=ablate)
    torch.testing.assert_close(trace["blocks.1.attn.head_out"], full["blocks.1.attn.head_out"], atol=1e-5, rtol=1e-4)


def test_masked_fill_applies_the_interventions():
    cfg = ModelConfig.bert(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=32)
    model = new_model(cfg, seed=0).eval()
    ids, masked = [3, 7, 9, 11, 13, 15], [2, 4]
    plain = MaskedFillSession(model, ids, masked, mask_token_id=1)
    edited = MaskedFillSession(model, ids, masked, mask_token_id=1, interventions=[Intervention("blocks.0.mlp.out", "mean")])
    assert not torch.allclose(plain.all_logits(), edited.all_logits())
    seq = torch.tensor([edited.ids()])
    from desktop_app.core.interventions import resolve
    with torch.no_grad():
        want = model(seq, interventions=resolve(model, edited.ids(), [Intervention("blocks.0.mlp.out", "mean")])).logits[0]
    torch.testing.assert_close(edited.all_logits(), want.float())


def _accuracy(model, x: torch.Tensor, labels: torch.Tensor, interventions=None) -> float:
    with torch.no_grad():
        logits = model(x, interventions=interventions).logits[:, -1]
    return float((logits.argmax(-1) == labels).float().mean())


@pytest.mark.slow
def test_motif_head_ablation_and_patching_agree(tmp_path):
    """A motif model (2 blocks, 1 head, width 32). The label is the letter right after the last A, so
    never A itself: chance is 1/3. Where the last A is the second-to-last token the answer is the last
    token, which the model sees without reading the sequence (a guess of the last token is right on
    about half of all sequences); elsewhere it must be read from the position after the last A. The
    head that reads it (the one whose last row attends most to that position) is found from the
    attention patterns; ablating it leaves chance where the answer must be read, and patching's
    layer x head map recovers the most at that same head."""
    started = time.perf_counter()
    # the README's What if motif model; at lr 3e-3 seed 0 ended at 87% with neither head reading the answer
    # (which model a seed gives is fragile at this size: README)
    cfg = TrainConfig(task="motif", family="gpt2", model={"n_layers": 2, "n_heads": 1, "d_model": 32, "d_ff": 64,
                                                          "context_length": 20},
                      lr=1e-3, steps=3000, warmup_steps=50, batch_size=64, eval_every=3000, checkpoint_every=100_000,
                      log_every=500, seed=0)
    summary = train(cfg, tmp_path / "motif")
    trained = time.perf_counter()
    loaded = load_model_folder(tmp_path / "motif")
    model = loaded.model.eval()
    task = MotifTask()
    x = task._instances(2000, torch.Generator().manual_seed(1))
    labels = torch.tensor([motif_label(r.tolist()) for r in x])
    letters = [loaded.tokenizer.encode(c)[0] for c in MotifTask.LETTERS]
    x, labels = torch.tensor(letters)[x], torch.tensor(letters)[labels]  # task ids -> the tokenizer's ids
    base = _accuracy(model, x, labels)
    assert base > 0.95, (base, summary)
    read = x[:, -2] != letters[0]  # the answer is not the last token: it must be read from elsewhere
    after_last_a = torch.tensor([max(i for i, t in enumerate(r) if t == letters[0]) + 1 for r in x.tolist()])

    L, H = model.cfg.n_layers, model.cfg.n_heads
    with torch.no_grad():
        _, trace = model.run_with_trace(x[read], names=["blocks.*.attn.pattern"])
    rows = torch.arange(int(read.sum()))
    to_answer = np.array([[float(trace[f"blocks.{l}.attn.pattern"][rows, h, -1, after_last_a[read]].mean())
                           for h in range(H)] for l in range(L)])  # mean attention, last position -> the answer
    reader = np.unravel_index(int(np.argmax(to_answer)), to_answer.shape)
    assert to_answer[reader] > 0.4, to_answer

    edits = {(l, h): [Intervention(f"blocks.{l}.attn.head.{h}")] for l in range(L) for h in range(H)}
    ablated = np.array([[_accuracy(model, x[read], labels[read], edits[l, h]) for h in range(H)] for l in range(L)])
    ablated_all = _accuracy(model, x, labels, edits[tuple(reader)])
    chance = 1 / 3  # the label is B, C or D, uniformly
    last_token_guess = float((x[:, -1] == labels).float().mean())  # the best a model blind to the rest gets
    assert ablated[reader] < chance + 0.06, (ablated, to_answer)
    assert ablated_all < last_token_guess + 0.03, (ablated_all, last_token_guess)

    # patching: clean vs the same text with the letter after the last A changed; metric logit[clean] - logit[other]
    recoveries = []
    for row in x[read][:12].tolist():
        last_a = max(i for i, t in enumerate(row) if t == letters[0])
        clean_answer = row[last_a + 1]
        other = next(t for t in letters[1:] if t != clean_answer)
        corrupted = list(row)
        corrupted[last_a + 1] = other
        res = activation_patching(loaded, row, corrupted, clean_answer, other)
        recoveries.append(res.heads)
    heads = np.mean(recoveries, axis=0)
    best = np.unravel_index(int(np.argmax(heads)), heads.shape)
    elapsed = time.perf_counter() - started
    print(f"\nmotif: accuracy {base:.3f}; attention from the last position to the answer {to_answer.round(3).tolist()}; "
          f"where the answer must be read ({int(read.sum())} of {len(x)}), zero-ablated accuracy per layer x head "
          f"{ablated.round(3).tolist()} (chance {chance:.3f}); on all sequences {ablated_all:.3f} with the reader "
          f"ablated (last-token guess {last_token_guess:.3f}); mean head recovery over {len(recoveries)} pairs "
          f"{heads.round(3).tolist()}; training {trained - started:.1f} s, all {elapsed:.1f} s")
    assert tuple(best) == tuple(reader), (to_answer, ablated, heads)
