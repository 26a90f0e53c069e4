"""Issue 37 §6: `train --task transcoder` / `--task clt` (core.training.sae's loop) save circuit-tracer's format,
which `graph` reads; the reported reconstruction is the saved files' own; a stopped run resumes exactly."""
from __future__ import annotations

import json

import pytest
import torch

from desktop_app.paths import resources_dir
from desktop_app.cli import main
from desktop_app.commands import load_model
from desktop_app.core.graphs import load_transcoders

pytestmark = pytest.mark.usefixtures("one_torch_thread")
DEMO = str(resources_dir() / "demo-model")


@pytest.fixture(scope="module")
def demo():
    loaded = load_model(DEMO)
    loaded.model.eval()
    return loaded


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "t.txt"
    path.write_text((resources_dir() / "demo-text.txt").read_text(encoding="utf-8")[:3000], encoding="utf-8")
    return path


def _run(text, **kw):
    from desktop_app.core.training.sae import SaeTrainConfig

    settings = dict(text_file=str(text), task="clt", architecture="relu", d_sae=16, steps=12, batch_size=32,
                    log_every=3, eval_every=6, checkpoint_every=4, l1_coefficient=1.0)
    return SaeTrainConfig(**{**settings, **kw})


def _reconstruction(transcoders, x: torch.Tensor) -> torch.Tensor:
    """Each layer's MLP output [N, L, d] as the loaded files reconstruct it from the MLP inputs x [N, L, d]."""
    L = transcoders.n_layers
    out = torch.stack([transcoders.b_dec(l).expand(len(x), -1) for l in range(L)], 1).clone()
    for l in range(L):
        acts = transcoders.encode(l, x[:, l])
        dec = transcoders.feature_rows_layer(l)  # [F, outputs, d]
        for k, t in enumerate(transcoders.output_layers(l)):
            out[:, t] += acts @ dec[:, k]
    return out


