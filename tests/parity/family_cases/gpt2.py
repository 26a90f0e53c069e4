"""GPT-2: learned positions, pre-LN, GELU(tanh), Conv1D weights ([in, out]) and a fused c_attn, tied head."""
import transformers

CASES = {"lm": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
    vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None))}
