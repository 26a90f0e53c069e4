"""Device and dtype choice: CUDA when present, MPS on Apple silicon, CPU always."""
from __future__ import annotations

import re
from dataclasses import dataclass

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


_DEVICE = re.compile(r"(cpu(:0)?|cuda(:[0-9]+)?|mps)")  # ASCII digits (\d takes '٣'); cpu:0 is torch's name too


def device_problem(name: str) -> str:
    """'' when `name` (cpu, cuda, cuda:N or mps) is a device this machine has, else why not in a few words, the
    devices it has named: the --device option's refusal, and load_model_file's of a script's device="gpu9"
    (which was torch's own "Invalid device string", or an AssertionError for a CUDA device without CUDA)."""
    present = available_devices()
    if not isinstance(name, str) or not _DEVICE.fullmatch(name):
        return f"must be cpu, cuda, cuda:N or mps, got {name!r} (this machine has: {', '.join(present)})"
    if name == "cuda" and any(d.startswith("cuda") for d in present):
        return ""
    if (name == "cuda:0" and "cuda" in present) or name == "cpu:0":
        return ""
    if name not in present:
        return f"{name} is not available on this machine (it has: {', '.join(present)})"
    return ""


def check_device(device: str | torch.device) -> None:
    """ValueError "device: PROBLEM" (device_problem) for a device named by a string this machine lacks; a
    torch.device is the caller's own and passes."""
    if isinstance(device, str) and (problem := device_problem(device)):
        raise ValueError(f"device: {problem}")


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


# -- memory: refuse a run that cannot fit, before allocating it ---------------------------------


class MemoryEstimateError(ValueError):
    """A run whose estimated memory is beyond what the machine (or the GPU) has available."""


def cuda_index(device: torch.device | str | int = "cuda") -> int:
    """The index of a CUDA device ("cuda" and cuda without an index: the current one); torch's memory
    fraction functions refuse a device without an index."""
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def cuda_memory_cap(device: torch.device | str = "cuda") -> int | None:
    """Bytes this process may hold on a CUDA device under torch.cuda.set_per_process_memory_fraction
    (fraction x the card's total memory); None when no cap is set (fraction 1) or it cannot be read."""
    getter = (getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.6
              or getattr(torch.cuda.memory, "get_per_process_memory_fraction", None))
    if getter is None:
        return None
    try:
        device = cuda_index(device)
        fraction = float(getter(device))
        if fraction >= 1.0:
            return None
        return int(fraction * torch.cuda.get_device_properties(device).total_memory)
    except (RuntimeError, AssertionError, ValueError):
        return None


# a container's memory limit and use (cgroup v2, then v1): the kernel kills a process that passes the limit,
# however much MemAvailable the machine reports
PROC_CGROUP, CGROUP_MOUNT = "/proc/self/cgroup", "/sys/fs/cgroup"
CGROUP_MEMORY = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def cgroup_memory_files() -> list[tuple[str, str]]:
    """(limit file, usage file) of this process's own memory cgroup and each of its ancestors (from
    /proc/self/cgroup: a process put in a cgroup of its own, e.g. `systemd-run --scope -p MemoryMax=8G`,
    sits below the mount's root), then the mount's root (CGROUP_MEMORY: a container's own)."""
    own: list[tuple[str, str]] = []
    try:
        with open(PROC_CGROUP, encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "-", "")
        if controllers == "":
            root, limit, used = CGROUP_MOUNT, "memory.max", "memory.current"  # v2
        elif "memory" in controllers.split(","):
            root, limit, used = CGROUP_MOUNT + "/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"  # v1
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), 0, -1):
            folder = "/".join([root, *parts[:depth]])
            own.append((f"{folder}/{limit}", f"{folder}/{used}"))
    return own + list(CGROUP_MEMORY)


def cgroup_memory_left() -> int | None:
    """Bytes this process's memory cgroups still allow: the least over its own and its ancestors' (each
    one's limit less its use); None without a limit."""
    left = None
    for limit_file, used_file in cgroup_memory_files():
        try:
            with open(limit_file, encoding="ascii") as f:
                limit = f.read().strip()
            with open(used_file, encoding="ascii") as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 2**60:  # v1's "no limit" is a huge number
            continue
        left = max(int(limit) - used, 0) if left is None else min(left, max(int(limit) - used, 0))
    return left


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes a new allocation may use: on CUDA the card's free memory, and no more than this process's
    cap (set_per_process_memory_fraction, which mem_get_info does not know) less what it has allocated;
    else the system's MemAvailable (/proc/meminfo), no more than the container's memory limit allows
    (cgroup_memory_left), else its physical memory; None when unknown."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        try:
            free = int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
        cap = cuda_memory_cap(device)
        if cap is not None:
            free = min(free, max(cap - int(torch.cuda.memory_allocated(device)), 0))
        return free
    cgroup = cgroup_memory_left()
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    return free if cgroup is None else min(free, cgroup)
    except (OSError, ValueError, IndexError):
        pass
    if cgroup is not None:
        return cgroup
    import os
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1000
    return ""


def check_memory(needed: float, what: str, purpose: str = "", device: torch.device | str = "cpu") -> None:
    """Refuse (MemoryEstimateError, one line) when `needed` bytes are more than `device` has available:
    '{what} needs about 77 GB {purpose}; this machine has 24 GB available'."""
    have = available_memory(device)
    if have is not None and needed > have:
        where = "this GPU has" if torch.device(device).type == "cuda" else "this machine has"
        raise MemoryEstimateError(f"{what} needs about {human_bytes(needed)}{' ' + purpose if purpose else ''}; "
                                  f"{where} {human_bytes(have)} available")


