"""Ollama's and LM Studio's models listed from fake stores the test builds: name, size, quantization,
whether they open; a manifest or link leading outside the store is refused; a listed model opens."""
from __future__ import annotations

import pytest

pytest.importorskip("gguf")

from fake_stores import make_lmstudio, make_ollama  # noqa: E402

from desktop_app.core.formats import load_model_file  # noqa: E402
from desktop_app.core.formats.local_stores import list_local_models  # noqa: E402


@pytest.fixture
def stores(tmp_path):
    outside = tmp_path / "outside"
    return (make_ollama(tmp_path / "ollama" / "models", outside), make_lmstudio(tmp_path / "lmstudio", outside))


def test_stores_list_and_the_supported_ones_open(stores):
    ollama, lmstudio = stores
    found = {(m.store, m.name): m for m in list_local_models(ollama=[ollama], lmstudio=[lmstudio])}
    assert set(found) == {("Ollama", "llama-tiny:q8"), ("Ollama", "evil:dots"), ("Ollama", "evil:link"),
                          ("Ollama", "gone:x"), ("LM Studio", "lmstudio-community/Tiny-GGUF/tiny-Q8_0.gguf"),
                          ("LM Studio", "lmstudio-community/Tiny-GGUF/mmproj-tiny-f16.gguf"),
                          ("LM Studio", "me/linked/away.gguf")}
    tiny = found["Ollama", "llama-tiny:q8"]
    assert tiny.supported and tiny.architecture == "llama" and tiny.quantization == "Q8_0"
    assert tiny.size == tiny.path.stat().st_size and tiny.path.parent == ollama / "blobs"
    loaded = load_model_file(tiny.path)  # a blob has no .gguf suffix: known by its magic
    assert loaded.name == "llama tiny" and loaded.gguf.file_type == "MOSTLY_Q8_0"
    lm = found["LM Studio", "lmstudio-community/Tiny-GGUF/tiny-Q8_0.gguf"]
    assert lm.supported and load_model_file(lm.path).config.family == "llama"

    assert not found["Ollama", "evil:dots"].supported and found["Ollama", "evil:dots"].path is None
    assert "not a sha256 digest: refused" in found["Ollama", "evil:dots"].reason
    for key in (("Ollama", "evil:link"), ("LM Studio", "me/linked/away.gguf")):
        assert not found[key].supported and found[key].path is None
        assert "leads outside the store" in found[key].reason
    assert "is missing" in found["Ollama", "gone:x"].reason
    clip = found["LM Studio", "lmstudio-community/Tiny-GGUF/mmproj-tiny-f16.gguf"]
    assert not clip.supported and "GGUF architecture 'clip' is not supported" in clip.reason


def test_no_stores_list_nothing(tmp_path):
    assert list_local_models(ollama=[tmp_path / "none"], lmstudio=[tmp_path / "none2"]) == []
