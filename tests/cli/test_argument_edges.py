"""Edge cases of the arguments a person types (edges7): values that start with '-', and numbers written
with other scripts' digits or underscores.

argparse took `--layers -1:1` and `--steer-scale -1e-3` for unknown options and said "expected one argument"
(it takes only "-1" and "-0.5" as values); every such value now reaches its option's type. int() and float()
take '٣' (Arabic-Indic three), '３' (full-width three) and '1_000': a number typed by a person is ASCII digits
only (core.numbers.parse_int / parse_float), in every option and every list of numbers an option holds.
"""
from __future__ import annotations

import argparse

import pytest

from desktop_app.cli import build_parser, main
from desktop_app.commands.args import Number

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _numeric_options(allow_negative: bool | None = None) -> list[tuple[str, str, Number]]:
    """(command, option, type) of every numeric option; with allow_negative, those whose range takes (or
    not) a negative value."""
    out = []
    for name, parser in _subparsers().items():
        for a in parser._actions:
            if a.option_strings and isinstance(a.type, Number):
                negative = a.type.lo is None or a.type.lo < 0
                if allow_negative is None or negative == allow_negative:
                    out.append((name, a.option_strings[-1], a.type))
    return out


def _refusal(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        build_parser(only=argv[0]).parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err.strip()


def _with_required(command: str) -> list[str]:
    """The least a command's parser needs besides the option tested (parsing only; nothing runs)."""
    return {"trace": ["trace", "m", "--ids", "1", "--out", "x.npz"],
            "attribute": ["attribute", "m", "--ids", "1", "--token-id", "1", "--csv", "x.csv"],
            "generate": ["generate", "m", "--prompt-ids", "1"],
            "features": ["features", "m", "--sae", "s", "--ids", "1"],
            "patch": ["patch", "m", "--clean-ids", "1", "--corrupted-ids", "1", "--answer-id", "1", "--csv", "x.csv"],
            "graph": ["graph", "m", "--transcoders", "t", "--ids", "1", "--out", "g.json"],
            "render": ["render", "m", "--ids", "1", "--out", "x.png"],
            "lipschitz": ["lipschitz", "--synthetic", "--csv", "x.csv"],
            "dynamics": ["dynamics", "--csv", "x.csv"],
            "scrub": ["scrub", "r", "--csv", "x.csv"],
            "train": ["train", "--out", "o"]}.get(command, [command, "m"])


def test_there_are_options_that_take_negative_values():
    assert {(c, o) for c, o, _ in _numeric_options(True)} >= {("generate", "--steer-scale"), ("attribute", "--position")}


@pytest.mark.parametrize("value", ["-1e-3", "-.5", "-2", "-0.5"])
def test_every_option_taking_a_negative_value_takes_it_as_typed(value):
    """`--steer-scale -1e-3` and `--steer-scale -.5` were "expected one argument"; each option whose range takes
    a negative value now parses it, in both spellings (`--opt V` and `--opt=V`)."""
    checked = 0
    for command, option, kind in _numeric_options(True):
        if kind.kind is int and not value.lstrip("-").isdigit():
            continue
        for argv in ([option, value], [f"{option}={value}"]):
            ns = build_parser(only=command).parse_args(_with_required(command) + argv)
            dest = next(a.dest for a in _subparsers()[command]._actions if option in a.option_strings)
            assert getattr(ns, dest) == kind(value), (command, argv)
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("command", ["lipschitz", "dynamics", "generate", "train", "trace"])
def test_a_negative_value_where_none_is_allowed_is_refused_by_its_range(command, capsys):
    """An option with no negative values meets '-1e-3' and says its range (not "expected one argument")."""
    options = [(o, t) for c, o, t in _numeric_options(False) if c == command]
    assert options
    for option, kind in options:
        line = _refusal(_with_required(command) + [option, "-1e-3" if kind.kind is float else "-3"], capsys)
        assert f"argument {option}: must be" in line and "expected one argument" not in line, line


def test_a_layer_range_that_starts_with_a_minus_reaches_the_range_check(capsys):
    """trace --layers -1:1 was "argument --layers: expected one argument"; it is the layer range's own refusal
    (A:B with 0 <= A), the same as --layers=-1:1."""
    for argv in (["--layers", "-1:1"], ["--layers=-1:1"]):
        line = _refusal(_with_required("trace") + argv, capsys)
        assert "argument --layers: layer range '-1:1': A:B with 0 <= A < B" in line, line
    assert build_parser(only="trace").parse_args(_with_required("trace") + ["--layers", "1:"]).layers == (1, None)


@pytest.mark.parametrize("option", ["--text", "--prompt", "--steer-towards"])
def test_a_text_that_starts_with_a_minus_is_told_how_to_give_it(option, capsys):
    """`--text -x` stays an unknown option to argparse (it could be a mistyped one); the refusal says to write
    --text=-x, which works."""
    command = "trace" if option == "--text" else "generate"
    base = [a for a in _with_required(command) if a not in ("--ids", "--prompt-ids", "1")]
    line = _refusal(base + [option, "-x"], capsys)
    assert f"argument {option}" in line and f"(a value that starts with '-' is written {option}=-x)" in line, line
    ns = build_parser(only=command).parse_args(base + [f"{option}=-x"] + (["--prompt-ids", "1"] if option ==
                                                                           "--steer-towards" else []))
    assert getattr(ns, {"--text": "text", "--prompt": "prompt", "--steer-towards": "steer_towards"}[option]) == "-x"


@pytest.mark.parametrize("argv,expected", [
    (["--panel", "generate", "--text", "-x"], "transformer-explorer: error: argument --text: expected one argument "
     "(a value that starts with '-' is written --text=-x) (see transformer-explorer --help)"),
    (["--timeout", "-1e-3"], "transformer-explorer: error: argument --timeout: must be in (0, 86400], got -1e-3 "
     "(see transformer-explorer --help)"),
    (["--panl", "layers"], "transformer-explorer: error: unrecognized arguments: --panl (did you mean --panel?) "
     "(see transformer-explorer --help)"),
])
def test_the_guis_command_line_refuses_as_the_clis_does(argv, expected, capsys):
    """`python -m desktop_app --panel generate --text -x` (the GUI's own argparse, ui/app.py) printed argparse's
    usage block and "expected one argument", and took `--timeout -1e-3` for an unknown option: it is the CLI's
    OneLineParser (app/arguments.py), one line, the same '-' values and hint. Refused before Qt starts."""
    from desktop_app.ui.app import build_parser as gui_parser, main as gui_main

    with pytest.raises(SystemExit) as exc:
        gui_main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.strip().splitlines() == [expected], err
    assert gui_parser().parse_args(["--text", "-1:1", "--text=-x"]).text == "-x"
    assert gui_parser().parse_args(["--text", "-1:1"]).text == "-1:1"  # a value, as the CLI reads it


@pytest.mark.parametrize("after", [[], ["--seed", "1"]], ids=["at the end", "before an option"])
def test_a_forgotten_value_gets_no_hint(after, capsys):
    line = _refusal(_with_required("generate") + ["--steer-towards", *after], capsys)
    assert line.endswith("argument --steer-towards: expected one argument (see python -m desktop_app generate "
                         "--help)"), line


@pytest.mark.parametrize("typed", ["٣", "３", "1_0", "1_000.5"])
def test_every_numeric_option_refuses_other_digits_and_underscores(typed, capsys):
    """int('٣') is 3 and float('1_000.5') 1000.5: --max-new ٣ generated three tokens. Every numeric option of
    every command refuses them in one line that says how to write the number."""
    options = _numeric_options()
    assert len(options) > 30
    for command, option, kind in options:
        if kind.kind is int and "." in typed:
            continue
        line = _refusal(_with_required(command) + [option, typed], capsys)
        assert f"argument {option}: must be" in line and "write it in the digits 0-9, without '_'" in line, line


@pytest.mark.parametrize("parse,typed", [
    ("desktop_app.core.inputs:parse_token_ids", "1,٢"),
    ("desktop_app.core.inputs:parse_token_ids", "1_0"),
    ("desktop_app.app.tracing:parse_layers", "0:١"),
    ("desktop_app.core.lipschitz.sweep:parse_lengths", "٢,3"),
    ("desktop_app.core.lipschitz.sweep:parse_lengths", "geom:2:1_0:3"),
    ("desktop_app.commands.render:_parse_size", "1200x９00"),
    ("desktop_app.core.interventions:parse_ablations", "٠.١"),
], ids=["ids", "ids_", "layers", "lengths", "geom", "size", "ablate"])
def test_lists_of_numbers_refuse_other_digits_too(parse, typed):
    """The options holding several numbers (--ids, --layers, --lengths, --size, --ablate) read them as the
    numeric options do; each took '٢' as 2 (and --ablate ٠.١ made the trace name 'blocks.٠.attn.head.١')."""
    import importlib

    module, name = parse.split(":")
    with pytest.raises(ValueError):
        getattr(importlib.import_module(module), name)(typed)


def test_a_covariance_refuses_other_digits():
    from desktop_app.core.dynamics import parse_covariance

    with pytest.raises(ValueError, match="give numbers"):
        parse_covariance("１,1", 2)
    assert parse_covariance("1e0, 2.", 2).tolist() == [[1, 0], [0, 2]]


def test_the_number_readers_take_what_a_person_types():
    from desktop_app.core.numbers import parse_float, parse_int

    assert [parse_int(t) for t in ("12", " -3 ", "+4", "007")] == [12, -3, 4, 7]
    assert [parse_float(t) for t in ("0.5", "-1e-3", ".5", "5.", "1E3", "-inf")] == [0.5, -1e-3, 0.5, 5.0, 1e3,
                                                                                     float("-inf")]
    for bad in ("٣", "３", "1_0", "", "1.5", "0x10", "1e3"):
        with pytest.raises(ValueError):
            parse_int(bad)
    for bad in ("１.5", "1_0.5", "", "e3", "1e", "--1", "infinite"):
        with pytest.raises(ValueError):
            parse_float(bad)


def test_a_unicode_digit_never_reaches_a_model(one_layer_gpt2_dir, tmp_path, capsys):
    """End to end: generate --max-new ٣ generated three tokens; it is refused before the model loads."""
    with pytest.raises(SystemExit) as exc:
        main(["generate", str(one_layer_gpt2_dir), "--prompt-ids", "1", "--max-new", "٣"])
    err = capsys.readouterr()
    assert exc.value.code == 2 and "--max-new: must be" in err.err and not err.out
