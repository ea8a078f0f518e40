"""Typed errors for trikernel; each says whose fault it is.

- ``ProtocolError``: a peer sent something we cannot accept (bad frames, bad
  signature, bad JSON). Remote fault: log, drop, keep serving.
- ``ConfigError``: a bad option, connection file or kernelspec. Stops start-up
  with a message naming the field.
- ``HandshakeError``: the JEP 66 registration failed (no ack, bad ack).
- ``BindError``: a port could not be bound on this host.
- ``JobInterrupted``, ``KernelShuttingDown``, ``JobFailed``: how a job in
  the user run ended, as seen from the io run (kernel-internal).
- ``InputNotDelivered``: an ``input_request`` could not reach the client's
  stdin channel in time; ``input()`` raises IPython's
  StdinNotImplementedError for it (user/interpreter.py).
- ``GuiError``: a GUI event loop the user asked for (``%gui``,
  ``%matplotlib``) cannot host the user run. User's request: shown in the
  cell as a UsageError; the run goes on as it was.
- ``KernelLoopError``: user code asked the kernel's asyncio loop to run or
  stop (``loop.run_until_complete``, ``run_forever``, ``stop``; also what
  ``nest_asyncio`` does): it already runs for the kernel's life. User's
  request: the cell fails with it, the loop and the kernel go on.

Runs on: any thread (pure: exception classes only).
"""

from __future__ import annotations


class TrikernelError(Exception):
    """Base class of every error trikernel raises on purpose."""


class ProtocolError(TrikernelError):
    """A peer sent a message that violates the Jupyter messaging protocol.

    Remote fault: the message is logged (without secrets) and dropped; the
    kernel keeps serving. ``kind`` is a short stable identifier of what was
    wrong (``"bad_signature"``, ``"too_deep"``, ...; see
    :mod:`trikernel.badinput`), used to count drops per kind.
    """

    def __init__(self, message: str, kind: str = "malformed") -> None:
        super().__init__(message)
        self.kind = kind


class ConfigError(TrikernelError):
    """A bad option, connection file field or kernelspec entry.

    The message names the offending field; start-up stops (exit code 2).
    """


class HandshakeError(TrikernelError):
    """JEP 66 registration with the launcher failed (timeout, bad reply)."""


class BindError(TrikernelError):
    """A channel's port could not be bound (already in use, bad address).

    Local fault of this host: start-up stops (exit code 1) with one line
    naming the channel and the address.
    """


class JobInterrupted(TrikernelError):
    """A job in the user run ended with KeyboardInterrupt (an interrupted
    comm handler, say); raised in the io run instead of the interrupt,
    which would end that run."""


class KernelShuttingDown(TrikernelError):
    """A job was submitted to, or cancelled in, a user run that is stopping."""


class JobFailed(TrikernelError):
    """A job in the user run raised: what the io run gets instead of the exception.

    ``ename`` is the error's type name, the message its text, ``detail`` its
    traceback as text; all taken in the user run (core/job.py). The
    exception itself never reaches the io thread: its ``__str__`` is code
    of the user's, and its frames hold user objects whose ``__del__`` would
    run where the last reference goes.
    """

    def __init__(self, ename: str, evalue: str, detail: str = "") -> None:
        super().__init__(evalue)
        self.ename = ename
        self.detail = detail


class InputNotDelivered(TrikernelError):
    """The ``input_request`` of an ``input()`` could not be delivered: the
    client's stdin socket did not connect within the bridge's route timeout
    (server/stdin.py). The user side turns it into IPython's
    ``StdinNotImplementedError``, what ``input()`` raises when a request
    says ``allow_stdin: false``."""


class GuiError(TrikernelError):
    """``%gui X`` / ``%matplotlib X`` cannot be honoured: a toolkit trikernel
    does not integrate, no binding installed, no display, or trio internals
    missing (guestrun.UNSUPPORTED). The message says which and what to do."""


class KernelLoopError(TrikernelError, RuntimeError):
    """User code asked the kernel's asyncio loop to run inside itself or to
    stop (user/aioloop.py); a RuntimeError, as asyncio's "This event loop is
    already running". The message says to ``await`` instead."""
