"""OPT: learned positions offset by 2, pre-LN, ReLU, biases."""
import transformers

def opt(bias: bool = True, pre: bool = True, tied: bool = True, heads: int = 4, act: str = "relu"):
    def make():
        return transformers.OPTForCausalLM(transformers.OPTConfig(
            vocab_size=97, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=heads,
            max_position_embeddings=64, word_embed_proj_dim=32, do_layer_norm_before=pre, enable_bias=bias,
            activation_function=act, tie_word_embeddings=tied, pad_token_id=1, bos_token_id=None,
            eos_token_id=None))
    return make


CASES = {"biases-pre-ln": opt()}
