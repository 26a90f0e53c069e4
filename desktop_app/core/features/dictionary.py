"""A sparse dictionary (SAE or transcoder): its weights, encode / decode, and its folder formats.

Formulas (SAELens' own, float32; x [..., d_in]):
    x_n   = norm_in(x)                     "none"; "constant_norm_rescale": x * sqrt(d_in) / |x|;
                                           "layer_norm": (x - mean) / (std + 1e-5), undone by y * std + mean
    x_c   = x_n - b_dec                    only when apply_b_dec_to_input (an SAE: d_in == d_out)
    pre   = x_c @ W_enc + b_enc            [..., d_sae]
    acts  = relu(pre)                      standard
            relu(pre) * (pre > threshold)  jumprelu
            relu of the k largest of pre,  topk
            the others 0
            (x_c @ W_enc + b_gate > 0) * relu(x_c @ (W_enc * exp(r_mag)) + b_mag)   gated (b_enc is b_mag)
    recon = norm_out(acts @ W_dec + b_dec) an SAE
            acts @ W_dec + b_dec (+ x @ W_skip.T)  a transcoder (with a skip connection)
    TopK with rescale_acts_by_decoder_norm: pre is multiplied by |W_dec_i| before the top k are taken,
    and acts divided by it before the decoder.

Folders read (`load_dictionary`):
    SAELens:      cfg.json + sae_weights.safetensors (W_enc [d_in, d_sae], W_dec [d_sae, d_in], b_enc,
                  b_dec, optional threshold; cfg: architecture, d_in, d_sae, k, apply_b_dec_to_input,
                  normalize_activations, metadata.hook_name (older: hook_name / hook_point));
                  a transcoder (architecture transcoder, skip_transcoder, jumprelu_transcoder...)
                  adds metadata.hook_name_out, d_out and optional W_skip [d_out, d_in]; a gated SAE has
                  b_gate, b_mag, r_mag instead of b_enc. Read as SAELens reads it: a cfg.json of SAELens 6
                  or later must name its architecture; an older one (no sae_lens_version, or below 6)
                  defaults to standard (TopK where activation_fn says so); apply_b_dec_to_input defaults
                  to true; any other architecture (matching pursuit...) is refused by its name.
    Gemma Scope:  params.safetensors or params.npz (W_enc, W_dec, b_enc, b_dec, threshold; JumpReLU);
                  the hook from a cfg.json beside it, the caller's `hook=`, or the folder path
                  (layer_N and a release named ...-res / -mlp / -att).
An .npz is read without pickle, its headers checked first (core.files.check_array_file).
Anything wrong is a DictionaryError naming the file and the problem in one line.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ARCHITECTURES = ("standard", "jumprelu", "topk", "gated")
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")
WEIGHTS_FILE = "sae_weights.safetensors"
CFG_FILE = "cfg.json"
GEMMA_SCOPE_FILES = ("params.safetensors", "params.npz")
SAELENS_FORMAT_VERSION = "6.0.0"  # the cfg.json layout written (SAELens reads an unversioned one as pre-6)
MAX_DICTIONARY_BYTES = 2**34  # 16 GB: a header claiming more is refused before anything is read
MAX_CFG_BYTES = 1 << 24  # a cfg.json is a few kB: 16 MB is far beyond, and is not read whole


class DictionaryError(ValueError):
    """A dictionary folder that cannot be used: one line naming the file and the problem."""


@dataclass(eq=False)
class SparseDictionary:
    """One sparse dictionary, float32 on the CPU (`.to(device)` moves it). `hook` is where it reads
    (a TransformerLens or app name, see features.hooks), `hook_out` where a transcoder writes (None: an
    SAE writes where it reads)."""
    W_enc: torch.Tensor  # [d_in, d_sae]
    b_enc: torch.Tensor  # [d_sae]
    W_dec: torch.Tensor  # [d_sae, d_out]
    b_dec: torch.Tensor  # [d_out]
    architecture: str = "standard"
    hook: str | None = None
    hook_out: str | None = None
    threshold: torch.Tensor | None = None  # [d_sae], jumprelu
    b_gate: torch.Tensor | None = None  # [d_sae], gated (its b_enc is SAELens' b_mag)
    r_mag: torch.Tensor | None = None  # [d_sae], gated
    k: int | None = None  # topk
    W_skip: torch.Tensor | None = None  # [d_out, d_in], a transcoder's skip connection (SAELens' layout)
    rescale_acts_by_decoder_norm: bool = False  # topk
    apply_b_dec_to_input: bool = False
    normalize_activations: str = "none"
    cfg: dict = field(default_factory=dict)  # the cfg.json as read (what is saved back)
    path: str = ""

    def __post_init__(self) -> None:
        # a TopK dictionary a script makes meets the loader's rule (activate kept min(k, d_sae) without a word)
        k = self.k
        if self.architecture == "topk" and (not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= self.d_sae):
            raise DictionaryError(f"{self.name}: a TopK dictionary needs k, an integer in 1..{self.d_sae} (d_sae), "
                                  f"got {k!r}")

    # -- sizes ------------------------------------------------------------------------------------
    @property
    def d_in(self) -> int:
        return int(self.W_enc.shape[0])

    @property
    def d_sae(self) -> int:
        return int(self.W_enc.shape[1])

    @property
    def d_out(self) -> int:
        return int(self.W_dec.shape[1])

    @property
    def is_transcoder(self) -> bool:
        return self.hook_out is not None

    @property
    def name(self) -> str:
        return Path(self.path).name if self.path else f"{self.architecture} {self.d_in}x{self.d_sae}"

    def to(self, device) -> "SparseDictionary":
        for key in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold", "W_skip", "b_gate", "r_mag"):
            t = getattr(self, key)
            if t is not None:
                setattr(self, key, t.to(device))
        return self

    # -- the formulas -----------------------------------------------------------------------------
    def normalize_in(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(x normalised, what norm_out needs to undo it; None for a transcoder, whose output is not)."""
        if self.is_transcoder:
            return x, None
        if self.normalize_activations == "constant_norm_rescale":
            coeff = math.sqrt(self.d_in) / x.norm(dim=-1, keepdim=True)
            return x * coeff, ("scale", coeff)
        if self.normalize_activations == "layer_norm":
            mu = x.mean(-1, keepdim=True)
            x = x - mu
            std = x.std(-1, keepdim=True)
            return x / (std + 1e-5), ("ln", mu, std)
        return x, None

    @staticmethod
    def normalize_out(y: torch.Tensor, how, linear: bool = False) -> torch.Tensor:
        """Undo normalize_in on a decoder output; `linear`: on a difference of outputs (no shift)."""
        if how is None:
            return y
        if how[0] == "scale":
            return y / how[1]
        y = y * how[2]  # SAELens multiplies back by the std alone (its eps only guards the division)
        return y if linear else y + how[1]

    def pre_activations(self, x: torch.Tensor, only: slice = slice(None)) -> tuple[torch.Tensor, Any]:
        """(pre-activations [..., d_sae], the normalisation state); `only`: those features' columns alone."""
        x = x.to(self.W_enc.dtype)
        x, how = self.normalize_in(x)
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        W_enc, b_enc = self.W_enc[:, only], self.b_enc[only]
        if self.architecture == "gated":  # relu(where(gate > 0, magnitude, 0)) = (gate > 0) * relu(magnitude)
            gate = x @ W_enc + self.b_gate[only]
            magnitude = x @ (W_enc * self.r_mag[only].exp()) + b_enc
            return torch.where(gate > 0, magnitude, torch.zeros_like(magnitude)), how
        pre = x @ W_enc + b_enc
        if self.architecture == "topk" and self.rescale_acts_by_decoder_norm:
            pre = pre * self.W_dec[only].norm(dim=-1)
        return pre, how

    def _dec_scale(self, acts: torch.Tensor) -> torch.Tensor:
        if self.architecture == "topk" and self.rescale_acts_by_decoder_norm:
            return acts * (1 / self.W_dec.norm(dim=-1))
        return acts

    def activate(self, pre: torch.Tensor, only: slice = slice(None)) -> torch.Tensor:
        if self.architecture == "jumprelu":
            return torch.relu(pre) * (pre > self.threshold[only]).to(pre.dtype)
        if self.architecture == "topk":
            top = pre.topk(self.k, dim=-1, sorted=False)  # k <= d_sae: __post_init__
            return torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))
        return torch.relu(pre)

    def encode_feature(self, x: torch.Tensor, feature: int) -> torch.Tensor:
        """encode(x)[..., feature] from that feature's encoder column alone (a TopK feature is on only where it
        ranks among the k largest: every column is computed)."""
        if self.architecture == "topk":
            return self.encode(x)[..., feature]
        only = slice(feature, feature + 1)
        return self.activate(self.pre_activations(x, only)[0], only)[..., 0]

    def encode_with(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(feature activations [..., d_sae], the normalisation state decode needs)."""
        pre, how = self.pre_activations(x)
        return self.activate(pre), how

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode_with(x)[0]

    def decode(self, acts: torch.Tensor, how=None, x_in: torch.Tensor | None = None) -> torch.Tensor:
        """acts @ W_dec + b_dec, un-normalised (`how` from encode_with), plus the skip term of a
        transcoder that has one (x_in: what it read)."""
        out = self.normalize_out(self._dec_scale(acts) @ self.W_dec + self.b_dec, how)
        if self.W_skip is not None:
            if x_in is None:
                raise ValueError(f"{self.name}: a transcoder's skip connection needs the input it read")
            out = out + self.skip(x_in)
        return out

    def skip(self, x_in: torch.Tensor) -> torch.Tensor:
        """A skip transcoder's x @ W_skip.T (zeros without a skip connection)."""
        if self.W_skip is None:
            return torch.zeros(*x_in.shape[:-1], self.d_out, dtype=self.W_dec.dtype, device=x_in.device)
        return x_in.to(self.W_skip.dtype) @ self.W_skip.T

    def decode_delta(self, d_acts: torch.Tensor, how=None) -> torch.Tensor:
        """What a change of the activations changes in the output: norm_out(d_acts @ W_dec), linear."""
        return self.normalize_out(self._dec_scale(d_acts) @ self.W_dec, how, linear=True)

    def reconstruct(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(acts, reconstruction) of x (an SAE; a transcoder's input)."""
        acts, how = self.encode_with(x)
        return acts, self.decode(acts, how, x_in=x)


# -- reading ------------------------------------------------------------------------------------


def _fail(path, problem: str):
    raise DictionaryError(f"{path}: {problem}")


def _read_json(path: Path) -> dict:
    from ..files import JsonFileError, read_json

    try:
        data = read_json(path, max_bytes=MAX_CFG_BYTES)  # the one strict reader: a key given twice is refused
    except JsonFileError as exc:
        raise DictionaryError(str(exc)) from None
    if not isinstance(data, dict):
        _fail(path, "is not a JSON object")
    return data


def _check_headers(path: Path, shapes: dict[str, list[int]], cfg: dict) -> None:
    """Before a weights file is read: its tensors' shapes (from its header) agree, and their float32 copies
    fit (a bound, and the memory available): one line naming the file otherwise."""
    from ..devices import MemoryEstimateError, check_memory

    if str(cfg.get("architecture", "")).lower() == "gated":
        shapes = {("b_enc" if k == "b_mag" else k): v for k, v in shapes.items()}
    check_shapes(shapes, cfg, path)
    total = sum(4 * math.prod(shape) for shape in shapes.values())
    if total > MAX_DICTIONARY_BYTES:
        _fail(path, f"claims {total / 2**30:.0f} GB of weights; refusing to read it")
    try:
        check_memory(2 * total, f"reading {path.name}", "(its weights, then float32)")
    except MemoryEstimateError as exc:
        _fail(path, str(exc))


def _read_safetensors(path: Path, cfg: dict) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, after its header says what it holds (_check_headers)."""
    from safetensors import safe_open

    from ..files import file_problem

    problem = file_problem(path)  # safetensors says "No such file or directory" of an unreadable file
    if problem is not None:
        _fail(path, problem)
    try:
        with safe_open(str(path), framework="pt") as f:
            _check_headers(path, {key: [int(n) for n in f.get_slice(key).get_shape()] for key in f.keys()}, cfg)
            return {key: f.get_tensor(key) for key in f.keys()}
    except DictionaryError:
        raise
    except Exception as exc:  # safetensors' own errors: a truncated or corrupt file
        _fail(path, f"not a readable safetensors file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")


def _read_npz(path: Path, cfg: dict) -> dict[str, torch.Tensor]:
    """Every array of an .npz (compressed members too), after their headers say what they hold
    (_check_headers: shapes and sizes refused before anything is inflated); one array read at a time."""
    import numpy as np

    from ..files import check_array_file

    try:
        headers = check_array_file(path, MAX_DICTIONARY_BYTES)
    except ValueError as exc:
        raise DictionaryError(str(exc)) from None
    _check_headers(path, {name: list(shape) for name, (shape, _) in headers.items()}, cfg)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {key: torch.from_numpy(z[key]) for key in z.files}
    except ValueError as exc:
        _fail(path, f"cannot be read without pickle ({exc})")
    except Exception as exc:
        _fail(path, f"not a readable .npz archive ({type(exc).__name__}: {exc})")


def _hook_from_path(folder: Path) -> str | None:
    """Gemma Scope's layout: .../gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71/params.npz."""
    text = str(folder.resolve()).replace("\\", "/")
    m = re.search(r"layer_(\d+)", text)
    if not m:
        return None
    layer = int(m.group(1))
    if re.search(r"-res(-|/|$)|resid", text):
        return f"blocks.{layer}.hook_resid_post"
    if re.search(r"-mlp(-|/|$)", text):
        return f"blocks.{layer}.hook_mlp_out"
    if re.search(r"-att(-|/|$)", text):
        return f"blocks.{layer}.attn.hook_z"
    return None


def _cfg_hook(cfg: dict) -> str | None:
    meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    for source in (meta, cfg):
        for key in ("hook_name", "hook_point"):
            if isinstance(source.get(key), str) and source[key]:
                return source[key]
    return None


def _cfg_hook_out(cfg: dict) -> str | None:
    meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    for source in (cfg, meta):
        for key in ("hook_name_out", "hook_point_out"):
            if isinstance(source.get(key), str) and source[key]:
                return source[key]
    return None


def _check_inside(folder: Path, f: Path) -> None:
    """A file of the folder that is a link leading outside it is refused (the rule of every folder the
    app reads, model folders' included: links stay inside it)."""
    if f.is_symlink():
        real = f.resolve()
        if not real.is_relative_to(folder.resolve()):
            _fail(f, f"a link to {real}, outside the dictionary's folder; refused (its files must lie inside it)")


def load_dictionary(folder: str | Path, hook: str | None = None) -> SparseDictionary:
    """Open a dictionary folder (SAELens or Gemma Scope, see the module docstring); `hook` overrides
    the hook its files name (and is needed where they name none)."""
    from ..files import file_problem

    folder = Path(folder)
    if folder.is_dir() and folder.name in (CFG_FILE, WEIGHTS_FILE, *GEMMA_SCOPE_FILES):  # named as the file
        _fail(folder, file_problem(folder))
    if folder.is_file():  # a weights file named directly: its folder
        if folder.name not in (CFG_FILE, WEIGHTS_FILE, *GEMMA_SCOPE_FILES):  # (else the message named the folder)
            _fail(folder, f"not a dictionary: give its folder (SAELens' {CFG_FILE} and {WEIGHTS_FILE}, or Gemma "
                          f"Scope's {' / '.join(GEMMA_SCOPE_FILES)}) or one of those files")
        folder = folder.parent
    if not folder.is_dir():
        _fail(folder, "no such folder (a dictionary is a folder with cfg.json and sae_weights.safetensors, or "
                      "Gemma Scope's params.npz)")
    cfg_path = folder / CFG_FILE
    for f in (cfg_path, folder / WEIGHTS_FILE, *(folder / n for n in GEMMA_SCOPE_FILES)):
        _check_inside(folder, f)
        if f.exists() and not f.is_file():  # a folder (or a pipe) of that name: not "missing", not "holds neither"
            _fail(f, file_problem(f))
    cfg = _read_json(cfg_path) if cfg_path.is_file() else {}
    weights_path = folder / WEIGHTS_FILE
    if weights_path.is_file():
        if not cfg:
            _fail(cfg_path, "missing: SAELens' folder format has cfg.json beside sae_weights.safetensors")
        major = _saelens_major(cfg)
        if not cfg.get("architecture") and major is not None and major >= 6:  # SAELens refuses it too
            _fail(cfg_path, f"names no architecture (SAELens {major}'s cfg.json must: one of "
                            f"{', '.join(ARCHITECTURES)}, or a transcoder)")
        tensors = _read_safetensors(weights_path, cfg)
    else:
        found = [folder / name for name in GEMMA_SCOPE_FILES if (folder / name).is_file()]
        if not found:
            _fail(folder, f"holds neither {WEIGHTS_FILE} (SAELens) nor params.safetensors / params.npz (Gemma Scope)")
        weights_path = found[0]
        tensors = (_read_safetensors(weights_path, cfg) if weights_path.suffix == ".safetensors"
                   else _read_npz(weights_path, cfg))
        cfg = {"architecture": "jumprelu", **cfg}
    return dictionary_from_tensors(tensors, cfg, weights_path, hook=hook, folder=folder)


_ARCHITECTURE_NAMES = {"jump_relu": "jumprelu", "top_k": "topk", "jumprelu_transcoder": "jumprelu",
                       "jumprelu_skip_transcoder": "jumprelu", "transcoder": "standard", "skip_transcoder": "standard"}


def check_shapes(shapes: dict[str, list[int]], cfg: dict, where: Path) -> tuple[int, int, int]:
    """(d_in, d_sae, d_out) when the tensors' shapes (by name: W_enc, W_dec, b_enc...) agree with each other
    and with cfg.json; DictionaryError naming `where` otherwise. Run on the files' headers before anything
    is read, and on the tensors read."""
    def shape(key):
        return shapes.get(key)

    W_enc, W_dec = shape("W_enc"), shape("W_dec")
    if W_enc is None or W_dec is None:
        return 0, 0, 0  # (a missing tensor is named by the caller)
    if len(W_enc) != 2:
        _fail(where, f"W_enc must be [d_in, d_sae], got shape {W_enc}")
    d_in, d_sae = W_enc
    if len(W_dec) != 2 or W_dec[0] != d_sae:
        _fail(where, f"W_dec must be [d_sae, d_out] = [{d_sae}, ...] (W_enc is [{d_in}, {d_sae}]), got shape {W_dec}")
    d_out = W_dec[1]
    for key, want, what in (("b_enc", [d_sae], "d_sae"), ("b_dec", [d_out], "d_out"), ("threshold", [d_sae], "d_sae"),
                            ("W_skip", [d_out, d_in], "d_out, d_in"), ("b_gate", [d_sae], "d_sae"),
                            ("r_mag", [d_sae], "d_sae")):
        if shape(key) is not None and shape(key) != want:
            _fail(where, f"{key} must have shape {want} ({what}), got {shape(key)}")
    for key, size in (("d_in", d_in), ("d_sae", d_sae)):
        if key in cfg and (not isinstance(cfg[key], int) or isinstance(cfg[key], bool)):
            _fail(where.with_name(CFG_FILE), f"{key} must be an integer, got {cfg[key]!r}")
        if key in cfg and cfg[key] != size:
            _fail(where.with_name(CFG_FILE), f"says {key} {cfg[key]!r} but {where.name} holds {size}")
    return d_in, d_sae, d_out


def _saelens_major(cfg: dict) -> int | None:
    """The major version of SAELens that wrote a cfg.json (sae_lens_version, at the top or in metadata)."""
    meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    version = cfg.get("sae_lens_version") or meta.get("sae_lens_version")
    m = re.match(r"\s*(\d+)", version) if isinstance(version, str) else None
    return int(m.group(1)) if m else None


def dictionary_from_tensors(tensors: dict[str, torch.Tensor], cfg: dict, where, hook: str | None = None,
                            folder: Path | None = None) -> SparseDictionary:
    """Check shapes, keys and values; DictionaryError naming `where` (the weights file) otherwise."""
    where = Path(where)
    cfg_where = where.with_name(CFG_FILE)
    raw_arch = str(cfg.get("architecture") or ("jumprelu" if "threshold" in tensors else "standard")).lower()
    arch = _ARCHITECTURE_NAMES.get(raw_arch, raw_arch)
    if arch not in ARCHITECTURES and not (cfg.get("activation_fn") or cfg.get("activation_fn_str")) == "topk":
        _fail(cfg_where, f"architecture {cfg.get('architecture')!r} is not one the app computes "
                         f"({', '.join(ARCHITECTURES)}, and the transcoders)")
    if arch == "gated":  # SAELens' names: b_mag is the magnitude path's b_enc
        tensors = {("b_enc" if k == "b_mag" else k): v for k, v in tensors.items()}
    needed = ("W_enc", "W_dec", "b_enc", "b_dec") + (("b_gate", "r_mag") if arch == "gated" else ())
    for key in needed:
        if key not in tensors:
            have = ", ".join(sorted("b_mag" if k == "b_enc" and arch == "gated" else k for k in tensors))
            _fail(where, f"has no tensor {'b_mag' if key == 'b_enc' and arch == 'gated' else key!r} "
                         f"(it has: {have or 'none'})")
    t = {key: value.detach().to(torch.float32).contiguous() for key, value in tensors.items()
         if key in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold", "W_skip", "b_gate", "r_mag")}
    for key, value in t.items():
        if not torch.isfinite(value).all():
            bad = int((~torch.isfinite(value)).sum())
            _fail(where, f"tensor {key!r} holds {bad} non-finite value{'s' if bad != 1 else ''} (NaN or infinite)")
    W_enc, W_dec, b_enc, b_dec = t["W_enc"], t["W_dec"], t["b_enc"], t["b_dec"]
    d_in, d_sae, d_out = check_shapes({k: list(v.shape) for k, v in t.items()}, cfg, where)
    threshold, W_skip = t.get("threshold"), t.get("W_skip")
    hook_out = _cfg_hook_out(cfg)
    fn = cfg.get("activation_fn") or cfg.get("activation_fn_str")  # SAELens before 6: TopK said here
    if fn == "topk" and not cfg.get("architecture"):
        raw_arch = arch = "topk"
        kwargs = cfg.get("activation_fn_kwargs") if isinstance(cfg.get("activation_fn_kwargs"), dict) else {}
        cfg = {**cfg, "k": cfg.get("k", kwargs.get("k"))}
    if "transcoder" in raw_arch and hook_out is None:
        _fail(cfg_where, f"a {raw_arch} names no output hook (metadata.hook_name_out, e.g. blocks.2.hook_mlp_out)")
    if hook_out is not None and "d_out" in cfg and cfg["d_out"] != d_out:
        _fail(cfg_where, f"says d_out {cfg['d_out']!r} but {where.name} holds {d_out}")
    if hook_out is None and d_out != d_in:
        _fail(where, f"an SAE decodes to its input's width: W_dec is [{d_sae}, {d_out}], W_enc [{d_in}, {d_sae}] "
                     "(a transcoder names hook_name_out in cfg.json)")
    if arch == "gated" and hook_out is not None:
        _fail(cfg_where, "a gated transcoder is not one SAELens saves (gated SAEs only)")
    if arch == "jumprelu" and threshold is None:
        _fail(where, "a JumpReLU dictionary needs a 'threshold' tensor")
    k = None
    if arch == "topk":
        k = cfg.get("k")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= d_sae:
            _fail(cfg_where, f"a TopK dictionary needs k, an integer in 1..{d_sae} (d_sae), got {k!r}")
    norm = cfg.get("normalize_activations") or "none"
    if norm not in NORMALIZATIONS:
        _fail(cfg_where, f"normalize_activations {norm!r} is not one the app computes ({', '.join(NORMALIZATIONS)})")
    # SAELens' default (its SAEConfig) when the cfg.json does not say; a transcoder's b_dec is the output's
    apply_b_dec = bool(cfg.get("apply_b_dec_to_input", hook_out is None and where.name == WEIGHTS_FILE))
    if apply_b_dec and hook_out is not None:
        _fail(cfg_where, "apply_b_dec_to_input does not apply to a transcoder (b_dec has the output's width)")
    hook = hook or _cfg_hook(cfg) or (_hook_from_path(folder) if folder is not None else None)
    if hook is None:
        _fail(cfg_where if cfg_where.exists() else where,
              "names no hook (metadata.hook_name): say which activation it reads (e.g. blocks.2.hook_resid_post)")
    from .hooks import app_point
    for h in (hook, hook_out):
        if h is not None:
            try:
                app_point(h)
            except ValueError as exc:
                _fail(cfg_where, str(exc))
    return SparseDictionary(W_enc, b_enc, W_dec, b_dec, architecture=arch, hook=hook, hook_out=hook_out,
                            threshold=threshold, k=k, W_skip=W_skip, apply_b_dec_to_input=apply_b_dec,
                            b_gate=t.get("b_gate"), r_mag=t.get("r_mag"),
                            normalize_activations=norm, cfg=dict(cfg), path=str(folder or where.parent),
                            rescale_acts_by_decoder_norm=bool(cfg.get("rescale_acts_by_decoder_norm", False)))


# -- writing (SAELens' format) -----------------------------------------------------------------


def saelens_cfg(d: SparseDictionary, model_name: str = "", context_size: int | None = None,
                dataset_path: str = "", prepend_bos: bool = True) -> dict:
    """The cfg.json SAELens (6.x) reads back for this dictionary; `prepend_bos`: whether each context it was
    trained on began with a BOS the model run added (SAELens' metadata)."""
    arch = d.architecture
    if d.is_transcoder:
        skip = "skip_" if d.W_skip is not None else ""
        if arch not in ("standard", "jumprelu"):
            raise ValueError(f"SAELens' format has no {arch} transcoder (standard or JumpReLU only)")
        arch = {"standard": f"{skip}transcoder", "jumprelu": f"jumprelu_{skip}transcoder"}[arch]
    cfg = {"architecture": arch, "d_in": d.d_in, "d_sae": d.d_sae, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": d.apply_b_dec_to_input, "normalize_activations": d.normalize_activations,
           "reshape_activations": "hook_z" if d.hook and d.hook.endswith("hook_z") else "none",
           "metadata": {"model_name": model_name, "hook_name": d.hook, "hook_head_index": None,
                        "prepend_bos": prepend_bos, "context_size": context_size, "dataset_path": dataset_path,
                        "sae_lens_version": SAELENS_FORMAT_VERSION, "sae_lens_training_version": None}}
    if d.architecture == "topk":
        cfg["k"] = d.k
        cfg["rescale_acts_by_decoder_norm"] = d.rescale_acts_by_decoder_norm
    if d.is_transcoder:
        cfg["d_out"] = d.d_out
        cfg["metadata"]["hook_name_out"] = d.hook_out
    return cfg


def save_dictionary(d: SparseDictionary, folder: str | Path, cfg: dict | None = None,
                    extra_files: dict[str, str | bytes] | None = None) -> None:
    """Write `folder` atomically in SAELens' format (cfg.json + sae_weights.safetensors), plus any
    `extra_files` (name -> text or bytes, e.g. training metrics and a resumable training state)."""
    from safetensors.torch import save_file

    from ..files import atomic_write_dir, write_files

    tensors = {"W_enc": d.W_enc, "W_dec": d.W_dec, "b_dec": d.b_dec}
    if d.architecture == "gated":  # SAELens' names
        tensors.update(b_mag=d.b_enc, b_gate=d.b_gate, r_mag=d.r_mag)
    else:
        tensors["b_enc"] = d.b_enc
    if d.threshold is not None:
        tensors["threshold"] = d.threshold
    if d.W_skip is not None:
        tensors["W_skip"] = d.W_skip
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in tensors.items()}
    cfg = cfg if cfg is not None else saelens_cfg(d)

    def fill(tmp: Path) -> None:
        save_file(tensors, str(tmp / WEIGHTS_FILE))
        (tmp / CFG_FILE).write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        write_files(tmp, extra_files)

    atomic_write_dir(Path(folder), fill)
