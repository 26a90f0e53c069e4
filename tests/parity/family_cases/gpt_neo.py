"""GPT-Neo: global and local (windowed) layers alternating, unscaled scores."""
import transformers

WINDOW = 4


def neo(attention_types, n_layers: int, window: int = WINDOW, tied: bool = True, heads: int = 4):
    def make():
        return transformers.GPTNeoForCausalLM(transformers.GPTNeoConfig(
            vocab_size=97, hidden_size=32, num_layers=n_layers, num_heads=heads, attention_types=attention_types,
            window_size=window, intermediate_size=64, max_position_embeddings=64, activation_function="gelu_new",
            tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None))
    return make


CASES = {"global-local": neo([[["global", "local"], 1]], 2)}
