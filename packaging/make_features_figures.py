"""The README's Features and Graph screenshots, made by the app's own window (offscreen) on the demo model by
clicking its tables, tabs and buttons, over a dictionary and a cross-layer transcoder trained by the README's
commands.

    .venv/bin/python packaging/make_features_figures.py [--sae SAE_DIR] [--clt CLT_DIR] [OUTDIR]
                                                                        (default: docs/screenshots)

features.png (the lens of the TopK dictionary on the demo model's layer 2, the first " of" chosen and its
strongest feature clicked), features_dashboard.png (that feature's top contexts over the first 60,000
characters of the demo text, its histogram and the tokens its decoder direction promotes) and graph.png (the
Graph panel's graph of "The cat sat on the mat because it was" over the cross-layer transcoder, the two most
influential features on its last token pinned, grouped and zeroed with attention frozen).

Without --sae / --clt each is trained now, into a temporary folder, by the README's commands:

    python -m desktop_app train --task sae --model resources/demo-model --hook blocks.2.hook_resid_post \\
        --text-file resources/demo-text.txt --d-sae 512 --k 32 --steps 1500 --batch-size 256 --out runs/sae-l2
    python -m desktop_app train --task clt --model resources/demo-model --text-file resources/demo-text.txt \\
        --out runs/demo-clt --d-sae 128 --steps 400 --batch-size 256 --l1-coefficient 1 --eval-every 200

Prints what each shot shows (the feature clicked, the pinned nodes, the graph's summary).
"""
from __future__ import annotations

import argparse
import html
import os
import re
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_kit, beside this script
from figure_kit import SCREENSHOTS, application, click_tab, exit_status, run_or_train, save_grab  # noqa: E402
from figure_kit import click as _click  # noqa: E402
from figure_kit import open_model, shown_window, wait_until  # noqa: E402

LENS_TEXT = "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do,"
GRAPH_TEXT = "The cat sat on the mat because it was"
CONTEXT_CHARS = 60_000  # the dashboard's text: the start of the demo text
SAE_TRAIN = ["train", "--task", "sae", "--model", "resources/demo-model", "--hook", "blocks.2.hook_resid_post",
             "--text-file", "resources/demo-text.txt", "--d-sae", "512", "--k", "32", "--steps", "1500",
             "--batch-size", "256"]
CLT_TRAIN = ["train", "--task", "clt", "--model", "resources/demo-model", "--text-file", "resources/demo-text.txt",
             "--d-sae", "128", "--steps", "400", "--batch-size", "256", "--l1-coefficient", "1", "--eval-every", "200"]


def _wait(app, done, seconds: float = 600.0, what: str = "the work") -> None:
    wait_until(app, done, seconds, what, "make_features_figures")


def _click_cell(table, row: int, column: int) -> None:
    table.scrollToItem(table.item(row, column))
    _click(table.viewport(), table.visualRect(table.model().index(row, column)).center())


def _save(widget, path: Path) -> None:
    save_grab(widget, path, "make_features_figures")


def _plain(label) -> str:
    return re.sub(r"<[^>]+>", "", html.unescape(label.text()))


def features_figures(app, window, state, sae: str, out: Path, work: Path) -> dict:
    """Write features.png and features_dashboard.png; what they show: {"token", "feature", "contexts"}."""
    click_tab(window.tabs, "Features")
    panel = window.slot("Features").panel  # built when its tab is first shown
    state.open_dictionary(sae)
    _wait(app, lambda: bool(state.dictionaries) or panel.status.text().startswith("Cannot"), what="the dictionary")
    if not state.dictionaries:
        raise OSError(f"make_features_figures: {panel.status.text()}")
    _wait(app, lambda: panel.lens is not None and panel.status.text().startswith(state.dictionaries[0].dictionary.name),
          what="the lens")
    strings = state.token_strings(panel.lens_ids)
    position = strings.index(" of")  # the text's first " of": "tired of"
    _click_cell(panel.tokens_table, position, 1)
    _wait(app, lambda: panel.token == position, what="choosing the token")
    _click_cell(panel.features_table, 0, 1)  # its strongest feature
    _wait(app, lambda: panel.feature is not None, what="clicking the feature")
    feature = panel.feature[1]
    print(f"token {position} {strings[position]!r}: feature {feature}; {panel.colour_label.text()}; "
          f"{panel.status.text()}")
    _save(window, out / "features.png")

    text = work / "demo-text-60k.txt"
    from desktop_app.paths import demo_text_path

    text.write_text(demo_text_path().read_text(encoding="utf-8")[:CONTEXT_CHARS], encoding="utf-8")
    dashboard = panel.dashboard
    click_tab(panel.tabs, "Dashboard")
    dashboard.text_file = str(text)  # what Text file…'s dialog sets
    dashboard.file_label.setText(str(text))
    _click(dashboard.run_button)
    _wait(app, lambda: dashboard.contexts is not None and dashboard.run_button.isEnabled()
          and dashboard.promoted_table.rowCount() > 1, what="the top contexts")
    rows = dashboard.contexts.rows
    print(f"feature {feature}: {dashboard.status.text()} top: "
          + ", ".join(repr(left[-12:] + "[" + token + "]") for _r, _a, _i, token, left, _right in rows[:5]))
    _save(window, out / "features_dashboard.png")
    return {"token": strings[position], "feature": feature, "top_features": [k for _a, k in panel._feature_rows],
            "contexts": [token for _r, _a, _i, token, _left, _right in rows]}


