"""`python -m desktop_app graph MODEL --transcoders DIR (--prompt TEXT | --ids IDS) --out GRAPH.json [--raw RAW.safetensors]`

An attribution graph (core.graphs; circuit-tracer 0.5's definitions) of the model's prediction after the
prompt: --transcoders is a circuit-tracer folder (a per-layer set with config.yaml, or a cross-layer
transcoder's W_enc_L / W_dec_L files). A special token (BOS, else PAD or EOS) goes first unless the input
starts with one, and position 0 gets no feature or error node, as circuit-tracer does. --out is the pruned
graph in the frontend's / Neuronpedia's JSON schema; --raw the unpruned graph's arrays (adjacency [N, N],
rows targets, columns sources; nodes [features, errors, tokens, logits]). Targets: the top logits up to
--desired-logit-prob (at most --max-logits), or --target TOKEN (repeatable), or --target "A-B" (the logit
difference). Progress goes to stderr; the last line printed is one JSON object (counts and scores).
An encoder-decoder (T5, BART, Marian): --source TEXT or --source-ids IDS is the encoder's input, --prompt /
--ids the decoder's tokens after its start token; the graph is over the decoder's MLPs (cross-attention
frozen with its pattern, the encoder's output a constant).
"""
from __future__ import annotations

from . import MODEL_HELP, add_dtype_argument
from .args import DEVICES_HELP, add_overwrite_argument, device, devices, int_in, probability, unit


def add_parser(sub) -> None:
    p = sub.add_parser("graph", help="an attribution graph over transcoder features (JSON for the graph frontend)")
    p.add_argument("model_dir", help=MODEL_HELP)
    p.add_argument("--transcoders", required=True, metavar="DIR",
                   help="circuit-tracer transcoders: a per-layer set (config.yaml, model_kind transcoder_set) or a "
                        "cross-layer transcoder (W_enc_L.safetensors, W_dec_L.safetensors)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", "--text", dest="text", metavar="TEXT", help="the prompt (needs the model's tokenizer)")
    g.add_argument("--ids", help="the prompt as comma-separated token ids")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--source", metavar="TEXT", help="an encoder-decoder's encoder input (then --prompt / --ids is "
                                                      "the decoder's text after its start token)")
    src.add_argument("--source-ids", metavar="IDS", help="the encoder input as comma-separated token ids")
    p.add_argument("--out", required=True, metavar="GRAPH.json", help="the pruned graph (frontend / Neuronpedia JSON)")
    p.add_argument("--raw", metavar="RAW.safetensors", help="also the unpruned graph's arrays")
    p.add_argument("--slug", help="the graph's name in its metadata (default: --out's file name)")
    p.add_argument("--node-threshold", type=unit, default=0.8,
                   help="keep the nodes holding this share of the influence on the logits (default 0.8)")
    p.add_argument("--edge-threshold", type=unit, default=0.98,
                   help="then the edges holding this share (default 0.98)")
    p.add_argument("--max-feature-nodes", type=int_in(1, 10**7), default=7500,
                   help="features given rows, most influential first (default 7500)")
    p.add_argument("--max-logits", type=int_in(1, 10**4), default=10, help="at most this many logit targets (default 10)")
    p.add_argument("--desired-logit-prob", type=probability, default=0.95,
                   help="logit targets until their probabilities sum to this (default 0.95)")
    p.add_argument("--target", action="append", metavar="TOKEN",
                   help="attribute this token's logit instead (repeatable), or \"A-B\": logit(A) - logit(B); "
                        "a token id where the model has no tokenizer")
    p.add_argument("--batch-size", type=int_in(1, 1 << 16), default=512, help="targets per backward pass (default 512)")
    p.add_argument("--device", type=device, default="cpu", help="cpu, cuda, cuda:N or mps (default cpu)")
    p.add_argument("--devices", type=devices, dest="device", help=DEVICES_HELP)
    add_dtype_argument(p)
    add_overwrite_argument(p)
    p.set_defaults(func=run)


def _one_token(loaded, text: str) -> int | None:
    tok = loaded.tokenizer
    if tok is None:
        return int(text) if text.isascii() and text.isdigit() else None  # '٣'.isdigit() too
    try:
        ids = tok.encode(text, add_special_tokens=False)
    except ValueError:  # a character outside the vocabulary: not a token of this model
        return None
    return ids[0] if len(ids) == 1 else None


def parse_targets(loaded, targets: list[str] | None) -> tuple | None:
    """--target values as ("tokens", [ids]) or ("difference", a, b); None: the top logits. Checked before
    any forward pass."""
    if not targets:
        return None
    ids = [_one_token(loaded, t) for t in targets]
    if all(i is not None for i in ids):
        return ("tokens", ids)
    if len(targets) == 1 and "-" in targets[0]:
        text = targets[0]
        for cut in (i for i, c in enumerate(text) if c == "-"):
            a, b = _one_token(loaded, text[:cut]), _one_token(loaded, text[cut + 1:])
            if a is not None and b is not None:
                return ("difference", a, b)
    bad = next(t for t, i in zip(targets, ids) if i is None)
    raise ValueError(f"--target {bad!r} is not one token (nor \"A-B\" of two single tokens)")


