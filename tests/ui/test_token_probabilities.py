"""The Model panel's p(token | tokens before), computed a few rows at a time (the first look's memory)."""
import math

import torch

from desktop_app.ui.panels.model import token_probabilities


def test_rows_at_a_time_give_the_whole_log_softmax_values():
    g = torch.Generator().manual_seed(0)
    vocab, t = 100_000, 200  # 83 rows a chunk at this vocabulary: three chunks, the last one short
    logits = torch.randn(t, vocab, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, vocab, (t,), generator=g).tolist()
    whole = torch.softmax(logits[:-1].float(), dim=-1)[torch.arange(t - 1), torch.tensor(ids[1:])]
    got = token_probabilities(logits, ids)
    assert len(got) == t and math.isnan(got[0])
    torch.testing.assert_close(torch.tensor(got[1:]), whole, rtol=1e-5, atol=1e-9)
    assert token_probabilities(logits[:1], ids[:1])[0] != token_probabilities(logits[:1], ids[:1])[0]  # NaN alone
