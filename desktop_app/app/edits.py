"""The what-if edit list (core.interventions.Intervention), Qt-free and evented: the one rule for adding an edit.

Every panel that makes an edit (the Attention panel's ablations, What if's ablations, routings and steers, the
Features panel's feature edits, an attribution graph's edits) adds it here, and the list decides:

- an edit that is already in the list (the same edit again) changes nothing: `add` says ALREADY;
- an edit in the same slot as one in the list replaces it (REPLACED; the new one goes last, as edits made
  later apply later); the slots (`replaces`):
    * setting an activation (zero, mean, resample, replace): the same target at the same positions, whatever
      the kind (the later would overwrite the earlier anyway: a mean ablation of a head zeroed replaces the zero);
    * a steer (core.interventions.is_steer): one steer at a time (the What if panel has one slider);
    * other additions (an attribution graph's feature edits): the same name at the same target;
    * a sparse dictionary's feature edit: the same dictionary's same feature(s);
- anything else stacks (ADDED): edits of other slots apply together.

`changed(edits)` is emitted after every change with the edits now (nothing when ALREADY or nothing removed).
"""
from __future__ import annotations

from typing import Callable, Iterable

from psygnal import Signal

ADDED, REPLACED, ALREADY = "added", "replaced", "already"
SETTING = ("zero", "mean", "resample", "replace")  # the kinds that set the activation (the others add to it)


def _dictionary_features(edit) -> tuple[object, set[int]]:
    f = edit.features
    return f.attached.dictionary, {op.feature for op in f.ops}


def replaces(new, old) -> bool:
    """Whether adding `new` takes `old` out of the list (the two are in the same slot; module docstring)."""
    from ..core.interventions import is_steer

    if new.how == "features" or old.how == "features":
        if new.how != old.how:
            return False
        (d_new, f_new), (d_old, f_old) = _dictionary_features(new), _dictionary_features(old)
        return d_new is d_old and bool(f_new & f_old)
    if is_steer(new) or is_steer(old):
        return is_steer(new) and is_steer(old)
    if new.how == "add" or old.how == "add":
        return new.how == old.how and (new.name, new.target, new.positions) == (old.name, old.target, old.positions)
    return (new.target, new.positions) == (old.target, old.positions)


def _same_value(a, b) -> bool:
    if a is None or b is None:
        return a is b
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())


def same_edit(a, b) -> bool:
    """Whether two edits do the same thing (the same slot, kind, positions, values and name)."""
    if a is b:
        return True
    if (a.target, a.how, a.positions, a.source_ids, a.name) != (b.target, b.how, b.positions, b.source_ids, b.name):
        return False
    if a.how == "features":
        return a.features.attached.dictionary is b.features.attached.dictionary and a.features.ops == b.features.ops
    return _same_value(a.value, b.value)


class EditList:
    """The what-if edits every trace applies, in the order they apply; `changed` after every change."""
    changed = Signal(list)  # the edits now

    def __init__(self, edits: Iterable = ()) -> None:
        self._edits: list = list(edits)

    def __iter__(self):
        return iter(list(self._edits))

    def __len__(self) -> int:
        return len(self._edits)

    def __getitem__(self, index: int):
        return self._edits[index]

    def __repr__(self) -> str:
        return f"EditList({[iv.label for iv in self._edits]})"

    def _emit(self) -> None:
        self.changed.emit(list(self._edits))

    def add(self, edit) -> str:
        """Add one edit by the list's rule (module docstring): ADDED, REPLACED or ALREADY."""
        if any(same_edit(edit, old) for old in self._edits):
            return ALREADY
        kept = [old for old in self._edits if not replaces(edit, old)]
        outcome = REPLACED if len(kept) < len(self._edits) else ADDED
        self._edits = kept + [edit]
        self._emit()
        return outcome

    def add_all(self, edits: Iterable) -> list[str]:
        """Add several edits by the rule, in order, with one `changed` (when any of them changed the list)."""
        with self.changed.blocked():
            outcomes = [self.add(edit) for edit in edits]
        if any(o != ALREADY for o in outcomes):
            self._emit()
        return outcomes

    def remove_at(self, index: int) -> None:
        """Remove the edit at `index` (an edit's x in the strip); an index out of range changes nothing."""
        if 0 <= index < len(self._edits):
            del self._edits[index]
            self._emit()

    def remove_if(self, predicate: Callable[[object], bool]) -> list:
        """Remove the edits `predicate` is true of (e.g. a detached dictionary's feature edits); the removed ones."""
        removed = [iv for iv in self._edits if predicate(iv)]
        if removed:
            self._edits = [iv for iv in self._edits if not any(iv is r for r in removed)]
            self._emit()
        return removed

    def clear(self) -> None:
        """Remove every edit (Clear all): `changed` even when there were none (the plain model, traced again)."""
        self.set([])

    def set(self, edits: Iterable) -> None:
        """Make `edits` the list as they are, in their order (a workspace restored, or edits made elsewhere)."""
        self._edits = list(edits)
        self._emit()
