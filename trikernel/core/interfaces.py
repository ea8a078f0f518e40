"""The seams of the core: what it needs of the transport and of the user side,
and what the user side needs of the server's services.

xeus's model (``xkernel_core`` talks to ``xserver`` and to the
interpreter's ``*_impl`` through small interfaces): the core
(``trikernel.core``) never sees a socket or IPython. It reaches

- the transport through :class:`Transport` (``trikernel.server`` implements
  it: the only code that writes to a socket);
- the user side through :class:`Interpreter` (the request bodies,
  ``trikernel.user.interpreter``), :class:`UserRunHandle` (a user trio run
  that takes :class:`~trikernel.core.job.Job`\\ s) and
  :class:`SubshellRuns` (JEP 91's threads).

The user side in turn reaches the server's services only through
:class:`IOPubSink`, :class:`InputChannel` and :class:`MessageLogView`, so
``trikernel.user`` imports nothing of ``trikernel.server`` (the launch
layer wires them together: launch/kernel.py).

Each method says which thread may call it.

Runs on: any thread (pure: Protocol classes, no code of their own); each
method says which thread may call it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    import trio

    from trikernel.core.job import Job
    from trikernel.protocol.wire import Message


class Empty:
    """The type of :data:`EMPTY`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "EMPTY"


#: What :meth:`Transport.receive_nowait` returns when nothing is queued.
EMPTY: Final = Empty()


class Transport(Protocol):
    """The kernel's sockets, as the core sees them (server/requests.py)."""

    @property
    def replies_from_threads(self) -> bool:
        """Whether a reply may be sent from the thread that ran its request
        (False with ``--message-log``, which records in the io run only)."""

    def send(self, channel: str, msg: Message, on_sent: Callable[[float], None] | None = None) -> bool:
        """Sign and send a reply on ``channel`` ("shell" or "control").

        A shell reply leaves only after the IOPub messages queued before it
        (it may wait behind them; True then). Returns False when the ROUTER
        cannot route it (the peer is gone or past its high-water mark:
        counted and logged). Never blocks. ``on_sent``: called once the
        reply left (handed to the socket; in the io run when the io run
        sends, as it does every failed execute's reply), with the wall time
        (``time.time()``) taken right before the send.

        Runs on: the io run; for "shell" also the thread that ran the request.
        """

    async def publish(self, msg: Message) -> bool:
        """Queue an IOPub message (status and the like). The io run has an
        overdraft, so this waits only when the queue is full past it;
        False once the queue is closed (shutdown). Runs on: the io run."""

    def publish_status_nowait(self, msg: Message) -> bool:
        """Queue a ``status`` from a user thread without waiting (a credit or
        the io overdraft); False when neither is left, and the io run then
        publishes it. Runs on: any thread but the io thread."""

    def receive_nowait(self, channel: str) -> Message | Empty | None:
        """The next message already queued on ``channel``, parsed; None when
        what was queued was bad input (counted, dropped); :data:`EMPTY` when
        nothing is queued. No checkpoint. Runs on: the io run."""


class UserRunHandle(Protocol):
    """A user trio run that takes jobs (user/userrun.py: the main thread's, or a subshell's)."""

    #: A sequential job is running (read on any thread; the run sets it).
    busy: bool
    #: :meth:`stop` was called (read on any thread).
    stopping: bool
    #: Set when the run has returned (wait on any thread).
    stopped: threading.Event

    def start_job_soon(self, job: Job) -> None:
        """Queue a sequential job (any thread, non-blocking); it runs once
        the concurrent jobs queued before it have ended (a cell sees the
        comm messages sent before it). Raises KernelShuttingDown when the
        run is not or no longer running."""

    def start_task_soon(self, job: Job) -> None:
        """Queue a concurrent job (any thread, non-blocking): the run starts
        its concurrent jobs in the order they were queued, beside the
        sequential lane's job (a comm handler runs while a cell awaits).
        Raises KernelShuttingDown when the run is not running."""

    def interrupt(self) -> None:
        """Interrupt the code the run is running (any thread)."""

    def stop(self) -> None:
        """Ask the run to end after its current job (any thread)."""


