"""The GGUF models Ollama and LM Studio keep on this machine, listed without the network.

Ollama: manifests under MODELS/manifests/<host>/<namespace>/<name>/<tag> (JSON) name their layers by
digest; the model layer (mediaType application/vnd.ollama.image.model) is the blob MODELS/blobs/sha256-<hex>,
a GGUF file. LM Studio: MODELS/<publisher>/<repository>/<file>.gguf. As for the Hugging Face cache, nothing
may lead outside its store: a digest that is not sha256:<64 hex>, or a file or link resolving outside the
store's folder, is listed as refused with the reason, and never opened.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..weights import ModelLoadError
from . import GGUF_SUFFIX

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few hundred bytes


@dataclass(frozen=True)
class StoredModel:
    store: str  # "Ollama" or "LM Studio"
    name: str  # "llama3.2:3b" (Ollama), "publisher/repository/file.gguf" (LM Studio)
    path: Path | None  # the GGUF file to open (None when refused before one was found)
    size: int  # bytes
    architecture: str  # general.architecture ("" when unread)
    quantization: str  # general.file_type as llama.cpp names it ("" when unknown)
    supported: bool
    reason: str  # why it cannot be opened; "" when supported


def ollama_roots() -> list[Path]:
    """$OLLAMA_MODELS, else ~/.ollama/models (and the Linux service's /usr/share/ollama/.ollama/models)."""
    if os.environ.get("OLLAMA_MODELS"):
        return [Path(os.path.expanduser(os.environ["OLLAMA_MODELS"]))]
    return [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def lmstudio_roots() -> list[Path]:
    """LM Studio's models folder: ~/.lmstudio/models, or the older ~/.cache/lm-studio/models."""
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def _inside(path: Path, root: Path) -> bool:
    """Whether `path`, links followed, lies inside `root` (links followed too)."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        return False


def _describe(store: str, name: str, path: Path, root: Path) -> StoredModel:
    """A GGUF file of a store: opened (header and metadata only, memory-mapped) to say whether it loads."""
    from .gguf_file import GGUFFile

    if not _inside(path, root):
        return StoredModel(store, name, None, 0, "", "", False, f"{path} leads outside the store ({root}): refused")
    try:
        size = path.stat().st_size
    except OSError as exc:
        return StoredModel(store, name, None, 0, "", "", False, f"{path}: {exc.strerror or exc}")
    try:
        f = GGUFFile(path)
        f.config()  # the metadata read as the app's family, as opening it would
    except ModelLoadError as exc:
        return StoredModel(store, name, path, size, "", "", False, exc.problem)
    return StoredModel(store, name, path, size, f.arch_name, f.summary.file_type.removeprefix("MOSTLY_"), True, "")


def _ollama_name(manifest: Path, manifests: Path) -> str:
    """host/namespace/name/tag -> 'name:tag' for Ollama's own library, else 'host/namespace/name:tag'."""
    parts = manifest.relative_to(manifests).parts
    host, namespace, model, tag = (("",) * 4 + parts)[-4:]
    if host == "registry.ollama.ai" and namespace == "library":
        return f"{model}:{tag}"
    return f"{'/'.join(p for p in (host, namespace, model) if p)}:{tag}"


def list_ollama(root: Path) -> list[StoredModel]:
    manifests, blobs = root / "manifests", root / "blobs"
    if not manifests.is_dir():
        return []
    out = []
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        name = _ollama_name(manifest, manifests)
        try:
            if not _inside(manifest, manifests):
                raise ValueError(f"the manifest {manifest} leads outside the store: refused")
            if manifest.stat().st_size > MAX_MANIFEST_BYTES:
                raise ValueError(f"the manifest {manifest} is too large to be one")
            layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers")
            digest = next(layer.get("digest") for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
        except (OSError, ValueError, AttributeError, TypeError, StopIteration) as exc:
            reason = str(exc) if isinstance(exc, ValueError) and str(exc).startswith("the manifest") else \
                f"the manifest {manifest} names no model layer (unreadable or not Ollama's)"
            out.append(StoredModel("Ollama", name, None, 0, "", "", False, reason))
            continue
        m = _DIGEST.match(digest) if isinstance(digest, str) else None
        if m is None:
            out.append(StoredModel("Ollama", name, None, 0, "", "", False,
                                   f"the manifest names {digest!r}, not a sha256 digest: refused"))
            continue
        blob = blobs / f"sha256-{m.group(1)}"
        if not blob.exists():
            out.append(StoredModel("Ollama", name, None, 0, "", "", False, f"its model blob {blob} is missing"))
            continue
        out.append(_describe("Ollama", name, blob, blobs))
    return out


def list_lmstudio(root: Path) -> list[StoredModel]:
    if not root.is_dir():
        return []
    return [_describe("LM Studio", path.relative_to(root).as_posix(), path, root)
            for path in sorted(root.rglob(f"*{GGUF_SUFFIX}")) if len(path.relative_to(root).parts) <= 4]


def list_local_models(ollama: list[Path] | None = None, lmstudio: list[Path] | None = None) -> list[StoredModel]:
    """Every GGUF model the stores hold, Ollama's first; each says whether the app opens it and why not."""
    found = []
    for root in ollama_roots() if ollama is None else ollama:
        found += list_ollama(root)
    for root in lmstudio_roots() if lmstudio is None else lmstudio:
        found += list_lmstudio(root)
    return found
