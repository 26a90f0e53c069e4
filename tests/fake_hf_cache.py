"""A Hugging Face cache folder as huggingface_hub writes it, for the cache tests (core, CLI, UI).

models--ORG--NAME/blobs/<hash>, snapshots/<rev>/<file> -> ../../blobs/<hash>, refs/main = <rev>."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from tiny_models import save_tiny_model

TEXT = "hello cache"


def add_snapshot(cache: Path, repo_id: str, files: dict[str, bytes], revision: str, main: bool = True) -> Path:
    """Write `files` as one snapshot of `repo_id`; returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / name)  # relative links, as huggingface_hub makes them
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snap


def tiny_model_files(tmp: Path, model_type: str | None = None, seed: int = 0) -> dict[str, bytes]:
    """The files of a tiny GPT-2 saved by the app (with a char tokenizer), its weights drawn with `seed`;
    `model_type` overrides config.json's, to make an unsupported one."""
    folder = tmp / ("saved-model" if seed == 0 else f"saved-model-{seed}")
    if not folder.exists():
        save_tiny_model(folder, TEXT, seed=seed, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=32)
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    if model_type is not None:
        import json
        d = json.loads(files["config.json"])
        d["model_type"] = model_type
        d.pop("transformer_explorer", None)
        files["config.json"] = json.dumps(d).encode()
    return files


def make_fake_cache(tmp: Path) -> Path:
    """A cache with tiny-org/tiny-gpt2 (openable, two revisions, main the newer) and
    other-org/mamba-tiny (an unsupported model_type)."""
    cache = tmp / "hf-cache"
    files = tiny_model_files(tmp)
    add_snapshot(cache, "tiny-org/tiny-gpt2", files, "a" * 40, main=False)
    add_snapshot(cache, "tiny-org/tiny-gpt2", files, "b" * 40)
    add_snapshot(cache, "other-org/mamba-tiny", tiny_model_files(tmp, model_type="mamba"), "c" * 40)
    return cache


STEP_REPO = "tiny-org/tiny-pythia"
STEPS = (0, 512, 1000)


def step_revision(step: int) -> str:
    """The (made-up) commit id of the revision step{step}."""
    return hashlib.sha1(f"step{step}".encode()).hexdigest()


def add_step_revisions(cache: Path, tmp: Path, repo_id: str = STEP_REPO, steps=STEPS, main_step: int | None = None,
                       missing=()) -> Path:
    """`repo_id` with one revision per training step, as Pythia's branches downloaded by name leave them:
    refs/step{N} holding that revision's commit id, snapshots/<commit>/ with a model whose weights differ at
    each step (seed N + 1); refs/main at `main_step`'s revision (default the last step; -1: a revision of its
    own that is no step). The steps of `missing` keep their ref but lose their snapshot. Returns the repo folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    main_step = steps[-1] if main_step is None else main_step
    for step in steps:
        add_snapshot(cache, repo_id, tiny_model_files(tmp, seed=step + 1), step_revision(step), main=step == main_step)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / f"step{step}").write_text(step_revision(step))
    if main_step == -1:
        add_snapshot(cache, repo_id, tiny_model_files(tmp, seed=99), "f" * 40)
    for step in missing:
        shutil.rmtree(repo / "snapshots" / step_revision(step))
    return repo


def point_at(monkeypatch, cache: Path, home: Path) -> None:
    """HF_HUB_CACHE at `cache`; HF_HOME, XDG_CACHE_HOME and HOME away from the real user's cache."""
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(home / "hf-home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "xdg-cache"))
    monkeypatch.setenv("HOME", str(home))
