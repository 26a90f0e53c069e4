"""The application layer: Qt-free use cases that the GUI (ui/) and the CLI (commands/) both call.

One module per use case: what the app *does* with the core (which names a trace records, how an image
file becomes a model's input, how a what-if edit is built from what the user typed...), written once
here instead of once per front end. A module here imports core only (and numpy / torch): never Qt,
ui/, commands/ or the CLI (tests/test_layering.py checks it). ui/ and commands/ import it and never
each other. What is science (a model, a trace, an intervention) belongs in core/; what draws or
parses arguments belongs in the front ends.

- tracing.py  which names a forward pass records, for which purpose; tracing a text or an image
- images.py   image files as arrays, and as a vision model's pixel values
- whatif.py   the what-if edits built from texts (steering)
- training.py training settings and their command-line form (the Train panel and `train`)
- timeline.py per-head metrics over a run's kept steps (the timeline, `scrub`)
- arguments.py the numeric argparse types (ranges, --device) of both command lines: the CLI's and the GUI's
- inputs.py   the inputs every view shows (model, text, target, image, special tokens, their key), evented
- edits.py    the what-if edit list, evented, owning the one rule for adding, replacing and removing an edit
- lipschitz.py the plan of a Lipschitz sweep (lengths kept and skipped, samples, the text): panel and CLI
"""
