"""Device and dtype choice: CUDA when present, MPS on Apple silicon, CPU always."""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def available_devices() -> list[str]:
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" if torch.cuda.device_count() > 1 else "cuda" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append("mps")
    return devices


def default_device() -> str:
    devices = available_devices()
    return next((d for d in devices if d != "cpu"), "cpu")


def resolve_device(name: str | None) -> torch.device:
    if name in (None, "", "auto"):
        return torch.device(default_device())
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available on this machine")
    if name == "mps" and "mps" not in available_devices():
        raise ValueError("device 'mps' requested but MPS is not available on this machine")
    return torch.device(name)


def resolve_dtype(name: str | torch.dtype | None) -> torch.dtype:
    if name is None:
        return torch.float32
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (known: {', '.join(DTYPES)})") from None


def memory_summary(device: torch.device | str) -> str:
    """A short status-bar text of memory in use on the device."""
    device = torch.device(device)
    if device.type == "cuda":
        used = torch.cuda.memory_allocated(device) / 2**20
        total = torch.cuda.get_device_properties(device).total_memory / 2**20
        return f"{used:.0f} / {total:.0f} MiB"
    try:
        import resource
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        return f"peak RSS {rss:.0f} MiB"
    except Exception:  # resource is POSIX only
        return ""
