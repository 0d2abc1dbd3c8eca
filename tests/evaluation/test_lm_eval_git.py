"""lm-eval's git-commit lookup is quiet outside a checkout (no "fatal: not a git repository")."""

from __future__ import annotations


def test_lm_eval_git_lookup_is_quiet_outside_a_checkout(tmp_path, monkeypatch, capfd):
    import lm_eval.evaluator as ev

    from gac.evaluation.tasks import _quiet_git_hash

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    ev.get_git_commit_hash()  # lm-eval's own lookup: git complains on stderr
    assert "not a git repository" in capfd.readouterr().err
    original = ev.get_git_commit_hash
    with _quiet_git_hash():
        assert ev.get_git_commit_hash() is None
    assert ev.get_git_commit_hash is original
    assert "not a git repository" not in capfd.readouterr().err
