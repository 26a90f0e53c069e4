"""`python -m desktop_app generate MODEL_DIR (--prompt TEXT | --prompt-ids 1,2,3) --max-new N ...`

The same GenerationSession the Generate panel drives. Encoder (BERT-family) models fill the
prompt's mask tokens instead of continuing it. --steer-towards/--steer-away/--steer-layer/--steer-scale
add scale x (mean residual after the layer on one text - that on the other) there at every position
(app.whatif.steering_edit, as the What if panel's Steer tab builds it), together with any --ablate.
An encoder-decoder (T5, BART, Marian) reads the prompt as its source and generates the target:
`ids` are the target tokens after the decoder's start token (through the end token when it comes),
`text` their decoding with the target tokenizer (Marian's target.spm). Greedy and beam ids, of every model,
are transformers' generate's (num_beams = --beams, length_penalty = --length-penalty, early_stopping =
--early-stopping: core/generation/search.py).
The folder's generation_config.json (or config.json's generation fields) gives the end tokens (every id of
a list: Llama-3.x-Instruct's <|eot_id|> too) and the constraints generate applies (bad_words_ids,
forced_eos_token_id, repetition_penalty, ...; core/generation_rules.py); never its sampling settings.
The JSON names them: `stop_tokens` (the ids in use), `stopped_by` (the one that ended it), `rules`.
"""
from __future__ import annotations

from ..app.generation import EARLY_STOPPING
from ..core.generation import STRATEGIES
from . import MODEL_HELP, add_dtype_argument, add_special_tokens_argument
from .args import DEVICES_HELP, Number, device, devices, float_in, layer_or_head