# -- the compute dtype that suits the machine --------------------------------------------------

HALF = (torch.bfloat16, torch.float16)
DTYPE_CHOICES = ("auto", *DTYPES)  # what --dtype and the Device menu offer


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}.get(dtype, str(dtype).replace("torch.", ""))


def half_matrix_units(dtype: torch.dtype) -> str:
    """The name of this CPU's instructions that multiply `dtype` (bfloat16 or float16) matrices at
    float32's speed or better, "" when it has none (the products are then emulated, several times
    slower): bfloat16 with Intel AMX tiles ("AMX") or AVX-512 BF16 dot products ("AVX-512 BF16");
    float16 with AMX-FP16 only (torch offers no probe of AVX-512 FP16).

    AVX-512 BF16 without AMX, measured on a 2-core AMD EPYC (Qwen2.5-0.5B shape, the GUI's trace of
    1,024 tokens and greedy one-token steps, bfloat16 and float32 interleaved in one process, load 2.5-3.5,
    26 Nov 2026): the trace 2.1x faster in bfloat16 on one thread (6.8 against 14.2 s) and 2.5x on two
    (3.5 against 8.5 s), a step 0.94x on one thread (138 against 129 ms) and 1.6x on two (78 against
    124 ms), with half the weights' memory (bench scale: 0.73x transformers' peak against 1.18x)."""
    probes = {torch.bfloat16: (("AMX", "_is_amx_tile_supported"), ("AVX-512 BF16", "_is_avx512_bf16_supported")),
              torch.float16: (("AMX-FP16", "_is_amx_fp16_supported"),)}.get(dtype, ())
    for name, probe in probes:
        try:
            if bool(getattr(torch.cpu, probe)()):
                return name
        except (AttributeError, RuntimeError):  # an older torch without the probe: not known to have them
            continue
    return ""


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str  # one line: why this dtype (the status bar's tooltip, `info`)


def choose_compute_dtype(stored: torch.dtype, device: torch.device | str, weight_count: int,
                         requested: str | torch.dtype | None = "auto", available: int | None = None) -> DtypeChoice:
    """The dtype to compute in for weights stored in `stored` (`weight_count` values) on `device`.

    An explicit `requested` dtype is taken as is. "auto": float32 checkpoints stay float32; a
    half-precision checkpoint computes in its own dtype on CUDA (and MPS), where it runs at full rate,
    and on a CPU whose instructions multiply it at float32's speed (half_matrix_units: bfloat16 with
    AVX-512 BF16 or AMX, float16 with AMX-FP16); on another CPU in float32 when its float32 copy
    (4 bytes a weight, with a quarter more for the work) fits in the available memory, else in its own
    dtype, and the reason says why."""
    if requested not in (None, "auto"):
        dtype = resolve_dtype(requested)
        return DtypeChoice(dtype, f"{dtype_name(dtype)}: asked for")
    name = dtype_name(stored)
    if stored not in HALF:
        return DtypeChoice(stored, f"{name}: the checkpoint's dtype")
    device = torch.device(device)
    if device.type != "cpu":
        return DtypeChoice(stored, f"{name}: the checkpoint's dtype, native on {device.type.upper()}")
    units = half_matrix_units(stored)
    if units:
        return DtypeChoice(stored, f"{name}: the checkpoint's dtype (this CPU multiplies {name} with {units}, "
                                   f"about as fast as float32 or faster, at half the memory)")
    need = weight_count * 4 * 5 // 4
    have = available_memory("cpu") if available is None else available
    if have is not None and need > have:
        return DtypeChoice(stored, f"{name}, not float32: a float32 copy needs about {human_bytes(need)} and this "
                                   f"machine has {human_bytes(have)} available (this CPU has no {name} matrix "
                                   f"instructions, so {name} is several times slower)")
    return DtypeChoice(torch.float32, f"float32: this CPU has no {name} matrix instructions ({name} products are "
                                      f"emulated, several times slower), and float32 fits in memory")


def pattern_dtype(compute: torch.dtype, stored: torch.dtype | None) -> torch.dtype | None:
    """The dtype a trace keeps attention patterns in: float16 when a half-precision checkpoint computes
    in float32 (probabilities in [0, 1] keep 10 bits there, more than bfloat16's 7; half the bytes);
    None (the model's own dtype) otherwise, so a float32 checkpoint's patterns stay exact."""
    return torch.float16 if stored in HALF and compute not in HALF else None


def to_host(tensors: list[torch.Tensor], dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """CPU copies of `tensors` (each cast to `dtype` when given), in one device-to-host transfer.

    On a GPU the tensors are packed into one device buffer and copied at once into pinned memory: a
    copy per tensor waits on the device once each (a generation step records about five tensors a
    layer; each wait was ~0.3 ms on an H100, more than the step's own work). The results are views of
    that one buffer. CPU tensors come back as they are (cast when asked), sharing their storage."""
    out: list[torch.Tensor | None] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        target = dtype or t.dtype
        if t.device.type == "cpu":
            out[i] = t if t.dtype == target else t.to(target)
        else:
            groups.setdefault((t.device, target), []).append(i)
    for (device, target), members in groups.items():
        flat = torch.cat([tensors[i].reshape(-1).to(target) for i in members])
        host = torch.empty(flat.shape, dtype=target, pin_memory=device.type == "cuda")
        host.copy_(flat)  # one wait on the device for the whole group
        for i, part in zip(members, host.split([tensors[i].numel() for i in members])):
            out[i] = part.view(tensors[i].shape)
    return out  # type: ignore[return-value]
