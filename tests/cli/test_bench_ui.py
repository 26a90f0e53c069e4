"""`bench ui`: its arguments refused in one line before any folder is made, and a scripted look at the tiny
shape measured in this process: every phase settled, each panel painted after its tab's click."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from desktop_app.benchmarks import ui as bench_ui  # noqa: E402
from desktop_app.benchmarks.firstlook import make_folder, text_of  # noqa: E402


@pytest.mark.parametrize("argv, says", [
    (["--panels", "Layers,Nope"], "no panel named 'Nope'"),
    (["--panels", " , "], "no panel named at all"),
    (["--tokens", "0"], "--tokens"),
    (["--stall-ms", "5"], "--stall-ms"),
    (["--shape", "gpt-5"], "--shape"),
])
def test_bad_arguments_are_one_line_before_any_work(argv, says, capsys, monkeypatch):
    monkeypatch.setattr("desktop_app.benchmarks.firstlook.make_folder",
                        lambda *a: pytest.fail("a folder made for bad arguments"))
    with pytest.raises(SystemExit) as exc:
        bench_ui.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("bench ui: error:") and says in err


def test_a_look_at_the_tiny_shape_measures_each_panel(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    make_folder("tiny", tmp_path / "tiny")
    text, ids = text_of(24)
    phases = bench_ui.measure(str(tmp_path / "tiny"), text, ["Layers", "Model", "Attention"], settle_s=60)
    names = [p["phase"] for p in phases]
    assert names[0] == "first look" and {"Layers", "Model", "Attention", "Layers: depth_slider up",
                                          "Layers: Component norms tab", "Model: hover"} <= set(names)
    assert all(p["settled"] for p in phases), phases
    for p in phases:
        assert 0 < p["longest_stall_ms"] < p["settled_s"] * 1000 + 1000 and p["stalls_ms"] >= 0
        assert (p["stalls"] == 0) == (p["stalls_ms"] == 0)
    shown = {p["phase"]: p["first_show_ms"] for p in phases if "first_show_ms" in p}
    assert set(shown) == {"Layers", "Model", "Attention"} and all(ms > 0 for ms in shown.values())
    table = bench_ui.table(phases).splitlines()
    assert len(table) == len(phases) + 1 and table[1].startswith("first look")
