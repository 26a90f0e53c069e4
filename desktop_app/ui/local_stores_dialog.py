"""File > Open from Local Model Stores…: the GGUF models Ollama and LM Studio hold on this machine
(core/formats/local_stores), with size, quantization and whether they open; never the network."""
from __future__ import annotations

from ..core.formats.local_stores import StoredModel, list_local_models, lmstudio_roots, ollama_roots
from ..core.hf_cache import format_size
from .hf_cache_dialog import ModelListDialog


def _roots() -> str:
    return ", ".join(str(r) for r in (*ollama_roots(), *lmstudio_roots()))


class LocalStoresDialog(ModelListDialog):
    title = "Open from Local Model Stores"
    columns = ("Store", "Model", "Architecture", "Quantization", "Size", "Supported")

    def looking(self) -> str:
        return f"Looking in {_roots()} …"

    def list_models(self) -> list[StoredModel]:
        return list_local_models()

    def cells(self, m: StoredModel) -> tuple[str, ...]:
        return (m.store, m.name, m.architecture or "?", m.quantization or "?", format_size(m.size) if m.size else "",
                "yes" if m.supported else f"no — {m.reason}")

    def summary(self, models: list[StoredModel]) -> str:
        if not models:
            return f"No Ollama or LM Studio models on this machine (looked in: {_roots()})."
        return (f"{len(models)} model(s), {sum(m.supported for m in models)} the app can open, in {_roots()}. "
                f"Nothing is downloaded.")

    def path_of(self, m: StoredModel) -> str:
        return str(m.path)

    def name_of(self, m: StoredModel) -> str:
        return f"{m.store} {m.name}"
