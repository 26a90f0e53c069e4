from __future__ import annotations

from . import MODEL_HELP


def add_parser(sub) -> None:
    p = sub.add_parser("trace", help="run a text through a model and save what it recorded as .npz")
    p.add_argument("model_dir", help=MODEL_HELP)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text")
    g.add_argument("--ids", help="comma-separated token ids")
    p.add_argument("--out", required=True, help="output .npz")
    p.set_defaults(func=run)


def trace_arrays(loaded, ids: list[int]) -> dict:
    """tokens, attn.{l} [H, T, T], hidden.{i} (Hugging Face's hidden_states), logits [T, vocab]."""
    import numpy as np
    import torch

    names = ["embed", "final_norm.out", "logits", "blocks.*.attn.pattern", "blocks.*.resid_post"]
    _, trace = loaded.model.run_with_trace(torch.tensor(ids)[None], names=names)
    arrays = {"tokens": np.asarray(ids, dtype=np.int64)}
    for l in range(loaded.config.n_layers):
        arrays[f"attn.{l}"] = trace.pattern(l)[0].float().numpy()
    for i, h in enumerate(trace.hidden_states()):
        arrays[f"hidden.{i}"] = h[0].float().numpy()
    if "logits" in trace:
        arrays["logits"] = trace["logits"][0].float().numpy()
    return arrays


def run(args) -> int:
    import io
    from pathlib import Path

    import numpy as np

    from . import load_model
    from ..core.files import atomic_write_bytes, prepare_output_file
    from . import input_ids

    prepare_output_file(args.out)  # a write failure now, not after the forward pass
    loaded = load_model(args.model_dir)
    arrays = trace_arrays(loaded, input_ids(loaded, args.text, args.ids))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(Path(args.out), buf.getvalue())
    print(f"wrote {args.out} ({len(arrays)} arrays)")
    return 0
