"""Transcoders in circuit-tracer's on-disk formats, read lazily from safetensors files.

Two kinds (circuit-tracer 0.5, transcoder/single_layer_transcoder.py and cross_layer_transcoder.py):

  per-layer set (PLT)  FOLDER/config.yaml with `model_kind: transcoder_set`, `feature_input_hook`,
                       `feature_output_hook` and `transcoders:` listing one safetensors file per layer
                       (layer_L.safetensors), each holding W_enc [F, d], b_enc [F], W_dec [F, d], b_dec [d],
                       optional W_skip [d, d] (skip = x W_skip^T) and `activation_function.threshold` [F]
                       (JumpReLU).
  cross-layer (CLT)    FOLDER/W_enc_L.safetensors holding W_enc_L [F, d], b_enc_L [F], b_dec_L [d], optional
                       threshold_L [F]; FOLDER/W_dec_L.safetensors holding W_dec_L [F, n_layers - L, d]: layer
                       L's features write to the MLP outputs of layers L..n_layers-1. An optional config.yaml
                       (`model_kind: cross_layer_transcoder`) names the hooks; without one, circuit-tracer's
                       load_clt defaults apply (hook_resid_mid, hook_mlp_out).

Activations: f = ReLU(x W_enc^T + b_enc), or JumpReLU (pre * (pre > threshold)) where a threshold is
stored; `activation_function: topk` with `k: K` in config.yaml keeps each position's K largest
pre-activations (circuit-tracer's TopK: x * gate, no ReLU).

Hooks (circuit-tracer's names): `mlp.hook_in` is the MLP's input after the pre-MLP norm and its gain (the
app's blocks.L.mlp.input); `hook_resid_mid` is the residual stream before that norm; `mlp.hook_out` and
`hook_mlp_out` are the MLP's output. Only safetensors are read (never a pickle); an hf:// path is refused
(nothing is downloaded). Arrays are read only when asked: a layer's encoder when that layer is encoded,
decoder rows of the active features only (positioned reads of their rows, never a memory map).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

INPUT_HOOKS = ("mlp.hook_in", "hook_resid_mid")
OUTPUT_HOOKS = ("mlp.hook_out", "hook_mlp_out")
ACTIVATIONS = ("relu", "jump_relu", "topk")


class TranscoderError(ValueError):
    """A transcoder folder that cannot be used: one line naming the file and the problem."""


def _fail(path, problem: str):
    raise TranscoderError(f"{path}: {problem}")


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


@dataclass
class _Tensors:
    """One safetensors file: its header read once, its arrays read on demand with positioned reads (pread),
    not memory-mapped: a CLT's decoder is tens of GB, and pages of a mapping stay in the process's resident
    memory once touched, where a read's pages are only the kernel's reclaimable cache."""
    path: Path
    header: dict = field(repr=False)
    data_start: int = 0

    @classmethod
    def open(cls, path: Path) -> "_Tensors":
        from ..files import file_problem

        problem = file_problem(path)  # a folder of that name is one, not "missing"
        if problem is not None:
            _fail(path, problem)
        try:
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                if not 2 <= n <= min(100 << 20, path.stat().st_size - 8):
                    raise ValueError(f"header length {n}")
                header = json.loads(f.read(n))
            header.pop("__metadata__", None)
            size = path.stat().st_size - 8 - n
            for name, info in header.items():
                begin, end = info["data_offsets"]
                shape = info["shape"]
                if not isinstance(shape, list) or not all(type(v) is int and v >= 0 for v in [*shape, begin, end]):
                    # (torch.empty's TypeError on a size 4.0 was a traceback; -4 x -8 passed the byte count)
                    raise ValueError(f"tensor {name!r}: shape {shape!r} and offsets {[begin, end]} must be "
                                     f"non-negative integers")
                count = math.prod(shape)
                if info["dtype"] not in _DTYPES or not 0 <= begin <= end <= size \
                        or end - begin != count * _DTYPES[info["dtype"]].itemsize:
                    raise ValueError(f"tensor {name!r}: dtype {info['dtype']}, shape {info['shape']}, "
                                     f"offsets {info['data_offsets']} do not fit the file")
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a truncated or non-safetensors file
            _fail(path, f"not a readable safetensors file ({exc})")
        return cls(path, header, 8 + n)

    def has(self, name: str) -> bool:
        return name in self.header

    def shape(self, name: str) -> tuple[int, ...]:
        if not self.has(name):
            _fail(self.path, f"has no tensor {name!r} (has {', '.join(sorted(self.header))})")
        return tuple(self.header[name]["shape"])

    def _read(self, fd: int, out: torch.Tensor, offset: int) -> None:
        view = out.view(torch.uint8).numpy().reshape(-1)
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                _fail(self.path, "truncated")
            done += got

    def full(self, name: str) -> torch.Tensor:
        info = self.header[name]
        out = torch.empty(self.shape(name), dtype=_DTYPES[info["dtype"]])
        fd = os.open(self.path, os.O_RDONLY)
        try:
            self._read(fd, out, self.data_start + info["data_offsets"][0])
        finally:
            os.close(fd)
        return out

    def rows(self, name: str, ids: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Rows `ids` of the first axis (not the whole array), in `dtype` (default: the file's); runs of
        consecutive ids are read at once."""
        info = self.header[name]
        stored = _DTYPES[info["dtype"]]
        shape = self.shape(name)
        out = torch.empty(len(ids), *shape[1:], dtype=dtype or stored)
        if len(ids) == 0:
            return out
        row_bytes = math.prod(shape[1:]) * stored.itemsize
        ids = ids.cpu().long()
        if int(ids.min()) < 0 or int(ids.max()) >= shape[0]:
            _fail(self.path, f"{name}: row ids outside 0..{shape[0] - 1}")
        breaks = (torch.nonzero(ids[1:] != ids[:-1] + 1).flatten() + 1).tolist()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for a, b in zip([0, *breaks], [*breaks, len(ids)]):
                for c in range(a, b, 4096):  # a bounded buffer where the file's dtype differs
                    e = min(b, c + 4096)
                    offset = self.data_start + info["data_offsets"][0] + int(ids[c]) * row_bytes
                    if out.dtype == stored:
                        self._read(fd, out[c:e], offset)
                    else:
                        chunk = torch.empty(e - c, *shape[1:], dtype=stored)
                        self._read(fd, chunk, offset)
                        out[c:e] = chunk
        finally:
            os.close(fd)
        return out


