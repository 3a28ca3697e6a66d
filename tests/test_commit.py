"""Several renames decided by one commit record: after a crash at any point, the files are all old or all new."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import iostack.commit as commit_mod
from iostack.commit import COMMIT, commit, finish, pending
from iostack.errors import StoreError


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs."""


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5), crash_at=st.integers(0, 7))
def test_a_crash_at_any_rename_leaves_all_old_or_all_new(tmp_path_factory, n, crash_at):
    d = tmp_path_factory.mktemp("c")
    names = [f"f{i}" for i in range(n)]
    for name in names:
        (d / name).write_text("old " + name)
        (d / (name + ".new")).write_text("new " + name)
    calls, real = [0], os.replace

    def dying(a, b):  # the record's rename is call 1, then one per file
        calls[0] += 1
        if calls[0] > crash_at:
            raise Crash
        real(a, b)

    commit_mod.os.replace = dying
    try:
        commit(d, [(name + ".new", name) for name in names], fsync=False)
    except Crash:
        pass
    finally:
        commit_mod.os.replace = real
    decided = crash_at >= 1  # the record made it into place
    assert pending(d) == (decided and crash_at < n + 1)
    finish(d, fsync=False)  # what the next load_placement does
    want = "new" if decided else "old"
    assert [(d / name).read_text() for name in names] == [f"{want} {name}" for name in names]
    assert not (d / COMMIT).exists()


def test_a_missing_staged_file_renames_nothing(tmp_path):
    (tmp_path / "a").write_text("old")
    (tmp_path / "a.new").write_text("new")
    with pytest.raises(StoreError, match="staged file is missing"):
        commit(tmp_path, [("a.new", "a"), ("b.new", "b")], fsync=False)
    assert (tmp_path / "a").read_text() == "old" and not pending(tmp_path)


def test_an_unreadable_record_is_refused_naming_it(tmp_path):
    (tmp_path / COMMIT).write_text("{not json")
    with pytest.raises(StoreError, match="commit record"):
        finish(tmp_path)
