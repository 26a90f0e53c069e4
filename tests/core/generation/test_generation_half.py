"""One-token steps in bfloat16 on the CPU (issue 27): pack_for_decoding prepacks Q/K/V and a gated MLP's gate
and up as one product each, the weights left as loaded, and generation still gives transformers' greedy
ids at the same dtype, with the logits of the unpacked model."""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.generation import GenerationSession, GenerationSettings
from desktop_app.core import model as model_module

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
ROPE_LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
BIT_FOR_BIT = dict(SHAPES, **{"llama3-rope": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
    vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rope_theta=500_000.0, rope_scaling=ROPE_LLAMA3,
    tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)),
    # bench scale's Pythia-1.4B shape: a parallel residual summed (mlp + attn) + input, as transformers sums it
    "gpt_neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=97, hidden_size=64, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
        max_position_embeddings=128, use_parallel_residual=True, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.25},
        bos_token_id=None, eos_token_id=None, pad_token_id=None)),
    # and Gemma-3-1B's: MQA, sliding layers (a window shorter than the prompt) beside a full one
    "gemma3_text": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        vocab_size=97, hidden_size=72, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"], max_position_embeddings=128,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        bos_token_id=None, eos_token_id=None, pad_token_id=None))})


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
    loaded_at = {name: p.data_ptr() for name, p in loaded.model.named_parameters()}
    session = GenerationSession(loaded, prompt, GenerationSettings("greedy"), stop_tokens=[])
    # the weights stay where the load put them: no copy laid out side by side (issue 38: half the weights
    # copied again at the 0.5B shape, before the prepacked copy was made from that copy)
    assert {name: p.data_ptr() for name, p in loaded.model.named_parameters()} == loaded_at
    if torch.backends.mkldnn.is_available():  # one prepacked product for Q/K/V and one for gate/up
        for block in loaded.model.blocks:
            for owner, linears in ((block.attn, (block.attn.q, block.attn.k, block.attn.v)),
                                   (block.mlp, (block.mlp.gate, block.mlp.up))):
                kept = model_module._prepacked(owner, linears)
                assert kept is not None and kept.weight.shape == (sum(lin.out_features for lin in linears),
                                                              linears[0].in_features)
                assert (kept.bias is None) == (linears[0].bias is None)
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
    shapes, prepacked = [], []
    real = model_module.products

    def spy(owner, x, linears):
        shapes.append((sum(lin.out_features for lin in linears), linears[0].in_features))
        prepacked.append(model_module._prepacked(owner, linears) is not None)
        return real(owner, x, linears)
    monkeypatch.setattr(model_module, "products", spy)
    run()
    # as a step multiplies: through model.products, by the prepacked weights where oneDNN has them
    assert all(prepacked) or not torch.backends.mkldnn.is_available()
    cfg = model.cfg  # per block: Q/K/V as one, W_O, gate and up as one, down; then the unembedding
    per_block = [(cfg.n_heads * cfg.d_head + 2 * cfg.n_kv_heads * cfg.d_head, cfg.d_model),
                 (2 * cfg.d_ff, cfg.d_model), (cfg.d_model, cfg.n_heads * cfg.d_head), (cfg.d_model, cfg.d_ff)]
    assert sorted(shapes) == sorted(per_block * cfg.n_layers + [(cfg.vocab_size, cfg.d_model)])


def _hidden_states(model, ids: torch.Tensor, cache) -> list[torch.Tensor]:
    """Our hidden states as transformers' output_hidden_states gives them (the last after the final norm)."""
    from desktop_app.core.trace import Trace
    trace = Trace(("embed", "blocks.*.resid_post", "final_norm.out"))
    with torch.inference_mode():
        model(ids, trace=trace, cache=cache)
    return trace.hidden_states()


