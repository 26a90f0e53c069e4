"""A Mixtral GGUF as llama.cpp's convert writes one (architecture "llama" with llama.expert_count; each
layer's experts stacked in ffn_gate_exps / ffn_up_exps / ffn_down_exps, the router in ffn_gate_inp,
q and k rows permuted) opens as the app's Mixtral. transformers has no GGUF loader for it, so the
reference is transformers' MixtralForCausalLM on the original weights (F32 file), or on the weights the
quantized file holds, dequantized by gguf (Q8_0, Q4_0). The file here is written by the test with the
gguf library, independently of the app's exporter; `export --format gguf` of the Mixtral then reopens
with the same logits."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from desktop_app.cli import main  # noqa: E402
from desktop_app.core.formats import load_model_file  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
HEADS, KV_HEADS, EXPERTS, LAYERS = 4, 2, 4, 2
IDS = torch.randint(0, 128, (2, 13), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("mixtral") / "hf"
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, num_local_experts=EXPERTS, num_experts_per_tok=2, max_position_embeddings=64,
        rope_theta=1e6, bos_token_id=None, eos_token_id=None))
    with torch.no_grad():  # non-trivial norms, so that a misplaced one shows in the logits
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: q and k rows reordered for llama.cpp's rotary."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def round_trip(w: np.ndarray, qtype) -> np.ndarray:
    """What a matrix of `qtype` holds, dequantized (rows are whole blocks, so row order does not matter)."""
    return gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).reshape(w.shape)


def write_llama_cpp_gguf(hf: Path, out: Path, qtype_name: str) -> None:
    """The Mixtral of `hf` as llama.cpp's convert names and lays it out (its MixtralModel is its LlamaModel):
    matrices in `qtype_name`, norms and the router F32 (convert keeps ffn_gate_inp F32)."""
    config = transformers.AutoConfig.from_pretrained(hf)
    sd = {k: v.float().numpy() for k, v in load_file(hf / "model.safetensors").items()}
    qtype = gguf.GGMLQuantizationType[qtype_name]
    w = gguf.GGUFWriter(out, "llama")
    w.add_name("tiny Mixtral")
    w.add_file_type({"F32": gguf.LlamaFileType.ALL_F32, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[qtype_name])
    w.add_vocab_size(config.vocab_size)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_rope_freq_base(config.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_expert_count(config.num_local_experts)
    w.add_expert_used_count(config.num_experts_per_tok)

    def add(name: str, arr: np.ndarray, quantized: bool = True) -> None:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if arr.ndim < 2 or not quantized or qtype_name == "F32":
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(config.num_hidden_layers):
        h = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", sd[h + "input_layernorm.weight"])
        add(f"blk.{i}.attn_q.weight", llama_cpp_permute(sd[h + "self_attn.q_proj.weight"], HEADS))
        add(f"blk.{i}.attn_k.weight", llama_cpp_permute(sd[h + "self_attn.k_proj.weight"], KV_HEADS))
        add(f"blk.{i}.attn_v.weight", sd[h + "self_attn.v_proj.weight"])
        add(f"blk.{i}.attn_output.weight", sd[h + "self_attn.o_proj.weight"])
        add(f"blk.{i}.ffn_norm.weight", sd[h + "post_attention_layernorm.weight"])
        add(f"blk.{i}.ffn_gate_inp.weight", sd[h + "block_sparse_moe.gate.weight"], quantized=False)
        for theirs, ours in (("w1", "ffn_gate_exps"), ("w3", "ffn_up_exps"), ("w2", "ffn_down_exps")):
            add(f"blk.{i}.{ours}.weight",
                np.stack([sd[f"{h}block_sparse_moe.experts.{e}.{theirs}.weight"] for e in range(EXPERTS)]))
    add("output_norm.weight", sd["model.norm.weight"])
    add("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def dequantized_folder(hf: Path, out: Path, qtype_name: str) -> Path:
    """`hf` with every matrix the quantized file quantizes replaced by what it holds, dequantized."""
    qtype = gguf.GGMLQuantizationType[qtype_name]
    sd = load_file(hf / "model.safetensors")
    kept = {k: (v if v.ndim < 2 or "block_sparse_moe.gate." in k
                else torch.from_numpy(round_trip(v.float().numpy(), qtype)).to(v.dtype)) for k, v in sd.items()}
    out.mkdir()
    (out / "config.json").write_bytes((hf / "config.json").read_bytes())
    save_file(kept, out / "model.safetensors", metadata={"format": "pt"})
    return out


def transformers_logits(folder: Path) -> torch.Tensor:
    model = transformers.MixtralForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(IDS).logits


def our_logits(path: Path) -> torch.Tensor:
    loaded = load_model_file(path, dtype="float32")
    with torch.no_grad():
        return loaded.model(IDS).logits


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_0"])
def test_a_llama_cpp_mixtral_gguf_gives_transformers_mixtral_logits(hf_dir, tmp_path, qtype):
    path = tmp_path / f"mixtral-{qtype}.gguf"
    write_llama_cpp_gguf(hf_dir, path, qtype)
    loaded = load_model_file(path, dtype="float32")
    cfg = loaded.config
    assert (cfg.family, cfg.num_experts, cfg.experts_per_token, cfg.router_norm) == ("mixtral", 4, 2, "renormalised")
    # per layer: the three stacked experts in the file's type, the router F32
    expected = Counter({qtype: 3 * LAYERS})
    expected["F32"] += LAYERS
    assert loaded.gguf.types["MLP"] == expected
    reference = transformers_logits(hf_dir if qtype == "F32" else dequantized_folder(hf_dir, tmp_path / "dq", qtype))
    ours = our_logits(path)
    assert reference.abs().max() > 0.1
    assert (ours - reference).abs().max().item() <= 1e-4, qtype
    if qtype != "F32":  # the quantization shows: the original weights give other logits
        assert (ours - transformers_logits(hf_dir)).abs().max().item() > 1e-3


def test_a_mixtral_exported_as_gguf_reopens_with_the_same_logits(hf_dir, tmp_path):
    reference = transformers_logits(hf_dir)
    for kind, tolerance in (("f32", 1e-4), ("q8_0", 5e-2)):
        out = tmp_path / f"exported-{kind}.gguf"
        assert main(["export", str(hf_dir), "--format", "gguf", "--type", kind, "--out", str(out)]) == 0
        reader = gguf.GGUFReader(out)
        assert reader.fields["general.architecture"].contents() == "llama"
        assert reader.fields["llama.expert_count"].contents() == EXPERTS
        names = {t.name for t in reader.tensors}
        assert {"blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight",
                "blk.1.ffn_gate_inp.weight"} <= names
        assert (our_logits(out) - reference).abs().max().item() <= tolerance, kind
