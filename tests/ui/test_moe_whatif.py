"""What if on a mixture of experts (issue 36), clicked: the Ablate tab zeroes one expert (every panel then
shows the edited model) and the attribution's bars are the chosen experts' terms."""
from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import Qt

from desktop_app.core.checkpoints import save_model_folder
from desktop_app.core.families import REGISTRY
from desktop_app.core.tokenizer import char_tokenizer
from tiny_models import save_tiny_model

from .walkthrough import choose_item, click_panel_tab, click_tab, open_window, type_into

TEXT = "the cat sat on the mat."


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("mixtral") / "m", "abcdefghijklmnopqrstuvwxyz .", "mixtral",
                           n_kv_heads=2, d_ff=32, init_std=0.2)


def test_ablating_an_expert_and_attributing_to_experts(qtbot, mixtral_dir, isolated_user_files, error_watch):
    win, state = open_window(qtbot, mixtral_dir, text=TEXT, watch=error_watch)
    try:
        panel = click_panel_tab(qtbot, win, "What if")
        qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None, timeout=30_000)
        att = panel.dla_chart.attribution
        assert abs(att.sum - att.logit) < 1e-4 and "expert" in att.components
        chosen = state.trace["blocks.1.mlp.experts"][0, att.position].tolist()
        assert {f"L1E{e}" for e in chosen} <= set(panel.dla_chart.labels)

        click_tab(qtbot, panel.tabs, "Ablate")
        choose_item(qtbot, panel.ablate_kind, "Expert")
        assert panel.ablate_head_label.text() == "Expert" and panel.ablate_head.maximum() == 7
        expert = int(state.trace["blocks.0.mlp.experts"][0, 0, 0])
        type_into(qtbot, panel.ablate_layer, "0")
        type_into(qtbot, panel.ablate_head, str(expert))
        before = state.trace["blocks.0.mlp.out"][0].clone()
        with qtbot.waitSignal(state.trace_changed, timeout=30_000):
            qtbot.mouseClick(panel.ablate_button, Qt.MouseButton.LeftButton)
        assert [iv.target for iv in state.interventions] == [f"blocks.0.mlp.expert_out.{expert}"]
        qtbot.waitUntil(lambda: state._trace_job is None and state.trace is not None, timeout=30_000)
        after = state.trace["blocks.0.mlp.out"][0]
        assert not torch.allclose(after[0], before[0])  # the first token had chosen it
    finally:
        win.close()


def test_the_layers_panel_shows_routing_and_expert_load(qtbot, mixtral_dir, tmp_path, isolated_user_files,
                                                        error_watch):
    win, state = open_window(qtbot, mixtral_dir, text=TEXT, watch=error_watch)
    try:
        panel = click_panel_tab(qtbot, win, "Layers")
        qtbot.waitUntil(lambda: panel.data is not None, timeout=30_000)
        click_tab(qtbot, panel.tabs, "Routing")
        panel.set_depth(2)  # after block 1: block 1's router
        hm = panel.widgets["routing"]
        probs = torch.softmax(state.trace["blocks.1.mlp.router"][0].float(), -1).numpy()
        assert hm.values.shape == (len(TEXT), 8) and abs(hm.values - probs).max() < 1e-6
        assert "block L1" in hm.plot.titleLabel.text
        win.grab().save(str(tmp_path / "routing.png"))  # looked at when the view was made
        click_tab(qtbot, panel.tabs, "Expert load")
        load = panel.widgets["expert-load"].values
        chosen = state.trace["blocks.0.mlp.experts"][0].flatten()
        assert load.shape == (2, 8) and abs(load[0, 3] - float((chosen == 3).sum()) / chosen.numel()) < 1e-9
    finally:
        win.close()
    # a dense model has no router: its Layers panel has no mixture-of-experts tabs (they drew a blank map)
    from desktop_app.core.checkpoints import new_model
    tok = char_tokenizer("abcdefghijklmnopqrstuvwxyz .")
    dense = REGISTRY["llama"].preset(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=4, d_ff=32,
                                     context_length=64)
    save_model_folder(new_model(dense, seed=0), tmp_path / "dense", tokenizer=tok)
    win, state = open_window(qtbot, mixtral_dir, text=TEXT, watch=error_watch)
    try:
        panel = click_panel_tab(qtbot, win, "Layers")
        qtbot.waitUntil(lambda: panel.data is not None, timeout=30_000)
        click_tab(qtbot, panel.tabs, "Expert load")
        bar = panel.tabs.tabBar()
        moe_tabs = [bar.tabText(i) for i in range(bar.count()) if bar.isTabVisible(i)][-3:]
        assert moe_tabs == ["Routing", "Expert norms", "Expert load"]
        with qtbot.waitSignal(state.model_changed, timeout=30_000):
            win.open_model(tmp_path / "dense")
        qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
        shown = [bar.tabText(i) for i in range(bar.count()) if bar.isTabVisible(i)]
        assert not set(moe_tabs) & set(shown) and "Residual norms" in shown
        current = bar.tabText(panel.tabs.currentIndex())
        assert current in shown and panel.view_state.view not in panel.MIXTURE_VIEWS  # it gave way to a view shown
        qtbot.waitUntil(lambda: panel.data is not None and panel.data.result.router_probs is None, timeout=30_000)
        assert panel.current_view().isVisible()
    finally:
        win.close()


