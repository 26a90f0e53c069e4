"""Beam search, one rule for decoders and encoder-decoders alike: transformers' generate(num_beams=...).

Each step takes the K = max(2, 1 + stop tokens) x width best continuations of the running beams (score:
the sum of the generated tokens' log-probabilities, after the folder's generation rules); those among the
best `width` that end with a stop token join the finished hypotheses, scored score / generated
length ** length_penalty (the best `width` kept), and the best `width` others run on. The search is done
when (early_stopping True) `width` hypotheses have finished, or (False, "never") once `width` have, when
the best running beam, scored at its own length (False) or at the longest it may become ("never", with a
positive length penalty), cannot beat the worst finished one. The result is the best of the finished and
running hypotheses by that score (generate finishes the running ones at max_length). Transformers'
_beam_search, _check_early_stop_heuristic and _update_finished_beams (generation/utils.py).

BeamSearch is mixed into GenerationSession (session.py), whose tree (tree.py) holds every beam's node.
"""
from __future__ import annotations

import torch

from .sampling import ContextLengthReached, GenerationError, process_logits
from .tree import Node


class BeamSearch:
    """The beam-search state and step of a GenerationSession: beams (running), finished_beams, their history."""

    def _start_beams(self, node: Node) -> None:
        """Beam search from `node`: its only beam, no history, no finished hypothesis."""
        self.beams: list[Node] = [node]
        self._beam_history: list[list[Node]] = []
        self.finished_beams: list[Node] = []  # ended by a stop token, best first
        self._finished_history: list[tuple[list[Node], bool]] = []
        self._beam_done = False

    def _leave_beam_mode(self) -> None:
        if self.settings.strategy == "beam":
            self._start_beams(self.current)

    def _beams_back(self) -> bool:
        """Back to the previous set of beams; False when there is none."""
        if not self._beam_history:
            return False
        self.beams = self._beam_history.pop()
        self.finished_beams, self._beam_done = self._finished_history.pop()
        self.current = self._best_beam()
        return True

    def _length_score(self, node: Node) -> float:
        """A hypothesis's score: its log-probability / generated length ** length_penalty."""
        return node.score / max(node.depth, 1) ** self.settings.length_penalty

    def _best_beam(self) -> Node:
        """The best of the finished and running hypotheses (what generate returns when it stops here)."""
        return max(self.finished_beams + self.beams, key=self._length_score)

    @property
    def _beams_finished(self) -> bool:
        return self._beam_done or not any(not b.stop for b in self.beams)

    def _beam_step(self) -> Node:
        s = self.settings
        width = s.beams
        live = [b for b in self.beams if not b.stop]
        if self._beam_done or not live:
            raise GenerationError("beam search is done: no running beam can beat the finished ones")
        ctx = self.model.cfg.context_length
        if any(b.position + 1 >= ctx for b in live):
            raise ContextLengthReached(f"the context length ({ctx} tokens) is reached")
        # generate's processors on each beam's log-probabilities (its _beam_search), then the beam's score
        logits = [b.next_logits for b in live]  # (each a cast to float32 in half precision: read once)
        ruled = [self._ruled(b, torch.log_softmax(x.double(), 0)) for b, x in zip(live, logits)]
        logp = torch.stack([b.score + r for b, r in zip(live, ruled)])
        V = logp.shape[1]
        keep = max(2, 1 + len(self.stop_tokens)) * width
        top = torch.topk(logp.reshape(-1), min(keep, logp.numel())).indices.tolist()
        picked: list[tuple[int, int]] = []  # (live beam, token)
        running = 0
        for rank, idx in enumerate(top):
            token = idx % V
            if token in self.stop_tokens:
                if rank < width:  # a stop among the best `width` finishes a hypothesis
                    picked.append((idx // V, token))
            elif running < width:
                picked.append((idx // V, token))
                running += 1
        created: list[Node] = []
        children: list[tuple[Node, Node]] = []
        for i, token in picked:
            b = live[i]
            child, new = self._new_child(b, token, process_logits(logits[i]), "beam",
                                         lp=float(ruled[i][token]) if self.rules.changes_logits else None)
            if new:
                created.append(child)
            children.append((b, child))
        to_forward = [(b, c) for b, c in children if c.next_logits is None]
        if to_forward:
            self._forward_children(to_forward, created)
        self._beam_history.append(self.beams)
        self._finished_history.append((self.finished_beams, self._beam_done))
        finished = self.finished_beams + [c for _, c in children if c.stop]
        self.finished_beams = sorted(finished, key=self._length_score, reverse=True)[:width]
        self.beams = [c for _, c in children if not c.stop]
        self._beam_done = not self.beams or (len(self.finished_beams) == width and not self._improvable())
        self.current = self._best_beam()
        return self.current

    def _improvable(self) -> bool:
        """generate's early-stop heuristic, once `width` hypotheses have finished: can the best running beam
        still beat the worst finished one?"""
        s = self.settings
        if s.early_stopping is True:
            return False
        best = max(self.beams, key=lambda b: b.score)
        length = best.depth  # the generated length so far
        if s.early_stopping == "never" and s.length_penalty > 0:  # the longest it may become
            length = (self.max_length or self.model.cfg.context_length) - len(self.prompt)
        return best.score / length ** s.length_penalty > self._length_score(self.finished_beams[-1])

    def _forward_children(self, pairs: list, created: list) -> None:
        """One batched decoder step for each (parent, child) pair of a beam step: the children's tokens on
        their parents' caches, their next logits and records kept (a child that has them keeps them); a
        failure undoes the children this step created."""
        parents = [p for p, _ in pairs]
        try:
            self._sync_cache_batch(parents)
            tokens = torch.tensor([[c.token] for _, c in pairs], device=self.model.device)
            logits, records = self._forward(tokens, parents)
        except BaseException:
            self._undo(created)
            raise
        for i, (_, c) in enumerate(pairs):
            if c.next_logits is None:
                c.next_logits, c.record = logits[i], records[i]
        if self.incremental:
            self._cache_nodes = [c for _, c in pairs]
