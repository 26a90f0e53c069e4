"""Models at the size people study: the GUI's trace and generation against transformers, same run.

    python -m desktop_app bench scale [--shape qwen2.5-0.5b|llama-3.2-1b|llama-3.1-8b|pythia-1.4b|gemma-3-1b|mixtral-1024|tiny] [--tokens 1024]
                                      [--device cpu|cuda] [--new 16] [--dtype auto|float32|bfloat16|float16]
                                      [--threads N] [--memory-cap-gb G] [--repeat 2] [--gen-runs 3]

A random checkpoint of the shape (the real config's dimensions, transformers' own random init, saved in
bfloat16 as such checkpoints ship) is made with transformers (a test-only dependency) in a temporary
folder, removed at the end; it is built on --device (on CUDA an 8B model's 16 GB are drawn on the card,
not by the CPU) and the time it took is reported. Then two fresh processes, one after the other, so that neither's memory
pollutes the other's peak (VmHWM, whole process, imports included):

- ours: open the folder (--dtype, default auto: the dtype that suits the device, core.devices), take
  the trace the GUI takes of `--tokens` random ids (app.tracing.trace_input: the Attention and Layers
  panels' input) and read its first layer's patterns as the Attention panel does; time to the first
  layer ready (from the trace's start to its first piece, LayersReady of block 0, read as the Attention
  panel's model view paints it: the GUI's progressive first look); peak memory; then greedy generation of
  `--new` tokens after an 8-token prompt, recording as the Generate panel does (what its history tree then
  holds, the nodes' next-token logits and records: ours_history_*_mb).
- transformers: load the checkpoint as shipped (bfloat16, eager attention), one forward with every
  attention map and hidden state brought to numpy (float32: numpy has no bfloat16); peak memory; then
  generate() greedy for the same tokens; and at our compute dtype too when it differs, for the ids (ours
  must give the same ids as transformers at the same dtype).

Each side's generation is timed `--gen-runs` times (default 3) and the least time per token kept. Where
both models fit in memory at once (generation_alternating), both processes stay, their models loaded,
once each has measured its trace and peak alone, and their generations alternate (ours, reference,
ours, ...): timed once each, seconds apart, one slow step or a neighbour's burst of load decided the
figure (0.46-2.15x over runs of unchanged code at the tiny shape; now 0.85-1.12x). Otherwise each side's follow its trace.

--memory-cap-gb G (CUDA only): each measured process caps itself at G GiB of the card before it allocates
anything (torch.cuda.set_per_process_memory_fraction; the app's own memory checks read that cap,
core.devices.available_memory), e.g. the Llama-3.1-8B shape in 24 GiB of an 80 GB card. When transformers'
forward does not fit under the cap, that is reported (reference_capped false, reference_cap_error) and the
reference runs again without the cap, so that its figures still come.

The two processes alternate `--repeat` times (default 2) and each figure is the least over the runs.
Ratios are reference / ours for times (above 1: ours faster) and ours / reference for memory (below 1:
ours smaller). On CUDA the GPU's peak allocation is reported too, and the fraction of the card's memory
bandwidth bound per generated token (weight bytes / measured copy bandwidth, over the time per token).
The last line printed is the JSON result.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..commands.args import OneLineParser, float_in, int_in
from ..commands.args import device as device_name
from .generation import measure_bandwidth

ROPE_LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
# the real configs' dimensions (Hugging Face config.json of each model); "tiny" is for the tests
SHAPES = {
    "qwen2.5-0.5b": ("qwen2", dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32_768,
                                   rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    "llama-3.2-1b": ("llama", dict(vocab_size=128_256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                   max_position_embeddings=131_072, rope_theta=500_000.0, rms_norm_eps=1e-5,
                                   rope_scaling=ROPE_LLAMA3, tie_word_embeddings=True)),
    "llama-3.1-8b": ("llama", dict(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131_072,
                                   rope_theta=500_000.0, rms_norm_eps=1e-5, rope_scaling=dict(ROPE_LLAMA3, factor=8.0),
                                   tie_word_embeddings=False)),
    # EleutherAI/pythia-1.4b ships float16; made in bfloat16 here as every shape: a float16 checkpoint's auto dtype on
    # a CPU without AMX-FP16 is float32 (core.devices.choose_compute_dtype), another comparison than the other shapes'
    "pythia-1.4b": ("gpt_neox", dict(vocab_size=50_304, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                                     num_attention_heads=16, max_position_embeddings=2048, hidden_act="gelu",
                                     layer_norm_eps=1e-5, use_parallel_residual=True, tie_word_embeddings=False,
                                     rope_parameters={"rope_type": "default", "rope_theta": 10_000.0,
                                                      "partial_rotary_factor": 0.25})),  # rotary_pct 0.25
    # Gemma3ForCausalLM's text config (google/gemma-3-1b-pt): every 6th layer global (sliding_window_pattern 6),
    # the others a 512-token window; no soft-capping (both null in its config.json)
    "gemma-3-1b": ("gemma3_text", dict(vocab_size=262_144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                                       num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                       max_position_embeddings=32_768, rms_norm_eps=1e-6, query_pre_attn_scalar=256,
                                       sliding_window=512, final_logit_softcapping=None, attn_logit_softcapping=None,
                                       layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                                    for i in range(26)],
                                       rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                        "sliding_attention": {"rope_type": "default",
                                                                              "rope_theta": 10_000.0}},
                                       tie_word_embeddings=True)),
    # mistralai/Mixtral-8x7B's proportions at hidden 1024 (issue 36's MoE speed check): intermediate 3.5 x hidden
    # (14336 / 4096), head_dim 128 (8 heads), 4 query heads per key/value head (2 kv heads), 8 experts, top-2, 8 layers
    "mixtral-1024": ("mixtral", dict(vocab_size=32_000, hidden_size=1024, intermediate_size=3584, num_hidden_layers=8,
                                     num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                                     num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32_768,
                                     rope_theta=1e6, rms_norm_eps=1e-5, sliding_window=None,
                                     tie_word_embeddings=False)),
    "tiny": ("qwen2", dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                           rope_theta=10_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
}
PROMPT = 8  # generation prompt length
PAIRED_BYTES_PER_PARAM = 8  # both sides' models at once: ours at float32 at most (4), transformers' bfloat16 (2), room


def shape_config(shape: str):
    """transformers' config of `shape` (no special tokens: random ids may be any)."""
    import transformers

    family, dims = SHAPES[shape]
    config_class = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig,
                    "gpt_neox": transformers.GPTNeoXConfig, "gemma3_text": transformers.Gemma3TextConfig,
                    "mixtral": transformers.MixtralConfig}[family]
    return config_class(**dims, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def make_checkpoint(shape: str, folder: Path, seed: int = 0, device: str = "cpu") -> tuple[int, str]:
    """The random bfloat16 checkpoint of `shape` written by transformers into `folder`, its weights drawn
    on `device` (transformers' own init, under `with torch.device(device)`); (its parameter count, the
    device the weights were drawn on)."""
    import torch
    import transformers

    config = shape_config(shape)
    torch.manual_seed(seed)
    with torch.no_grad(), torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        count = sum(p.numel() for p in model.parameters())
        built_on = str(next(model.parameters()).device)
        model.to("cpu").save_pretrained(folder)  # one copy to the host, then written as on a CPU
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the measured processes get the card whole
    return count, built_on


def write_checkpoint_by_tensor(shape: str, folder: Path, seed: int = 0, shard_gib: float = 2.0) -> int:
    """The random bfloat16 checkpoint of `shape` written tensor by tensor into safetensors shards of about
    `shard_gib` GiB (+ model.safetensors.index.json), as transformers' save_pretrained lays a sharded
    folder out: at most one shard in memory, so an 8B shape (16 GB) is made on a machine that cannot hold
    it. The names and shapes come from transformers' model built on the meta device; the values follow
    its init for these shapes (normal(0, initializer_range) for matrices and embeddings, ones for the
    norms' gains, zeros for biases). Returns the parameter count."""
    import torch
    import transformers
    from safetensors.torch import save_file

    config = shape_config(shape)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    params = [(n, tuple(p.shape)) for n, p in model.named_parameters(remove_duplicate=True)]
    limit, shards, current, size = int(shard_gib * 2**30), [], [], 0
    for name, shape_ in params:
        nbytes = 2 * int(torch.Size(shape_).numel())
        if current and size + nbytes > limit:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape_))
        size += nbytes
    shards.append(current)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    generator = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape_ in shard:
            if name.endswith(".bias"):
                t = torch.zeros(shape_, dtype=torch.bfloat16)
            elif len(shape_) == 1:  # a norm's gain
                t = torch.ones(shape_, dtype=torch.bfloat16)
            else:
                t = torch.empty(shape_, dtype=torch.bfloat16).normal_(0.0, config.initializer_range, generator=generator)
            tensors[name] = t
            weight_map[name] = file
            total += t.numel() * 2
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        del tensors
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return sum(torch.Size(s).numel() for _, s in params)


