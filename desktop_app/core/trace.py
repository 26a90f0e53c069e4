"""Trace: what one forward pass recorded, under uniform, predictable names.

Names (l = layer index, 0-based):
    embed                       embedding output (Hugging Face hidden_states[0])      [B, T, d]
    blocks.l.attn.input         what the attention sublayer receives                  [B, T, d]
    blocks.l.attn.q             queries, after rotary positions                       [B, H, T, d_head]
    blocks.l.attn.pattern       attention probabilities                               [B, H, T_q, T_k]
    blocks.l.attn.head_out      each head's contribution after W_O (no o-bias)        [B, H, T, d]
    blocks.l.attn.out           attention sublayer output, before the residual add    [B, T, d]
    blocks.l.resid_mid          residual stream after attention (post-LN: after norm) [B, T, d]
    blocks.l.mlp.out            MLP output, before the residual add                   [B, T, d]
    blocks.l.resid_post         output of block l (Hugging Face hidden_states[l + 1]) [B, T, d]
    blocks.l.logit_lens         final norm + unembedding applied to resid_post        [B, T, vocab]
    final_norm.out              last block's output after the final norm (GPT-2, LLaMA) [B, T, d]
    logits                      the model's logits                                    [B, T, vocab]

A Trace is created with glob patterns (fnmatch) of the names to keep; the model asks `wants(name)`
before computing anything only a trace needs, so names nobody asked for cost nothing.
"""
from __future__ import annotations

import fnmatch
from typing import Iterable, Iterator

import torch


class Trace:
    def __init__(self, names: Iterable[str] = ("*",), to_cpu: bool = False) -> None:
        self.patterns = tuple(names)
        self.to_cpu = to_cpu
        self.tensors: dict[str, torch.Tensor] = {}
        self._wants: dict[str, bool] = {}

    def wants(self, name: str) -> bool:
        hit = self._wants.get(name)
        if hit is None:
            hit = any(fnmatch.fnmatchcase(name, p) for p in self.patterns)
            self._wants[name] = hit
        return hit

    def record(self, name: str, tensor: torch.Tensor) -> None:
        if self.wants(name):
            t = tensor.detach()
            self.tensors[name] = t.cpu() if self.to_cpu else t

    # -- read access ---------------------------------------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{name!r} was not recorded (recorded: {', '.join(sorted(self.tensors)) or 'nothing'})") from None

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def keys(self):
        return self.tensors.keys()

    def items(self):
        return self.tensors.items()

    @property
    def n_layers(self) -> int:
        layers = {int(k.split(".")[1]) for k in self.tensors if k.startswith("blocks.")}
        return max(layers) + 1 if layers else 0

    def pattern(self, layer: int) -> torch.Tensor:
        return self[f"blocks.{layer}.attn.pattern"]

    def hidden_states(self) -> list[torch.Tensor]:
        """Hugging Face's hidden_states: [embed, block 0 output, ..., block L-1 output].

        As in Hugging Face, the last entry is taken after the final norm when the model has one.
        """
        hs = [self["embed"]] + [self[f"blocks.{l}.resid_post"] for l in range(self.n_layers)]
        if "final_norm.out" in self.tensors:
            hs[-1] = self["final_norm.out"]
        return hs
