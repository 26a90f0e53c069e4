"""Issue 16, "every panel works on it": each text family's folder, as `transformers` writes it (a tiny
random model + a character tokenizer.json), opened in the app window and clicked through as a
person would: Model (type a text, tokens appear), Attention (a thumbnail click, every view tab),
Layers (every view tab, the logit lens), Generate (decoders: Start and Step; encoders: fill a
[MASK]) and Lipschitz (a layer and one head, small lengths). No error dialog, no error log, no
AppState.error. Texts are longer than every sliding window (4 or 5 tokens here).

The families are the registry's text families (core/families REGISTRY, less the encoder-decoders and
image models, which have walkthroughs of their own): a family added there is walked through here with
the first case of its parity case file (tests/parity/family_cases/<model_type>.py) unless _build has a
configuration of its own. Four representative families run by default (LLaMA with Llama 3's rope
scaling and a head_dim of its own, RoBERTa's offset positions and <mask>, Gemma 3's windows, norms and
scalings, Gemma 2's soft-capped attention, which the Lipschitz lab refuses in one line); all run with
-m slow.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt

from desktop_app.core.families import REGISTRY
from desktop_app.core.generation import GenerationSession, MaskedFillSession
from desktop_app.core.lipschitz.measured import unmeasured
from desktop_app.core.tokenizer import char_tokenizer

from .walkthrough import click_panel_tab, click_tab, open_window, shown_tab_titles, type_into

transformers = pytest.importorskip("transformers")

LEFT = Qt.MouseButton.LeftButton
VOCAB = 97
CONTEXT = 128
ALPHABET = "abcdefghijklmnopqrstuvwxyz .,"
TEXT = "the cat sat on the mat. the dog sat on the log."  # 47 characters: past every window
NEW_TEXT = "the dog sat on the cat, and the cat sat."
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # <pad> = 1, RoBERTa's padding_idx
DECODER_SPECIALS = ("<|endoftext|>",)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16, "rope_theta": 500000.0}
NO_SPECIAL_IDS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _decoder(cls, config_cls, **kw):
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=CONTEXT, **NO_SPECIAL_IDS)
    return cls(config_cls(**{**base, **kw}))


# family -> (a tiny random transformers model, the tokenizer's special tokens); the smallest
# configs of tests/parity/test_family_*.py with room for the text, and each family's own switches on
def _build(family: str):
    t = transformers
    if family == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=32, n_layer=2,
                                              n_head=4)), DECODER_SPECIALS
    if family == "bert":
        return t.BertForMaskedLM(t.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4, intermediate_size=64,
                                              max_position_embeddings=CONTEXT)), BERT_SPECIALS
    if family == "roberta":
        return t.RobertaForMaskedLM(t.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=4, intermediate_size=64,
                                                    max_position_embeddings=CONTEXT + 2)), ROBERTA_SPECIALS
    if family == "distilbert":
        return t.DistilBertForMaskedLM(t.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4,
                                                          hidden_dim=64, max_position_embeddings=CONTEXT)), \
            BERT_SPECIALS
    if family == "llama":
        return _decoder(t.LlamaForCausalLM, t.LlamaConfig, head_dim=16, rope_parameters=LLAMA3_ROPE), \
            DECODER_SPECIALS
    if family == "gpt_neox":
        return t.GPTNeoXForCausalLM(t.GPTNeoXConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=CONTEXT, hidden_act="gelu", use_parallel_residual=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            **NO_SPECIAL_IDS)), DECODER_SPECIALS
    if family == "gpt_neo":
        return t.GPTNeoForCausalLM(t.GPTNeoConfig(
            vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
            window_size=4, intermediate_size=64, max_position_embeddings=CONTEXT, activation_function="gelu_new",
            bos_token_id=None, eos_token_id=None)), DECODER_SPECIALS
    if family == "opt":
        return t.OPTForCausalLM(t.OPTConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
            max_position_embeddings=CONTEXT, word_embed_proj_dim=32, pad_token_id=1, bos_token_id=None,
            eos_token_id=None)), DECODER_SPECIALS
    if family == "qwen2":
        return _decoder(t.Qwen2ForCausalLM, t.Qwen2Config, num_hidden_layers=3, use_sliding_window=True,
                        sliding_window=4, max_window_layers=1), DECODER_SPECIALS
    if family == "qwen3":
        return _decoder(t.Qwen3ForCausalLM, t.Qwen3Config, head_dim=16, tie_word_embeddings=True), DECODER_SPECIALS
    if family == "mistral":
        return _decoder(t.MistralForCausalLM, t.MistralConfig, sliding_window=5), DECODER_SPECIALS
    if family == "gemma3_text":
        return _decoder(t.Gemma3ForCausalLM, t.Gemma3TextConfig, num_hidden_layers=3, head_dim=16,
                        query_pre_attn_scalar=24, sliding_window=4, final_logit_softcapping=30.0,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                            "rope_theta": 1000.0},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}), \
            DECODER_SPECIALS
    return _parity_case(family)(), DECODER_SPECIALS if REGISTRY[family].decoder else BERT_SPECIALS


PARITY = Path(__file__).resolve().parents[1] / "parity"


def _parity_case(family: str):
    """The first case of the family's parity case file (its cases build room for the text: vocabulary 97,
    128 positions); the case files import the parity helpers by their plain names."""
    if str(PARITY) not in sys.path:
        sys.path.insert(0, str(PARITY))
    return next(iter(importlib.import_module(f"family_cases.{family}").CASES.values()))


# the registry's text families (encoder-decoders and image models have walkthroughs of their own)
FAMILIES = tuple(name for name, f in REGISTRY.items()
                 if not f.encoder_decoder and f.preset().input_kind == "tokens")
FAST = ("llama", "roberta", "gemma3_text", "gemma2")


def _family_folder(root: Path, family: str) -> Path:
    import torch

    torch.manual_seed(0)
    hf, specials = _build(family)
    folder = root / family
    hf.save_pretrained(folder)
    tokenizer = char_tokenizer(ALPHABET, specials=specials)
    assert tokenizer.vocab_size <= VOCAB
    tokenizer.save(folder / "tokenizer.json")
    return folder


@pytest.fixture(scope="module")
def family_root(tmp_path_factory):
    return tmp_path_factory.mktemp("family-folders")


def _wait_traced(qtbot, state):
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    qtbot.waitUntil(lambda: state.trace is not None or state.trace_problem != "", timeout=30_000)
    assert state.trace is not None, state.trace_problem


def _model_panel(qtbot, window, state):
    click_panel_tab(qtbot, window, "Model")
    model = window.slot("Model").panel
    model.text_edit.setFocus()
    model.text_edit.selectAll()
    with qtbot.waitSignal(state.trace_changed, timeout=30_000):
        qtbot.keyClicks(model.text_edit, NEW_TEXT)
    qtbot.waitUntil(lambda: state.text == NEW_TEXT, timeout=30_000)
    _wait_traced(qtbot, state)
    n = len(state.token_ids)
    assert n >= len(NEW_TEXT) and model.token_strip.count() == n  # one token a character
    qtbot.mouseClick(model.token_strip.canvas, LEFT, pos=model.token_strip.chip_center(1))
    assert model.token_info.text().startswith(f"token #1: id {state.token_ids[1]}")
    return n


def _attention_panel(qtbot, window, cfg, n):
    click_panel_tab(qtbot, window, "Attention")
    attention = window.slot("Attention").panel
    qtbot.waitUntil(lambda: len(attention.model_view.boxes) == cfg.n_layers * cfg.n_heads
                    and attention.stats is not None, timeout=30_000)
    mv = attention.model_view
    layer, head = cfg.n_layers - 1, cfg.n_heads - 1
    qtbot.mouseClick(mv.viewport(), LEFT, pos=mv.mapFromScene(mv.thumb_scene_center(layer, head)))
    assert (attention.layer, attention.head) == (layer, head)
    assert attention.current_view() is attention.heatmap and attention.heatmap.values.shape == (n, n)
    if cfg.sliding_window is not None:
        _check_sliding_window_shown(qtbot, attention, cfg, n)
    for title in attention.VIEW_TITLES:
        click_tab(qtbot, attention.tabs, title)
    click_tab(qtbot, attention.tabs, "Head statistics")
    assert attention.stats_map.values.shape == (cfg.n_layers, cfg.n_heads)
    click_tab(qtbot, attention.tabs, "Head view")
    assert len(attention.head_view.checks) == cfg.n_heads
    click_tab(qtbot, attention.tabs, "Mean over heads")
    assert attention.mean_map.values.shape == (n, n)


def _check_sliding_window_shown(qtbot, attention, cfg, n):
    """The heatmap of a windowed layer (a thumbnail clicked) gives the last token at most
    `sliding_window` keys, a full layer's gives it all n: the text runs past the window."""
    import numpy as np

    types = cfg.layer_types or ["sliding_attention"] * cfg.n_layers
    mv = attention.model_view
    for layer, kind in enumerate(types):
        qtbot.mouseClick(mv.viewport(), LEFT, pos=mv.mapFromScene(mv.thumb_scene_center(layer, 0)))
        assert (attention.layer, attention.head) == (layer, 0)
        last_row = np.nan_to_num(np.asarray(attention.heatmap.values[n - 1], dtype=float))
        seen = int(np.count_nonzero(last_row > 0))
        if kind == "sliding_attention":
            assert 1 <= seen <= cfg.sliding_window < n, (layer, seen)
        else:
            assert seen == n, (layer, seen)


