"""Token ids and stopping as transformers' `generate()` on folders with a generation_config.json (issue 27):
random tiny models saved by transformers, with a generation_config.json (or a config.json) written here,
and `model.generate(ids, do_sample=False, max_new_tokens=N)` on the folder reopened by transformers as the
reference: every end token of a list stops (Llama-3.x-Instruct), Marian's bad_words_ids [[pad]] and
forced_eos_token_id (greedy and beam, renormalize_logits too), repetition_penalty and no_repeat_ngram_size;
a malformed file is one line and the folder still opens."""
from __future__ import annotations

import json

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.generation import GenerationSettings, generate
from seq2seq_decode import beam_decode, greedy_decode

transformers = pytest.importorskip("transformers")

VOCAB = 60
PROMPT = [3, 17, 41, 8, 29]
N = 14


def _llama_folder(tmp_path, seed: int = 0):
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
        pad_token_id=None)).eval()
    hf.save_pretrained(tmp_path)
    return hf


def _reference(folder, prompt, n, **kw) -> list[int]:
    """generate() on the folder as transformers opens it (its generation_config.json, or config.json's)."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, **kw)[0, len(prompt):].tolist()


def _rewrite(path, **fields) -> None:
    d = json.loads(path.read_text()) if path.exists() else {}
    d.update(fields)
    path.write_text(json.dumps(d))


def _greedy_without_stops(hf) -> list[int]:
    with torch.no_grad():
        return hf.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=N, eos_token_id=None,
                           pad_token_id=0)[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("where", ["config.json", "generation_config.json"])
def test_every_end_token_of_a_list_stops_where_generate_stops(where, tmp_path):
    """Llama-3.x-Instruct: eos_token_id [128001, 128008, 128009] stops at <|eot_id|>, not the list's first id;
    from config.json's list (no generation_config.json) or from generation_config.json's."""
    hf = _llama_folder(tmp_path)
    free = _greedy_without_stops(hf)
    # an end token that greedy writes at a later step (not one it wrote before), after two it never writes
    at = next(i for i in range(2, N) if free[i] not in free[:i])
    unused = [t for t in range(VOCAB) if t not in free][:2]
    ends = unused + [free[at]]
    if where == "config.json":
        (tmp_path / "generation_config.json").unlink()
        _rewrite(tmp_path / "config.json", eos_token_id=ends)
    else:  # config.json names one end token; generation_config.json lists them all, as Llama-3.1-Instruct's
        _rewrite(tmp_path / "config.json", eos_token_id=unused[0])
        _rewrite(tmp_path / "generation_config.json", eos_token_id=ends, bos_token_id=1, do_sample=True,
                 temperature=0.6, top_p=0.9)
    ref = _reference(tmp_path, PROMPT, N)
    assert ref == free[:at + 1]  # generate stopped at the list's last id
    loaded = load_model_folder(tmp_path)
    ids, session = generate(loaded, PROMPT, N, GenerationSettings("greedy"))
    assert ids[len(PROMPT):] == ref
    assert session.stop_reason == "a stop token was generated" and session.current.stop
    assert set(loaded.generation.eos_ids) == set(ends)


RULES = {  # each made from the ids greedy writes without rules (free), so that it changes them
    "repetition_penalty+no_repeat_ngram": lambda free: dict(repetition_penalty=1.6, no_repeat_ngram_size=2),
    "suppress_tokens": lambda free: dict(suppress_tokens=[free[0], free[3]]),
    "begin_suppress_tokens": lambda free: dict(begin_suppress_tokens=[free[0]]),
    "bad_words_ids of two tokens": lambda free: dict(bad_words_ids=[[free[1], free[2]], [free[0]]]),
    "min_length": lambda free: dict(eos_token_id=free[2], min_length=len(PROMPT) + 6),
    "forced_eos_token_id": lambda free: dict(eos_token_id=[t for t in range(VOCAB) if t not in free][0],
                                             forced_eos_token_id=[t for t in range(VOCAB) if t not in free][0]),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_each_constraint_of_generation_config_gives_generates_ids(rule, tmp_path):
    hf = _llama_folder(tmp_path, seed=1)
    free = _greedy_without_stops(hf)
    _rewrite(tmp_path / "generation_config.json", **{"eos_token_id": None, **RULES[rule](free)})
    ref = _reference(tmp_path, PROMPT, N, pad_token_id=0)
    assert ref != free  # the rule changes greedy's ids here: the test sees it
    loaded = load_model_folder(tmp_path)
    ids, _ = generate(loaded, PROMPT, N, GenerationSettings("greedy"))
    assert ids[len(PROMPT):] == ref


def _marian_folder(tmp_path):
    """A Marian whose pad token (its decoder start, as opus-mt's) is likely and its end token unlikely, with
    opus-mt's generation_config.json: pad banned, the end token forced at max_length - 1, beams 4."""
    torch.manual_seed(0)
    pad = VOCAB - 1
    hf = transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=40,
        scale_embedding=True, dropout=0.0, attention_dropout=0.0, pad_token_id=pad, decoder_start_token_id=pad,
        eos_token_id=0, forced_eos_token_id=None))
    with torch.no_grad():
        hf.final_logits_bias[0, pad] = 3.0
        hf.final_logits_bias[0, 0] = -3.0
    hf.eval().save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "bad_words_ids": [[pad]], "bos_token_id": 0, "decoder_start_token_id": pad, "eos_token_id": 0,
        "forced_eos_token_id": 0, "max_length": 512, "num_beams": 4, "pad_token_id": pad,
        "renormalize_logits": True}))
    return transformers.MarianMTModel.from_pretrained(tmp_path).eval()


