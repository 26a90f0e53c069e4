"""Where each layer's weights are while it computes: read from the files only then (a model larger than
memory), and on which device (layers placed across several GPUs).

Both ride on forward hooks of the model's Blocks, the one place every pass through a layer goes
(Transformer.forward's loop, which the trace, the first look and generation walk): nothing in model.py
knows about them.

- StreamedWeights: the blocks' parameters stay on the meta device (shapes only) until a block is
  called; its pre-hook reads that block's tensors from the files (through the family's weight table,
  `load_block`; a pass stopped within the block, stop_at, only those it uses there), copies them
  into the compute dtype on the block's device, and its post-hook puts them back on meta. The
  resident set is then the embeddings and head, one block (plus any held), and what is recorded.
  Code that reads a block's weights outside its forward (the Lipschitz lab, a lazy trace's head
  outputs) holds it: `with holding(model, layer, only={"attn.o"}): ...`, reading only the
  parts it names (the whole block without `only`; the block's forward reads what is still on meta). A
  pass whose backward comes later (the attribution graph's) runs under `weights_saved_by_name`:
  autograd keeps a block's weights as (layer, name), read again when the backward reaches them, not the
  tensors themselves (which would keep every block's saved weights in memory until the backward is done).
  Passes that go over the layers again and again reading parts (the graph's replay, its backward
  batches) run under `keeping`: those parts of the first blocks, within one block's bytes, are read once.
- place_blocks: consecutive blocks on each of several devices (plan_devices), each block's inputs
  moved to its device before it runs and its output back to the model's own device (where the
  embeddings, the head and the records' hand-off are), so everything around the loop is unchanged.
"""
from __future__ import annotations

import functools
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

# (the block's state dict, names relative to the block) for block l, in the compute dtype on `device`;
# given names, those (and what is stored with them), not the whole block
BlockLoader = Callable[[int, torch.device, "set[str] | None"], dict[str, torch.Tensor]]


def block_device(model, layer: int) -> torch.device:
    """The device block `layer` computes on: its placement (place_blocks), else the model's."""
    devices = getattr(model, "block_devices", None)
    return devices[layer] if devices else model.device


