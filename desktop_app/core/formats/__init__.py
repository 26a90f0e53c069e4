"""Model files other tools write: GGUF (llama.cpp, Ollama, LM Studio), read with the format's own `gguf`
package and turned into the app's families through the same loading path as a model folder
(core/checkpoints.assemble_model); gguf_export.py writes them back."""
from __future__ import annotations

from pathlib import Path

GGUF_MAGIC = b"GGUF"
GGUF_SUFFIX = ".gguf"


def is_gguf(path: str | Path) -> bool:
    """Whether `path` names a GGUF file: a .gguf name (even one that does not exist, so that opening it
    says so), or a file starting with the GGUF magic (an Ollama blob has no suffix)."""
    path = Path(path)
    if path.suffix.lower() == GGUF_SUFFIX and not path.is_dir():
        return True
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def gguf_of_folder(folder: Path) -> Path | None:
    """The GGUF file to open for a folder without config.json that holds GGUF files (a GGUF repository's
    snapshot in the Hugging Face cache): its only one; a ModelLoadError listing them when there are
    several; None for any other folder. Its link must stay inside the folder or its cache blobs/."""
    from ..weights import CONFIG, ModelLoadError, check_links

    if not folder.is_dir() or (folder / CONFIG).exists():
        return None
    found = sorted(p for p in folder.iterdir() if p.suffix.lower() == GGUF_SUFFIX and not p.is_dir())
    if len(found) > 1:
        shown = ", ".join(p.name for p in found[:6]) + (", ..." if len(found) > 6 else "")
        raise ModelLoadError(folder, f"holds {len(found)} GGUF files ({shown}): open one of them")
    if found:
        check_links(folder, (found[0].name,))
    return found[0] if found else None


def load_model_file(path: str | Path, **kwargs):
    """What a user opened, as a LoadedModel: a GGUF file (gguf_file.load_gguf), a folder holding one
    GGUF file, or a model folder (checkpoints.load_model_folder); keyword arguments as those take them
    (device, dtype, for_training). A device of several ("cuda:0,cuda:1"): read on the CPU, then its
    layers placed across them (streamed.place_blocks), in proportion to each one's free memory."""
    from ..streamed import device_list, place_blocks

    from ..devices import check_device

    devices = device_list(kwargs.get("device", "cpu"))
    for name in devices if isinstance(kwargs.get("device", "cpu"), str) else ():
        check_device(name)  # device="gpu9": one line naming it and this machine's devices, not torch's error
    if len(devices) > 1:
        if kwargs.get("for_training"):
            raise ValueError("training runs on one device (layers across several are for inspection)")
        kwargs["device"] = "cpu"
    path = gguf_of_folder(Path(path)) or path
    if is_gguf(path):
        from .gguf_file import load_gguf

        loaded = load_gguf(path, **kwargs)
    else:
        from ..checkpoints import load_model_folder

        loaded = load_model_folder(path, **kwargs)
    if len(devices) > 1:
        from ..devices import available_memory

        place_blocks(loaded.model, devices, [available_memory(d) for d in devices])
    return loaded
