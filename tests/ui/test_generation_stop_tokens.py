"""The Generate panel on a folder whose generation_config.json lists several end tokens (Llama-3.x-Instruct):
Run N stops at the list's later id, where transformers' generate stops, and the status names that token;
a malformed generation_config.json is one line in the status and the panel still generates."""
from __future__ import annotations

import json

import pytest
import torch
from PySide6.QtCore import Qt

from desktop_app.core.checkpoints import load_model_folder
from .walkthrough import show_generation_panel

transformers = pytest.importorskip("transformers")

PROMPT = [3, 17, 41, 8, 29]
N = 14


@pytest.fixture
def llama_folder(tmp_path):
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
        pad_token_id=None)).eval()
    hf.save_pretrained(tmp_path)
    with torch.no_grad():
        free = hf.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=N, eos_token_id=None,
                           pad_token_id=0)[0, len(PROMPT):].tolist()
    return tmp_path, free


def _panel(qtbot, loaded):
    return show_generation_panel(qtbot, loaded)


def _run(qtbot, p, n: int) -> None:
    p.prompt.setText(" ".join(map(str, PROMPT)))
    p.run_n.setValue(n)
    qtbot.mouseClick(p.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: p.session is not None and not p.busy and p.status.text().startswith(("Stopped", "Done")),
                    timeout=30_000)


def test_run_stops_at_a_later_end_token_of_the_list_and_names_it(qtbot, llama_folder):
    folder, free = llama_folder
    at = next(i for i in range(2, N) if free[i] not in free[:i])
    unused = [t for t in range(60) if t not in free][:2]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": unused + [free[at]]}))
    p = _panel(qtbot, load_model_folder(folder))
    _run(qtbot, p, N)
    assert p.session.ids()[len(PROMPT):] == free[:at + 1]  # generate's stop (test_generation_config.py)
    assert p.status.text() == f"Stopped: a stop token was generated: id {free[at]}."
    p.grab().save("/tmp/pt-h5-generate-stop.png")


def test_a_malformed_generation_config_is_one_line_in_the_status(qtbot, llama_folder):
    folder, free = llama_folder
    (folder / "generation_config.json").write_text('{"eos_token_id": [1, "two"]}')
    p = _panel(qtbot, load_model_folder(folder))
    text = p.status.text()
    assert "\n" not in text and str(folder / "generation_config.json") in text and "'eos_token_id'" in text
    _run(qtbot, p, 4)
    assert p.session.ids()[len(PROMPT):] == free[:4]  # it still generates, with config.json's (no) end tokens