class StreamedWeights:
    """A model's blocks brought in from the files only while each computes (see the module's docstring)."""

    def __init__(self, model: nn.Module, load_block: BlockLoader) -> None:
        self.model, self.load_block = model, load_block
        self.held: Counter = Counter()  # layer -> how many `holding` keep it in
        self.resident: set[int] = set()  # layers with any of their parameters in memory (the others on meta)
        self.loads = 0  # blocks (or the part of one a computation uses) read from the files so far
        self.bytes_read = 0  # the bytes of those reads' tensors (in the compute dtype)
        self.storages: dict[int, tuple[int, str]] = {}  # a resident parameter's storage address -> (layer, name)
        self.on_drop: Callable[[int, dict[str, torch.Tensor]], None] | None = None  # (layer, its tensors in memory)
        self.keep: dict[int, set[str]] = {}  # layer -> its parameters that stay in memory when it is let go (`keeping`)
        self.keep_budget: int | None = None  # the bytes `keeping` may keep; None: one block's
        for l, block in enumerate(model.blocks):
            block.register_forward_pre_hook(
                lambda module, args, kwargs, l=l: self.bring(l, parts_before_stop(module, args, kwargs)),
                with_kwargs=True)
            block.register_forward_hook(lambda module, args, out, l=l: self.drop(l), always_call=True)
            self.drop(l, force=True)
        model.streamed = self

    def bring(self, layer: int, names: set[str] | None = None) -> None:
        """Block `layer`'s parameters `names` (all by default) in memory: those still on meta are read."""
        block = self.model.blocks[layer]
        on_meta = {name for name, p in block.named_parameters() if p.device.type == "meta"}
        wanted = on_meta if names is None else on_meta & names
        if not wanted:
            return
        whole = names is None and layer not in self.resident  # the block's own read (all of it on meta)
        sd = self.load_block(layer, block_device(self.model, layer), None if whole else wanted)
        self.loads += 1
        self.bytes_read += sum(t.numel() * t.element_size() for t in sd.values())
        # what is stored with them comes too and is kept; one already in stays as it is (autograd may have saved it)
        sd = {name: t for name, t in sd.items() if name in on_meta}
        block.load_state_dict(sd, strict=whole, assign=True)
        self.resident.add(layer)
        self.storages.update({p.untyped_storage().data_ptr(): (layer, name) for name, p in block.named_parameters()
                              if name in sd})

    def drop(self, layer: int, force: bool = False) -> None:
        """Block `layer`'s parameters back to shapes only (unless a `holding` keeps it), but for those
        `keeping` keeps (all of them, forced)."""
        if not force and (layer not in self.resident or self.held[layer]):
            return
        block = self.model.blocks[layer]
        if self.on_drop is not None:
            self.on_drop(layer, {name: p for name, p in block.named_parameters() if p.device.type != "meta"})
        kept = set() if force else self.keep.get(layer, set())
        going = {name: p for name, p in block.named_parameters() if name not in kept}
        for p in going.values():
            if p.device.type != "meta":
                self.storages.pop(p.untyped_storage().data_ptr(), None)
        block.load_state_dict({name: torch.empty(p.shape, dtype=p.dtype, device="meta") for name, p in going.items()},
                              strict=not kept, assign=True)
        if all(p.device.type == "meta" for p in block.parameters()):
            self.resident.discard(layer)

    def resident_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for l in self.resident for p in self.model.blocks[l].parameters()
                   if p.device.type != "meta")

    @contextmanager
    def weights_saved_by_name(self) -> Iterator[None]:
        """Autograd, within, saves a block's parameter (or a view of it: linear's transposed weight) as
        (layer, name, the view's place in it), not the tensor: the backward's unpacking reads the
        tensors of that layer the forward saved (only those: the replacement model's attention values,
        output and norms, not its MLP) and keeps them until the backward moves on to another layer, so
        the backward holds one layer's worth, not every block the forward read. The layer the forward
        let go last is the one the backward starts with: what it saved is kept across that turn (so
        one layer's worth, the forward's, besides the block in memory), not read again. The backward runs
        within too: what it read last is let go after."""
        saved_names: dict[int, set[str]] = {}  # layer -> the names saved from it
        in_backward: dict[int, dict[str, torch.Tensor]] = {}  # the one layer the backward has read

        def pack(t: torch.Tensor):
            where = self.storages.get(t.untyped_storage().data_ptr()) if t.device.type != "meta" else None
            if where is None:
                return t
            layer, name = where
            p = self.model.blocks[layer].get_parameter(name)
            offset = t.storage_offset() - p.storage_offset()
            last = offset + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
            if offset < 0 or last >= p.numel():  # (a storage shared with another tensor: kept as it is)
                return t
            saved_names.setdefault(layer, set()).add(name)
            return layer, name, t.shape, t.stride(), offset

        def unpack(saved):
            if isinstance(saved, torch.Tensor):
                return saved
            layer, name, shape, stride, offset = saved
            p = self.model.blocks[layer].get_parameter(name)
            if p.device.type != "meta":  # (held by a `holding` around the backward: nothing to read)
                return p.as_strided(shape, stride, p.storage_offset() + offset)
            if layer not in in_backward:
                in_backward.clear()
                in_backward[layer] = self.load_block(layer, block_device(self.model, layer), saved_names[layer])
                self.loads += 1
                self.bytes_read += sum(t.numel() * t.element_size() for t in in_backward[layer].values())
            t = in_backward[layer][name]
            return t.as_strided(shape, stride, t.storage_offset() + offset)

        def keep(layer: int, tensors: dict[str, torch.Tensor]) -> None:  # a layer the forward lets go
            wanted = saved_names.get(layer)
            if wanted and wanted <= tensors.keys():
                in_backward.clear()
                in_backward[layer] = {name: tensors[name] for name in wanted}

        # no gradient for the blocks' weights either: the backward's node that would gather one (autograd's
        # AccumulateGrad) holds the parameter itself
        blocks = self.model.blocks
        wanted = {name: p.requires_grad for name, p in blocks.named_parameters()}
        blocks.requires_grad_(False)  # kept by each block read within (load_state_dict's assign)
        self.on_drop = keep
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                yield
        finally:
            self.on_drop = None
            in_backward.clear()
            for name, p in blocks.named_parameters():
                p.requires_grad_(wanted[name])


