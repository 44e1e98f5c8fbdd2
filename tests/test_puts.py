"""The record of the files nodes put back beside their directories, shared by the user's runs on a
node (sea.puts): its place is refused when someone else could have made it, and the last run out
removes it."""

from __future__ import annotations

import os

import pytest

from sea.puts import PutRecords


def test_the_last_run_out_removes_the_records_and_not_before(tmp_path):
    where, data = tmp_path / "puts", tmp_path / "data"
    data.mkdir()
    first, second = PutRecords.shared(where), PutRecords.shared(where)
    with first.record(str(data), "notes.txt") as noted:
        noted.write("7 12\n")
    first.close()
    with second.record(str(data), "notes.txt") as noted:
        assert noted.read() == "7 12\n", "the first run out removed what a run under way still needs"
    assert oct(where.stat().st_mode & 0o777) == "0o700"
    second.close()
    assert not where.exists()
    third = PutRecords.shared(where)  # made again by the next run
    with third.record(str(data), "notes.txt") as noted:
        assert noted.read() == ""
    third.close()


@pytest.mark.parametrize("made", ["a link", "writable by others", "another user's"])
def test_a_place_someone_else_could_have_made_is_refused_for_the_runs_own_in_one_line(tmp_path, made, caplog):
    where, fallback, target = tmp_path / "puts", tmp_path / "own", tmp_path / "elsewhere"
    target.mkdir()
    if made == "a link":
        where.symlink_to(target)
    else:
        where.mkdir()
        os.chmod(where, 0o777) if made == "writable by others" else os.chown(where, 12345, 12345)
    records = PutRecords.shared(where, fallback=fallback)
    assert records.where == fallback
    said = [r.getMessage() for r in caplog.records if r.name == "sea"]
    assert len(said) == 1 and str(where) in said[0] and "not shared with your other runs" in said[0], said
    with records.record(str(tmp_path), "notes.txt") as noted:
        noted.write("0 1\n")
    records.close()
    assert list(target.iterdir()) == [] and (made == "a link" or list(where.iterdir()) == [])