# -- the two processes --------------------------------------------------------------------------


def _status_mb(field: str) -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(field + ":"))


def _peak_mb() -> float:
    """This process's peak resident memory (VmHWM). Not getrusage's ru_maxrss: Linux carries that across
    exec from the parent (subprocess spawns with vfork), so a child read the bench's own peak (an 8B
    checkpoint made in the parent: 16 GB for both sides) whenever the parent's was larger."""
    return _status_mb("VmHWM")


def _rss_mb() -> float:
    return _status_mb("VmRSS")


def _ids(n: int, vocab: int, seed: int) -> list[int]:
    import torch

    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _sync(device: str):
    import torch

    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def _gpu_peak_mb(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None


def cap_memory(device: str, cap_gib: float | None) -> dict:
    """Cap this process at `cap_gib` GiB of the CUDA device (set_per_process_memory_fraction), before
    anything is allocated there; what was set, for the JSON."""
    if not cap_gib:
        return {"memory_cap_gib": None}
    import torch

    from ..core.devices import cuda_index

    index = cuda_index(device)  # set_per_process_memory_fraction refuses "cuda" without an index
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = min(1.0, cap_gib * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return {"memory_cap_gib": cap_gib, "memory_cap_fraction": round(fraction, 4)}


def timed(generate, new: int) -> dict:
    """One timed generation of `new` tokens: its ids and seconds per token."""
    t0 = time.perf_counter()
    ids = generate(new)
    return {"ids": ids, "s_per_token": (time.perf_counter() - t0) / new}


def least_per_token(generate, new: int, runs: int) -> tuple[list[int], float]:
    """(the ids, the least seconds per token) of `runs` timed calls of generate(new): one slow step on a
    shared machine (a neighbour's burst: 10-40 ms against 2 ms) decided a single timing; the least of
    several is the undisturbed one. Greedy: every run must give the same ids."""
    ids, best = None, float("inf")
    for _ in range(runs):
        got = timed(generate, new)
        best = min(best, got["s_per_token"])
        assert ids is None or got["ids"] == ids, "greedy ids differ between runs"
        ids = got["ids"]
    return ids, best


def child_ours(folder: str, tokens: int, new: int, device: str, dtype: str, runs: int,
               cap_gib: float | None = None):
    """(the trace's figures, one timed generation, the figures after the generations: the last generation's
    history, its logits and records as its nodes keep them)."""
    import torch

    capped = cap_memory(device, cap_gib)

    from ..app.tracing import estimated_trace_bytes, trace_input, trace_memory
    from ..core import analysis
    from ..core.checkpoints import load_model_folder
    from ..core.generation import GenerationSession, GenerationSettings
    from ..core.views.attention import prepare

    sync = _sync(device)
    baseline = _rss_mb()
    t0 = time.perf_counter()
    loaded = load_model_folder(folder, device=device, dtype=dtype)
    sync()
    t_load = time.perf_counter() - t0
    ids = _ids(tokens, loaded.config.vocab_size, 1)
    first: list[float] = []

    def layer_ready(ready) -> None:  # the GUI's first piece: layer 0's patterns, read as its model view does
        if ready.done == 1:
            analysis.attention_pattern(ready.trace, 0)
            sync()
            first.append(time.perf_counter())

    t1 = time.perf_counter()
    _, trace = trace_input(loaded, "", ids, on_layer=layer_ready)
    layer0 = prepare(trace, None, None).patterns[0]  # what the Attention panel paints first
    sync()
    t_trace = time.perf_counter() - t1
    assert layer0.shape == (loaded.config.n_heads, tokens, tokens)
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in loaded.model.parameters()}.values())
    out = {"load_s": t_load, "trace_s": t_trace, "first_layer_s": first[0] - t1, "peak_mb": _peak_mb(),
           "baseline_mb": baseline, "gpu_peak_mb": _gpu_peak_mb(device), "trace_held_mb": trace.nbytes() / 2**20,
           "estimate_mb": (weights + estimated_trace_bytes(loaded, tokens)) / 2**20,
           "device_estimate_mb": (weights + trace_memory(loaded, tokens).device) / 2**20,  # the card's share
           "dtype": str(loaded.model.dtype).replace("torch.", ""), "dtype_reason": loaded.dtype_reason,
           "weight_bytes": weights, "threads": torch.get_num_threads(), **capped}
    del trace, layer0
    prompt = _ids(PROMPT, loaded.config.vocab_size, 2)

    held: dict[str, int] = {}  # what the last generation's history tree holds (GenerationSession.held_bytes)

    def generate(n: int) -> list[int]:
        s = GenerationSession(loaded, prompt, GenerationSettings("greedy"), stop_tokens=[])
        for _ in s.run(n, lazy_last=True):  # generate's forwards: none for the last token
            pass
        sync()
        held.update(s.held_bytes())
        return s.ids()

    generate(new if device.startswith("cuda") else 2)  # warm up (a GPU's first steps pick kernels: 3x slower)
    return out, lambda: timed(generate, new), lambda: {f"history_{part}_mb": b / 2**20 for part, b in held.items()}