def streamed_of(model) -> StreamedWeights | None:
    return getattr(model, "streamed", None)


@contextmanager
def holding(model, layer: int, only: set[str] | None = None) -> Iterator[None]:
    """Block `layer`'s weights in memory for the duration (a no-op for a model held whole); `only`: just
    these parts of the block (its modules' or parameters' names, "attn.v", "norm1"), not the rest (a
    computation that never calls the MLP need not read it, most of a block's bytes)."""
    streamed = streamed_of(model)
    if streamed is None:
        yield
        return
    names = None if only is None else parameter_names(model.blocks[layer], only)
    streamed.held[layer] += 1
    try:
        streamed.bring(layer, names)
        yield
    finally:
        streamed.held[layer] -= 1
        streamed.drop(layer)


@contextmanager
def keeping(model, parts: Callable[[nn.Module], set[str] | None]) -> Iterator[None]:
    """Within, the parts of the first blocks (`parts(block)`: names of its modules or parameters, as
    `holding`'s `only`; None: the whole block), as many blocks as fit in the streamed model's keep_budget
    (default one block's bytes), stay in memory once read rather than being let go with their block;
    all let go on leaving. For a computation that passes over the layers again and again (an attribution
    graph's replay after its real forward, its backward batches, each a forward and a backward through
    every layer) reading only parts of each block: those it keeps are read once. One block's bytes is
    memory the load counted (checkpoints.resident_fits: the embeddings, head and two layers) that a pass
    reading parts leaves unused: with the block computing (a real forward's whole one), no more than two
    blocks are in memory. A no-op for a model held whole."""
    streamed = streamed_of(model)
    if streamed is None:
        yield
        return
    blocks = model.blocks

    def nbytes(block: nn.Module, names: set[str] | None = None) -> int:
        return sum(p.numel() * p.element_size() for n, p in block.named_parameters() if names is None or n in names)
    budget = max(map(nbytes, blocks)) if streamed.keep_budget is None else streamed.keep_budget
    keep, total = {}, 0
    for layer, block in enumerate(blocks):  # the first blocks: the backward ends, and the next forward starts, there
        only = parts(block)
        names = {n for n, _ in block.named_parameters()} if only is None else parameter_names(block, only)
        total += nbytes(block, names)
        if total > budget:
            break
        keep[layer] = names
    before, streamed.keep = streamed.keep, keep
    try:
        yield
    finally:
        streamed.keep = before
        for layer in keep:
            streamed.drop(layer)


def _argument(block: nn.Module, name: str, args: tuple, kwargs: dict):
    """The value a call of block.forward(*args, **kwargs) gives its parameter `name` (by its place in
    forward's signature when passed by position), or None."""
    if name in kwargs:
        return kwargs[name]
    place = _place_of(type(block), name)
    return args[place] if place < len(args) else None


@functools.cache
def _place_of(kind: type, name: str) -> int:
    import inspect

    return list(inspect.signature(kind.forward).parameters).index(name) - 1  # (self)


def parts_before_stop(block: nn.Module, args: tuple, kwargs: dict) -> set[str] | None:
    """The names of the parameters a call of `block` (Block.forward's args) uses when the pass stops
    within it (stop_at: a Lipschitz input's "blocks.3.attn.input" needs the norm before attention,
    no attention or MLP), walking its sublayers in Block.compose's order; None (all of them) when it
    does not stop there, or stops inside a sublayer (attn.pattern: the pass ends at the block's end)."""
    stop_at, prefix = kwargs.get("stop_at"), _argument(block, "prefix", args, kwargs)
    if not stop_at or not prefix or not stop_at.startswith(prefix):
        return None
    parts: set[str] = set()
    for s in block.sublayers:
        if s.norm is not None and not s.post:
            parts.add(s.norm)
        if stop_at == prefix + s.name + ".input":
            return parameter_names(block, parts)
        parts |= {s.name} | ({s.out_norm} if s.out_norm else set())
        if stop_at == prefix + s.name + ".out":
            return parameter_names(block, parts)
        if s.post:
            parts.add(s.norm)
        if stop_at == prefix + s.resid:
            return parameter_names(block, parts)
    return None


