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


def test_two_nodes_putting_back_appends_to_one_input_at_once_keep_both(tmp_path, monkeypatch):
    """The eleventh adversarial pass, N2: four nodes appended to one prefetched input and returned
    at once, and one append was lost (1 run in 14): each put back its copy at the end of the file
    it saw, the later writing over the other's bytes. A put back holds its file's record. Made
    certain here: the first put pauses as it writes until the second is writing too, or half a
    second has passed (the second waiting for the record); both nodes' bytes are kept, once each."""
    import threading

    from sea import stager
    from sea.view import put_input_back

    data, copies = tmp_path / "data", tmp_path / "copies"
    data.mkdir(), copies.mkdir()
    original = data / "events.tsv"
    original.write_bytes(b"onset\tduration\n")
    as_copied = stager.identity(original.stat())
    appended = {"a": b"1\t2\n" * 1024, "b": b"3\t4\n" * 1024}
    for node, lines in appended.items():
        (copies / node).write_bytes(original.read_bytes() + lines)
    began = copies / "prefetched"  # the copy the nodes were given, as it was
    began.write_bytes(original.read_bytes())
    writing, overlapped, second_writing, failed = [], [], threading.Event(), []
    copy_data = stager._copy_data

    def pausing(*args, **kwargs):
        writing.append(threading.current_thread().name)
        if len(writing) == 1:
            overlapped.append(second_writing.wait(timeout=0.5))
        else:
            second_writing.set()
        return copy_data(*args, **kwargs)

    def put(node):
        try:
            put_input_back(records, str(data), original.name, str(copies / node), str(original), as_copied, began)
        except OSError as e:
            failed.append(f"{node}: {e}")

    monkeypatch.setattr(stager, "_copy_data", pausing)
    records = PutRecords.shared(tmp_path / "puts")
    nodes = [threading.Thread(target=put, args=(node,), name=node) for node in appended]
    for node in nodes:
        node.start()
    for node in nodes:
        node.join(timeout=30)
    records.close()
    assert not failed and len(writing) == 2, failed
    first, second = writing
    assert original.read_bytes() == b"onset\tduration\n" + appended[first] + appended[second], "a node's appends were lost"
    assert overlapped == [False], "the second put wrote while the first was writing"
