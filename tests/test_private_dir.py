"""Sea's private directory on a tier (:mod:`sea.private`) used from several threads at once, as a
Dask worker does when the client ends the run (``close_run``, in the worker's event loop) while a
node that was running there removes what it wrote (its task's thread)."""

from __future__ import annotations

import threading

from sea.private import PrivateDir


def _tree(private: PrivateDir, nodes: int = 4, files: int = 30) -> None:
    for n in range(nodes):
        node = private.path / "wf" / f"node{n}"
        node.mkdir(parents=True)
        for f in range(files):
            (node / f"f{f}").write_bytes(b"x")


def _at_once(private: PrivateDir, removals: list[str | None]) -> list[BaseException]:
    """Each removal in a thread of its own, started together: a node's directory, or (None) the whole."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(removals))

    def remove(node: str | None) -> None:
        start.wait()
        try:
            if node is None:
                private.remove_all()
            else:
                private.remove(private.path / "wf" / node)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=remove, args=(node,)) for node in removals]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_removals_from_several_threads_neither_fail_nor_leave_anything(tmp_path):
    """Seen in CI: the run's end removed the directory whole (``remove_all``) while the task of a
    node that was running did the same after removing its own directory; one closed the descriptor
    the other was removing through (``OSError: [Errno 9] Bad file descriptor``), which ended a
    stopped SeaDask run without its report. A closed descriptor's number is soon another file's:
    no removal may go through one."""
    for round_ in range(60):
        root = tmp_path / str(round_)
        root.mkdir()
        private = PrivateDir.create(root, owner="test")
        _tree(private)
        errors = _at_once(private, ["node0", "node1", None, None])
        assert errors == [], f"round {round_}: {errors[0]!r}"
        assert list(root.iterdir()) == [], f"round {round_}: left {list(root.rglob('*'))[:5]}"