@pytest.mark.parametrize("task", ["transcoder", "clt"])
def test_a_few_steps_save_circuit_tracers_format_that_graph_reads(demo, text, tmp_path, capsys, task):
    """`train --task transcoder|clt` for a few steps: the folder opens as circuit-tracer's per-layer set /
    cross-layer transcoder on mlp.hook_in -> mlp.hook_out, the held-out variance explained it reports is the
    saved files' own on the model's activations (the training scale folded back), and `graph` runs on it."""
    from desktop_app.core.features.hooks import hook_point
    from desktop_app.core.inputs import text_file_ids
    from desktop_app.core.training.sae import collect_activations

    out = tmp_path / task
    code = main(["train", "--task", task, "--model", DEMO, "--text-file", str(text), "--out", str(out),
                 "--d-sae", "16", "--steps", "12", "--batch-size", "32", "--eval-every", "6", "--l1-coefficient", "1"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    summary = json.loads(printed.strip().splitlines()[-1])
    assert "per layer: variance_explained" in printed and "replacement_score" in printed
    L = demo.config.n_layers
    assert summary["step"] == 12 and len(summary["variance_explained_per_layer"]) == L == len(summary["l0_per_layer"])
    assert 0 < summary["replacement_score"] <= 1 and summary["dead"] >= 0
    tc = load_transcoders(out)
    assert tc.kind == {"transcoder": "transcoder_set", "clt": "cross_layer_transcoder"}[task]
    assert (tc.n_layers, tc.n_features, tc.d_model) == (L, 16, demo.config.d_model)
    assert (tc.input_hook, tc.output_hook, tc.activation) == ("mlp.hook_in", "mlp.hook_out", "relu")
    ids = text_file_ids(demo, str(text))
    held_out = ids[int(len(ids) * 0.9):]  # the run's held-out tokens (heldout_fraction 0.1)
    x, y = collect_activations(demo, held_out, [hook_point(f"blocks.{l}.mlp.input", demo.config) for l in range(L)],
                               [hook_point(f"blocks.{l}.mlp.out", demo.config) for l in range(L)], 10**6)
    recon = _reconstruction(tc, x).double()
    err = (y.double() - recon).pow(2).sum((0, 2))
    total = (y.double() - y.double().mean(0)).pow(2).sum((0, 2))
    assert (1 - err / total).tolist() == pytest.approx(summary["variance_explained_per_layer"], abs=1e-4)
    graph_out = tmp_path / "g.json"
    assert main(["graph", DEMO, "--transcoders", str(out), "--prompt", "Alice was beginning", "--out",
                 str(graph_out)]) == 0
    made = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert made["active_features"] > 0 and 0 < made["replacement_score"] <= 1 and graph_out.is_file()


def test_a_stopped_clt_run_resumes_to_the_weights_of_an_uninterrupted_one(demo, text, tmp_path):
    from safetensors.torch import load_file

    from desktop_app.core.training import TrainControl
    from desktop_app.core.training.sae import sae_checkpoint_step, train_sae

    cfg = _run(text)
    train_sae(cfg, demo, tmp_path / "straight")
    control, events = TrainControl(), []

    def on_event(ev):
        events.append(ev)
        if ev["event"] == "step" and ev["step"] == 6:
            control.cancel()

    summary, _ = train_sae(cfg, demo, tmp_path / "stopped", on_event=on_event, control=control)
    assert events[-1]["event"] == "stopped" and summary["step"] == 6 == sae_checkpoint_step(tmp_path / "stopped")
    assert load_transcoders(tmp_path / "stopped").cross_layer  # what `graph` reads, at every checkpoint
    events.clear()
    train_sae(cfg, demo, tmp_path / "stopped", on_event=events.append, resume=True)
    assert events[0]["step"] == 6 and events[0]["resumed"]
    names = [f"W_{part}_{l}.safetensors" for part in ("enc", "dec") for l in range(demo.config.n_layers)]
    for name in names:
        straight, resumed = load_file(str(tmp_path / "straight" / name)), load_file(str(tmp_path / "stopped" / name))
        assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)
    with pytest.raises(ValueError, match="trained with task 'clt', not 'transcoder'"):
        train_sae(_run(text, task="transcoder", steps=20), demo, tmp_path / "stopped", resume=True)


def test_transcoders_train_with_relu_only(text):
    assert "trains with architecture relu" in _run(text, architecture="topk").problem()


@pytest.mark.slow
def test_a_clt_trained_on_the_demo_text_gives_a_graph_whose_replacement_score_is_above_a_floor(demo, tmp_path):
    """A small CLT (64 features per layer, 300 steps on the demo text) explains the demo model's prediction
    after a held-out prompt: the graph's replacement score (the share of the tokens' influence on the logits
    that does not pass through error nodes) is above 0.4."""
    from desktop_app.core.graphs import attribute, build_context, graph_scores, salient_targets, with_leading_special
    from desktop_app.core.training.sae import train_sae

    cfg = _run(resources_dir() / "demo-text.txt", d_sae=64, steps=300, batch_size=256, eval_every=300,
               checkpoint_every=300, log_every=50)
    summary, transcoders = train_sae(cfg, demo, tmp_path / "clt")
    assert summary["replacement_score"] > 0.4
    from desktop_app.core.inputs import encode

    ids = with_leading_special(encode(demo, "Alice was not a bit hurt, and she jumped up", cut=False,
                                      special_tokens=False).ids, demo.tokenizer)
    ctx = build_context(demo.model, ids, load_transcoders(tmp_path / "clt"))
    graph = attribute(ctx, salient_targets(demo.model, ctx.frozen.logits[-1], 10, 0.95, str))
    assert graph_scores(graph)[0] > 0.4


def test_the_replacement_score_prompt_fits_a_model_whose_context_it_fills(demo, text, tmp_path):
    """The held-out prompt is REPLACEMENT_TOKENS long and the graph puts a special token first: on a model
    whose context is exactly that long (a run trained here with --context 32), the score is still computed
    (it ended in "sequence of 33 tokens exceeds the context length 32")."""
    import dataclasses

    from desktop_app.core.graphs.transcoders import random_transcoders
    from desktop_app.core.inputs import text_file_ids
    from desktop_app.core.model import Transformer
    from desktop_app.core.training.sae import REPLACEMENT_TOKENS, _replacement_score

    cfg = demo.config.replace(context_length=REPLACEMENT_TOKENS)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()

    class WithBos:  # the demo's tokenizer has no special token; a trained run's may have a BOS
        def special_id(self, name):
            return 1 if name == "bos" else None

    loaded = dataclasses.replace(demo, model=model, config=cfg, tokenizer=WithBos())
    ids = [int(i) for i in text_file_ids(demo, text)[1:REPLACEMENT_TOKENS + 1]]  # no BOS: the score adds one
    assert len(ids) == REPLACEMENT_TOKENS
    random_transcoders(tmp_path / "clt", cfg.n_layers, cfg.d_model, 8, cross_layer=True)
    transcoders = load_transcoders(tmp_path / "clt")
    score = _replacement_score(loaded, transcoders, ids)
    assert score is not None and 0.0 <= score <= 1.0
