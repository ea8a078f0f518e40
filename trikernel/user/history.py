"""IPython's history manager, without a lock wait on the path of every cell.

IPython's ``HistoryManager.writeout_cache`` holds ``db_input_cache_lock``
(and then ``db_output_cache_lock``) for the whole SQLite transaction,
commit included. It runs on IPython's history-saving thread after every
cell (``db_cache_size`` is 0 by default, so each cell is written at once),
and ``store_inputs``, which every ``run_cell`` calls on the main thread
before the cell runs, takes the same lock: a cell sent while the previous
cell's input is being committed waits for the commit. py-spy put a
quarter of the main thread's samples during ``execute_request`` messages
of ``pass`` sent back to back at that lock (waiting for it, or for the GIL
after it). On a local disk a commit takes about 0.4 ms and removing the
wait changed the back-to-back round trip by 2 % (``bench/latency.py``'s
client, issue 12). Where a commit is slow (a home directory on NFS) each
cell of a Run All waits for the previous cell's commit: with a write made
to take 20 ms, 100 cells 1 ms apart spent 1.98 s in ``store_inputs`` with
IPython's class and 1 ms with this one.

:class:`HistoryManager` writes the same rows (IPython's schema and its
handling of a duplicate session/line) but holds the cache locks only to
take the pending rows; the SQLite write happens under a lock of its own,
so two writers (the saving thread and a main-thread caller such as
``get_tail`` for a ``history_request``, or ``end_session``) still run one
at a time, and a reader that writes out first sees the rows in flight.
Every cell is still written as soon as it ran.

Threads: ``writeout_cache`` runs on the history-saving thread and on the
main thread; the rest is IPython's.

Runs on: IPython's history-saving thread and every user thread that
runs a cell or a history request (``writeout_cache`` serialises the
database writes with a lock of its own).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from typing import Any

from IPython.core.history import HistoryManager as _IPythonHistoryManager

__all__ = ["HistoryManager"]


class HistoryManager(_IPythonHistoryManager):
    """IPython's HistoryManager; ``writeout_cache`` never holds the cache
    locks across a database write (see the module docstring)."""

    def __init__(self, **kwargs: Any):
        self._write_lock = threading.RLock()  # re-entrant: IPython code it calls may write out too
        super().__init__(**kwargs)

    def writeout_cache(self, conn: sqlite3.Connection | None = None) -> None:
        """Write the pending input and output rows to the database.

        Same rows and errors as IPython's: a duplicate session/line for
        input moves history to a new session (printed) and writes there; for
        output the rows are not stored (printed). Any thread.
        """
        if not self.enabled:
            return
        if conn is None:
            conn = self.db
        with self._write_lock:
            with self.db_input_cache_lock:
                inputs, self.db_input_cache = self.db_input_cache, []
            if inputs:
                try:
                    self._insert_inputs(conn, inputs)
                except sqlite3.IntegrityError:
                    self.new_session(conn)
                    print(
                        "ERROR! Session/line number was not unique in",
                        "database. History logging moved to new session",
                        self.session_number,
                    )
                    # once more in the new session; if that fails too, don't recurse
                    with contextlib.suppress(sqlite3.IntegrityError):
                        self._insert_inputs(conn, inputs)
            # taken only now, as IPython does: if the input write raised
            # (a locked or read-only database), the output rows stay pending
            with self.db_output_cache_lock:
                outputs, self.db_output_cache = self.db_output_cache, []
            if outputs:
                try:
                    with conn:
                        conn.executemany(
                            "INSERT INTO output_history VALUES (?, ?, ?)",
                            [(self.session_number, *row) for row in outputs],
                        )
                except sqlite3.IntegrityError:
                    print(
                        "!! Session/line number for output was not unique",
                        "in database. Output will not be stored.",
                    )

    def _insert_inputs(self, conn: sqlite3.Connection, inputs: list[tuple[Any, ...]]) -> None:
        with conn:
            conn.executemany("INSERT INTO history VALUES (?, ?, ?, ?)", [(self.session_number, *row) for row in inputs])