def choose_targets(model, logits, spec: tuple | None, args, decode):
    from ..core.graphs import difference_target, salient_targets, token_targets

    if spec is None:
        return salient_targets(model, logits, args.max_logits, args.desired_logit_prob, decode)
    if spec[0] == "tokens":
        return token_targets(model, logits, spec[1], decode)
    return difference_target(model, logits, spec[1], spec[2], decode)


def run(args) -> int:
    import json
    import sys
    from pathlib import Path

    from . import load_model
    from ..core.files import check_output_file
    from ..core.graphs import attribute, build_context, graph_problem, graph_scores, load_transcoders, prune_graph
    from ..core.graphs import with_leading_special
    from ..core.graphs.files import graph_json, save_raw, write_graph_json
    from ..core.inputs import check_ids, encode, parse_token_ids

    def say(msg: str) -> None:
        print(f"graph: {msg}", file=sys.stderr, flush=True)

    check_output_file(args.out, args.overwrite)
    if args.raw:
        check_output_file(args.raw, args.overwrite)
    transcoders = load_transcoders(args.transcoders)
    loaded = load_model(args.model_dir, dtype=args.dtype, device=args.device)
    cfg = loaded.config
    problem = graph_problem(cfg)
    if problem:
        raise ValueError(f"{args.model_dir}: {problem}")
    encoder_decoder = getattr(cfg, "is_encoder_decoder", False)
    source = None
    if encoder_decoder:
        if args.source is None and args.source_ids is None:
            raise ValueError(f"{args.model_dir}: an encoder-decoder: give the encoder's input with --source TEXT or "
                             f"--source-ids IDS (--prompt / --ids are the decoder's tokens after its start token)")
        if args.source_ids is not None:
            source = parse_token_ids(args.source_ids, "--source-ids")
        elif loaded.tokenizer is None:
            raise ValueError(f"{loaded.path}: {loaded.tokenizer_missing}; pass --source-ids instead of --source")
        else:
            source = encode(loaded, args.source, cut=False).ids  # with its special tokens, as the encoder reads it
        source = check_ids(source, cfg.vocab_size, cfg.context_length, cut=False).ids
    elif args.source is not None or args.source_ids is not None:
        raise ValueError(f"{args.model_dir}: --source is for encoder-decoders; this model is a decoder")
    if args.ids is not None:
        ids = parse_token_ids(args.ids, "--ids")
    elif loaded.tokenizer is None:
        raise ValueError(f"{loaded.path}: {loaded.tokenizer_missing}; pass --ids instead of --prompt")
    else:
        ids = encode(loaded, args.text, cut=False, special_tokens=False).ids
    ids = [loaded.model.start_token(), *ids] if encoder_decoder else with_leading_special(ids, loaded.tokenizer)
    ids = check_ids(ids, cfg.vocab_size, cfg.context_length, cut=False).ids
    if len(ids) < 2:
        raise ValueError("the prompt is empty (position 0 is the special token the graph ignores)")
    spec = parse_targets(loaded, args.target)
    tok = loaded.tokenizer
    decode = (lambda t: tok.decode([t])) if tok is not None else str
    token_strings = tok.token_strings(ids) if tok is not None else [str(t) for t in ids]
    say(f"{len(ids)} tokens, {transcoders.kind} ({transcoders.n_features} features per layer, "
        f"{transcoders.activation}), model in {loaded.model.dtype} on {args.device}")
    ctx = build_context(loaded.model, ids, transcoders, source=source)
    targets = choose_targets(loaded.model, ctx.frozen.logits[-1], spec, args, decode)
    graph = attribute(ctx, targets, batch_size=args.batch_size, max_feature_nodes=args.max_feature_nodes,
                      progress=say, input_string=tok.decode(ids) if tok is not None else "",
                      token_strings=token_strings)
    n_active = len(ctx.active)
    del ctx  # its decoder rows (GBs on a long prompt) are not needed to prune
    say("pruning")
    pruned = prune_graph(graph, args.node_threshold, args.edge_threshold)
    replacement, completeness = graph_scores(graph)
    slug = args.slug or Path(args.out).stem
    model = graph_json(graph, pruned, slug, args.node_threshold)
    check_output_file(args.out, overwrite=True)
    write_graph_json(args.out, model)
    if args.raw:
        check_output_file(args.raw, overwrite=True)
        save_raw(args.raw, graph)
    print(json.dumps({"out": args.out, "raw": args.raw, "tokens": len(ids), "active_features": n_active,
                      "selected_features": graph.n_features, "logit_targets": graph.n_logits,
                      "nodes": len(model["nodes"]), "links": len(model["links"]),
                      "replacement_score": replacement, "completeness_score": completeness}))
    return 0
