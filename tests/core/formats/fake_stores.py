"""A fake Ollama store and LM Studio models folder, built from tiny GGUF files (and the ways such a
store can try to lead outside itself)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf

from desktop_app.core.checkpoints import new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.formats.gguf_export import save_gguf


def tiny_gguf(path: Path, kind: str = "q8_0", name: str = "tiny") -> Path:
    cfg = ModelConfig.llama(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, context_length=32)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_gguf(new_model(cfg, seed=0), path, kind=kind, name=name)
    return path


def clip_gguf(path: Path) -> Path:
    """A vision projector (mmproj) file, as LM Studio keeps beside vision models: not a language model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(path, "clip")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def manifest(root: Path, name: str, tag: str, digest: str) -> None:
    folder = root / "manifests" / "registry.ollama.ai" / "library" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / tag).write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": 1},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 1}]}))


def make_ollama(root: Path, outside: Path) -> Path:
    """llama-tiny:q8 (opens), evil:dots (a digest with ../), evil:link (a blob linking outside), gone:x."""
    blob = tiny_gguf(root / "tmp.gguf", name="llama tiny")
    digest = hashlib.sha256(blob.read_bytes()).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    blob.rename(root / "blobs" / f"sha256-{digest}")
    manifest(root, "llama-tiny", "q8", f"sha256:{digest}")
    manifest(root, "evil", "dots", "sha256:../../../../outside/secret.gguf")
    secret = tiny_gguf(outside / "secret.gguf")
    link_digest = "f" * 64
    (root / "blobs" / f"sha256-{link_digest}").symlink_to(secret)
    manifest(root, "evil", "link", f"sha256:{link_digest}")
    manifest(root, "gone", "x", "sha256:" + "e" * 64)
    return root


def make_lmstudio(root: Path, outside: Path) -> Path:
    tiny_gguf(root / "lmstudio-community" / "Tiny-GGUF" / "tiny-Q8_0.gguf")
    clip_gguf(root / "lmstudio-community" / "Tiny-GGUF" / "mmproj-tiny-f16.gguf")
    (root / "me" / "linked").mkdir(parents=True)
    (root / "me" / "linked" / "away.gguf").symlink_to(tiny_gguf(outside / "away.gguf"))
    return root
