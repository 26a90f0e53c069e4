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


def test_a_folder_of_gguf_files_without_config_opens_its_only_one(tmp_path):
    """A GGUF repository's snapshot (the Hugging Face cache's, as `org/name-GGUF`): one file opens, several
    are listed to choose from, a link outside the folder is refused."""
    from fake_stores import tiny_gguf

    from desktop_app.core.checkpoints import ModelLoadError

    one = tmp_path / "one"
    tiny_gguf(one / "tiny-Q8_0.gguf")
    assert load_model_file(one).path == one / "tiny-Q8_0.gguf"
    tiny_gguf(one / "tiny-F16.gguf", kind="f16")
    with pytest.raises(ModelLoadError, match=r"holds 2 GGUF files \(tiny-F16.gguf, tiny-Q8_0.gguf\): open one of them"):
        load_model_file(one)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "away.gguf").symlink_to(one / "tiny-F16.gguf")
    with pytest.raises(ModelLoadError, match="outside the model folder; refused"):
        load_model_file(linked)
