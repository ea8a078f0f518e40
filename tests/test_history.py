"""trikernel.history.HistoryManager: IPython's history rows, and the main
thread's ``store_inputs`` never waits for the saving thread's SQLite write
(issue 12). In process, with IPython's real HistorySavingThread and a real
SQLite file; a stand-in shell gives only what the manager calls."""

from __future__ import annotations

import sqlite3
import threading
from typing import TYPE_CHECKING, Any

import pytest
from IPython.core.interactiveshell import InteractiveShellABC

from trikernel.user.history import HistoryManager

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

DEADLINE = 10.0


class StandInShell:
    """What HistoryManager uses of its shell: the execution count and push()."""

    execution_count = 1

    def __init__(self) -> None:
        self.user_ns: dict[str, Any] = {}

    def push(self, variables: dict[str, Any], interactive: bool = True) -> None:
        self.user_ns.update(variables)


InteractiveShellABC.register(StandInShell)


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[HistoryManager]:
    hm = HistoryManager(shell=StandInShell(), hist_file=str(tmp_path / "history.sqlite"))
    try:
        yield hm
    finally:
        hm.save_thread.stop()
        hm.db.close()


def rows(hm: HistoryManager, table: str = "history") -> list[tuple[Any, ...]]:
    con = sqlite3.connect(hm.hist_file)
    try:
        return con.execute(f"SELECT * FROM {table} ORDER BY session, line").fetchall()
    finally:
        con.close()


def test_inputs_and_outputs_are_the_rows_ipython_writes(manager: HistoryManager) -> None:
    manager.db_log_output = True
    manager.store_inputs(1, "a = 1", "a = 1")
    manager.store_inputs(2, "a", "a")
    manager.output_hist_reprs[2] = "1"
    manager.store_output(2)
    manager.writeout_cache()
    s = manager.session_number
    assert rows(manager) == [(s, 1, "a = 1", "a = 1"), (s, 2, "a", "a")]
    assert rows(manager, "output_history") == [(s, 2, "1")]
    assert [(line, src) for _, line, src in manager.get_tail(5, include_latest=True)] == [(1, "a = 1"), (2, "a")]


def test_a_slow_write_does_not_hold_up_the_next_cell(manager: HistoryManager) -> None:
    """IPython's writeout_cache holds db_input_cache_lock across the commit,
    so store_inputs (the start of every run_cell) waited for it."""
    entered, release = threading.Event(), threading.Event()
    insert = manager._insert_inputs

    def slow_insert(conn: sqlite3.Connection, batch: list[tuple[Any, ...]]) -> None:
        entered.set()
        release.wait(DEADLINE)
        insert(conn, batch)

    manager._insert_inputs = slow_insert  # type: ignore[method-assign]
    manager.store_inputs(1, "x = 1")  # db_cache_size 0: the saving thread writes it now
    assert entered.wait(DEADLINE), "the saving thread never wrote"
    second = threading.Thread(target=manager.store_inputs, args=(2, "y = 2"))
    second.start()
    second.join(2.0)  # well inside the slow write's DEADLINE
    try:
        assert not second.is_alive(), "store_inputs waited for the saving thread's write"
        assert not release.is_set()  # the first write was still in progress all along
    finally:
        release.set()
        second.join(DEADLINE)
    # a main-thread writer (get_tail, end_session) waits for the write in flight
    manager.writeout_cache()
    assert [r[1:3] for r in rows(manager)] == [(1, "x = 1"), (2, "y = 2")]


def test_a_duplicate_line_moves_history_to_a_new_session(
    manager: HistoryManager, capsys: pytest.CaptureFixture[str]
) -> None:
    manager.store_inputs(1, "a = 1")
    manager.writeout_cache()
    first = manager.session_number
    manager.db_input_cache.append((1, "b = 2", "b = 2"))  # the same line number again
    manager.writeout_cache()
    assert manager.session_number > first
    assert "History logging moved to new session" in capsys.readouterr().out
    assert [r[:3] for r in rows(manager)] == [(first, 1, "a = 1"), (manager.session_number, 1, "b = 2")]