def _limit(name: str) -> Number:
    """The option's type: the range a script's generate() and GenerationSettings take (core.numbers.GENERATION)."""
    from ..core.numbers import GENERATION
    return Number.of(GENERATION[name])


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate tokens (or fill [MASK] tokens for encoder models)")
    p.add_argument("model_dir", help=MODEL_HELP)
    add_dtype_argument(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="prompt text (needs the model's tokenizer: tokenizer.json, a SentencePiece "
                   "model, vocab.txt or vocab.json + merges.txt); an encoder-decoder's source")
    g.add_argument("--prompt-ids", help="comma-separated prompt token ids")
    p.add_argument("--max-new", type=_limit("max_new"), default=20, help="tokens to generate (default 20)")
    p.add_argument("--strategy", choices=STRATEGIES, default="greedy")
    p.add_argument("--temperature", type=_limit("temperature"), default=1.0, help="0: greedy (default 1)")
    p.add_argument("--top-k", type=_limit("top_k"), default=0, help="0: off (strategy top-k defaults to 40)")
    p.add_argument("--top-p", type=_limit("top_p"), default=1.0, help="1: off (strategy top-p defaults to 0.9)")
    p.add_argument("--beams", type=_limit("beams"), default=4)
    p.add_argument("--length-penalty", type=_limit("length_penalty"), default=1.0,
                   help="beam search: a finished sequence scores log p / its length ** this (transformers' "
                        "length_penalty; > 0 favours longer ones; default 1)")
    p.add_argument("--early-stopping", choices=tuple(EARLY_STOPPING), default="false",
                   help="beam search: stop once --beams sequences have ended (true), once the best running one "
                        "cannot beat them at its length (false, the default) or at the longest it may become "
                        "(never); transformers' early_stopping")
    p.add_argument("--seed", type=_limit("seed"), default=0)
    p.add_argument("--stop-ids", help="comma-separated stop token ids (default: the model's end token)")
    p.add_argument("--order", choices=("confident", "left-to-right"), default="confident",
                   help="encoder models: which mask to fill first")
    p.add_argument("--ablate", help="zero-ablate: LAYER.HEAD[,LAYER.HEAD...] (also LAYER.attn, LAYER.mlp)")
    s = p.add_argument_group("steering (all four or none)")
    s.add_argument("--steer-towards", metavar="TEXT", help="steer towards this text (token ids without a tokenizer)")
    s.add_argument("--steer-away", metavar="TEXT", help="... and away from this one")
    s.add_argument("--steer-layer", metavar="L", type=layer_or_head, help="read and add the vector after block L")
    s.add_argument("--steer-scale", metavar="S", type=float_in(-1e6, 1e6),
                   help="multiply the vector by S (negative: the other way)")
    add_special_tokens_argument(p)
    p.add_argument("--device", type=device, default="cpu", help="cpu, cuda, cuda:N or mps (default cpu)")
    p.add_argument("--devices", type=devices, dest="device", help=DEVICES_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def check_generation_memory(loaded, prompt_length: int, args, source_length: int = 0) -> None:
    """app.generation.check_generation_memory for these options (the option to lower named)."""
    from ..app.generation import check_generation_memory as check
    from ..core.generation import GenerationSession

    beams = GenerationSession.search_width(args)  # (args has the settings' strategy and beams)
    check(loaded, prompt_length, args.max_new, beams, f"--beams {args.beams}" if beams > 1 else f"--max-new {args.max_new}",
          source_length=source_length)


def run(args) -> int:
    import json
    import sys

    from . import load_model
    from ..app.generation import generation_settings, mask_positions, why_cannot_generate
    from ..core.devices import resolve_device
    from ..core.generation import MaskedFillSession, generate
    from ..core.inputs import parse_token_ids
    from ..core.interventions import parse_ablations
    from . import input_ids

    steering = {f"--steer-{k}": getattr(args, f"steer_{k}") for k in ("towards", "away", "layer", "scale")}
    missing = [k for k, v in steering.items() if v is None]
    if 0 < len(missing) < len(steering):  # before loading the model: a typo costs no load
        raise ValueError(f"steering needs all of --steer-towards, --steer-away, --steer-layer, --steer-scale "
                         f"(missing {', '.join(missing)})")
    loaded = load_model(args.model_dir, special_tokens=args.special_tokens, dtype=args.dtype,
                        device=args.device if "," in args.device else resolve_device(args.device))
    if loaded.generation.problem:  # the folder still generates, with config.json's end tokens
        print(loaded.generation.problem, file=sys.stderr)
    seq2seq = bool(getattr(loaded.config, "is_encoder_decoder", False))
    if seq2seq and not missing:
        raise ValueError(f"{loaded.path}: steering adds a decoder-only model's residual direction; "
                         "this is an encoder-decoder (use --ablate)")
    if args.prompt is not None and loaded.tokenizer is None:
        raise ValueError(f"{loaded.path}: {loaded.tokenizer_missing}; pass --prompt-ids instead of --prompt")
    prompt = input_ids(loaded, args.prompt, args.prompt_ids)
    check_generation_memory(loaded, 1 if seq2seq else len(prompt), args, len(prompt) if seq2seq else 0)
    settings = generation_settings(args.strategy, args.temperature, args.top_k, args.top_p, args.beams,
                                   args.length_penalty, args.early_stopping)
    result: dict = {"model": str(loaded.path), "strategy": args.strategy, "seed": args.seed}
    edits = parse_ablations(args.ablate, loaded.config) if args.ablate else []
    if not missing:  # the What if panel's Steer tab builds the same edit (app/whatif.py)
        from ..app.whatif import steering_edit

        edits.append(steering_edit(loaded, args.steer_towards, args.steer_away, args.steer_layer, args.steer_scale)[0])
        result["steer"] = edits[-1].label
    edits = edits or None
    tokenizer = loaded.tokenizer
    if loaded.config.causal:
        stops = parse_token_ids(args.stop_ids, "--stop-ids") if args.stop_ids is not None else None
        bad = [t for t in stops or () if not 0 <= t < loaded.config.vocab_size]
        if bad:  # a stop token the model can never produce would silently never stop it
            raise ValueError(f"--stop-ids {bad[0]} is not a token of {loaded.path}'s vocabulary "
                             f"(0 to {loaded.config.vocab_size - 1})")
        ids, session = generate(loaded, prompt, args.max_new, settings, seed=args.seed, stop_tokens=stops,
                                interventions=edits)
        gen = session.generated()
        if seq2seq:  # the target after the decoder's start token, read by the target side's tokenizer
            ids = ids[len(session.prompt):]
            tokenizer = getattr(tokenizer, "target", None) or tokenizer
            result["source_ids"] = prompt
        result.update(prompt_length=len(prompt), ids=ids,
                      probs=[round(n.model_prob, 6) for n in gen],
                      score=session.current.score, stop_reason=session.stop_reason,
                      stop_tokens=sorted(session.stop_tokens), rules=loaded.generation.describe())
        if session.current.stop:
            result["stopped_by"] = session.current.token
    else:
        if (why := why_cannot_generate(loaded)) is not None:
            raise ValueError(f"{loaded.path}: {why}")
        mask_id = loaded.tokenizer.mask_token_id
        masked = mask_positions(loaded, prompt)
        if not masked:
            raise ValueError("an encoder model fills [MASK] tokens: put at least one in the prompt")
        session = MaskedFillSession(loaded, prompt, masked, mask_id, settings, args.order, args.seed,
                                    interventions=edits)
        steps = list(session.run(min(args.max_new, len(masked))))
        ids = session.ids()
        result.update(prompt_length=len(prompt), ids=ids,
                      filled=[{"position": s.position, "token": s.token, "prob": round(s.model_prob, 6)} for s in steps])
    if tokenizer is not None:
        result["text"] = tokenizer.decode(ids)
    if args.json:
        print(json.dumps(result))
    else:
        print(result.get("text", " ".join(map(str, ids))))
        if result.get("stop_reason"):
            by = result.get("stopped_by")
            named = "" if by is None or tokenizer is None else f" {tokenizer.decode([by])!r}"
            print(f"(stopped: {result['stop_reason']}" + ("" if by is None else f": id {by}{named}") + ")")
    return 0
