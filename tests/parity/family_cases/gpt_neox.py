"""GPT-NeoX (Pythia): partial rotary, parallel residual, untied embed_out."""
import transformers

def neox(rotary_pct: float, parallel: bool, tied: bool = False, bias: bool = True, scaling: dict | None = None):
    def make():
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": rotary_pct, **(scaling or {})}
        return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
            vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, hidden_act="gelu", use_parallel_residual=parallel, rope_parameters=rope,
            tie_word_embeddings=tied, attention_bias=bias, bos_token_id=None, eos_token_id=None))
    return make


CASES = {"rotary0.25-parallel": neox(0.25, True)}