def _layers_panel(qtbot, window, cfg, n):
    click_panel_tab(qtbot, window, "Layers")
    layers = window.slot("Layers").panel
    qtbot.waitUntil(lambda: layers.result is not None, timeout=30_000)
    mixture = bool(getattr(layers.state.loaded.config, "num_experts", 0))
    moe_titles = {v.title for v in layers.VIEW_TABLE if v.name in layers.MIXTURE_VIEWS}
    assert moe_titles <= set(shown_tab_titles(layers.tabs)) if mixture else not moe_titles & set(shown_tab_titles(layers.tabs))
    for title in shown_tab_titles(layers.tabs):
        click_tab(qtbot, layers.tabs, title)
    layers.depth_slider.setFocus()
    qtbot.keyClick(layers.depth_slider, Qt.Key.Key_End)
    assert layers.depth_slider.value() == cfg.n_layers
    assert layers.lens_view.lens.rowCount() == n  # the logit lens: one row a position


def _idle(qtbot, panel):
    qtbot.waitUntil(lambda: not panel.busy, timeout=20_000)
    qtbot.wait(5)


def _generate_panel(qtbot, window, state):
    click_panel_tab(qtbot, window, "Generate")
    panel = window.panel("Generate")
    qtbot.waitUntil(lambda: panel.start_button.isVisible())
    assert panel.prompt.text()
    qtbot.mouseClick(panel.start_button, LEFT)
    if state.loaded.config.causal:
        qtbot.waitUntil(lambda: isinstance(panel.session, GenerationSession), timeout=20_000)
        _idle(qtbot, panel)
        for depth in (1, 2, 3):
            qtbot.mouseClick(panel.step_button, LEFT)
            qtbot.waitUntil(lambda: panel.session.current.depth == depth, timeout=20_000)
            _idle(qtbot, panel)
            assert panel.status.text().startswith(f"Step {depth}:"), panel.status.text()
        assert all(0 <= t < state.loaded.config.vocab_size for t in panel.session.ids())
    else:
        qtbot.waitUntil(lambda: isinstance(panel.session, MaskedFillSession), timeout=20_000)
        _idle(qtbot, panel)
        assert len(panel.session.masked) == 1  # the default prompt has one mask token
        position = panel.session.masked[0] if isinstance(panel.session.masked, list) else \
            next(iter(panel.session.masked))
        qtbot.mouseClick(panel.step_button, LEFT)
        qtbot.waitUntil(lambda: panel.session.finished, timeout=20_000)
        _idle(qtbot, panel)
        assert panel.session.history[0].position == position
        assert panel.session.ids()[position] != state.loaded.tokenizer.mask_token_id
        assert "filled" in panel.status.text()