@pytest.mark.parametrize("family", list(BIT_FOR_BIT))
def test_a_bfloat16_prompt_and_step_equal_transformers_default_attention_bit_for_bit(family, tmp_path):
    """Every hidden state of the prompt's forward and of a cached one-token step, bit for bit, against
    transformers' default (SDPA) attention in bfloat16: rotary positions in the activations' dtype, cos
    and sin rounded to it, as transformers computes them (they were computed in float32 and rounded
    once: layer 1 already differed, and greedy ids drifted from transformers' on near ties)."""
    from desktop_app.core.model import KVCache
    torch.manual_seed(0)
    BIT_FOR_BIT[family]().to(torch.bfloat16).save_pretrained(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    model = load_model_folder(tmp_path, dtype="bfloat16").model
    model.pack_for_decoding()  # as a generation session runs it
    prompt = torch.randint(3, 97, (1, 12), generator=torch.Generator().manual_seed(1))
    cache = KVCache(model.cfg.n_layers)
    with torch.no_grad():
        out = hf(prompt, output_hidden_states=True, use_cache=True)
        ours = _hidden_states(model, prompt, cache)
        for i, (a, b) in enumerate(zip(out.hidden_states, ours)):
            assert torch.equal(a, b), f"prompt: hidden state {i} differs by {(a.float() - b.float()).abs().max()}"
        step = out.logits[0, -1].argmax().view(1, 1)
        out = hf(step, past_key_values=out.past_key_values, output_hidden_states=True, use_cache=True)
        ours = _hidden_states(model, step, cache)
        for i, (a, b) in enumerate(zip(out.hidden_states, ours)):
            assert torch.equal(a, b), f"step: hidden state {i} differs by {(a.float() - b.float()).abs().max()}"


def test_bfloat16_greedy_ids_equal_transformers_recording_or_not(tmp_path):
    """Greedy ids the same as transformers' generate in bfloat16 (its default attention), whether the
    session records (as the Generate panel does) or not. A random checkpoint with near-tied logits:
    recording used to run the prompt's attention unfused (as transformers' eager attention does, not
    its default), and with the rotary rounding of before, a prompt's ids parted from transformers'."""
    config = transformers.Qwen2Config(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                      rope_theta=1_000_000.0, tie_word_embeddings=True,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    loaded = load_model_folder(tmp_path, dtype="bfloat16")
    steps = 24
    # prompts 2 and 7 of this checkpoint are where the ids parted: 2 with both causes, 7 with the
    # unfused prompt alone (rotary rounding already as transformers')
    for seed in (2, 7):
        prompt = torch.randint(0, 8192, (8,), generator=torch.Generator().manual_seed(seed)).tolist()
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                               num_beams=1, pad_token_id=0, eos_token_id=None)[0].tolist()
        for record in (True, False):
            session = GenerationSession(loaded, prompt, GenerationSettings("greedy"), stop_tokens=[], record=record)
            list(session.run(steps))
            assert session.ids() == want, f"prompt {seed}, record={record}"


def _bf16_llama(tmp_path):
    torch.manual_seed(0)
    SHAPES["llama"]().to(torch.bfloat16).save_pretrained(tmp_path)
    return load_model_folder(tmp_path, dtype="bfloat16")


def test_a_bfloat16_step_multiplies_by_weights_prepacked_once(tmp_path, monkeypatch):
    """A bfloat16 step on the CPU multiplies by oneDNN-prepacked copies of its weights (F.linear re-laid
    each weight out at every call: 2-4x slower at the Qwen2.5-0.5B shape), with the same ids and values."""
    loaded = _bf16_llama(tmp_path)
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    plain_calls = []
    real = model_module.F.linear
    session = GenerationSession(loaded, [5, 9, 2, 7], GenerationSettings("greedy"), stop_tokens=[])
    monkeypatch.setattr(model_module.F, "linear", lambda *a, **k: plain_calls.append(1) or real(*a, **k))
    list(session.run(4))
    assert plain_calls == []  # every product of a step prepacked (before: four a layer and the unembedding)
    monkeypatch.setattr(model_module.F, "linear", real)
    with torch.no_grad():
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
        want = hf.generate(torch.tensor([[5, 9, 2, 7]]), max_new_tokens=4, min_new_tokens=4, do_sample=False,
                           pad_token_id=0, eos_token_id=None)[0].tolist()
    assert session.ids() == want


def test_weights_changed_in_place_are_never_read_from_a_stale_prepacked_copy(tmp_path):
    loaded = _bf16_llama(tmp_path)
    model = loaded.model
    GenerationSession(loaded, [5, 9, 2], GenerationSettings("greedy"), stop_tokens=[])  # prepacks
    state = {k: v * 1.5 if k.endswith(("mlp.down.weight", "attn.o.weight", "attn.q.weight")) else v
             for k, v in model.state_dict().items()}
    model.load_state_dict(state)  # copies into the same buffers
    with torch.no_grad():
        full = model(torch.tensor([[5, 9, 2, 11]])).logits[0, -1]
    session = GenerationSession(loaded, [5, 9, 2], GenerationSettings("greedy"), stop_tokens=[])
    session.choose(11)
    torch.testing.assert_close(session.current.next_logits, full.float(), rtol=0.02, atol=0.02 * float(full.abs().max()))
    # and a step between the load and a new session
    model.load_state_dict({k: v * 0.5 if k.endswith("mlp.down.weight") else v for k, v in state.items()})
    with torch.inference_mode():
        x = torch.randn(1, 1, model.cfg.d_ff, dtype=torch.bfloat16)
        down = model.blocks[0].mlp.down
        assert torch.equal(model_module.linear(down, x, down.weight), torch.nn.functional.linear(x, down.weight))


def test_a_bias_edited_a_weight_replaced_or_a_model_copied_never_reads_a_stale_prepacked_copy(tmp_path):
    """The other ways a weight changes under a prepacked copy (issue 38: the check is now one dict read and C
    calls a product): a group's bias edited in place (Q/K/V's, kept beside the copy), a weight's data replaced
    (`.data =`, as a device or dtype move does: same version, another place), and a deepcopy of the model
    (as the app's device move makes: it keeps no copy of the copies, and steps with its own weights)."""
    import copy
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    torch.manual_seed(0)
    SHAPES["qwen2"]().to(torch.bfloat16).save_pretrained(tmp_path)
    loaded = load_model_folder(tmp_path, dtype="bfloat16")
    model = loaded.model
    GenerationSession(loaded, [5, 9, 2], GenerationSettings("greedy"), stop_tokens=[])  # prepacks
    attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
    qkv = (attn.q, attn.k, attn.v)
    x = torch.randn(1, 1, model.cfg.d_model, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert model_module._prepacked(attn, qkv) is not None
        with torch.no_grad():
            attn.k.bias.add_(1.0)
        assert model_module._prepacked(attn, qkv) is None
        assert torch.equal(model_module.products(attn, x, qkv)[1], torch.nn.functional.linear(x, attn.k.weight, attn.k.bias))
        h = torch.randn(1, 1, model.cfg.d_model, dtype=torch.bfloat16)
        gate_up = (mlp.gate, mlp.up)
        assert model_module._prepacked(mlp, gate_up) is not None
        mlp.up.weight.data = mlp.up.weight.data * 2  # version unchanged, the values elsewhere
        assert torch.equal(model_module.products(mlp, h, gate_up)[1], torch.nn.functional.linear(h, mlp.up.weight))
        model.lm_head.weight.data = model.lm_head.weight.data.clone()  # same values, another place: not the copy
        assert model_module._prepacked(model.lm_head, (model.lm_head,)) is None
    moved = copy.deepcopy(model)
    assert not any(model_module.one_row_copy(m) is not None for m in moved.modules())
    loaded.model = moved
    session = GenerationSession(loaded, [5, 9, 2], GenerationSettings("greedy"), stop_tokens=[])
    assert model_module._prepacked(moved.blocks[0].attn, (moved.blocks[0].attn.q, moved.blocks[0].attn.k,
                                                          moved.blocks[0].attn.v)) is not None
    with torch.no_grad():
        full = moved(torch.tensor([[5, 9, 2, 11]])).logits[0, -1]
    session.choose(11)
    torch.testing.assert_close(session.current.next_logits, full.float(), rtol=0.02, atol=0.02 * float(full.abs().max()))


def test_no_prepacked_copy_where_it_would_not_fit_in_memory(tmp_path, monkeypatch):
    from desktop_app.core import devices
    loaded = _bf16_llama(tmp_path)
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": 1000)
    GenerationSession(loaded, [5, 9, 2], GenerationSettings("greedy"), stop_tokens=[])
    assert not any(model_module.one_row_copy(m) is not None for m in loaded.model.modules())


def test_a_beam_search_makes_no_prepacked_copy_it_would_never_read(tmp_path):
    """Beam steps multiply a row per beam (F.linear), never the one-row prepacked copy: a bfloat16 beam
    session makes none (it cost the weights' memory again and their copying time, issue 38); turned to
    greedy, its one-row steps get it; the beam ids are transformers' generate's."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    loaded = _bf16_llama(tmp_path)
    prompt = [5, 9, 2, 7]
    session = GenerationSession(loaded, prompt, GenerationSettings("beam", beams=3), stop_tokens=[])
    assert not any(model_module.one_row_copy(m) is not None for m in loaded.model.modules())
    list(session.run(5))
    with torch.no_grad():
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=5, min_new_tokens=5, num_beams=3, do_sample=False,
                           early_stopping=False, length_penalty=1.0, pad_token_id=0, eos_token_id=None)[0].tolist()
    assert session.ids() == want
    session.set_settings(GenerationSettings("greedy"))
    assert model_module.one_row_copy(loaded.model.lm_head) is None  # set_settings copies nothing (a UI thread calls it)
    session.step()
    assert model_module.one_row_copy(loaded.model.lm_head) is not None  # the step's forward made it first


@pytest.mark.parametrize("family", list(SHAPES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_grouped_query_rows_equal_the_rows_against_repeated_keys_bit_for_bit(family, dtype, tmp_path):
    """A half-precision step's recorded attention rows score each key head's queries as the rows of one
    product against its keys (the cache's keys are not copied once per query head): the same values, bit
    for bit, as the rows against the keys repeated for every query head, before and after the cache's
    buffer grows (64 rows)."""
    from desktop_app.core.attention import attention_probs
    from desktop_app.core.model import attention_scale

    torch.manual_seed(0)
    SHAPES[family]().to(dtype).save_pretrained(tmp_path)
    loaded = load_model_folder(tmp_path, dtype=str(dtype).replace("torch.", ""))
    cfg = loaded.model.cfg
    G = cfg.n_heads // cfg.n_kv_heads
    assert G > 1
    session = GenerationSession(loaded, list(range(3, 63)), GenerationSettings("greedy"), stop_tokens=[])
    g = torch.Generator().manual_seed(1)
    for _ in range(6):  # 60 prompt tokens, then 61-66 keys: the buffer grows past 64 rows
        session.step()
        queries = [torch.randn(1, cfg.n_heads, 1, cfg.d_head, generator=g).to(dtype) for _ in range(cfg.n_layers)]
        with torch.inference_mode():
            rows = session._attention_rows(queries)
            keys = session._cache.stacked_keys()  # [L, B, H_kv, T, dh]
            for layer, q in enumerate(queries):
                want = attention_probs(q, keys[layer].repeat_interleave(G, dim=1), scale=attention_scale(cfg))
                assert torch.equal(rows[layer], want), layer


def test_a_prepacked_group_whose_layers_differ_in_bias_keeps_each_bias():
    """Q and V with a bias, K without (no family here has it; a converted model could): the packed product adds
    each layer's own bias, zeros for the one without, never dropping the others (it dropped all of them)."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    torch.manual_seed(0)
    owner = torch.nn.Module()
    q, k, v = (torch.nn.Linear(64, n, dtype=torch.bfloat16) for n in (64, 32, 32))
    k.bias = None
    if not model_module.prepack_one_row(owner, (q, k, v)):
        pytest.skip("this CPU has no prepacked bfloat16 product")
    x = torch.randn(1, 1, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert model_module._prepacked(owner, (q, k, v)) is not None
        got = model_module.products(owner, x, (q, k, v))
        for out, lin in zip(got, (q, k, v)):
            torch.testing.assert_close(out, torch.nn.functional.linear(x, lin.weight, lin.bias), rtol=0.02, atol=0.02)