def test_expert_norms_routing_strip_and_forced_routing_when_clicked(qtbot, mixtral_dir, tmp_path, isolated_user_files,
                                                                     error_watch):
    """The Layers panel's Expert norms are |w_e expert_e(x)| (checked against expert_out recorded by name);
    the strip under the Model panel's chips shows each token's experts at the chosen layer; the Ablate tab
    forces a token's routing, and the trace every panel reads (and that strip) then shows it."""
    win, state = open_window(qtbot, mixtral_dir, text=TEXT, watch=error_watch)
    try:
        panel = click_panel_tab(qtbot, win, "Layers")
        qtbot.waitUntil(lambda: panel.data is not None, timeout=30_000)
        click_tab(qtbot, panel.tabs, "Expert norms")
        panel.set_depth(2)  # after block 1
        ids = torch.tensor([state.token_ids])
        _, ref = state.loaded.model.run_with_trace(ids, ["blocks.1.mlp.expert_out.*"])
        want = torch.stack([ref[f"blocks.1.mlp.expert_out.{e}"][0].float().norm(dim=-1) for e in range(8)], -1)
        hm = panel.widgets["expert-norms"]
        assert hm.values.shape == (len(TEXT), 8) and abs(hm.values - want.numpy()).max() < 1e-4
        assert ((hm.values > 0).sum(-1) == 2).all()  # top-2: two experts per token
        win.grab().save(str(tmp_path / "expert-norms.png"))

        model_panel = click_panel_tab(qtbot, win, "Model")
        assert model_panel.routing_strip.isVisible()
        type_into(qtbot, model_panel.routing_layer, "1")
        chosen = state.trace["blocks.1.mlp.experts"][0].tolist()
        canvas = model_panel.routing_strip.canvas
        assert canvas.strings[4].endswith("\u2192" + ",".join(f"E{e}" for e in chosen[4]))
        qtbot.mouseClick(canvas, Qt.MouseButton.LeftButton, pos=model_panel.routing_strip.chip_center(4))
        assert model_panel.token_info.text().startswith(f"token #4 at layer 1: experts E{chosen[4][0]} (")
        win.grab().save(str(tmp_path / "routing-strip.png"))

        whatif = click_panel_tab(qtbot, win, "What if")
        click_tab(qtbot, whatif.tabs, "Ablate")
        qtbot.waitUntil(whatif.route_row.isVisible, timeout=10_000)  # shown for a mixture of experts
        before = state.trace["blocks.0.mlp.experts"][0, 2].tolist()
        forced = [e for e in range(8) if e not in before][:2]
        type_into(qtbot, whatif.route_layer, "0")
        type_into(qtbot, whatif.route_position, "2")
        qtbot.keyClicks(whatif.route_experts, f"{forced[0]},{forced[1]}")
        with qtbot.waitSignal(state.trace_changed, timeout=30_000):
            qtbot.mouseClick(whatif.route_button, Qt.MouseButton.LeftButton)
        assert [iv.target for iv in state.interventions] == ["blocks.0.mlp.experts"]
        qtbot.waitUntil(lambda: state._trace_job is None and state.trace is not None, timeout=30_000)
        assert state.trace["blocks.0.mlp.experts"][0, 2].tolist() == forced
        win.grab().save(str(tmp_path / "forced.png"))
        model_panel = click_panel_tab(qtbot, win, "Model")
        type_into(qtbot, model_panel.routing_layer, "0")
        assert model_panel.routing_strip.canvas.strings[2].endswith(f"\u2192E{forced[0]},E{forced[1]}")
        # a bad routing is one line, nothing applied
        whatif = click_panel_tab(qtbot, win, "What if")
        whatif.route_experts.clear()
        qtbot.keyClicks(whatif.route_experts, "1,1")
        qtbot.mouseClick(whatif.route_button, Qt.MouseButton.LeftButton)
        assert whatif.ablate_status.text().startswith("Cannot route:") and "must differ" in whatif.ablate_status.text()
        assert len(state.interventions) == 1
    finally:
        win.close()
