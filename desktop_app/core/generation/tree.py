"""The history tree of a generation: its nodes, and moving through them (back, goto, the branches).

Every node holds the token, its probability, the logits of the next-token distribution (so views can
re-process them with other temperature/top-k/top-p without running the model) and what the forward that
consumed the token recorded. HistoryTree is mixed into GenerationSession (session.py), which makes the nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .sampling import GenerationError


class BatchRow(dict):
    """A node's records as stored, each [1, ...] in the model's dtype (a one-row step's as its forward left
    them; a beam's, its row copied): given to Node.record, which makes the float32 tensors [...] every reader
    gets at the node's first read. A select and a cast a record, ~150 a step at 24 layers, made only for a node
    something reads; a bfloat16 history holds half a float32 one's bytes (the cast is exact: the same values)."""


@dataclass(eq=False)
class Node:
    """One token of the history tree (the root is the prompt)."""
    token: int | None  # None for the root
    parent: "Node | None"
    position: int  # index of this token in the sequence (root: prompt length - 1)
    prob: float = 1.0  # probability it had in the distribution it was picked from (as processed)
    model_prob: float = 1.0  # probability the model gave it (T = 1, no filtering)
    score: float = 0.0  # cumulative log model-probability of the generated tokens (beam score)
    how: str = ""  # greedy, sampled, chosen, beam
    stop: bool = False  # a stop token: nothing follows
    children: list["Node"] = field(default_factory=list)
    # next_logits and record (below) as the session filled them; `compute`, when set, fills them at their first
    # read (the forward that consumes the last token of a run is made only when something reads it)
    _next_logits: torch.Tensor | None = field(default=None, repr=False)  # [V] in the model's dtype
    _record: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    _rows: BatchRow | None = field(default=None, repr=False)  # the records until read (record)
    compute: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def next_logits(self) -> torch.Tensor | None:
        """[V] float32 CPU: the logits of the distribution after this token. Kept in the model's dtype (a bfloat16
        history's larger part: 0.3 MB a token at a 151,936-token vocabulary, not float32's 0.6), made float32 at
        each read (exact: the values every reader had; the tensor kept when it is float32 already)."""
        if self.compute is not None:
            self.compute()
        logits = self._next_logits
        return None if logits is None else logits.float()

    @next_logits.setter
    def next_logits(self, value: torch.Tensor | None) -> None:
        self._next_logits = value

    @property
    def record(self) -> dict[str, torch.Tensor]:
        """What the forward that consumed this token recorded, float32 (batch dim dropped; empty without
        recording)."""
        if self.compute is not None:
            self.compute()
        rows = self._rows
        if rows is not None:  # (another thread reading at once makes the same values)
            self._record, self._rows = {name: t[0].float() for name, t in rows.items()}, None
        return self._record

    @record.setter
    def record(self, value: dict[str, torch.Tensor] | BatchRow) -> None:
        self._rows, self._record = (value, {}) if isinstance(value, BatchRow) else (None, value)

    def kept_records(self) -> dict[str, torch.Tensor]:
        """The records as kept, each [1, ...]: in the model's dtype until the node is read (then float32). For a
        reader that joins many nodes' records and makes float32 once (step_trace), leaving each node as it is."""
        if self.compute is not None:
            self.compute()
        rows = self._rows
        return rows if rows is not None else {name: t[None] for name, t in self._record.items()}

    def path(self) -> list["Node"]:
        out, n = [], self
        while n is not None:
            out.append(n)
            n = n.parent
        return out[::-1]

    def child(self, token: int) -> "Node | None":
        for c in self.children:
            if c.token == token:
                return c
        return None

    @property
    def depth(self) -> int:
        """Generated tokens from the root to here."""
        d, n = 0, self
        while n.parent is not None:
            d, n = d + 1, n.parent
        return d


class HistoryTree:
    """The tree's reading and moving (GenerationSession's): the root is the prompt, `current` the node shown."""
    prompt: list[int]
    root: Node
    current: Node
    stop_reason: str | None

    def ids(self, node: Node | None = None) -> list[int]:
        """Prompt + generated ids up to `node` (default: the current node)."""
        node = self.current if node is None else node
        return self.prompt + [n.token for n in node.path()[1:]]

    def generated(self, node: Node | None = None) -> list[Node]:
        return (self.current if node is None else node).path()[1:]

    def back(self) -> Node:
        """Go to the previous token (beam search: the previous set of beams)."""
        if not (self.settings.strategy == "beam" and self._beams_back()) and self.current.parent is not None:
            self.current = self.current.parent
        self.stop_reason = None
        return self.current

    def goto(self, node: Node) -> Node:
        """Make any node of this tree current (e.g. another branch)."""
        if node.path()[0] is not self.root:
            raise GenerationError("that node belongs to another generation")
        self.current = node
        self._start_beams(node)
        self.stop_reason = None
        return node

    def node_at(self, tokens: Sequence[int]) -> Node | None:
        """The node reached from the root by these generated tokens (None if the tree has no such path)."""
        node = self.root
        for t in tokens:
            node = node.child(int(t))
            if node is None:
                return None
        return node

    def held_bytes(self) -> dict[str, int]:
        """The bytes the tree's nodes hold, by part: every node's next-token logits and its records as kept (in
        the model's dtype until read, float32 after), each storage counted once (a beam step's logits rows
        share one). A node whose forward waits (run's lazy last) holds nothing yet; the KV cache is not counted."""
        held, seen = {"logits": 0, "records": 0}, set()
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            rows = node._rows if node._rows is not None else node._record
            for part, tensors in (("logits", [node._next_logits]), ("records", rows.values())):
                for t in tensors:
                    storage = None if t is None else t.untyped_storage()
                    if storage is not None and storage.data_ptr() not in seen:
                        seen.add(storage.data_ptr())
                        held[part] += storage.nbytes()
        return held

    def branches(self) -> list[Node]:
        """Leaves of the tree (each is the end of one branch), oldest first."""
        out: list[Node] = []

        def walk(n: Node) -> None:
            if not n.children:
                out.append(n)
            for c in n.children:
                walk(c)
        walk(self.root)
        return out