def parameter_names(block: nn.Module, parts: set[str]) -> set[str]:
    """The block's parameters in `parts` (names of its modules or parameters); a name it lacks is refused
    (a typo would leave what the computation uses on meta)."""
    names = {name for name, _ in block.named_parameters()}
    unknown = set(parts) - names - {name for name, _ in block.named_modules()}
    if unknown:
        raise ValueError(f"the block has no module or parameter {', '.join(sorted(unknown))}")
    return {name for name in names if any(name == part or name.startswith(part + ".") for part in parts)}


@contextmanager
def weights_saved_by_name(model) -> Iterator[None]:
    """StreamedWeights.weights_saved_by_name for a streamed model; nothing at all for one held whole."""
    streamed = streamed_of(model)
    if streamed is None:
        yield
        return
    with streamed.weights_saved_by_name():
        yield


# -- several devices ---------------------------------------------------------------------------


def plan_devices(n_layers: int, devices: Sequence[str | torch.device],
                 free: Sequence[int | None] | None = None) -> list[torch.device]:
    """Each layer's device: consecutive layers per device (one hand-off between devices per device
    boundary), in proportion to each device's free memory where known, else evenly; every device
    listed gets at least one layer while there are layers enough."""
    devices = [torch.device(d) for d in devices]
    if not devices:
        raise ValueError("no devices given")
    if len(set(devices)) != len(devices):
        raise ValueError(f"a device is listed twice: {', '.join(map(str, devices))}")
    weights = [float(f) if f else 0.0 for f in (free or [None] * len(devices))]
    if not all(weights):
        weights = [1.0] * len(devices)
    total = sum(weights)
    # cumulative boundaries, halves rounded up (a spare layer goes to the first devices, the home one first):
    # layers [bounds[i], bounds[i+1]) on device i
    bounds = [int(n_layers * sum(weights[:i]) / total + 0.5) for i in range(len(devices) + 1)]
    k = len(devices)
    if n_layers >= k:  # at least one layer each, and one left for each device after
        for i in range(1, k):
            bounds[i] = min(max(bounds[i], bounds[i - 1] + 1), n_layers - (k - i))
    return [devices[i] for i in range(len(devices)) for _ in range(bounds[i], bounds[i + 1])]


def device_list(spec: str | torch.device) -> list[str]:
    """The devices a device setting names: "cuda:0,cuda:1" (layers placed across them) or one device."""
    return [d.strip() for d in str(spec).split(",") if d.strip()]


def _to(value, device: torch.device):
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, tuple):  # (cos, sin) of the rotary
        return tuple(_to(v, device) for v in value)
    return value


def place_blocks(model: nn.Module, devices: Sequence[str | torch.device],
                 free: Sequence[int | None] | None = None) -> list[torch.device]:
    """Spread the model's blocks over `devices` (plan_devices) and the rest of the model (embeddings,
    final norm, head: its home) onto the first. Each block's tensor arguments move to its device before
    it runs, its output home after; a streamed model's blocks are read straight onto theirs. Returns
    each block's device."""
    plan = plan_devices(len(model.blocks), devices, free)
    home = torch.device(devices[0])
    streamed = streamed_of(model) is not None
    for l, (block, device) in enumerate(zip(model.blocks, plan)):
        if not streamed:
            block.to(device)
    for name, child in model.named_children():
        if name != "blocks":
            child.to(home)
    for name, t in list(model.named_parameters(recurse=False)) + list(model.named_buffers(recurse=False)):
        t.data = t.data.to(home)
    model.block_devices = plan
    for l, (block, device) in enumerate(zip(model.blocks, plan)):
        if device == home:
            continue
        block.register_forward_pre_hook(
            lambda module, args, kwargs, device=device: (tuple(_to(a, device) for a in args),
                                                         {k: _to(v, device) for k, v in kwargs.items()}),
            with_kwargs=True, prepend=True)  # before a streamed block is read, so it is read onto `device`
        block.register_forward_hook(lambda module, args, out: out.to(home))
    return plan
