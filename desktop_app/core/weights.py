"""The files of a model folder, below the families and the loader: which files hold its weights
(model.safetensors, a sharded index, the only .safetensors), that every file read lies inside the
folder, and ModelLoadError, the one error for a folder or a file in it that cannot be used.

Both checkpoints (the loader) and a family that looks at a folder's tensors (ViT's pooler) read
weight files through here; this module imports no family and no model code.
"""
from __future__ import annotations

import os
from pathlib import Path

from safetensors import SafetensorError, safe_open

from .files import file_problem
from .hf_layout import is_snapshot
from .sentencepiece_tokenizer import SENTENCEPIECE_FILES
from .tokenizer import BPE_MERGES, BPE_VOCAB, SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG, WORDPIECE_VOCAB

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"


class ModelLoadError(Exception):
    """A model folder (or one file in it) that cannot be used, and why."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def weight_files(folder: Path) -> dict[str, Path]:
    """tensor name -> file holding it, from model.safetensors or the sharded index."""
    single, index = folder / WEIGHTS, folder / INDEX
    if index.is_file():
        from .files import JsonFileError, read_json

        try:  # the one strict reader, capped (a 2 GB index is not read whole)
            weight_map = read_json(index)["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map must map tensor names to file names")
        except JsonFileError as exc:
            raise ModelLoadError(index, f"malformed index: {exc.problem}") from None
        except (KeyError, TypeError) as exc:
            raise ModelLoadError(index, f"malformed index ({exc})") from None
        files = {}
        for name, fname in weight_map.items():
            f = shard_path(folder, index, fname)
            if not f.is_file():
                raise ModelLoadError(f, f"shard listed in {INDEX} is missing")
            files[name] = f
        return files
    if single.is_file():
        return {name: single for name in safetensors_names(single)}
    others = sorted(p.name for p in folder.glob("*.safetensors"))
    if len(others) == 1:
        check_links(folder, (others[0],))
        f = folder / others[0]
        return {name: f for name in safetensors_names(f)}
    if any((folder / n).exists() for n in ("pytorch_model.bin", "model.pt", "model.ckpt")):
        raise ModelLoadError(folder, f"only pickle weights found (e.g. pytorch_model.bin); this app loads "
                                     f"{WEIGHTS} only and never unpickles. Convert the checkpoint to safetensors.")
    raise ModelLoadError(folder, f"no weights: expected {WEIGHTS} or {INDEX}")


def shard_path(folder: Path, index: Path, fname: str) -> Path:
    """The shard `fname` names, refused unless it lies inside the model folder (outside_folder).

    An index is data from wherever the model came from: an absolute path, '..' or a link leading out
    would read any file on the machine."""
    rel = Path(fname)
    if not fname or rel.is_absolute() or rel.drive or ".." in rel.parts:
        raise ModelLoadError(index, f"shard path {fname!r} leaves the model folder; refused")
    f = folder / rel
    real = outside_folder(folder, f)
    if real is not None:
        raise ModelLoadError(index, f"shard path {fname!r} resolves to {real}, outside the model folder; refused")
    return f


def outside_folder(folder: Path, f: Path) -> Path | None:
    """Where `f` really is when that is outside the model folder (None when it is inside): the one rule
    for every file the loader reads, named directly or through a shard index. A Hugging Face cache
    snapshot (models--ORG--NAME/snapshots/<commit>/) may hold its files as links into the same
    repository's blobs/ folder, and nowhere else."""
    real, root = f.resolve(), folder.resolve()
    allowed = [root]
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--") and is_snapshot(root, root.parent):
        allowed.append(root.parent.parent / "blobs")
    return None if any(real.is_relative_to(a) for a in allowed) else real


# every file of a model folder the loader (and load_tokenizer_folder) may read by its name
READ = (CONFIG, INDEX, WEIGHTS, TOKENIZER, WORDPIECE_VOCAB, BPE_VOCAB, BPE_MERGES, TOKENIZER_CONFIG,
         SPECIAL_TOKENS_MAP, *SENTENCEPIECE_FILES)


def check_links(folder: Path, names: tuple[str, ...] | None = None) -> None:
    """Refuse a file of the folder (config, weights, tokenizer; or only `names`) that is a link leading
    outside it, naming the file: the rule shard indexes follow (outside_folder), for the files named directly
    (shards are checked as their index names them)."""
    for f in (folder / n for n in (names or READ)):
        if os.path.islink(f) and (real := outside_folder(folder, f)) is not None:
            raise ModelLoadError(f, f"a link to {real}, outside the model folder; refused (a model folder's "
                                    f"files must lie inside it, or in its cache repository's blobs/)")


def safetensors_names(f: Path) -> list[str]:
    problem = file_problem(f)  # safetensors says "No such device" of a folder, "No such file" of an unreadable file
    if problem is not None:
        raise ModelLoadError(f, problem)
    try:
        with safe_open(str(f), framework="pt") as st:
            return list(st.keys())
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelLoadError(f, f"corrupt or truncated safetensors file ({exc})") from exc
