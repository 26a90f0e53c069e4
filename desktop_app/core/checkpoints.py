"""Model folders in the Hugging Face layout: config.json + *.safetensors (+ index) + tokenizer.json.

Reads and writes every family in core/families' REGISTRY (GPT-2, BERT, LLaMA...) through that
family's config mapping and weight-name table, so `transformers` loads what we save; nothing here
knows a family by name. Weights are read only through safetensors (never pickle) and memory-mapped
where possible. Every problem is one ModelLoadError naming the file and what is wrong with it.
"""
from __future__ import annotations

import functools
import json
import mmap
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .config import MAX_SIZES, ConfigError, ModelConfig
from .devices import DTYPES, MemoryEstimateError, check_memory, choose_compute_dtype, dtype_name, resolve_dtype
from .families import Family, Weight, family_for, family_of
from .files import JsonFileError, atomic_write_dir, interrupted_copy, read_json
from .model import Transformer, sinusoidal_table
from .seq2seq import EncoderDecoder
from .streamed import StreamedWeights
from .generation_rules import GenerationRules, read_generation_rules
from .hf_layout import snapshot_repo_ref
from .tokenizer import Tokenizer, TokenizerError, load_tokenizer_folder
# the files of a model folder, and ModelLoadError: re-exported (checkpoints.WEIGHTS, checkpoints.ModelLoadError ...)
from .weights import CONFIG, INDEX, TOKENIZER, WEIGHTS, ModelLoadError, check_links, weight_files  # noqa: F401

NATIVE_KEY = "transformer_explorer"  # our full ModelConfig, kept beside the Hugging Face fields




def model_class(cfg: ModelConfig) -> type[Transformer] | type[EncoderDecoder]:
    """The class that computes a config: the encoder-decoder (core/seq2seq.py) or the Transformer."""
    return EncoderDecoder if cfg.is_encoder_decoder else Transformer


@dataclass
class LoadedModel:
    model: Transformer  # or an EncoderDecoder (config.is_encoder_decoder)
    config: ModelConfig
    tokenizer: Tokenizer | None
    path: Path | None
    name: str
    # without a tokenizer, why ("no tokenizer.json"): messages say "PATH: {this}; ..."
    tokenizer_missing: str = "no tokenizer.json"
    stored_dtype: torch.dtype | None = None  # the weights' dtype in the files (None: unknown, e.g. a new model)
    dtype_reason: str = ""  # why it computes in model.dtype (devices.choose_compute_dtype), "" when not chosen
    # generation_config.json's end tokens and id constraints, as transformers' generate applies them
    generation: GenerationRules = GenerationRules()
    # a GGUF file's formats.gguf_file.GGUFSummary (types per tensor kind, dequantized or not); None for a folder
    gguf: object | None = None


def missing_tokenizer(folder: Path) -> str:
    """Why load_tokenizer_folder found no tokenizer in `folder` (it reads tokenizer.json, the
    SentencePiece files and vocab.txt / vocab.json + merges.txt, so: none of them)."""
    return f"no {TOKENIZER}"


# -- configs ---------------------------------------------------------------------------------


_LAYER_KEYS = ("n_layer", "n_layers", "num_hidden_layers", "num_layers")  # the families' names for the layer count


