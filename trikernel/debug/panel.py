"""The Variables panel's requests while no thread is stopped: their jobs and deadlines.

``inspectVariables``, ``variables``, ``richInspectVariables`` and
``modules`` are answered by the kernel itself while no thread is stopped
(debugger.py). Their work touches user objects and so runs in the main
user run (variables.py, issue 26.2); :class:`VariablesPanel` starts it
there as a :class:`~trikernel.core.job.Job` (``start_task_soon``, as the
start of debugpy) and waits for it at most :data:`VARIABLES_TIMEOUT`. A
job waits while a cell runs that does not yield (the main thread is
busy), and runs as long as a slow ``__repr__`` takes; past the deadline
the request is answered without it (docs/debugger.md, "While a cell
runs"), and control, shell and IOPub never wait at all. At a stop,
debugpy answers ``variables`` itself (unchanged).

Runs on: the io run (every method); the jobs' bodies in the main user run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from trikernel.core.job import Job
from trikernel.debug.variables import VariableExplorer, list_modules, rich_inspect
from trikernel.errors import KernelShuttingDown

if TYPE_CHECKING:
    from collections.abc import Callable

    from IPython.core.interactiveshell import InteractiveShell

    from trikernel.core.interfaces import UserRunHandle

#: Seconds a Variables request waits for its job in the main user run.
VARIABLES_TIMEOUT = 5.0
#: What stands for a value the request could not wait for.
BUSY = "… (the kernel is busy: a cell is running, or a value is slow to show; shown when it is idle)"
_BUSY_VARIABLE = {"name": "…", "value": BUSY, "type": "", "variablesReference": 0}


class VariablesPanel:
    """The io side of the Variables panel while no thread is stopped.

    Args:
        user_run: the main user run, where every job goes.

    Each request method returns the DAP response's body (plain data), or a
    str: the message of a failed response. One ``inspectVariables`` job at
    a time: requests that come while it is under way share it (JupyterLab
    asks again at every IOPub message of a running cell).

    Runs on: the io run.
    """

    def __init__(self, user_run: UserRunHandle):
        self._user_run = user_run
        #: the explorer and its references: touched only in the user run
        self.explorer = VariableExplorer()
        self._listing: Job | None = None
        self._last_listing: list[dict[str, Any]] | None = None

    def _job(self, fn: Callable[[], Any]) -> Job | None:
        job = Job(_async(fn))
        try:
            self._user_run.start_task_soon(job)
        except KernelShuttingDown:
            return None
        return job

    async def _wait(self, job: Job | None) -> Any:
        """``job``'s result; :data:`BUSY` (a str) past the deadline, or the failure's message."""
        if job is None:
            return "the kernel is shutting down"
        with trio.move_on_after(VARIABLES_TIMEOUT):
            await job.done.wait()
        if not job.done.is_set():
            return BUSY
        if isinstance(job.error, KeyboardInterrupt):
            return "interrupted"
        if job.error is not None:  # a plain error (core/job.py): its text only
            return f"{getattr(job.error, 'ename', type(job.error).__name__)}: {job.error}"
        return job.result

    async def inspect(self, shell: InteractiveShell) -> dict[str, Any] | str:
        """``inspectVariables``'s body; past the deadline the last listing, so the panel keeps what it showed."""
        explorer, job = self.explorer, self._listing
        if job is None or job.done.is_set():
            job = self._listing = self._job(lambda: explorer.listing(shell))
        result = await self._wait(job)
        if result is BUSY:
            return {"variables": self._last_listing or [_BUSY_VARIABLE]}
        if isinstance(result, str):
            return result
        self._last_listing = result
        return {"variables": result}

    async def children(self, ref: int) -> list[dict[str, Any]] | str | None:
        """``variables`` of reference ``ref``: its children, None for a reference the panel never gave."""
        explorer = self.explorer
        result = await self._wait(self._job(lambda: explorer.children(ref)))
        return [_BUSY_VARIABLE] if result is BUSY else result

    async def rich(self, shell: InteractiveShell, name: str) -> dict[str, Any] | str:
        """``richInspectVariables`` of ``name``: ``{"data": ..., "metadata": ...}``."""
        return await self._wait(self._job(lambda: rich_inspect(shell, name)))  # type: ignore[no-any-return]

    async def modules(self, start: int, count: int) -> dict[str, Any] | str:
        """DAP ``modules``: ``{"modules": [...], "totalModules": n}``."""
        return await self._wait(self._job(lambda: list_modules(start, count)))  # type: ignore[no-any-return]

    def forget(self) -> None:
        """The client disconnected: the explorer drops its references, in the user run."""
        self._last_listing = None
        self._job(self.explorer.reset)


def _async(fn: Callable[[], Any]) -> Callable[[], Any]:
    async def run() -> Any:
        return fn()

    return run