def child_reference(folder: str, tokens: int, new: int, device: str, same_dtype: str, runs: int,
                    cap_gib: float | None = None):
    """(the forward's figures, one timed generation, the figures after the generations: at our compute
    dtype when it is not bfloat16, transformers' ids and time per token, the least of `runs`)."""
    import torch
    import transformers

    capped = cap_memory(device, cap_gib)
    sync = _sync(device)
    # the model's class imported before the clock starts, as ours is (transformers imports lazily)
    model_class = transformers.AutoModelForCausalLM._model_mapping[type(transformers.AutoConfig.from_pretrained(folder))]
    baseline = _rss_mb()
    t0 = time.perf_counter()
    model = model_class.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="eager").to(device).eval()
    sync()
    t_load = time.perf_counter() - t0
    ids = torch.tensor([_ids(tokens, model.config.vocab_size, 1)], device=device)
    t1 = time.perf_counter()
    with torch.no_grad():
        o = model(ids, output_attentions=True, output_hidden_states=True)
        attentions = [a[0].float().cpu().numpy() for a in o.attentions]
        hidden = [h[0].float().cpu().numpy() for h in o.hidden_states]
    sync()
    t_forward = time.perf_counter() - t1
    out = {"load_s": t_load, "forward_s": t_forward, "peak_mb": _peak_mb(), "baseline_mb": baseline,
           "gpu_peak_mb": _gpu_peak_mb(device), "arrays": len(attentions) + len(hidden), "threads": torch.get_num_threads(),
           **capped}
    del o, attentions, hidden
    # generation with transformers' default attention (SDPA; eager was only for the attention maps):
    # what a user's generate runs, and what our session computes as, bit for bit in bfloat16
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("sdpa")
    prompt = torch.tensor([_ids(PROMPT, model.config.vocab_size, 2)], device=device)

    def generate(m, n: int) -> list[int]:
        with torch.no_grad():
            g = m.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, num_beams=1,
                           use_cache=True, pad_token_id=0)
        sync()
        return g[0].tolist()

    generate(model, new if device.startswith("cuda") else 2)  # warm up, as ours

    def same_dtype_figures() -> dict:
        if same_dtype == "bfloat16":  # the generations' own
            return {}
        nonlocal model  # our compute dtype: the ids must be the same there
        del model
        model = model_class.from_pretrained(folder, dtype=getattr(torch, same_dtype)).to(device)
        generate(model.eval(), 2)
        ids, s_per_token = least_per_token(lambda n: generate(model, n), new, runs)
        return {"same_dtype_ids": ids, "same_dtype_generate_s_per_token": s_per_token}

    return out, lambda: timed(lambda n: generate(model, n), new), same_dtype_figures