def config_from_hf(d: dict, path: Path) -> ModelConfig:
    """ModelConfig from a config.json dictionary (ours or a Hugging Face one)."""
    if "auto_map" in d:
        raise ModelLoadError(path, "the config asks for custom model code ('auto_map'); this app never runs "
                                   "code from a model folder and reads only the families it knows")
    for key in _LAYER_KEYS:  # before a family expands per-layer lists (layer_types) from the count
        n = d.get(key)
        if isinstance(n, int) and n > MAX_SIZES["n_layers"]:
            raise ModelLoadError(path, f"invalid configuration: {key} {n:,} is beyond the {MAX_SIZES['n_layers']:,} "
                                       f"layers this app supports (no real model comes near; the config is damaged)")
    try:
        if NATIVE_KEY in d:
            if not isinstance(d[NATIVE_KEY], dict):
                raise ModelLoadError(path, f"the {NATIVE_KEY!r} block is not a JSON object")
            cfg = _one_input_norm_as_read(ModelConfig.from_dict(d[NATIVE_KEY]), d, path)
            _check_native_agrees(cfg, d, path)
            return cfg
        return family_for(d.get("model_type"), path, d).config_from_hf(d, path)
    except ConfigError as exc:
        raise ModelLoadError(path, f"invalid configuration: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(path, f"invalid value: {exc}") from exc


# The Hugging Face fields that fix the architecture: other tools read these, we read our block, so
# the two must describe the same model (an edit to one alone is refused, not silently ignored).
# Each family adds its own (Family.structural).
_STRUCTURAL = ("model_type", "vocab_size", "tie_word_embeddings")


def _one_input_norm_as_read(cfg: ModelConfig, d: dict, path: Path) -> ModelConfig:
    """A block written before Phi, Cohere and Falcon read their one input norm as shared_input_norm (they
    read it into norm1 and norm2 then, and wrote it back once): the Hugging Face fields say, as they do for a
    folder from elsewhere, so folders saved then still load."""
    if not cfg.parallel_residual or cfg.shared_input_norm or "shared_input_norm" not in family_of(cfg).switches:
        return cfg
    if not family_of(cfg).config_from_hf(d, path).shared_input_norm:
        return cfg
    return cfg.replace(shared_input_norm=True, extra={k: v for k, v in cfg.extra.items() if k != "falcon_norms"})


def _check_native_agrees(cfg: ModelConfig, d: dict, path: Path) -> None:
    expected = config_to_hf(cfg)
    for key in _STRUCTURAL + family_of(cfg).structural:
        if key in d and key in expected and d[key] != expected[key]:
            raise ModelLoadError(path, f"the Hugging Face field {key!r} is {d[key]!r} but the {NATIVE_KEY!r} block "
                                       f"implies {expected[key]!r}; the two must describe the same model")
    if d.get("rope_scaling") and cfg.positions == "rotary":
        # never written here, but transformers reads a rope_scaling added by hand before rope_parameters:
        # the family's own reading of the Hugging Face fields must give our block's rotary positions
        theirs = family_of(cfg).config_from_hf(d, path)
        if (theirs.rope_theta, theirs.rope_scaling) != (cfg.rope_theta, cfg.rope_scaling):
            raise ModelLoadError(path, f"rope_scaling {d['rope_scaling']!r} is not the rotary scaling of the "
                                       f"{NATIVE_KEY!r} block ({cfg.rope_scaling!r}); the two must describe the "
                                       f"same model")


def config_to_hf(cfg: ModelConfig) -> dict:
    """A config.json that `transformers` understands, with our full config alongside."""
    family = family_of(cfg)
    return {"vocab_size": cfg.vocab_size, "tie_word_embeddings": cfg.tie_embeddings, "dtype": cfg.dtype,
            "model_type": family.model_type, "architectures": [family.architecture(cfg)],
            **family.config_to_hf(cfg), NATIVE_KEY: cfg.to_dict()}


# -- weight names ----------------------------------------------------------------------------
# The family's weight table maps Hugging Face tensors to ours; a config its Hugging Face class
# cannot hold is saved with our own state-dict names instead.


def hf_compatible(cfg: ModelConfig) -> bool:
    """Whether the family's Hugging Face architecture can hold this config's weights.

    The training panel's builder mixes switches freely (e.g. GPT-2 with rotary positions or RMSNorm,
    BERT without token types or with a final norm); such models are saved with our own tensor names
    (NATIVE_PROBE present) so they still round-trip through model folders.
    """
    return family_of(cfg).hf_compatible(cfg)


NATIVE_PROBE = "tok_embed.weight"  # present only in folders saved with our own tensor names


def _hf_name(family: Family, entry: Weight, prefix: str, local: str | None = None) -> str:
    """entry's full Hugging Face name (or one of its aliases, `local`) under the base-model prefix."""
    local = entry.theirs if local is None else local
    return local if entry.outside_prefix else prefix + local


def _hf_tensors(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> Iterator[tuple[Weight, torch.Tensor]]:
    """Each table entry with its Hugging Face tensor built from our state dict (the writing direction)."""
    for entry in family_of(cfg).weights(cfg):
        if entry.optional and not all(name in sd for name in entry.ours):
            continue
        yield entry, entry.convert.to_theirs([sd[name] for name in entry.ours], cfg)


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    cfg, sd = model.cfg, model.state_dict()
    if not hf_compatible(cfg):
        tied = cfg.lm_head and cfg.tie_embeddings
        return {k: v.detach().contiguous() for k, v in sd.items() if not (tied and k == "lm_head.weight")}
    family = family_of(cfg)
    prefix = family.prefix(cfg)
    out: dict[str, torch.Tensor] = {}
    written: set[str] = set()
    for entry, t in _hf_tensors(cfg, sd):
        t = t.detach().contiguous()
        if written.intersection(entry.ours):  # stored twice (BERT's untied decoder.bias): safetensors
            t = t.clone()                      # refuses two names over the same memory
        written.update(entry.ours)
        out[_hf_name(family, entry, prefix)] = t
    return out


def _stored_name(family: Family, entry: Weight, prefix: str, names: set[str]) -> str | None:
    """The name under which a folder holds entry's tensor (its own or an old alias), or None."""
    for local in (entry.theirs, *entry.aliases):
        full = _hf_name(family, entry, prefix, local)
        if full in names:
            return full
    return None


def _from_hf(cfg: ModelConfig, get: Callable[[str], torch.Tensor], names: set[str],
             file_of: Callable[[str], Path], keep: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """Our state dict from a reader of Hugging Face tensors (names = what the files hold); with `keep`,
    only the tensors of ours it accepts (one block's, for StreamedWeights)."""
    if NATIVE_PROBE in names:  # saved with our own names (a config Hugging Face cannot express)
        return {n: get(n) for n in names if keep is None or keep(n)}
    family = family_of(cfg)
    prefix = family.detect_prefix(cfg, names)
    sd: dict[str, torch.Tensor] = {}
    for entry in family.weights(cfg):
        if keep is not None and not all(keep(name) for name in entry.ours):
            continue
        stored = _stored_name(family, entry, prefix, names)
        if stored is None:
            if entry.optional:
                continue
            full = _hf_name(family, entry, prefix)
            raise ModelLoadError(file_of(full), f"missing tensor {full!r}")
        parts = entry.convert.to_ours(get(stored), cfg)
        if entry.same_as_before:
            for name, t in zip(entry.ours, parts):
                if name in sd and not torch.equal(sd[name], t):
                    raise ModelLoadError(file_of(stored), f"tensor {stored!r} differs from the one read before into "
                                                          f"{name!r}; this app keeps one (not supported)")
        sd.update(zip(entry.ours, parts))
    return sd


def _stored_with(cfg: ModelConfig, ours: set[str]) -> set[str]:
    """`ours` and the tensors stored in one file tensor with any of them (GPT-2's c_attn holds q, k and v)."""
    together = set(ours)
    for entry in family_of(cfg).weights(cfg):
        if together.intersection(entry.ours):
            together.update(entry.ours)
    return together


# -- reading ---------------------------------------------------------------------------------


def read_config(folder: Path) -> ModelConfig:
    path = folder / CONFIG
    if path.is_dir():
        raise ModelLoadError(path, "is a folder, not a file")
    if not path.is_file():
        raise ModelLoadError(folder, f"not a model folder: no {CONFIG}")
    check_links(folder, (CONFIG,))
    try:
        d = read_json(path)  # strict: a key given twice (n_layer 4, then 10**9) is refused by name
    except JsonFileError as exc:
        raise ModelLoadError(path, exc.problem) from None
    if not isinstance(d, dict):
        raise ModelLoadError(path, "malformed config: expected a JSON object")
    return config_from_hf(d, path)


class _MetaSkeleton(torch.overrides.TorchFunctionMode):
    """Build and reshape the meta skeleton without Python meta kernels: meta tensors hold no
    values, and those kernels (random init in nn.Embedding/nn.Linear constructors, torch.cat)
    import torch._dynamo on first use, seconds at start-up. Skips the init, computes cat's shape.
    Modes are per thread, so models built elsewhere meanwhile are not affected."""

    SKIP = {torch.nn.init.normal_, torch.nn.init.uniform_, torch.nn.init.kaiming_uniform_,
            torch.nn.init.trunc_normal_, torch.Tensor.normal_, torch.Tensor.uniform_}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.SKIP:
            return args[0] if args else kwargs["tensor"]
        if func is torch.cat and args and all(t.is_meta for t in args[0]):
            parts, dim = args[0], (args[1] if len(args) > 1 else kwargs.get("dim", 0))
            shape = list(parts[0].shape)
            shape[dim] = sum(t.shape[dim] for t in parts)
            return torch.empty(shape, dtype=parts[0].dtype, device="meta")
        return func(*args, **kwargs)


def assemble_model(cfg: ModelConfig, get: Callable[[str], torch.Tensor], names: set[str],
                   file_of: Callable[[str], Path], weights_file: Path, check_shapes: Callable[[Transformer], None],
                   check_read: Callable[[torch.dtype], None], device: str | torch.device = "cpu",
                   dtype: str | torch.dtype | None = None, for_training: bool = False,
                   stored_dtype: torch.dtype | None = None,
                   block_reader: Callable[[], tuple[Callable[[str], torch.Tensor], Callable[[], None]]] | None = None,
                   ) -> tuple[Transformer, ModelConfig, torch.dtype, str]:
    """The model `cfg` describes, its weights read through the family's table from `get` (Hugging Face
    tensor name -> tensor; `names`: those the source holds): a model folder's safetensors or a GGUF file
    (core/formats). `check_shapes(meta_model)` compares the source's shapes before any data is read;
    `check_read(into)` runs once every tensor is read and the dtype they are cast `into` is known, before the
    cast allocates anything, and again (streamed) after each block's read, before its cast: it checks the
    tensors read since it last ran. `stored_dtype`: the source's dtype when the tensors do
    not say it (dequantized GGUF weights). With `block_reader` (a model larger than memory), only the
    weights outside the blocks are read now; each block is read while it computes (core/streamed.py)
    through a fresh (get, close) pair from block_reader(). Returns (model, config, stored dtype, why)."""
    with torch.device("meta"), _MetaSkeleton():
        model = model_class(cfg)(cfg, init_weights=False)
    check_shapes(model)
    streamed = block_reader is not None
    if streamed and (for_training or cfg.is_encoder_decoder):
        raise ModelLoadError(weights_file, "larger than memory: only a decoder or encoder, not for training, can be "
                                           "read layer by layer")
    sd = _from_hf(cfg, get, names, file_of, keep=(lambda n: not n.startswith("blocks.")) if streamed else None)
    stored_dtype = stored_dtype or _stored_dtype(sd, resolve_dtype(cfg.dtype))
    dtype_reason = ""
    if dtype == "auto":  # the dtype that suits the device (devices.choose_compute_dtype)
        count = cfg.parameter_estimate() if streamed else sum(t.numel() for t in sd.values())
        choice = choose_compute_dtype(stored_dtype, device, count)
        dtype, dtype_reason = choice.dtype, choice.reason
    target_dtype = resolve_dtype(dtype) if dtype is not None else stored_dtype
    check_read(target_dtype)
    if target_dtype != resolve_dtype(cfg.dtype):  # only the recorded dtype changes; the modules need nothing else
        cfg = model.cfg = cfg.replace(dtype={v: k for k, v in DTYPES.items()}[target_dtype])
    expected = {k: v for k, v in model.state_dict().items()}
    for name, t in sd.items():
        want = expected.get(name)
        if want is None:
            continue
        if tuple(t.shape) != tuple(want.shape):
            hf = _hf_name_for(cfg, name, names)
            raise ModelLoadError(file_of(hf),
                                 f"tensor {hf!r} has shape {list(t.shape)} but the config implies {list(want.shape)}")
    if cfg.lm_head and cfg.tie_embeddings:
        sd.pop("lm_head.weight", None)
    missing = set(expected) - set(sd) - ({"lm_head.weight"} if cfg.lm_head and cfg.tie_embeddings else set())
    if streamed:
        missing = {n for n in missing if not n.startswith("blocks.")}
    if missing:
        raise ModelLoadError(weights_file, f"missing tensors for: {', '.join(sorted(missing)[:5])}")
    if for_training:
        sd = {k: v.to(device=device, dtype=target_dtype, memory_format=torch.contiguous_format, copy=True)
              for k, v in sd.items()}
    else:
        sd = {k: v.to(device=device, dtype=target_dtype) for k, v in sd.items()}
    model.load_state_dict(sd, strict=False, assign=True)
    if cfg.lm_head and cfg.tie_embeddings:
        model.lm_head.weight = model.tok_embed.weight
    if cfg.positions == "sinusoidal":
        model.pos_table = sinusoidal_table(cfg.context_length, cfg.d_model, cfg.sinusoidal_layout).to(device)
    model.eval()
    if streamed:
        def load_block(layer: int, on: torch.device, only: set[str] | None = None) -> dict[str, torch.Tensor]:
            block_get, close = block_reader()
            prefix = f"blocks.{layer}."
            try:
                wanted = None if only is None else _stored_with(cfg, {prefix + n for n in only})
                part = _from_hf(cfg, block_get, names, file_of,
                                keep=lambda n: n.startswith(prefix) and (wanted is None or n in wanted))
                check_read(target_dtype)  # the whole load's check, of the tensors not read before
                # copies of their own, so that the files' pages are let go once the reader closes
                out = {n[len(prefix):]: t.to(device=on, dtype=target_dtype, copy=True) for n, t in part.items()}
            finally:
                close()
            return out

        StreamedWeights(model, load_block)
    return model, cfg, stored_dtype, dtype_reason


def _stream_fits(cfg: ModelConfig, folder: Path, width: int, device, for_training: bool) -> bool:
    """Whether a model whose weights exceed the free memory can run layer by layer (core/streamed.py):
    an inference load whose files hold the weights the config describes, and whose embeddings, head and
    two layers (the one computing and its copy being made) fit in memory."""
    if for_training or cfg.is_encoder_decoder or cfg.n_layers < 2:
        return False
    try:
        stored = sum(f.stat().st_size for f in set(weight_files(folder).values()))
    except (ModelLoadError, OSError):
        return False  # the files' own problem is named when they are read
    if stored < 0.9 * cfg.parameter_estimate() * resolve_dtype(cfg.dtype).itemsize:
        return False
    return resident_fits(cfg, width, device)


def resident_bytes(cfg: ModelConfig, width: int) -> float:
    """What a model read layer by layer keeps in memory, at `width` bytes a weight: its embeddings, head and
    two layers (the one computing and its copy being made)."""
    outside = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings or not cfg.lm_head else 2)
    layer = (cfg.parameter_estimate() - outside) / cfg.n_layers
    return (outside + 2 * layer) * width


def resident_fits(cfg: ModelConfig, width: int, device) -> bool:
    """Whether what a model read layer by layer keeps in memory (resident_bytes) fits."""
    try:
        check_memory(resident_bytes(cfg, width), "the model's embeddings, head and two layers", "", device)
    except MemoryEstimateError:
        return False
    return True


def _read_tensor(handles: dict, f: Path, name: str) -> torch.Tensor:
    """Tensor `name` of safetensors file `f`, opening it once into `handles`; a corrupt or truncated file is a
    ModelLoadError naming it."""
    try:
        if f not in handles:
            handles[f] = safe_open(str(f), framework="pt")
        return handles[f].get_tensor(name)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f, f"cannot read tensor {name!r}: corrupt or truncated ({exc})") from exc


def load_model_folder(path: str | Path, device: str | torch.device = "cpu",
                      dtype: str | torch.dtype | None = None, for_training: bool = False,
                      streamed: bool | None = None) -> LoadedModel:
    """Load a model folder; raises ModelLoadError naming the file and the problem.

    A model whose weights exceed the free memory (or any, with streamed=True) is read layer by layer:
    its blocks' weights are read from the files only while each computes (core/streamed.py).

    Weights stay memory-mapped views of the files unless `for_training`: then every parameter gets its
    own contiguous copy. GPT-2's q, k, v and projections are transposed slices of its Conv1D tensors,
    and a strided weight takes another matmul path than a fresh model's, so a resumed run drifted from
    an uninterrupted one (~3e-5 in 20 steps); a copy also never maps the files a trainer rewrites.
    A GGUF file opens with formats.load_model_file, through the same assemble_model.
    """
    from .devices import check_device

    check_device(device)  # a script's device="gpu9": one line naming it and this machine's devices, not torch's
    folder = Path(path)
    folder = interrupted_copy(folder) or folder  # an interrupted atomic_write_dir (the app's own .old only)
    if not folder.exists():
        raise ModelLoadError(folder, "no such folder")
    if not folder.is_dir():
        raise ModelLoadError(folder, "not a folder (open the folder that holds config.json)")
    check_links(folder)
    cfg = read_config(folder)
    # the weights the config describes, before anything is built: a config edited to absurd sizes is
    # refused with the estimate (the tensors' shapes are checked against it next, from their headers)
    width = resolve_dtype(dtype if dtype not in (None, "auto") else cfg.dtype).itemsize
    if streamed is None:
        try:
            check_memory(cfg.parameter_estimate() * width, "the model it describes", "for its weights", device)
            streamed = False
        except MemoryEstimateError as exc:
            # larger than memory: read layer by layer, when the files hold the weights (an absurd config is
            # refused here, before the files' headers are read) and what stays in memory fits
            streamed = _stream_fits(cfg, folder, width, device, for_training)
            if not streamed:
                raise ModelLoadError(folder / CONFIG, str(exc)) from None
    files = weight_files(folder)
    _check_layer_count(cfg, files)
    handles: dict[Path, object] = {}
    # the tensors the model takes, read and not yet checked (an unused extra is not refused); those checked
    # are not again: a streamed block read again (every generated token, every graph batch) is the same bytes
    unchecked: dict[str, None] = {}
    checked: set[str] = set()

    def get(name: str) -> torch.Tensor:
        if name not in checked:
            unchecked[name] = None
        return _read_tensor(handles, files[name], name)

    def check_shapes(meta_model: Transformer) -> None:
        _check_shapes(meta_model, files)

    def check_finite(into: torch.dtype) -> None:
        read = list(unchecked)
        _check_finite({name: files[name] for name in read}, into)
        checked.update(read)
        for name in read:
            unchecked.pop(name, None)

    def block_reader():  # handles of its own, closed once the block is copied: its pages unmapped
        own: dict[Path, object] = {}

        def block_get(name: str) -> torch.Tensor:
            if name not in checked:
                unchecked[name] = None
            return _read_tensor(own, files[name], name)
        return block_get, own.clear

    model, cfg, stored_dtype, dtype_reason = assemble_model(
        cfg, get, set(files), lambda n: files.get(n, folder / WEIGHTS), folder / WEIGHTS, check_shapes, check_finite,
        device=device, dtype=dtype, for_training=for_training, block_reader=block_reader if streamed else None)
    if streamed:
        dtype_reason = "; ".join(filter(None, (dtype_reason, "larger than the free memory: each layer is read from "
                                                             "the files while it computes")))

    try:
        tokenizer = load_tokenizer_folder(folder)
    except TokenizerError as exc:
        raise ModelLoadError(exc.path or folder, f"broken tokenizer: {exc.args[0].split(': ', 1)[-1]}") from exc
    # a snapshot of the local Hugging Face cache is named by its repository, not its commit hash
    name = snapshot_repo_ref(path) or Path(path).name
    generation = read_generation_rules(folder, read_json(folder / CONFIG), cfg.vocab_size)
    return LoadedModel(model=model, config=cfg, tokenizer=tokenizer, path=Path(path), name=name,
                       tokenizer_missing="" if tokenizer is not None else missing_tokenizer(folder),
                       stored_dtype=stored_dtype, dtype_reason=dtype_reason, generation=generation)


def _stored_dtype(sd: dict[str, torch.Tensor], recorded: torch.dtype) -> torch.dtype:
    """The dtype the weights are stored in, when they share one the app computes in: then they stay
    memory-mapped views of the files (a bfloat16 model takes its file's size of memory, where a
    float32 copy would take twice that more). config.json's dtype is only a label, often missing
    (read as float32) or disagreeing with the tensors. Mixed dtypes: the recorded one, by conversion."""
    stored = {t.dtype for t in sd.values() if t.is_floating_point()}
    return stored.pop() if len(stored) == 1 and next(iter(stored)) in DTYPES.values() else recorded


_LAYER_INDEX = re.compile(r"(?:^|\.)(?:h|layer|layers|blocks|block)\.(\d+)\.")  # GPT-2, BERT, LLaMA, ours, T5


def _check_layer_count(cfg: ModelConfig, files: dict[str, Path]) -> None:
    """Weights for more layers than the config has would be dropped without a word: refuse them (an
    encoder-decoder's decoder tensors against its decoder depth)."""
    def layers(name: str) -> int:
        decoder = cfg.is_encoder_decoder and (name.startswith("decoder.") or ".decoder." in name)
        return cfg.n_decoder_layers if decoder else cfg.n_layers

    extra = sorted((int(m.group(1)), name) for name in files
                   if (m := _LAYER_INDEX.search(name)) and int(m.group(1)) >= layers(name))
    if extra:
        layers = sorted({i for i, _ in extra})
        raise ModelLoadError(files[extra[0][1]], f"holds weights for layer(s) {', '.join(map(str, layers[:8]))}"
                                                 f"{' ...' if len(layers) > 8 else ''} but {CONFIG} has n_layers="
                                                 f"{cfg.n_layers}: {len(extra)} tensors (e.g. {extra[0][1]!r}) "
                                                 f"would be dropped")


# safetensors float dtype -> (same-width signed and unsigned integers, the bits of the least positive value
# that is not finite): +infinity, all exponent bits set (float8 e4m3 has none: its all-ones NaN, 0x7F).
# Read as the signed integer, a positive NaN or infinity is then >= those bits (nothing above them but
# other NaNs); read as the unsigned integer, a negative one is >= sign | those bits. So two maxima of the
# bytes as they are settle it: two reads of each chunk while it is in the cache, nothing written (~0.12 s
# for a 0.5B model's 1 GB of bfloat16, against ~0.25 s for a masked copy and its maximum). The same two
# maxima against a lower edge tell the finite values that the cast to a narrower dtype makes infinite
# (float64's 1e39 as float32).
_EXPONENT = {"F16": (np.int16, np.uint16, 0x7C00), "BF16": (np.int16, np.uint16, 0x7F80),
             "F32": (np.int32, np.uint32, 0x7F800000), "F64": (np.int64, np.uint64, 0x7FF0000000000000),
             "F8_E5M2": (np.int8, np.uint8, 0x7C), "F8_E4M3": (np.int8, np.uint8, 0x7F)}
_FINITE_CHUNK = 1 << 20  # bytes per look: twice read from the cache, and the resident pages bounded
_TORCH_FLOAT = {"F16": (torch.float16, torch.int16), "BF16": (torch.bfloat16, torch.int16),
                "F32": (torch.float32, torch.int32), "F64": (torch.float64, torch.int64),
                "F8_E5M2": (torch.float8_e5m2, torch.int8), "F8_E4M3": (torch.float8_e4m3fn, torch.int8)}


@functools.cache
def _overflow_bits(stored: str, into: torch.dtype) -> int | None:
    """The bits of the smallest positive `stored` value that torch's cast to `into` makes infinite (the
    cast rounds, so the edge lies a little above into's largest value), or None when no finite one does.
    Found by bisection over the bits, which order positive floats, so it is exactly the cast's own edge."""
    as_float, as_int = _TORCH_FLOAT[stored]

    def overflows(bits: int) -> bool:
        return bool(torch.isinf(torch.tensor([bits], dtype=as_int).view(as_float).to(into)).item())

    finite, infinite = 0, _EXPONENT[stored][2]  # +0 and the least positive value not finite
    if not overflows(infinite - 1):  # the largest finite value
        return None
    while infinite - finite > 1:
        mid = (finite + infinite) // 2
        finite, infinite = (finite, mid) if overflows(mid) else (mid, infinite)
    return infinite


def _not_finite(name: str, beyond: torch.dtype | None = None) -> str:
    """The message for tensor `name` holding NaN or infinity, or (`beyond`) finite values the cast to that
    dtype would make infinite."""
    if beyond is None:
        return f"tensor {name!r} holds NaN or infinite values: the file is damaged (or was saved from a diverged run)"
    return (f"tensor {name!r} holds values beyond {dtype_name(beyond)}'s range (magnitudes above "
            f"{torch.finfo(beyond).max:.3g}), the dtype it is computed in: they would become infinite")


def range_problem(name: str, bits: np.ndarray, stored: str, into: torch.dtype) -> str | None:
    """Why tensor `name`'s values cannot be computed in `into`: NaN or infinity, or finite values the cast
    makes infinite; None when they can. `bits`: the values (all, or a chunk) as the signed integers of their
    width, `stored` their float type ("F32"): a map's bytes (safetensors) or a float array's .view (GGUF's
    dequantized values); two maxima, nothing copied."""
    if not bits.size:
        return None
    signed, unsigned, exponent = _EXPONENT[stored]
    sign = 1 << (8 * np.dtype(unsigned).itemsize - 1)
    largest, most_negative = int(bits.max()), int(bits.view(unsigned).max())
    if largest >= exponent or most_negative >= sign | exponent:
        return _not_finite(name)
    overflow = _overflow_bits(stored, into)
    if overflow is not None and (largest >= overflow or most_negative >= sign | overflow):
        return _not_finite(name, into)
    return None


def _check_finite(files: dict[str, Path], into: torch.dtype) -> None:
    """Refuse a tensor holding NaN or infinity (damaged bytes, a diverged save), or finite values that
    the cast `into` the compute dtype would make infinite, naming it.

    Reads the files through a read-only map, a chunk at a time, without copying them, and releases
    each chunk's pages once looked at, so the resident set does not grow by the file's size.
    numpy rather than torch: torch's threads spin against each other on a busy machine, 5-10x slower.
    """
    by_file: dict[Path, set[str]] = {}
    for name, f in files.items():
        by_file.setdefault(f, set()).add(name)
    for f, names in by_file.items():
        try:
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(n))
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError, RecursionError) as exc:
            raise ModelLoadError(f, f"corrupt or truncated safetensors file ({exc})") from exc
        spans = sorted((info["data_offsets"], name, info["dtype"]) for name, info in header.items()
                       if name in names and info.get("dtype") in _EXPONENT)
        try:
            for (begin, end), name, dt in spans:
                signed = np.dtype(_EXPONENT[dt][0])
                for off in range(8 + n + begin, 8 + n + end, _FINITE_CHUNK):
                    size = min(8 + n + end - off, _FINITE_CHUNK)
                    # dropped once looked at: no view may outlive the map
                    chunk = np.frombuffer(mm, dtype=signed, count=size // signed.itemsize, offset=off)
                    problem, chunk = range_problem(name, chunk, dt, into), None
                    if problem:
                        raise ModelLoadError(f, problem)
                    if hasattr(mm, "madvise"):
                        page = off - off % mmap.PAGESIZE
                        mm.madvise(mmap.MADV_DONTNEED, page, off + size - page)
        finally:
            mm.close()


def expected_shapes(meta_model: Transformer, names: set[str]) -> dict[str | None, list[int]]:
    """The shape the config implies for each stored tensor (by the name the source holds it under;
    None for those it lacks), from the meta skeleton: no data read."""
    cfg = meta_model.cfg
    with _MetaSkeleton():
        if hf_compatible(cfg):
            family = family_of(cfg)
            prefix = family.detect_prefix(cfg, names)
            return {_stored_name(family, entry, prefix, names): list(t.shape)
                    for entry, t in _hf_tensors(cfg, meta_model.state_dict())}
        return {k: list(t.shape) for k, t in to_hf_state_dict(meta_model).items()}


def _check_shapes(meta_model: Transformer, files: dict[str, Path]) -> None:
    """Compare every tensor's stored shape (header only, no data read) with what the config implies."""
    expected = expected_shapes(meta_model, set(files))
    by_file: dict[Path, list[tuple[str, list[int]]]] = {}
    for stored, want in expected.items():
        if stored in files:  # missing tensors are reported by _from_hf with their name
            by_file.setdefault(files[stored], []).append((stored, want))
    for f, wanted in by_file.items():
        try:
            with safe_open(str(f), framework="pt") as st:
                shapes = [(stored, list(st.get_slice(stored).get_shape()), want) for stored, want in wanted]
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f, f"corrupt or truncated safetensors file ({exc})") from exc
        for stored, shape, want in shapes:
            if shape != want:
                raise ModelLoadError(f, f"tensor {stored!r} has shape {shape} but the config implies {want}")


