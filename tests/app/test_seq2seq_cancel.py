"""A cancel in the middle of an encoder-decoder's forward (T5, BART, Marian), as a decoder-only one is cancelled:
the cancel rides on the forward's on_layer (EncoderDecoder.encode / decode), so the pass stops after the block
where it was asked, raises core.jobs.Cancelled, and leaves nothing half-written (no trace handed back, no
half-made node in a generation's tree, the next run as if nothing had happened). The cancel is set from inside
the chosen block (a forward hook), so nothing here waits or sleeps."""
from __future__ import annotations

import pytest
import torch

from desktop_app.app.tracing import trace_input
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.generation import GenerationSession, GenerationSettings
from desktop_app.core.jobs import Cancelled, JobControl
from translate_models import save_translate_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_ENC, N_DEC = 2, 3


@pytest.fixture(scope="module", params=["t5", "bart", "marian"])
def loaded(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "m"
    save_translate_model(folder, request.param, d_model=16, n_layers=N_ENC, n_decoder_layers=N_DEC, n_heads=2,
                         d_ff=32, context_length=24, init_std=0.2)
    return load_model_folder(folder)


def _blocks(model):
    return [("encoder", l, b) for l, b in enumerate(model.encoder.blocks)] + \
           [("decoder", l, b) for l, b in enumerate(model.decoder.blocks)]


class CancelAt:
    """Forward hooks on every block of both stacks: each records that its block ran, and the chosen one cancels
    `job` once it has run `after` times (the on_layer check right after it is then the first to see it)."""

    def __init__(self, model, job: JobControl, stack: str, layer: int, after: int = 1) -> None:
        self.ran: list[tuple[str, int]] = []
        self.hooks = []
        for s, l, block in _blocks(model):
            def hook(_module, _args, _out, s=s, l=l):
                self.ran.append((s, l))
                if (s, l) == (stack, layer) and self.ran.count((s, l)) == after:
                    job.cancel()
            self.hooks.append(block.register_forward_hook(hook))

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


@pytest.mark.parametrize("stack,layer", [("encoder", 0), ("decoder", 1)])
def test_a_cancel_inside_a_seq2seq_trace_stops_after_that_block(loaded, stack, layer):
    _, plain = trace_input(loaded, "", [5, 6, 7], target_ids=[9, 10])
    job = JobControl()
    seen = CancelAt(loaded.model, job, stack, layer)
    try:
        with pytest.raises(Cancelled):
            trace_input(loaded, "", [5, 6, 7], target_ids=[9, 10], job=job)
    finally:
        seen.remove()
    everything = [(s, l) for s, l, _ in _blocks(loaded.model)]
    assert seen.ran == everything[:everything.index((stack, layer)) + 1]  # no block after the chosen one ran
    # nothing left behind: the same trace as before, hooks gone, and a trace with a job reports every block
    progress = []
    _, again = trace_input(loaded, "", [5, 6, 7], target_ids=[9, 10],
                           job=JobControl(on_progress=lambda done, total, _m: progress.append((done, total))))
    assert torch.equal(again["logits"], plain["logits"])
    assert progress == [(k, N_ENC + N_DEC) for k in range(N_ENC + N_DEC + 1)]


def test_a_cancel_inside_a_seq2seq_generation_step_leaves_the_tree_and_cache_consistent(loaded):
    source = [5, 6, 7, 8]
    ref = GenerationSession(loaded.model, source, GenerationSettings("greedy"), stop_tokens=[])
    list(ref.run(4))
    s = GenerationSession(loaded.model, source, GenerationSettings("greedy"), stop_tokens=[])
    list(s.run(2))
    job = JobControl()
    # the session encodes its source once, at its start: the run's forwards are the decoder's, one per token
    seen = CancelAt(loaded.model, job, "decoder", 1, after=2)  # in the second step of this run
    try:
        with pytest.raises(Cancelled):
            list(s.run(5, job))
    finally:
        seen.remove()
    assert seen.ran == [("decoder", l) for l in range(N_DEC)] + [("decoder", 0), ("decoder", 1)]
    assert s.current.depth == 3  # one more token made, the second interrupted
    assert s.current.children == []  # no half-made node
    list(s.run(1))  # carries on (the half-updated cache dropped and rebuilt): the uncancelled session's tokens
    assert s.ids() == ref.ids()
    for a, b in zip(s.current.path(), ref.current.path()):
        torch.testing.assert_close(a.next_logits, b.next_logits, atol=1e-5, rtol=0)