OOM = ("OutOfMemoryError", "CUDA out of memory", "needs about")  # the last: our memory checks' refusal


class Measured:
    """A measured process (python -m desktop_app.benchmarks.scale KIND ARGS_JSON) once it has printed its
    first figures (`result`); it stays, its model loaded, for timed generations until finish()."""

    def __init__(self, kind: str, args: tuple, threads: int | None):
        from ..paths import package_on_path

        env = package_on_path(dict(os.environ))
        self.kind = kind
        self.stderr = tempfile.TemporaryFile("w+")  # a file, not a pipe: a full pipe would block the process
        self.process = subprocess.Popen([sys.executable, "-m", "desktop_app.benchmarks.scale", kind, json.dumps(args)]
                                        + ([str(threads)] if threads else []), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)
        self.result = self._read()

    ANSWER_TIMEOUT_S = 3600  # a process that hangs is killed, as subprocess.run(timeout=3600) did before

    def _read(self) -> dict:
        hung = threading.Event()

        def kill() -> None:
            hung.set()
            self.process.kill()

        watchdog = threading.Timer(self.ANSWER_TIMEOUT_S, kill)
        watchdog.start()
        try:
            line = self.process.stdout.readline()
        finally:
            watchdog.cancel()
        if not line:  # it ended (or was killed) without its figures
            self.process.wait(timeout=60)
            self.stderr.seek(0)
            err = self.stderr.read()
            self.stderr.close()
            if hung.is_set():
                err += f"\n(killed: no answer in {self.ANSWER_TIMEOUT_S} s)"
            error = RuntimeError(f"bench scale: the {self.kind} process failed:\n{err[-3000:]}")
            error.out_of_memory = any(word in err for word in OOM)
            raise error
        return json.loads(line)

    def _ask(self, what: str) -> dict:
        self.process.stdin.write(what + "\n")
        self.process.stdin.flush()
        return self._read()

    def generate(self) -> dict:
        """One timed generation: {"ids", "s_per_token"}."""
        return self._ask("generate")

    def finish(self) -> dict:
        """The figures that come after the generations; the process ends."""
        out = self._ask("finish")
        self.process.wait(timeout=60)
        self.stderr.close()
        return out

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


