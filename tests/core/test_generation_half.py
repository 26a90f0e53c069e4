"""One-token steps in bfloat16 on the CPU (issue 27): pack_for_decoding fuses Q/K/V and a gated MLP's gate
and up into one product each, every weight kept row-major, and generation still gives transformers' greedy
ids at the same dtype, with the logits of the unpacked model."""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.generation import GenerationSession, GenerationSettings
from desktop_app.core.model import packed_linears

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

SHAPES = {  # Qwen2: Q/K/V biases, GQA, tied; Llama: no biases, MQA, untied
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)),
}


@pytest.mark.parametrize("family", list(SHAPES))
def test_bfloat16_steps_fuse_their_products_and_keep_transformers_greedy_ids(family, tmp_path):
    torch.manual_seed(0)
    hf = SHAPES[family]().to(torch.bfloat16).eval()
    hf.save_pretrained(tmp_path)
    loaded = load_model_folder(tmp_path, dtype="bfloat16")
    plain = load_model_folder(tmp_path, dtype="bfloat16").model  # never packed
    assert loaded.model.dtype == torch.bfloat16
    prompt = torch.randint(3, 97, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    steps = 24
    session = GenerationSession(loaded, prompt, GenerationSettings("greedy"), stop_tokens=[])
    for block in loaded.model.blocks:  # one product for Q/K/V and one for gate/up, row-major
        for linears in ((block.attn.q, block.attn.k, block.attn.v), (block.mlp.gate, block.mlp.up)):
            packed = packed_linears(linears)
            assert packed is not None
            assert packed[0].is_contiguous() and all(lin.weight.is_contiguous() for lin in linears)
            assert (packed[1] is None) == (linears[0].bias is None)
    nodes = list(session.run(steps))
    assert len(nodes) == steps
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                          num_beams=1, pad_token_id=0, eos_token_id=None)[0].tolist()
        plain_logits = plain(torch.tensor([session.ids()])).logits[0].float()
    ids = session.ids()
    first = next((i for i, (a, b) in enumerate(zip(ids, ref)) if a != b), None)
    if first is not None:  # only where bfloat16 rounding decides a tie: transformers' own full forward
        with torch.no_grad():  # puts its two best tokens there within a rounding step
            top = hf(torch.tensor([ref[:first]])).logits[0, -1].float().topk(2).values
        assert top[0] - top[1] <= 0.01 * top[0].abs(), (first, ids, ref)
        assert first >= len(prompt) + steps // 2
    # each one-token step's logits (after generated token i) are the unpacked model's full forward's there
    for i, node in enumerate(nodes):
        expected = plain_logits[len(prompt) + i]
        assert (node.next_logits - expected).abs().max() <= 0.02 * expected.abs().max(), i
    # the packed weights are the checkpoint's values, parameters unchanged in name, shape and value
    for (n1, p1), (n2, p2) in zip(loaded.model.named_parameters(), plain.named_parameters()):
        assert n1 == n2 and p1.shape == p2.shape and torch.equal(p1, p2), n1


def test_the_generation_bench_times_the_fused_products_a_bfloat16_step_makes(tmp_path, monkeypatch):
    from desktop_app.benchmarks.generation import step_products

    torch.manual_seed(0)
    SHAPES["llama"]().to(torch.bfloat16).save_pretrained(tmp_path)
    model = load_model_folder(tmp_path, dtype="bfloat16").model
    model.pack_for_decoding()
    run = step_products(model)
    shapes = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b=None: shapes.append(tuple(w.shape)) or real(x, w, b))
    run()
    cfg = model.cfg  # per block: Q/K/V as one, W_O, gate and up as one, down; then the unembedding
    per_block = [(cfg.n_heads * cfg.d_head + 2 * cfg.n_kv_heads * cfg.d_head, cfg.d_model),
                 (2 * cfg.d_ff, cfg.d_model), (cfg.d_model, cfg.n_heads * cfg.d_head), (cfg.d_model, cfg.d_ff)]
    assert sorted(shapes) == sorted(per_block * cfg.n_layers + [(cfg.vocab_size, cfg.d_model)])