def test_marians_generation_config_gives_generates_greedy_and_beam_ids(tmp_path):
    hf = _marian_folder(tmp_path)
    loaded = load_model_folder(tmp_path)
    src = [5, 9, 14, 22, 7, 31]
    n = 8
    with torch.no_grad():
        beam_ref = hf.generate(torch.tensor([src]), do_sample=False, max_new_tokens=n)[0, 1:].tolist()  # 4 beams
        greedy_ref = hf.generate(torch.tensor([src]), do_sample=False, max_new_tokens=n, num_beams=1)[0, 1:].tolist()
    pad = VOCAB - 1
    assert pad in greedy_decode(loaded.model, src, n)  # without the file's rules the pad token comes
    assert pad not in greedy_ref and greedy_ref[-1] == 0 and 0 not in greedy_ref[:-1]  # forced at the end
    # the session (Generate panel, `generate` command), greedy and beam
    ids, _ = generate(loaded, src, n, GenerationSettings("greedy"))
    assert ids[1:] == greedy_ref
    ids, _ = generate(loaded, src, n, GenerationSettings("beam", beams=4))
    assert ids[1:] == beam_ref
    # core.seq2seq's decoders given the folder's rules
    rules = loaded.generation
    assert greedy_decode(loaded.model, src, n, rules=rules) == greedy_ref
    assert beam_decode(loaded.model, src, n, 4, rules=rules) == beam_ref


@pytest.mark.parametrize("text, field", [("{not json", "generation_config.json"),
                                         ('{"eos_token_id": "</s>"}', "'eos_token_id'"),
                                         ('{"bad_words_ids": [3]}', "'bad_words_ids'"),
                                         ('{"repetition_penalty": -1}', "'repetition_penalty'")])
def test_a_malformed_generation_config_is_one_line_and_the_folder_opens(text, field, tmp_path):
    _llama_folder(tmp_path)
    _rewrite(tmp_path / "config.json", eos_token_id=[7, 9])
    (tmp_path / "generation_config.json").write_text(text)
    loaded = load_model_folder(tmp_path)
    problem = loaded.generation.problem
    assert "\n" not in problem and "generation_config.json" in problem and field in problem
    assert loaded.generation.eos_ids == (7, 9) and not loaded.generation.changes_logits  # config.json's, as today
    ids, session = generate(loaded, PROMPT, 4, GenerationSettings("greedy"))
    assert session.stop_tokens == {7, 9}