class SubshellRun(UserRunHandle, Protocol):
    """One subshell's run (JEP 91), on a thread of its own."""

    @property
    def subshell_id(self) -> str:
        """The id clients address it by."""

    @property
    def ready(self) -> trio.Event:
        """Set (io run's event) once the run takes jobs."""

    @property
    def ended(self) -> trio.Event:
        """Set (io run's event) once the thread's run has returned."""

    @property
    def thread(self) -> threading.Thread:
        """The subshell's thread."""


class SubshellRuns(Protocol):
    """The threads of the subshells (user/subshells.py). The core keeps the
    one list of subshells that exist (:class:`~trikernel.core.lanes.Lanes`);
    this keeps the threads, deleted ones too until they end."""

    def create(self) -> SubshellRun:
        """Start a new subshell's thread; io run."""

    def forget(self, subshell_id: str) -> None:
        """The subshell was deleted (its lane stops its run when done):
        ``%subshell`` no longer names its thread; io run."""

    def interrupt_busy(self) -> None:
        """Interrupt every busy subshell; io run."""

    def stop_all(self) -> None:
        """Shutdown: every subshell ends after its current request; io run."""

    async def wait_stopped(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for the threads, then interrupt; io run."""


class Interpreter(Protocol):
    """The request bodies (user/interpreter.py; xeus's ``*_impl``). Each
    returns the reply content. Runs on: a user run, inside a Job."""

    async def execute(self, msg: Message) -> dict[str, Any]:
        """``execute_request`` → ``execute_reply`` content."""

    def complete(self, msg: Message) -> dict[str, Any]:
        """``complete_request`` → ``complete_reply`` content."""

    def inspect(self, msg: Message) -> dict[str, Any]:
        """``inspect_request`` → ``inspect_reply`` content."""

    def is_complete(self, msg: Message) -> dict[str, Any]:
        """``is_complete_request`` → ``is_complete_reply`` content."""

    def history(self, msg: Message) -> dict[str, Any]:
        """``history_request`` → ``history_reply`` content."""

    def comm(self, msg: Message) -> None:
        """``comm_open`` / ``comm_msg`` / ``comm_close``: run the handlers."""

    def comm_info(self, msg: Message) -> dict[str, Any]:
        """``comm_info_request`` → ``comm_info_reply`` content."""


class IOPubStatistics(Protocol):
    """The one counter user code increments on the IOPub path."""

    silenced: int


class IOPubSink(Protocol):
    """The IOPub queue as user code sees it (server/iopubqueue.py)."""

    #: The queue is closed (shutdown): nothing more is published (read on any thread).
    closed: bool

    @property
    def in_io_thread(self) -> bool:
        """The caller is the io thread (which must never block on the queue)."""

    @property
    def stats(self) -> IOPubStatistics:
        """The counters (``silenced``: output of silent requests dropped)."""

    def put_from_thread(self, msg: Message) -> bool:
        """Queue a signed IOPub message; blocks while the queue is full
        (backpressure). Runs on: any thread but the io thread."""

    def write_stream(self, name: str, text: str, parent: dict[str, Any]) -> None:
        """Append ``text`` to the ``name`` stream ("stdout"/"stderr") under
        ``parent`` (coalesced). Runs on: any thread but the io thread."""

    def flush_stream(self, name: str) -> None:
        """``flush()`` of the ``name`` stream: what it holds leaves now, not at the end of its
        line. Runs on: any thread but the io thread."""


class InputChannel(Protocol):
    """The stdin channel as user code sees it (server/stdin.py)."""

    def request_input(self, parent: Message, prompt: str, password: bool) -> str:
        """Ask the client that sent ``parent`` for a line; blocks until it
        answers. Raises :class:`~trikernel.errors.InputNotDelivered` when
        the ``input_request`` could not be delivered, EOFError on Ctrl-D.
        Runs on: any thread but the io thread."""


class MessageLogView(Protocol):
    """What ``%trikernel log`` reads of the ``--message-log`` (server/messagelog.py)."""

    @property
    def max_tail(self) -> int:
        """The most lines :meth:`report` shows."""

    def report(self, n: int) -> list[str]:
        """A header line, then the last ``n`` lines, one row each (any thread)."""
