"""A feature's dashboard over a text file: its top-activating contexts, its activation histogram, and
the tokens its decoder direction promotes and suppresses through the unembedding.

The file is tokenized in pieces (core.inputs.text_file_ids: memory holds the ids, 2 or 4 bytes each)
and run through the model in windows of `window` tokens (default: the model's context, at most 256),
a few windows per forward; only the `top` best hits, and at most MAX_HISTOGRAM_VALUES non-zero
activations for the histogram, are kept. `job` (JobControl) is told the progress and may cancel.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import torch

from ..jobs import report
from .activations import Attached, read_point, record_points

MAX_HISTOGRAM_VALUES = 1_000_000
CONTEXT_COLUMNS = ("rank", "activation", "token_index", "token", "left", "right")
WINDOWS_PER_FORWARD = 8


@dataclass
class TopContexts:
    feature: int
    tokens_seen: int
    active_tokens: int  # tokens where the feature fired
    rows: list[tuple]  # (rank, activation, token index in the file, token, left context, right context)
    histogram: tuple[np.ndarray, np.ndarray]  # (counts, bin edges) of its non-zero activations

    @property
    def density(self) -> float:
        return self.active_tokens / self.tokens_seen if self.tokens_seen else 0.0


def top_contexts(loaded, attached: Attached, path, feature: int, top: int = 20, window: int | None = None,
                 left: int = 16, right: int = 4, job=None, interventions=None,
                 windows_per_forward: int | None = None) -> TopContexts:
    from ..inputs import text_file_ids

    d = attached.dictionary
    if not 0 <= feature < d.d_sae:
        raise ValueError(f"{d.name}: feature {feature} is not in 0..{d.d_sae - 1}")
    model = loaded.model
    cfg = model.cfg
    window = int(window or min(cfg.context_length, 256))
    if not 1 <= window <= cfg.context_length:
        raise ValueError(f"window {window}: the model reads at most {cfg.context_length} tokens")
    ids = text_file_ids(loaded, path)
    n = len(ids)
    starts = list(range(0, n, window))
    heap: list[tuple[float, int]] = []
    values: list[np.ndarray] = []
    kept, active = 0, 0
    batch = windows_per_forward if windows_per_forward is not None else WINDOWS_PER_FORWARD
    for b in range(0, len(starts), batch):
        if job is not None:
            job.check()
        group = starts[b:b + batch]
        # equal windows go in one forward [B, window]; the file's shorter tail goes alone
        full = [s for s in group if s + window <= n]
        forwards = [full] if full else []
        forwards += [[s] for s in group if s + window > n]
        for run in forwards:
            windows = torch.tensor(np.asarray([ids[s:s + window] for s in run], dtype=np.int64))
            # an encoder-decoder reads the window as its source (a decoder hook is refused: no target)
            trace = record_points(model, windows, (attached.read, attached.write), interventions)
            with torch.no_grad():
                x = torch.stack([read_point(trace, attached.read, row=r) for r in range(len(run))])
                acts = d.encode_feature(x.float().to(d.W_enc.device), feature).cpu().numpy()
            for s, a in zip(run, acts):
                nz = np.nonzero(a)[0]
                active += len(nz)
                if kept < MAX_HISTOGRAM_VALUES and len(nz):
                    take = a[nz][: MAX_HISTOGRAM_VALUES - kept]
                    values.append(take.astype(np.float32))
                    kept += len(take)
                for i in nz[np.argsort(-a[nz])][:top]:
                    item = (float(a[i]), s + int(i))
                    if len(heap) < top:
                        heapq.heappush(heap, item)
                    elif item[0] > heap[0][0]:
                        heapq.heapreplace(heap, item)
        report(job, min(len(starts), b + batch), len(starts), "top contexts")
    tok = loaded.tokenizer
    decode = (lambda xs: tok.decode(list(xs))) if tok is not None else (lambda xs: " ".join(map(str, xs)))
    rows = []
    for rank, (act, i) in enumerate(sorted(heap, key=lambda x: (-x[0], x[1])), 1):
        rows.append((rank, act, i, decode([ids[i]]), decode(ids[max(0, i - left):i]), decode(ids[i + 1:i + 1 + right])))
    allv = np.concatenate(values) if values else np.zeros(0, np.float32)
    hist = np.histogram(allv, bins=40) if allv.size else (np.zeros(0, np.int64), np.zeros(0))
    return TopContexts(feature, n, active, rows, hist)


def decoder_logits(model, dictionary, feature: int, n: int = 10) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """The `n` tokens the feature's decoder row promotes most and suppresses most, read directly through
    the unembedding (W_U @ W_dec[feature]; no final norm): ([(token id, weight)], [(token id, weight)])."""
    model = getattr(model, "model", model)
    if getattr(model.cfg, "is_encoder_decoder", False) and dictionary.hook.startswith("encoder."):
        raise ValueError(f"{dictionary.name}: its hook {dictionary.hook} is in the encoder, whose stream the "
                         "unembedding never reads (the decoder's hooks have tokens)")
    if not model.cfg.lm_head:
        raise ValueError("the model has no unembedding to read a decoder direction through")
    if dictionary.d_out != model.cfg.d_model:
        raise ValueError(f"{dictionary.name}: its decoder writes width {dictionary.d_out}, not the residual stream")
    if not 0 <= feature < dictionary.d_sae:
        raise ValueError(f"{dictionary.name}: feature {feature} is not in 0..{dictionary.d_sae - 1}")
    with torch.no_grad():
        w = model.lm_head.weight.detach().float().cpu() @ dictionary.W_dec[feature].float().cpu()
    n = min(n, w.numel())
    up, down = w.topk(n), (-w).topk(n)
    return ([(int(i), float(v)) for v, i in zip(up.values, up.indices)],
            [(int(i), float(-v)) for v, i in zip(down.values, down.indices)])