def _lipschitz_run(qtbot, panel):
    rows = panel.table.rowCount()
    qtbot.mouseClick(panel.run_button, LEFT)
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=60_000)
    assert "failed" not in panel.status.text(), panel.status.text()
    assert "exponent" in panel.status.text(), panel.status.text()
    assert panel.table.rowCount() > rows
    assert [r.n for r in panel.runs[-1].result.lengths] == [4, 8]


def _lipschitz_refused(qtbot, panel, problem):
    """A family whose attention the lab does not compute faithfully: Run gives the one-line refusal."""
    qtbot.mouseClick(panel.run_button, LEFT)
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=60_000)
    assert problem in panel.status.text(), panel.status.text()
    assert not panel.runs


def _lipschitz_panel(qtbot, window, cfg):
    panel = click_panel_tab(qtbot, window, "Lipschitz")
    assert panel.source.currentText() == "Model layer"
    assert panel.masked.isChecked() == cfg.causal
    type_into(qtbot, panel.lengths, "4,8")
    type_into(qtbot, panel.layer, str(cfg.n_layers - 1))
    assert panel.layer.value() == cfg.n_layers - 1
    if unmeasured(cfg):
        return _lipschitz_refused(qtbot, panel, unmeasured(cfg))
    _lipschitz_run(qtbot, panel)  # the whole attention sublayer of the last layer
    assert panel.head.currentText() == "whole sublayer"
    panel.head.setFocus()
    qtbot.keyClick(panel.head, Qt.Key.Key_Down)  # whole sublayer -> head 0 -> head 1
    qtbot.keyClick(panel.head, Qt.Key.Key_Down)
    assert panel.head.currentText() == "head 1"
    _lipschitz_run(qtbot, panel)  # one head of it
    assert len(panel.runs) == 2


@pytest.mark.parametrize("family", [f if f in FAST else pytest.param(f, marks=pytest.mark.slow)
                                    for f in FAMILIES])
def test_every_panel_works_on_the_family(qtbot, family, family_root, isolated_user_files, error_watch):
    folder = _family_folder(family_root, family)
    window, state = open_window(qtbot, folder, text=TEXT, watch=error_watch)
    window.resize(1200, 800)
    cfg = state.loaded.config
    assert cfg.family == family
    _wait_traced(qtbot, state)
    assert len(state.token_ids) == len(TEXT)
    n = _model_panel(qtbot, window, state)
    _attention_panel(qtbot, window, cfg, n)
    _layers_panel(qtbot, window, cfg, n)
    _generate_panel(qtbot, window, state)
    _lipschitz_panel(qtbot, window, cfg)
    error_watch.assert_clean()