def _run_child(kind: str, *args, threads: int | None = None) -> Measured:
    return Measured(kind, args, threads)


def generation_rounds(sides: list[Measured], runs: int) -> None:
    """`runs` timed generations of each side, alternating (ours, reference, ours, ...) when several sides
    are given, so that a neighbour's burst of load falls on both alike: the least time per token of each
    side goes into its result (one slow step decided a single timing); greedy, so every run of a side must
    give the same ids."""
    for _ in range(runs):
        for side in sides:
            got = side.generate()
            ids = side.result.setdefault("generated_ids", got["ids"])
            assert got["ids"] == ids, f"{side.kind}: greedy ids differ between runs"
            side.result["generate_s_per_token"] = min(side.result.get("generate_s_per_token", float("inf")),
                                                      got["s_per_token"])


def _run_sides(common: tuple, dtype: str, runs: int, paired: bool, caps: dict, errors: dict,
               threads: int | None) -> tuple[dict, dict]:
    """One run of each side: ours, then the reference (each process's trace figures and peak measured
    while it is the only one working); their generations alternating when `paired` (both processes
    alive, both models loaded), else each side's in turn."""
    sides = []
    try:
        ours = _run_capped("ours", common + (dtype, runs), caps, errors, threads)
        sides.append(ours)
        if not paired:
            generation_rounds([ours], runs)
            ours.result.update(ours.finish())
        ref = _run_capped("reference", common + (ours.result["dtype"], runs), caps, errors, threads)
        sides.append(ref)
        generation_rounds([ours, ref] if paired else [ref], runs)
        for side in sides if paired else [ref]:
            side.result.update(side.finish())
    finally:
        for side in sides:
            side.close()
    ref.result.setdefault("same_dtype_ids", ref.result["generated_ids"])  # at bfloat16: the generations'
    ref.result.setdefault("same_dtype_generate_s_per_token", ref.result["generate_s_per_token"])
    return ours.result, ref.result


