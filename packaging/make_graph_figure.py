"""The README's demo circuit: the Graph panel showing the cross-layer transcoder graph of "the White" on the
demo model, made by the panel itself (offscreen).

    .venv/bin/python packaging/make_graph_figure.py GRAPH.json [OUT.png] [--features 47,117]

GRAPH.json is the README's (train --task clt ... --out runs/demo-clt; graph resources/demo-model --transcoders
runs/demo-clt --prompt "the White" --out runs/white.json). The panel opens it; the layer-0 features named
(on the last token, "ite") are pinned and grouped into a supernode, the first is clicked (its strongest
ancestors and descendants highlighted in orange) and labelled; the panel is saved (default
docs/screenshots/graph_demo_circuit.png).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_kit, beside this script
from figure_kit import application, save_grab, wait_until  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graph", type=Path)
    ap.add_argument("out", type=Path, nargs="?", default=Path("docs/screenshots/graph_demo_circuit.png"))
    ap.add_argument("--features", default="47,117", help="the layer-0 features of the circuit (comma-separated)")
    ap.add_argument("--size", default="1280x720")
    args = ap.parse_args(argv)
    from PySide6.QtWidgets import QSplitter

    from desktop_app.ui.offscreen import dispose
    from desktop_app.ui.panels.graph import GraphPanel

    app = application()
    panel = GraphPanel()
    w, h = (int(v) for v in args.size.split("x"))
    panel.resize(w, h)
    panel.show()
    if not panel.open_graph(args.graph):
        from PySide6.QtGui import QTextDocumentFragment  # the error line is rich text in the summary

        raise SystemExit(f"{args.graph}: the panel did not open it "
                         f"({QTextDocumentFragment.fromHtml(panel.summary.text()).toPlainText()})")
    nodes = panel.full_layout.nodes
    last = max(int(n["ctx_idx"]) for n in nodes)
    wanted = [int(f) for f in args.features.split(",")]
    found = {int(n["node_id"].split("_")[1]): i for i, n in enumerate(nodes)  # node ids: layer_feature_position
             if n["feature_type"] == "cross layer transcoder" and n["layer"] == "0" and int(n["ctx_idx"]) == last}
    missing = [f for f in wanted if f not in found]
    if missing:
        raise SystemExit(f"{args.graph}: no layer-0 feature {missing} on the last token; there: {sorted(found)}")
    for f in wanted:
        panel.select_node(found[f])
        panel.toggle_pin()
    panel.group("White → Rabbit", [nodes[found[f]]["node_id"] for f in wanted])
    logits = [n for n in nodes if n["feature_type"] == "logit"]
    top = max(logits, key=lambda n: n.get("token_prob", 0))
    panel.group(top.get("clerp", top["node_id"]).removeprefix("Output "), [top["node_id"]])  # a label on the logit
    panel.select_node(found[wanted[0]])
    panel.findChild(QSplitter).setSizes([w, 0])  # the graph alone: a graph opened from a file has no dashboard
    plot = panel.plot.getPlotItem()
    plot.setYRange(-0.6, panel.full_layout.n_rows - 0.05, padding=0)  # room for the logit's label
    wait_until(app, panel.edges_item.is_current, 120, "the edges", "make_graph_figure")
    app.processEvents()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        save_grab(panel, args.out, "make_graph_figure")
    except (OSError, ValueError) as exc:  # one line, as the script's other errors
        raise SystemExit(str(exc)) from None
    print(f"{args.out}: {len(nodes)} nodes, {len(panel.full_layout.edges)} edges; "
          f"pinned and grouped {', '.join(nodes[found[f]]['node_id'] for f in wanted)}")
    dispose(panel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
