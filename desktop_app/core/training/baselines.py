"""The lectures' MLP baseline for the motif task: embedding 32, 20*32 -> 64 -> 4.

Trained on the same batches and scored on the same held-out set as the transformer, so the two
accuracies compare (lectures: 56.4% for the MLP, 95.6% for the 3-block, 1-head transformer).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

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
                    n_train: int | None = None, weight_decay: float = 0.0) -> dict:
    """Train the MLP on the motif task; returns {parameters, train_loss, val_accuracy}."""
    torch.manual_seed(seed)
    task = MotifTask(n_train=n_train)
    model = MotifMLP()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        b = task.train_batch(batch_size, gen)
        loss = F.cross_entropy(model(b.inputs), b.targets[:, -1])
        opt.zero_grad()
        loss.backward()
        opt.step()
    val = task.val_set(seed)
    with torch.no_grad():
        acc = (model(val.inputs).argmax(-1) == val.targets[:, -1]).float().mean().item()
    return {"parameters": sum(p.numel() for p in model.parameters()), "train_loss": float(loss.detach()),
            "val_accuracy": acc}
