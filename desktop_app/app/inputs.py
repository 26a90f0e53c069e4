"""The inputs every view shows (model, text, target, image, special tokens, their key), as a Qt-free evented model.

One event per field, napari-style (its `EventedModel`; here psygnal's `evented` dataclass, the event library
napari uses): `inputs.events.text.connect(fn)` calls fn(new, old) whenever the text changes, and only then.
The GUI's AppState holds one Inputs and forwards its events to Qt signals; nothing here knows Qt.

InputKey names what a computed result depends on, as serial numbers `advance` moves on: a result whose key
differs from the current one in a part it depends on is stale and never shown.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

from psygnal import evented

# What a computed result depends on (InputKey's serials): the model open, the input traced (the text's
# ids, a generation step or a ViT's image), and the what-if edits.
MODEL, INPUT, EDITS = "model", "input", "edits"
PARTS = (MODEL, INPUT, EDITS)
# The sparse dictionaries attached: a part only feature results depend on, so not in PARTS (a view showing
# features passes FEATURE_PARTS).
DICTIONARIES = "dictionaries"
FEATURE_PARTS = PARTS + (DICTIONARIES,)


@dataclass(frozen=True)
class InputKey:
    """The inputs a result was computed for, as serial numbers Inputs.advance moves on: `model` at every
    model opened (or made current), `input` at every new trace of the text, ids or image, `edits` at every
    change of the what-if edits. An encoder-decoder's input is its source and its target text: a change of
    either is a new trace, so a new `input`. A result whose key differs from the current one in a part it
    depends on is stale."""
    model: int = 0
    input: int = 0
    edits: int = 0
    model_name: str = ""  # the model's name when the key was made (for labels)
    dictionaries: int = 0  # at every change of the attached sparse dictionaries

    def same(self, other: "InputKey", parts=PARTS) -> bool:
        return all(getattr(self, p) == getattr(other, p) for p in parts)

    def changed_parts(self, older: "InputKey") -> frozenset:
        """The parts whose serials differ from `older`'s."""
        return frozenset(p for p in FEATURE_PARTS if getattr(self, p) != getattr(older, p))


# A model and pixel values are compared by identity: the same object is the same input (their == is a
# field-by-field or element-wise comparison, meaningless or costly here).
@evented(equality_operators={"loaded": operator.is_, "image": operator.is_})
@dataclass
class Inputs:
    """The current inputs; assigning a field emits `events.<field>(new, old)` when its value changes."""
    loaded: object = None  # the open model (core.checkpoints.LoadedModel), None before one is opened
    text: str = ""  # the text box's text (an encoder-decoder's source)
    target: str = ""  # an encoder-decoder's target text (its decoder reads [start] + its tokens)
    image: object = None  # a ViT's input: pixel values [C, H, W] made for the open model, None: not chosen
    image_source: str = ""  # what the image is (a file's name, "held-out digit #3")
    special_tokens: bool = True  # the tokenizer's special tokens ([CLS] ... [SEP], BOS) added to every text
    key: InputKey = field(default_factory=InputKey)  # what the model, input, edits and dictionaries are now

    def advance(self, *parts: str) -> InputKey:
        """Move the serials of `parts` on (results computed before, in those parts, are now stale); the new key."""
        k = self.key
        name = getattr(self.loaded, "name", "") if self.loaded is not None else ""
        self.key = InputKey(k.model + (MODEL in parts), k.input + (INPUT in parts), k.edits + (EDITS in parts),
                            name, k.dictionaries + (DICTIONARIES in parts))
        return self.key