def graph_figure(app, window, state, clt: str, out: Path) -> dict:
    """Write graph.png; what it shows: {"nodes" (the pinned), "supernodes", "edit" (the edit's result: edits,
    logits before, after, live)}."""
    window.resize(1500, 950)
    click_tab(window.tabs, "Graph")
    panel = window.slot("Graph").panel  # built when its tab is first shown
    state.set_text(GRAPH_TEXT)  # (what the text box does)
    _wait(app, lambda: state.token_ids and state.token_strings(list(state.token_ids))[-1] == " was"
          and (state._trace_job is None or state._trace_job.done), what="tracing the text")
    panel.compute(clt)  # what Compute graph…'s folder dialog calls
    _wait(app, lambda: panel.result is not None or "color:#b00" in panel.summary.text(), what="the graph")
    if panel.result is None:
        raise OSError(f"make_features_figures: the graph failed: {_plain(panel.summary)}")
    nodes = panel.full_layout.nodes
    last = max(int(n["ctx_idx"]) for n in nodes)
    features = [i for i, n in enumerate(nodes)
                if n["feature_type"] == "cross layer transcoder" and int(n["ctx_idx"]) == last]
    top = sorted(features, key=lambda i: float(nodes[i]["influence"]))[:2]  # cumulative influence: smallest first
    for i in top:
        panel.select_node(i)
        _click(panel.pin_button)
    panel.group("top pair", [nodes[i]["node_id"] for i in top])  # Group…'s dialog gives the label
    panel.select_node(top[0])
    click_tab(panel.side, "Intervene")
    panel.how_box.setCurrentText("zero")
    panel.frozen_button.setChecked(True)
    panel.edit_result = None
    _click(panel.run_edit_button)
    _wait(app, lambda: panel.edit_result is not None and panel.run_edit_button.isEnabled(), what="the intervention")
    _wait(app, panel.edges_item.is_current, 120, "the edges")
    print(f"{_plain(panel.summary)}; pinned {', '.join(nodes[i]['node_id'] for i in top)}; "
          f"{panel.edit_status.text()}")
    _save(window, out / "graph.png")
    return {"nodes": [dict(nodes[i]) for i in top], "last": last, "supernodes": [list(g) for g in panel.supernodes],
            "edit": panel.edit_result}


def make(app, out: Path, sae: str, clt: str) -> dict:
    """The three screenshots of the demo model into `out`; what they show ({"features": ..., "graph": ...})."""
    from desktop_app.paths import demo_model_dir

    out.mkdir(parents=True, exist_ok=True)
    with shown_window(1280, 800) as (state, window), tempfile.TemporaryDirectory() as work:
        state.text = LENS_TEXT
        open_model(app, window, demo_model_dir(), "make_features_figures")
        shown = {"features": features_figures(app, window, state, sae, out, Path(work))}
        shown["graph"] = graph_figure(app, window, state, clt, out)
        return shown


def readme_runs(sae: str | None, clt: str | None) -> tuple:
    """((the dictionary folder, its temporary folder), (the transcoder's, its)): each given, or trained now by
    the README's command (figure_kit.run_or_train)."""
    root = str(Path(__file__).resolve().parents[1])  # the README's commands name resources/ from the clone's root
    return (run_or_train(sae, [a.replace("resources/", f"{root}/resources/") for a in SAE_TRAIN], "sae-l2"),
            run_or_train(clt, [a.replace("resources/", f"{root}/resources/") for a in CLT_TRAIN], "demo-clt"))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="make_features_figures")
    ap.add_argument("outdir", nargs="?", default=str(SCREENSHOTS))
    ap.add_argument("--sae", help="the README's TopK dictionary folder (runs/sae-l2); trained now when not given")
    ap.add_argument("--clt", help="the README's cross-layer transcoder folder (runs/demo-clt); trained now when "
                                  "not given")
    args = ap.parse_args(argv)
    out = Path(args.outdir)
    (sae, sae_tmp), (clt, clt_tmp) = readme_runs(args.sae, args.clt)
    try:
        if sae is None or clt is None:
            print("make_features_figures: training the dictionary or the transcoder failed", file=sys.stderr)
            return 1
        app = application()
        return exit_status(lambda: make(app, out, sae, clt))
    finally:
        for tmp in (sae_tmp, clt_tmp):  # the one trained when the other failed too
            if tmp is not None:
                tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
