"""The bodies of the jobs the io run hands to the user run.

Runs on: the main thread, inside the user trio run (userrun.py). Nothing
here touches a socket: output goes through the IOPub queue (outstream.py),
input through the stdin bridge (server/stdin.py), replies back to the io run
as a job's result.

:func:`set_up` builds the user side once, inside the user run: the IOPub
sender for display, errors and comms, ``comm``, the IPython shell, the user
nursery, the ``%trikernel`` magic and the output streams.
:class:`Interpreter` then runs one request at a time (or, for comm messages,
concurrently), each inside ``ParentTracker.running(msg)``: the request is
the ``current_request`` context variable, so everything the job prints or
displays is parented to it (messaging spec "IOPub": ``parent_header``), and
fd 1/2 output written meanwhile is published before the job returns, i.e.
before the reply (fdcapture.py).
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from trikernel.errors import ConfigError, InputNotDelivered
from trikernel.threads import not_traced
from trikernel.user import fdcapture, lanestate, outstream, threadparent

if TYPE_CHECKING:
    from collections.abc import Callable

    from comm.base_comm import CommManager

    from trikernel.core.interfaces import InputChannel, IOPubSink, MessageLogView
    from trikernel.protocol.connection import ConnectionInfo
    from trikernel.protocol.messages import MessageBuilder
    from trikernel.protocol.wire import Message
    from trikernel.user.shell import TrikernelShell
    from trikernel.user.usernursery import UserNursery


class Interpreter:
    """One method per request the user run serves; each returns the reply
    content (messaging spec "Messages on the shell (ROUTER/DEALER) channel").

    Call only in the user run. Exceptions propagate to the io run, which
    answers with an error reply.
    """

    def __init__(
        self,
        shell: TrikernelShell,
        comm_manager: CommManager,
        parents: outstream.ParentTracker,
        stdin: InputChannel,
        user_nursery: UserNursery,
    ):
        self.shell = shell
        self.comm_manager = comm_manager
        self.parents = parents
        self.stdin = stdin
        #: trikernel.nursery; whoever runs set_up starts its host
        self.user_nursery = user_nursery

    async def execute(self, msg: Message) -> dict[str, Any]:
        """Run an ``execute_request``: publishes ``execute_input`` (unless
        ``silent``), runs the cell, returns ``execute_reply`` content."""
        from trikernel.user import shell as shell_mod

        silent = bool(msg.content.get("silent", False))
        with (
            self.parents.running(msg, execute=True),
            # the cell takes its number now: a cell on another lane may start meanwhile
            lanestate.cell(self.shell, bool(msg.content.get("store_history", not silent))) as number,
        ):
            if not silent:
                # code is a string: dispatch refuses anything else (_check_execute_content)
                self.shell.publisher.send(
                    "execute_input", {"code": msg.content.get("code", ""), "execution_count": number}
                )
            return await shell_mod.execute(
                self.shell, msg.content, lambda prompt, password: _request_input(self.stdin, msg, prompt, password)
            )

    def complete(self, msg: Message) -> dict[str, Any]:
        """Answer a ``complete_request`` (messaging spec "Completion"): IPython's completer at
        ``cursor_pos`` (code points), run with ``msg`` as the running request; returns
        ``complete_reply`` content. User run of the request's shell lane (main or subshell
        thread)."""
        from trikernel.user import shell as shell_mod

        return self._with_parent(msg, shell_mod.complete)

    def inspect(self, msg: Message) -> dict[str, Any]:
        """Answer an ``inspect_request`` (messaging spec "Introspection"): IPython's inspector
        for the name at ``cursor_pos``, with ``msg`` as the running request; returns
        ``inspect_reply`` content. User run of the request's shell lane."""
        from trikernel.user import shell as shell_mod

        return self._with_parent(msg, shell_mod.inspect)

    def is_complete(self, msg: Message) -> dict[str, Any]:
        """Answer an ``is_complete_request`` (messaging spec "Code completeness"): complete,
        incomplete (with ``indent``) or invalid, with ``msg`` as the running request; returns
        ``is_complete_reply`` content. User run of the request's shell lane."""
        from trikernel.user import shell as shell_mod

        return self._with_parent(msg, shell_mod.is_complete)

    def history(self, msg: Message) -> dict[str, Any]:
        """Answer a ``history_request`` (messaging spec "History"): tail, range or search of
        IPython's history database, with ``msg`` as the running request; returns
        ``history_reply`` content. User run of the request's shell lane."""
        from trikernel.user import shell as shell_mod

        return self._with_parent(msg, shell_mod.history)

    def comm(self, msg: Message) -> None:
        """comm_open / comm_msg / comm_close from the frontend: run the
        manager's handler (``on_msg`` callbacks, comm targets)."""
        from trikernel.user import comms

        with self.parents.running(msg):
            comms.dispatch(self.comm_manager, msg)

    def comm_info(self, msg: Message) -> dict[str, Any]:
        """Answer a ``comm_info_request`` (messaging spec "Comm info"): the open comms, only
        those of ``target_name`` when the request names one (a string); returns
        ``comm_info_reply`` content. User run (a concurrent-lane job)."""
        from trikernel.user import comms

        target = msg.content.get("target_name")
        return comms.comm_info(self.comm_manager, target if isinstance(target, str) else None)

    def _with_parent(
        self, msg: Message, fn: Callable[[TrikernelShell, dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        with self.parents.running(msg):
            return fn(self.shell, msg.content)


@dataclass(frozen=True)
class UserSideDeps:
    """What :func:`set_up` needs from the kernel (all created before the user run).

    - ``builder``, ``queue``: build and queue IOPub messages;
    - ``parents``: the fallback parent for output without a context;
    - ``stdin``: the bridge ``input()`` uses;
    - ``stats``: returns the IOPub counters for ``%trikernel``;
    - ``capture_fds``: capture file descriptors 1 and 2 (KernelConfig);
    - ``connection``, ``connection_file``: what ``%connect_info`` prints (the
      connection info with the bound ports; a file holding it, or None);
    - ``fd_backlog_bytes``: bytes per captured fd held for the notebook
      before more is dropped, counted and shown (KernelConfig).
    - ``message_log``: what ``%trikernel log`` shows (``--message-log``), or None.
    - ``ipython_argv``: the IPython options of the command line (checked
      before bind, user/ipyoptions.py), for the ``IPKernelApp`` (kernelapp.py).
    """

    builder: MessageBuilder
    queue: IOPubSink
    parents: outstream.ParentTracker
    stdin: InputChannel
    stats: Callable[[], dict[str, Any]]
    capture_fds: bool
    connection: ConnectionInfo | None = None
    connection_file: str | None = None
    fd_backlog_bytes: int = 64 << 20
    message_log: MessageLogView | None = None
    ipython_argv: tuple[str, ...] = ()


def set_up(nursery: trio.Nursery, deps: UserSideDeps) -> Interpreter:
    """Build the user side, inside the user run (main thread): IPython's
    configuration (kernelapp.py), the shell (zmqshell.py), ``comm``,
    ``get_ipython().kernel``, the ipykernel facade (facade.py), the user
    nursery, the magics, the output streams; then IPython's start-up code
    (profile startup files, ``exec_lines``, extensions, ``--matplotlib``).

    Slow (IPython imports): the io run answers ``kernel_info`` meanwhile.
    The user nursery's host is not started here: the caller awaits
    ``nursery.start(jobs.user_nursery.host)`` before the first job.

    Raises:
        ConfigError: a bad IPython config value or profile (raised before
            the output streams are installed, so the caller's one line
            reaches the kernel's stderr).
    """
    from traitlets.traitlets import TraitError

    import trikernel
    from trikernel.user import comms, facade, kernelapp, magics, tracebacks
    from trikernel.user import shell as shell_mod
    from trikernel.user.kernelhandle import KernelHandle
    from trikernel.user.usernursery import UserNursery
    from trikernel.user.zmqshell import ZMQInteractiveShell

    publisher = outstream.Publisher(deps.builder, deps.queue, deps.parents)
    comm_manager = comms.install(publisher)
    # under ipykernel's name: libraries tell a notebook kernel by it (user/zmqshell.py)
    shell_class = ZMQInteractiveShell
    app = kernelapp.create(deps.ipython_argv, deps.connection_file, shell_class)
    # Threads IPython starts (the history saver) inherit this mask: SIGINT
    # must reach the main thread, where user code runs.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        shell = shell_mod.create_shell(publisher, shell_class, parent=app, profile_dir=app.profile_dir)
    except TraitError as exc:  # a config value the shell (or its history, formatters) refuses
        raise ConfigError(f"bad config: {exc}") from None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    save_thread = getattr(shell.history_manager, "save_thread", None)
    if isinstance(save_thread, threading.Thread):
        not_traced(save_thread)  # the debugger never stops it (debugger.py)
    comms.set_shell(shell)
    # get_ipython().kernel: what ipywidgets and friends use (user/kernelhandle.py)
    shell.kernel = KernelHandle(deps.parents, publisher, comm_manager=comm_manager, shell=shell)
    facade.install()  # import ipykernel gives trikernel's answers in this process (user/ipykernel_facade)

    def report(header: str, exc: BaseException, tb: Any) -> None:
        hide = bool(getattr(shell.InteractiveTB, "skip_hidden", True))  # %xmode --show shows them
        tracebacks.show_on_stderr(header, exc, tb, hide=hide)

    un = UserNursery(nursery, report)
    trikernel.nursery = un
    for name, value in (("nursery", un), ("trio", trio)):
        shell.user_ns[name] = value
        shell.user_ns_hidden[name] = value
    session_name = os.environ.get("JPY_SESSION_NAME")
    if session_name:  # the notebook's path, set by jupyter_server (as ipykernel)
        shell.user_ns["__session__"] = session_name
    magics.register(shell, deps.stats, deps.message_log)
    info = deps.connection.to_dict() if deps.connection is not None else None
    magics.register_kernel_magics(shell, magics.ConnectionFile(info, deps.connection_file) if info else None)
    threadparent.install()  # threads and executor work keep the request that started them
    outstream.install(deps.queue, deps.parents, capture_fds=deps.capture_fds, fd_backlog=deps.fd_backlog_bytes)
    # '' on sys.path (imports follow %cd), --matplotlib/--gui, extensions,
    # startup files, exec_lines, -c: as ipykernel, once the streams are in place
    app.start_shell(shell)
    return Interpreter(shell, comm_manager, deps.parents, deps.stdin, un)


def _request_input(stdin: InputChannel, msg: Message, prompt: str, password: bool) -> str:
    """``input()`` / ``getpass()`` of the cell ``msg``: the stdin channel's
    answer; a request that could not be delivered raises IPython's
    StdinNotImplementedError, as for ``allow_stdin: false``. fd 1/2 output
    written so far is published first, so it too precedes the prompt
    (the IOPub queue orders the ``input_request`` behind it)."""
    from IPython.core.error import StdinNotImplementedError

    fdcapture.flush()
    try:
        return stdin.request_input(msg, prompt, password)
    except InputNotDelivered as exc:
        raise StdinNotImplementedError(str(exc)) from None
