"""The Generate panel's settings as data (no Qt): what a workspace saves of it and brings back.

The settings, not the generation: a workspace reopens the panel with the same prompt and sampling
choices, ready to Step. Read back with core.views.state_from_dict (unknown keys ignored, missing or
ill-typed ones keep their defaults); a strategy this version lacks keeps the panel's current one.
The sliders' units are the ones the panel shows (temperature 1.0, top-p 1.0 = off), not slider ticks.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GenerationViewState:
    prompt: str = ""  # "": the panel fills in the start of the current text when a model opens
    strategy: str = "greedy"  # one of core.generation.STRATEGIES
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    beams: int = 4
    seed: int = 0
    run_n: int = 20  # how many tokens Run N generates
    length_penalty: float = 1.0  # beam search (app.generation.LENGTH_PENALTY)
    early_stopping: str = "false"  # beam search: a word of app.generation.EARLY_STOPPING


# -- the history tree and the beams as the panel lists them -----------------------------------


@dataclass
class BranchRow:
    """One row of the branch list: a branch from `start` (the root for the first row) down its oldest
    children to a leaf `end`; `parent` is the row it branches off (None for the first row)."""
    start: object  # core.generation.Node
    end: object
    parent: int | None

    @property
    def nodes(self) -> list:
        path = self.end.path()
        return path[path.index(self.start):]


def branch_rows(root) -> list[BranchRow]:
    """The history tree as rows that nest only where a branch leaves another: a row follows the oldest
    child at every fork (the line it was generated on), and each younger child starts a row under it.
    Beam search forks at almost every step; nesting each fork would push the labels out of view, while
    here a row is as deep as the number of times its branch left an older one. Rows come depth first,
    a row's branches in the order they leave it."""
    rows: list[BranchRow] = []
    stack = [(root, None)]
    while stack:
        start, parent = stack.pop()
        end, alternatives = start, []
        while True:
            alternatives += end.children[1:]
            if not end.children:
                break
            end = end.children[0]
        rows.append(BranchRow(start, end, parent))
        stack.extend((alt, len(rows) - 1) for alt in reversed(alternatives))
    return rows


def common_prefix_length(sequences) -> int:
    """How many leading items every sequence shares."""
    sequences = [list(s) for s in sequences]
    if not sequences:
        return 0
    n = min(map(len, sequences))
    for i in range(n):
        if any(s[i] != sequences[0][i] for s in sequences[1:]):
            return i
    return n
