"""The local Hugging Face cache: listing, org/name resolution, loading a real snapshot layout, the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from desktop_app import cli
from desktop_app.core.checkpoints import ModelLoadError, load_model_folder
from desktop_app.core.hf_cache import (NotInCacheError, cache_roots, list_cached_models, resolve_model_ref,
                                       snapshot_repo_ref)
from fake_hf_cache import TEXT, add_snapshot, make_fake_cache, point_at, tiny_model_files


@pytest.fixture
def cache(tmp_path, monkeypatch):
    cache = make_fake_cache(tmp_path)
    point_at(monkeypatch, cache, tmp_path / "home")
    return cache


def test_cache_roots_follow_huggingface_hub_precedence(tmp_path, monkeypatch):
    point_at(monkeypatch, tmp_path / "hub-cache", tmp_path / "home")
    assert cache_roots() == [tmp_path / "hub-cache", tmp_path / "home" / "hf-home" / "hub",
                             tmp_path / "home" / "xdg-cache" / "huggingface" / "hub"]
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HF_HOME")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_roots() == [tmp_path / "home" / ".cache" / "huggingface" / "hub"]


def test_lists_each_snapshot_with_family_size_and_support(cache):
    rows = list_cached_models()
    assert [(m.repo_id, m.revision[:1], m.refs) for m in rows] == [
        ("other-org/mamba-tiny", "c", ("main",)),
        ("tiny-org/tiny-gpt2", "b", ("main",)),  # the current revision first
        ("tiny-org/tiny-gpt2", "a", ()),
    ]
    mamba, gpt2 = rows[0], rows[1]
    assert gpt2.model_type == "gpt2" and gpt2.supported and gpt2.reason == ""
    assert gpt2.folder == cache / "models--tiny-org--tiny-gpt2" / "snapshots" / ("b" * 40)
    assert gpt2.weights_bytes == (gpt2.folder / "model.safetensors").resolve().stat().st_size > 1000
    assert not mamba.supported and "'mamba' is not supported" in mamba.reason
    assert gpt2.ref_text == "tiny-org/tiny-gpt2" and rows[2].ref_text == "tiny-org/tiny-gpt2@" + "a" * 12


def test_pickle_only_and_dangling_snapshots_are_listed_not_supported(cache, tmp_path):
    files = tiny_model_files(tmp_path)
    add_snapshot(cache, "old/pickled", {"config.json": files["config.json"], "pytorch_model.bin": b"x" * 10}, "d" * 40)
    row = next(m for m in list_cached_models() if m.repo_id == "old/pickled")
    assert not row.supported and "pickle" in row.reason and row.weights_bytes == 10


def test_resolve_model_ref(cache, tmp_path):
    snaps = cache / "models--tiny-org--tiny-gpt2" / "snapshots"
    assert resolve_model_ref("tiny-org/tiny-gpt2") == snaps / ("b" * 40)
    assert resolve_model_ref("tiny-org/tiny-gpt2@main") == snaps / ("b" * 40)
    assert resolve_model_ref("tiny-org/tiny-gpt2@aaaaaaa") == snaps / ("a" * 40)
    assert resolve_model_ref(str(tmp_path)) == tmp_path  # a path that exists wins
    assert resolve_model_ref("no-such-folder") == Path("no-such-folder")  # a bare word: left to the loader
    with pytest.raises(NotInCacheError) as err:
        resolve_model_ref("nobody/nothing")
    msg = str(err.value)
    assert msg.startswith("nobody/nothing is not a folder, and not in the local Hugging Face cache (looked in: ")
    assert str(cache) in msg and msg.endswith("nothing is downloaded")


def test_snapshot_of_links_into_blobs_loads_and_runs(cache, tmp_path):
    """The real layout (every file a relative link into blobs/) loads, and computes what the folder
    it was copied from computes."""
    loaded = load_model_folder(resolve_model_ref("tiny-org/tiny-gpt2"))
    original = load_model_folder(tmp_path / "saved-model")
    assert loaded.tokenizer is not None
    ids = torch.tensor([loaded.tokenizer.encode(TEXT)])
    logits = loaded.model(ids).logits
    assert logits.shape == (1, len(TEXT), loaded.config.vocab_size)
    assert torch.equal(logits, original.model(ids).logits)


def test_cli_info_takes_org_name(cache, capsys):
    assert cli.main(["info", "tiny-org/tiny-gpt2"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == "gpt2" and info["n_layers"] == 1 and info["d_model"] == 16


def test_cli_org_name_not_in_cache_is_one_line_and_exit_2(cache, capsys):
    assert cli.main(["info", "nobody/nothing"]) == cli.EXIT_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nobody/nothing is not a folder, and not in the local Hugging Face cache" in err[0]


def test_cli_plain_missing_folder_still_says_no_such_folder(cache, tmp_path, capsys):
    assert cli.main(["info", str(tmp_path / "missing")]) == cli.EXIT_INPUT
    assert "no such folder" in capsys.readouterr().err


def test_supported_families_come_from_the_families_registry_when_it_exists(cache, monkeypatch):
    """The registry is read when the listing runs, not at import; the loader still has the last word."""
    import sys
    import types

    registry = types.ModuleType("desktop_app.core.families")
    registry.REGISTRY = {"gpt2": object()}
    monkeypatch.setitem(sys.modules, "desktop_app.core.families", registry)
    rows = {m.repo_id: m for m in list_cached_models()}
    assert "(supported: gpt2)" in rows["other-org/mamba-tiny"].reason
    registry.REGISTRY = {"gpt2": object(), "mamba": object()}
    mamba = next(m for m in list_cached_models() if m.repo_id == "other-org/mamba-tiny")
    assert not mamba.supported and "unknown model_type 'mamba'" in mamba.reason  # read_config's own word


def test_bare_repo_names_and_unknown_revisions(cache, tmp_path):
    """Legacy repositories without an org ('gpt2' is models--gpt2) resolve when cached; a revision
    the cache lacks is named in the error."""
    snap = add_snapshot(cache, "tiny", tiny_model_files(tmp_path), "e" * 40)
    assert resolve_model_ref("tiny") == snap
    assert next(m for m in list_cached_models() if m.repo_id == "tiny").supported
    with pytest.raises(NotInCacheError, match=r"^tiny-org/tiny-gpt2@v9 is not a folder"):
        resolve_model_ref("tiny-org/tiny-gpt2@v9")


def test_snapshot_repo_ref_names_a_snapshot_by_its_repository(cache, tmp_path):
    snaps = cache / "models--tiny-org--tiny-gpt2" / "snapshots"
    assert snapshot_repo_ref(snaps / ("b" * 40)) == "tiny-org/tiny-gpt2"
    assert snapshot_repo_ref(snaps / ("a" * 40)) == "tiny-org/tiny-gpt2@" + "a" * 12
    assert snapshot_repo_ref(tmp_path / "saved-model") is None


# -- one rule: a ref holds the commit id of a snapshot in the cache; files link only into its blobs/ --


def _outside_model(tmp_path: Path) -> Path:
    """A real model folder outside the cache (what a bad ref or link would lead to)."""
    outside = tmp_path / "outside-model"
    outside.mkdir()
    for name, data in tiny_model_files(tmp_path).items():
        (outside / name).write_bytes(data)
    return outside


@pytest.mark.parametrize("ref", ["../..", "../../../../outside-model", "ABSOLUTE"])
def test_a_ref_that_is_not_a_commit_id_is_refused_naming_the_ref(cache, tmp_path, ref):
    """refs/main holding '../..' or an absolute path loaded a folder outside the cache."""
    outside = _outside_model(tmp_path)
    ref = str(outside) if ref == "ABSOLUTE" else ref
    repo = cache / "models--tiny-org--tiny-gpt2"
    (repo / "refs" / "main").write_text(ref)
    with pytest.raises(NotInCacheError) as err:
        resolve_model_ref("tiny-org/tiny-gpt2")
    assert str(err.value) == f"{repo / 'refs' / 'main'}: holds {ref!r}, not a commit id (40 hex digits); refused"


def test_a_ref_naming_a_missing_snapshot_is_refused_not_replaced(cache, tmp_path):
    """With one snapshot present, a ref naming another one silently loaded the one present."""
    add_snapshot(cache, "solo/model", tiny_model_files(tmp_path), "a" * 40, main=False)
    repo = cache / "models--solo--model"
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("f" * 40)
    with pytest.raises(NotInCacheError, match=rf"^{repo / 'refs' / 'main'}: names revision f{{40}}, which is not a "
                                              r"snapshot in the cache \(.* is missing or a link elsewhere\); refused$"):
        resolve_model_ref("solo/model")
    (repo / "refs" / "main").write_text("a" * 40)
    assert resolve_model_ref("solo/model") == repo / "snapshots" / ("a" * 40)


def test_a_snapshot_folder_linked_out_of_the_cache_is_not_a_snapshot(cache, tmp_path):
    outside = _outside_model(tmp_path)
    repo = cache / "models--linked--out"
    (repo / "snapshots").mkdir(parents=True)
    (repo / "snapshots" / ("d" * 40)).symlink_to(outside)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("d" * 40)
    with pytest.raises(NotInCacheError, match="a link elsewhere"):
        resolve_model_ref("linked/out")
    assert "linked/out" not in {m.repo_id for m in list_cached_models()}


def test_cli_bad_ref_is_one_line_and_exit_2(cache, capsys):
    (cache / "models--tiny-org--tiny-gpt2" / "refs" / "main").write_text("../..")
    assert cli.main(["info", "tiny-org/tiny-gpt2"]) == cli.EXIT_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refs/main: holds '../..', not a commit id" in err[0]


def test_a_snapshot_file_linked_outside_its_blobs_is_refused_and_listed_so(cache, tmp_path):
    """model.safetensors in a snapshot linking outside the repository's blobs/ was followed (the same
    link through a shard index was refused)."""
    outside = _outside_model(tmp_path)
    snap = add_snapshot(cache, "leaky/model", tiny_model_files(tmp_path), "e" * 40)
    (snap / "model.safetensors").unlink()
    (snap / "model.safetensors").symlink_to(outside / "model.safetensors")
    with pytest.raises(ModelLoadError) as err:
        load_model_folder(resolve_model_ref("leaky/model"))
    assert err.value.path == snap / "model.safetensors"
    assert f"a link to {outside / 'model.safetensors'}, outside the model folder; refused" in str(err.value)
    row = next(m for m in list_cached_models() if m.repo_id == "leaky/model")
    assert not row.supported and "outside the model folder" in row.reason


def test_a_snapshot_linking_into_another_repositorys_blobs_is_refused(cache, tmp_path):
    snap = add_snapshot(cache, "borrower/model", tiny_model_files(tmp_path), "e" * 40)
    other_blob = next((cache / "models--tiny-org--tiny-gpt2" / "blobs").iterdir())
    (snap / "config.json").unlink()
    (snap / "config.json").symlink_to(other_blob)
    with pytest.raises(ModelLoadError, match="config.json: a link to .*models--tiny-org--tiny-gpt2/blobs/.*, "
                                             "outside the model folder"):
        load_model_folder(snap)


def test_an_encoder_decoder_in_the_cache_is_listed_as_such(cache, tmp_path):
    add_snapshot(cache, "google/pegasus-tiny", {"config.json": json.dumps({"model_type": "pegasus"}).encode(),
                                               "model.safetensors": b"x"}, "f" * 40)
    row = next(m for m in list_cached_models() if m.repo_id == "google/pegasus-tiny")
    assert not row.supported and row.reason == "encoder-decoder models (pegasus) are not supported yet"


def test_a_cached_config_json_of_gigabytes_is_not_read_to_list_the_cache(cache, tmp_path):
    """Listing the cache read each snapshot's config.json whole (json.loads of read_text): a 2 GB one took 2 GB.
    It goes through files.read_json, capped: listed, not supported, within a few MB."""
    import tracemalloc

    files = tiny_model_files(tmp_path)
    add_snapshot(cache, "big/config", {"config.json": files["config.json"], "model.safetensors": b"x" * 10}, "e" * 40)
    config = cache / "models--big--config" / "snapshots" / ("e" * 40) / "config.json"
    with open(config.resolve(), "r+b") as fh:
        fh.truncate(2 << 30)  # sparse
    tracemalloc.start()
    try:
        row = next(m for m in list_cached_models() if m.repo_id == "big/config")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not row.supported and row.reason.startswith("config.json is 2,147,483,648 bytes"), row.reason
    assert peak < 64 << 20, peak  # (the other snapshots listed beside it: some MB)


def test_a_cached_config_json_that_cannot_be_used_is_listed_with_what_is_wrong(cache, tmp_path):
    """The listing's reason for a config.json it could not use was always 'config.json names no model_type (or
    cannot be read)': a file of gigabytes, malformed JSON and one without model_type all read alike. Now each
    says what is wrong, in read_json's words."""
    files = tiny_model_files(tmp_path)
    no_type = {k: v for k, v in json.loads(files["config.json"]).items() if k != "model_type"}
    cases = {"big/config": files["config.json"], "bad/json": b'{"model_type": "gpt2",',
             "no/type": json.dumps(no_type).encode()}
    for i, (repo, config) in enumerate(cases.items()):
        add_snapshot(cache, repo, {"config.json": config, "model.safetensors": b"x" * 10}, str(i) * 40)
    with open((cache / "models--big--config" / "snapshots" / ("0" * 40) / "config.json").resolve(), "r+b") as fh:
        fh.truncate(20 << 20)  # sparse: 20 MB, beyond read_json's 16 MB cap
    reasons = {m.repo_id: m.reason for m in list_cached_models() if m.repo_id in cases}
    assert reasons == {
        "big/config": "config.json is 20,971,520 bytes, not a settings file (at most 16,777,216 are read)",
        "bad/json": "config.json: malformed JSON at line 1, column 23: Expecting property name enclosed in double quotes",
        "no/type": "config.json names no model_type"}, reasons
