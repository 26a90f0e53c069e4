"""The plan of a Lipschitz sweep: which lengths the data can fill, from which text, and why (the panel and the CLI).

The Lipschitz panel and the `lipschitz` command both call `plan_lengths` before building the sweep, so they
keep and skip the same lengths, reduce the same sample counts and fall back to the same text; each words
its own controls in the notes (the panel's "Samples K", the CLI's "--samples").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..core import lipschitz as lip
from ..core.lipschitz.sources import image_sequence_length


@dataclass
class LengthPlan:
    lengths: list[int]  # the lengths the sweep runs (of those asked, sorted, in their order)
    ids: list[int] | None  # the text real windows come from (None: the data needs none)
    notes: list[str]  # a sentence for each length skipped, sample count reduced or text replaced
    where: str  # what real windows come from ("the text", "the demo text", "the target", a file's name); "" if none


def listed(ns, most: int = 8) -> str:
    """Lengths for a note: all of a few; of many the first ones, the last and how many (geom:2:512:1000
    skipped 256 lengths, listed one by one in the status line)."""
    ns = list(ns)
    if len(ns) <= most:
        return ", ".join(str(n) for n in ns)
    return f"{', '.join(str(n) for n in ns[:most - 2])}, …, {ns[-1]} ({len(ns)} lengths)"


def plan_lengths(config, data: str, lengths: Sequence[int], ids: list[int] | None, samples: int, *,
                 function: str = lip.MODEL, search_start: str = "random", where: str = "the text",
                 fallback: Callable[[], list[int] | None] | None = None, samples_said: str = "Samples K = {k}",
                 one_each: str = "one sample each", longer: str = "choose a longer text") -> LengthPlan:
    """The lengths `data` can fill and the text its windows come from, with a note for each change.

    Windows of real text need n tokens (and n within the context of a model with learned or sinusoidal
    positions); when `ids`, the current text's, fill fewer than two of the lengths, `fallback()` (the bundled
    demo text's ids; None: no fallback, as for a text file or a target) takes their place if it fills more. A ViT's image patches give at most [CLS] + its
    patches. `config`: the model's ModelConfig (None for a synthetic head). The notes name the front end's
    controls: `samples_said` (formatted with k=samples), `one_each`, and `longer` (how to give a longer text).
    ValueError (one line) when no length fits."""
    lengths, notes = list(lengths), []
    source = lip.get_source(data, function)
    if source.one_input_per_length:
        if samples > 1:
            notes.append(f"the {data} input is one construction per n, so {samples_said.format(k=samples)} gives "
                         f"{one_each}")
        return LengthPlan(lengths, ids, notes, "")
    if function != lip.MODEL:
        return LengthPlan(lengths, ids, notes, "")
    if data == "image" and config.input_kind == "patches":
        longest = image_sequence_length(config)
        over = [n for n in lengths if n > longest]
        if over:
            notes.append(f"skipped n = {listed(over)}: this ViT reads {longest} tokens ([CLS] + {longest - 1} patches)")
        fits = [n for n in lengths if n <= longest]
        if not fits:
            raise ValueError(f"no length fits: this ViT reads {longest} tokens ([CLS] + {longest - 1} "
                             f"patches); choose lengths up to {longest}")
        return LengthPlan(fits, ids, notes, "")
    if not (source.needs_text or (data == "search" and search_start == "real")):
        return LengthPlan(lengths, ids, notes, "")
    limit = config.context_length if config.positions in ("learned", "sinusoidal") else None
    over = [n for n in lengths if limit is not None and n > limit]
    if over:
        notes.append(f"skipped n = {listed(over)}: longer than the model's context length {limit}")
    lengths = [n for n in lengths if n not in over]
    fits = [n for n in lengths if ids and n <= len(ids)]
    if len(fits) < min(2, len(lengths)) and fallback is not None:
        demo = fallback()
        if demo and len([n for n in lengths if n <= len(demo)]) > len(fits):
            told = f"the current text has {len(ids)} tokens" if ids else "there is no current text"
            notes.append(f"{told}, too few for these lengths: real windows come from the bundled demo text "
                         f"({len(demo)} tokens)")
            ids, where = demo, "the demo text"
            fits = [n for n in lengths if n <= len(ids)]
    short = [n for n in lengths if n not in fits]
    if short and ids:
        notes.append(f"skipped n = {listed(short)}: {where} has {len(ids)} tokens ({longer})")
    if not fits:
        if not ids:
            raise ValueError("real windows need a text: type one, or choose a text file")
        raise ValueError(f"no length fits: {where} has {len(ids)} tokens"
                         + (f" and the context is {limit}" if limit is not None else "")
                         + f"; choose lengths up to {min(len(ids), limit or len(ids))}")
    # real data takes the same windows for every n, as many distinct ones as the longest n allows;
    # a search from real text takes its own per n, the fewest at the longest
    windows = len(lip.window_starts(len(ids), fits[-1], samples))
    if windows < samples:
        notes.append(f"{samples_said.format(k=samples)} reduced to {windows}"
                     + (f" at n = {fits[-1]}" if data == "search" else "")
                     + f": {where} has only {windows} distinct windows of n = {fits[-1]} tokens")
    return LengthPlan(fits, ids, notes, where)
