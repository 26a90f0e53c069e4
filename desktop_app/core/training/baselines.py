"""The lectures' MLP baseline for the motif task: embedding 32, 20*32 -> 64 -> 4.

Trained on the same batches and scored on the same held-out set as the transformer, so the two
accuracies compare (lectures: 56.4% for the MLP, 95.6% for the 3-block, 1-head transformer).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..jobs import JobControl
from .tasks import MotifTask


class MotifMLP(nn.Module):
    def __init__(self, length: int = 20, vocab: int = 4, d: int = 32, hidden: int = 64, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.hidden = nn.Linear(length * d, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.hidden(self.embed(x).flatten(1))))


def train_motif_mlp(steps: int = 3000, batch_size: int = 64, lr: float = 1e-3, seed: int = 0,
                    n_train: int | None = None, weight_decay: float = 0.0, length: int = 20,
                    eval_every: int | None = None, log_every: int = 10,
                    on_event: Callable[[dict], None] | None = None, control: JobControl | None = None) -> dict:
    """Train the MLP on the motif task; returns {parameters, train_loss, train_accuracy, val_loss, val_accuracy}.

    Emits the trainer's events ("start", "step", "eval", "done", or "stopped" when `control` cancels;
    "paused"/"resumed" with a TrainControl) so the Train panel plots it like a transformer run.
    train_loss is the last batch's loss; train_accuracy counts the training batches since the last
    evaluation. Nothing is written to disk.
    """
    from .loop import Loop, Run, RunConfig
    from .trainer import SUMMARY_KEYS, grad_norms

    emit = on_event or (lambda ev: None)
    torch.manual_seed(seed)
    task = MotifTask(length=length, n_train=n_train)
    model = MotifMLP(length=length)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    val = task.val_set(seed)
    groups = {name: list(m.parameters()) for name, m in model.named_children()}
    n_params = sum(p.numel() for p in model.parameters())
    emit({"event": "start", "step": 0, "steps": steps, "parameters": n_params, "task": task.describe(),
          "model": {"baseline": "mlp", "length": length, "d": 32, "hidden": 64}, "out": None, "world_size": 1,
          "device": "cpu"})
    summary: dict = {"step": 0, **{k: None for k in SUMMARY_KEYS}, "parameters": n_params}

    class MLPRun(Run):  # nothing is written: no checkpoints
        correct = scored = window_n = 0
        window_loss = 0.0
        per_layer: dict | None = None

        def step(self, loop: Loop) -> None:
            b = task.train_batch(batch_size, gen)
            logits = model(b.inputs)
            loss = F.cross_entropy(logits, b.targets[:, -1])
            self.correct += int((logits.argmax(-1) == b.targets[:, -1]).sum())
            self.scored += len(b)
            opt.zero_grad()
            loss.backward()
            self.per_layer = grad_norms(groups) if loop.logs(loop.step) else None
            opt.step()
            self.window_loss += float(loss.detach())
            self.window_n += 1
            summary.update(step=loop.step, train_loss=float(loss.detach()), train_accuracy=self.correct / self.scored)

        def log(self, loop: Loop) -> None:
            step, elapsed = loop.step, loop.elapsed
            emit({"event": "step", "step": step, "steps": steps, "train_loss": self.window_loss / self.window_n,
                  "train_accuracy": self.correct / self.scored, "lr": lr,
                  "grad_norm": math.sqrt(sum(v * v for v in self.per_layer.values())), "grad_norms": self.per_layer,
                  "tokens_per_s": step * batch_size * length / max(elapsed, 1e-9), "elapsed": elapsed,
                  "eta": loop.eta})
            self.window_loss, self.window_n = 0.0, 0

        def evaluate(self, loop: Loop) -> None:
            with torch.no_grad():
                val_logits = model(val.inputs)
                val_loss = float(F.cross_entropy(val_logits, val.targets[:, -1]))
                val_acc = (val_logits.argmax(-1) == val.targets[:, -1]).float().mean().item()
            summary.update(val_loss=val_loss, val_accuracy=val_acc)
            emit({"event": "eval", "step": loop.step, "val_loss": val_loss, "val_accuracy": val_acc,
                  "train_accuracy": self.correct / self.scored, "elapsed": loop.elapsed})
            self.correct = self.scored = 0

    loop = Loop(RunConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed, log_every=log_every,
                          eval_every=eval_every or steps, checkpoint_every=steps))
    if loop.run(MLPRun(), control, emit):
        emit({"event": "stopped", "step": loop.step, **{k: summary[k] for k in SUMMARY_KEYS}})
        return summary
    emit({"event": "done", **summary, "elapsed": loop.elapsed})
    return summary