def _run_capped(kind: str, args: tuple, caps: dict, errors: dict, threads: int | None) -> Measured:
    """The measured process `kind` under caps[kind] GiB (None: no cap); when it runs out of memory there
    (or our estimate refuses), the line goes to errors[kind], the cap is dropped for that side and it
    runs again without it: a finding, with the figures still measured."""
    try:
        return _run_child(kind, *args, caps[kind], threads=threads)
    except RuntimeError as exc:
        if caps[kind] is None or not getattr(exc, "out_of_memory", False):
            raise
        errors[kind] = next((line.strip() for line in reversed(str(exc).splitlines())
                             if any(word in line for word in OOM)), "out of memory")[:300]
        print(f"bench scale: {kind} did not fit under the {caps[kind]:g} GiB cap ({errors[kind]}); run again "
              f"without it", file=sys.stderr, flush=True)
        caps[kind] = None
        return _run_child(kind, *args, None, threads=threads)


def _fastest(runs: list[dict]) -> dict:
    """One side's runs merged: the least of every time and memory figure (the least disturbed by a busy
    machine), the rest from the first run; ids must agree between runs."""
    out = dict(runs[0])
    for key, value in out.items():
        if isinstance(value, float) and key.endswith(("_s", "_mb", "_per_token")):
            out[key] = min(r[key] for r in runs)
    assert all(r["generated_ids"] == out["generated_ids"] for r in runs), "greedy ids differ between runs"
    out["runs"] = len(runs)
    return out