def _hf_name_for(cfg: ModelConfig, ours: str, names: set[str]) -> str:
    """The stored tensor that holds our tensor `ours` (for messages)."""
    if NATIVE_PROBE in names or not hf_compatible(cfg):
        return ours
    family = family_of(cfg)
    prefix = family.detect_prefix(cfg, names)
    for entry in family.weights(cfg):
        if ours in entry.ours:
            return _stored_name(family, entry, prefix, names) or _hf_name(family, entry, prefix)
    return ours


# -- writing ---------------------------------------------------------------------------------


def save_model_folder(model: Transformer, path: str | Path, tokenizer: Tokenizer | None = None,
                      extra_files: dict[str, bytes] | None = None,
                      extra_fill: Callable[[Path], None] | None = None) -> None:
    """Write config.json + model.safetensors (+ tokenizer.json, + extra files) atomically; `extra_fill(tmp)`
    adds more to the folder before it is swapped in (a training run's kept checkpoints)."""
    cfg = model.cfg

    def fill(tmp: Path) -> None:
        cfg_dict = config_to_hf(cfg.replace(dtype={v: k for k, v in DTYPES.items()}.get(model.dtype, "float32")))
        (tmp / CONFIG).write_text(json.dumps(cfg_dict, indent=2), encoding="utf-8")
        tensors = {k: v.to("cpu") for k, v in to_hf_state_dict(model).items()}
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        if tokenizer is not None:
            _write_tokenizer(tokenizer, tmp)
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
        if extra_fill is not None:
            extra_fill(tmp)

    atomic_write_dir(Path(path), fill)


# what a SentencePiece tokenizer reads beside its model files (core/tokenizer.py's folder settings)
TOKENIZER_SETTINGS = ("tokenizer_config.json", "special_tokens_map.json")


def _write_tokenizer(tokenizer: Tokenizer, folder: Path) -> None:
    """tokenizer.json, or, for a SentencePiece tokenizer (which has no tokenizer.json form), a copy of
    the files it was read from (spiece.model, source.spm / target.spm / vocab.json, tokenizer.model)
    with the settings files beside them, so the saved folder tokenizes as the one it came from."""
    shipped = getattr(tokenizer.tok, "files", None)
    if not shipped:
        (folder / TOKENIZER).write_text(tokenizer.to_str(), encoding="utf-8")
        return
    origin = Path(shipped[0]).parent
    for f in (*map(Path, shipped), *(origin / name for name in TOKENIZER_SETTINGS)):
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())


def new_model(cfg: ModelConfig, seed: int | None = None) -> Transformer | EncoderDecoder:
    if seed is not None:
        torch.manual_seed(seed)
    return model_class(cfg)(cfg).to(dtype=DTYPES[cfg.dtype])
