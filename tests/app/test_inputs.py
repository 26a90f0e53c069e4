"""app/inputs.py: one event per input field, fired on a change only, and the key's serials."""
from __future__ import annotations

import numpy as np

from desktop_app.app.inputs import DICTIONARIES, EDITS, INPUT, MODEL, PARTS, InputKey, Inputs


def _events(inputs: Inputs) -> list[tuple]:
    seen: list[tuple] = []
    for name in ("loaded", "text", "target", "image", "image_source", "special_tokens", "key"):
        getattr(inputs.events, name).connect(lambda new, old, name=name: seen.append((name, new, old)))
    return seen


def test_each_field_has_its_own_event_fired_on_a_change_only():
    inputs = Inputs()
    seen = _events(inputs)
    inputs.text = "hello"
    inputs.text = "hello"
    inputs.target = "bonjour"
    inputs.special_tokens = False
    assert seen == [("text", "hello", ""), ("target", "bonjour", ""), ("special_tokens", False, True)]


def test_a_model_and_an_image_are_the_same_input_when_they_are_the_same_object():
    inputs = Inputs()
    seen = _events(inputs)
    pixels = np.zeros((3, 4, 4))
    inputs.image = pixels
    inputs.image = pixels  # no element-wise comparison (an array's == is not a bool)
    inputs.image = np.zeros((3, 4, 4))  # equal values, another image
    assert [s[0] for s in seen] == ["image", "image"]


def test_advance_moves_the_serials_of_the_parts_named_and_names_the_model():
    class Loaded:
        name = "tiny"

    inputs = Inputs()
    seen = _events(inputs)
    first = inputs.key
    inputs.loaded = Loaded()
    key = inputs.advance(MODEL, INPUT)
    assert (key.model, key.input, key.edits, key.dictionaries, key.model_name) == (1, 1, 0, 0, "tiny")
    assert key.changed_parts(first) == {MODEL, INPUT}
    later = inputs.advance(EDITS, DICTIONARIES)
    assert later.changed_parts(key) == {EDITS, DICTIONARIES}
    assert later.same(key, parts=(MODEL, INPUT)) and not later.same(key, parts=PARTS)
    assert [s[0] for s in seen] == ["loaded", "key", "key"] and seen[-1][1:] == (later, key)
    assert InputKey().same(InputKey(model_name="other"))  # the name labels a key, it is not a part