def test_the_generate_command_names_the_stop_tokens_and_a_malformed_file(tmp_path, capsys):
    from desktop_app.cli import main

    hf = _llama_folder(tmp_path)
    free = _greedy_without_stops(hf)
    at = next(i for i in range(2, N) if free[i] not in free[:i])
    unused = [t for t in range(VOCAB) if t not in free][:2]
    _rewrite(tmp_path / "generation_config.json", eos_token_id=unused + [free[at]])
    args = ["generate", str(tmp_path), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new", str(N)]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["ids"][len(PROMPT):] == free[:at + 1] and out["stopped_by"] == free[at]
    assert out["stop_tokens"] == sorted(unused + [free[at]]) and "generation_config.json" in out["rules"]
    assert main(args) == 0
    assert f"(stopped: a stop token was generated: id {free[at]})" in capsys.readouterr().out
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [1, "two"]}')
    assert main(args + ["--json"]) == 0
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if "generation_config.json" in line]
    assert len(err) == 1 and "'eos_token_id'" in err[0]
    assert len(json.loads(captured.out.strip().splitlines()[-1])["ids"]) == len(PROMPT) + N  # config.json names no end token


def test_a_bart_config_json_with_generation_fields_gives_generates_ids(tmp_path):
    """No generation_config.json: generate takes the generation fields of config.json (as bart-large-cnn's:
    forced_bos_token_id, min_length, no_repeat_ngram_size, repetition_penalty), greedy and beam."""
    torch.manual_seed(0)
    hf = transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=40,
        dropout=0.0, attention_dropout=0.0, forced_eos_token_id=None)).eval()
    with torch.no_grad():
        hf.final_logits_bias[0, 2] = 2.0  # the end token (2) likely: min_length holds it back
    hf.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    _rewrite(tmp_path / "config.json", forced_bos_token_id=0, min_length=6, no_repeat_ngram_size=2,
             repetition_penalty=1.3)
    hf = transformers.BartForConditionalGeneration.from_pretrained(tmp_path).eval()
    loaded = load_model_folder(tmp_path)
    src, n = [5, 9, 14, 22, 7, 31, 12], 10
    for beams in (1, 3):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([src]), do_sample=False, max_new_tokens=n, num_beams=beams)[0, 1:].tolist()
        ref = ref[:ref.index(2) + 1] if 2 in ref else ref
        plain = (greedy_decode(loaded.model, src, n, eos_id=2) if beams == 1 else
                 beam_decode(loaded.model, src, n, beams, eos_id=2))
        assert ref[0] == 0 and ref != plain, beams  # the fields change the ids: the test sees them
        ids, _ = generate(loaded, src, n, GenerationSettings("beam" if beams > 1 else "greedy", beams=beams))
        assert ids[1:] == ref, beams
        decode = (greedy_decode(loaded.model, src, n, rules=loaded.generation) if beams == 1 else
                  beam_decode(loaded.model, src, n, beams, rules=loaded.generation))
        assert decode == ref, beams


def test_a_constraint_not_applied_is_named_and_sampling_fields_are_not_taken(tmp_path):
    _llama_folder(tmp_path)
    _rewrite(tmp_path / "generation_config.json", eos_token_id=[4, 6], min_new_tokens=3, do_sample=True,
             temperature=0.6, top_p=0.9, num_beams=4)
    loaded = load_model_folder(tmp_path)
    rules = loaded.generation
    assert "not applied: min_new_tokens" in rules.describe() and not rules.problem
    assert set(rules.ignored) == {"do_sample", "temperature", "top_p", "num_beams"}
    _, session = generate(loaded, PROMPT, 2)  # the app's settings: greedy, temperature 1, top-p off
    assert session.settings.strategy == "greedy" and session.settings.temperature == 1.0 and session.stop_tokens == {4, 6}