@dataclass
class _MemoryTensors:
    """_Tensors' interface over tensors in memory (a transcoder being trained, before it is saved)."""
    path: Path
    tensors: dict

    def has(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        if not self.has(name):
            _fail(self.path, f"has no tensor {name!r}")
        return tuple(self.tensors[name].shape)

    def full(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def rows(self, name: str, ids: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = self.tensors[name][ids.cpu()]
        return t if dtype is None else t.to(dtype)


class Transcoders:
    """A per-layer set or a cross-layer transcoder, covering layers 0..n_layers-1.

    encode(layer, x [T, d]) -> activations [T, F]; encoder_rows(layer, ids) -> [n, d];
    decoder_rows(layer, ids) -> [n, len(output_layers(layer)), d]; b_dec(layer) -> [d];
    skip(layer, x) -> [T, d] or None. Values come back in float32 (callers cast), rows in `dtype`."""

    def __init__(self, folder: Path, kind: str, input_hook: str, output_hook: str, activation: str,
                 enc_files: list[_Tensors], dec_files: list[_Tensors], k: int | None = None, scan: str = "") -> None:
        self.folder, self.kind = folder, kind
        self.input_hook, self.output_hook = input_hook, output_hook
        self.activation, self.k = activation, k
        self.scan = scan or folder.name
        self._enc, self._dec = enc_files, dec_files
        self.n_layers = len(enc_files)
        self.n_features, self.d_model = enc_files[0].shape(self._name("W_enc", 0))
        self._small: dict[tuple[str, int], torch.Tensor] = {}  # biases and thresholds, read once
        self._check()

    @property
    def cross_layer(self) -> bool:
        return self.kind == "cross_layer_transcoder"

    def _name(self, base: str, layer: int) -> str:
        return f"{base}_{layer}" if self.cross_layer else base

    def _threshold_name(self, layer: int) -> str:
        return f"threshold_{layer}" if self.cross_layer else "activation_function.threshold"

    def _check(self) -> None:
        """Every array's shape from the headers, before any array is read."""
        F, d, L = self.n_features, self.d_model, self.n_layers
        if self.activation == "topk" and self.k > F:  # (encode kept min(k, F) without a word; circuit-tracer's
            # topk fails there)
            _fail(self.folder / "config.yaml", f"activation_function topk needs k, an integer in 1..{F:,} (the "
                                               f"features a layer has), got {self.k:,}")
        for layer in range(L):
            enc, dec = self._enc[layer], self._dec[layer]
            want = {self._name("W_enc", layer): (F, d), self._name("b_enc", layer): (F,),
                    self._name("b_dec", layer): (d,)}
            if self.activation == "jump_relu":
                want[self._threshold_name(layer)] = (F,)
            for name, shape in want.items():
                if enc.shape(name) != shape:
                    _fail(enc.path, f"{name} has shape {list(enc.shape(name))}, expected {list(shape)}")
            dec_shape = (F, L - layer, d) if self.cross_layer else (F, d)
            name = self._name("W_dec", layer)
            if dec.shape(name) != dec_shape:
                _fail(dec.path, f"{name} has shape {list(dec.shape(name))}, expected {list(dec_shape)}")
            if not self.cross_layer and enc.has("W_skip") and enc.shape("W_skip") != (d, d):
                _fail(enc.path, f"W_skip has shape {list(enc.shape('W_skip'))}, expected {[d, d]}")

    def _vector(self, name: str, layer: int) -> torch.Tensor:
        key = (name, layer)
        if key not in self._small:
            t = self._enc[layer].full(name).float()
            if not torch.isfinite(t).all():
                _fail(self._enc[layer].path, f"{name} has non-finite values")
            self._small[key] = t
        return self._small[key]

    def output_layers(self, layer: int) -> range:
        """The MLP outputs layer `layer`'s features write to."""
        return range(layer, self.n_layers) if self.cross_layer else range(layer, layer + 1)

    def b_dec(self, layer: int) -> torch.Tensor:
        return self._vector(self._name("b_dec", layer), layer)

    def pre_activations(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        W = self._enc[layer].full(self._name("W_enc", layer)).to(x)
        return x @ W.T + self._vector(self._name("b_enc", layer), layer).to(x)

    def encode(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Activations [T, F] of the features at `layer` for inputs x [T, d] (read at input_hook)."""
        pre = self.pre_activations(layer, x)
        if self.activation == "jump_relu":
            return pre * (pre > self._vector(self._threshold_name(layer), layer).to(pre))
        if self.activation == "topk":
            gate = torch.zeros_like(pre).scatter_(-1, pre.topk(self.k, dim=-1).indices, 1)  # k <= F: _check
            return pre * gate
        return torch.relu(pre)

    def encoder_rows(self, layer: int, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._enc[layer].rows(self._name("W_enc", layer), ids, dtype)

    def decoder_rows(self, layer: int, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[n, n_outputs, d]: feature ids' decoder vectors for each layer in output_layers(layer)."""
        rows = self._dec[layer].rows(self._name("W_dec", layer), ids, dtype)
        return rows if self.cross_layer else rows[:, None]

    def has_skip(self) -> bool:
        return not self.cross_layer and self._enc[0].has("W_skip")

    def skip(self, layer: int, x: torch.Tensor) -> torch.Tensor | None:
        """The transcoder's linear skip term x W_skip^T (None without one)."""
        if not self.has_skip():
            return None
        return x @ self._enc[layer].full("W_skip").to(x).T

    def feature_rows_layer(self, layer: int) -> torch.Tensor:
        """All decoder vectors of a layer, [F, n_outputs, d] (small transcoders: tests, edits)."""
        return self.decoder_rows(layer, torch.arange(self.n_features))


MAX_CONFIG_BYTES = 1 << 20  # a config.yaml names hooks and per-layer files: a few kB


def _read_yaml(path: Path) -> dict:
    """config.yaml, refused unread beyond MAX_CONFIG_BYTES, and without YAML's aliases (*name): nine nested
    lists of nine aliases are 9**9 values to print in a message or to str() (a few lines, gigabytes)."""
    import yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                _fail(path, f"line {self.peek_event().start_mark.line + 1}: a YAML alias (*name), which is not "
                            "read here: write the value itself")
            return super().compose_node(parent, index)

    if path.stat().st_size > MAX_CONFIG_BYTES:
        _fail(path, f"is {path.stat().st_size:,} bytes; a transcoders' config.yaml is a few kB (at most "
                    f"{MAX_CONFIG_BYTES:,} are read)")
    try:
        cfg = yaml.load(path.read_text(encoding="utf-8"), Loader=NoAliases)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        _fail(path, f"cannot be read as YAML ({' '.join(str(exc).split())})")
    if not isinstance(cfg, dict):
        _fail(path, "is not a YAML mapping")
    return cfg


def _activation_of(cfg: dict, path: Path, has_threshold: bool) -> tuple[str, int | None]:
    declared = cfg.get("activation_function")
    if declared is None:
        return ("jump_relu" if has_threshold else "relu"), None
    if declared not in ACTIVATIONS:
        _fail(path, f"activation_function {declared!r} is not one of {', '.join(ACTIVATIONS)}")
    if declared == "jump_relu" and not has_threshold:
        _fail(path, "activation_function jump_relu but the files hold no threshold")
    k = None
    if declared == "topk":
        k = cfg.get("k")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            _fail(path, f"activation_function topk needs a positive integer k, got {k!r}")
    return declared, k


def _hooks_of(cfg: dict, path: Path, default_in: str | None = None, default_out: str | None = None) -> tuple[str, str]:
    hook_in, hook_out = cfg.get("feature_input_hook", default_in), cfg.get("feature_output_hook", default_out)
    if hook_in not in INPUT_HOOKS:
        _fail(path, f"feature_input_hook {hook_in!r} is not supported (one of {', '.join(INPUT_HOOKS)})")
    if hook_out not in OUTPUT_HOOKS:
        _fail(path, f"feature_output_hook {hook_out!r} is not supported (one of {', '.join(OUTPUT_HOOKS)})")
    return hook_in, hook_out


def load_transcoders(folder: str | Path) -> Transcoders:
    """A circuit-tracer transcoder folder (module docstring): per-layer set or cross-layer."""
    folder = Path(folder)
    if not folder.is_dir():
        _fail(folder, "is not a folder (give a transcoder folder holding config.yaml or W_enc_0.safetensors)")
    config_path = folder / "config.yaml"
    for named in (config_path, folder / "W_enc_0.safetensors"):
        if named.exists() and not named.is_file():  # a folder of that name: not "holds neither", not "missing"
            from ..files import file_problem

            _fail(named, file_problem(named))
    cfg = _read_yaml(config_path) if config_path.is_file() else {}
    kind = cfg.get("model_kind")
    if kind is None:
        if not (folder / "W_enc_0.safetensors").is_file():
            _fail(folder, "holds neither config.yaml nor W_enc_0.safetensors (a circuit-tracer transcoder folder)")
        kind = "cross_layer_transcoder"
    scan = str(cfg.get("scan") or folder.name)
    if kind == "transcoder_set":
        paths = cfg.get("transcoders")
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
            _fail(config_path, "transcoders: must list one safetensors file per layer")
        files = []
        for p in paths:
            if "://" in p:
                _fail(config_path, f"{p!r} is remote; download the files and list local paths (nothing is fetched)")
            if not p.endswith(".safetensors"):
                _fail(config_path, f"{p!r}: only safetensors transcoders are read (never a pickle or npz)")
            path = Path(p) if Path(p).is_absolute() else folder / p
            files.append(_Tensors.open(path))
        hook_in, hook_out = _hooks_of(cfg, config_path)
        activation, k = _activation_of(cfg, config_path, files[0].has("activation_function.threshold"))
        return Transcoders(folder, kind, hook_in, hook_out, activation, files, files, k, scan)
    if kind == "cross_layer_transcoder":
        n = 0
        while (folder / f"W_enc_{n}.safetensors").is_file():
            n += 1
        if n == 0:
            _fail(folder / "W_enc_0.safetensors", "missing (a cross-layer transcoder's first encoder file)")
        extra = sorted(p.name for p in folder.glob("W_enc_*.safetensors")
                       if p.stem[len("W_enc_"):] not in {str(i) for i in range(n)})
        if extra:
            _fail(folder, f"encoder files are not numbered 0..{n - 1} without gaps ({', '.join(extra)})")
        enc = [_Tensors.open(folder / f"W_enc_{i}.safetensors") for i in range(n)]
        dec = [_Tensors.open(folder / f"W_dec_{i}.safetensors") for i in range(n)]
        hook_in, hook_out = _hooks_of(cfg, config_path, "hook_resid_mid", "hook_mlp_out")
        activation, k = _activation_of(cfg, config_path, enc[0].has("threshold_0"))
        return Transcoders(folder, kind, hook_in, hook_out, activation, enc, dec, k, scan)
    _fail(config_path, f"model_kind {kind!r} is not transcoder_set or cross_layer_transcoder")


def _file_tensors(encoders: list[dict[str, torch.Tensor]], decoders: list[torch.Tensor],
                  cross_layer: bool) -> dict[str, dict[str, torch.Tensor]]:
    """File name -> its tensors, in circuit-tracer's layout (save_transcoders' arguments)."""
    files = {}
    for layer, (enc, dec) in enumerate(zip(encoders, decoders)):
        if cross_layer:
            t = {f"W_enc_{layer}": enc["W_enc"], f"b_enc_{layer}": enc["b_enc"], f"b_dec_{layer}": enc["b_dec"]}
            if "threshold" in enc:
                t[f"threshold_{layer}"] = enc["threshold"]
            files[f"W_enc_{layer}.safetensors"] = t
            files[f"W_dec_{layer}.safetensors"] = {f"W_dec_{layer}": dec}
        else:
            t = {"W_enc": enc["W_enc"], "b_enc": enc["b_enc"], "W_dec": dec, "b_dec": enc["b_dec"]}
            if "threshold" in enc:
                t["activation_function.threshold"] = enc["threshold"]
            if "W_skip" in enc:
                t["W_skip"] = enc["W_skip"]
            files[f"layer_{layer}.safetensors"] = t
    return {name: {k: v.contiguous() for k, v in t.items()} for name, t in files.items()}


def transcoders_in_memory(encoders: list[dict[str, torch.Tensor]], decoders: list[torch.Tensor], cross_layer: bool,
                          input_hook: str = "mlp.hook_in", output_hook: str = "mlp.hook_out",
                          folder: str | Path = "(in memory)") -> Transcoders:
    """The Transcoders that save_transcoders' arguments would load as, without writing them (ReLU)."""
    files = {name: _MemoryTensors(Path(folder) / name, t)
             for name, t in _file_tensors(encoders, decoders, cross_layer).items()}
    n = len(encoders)
    if cross_layer:
        enc = [files[f"W_enc_{i}.safetensors"] for i in range(n)]
        dec = [files[f"W_dec_{i}.safetensors"] for i in range(n)]
        kind = "cross_layer_transcoder"
    else:
        enc = dec = [files[f"layer_{i}.safetensors"] for i in range(n)]
        kind = "transcoder_set"
    return Transcoders(Path(folder), kind, input_hook, output_hook, "relu", enc, dec)


def save_transcoders(folder: str | Path, encoders: list[dict[str, torch.Tensor]], decoders: list[torch.Tensor],
                     cross_layer: bool, input_hook: str = "mlp.hook_in", output_hook: str = "mlp.hook_out",
                     extra_config: dict | None = None, extra_files: dict[str, str | bytes] | None = None) -> None:
    """Write transcoders in circuit-tracer's layout (a new folder, built beside and renamed into place).
    encoders[L]: W_enc [F, d], b_enc [F], b_dec [d], optional threshold [F] and (per-layer) W_skip [d, d];
    decoders[L]: W_dec [F, d] (per-layer) or [F, n_layers - L, d] (cross-layer). `extra_files` (name ->
    text or bytes) go beside them (a training run's metrics and resumable state)."""
    import yaml
    from safetensors.torch import save_file

    from ..files import atomic_write_dir, write_files

    def fill(tmp: Path) -> None:
        cfg = {"model_kind": "cross_layer_transcoder" if cross_layer else "transcoder_set",
               "feature_input_hook": input_hook, "feature_output_hook": output_hook, **(extra_config or {})}
        for name, t in _file_tensors(encoders, decoders, cross_layer).items():
            save_file(t, str(tmp / name))
        if not cross_layer:
            cfg["transcoders"] = [f"layer_{layer}.safetensors" for layer in range(len(encoders))]
        (tmp / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        write_files(tmp, extra_files)

    atomic_write_dir(Path(folder), fill)


def random_transcoders(folder: str | Path, n_layers: int, d_model: int, n_features: int, cross_layer: bool = False,
                       activation: str = "relu", skip: bool = False, seed: int = 0, dtype=torch.float32,
                       input_hook: str = "mlp.hook_in", k: int | None = None) -> None:
    """Random transcoders (tests, benchmarks, the circuit-tracer comparison): encoders ~ N(0, 1/d), biases
    small and negative so that a fraction of the features fire, decoders ~ N(0, 1/F)."""
    g = torch.Generator().manual_seed(seed)
    encoders, decoders = [], []
    for layer in range(n_layers):
        enc = {"W_enc": torch.randn(n_features, d_model, generator=g) / d_model ** 0.5,
               "b_enc": -0.3 * torch.rand(n_features, generator=g),
               "b_dec": 0.1 * torch.randn(d_model, generator=g)}
        if activation == "jump_relu":
            enc["threshold"] = 0.2 * torch.rand(n_features, generator=g)
        if skip:
            enc["W_skip"] = 0.1 * torch.randn(d_model, d_model, generator=g) / d_model ** 0.5
        outputs = (n_layers - layer,) if cross_layer else ()
        decoders.append((torch.randn(n_features, *outputs, d_model, generator=g) / n_features ** 0.5).to(dtype))
        encoders.append({name: t.to(dtype) for name, t in enc.items()})
    extra = {"activation_function": "topk", "k": k} if activation == "topk" else None
    save_transcoders(folder, encoders, decoders, cross_layer, input_hook, extra_config=extra)
