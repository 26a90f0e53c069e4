"""Issue 30: a cached model whose revisions are training steps (Pythia's step1000 branches, refs/step1000) has a
timeline: core.hf_cache lists the step revisions and their snapshots; app.timeline's timeline_of / open_step
give the timeline bar its steps and open each step's snapshot."""
from __future__ import annotations

import pytest
import torch

from desktop_app.app.timeline import open_step, run_of, step_model_folder, timeline_of
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.hf_cache import (NotInCacheError, resolve_model_ref, step_of_snapshot, step_revisions,
                                       step_snapshot)
from desktop_app.core.training.timeline import KeptStepError
from fake_hf_cache import STEP_REPO, STEPS, add_snapshot, add_step_revisions, point_at, step_revision, tiny_model_files


@pytest.fixture
def cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    point_at(monkeypatch, cache, tmp_path / "home")
    return cache


def _weights(folder):
    return load_model_folder(folder).model.state_dict()


def test_step_revisions_are_listed_in_order_of_step_with_their_snapshots(cache, tmp_path):
    repo = add_step_revisions(cache, tmp_path, missing=(512,))
    (repo / "refs" / "step7").write_text("../../etc")  # not a commit id: left out, never read as a path
    (repo / "refs" / "stepping").write_text(step_revision(0))  # not a step name
    (repo / "refs" / "pr").mkdir()
    (repo / "refs" / "pr" / "step3").write_text(step_revision(0))  # a pull request's ref, not a branch
    revs = step_revisions(repo)
    assert [(r.step, r.ref, r.present) for r in revs] == [(0, "step0", True), (512, "step512", False),
                                                         (1000, "step1000", True)]
    assert revs[0].folder == repo / "snapshots" / step_revision(0)
    assert step_snapshot(repo, 1000) == repo / "snapshots" / step_revision(1000)
    assert step_of_snapshot(revs[0].folder) == 0 and step_of_snapshot(repo / "snapshots" / ("0" * 40)) is None
    with pytest.raises(NotInCacheError, match=r"refs/step512: names revision .* not a snapshot in the cache"):
        step_snapshot(repo, 512)
    with pytest.raises(NotInCacheError, match=r"no revision step5 .*its step revisions: 0, 1000\)"):
        step_snapshot(repo, 5)
    assert resolve_model_ref(f"{STEP_REPO}@step0") == revs[0].folder  # the CLI's org/name@step0 already


def test_a_snapshot_of_a_step_revision_has_a_timeline_and_each_step_opens_its_own_weights(cache, tmp_path):
    repo = add_step_revisions(cache, tmp_path)
    main = resolve_model_ref(STEP_REPO)  # main points at step1000's revision
    assert run_of(main) == (repo, None)
    tl, step = timeline_of(main)
    assert step == 1000 and tl.latest_step == 1000 and tl.run_dir == repo
    assert [k.step for k in tl.openable()] == list(STEPS) and tl.curve.steps == []
    for s in STEPS:
        folder = step_model_folder(repo, s)
        assert folder == repo / "snapshots" / step_revision(s)
        assert step_model_folder(main, s) == folder  # from a snapshot too
        got, want = open_step(repo, s).model.state_dict(), _weights(folder)
        assert all(torch.equal(got[k], want[k]) for k in want)
    first, last = _weights(step_model_folder(repo, 0)), _weights(step_model_folder(repo, 1000))
    assert not all(torch.equal(first[k], last[k]) for k in first)  # the steps are different models
    assert timeline_of(step_model_folder(repo, 512))[1] == 512
    with pytest.raises(KeptStepError, match=r"models--tiny-org--tiny-pythia: no revision step3 "):
        step_model_folder(repo, 3)


def test_main_that_is_no_step_shows_the_timeline_at_no_step(cache, tmp_path):
    repo = add_step_revisions(cache, tmp_path, main_step=-1)
    tl, step = timeline_of(resolve_model_ref(STEP_REPO))
    assert step is None and tl.latest_step == 1000 and [k.step for k in tl.openable()] == list(STEPS)


def test_no_timeline_for_a_cached_model_with_fewer_than_two_step_revisions_there(cache, tmp_path):
    add_snapshot(cache, "tiny-org/plain", tiny_model_files(tmp_path), "b" * 40)  # main only
    assert timeline_of(resolve_model_ref("tiny-org/plain")) is None
    add_step_revisions(cache, tmp_path, repo_id="tiny-org/one-left", missing=(0, 512))
    assert timeline_of(resolve_model_ref("tiny-org/one-left")) is None
    assert run_of(tmp_path / "hf-cache") is None and run_of(tmp_path) is None  # not snapshots


def test_a_step_revision_is_named_by_its_ref_not_its_hash(cache, tmp_path):
    from desktop_app.core.hf_cache import list_cached_models, snapshot_repo_ref

    repo = add_step_revisions(cache, tmp_path)
    assert snapshot_repo_ref(repo / "snapshots" / step_revision(512)) == f"{STEP_REPO}@step512"
    assert snapshot_repo_ref(repo / "snapshots" / step_revision(1000)) == STEP_REPO  # main
    names = sorted(m.ref_text for m in list_cached_models())
    assert names == [STEP_REPO, f"{STEP_REPO}@step0", f"{STEP_REPO}@step512"]
    assert load_model_folder(resolve_model_ref(names[1])).name == names[1]  # the name opens that revision


def test_a_step_ref_in_other_digits_is_no_step(cache, tmp_path):
    """_STEP_REF's \\d took any script's digits: refs/step٣ (Arabic-Indic three) and refs/step３ (full-width)
    were listed as step 3 (int() reads them). Only ASCII digits name a step, as the Hub's branches do."""
    repo = add_step_revisions(cache, tmp_path)
    for name in ("step\u0663", "step\uff13", "step1\u0660"):
        (repo / "refs" / name).write_text(step_revision(0))
    assert [r.ref for r in step_revisions(repo)] == ["step0", "step512", "step1000"]
    from desktop_app.core.hf_cache import _REPO_REF

    assert _REPO_REF.match(f"{STEP_REPO}@step\u0663") is None and _REPO_REF.match("org/mod\u00e8le") is None
    assert _REPO_REF.match(f"{STEP_REPO}@step3")["rev"] == "step3"