def main(argv: list[str]) -> dict:
    ap = OneLineParser(prog="bench scale")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--tokens", type=int_in(1, 32_768), default=1024, help="tokens traced (default 1024)")
    ap.add_argument("--new", type=int_in(1, 4096), default=16, help="tokens generated, greedy (default 16)")
    ap.add_argument("--device", type=device_name, default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--repeat", type=int_in(1, 100), default=2,
                    help="alternating runs of each side, the fastest of each kept (default 2)")
    ap.add_argument("--gen-runs", type=int_in(1, 1000), default=3,
                    help="timed generations of --new tokens a side, alternating between the two processes where "
                         "both models fit in memory, the fastest of each kept (default 3)")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                    help="our compute dtype (default auto: what suits the device)")
    ap.add_argument("--memory-cap-gb", type=float_in(0, 1e5, lo_open=True), default=None, metavar="G",
                    help="CUDA only: each measured process may use at most G GiB of the card "
                         "(set_per_process_memory_fraction, set before anything is allocated)")
    ap.add_argument("--threads", type=int_in(1, 1024), default=None,
                    help="torch threads in both measured processes (default: torch's own, one per core; "
                         "the GUI uses one core fewer)")
    args = ap.parse_args(argv)
    if not Path("/proc/self/status").exists():
        raise SystemExit("bench scale reads peak memory per process (Linux only)")
    import torch

    from ..core.devices import available_memory

    cap = args.memory_cap_gb
    if cap is not None and not args.device.startswith("cuda"):
        ap.error(f"--memory-cap-gb caps a CUDA device's memory; --device is {args.device} (give --device cuda)")
    if cap is not None:
        card = torch.cuda.get_device_properties(args.device).total_memory / 2**30
        if cap > card:
            ap.error(f"--memory-cap-gb {cap:g}: the card ({torch.cuda.get_device_name(args.device)}) has "
                     f"{card:.1f} GiB in all")

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        folder = Path(tmp) / args.shape
        params, built_on = make_checkpoint(args.shape, folder, device=args.device)
        made_s = time.perf_counter() - t0
        print(f"bench scale: {args.shape} checkpoint ({params / 1e9:.2f} B parameters) drawn on {built_on} and "
              f"saved in {made_s:.1f} s", file=sys.stderr, flush=True)
        # the generations alternate between the two processes, both models loaded, where both fit with room
        # (ours at float32 at most, transformers' in bfloat16); else each side's follow its trace
        have = available_memory(args.device)
        paired = have is not None and PAIRED_BYTES_PER_PARAM * params < have
        runs, caps, cap_errors = [], {"ours": cap, "reference": cap}, {"ours": None, "reference": None}
        for _ in range(args.repeat):  # alternating, so that both sides see the same machine load
            runs.append(_run_sides((str(folder), args.tokens, args.new, args.device), args.dtype, args.gen_runs,
                                   paired, caps, cap_errors, args.threads))
    ours, ref = (_fastest([run[i] for run in runs]) for i in (0, 1))
    ours_total = ours["load_s"] + ours["trace_s"]
    ref_total = ref["load_s"] + ref["forward_s"]
    result = {
        "name": "scale", "shape": args.shape, "params": params, "tokens": args.tokens, "device": args.device,
        "checkpoint": "random, saved in bfloat16 by transformers", "ours_dtype": ours["dtype"],
        "ours_dtype_reason": ours["dtype_reason"], "reference_dtype": "bfloat16 (as shipped), eager attention",
        "torch_threads": ours["threads"], "reference_torch_threads": ref["threads"], "make_checkpoint_s": round(made_s, 2),
        "checkpoint_drawn_on": built_on, "repeats": args.repeat,
        "generation_runs": args.gen_runs, "generation_alternating": paired,
        # --memory-cap-gb: the cap each measured process set on itself (None: none)
        "memory_cap_gib": cap, "ours_memory_cap_fraction": ours.get("memory_cap_fraction"),
        # a side that did not fit under the cap (out of memory, or our own memory check's refusal) says so
        # and its figures are from a run without the cap
        "ours_capped": caps["ours"] is not None, "ours_cap_error": cap_errors["ours"],
        "reference_capped": caps["reference"] is not None, "reference_cap_error": cap_errors["reference"],
        # complete trace (open + the GUI's trace) against load + forward with every map brought to numpy
        "ours_load_s": round(ours["load_s"], 3), "ours_trace_s": round(ours["trace_s"], 3),
        "ours_total_s": round(ours_total, 3),
        "reference_load_s": round(ref["load_s"], 3), "reference_forward_s": round(ref["forward_s"], 3),
        "reference_total_s": round(ref_total, 3),
        "trace_speedup": round(ref_total / ours_total, 3),
        "ours_peak_mb": round(ours["peak_mb"], 1), "reference_peak_mb": round(ref["peak_mb"], 1),
        "ours_baseline_mb": round(ours["baseline_mb"], 1), "reference_baseline_mb": round(ref["baseline_mb"], 1),
        "memory_ratio": round(ours["peak_mb"] / ref["peak_mb"], 3),
        "ours_trace_held_mb": round(ours["trace_held_mb"], 1),
        "ours_estimate_mb": round(ours["estimate_mb"], 1),
        "estimate_over_peak_above_baseline": round(ours["estimate_mb"] / max(ours["peak_mb"] - ours["baseline_mb"], 1e-9), 3),
        # the first layer ready (from the trace's start) against transformers' whole forward
        "ours_first_layer_s": round(ours["first_layer_s"], 3),
        "first_layer_over_reference_forward": round(ours["first_layer_s"] / ref["forward_s"], 3),
        # generation, greedy, batch 1, after an 8-token prompt (prompt forward included)
        "new_tokens": args.new,
        "ours_ms_per_token": round(1000 * ours["generate_s_per_token"], 2),
        "reference_ms_per_token": round(1000 * ref["generate_s_per_token"], 2),
        "generation_speedup": round(ref["generate_s_per_token"] / ours["generate_s_per_token"], 3),
        "reference_same_dtype_ms_per_token": round(1000 * ref["same_dtype_generate_s_per_token"], 2),
        "same_ids_as_reference_at_same_dtype": ours["generated_ids"] == ref["same_dtype_ids"],
        # what the recorded generation's history tree holds (its nodes' next-token logits and records, in the model's
        # dtype until read): the KV cache and the weights not counted
        "ours_history_logits_mb": round(ours["history_logits_mb"], 3),
        "ours_history_records_mb": round(ours["history_records_mb"], 3),
    }
    if args.device.startswith("cuda"):
        bw = measure_bandwidth(256 << 20, device=args.device)
        bound = ours["weight_bytes"] / bw
        result.update(ours_gpu_peak_mb=round(ours["gpu_peak_mb"], 1), reference_gpu_peak_mb=round(ref["gpu_peak_mb"], 1),
                      gpu_memory_ratio=round(ours["gpu_peak_mb"] / ref["gpu_peak_mb"], 3),
                      ours_gpu_estimate_mb=round(ours["device_estimate_mb"], 1),
                      gpu_estimate_over_gpu_peak=round(ours["device_estimate_mb"] / ours["gpu_peak_mb"], 3),
                      device_name=torch.cuda.get_device_name(), bandwidth_GBps=round(bw / 1e9, 1),
                      fraction_of_bandwidth_bound=float(f"{bound / ours['generate_s_per_token']:.3g}"))  # 3 significant digits (tiny shapes: 1e-5)
    for key in ("ours_total_s", "reference_total_s", "trace_speedup", "ours_peak_mb", "reference_peak_mb",
                "memory_ratio", "ours_first_layer_s", "first_layer_over_reference_forward", "ours_ms_per_token",
                "reference_ms_per_token", "generation_speedup", "same_ids_as_reference_at_same_dtype"):
        print(f"{key:40s} {result[key]}", file=sys.stderr)
    return result


if __name__ == "__main__":  # a measured process: python -m desktop_app.benchmarks.scale ours|reference ARGS_JSON
    kind, child_args = sys.argv[1], json.loads(sys.argv[2])
    if len(sys.argv) > 3:  # --threads
        import torch

        torch.set_num_threads(int(sys.argv[3]))
    figures, timed_generation, after = {"ours": child_ours, "reference": child_reference}[kind](*child_args)
    print(json.dumps(figures), flush=True)
    for request in sys.stdin:  # the bench's requests, one a line: "generate"s, then "finish"
        print(json.dumps(timed_generation() if request.strip() == "generate" else after()), flush=True)
        if request.strip() != "generate":
            break
