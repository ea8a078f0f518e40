"""GUI event loops that host the user trio run: ``%gui tk``, ``%gui qt``, ``%matplotlib tk``/``qt``.

Runs on: the main thread. :func:`enable_gui` and the ``%gui`` magic run
inside the user trio run (a cell); the hosts' callbacks run in the GUI's
event loop, which owns the main thread while it hosts the run
(guestrun.py); ``run_sync_soon_threadsafe`` is called from trio's I/O
thread. User guide: docs/gui.md; design: docs/design.md, "GUI event loops".

With a host, the user run is a guest of the GUI's loop (trio guest mode):
GUI events (windows, ``root.after``, ``QTimer``, matplotlib redraws), trio
tasks in ``trikernel.nursery`` and cells all run on the main thread, the
GUI's loop waking trio exactly when trio has work (no polling interval).

- **Tk** (:class:`TkHost`): a Tcl interpreter of the host's own, without a
  window, runs tkinter's ``mainloop``; Tcl's event loop is per thread, so it
  serves every ``tkinter.Tk()`` the user (or matplotlib's TkAgg) makes. The
  host creates no default root: ``tk.Tk()``, ``StringVar()`` and widgets
  without a master behave as in plain Python. trio wakes the loop through a
  pipe with a Tcl file handler (what ipykernel's Tk loop uses for its
  socket), and runs follow-up batches as ``after idle`` callbacks.
- **Qt** (:class:`QtHost`): PySide6 or PyQt6 (PyQt5/PySide2 with ``qt5``),
  chosen as ipykernel does (IPython's ``qt_for_kernel``: a binding already
  imported, else ``QT_API``, else the first installed); the existing
  ``QApplication`` or a new one; a ``QEventLoop`` of the host's own, so
  detaching does not quit the application. trio posts an event to a private
  ``QObject`` (``QCoreApplication.postEvent``, thread-safe). Before creating
  a ``QApplication`` a subprocess tries the same, because Qt aborts the
  whole process when no platform plugin loads (no display, a missing
  ``libxcb-cursor0``): ``%gui qt`` then fails with Qt's reason instead of
  killing the kernel.
- Every other toolkit IPython knows (wx, GTK, macOS Cocoa, pyglet, GLUT) is
  refused with a message saying so; ``inline`` and the other non-GUI
  matplotlib backends mean "no GUI loop", as in ipykernel.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import subprocess
import sys
import threading
import traceback
from collections import deque
from typing import TYPE_CHECKING, Any

from trikernel.errors import GuiError
from trikernel.user import guestrun

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("trikernel.guiloop")

#: GUI names that host the run, as IPython's ``%gui`` / ``%matplotlib`` spell them.
HOSTED = ("tk", "qt", "qt6", "qt5")
#: Names that mean "no GUI event loop": the plain run (ipykernel's loop_map maps them to None).
PLAIN = frozenset({"inline", "agg", "nbagg", "webagg", "notebook", "ipympl", "widget"})
#: Toolkits IPython knows that trikernel does not integrate.
NOT_INTEGRATED = {
    "wx": "wxPython",
    "gtk": "GTK",
    "gtk3": "GTK 3",
    "gtk4": "GTK 4",
    "osx": "macOS (Cocoa)",
    "macosx": "macOS (Cocoa)",
    "pyglet": "pyglet",
    "glut": "GLUT",
    "qt4": "Qt 4",
}
_SUPPORTED_TEXT = "supported: %gui tk, %gui qt (Qt 6: PySide6 or PyQt6; qt5 for Qt 5), and %gui alone for none"

_hosts: dict[str, guestrun.Host] = {}


def check_supported(gui: str | None) -> None:
    """Raise GuiError unless ``gui`` is a name :func:`enable_gui` accepts.

    Pure (creates nothing): ``%matplotlib X`` calls it before matplotlib
    switches backend, so a refused toolkit leaves matplotlib as it was.
    """
    if gui is None or gui in PLAIN or gui in HOSTED:
        return
    if gui in NOT_INTEGRATED:
        raise GuiError(
            f"trikernel does not integrate the {NOT_INTEGRATED[gui]} event loop ({_SUPPORTED_TEXT}); "
            "nothing was changed"
        )
    if gui == "asyncio":
        raise GuiError(
            "%gui asyncio is not needed: every cell may await asyncio already, on the kernel's asyncio loop "
            "inside its trio run (trikernel's docs/trio.md, asyncio beside trio); nothing was changed"
        )
    raise GuiError(f"unknown GUI event loop {gui!r} ({_SUPPORTED_TEXT})")


def enable_gui(gui: str | None) -> str | None:
    """Let GUI ``gui``'s event loop host the user run (None, ``inline``, ...: the plain run).

    Main thread, inside the user run. The switch happens when the calling
    cell next awaits or ends; the nursery's tasks and the run go on. Returns
    the host's name (``"tk"``, ``"qt"``) or None.

    Raises:
        GuiError: a toolkit not integrated, tkinter or a Qt binding missing,
            Qt unable to start (no display), called off the main thread, or
            trio internals missing (guestrun.UNSUPPORTED). Nothing changes.
    """
    check_supported(gui)
    if threading.current_thread() is not threading.main_thread():
        raise GuiError("GUI event loops run on the main thread: use %gui in the kernel's main shell")
    driver = guestrun.current()
    if driver is None:
        raise GuiError(f"GUI event loops are not available: {guestrun.UNSUPPORTED or 'the user run is not running'}")
    if gui is None or gui in PLAIN:
        driver.use_host(None)
        return None
    host = prepare_host(gui)
    driver.use_host(host)
    return host.name


def prepare_host(gui: str) -> guestrun.Host:
    """The host for ``gui`` (a name in :data:`HOSTED`), created once: the
    Tcl interpreter, or the QApplication. ``%matplotlib qt`` prepares it
    before matplotlib picks its backend, so matplotlib finds Qt running
    (with ``QT_QPA_PLATFORM=offscreen`` and no ``DISPLAY`` it would
    otherwise call the session headless). Main thread, inside the user run.

    Raises:
        GuiError: as :func:`enable_gui`.
    """
    if threading.current_thread() is not threading.main_thread():
        raise GuiError("GUI event loops run on the main thread: use %gui in the kernel's main shell")
    key = "qt" if gui.startswith("qt") else gui
    host = _hosts.get(key)
    if host is None:
        host = TkHost() if key == "tk" else QtHost(gui)
        _hosts[key] = host
    return host


def register_magic(shell: Any) -> None:
    """Register ``%gui`` on ``shell``, replacing IPython's, which logs a
    failure to the kernel's log instead of showing it in the cell."""

    def gui(line: str = "") -> None:
        """%gui [tk|qt|qt6|qt5]: let that GUI's event loop host the kernel's trio run.

        GUI events, trio tasks (trikernel.nursery) and cells then all run
        on the main thread. %gui alone returns to the plain trio run.
        Do not start the GUI's loop yourself (root.mainloop(), app.exec()):
        a cell that does blocks until that loop ends.
        """
        shell.enable_gui(line.strip() or None)

    shell.register_magic_function(gui, "line", "gui")


class _Queue:
    """The callbacks trio posted to a host, run in posting order."""

    def __init__(self) -> None:
        self._items: deque[Callable[[], object]] = deque()

    def append(self, fn: Callable[[], object]) -> None:
        self._items.append(fn)  # deque.append is atomic: any thread

    def run(self) -> None:
        """Run the callbacks queued so far (main thread). One that posts
        another gets it run at the host's next turn, after GUI events."""
        items = self._items
        for _ in range(len(items)):
            fn = items.popleft()
            try:
                fn()
            except BaseException:  # nothing may escape into the toolkit's C code
                log.exception("a callback of the user run failed in the GUI event loop")


class TkHost:
    """Tk's event loop (tkinter ``mainloop``) hosting the user run. Main thread."""

    name = "tk"

    def __init__(self) -> None:
        try:
            import _tkinter
            import tkinter
        except ImportError as exc:
            raise GuiError(f"%gui tk needs tkinter, which this Python lacks ({exc}); on Debian: python3-tk") from None
        with guestrun.sigint_blocked():  # Tcl's notifier thread starts at the first event check
            interp = tkinter.Tcl()
            interp.tk.dooneevent(_tkinter.DONT_WAIT)
        if not hasattr(interp.tk, "createfilehandler"):
            raise GuiError("%gui tk needs Tcl file handlers, which this platform lacks")
        self._interp = interp
        self._queue = _Queue()
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        interp.tk.createfilehandler(self._rfd, tkinter.READABLE, self._on_readable)
        self._idle_command = interp.register(self._queue.run)
        self._stopping = False

    def run_sync_soon_threadsafe(self, fn: Callable[[], object]) -> None:
        """:meth:`guestrun.Host.run_sync_soon_threadsafe` for Tk: queue ``fn`` and write a byte
        to the host's wake-up pipe, whose Tcl file handler runs the queue on the main thread.
        Any thread (trio's I/O thread); never blocks (a full pipe already has a wake-up
        pending)."""
        self._queue.append(fn)
        with contextlib.suppress(BlockingIOError):  # the pipe is full: a wake-up is pending anyway
            os.write(self._wfd, b"\0")

    def run_sync_soon_not_threadsafe(self, fn: Callable[[], object]) -> None:
        # the idle callback runs from the loop, later: queue fn once the call
        # succeeded, so a failure (the driver then goes plain) leaves nothing queued
        """:meth:`guestrun.Host.run_sync_soon_not_threadsafe` for Tk: schedule the queue's run as
        a Tcl ``after idle`` callback, then queue ``fn`` (only once scheduling succeeded).
        Main thread. Raises tkinter's TclError if Tcl refuses the callback."""
        self._interp.tk.call("after", "idle", self._idle_command)
        self._queue.append(fn)

    def _on_readable(self, fd: int, mask: int) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._rfd, 4096)
        self._queue.run()

    def loop(self) -> None:
        """:meth:`guestrun.Host.loop` for Tk: run the host's Tcl interpreter's ``mainloop(-1)``
        (it runs also while no Tk window exists) until :meth:`stop_loop`; entered again after
        a user's ``quit()``, and an error a Tcl callback raised there is printed on stderr.
        Main thread."""
        self._stopping = False
        while not self._stopping:
            try:
                # -1: run while no Tk window exists too (the host has none);
                # a user's root.quit() ends mainloop, so it is entered again
                self._interp.mainloop(-1)
            except BaseException:  # a Tcl callback's error that tkinter re-raises here
                _report_callback_error("Tk")

    def stop_loop(self) -> None:
        """:meth:`guestrun.Host.stop_loop` for Tk: end ``mainloop`` (Tcl ``quit``) and do not
        enter it again. Main thread, from a host callback."""
        self._stopping = True
        self._interp.quit()


class QtHost:
    """Qt's event loop hosting the user run (a QEventLoop of its own). Main thread."""

    name = "qt"

    def __init__(self, gui: str) -> None:
        _choose_qt_api(gui)
        try:
            from IPython.external.qt_for_kernel import QT_API, QtCore, QtGui
        except ImportError as exc:
            raise GuiError(f"%gui {gui}: no Qt binding could be imported ({exc}); install PySide6 or PyQt6") from None
        app = QtGui.QApplication.instance()
        if app is None:
            _probe_qt(gui, QT_API)
            with guestrun.sigint_blocked():  # threads Qt starts (its X event reader, ...) inherit the mask
                app = QtGui.QApplication(["trikernel"])
        self._app = app
        self._core = QtCore
        self._queue = _Queue()
        self._loop = QtCore.QEventLoop()
        self._event_type = QtCore.QEvent.Type.User
        self._waker = _waker_class(QtCore)(self._event_type, self._queue.run)
        self._stopping = False
        self._in_app_exec = False
        self.api = QT_API

    def run_sync_soon_threadsafe(self, fn: Callable[[], object]) -> None:
        """:meth:`guestrun.Host.run_sync_soon_threadsafe` for Qt: queue ``fn``, then post a user
        ``QEvent`` to the host's private ``QObject`` (``QCoreApplication.postEvent``,
        thread-safe), whose handler runs the queue on the main thread. Any thread (trio's I/O
        thread)."""
        self._queue.append(fn)  # first: the event may be handled before postEvent returns
        self._core.QCoreApplication.postEvent(self._waker, self._core.QEvent(self._event_type))

    def run_sync_soon_not_threadsafe(self, fn: Callable[[], object]) -> None:
        # on the main thread the event is handled later, by the loop: queue fn
        # once posting succeeded (see TkHost)
        """:meth:`guestrun.Host.run_sync_soon_not_threadsafe` for Qt: post the wake-up event,
        then queue ``fn`` (only once posting succeeded); the loop handles it later. Main
        thread."""
        self._core.QCoreApplication.postEvent(self._waker, self._core.QEvent(self._event_type))
        self._queue.append(fn)

    def loop(self) -> None:
        """:meth:`guestrun.Host.loop` for Qt: run the host's own ``QEventLoop`` until
        :meth:`stop_loop` (leaving it does not quit the application); after a user's
        ``QCoreApplication.exit()``, when Qt refuses event loops (``exec`` returns -1), run
        ``QApplication.exec()`` instead. Main thread."""
        self._stopping = False
        while not self._stopping:
            if self._loop.exec() == -1 and not self._stopping:
                # QCoreApplication.exit() was called (a Quit action): Qt then
                # starts no event loop until QCoreApplication.exec() runs
                # again, so run that one until it ends or stop_loop() ends it
                self._in_app_exec = True
                try:
                    self._app.exec()
                finally:
                    self._in_app_exec = False

    def stop_loop(self) -> None:
        """:meth:`guestrun.Host.stop_loop` for Qt: leave the host's ``QEventLoop``, or end
        ``QApplication.exec()`` (``exit(0)``) when :meth:`loop` runs that one. Main thread,
        from a host callback."""
        self._stopping = True
        if self._in_app_exec:
            self._app.exit(0)
        else:
            self._loop.exit()


def _waker_class(QtCore: Any) -> Any:
    class Waker(QtCore.QObject):  # type: ignore[misc]
        """Receives the events trio posts; lives on the main thread."""

        def __init__(self, event_type: Any, on_event: Callable[[], None]) -> None:
            super().__init__()
            self._event_type = event_type
            self._on_event = on_event

        def event(self, ev: Any) -> bool:
            if ev.type() == self._event_type:
                self._on_event()
                return True
            return bool(super().event(ev))

    return Waker


def _choose_qt_api(gui: str) -> None:
    """``%gui qt6`` / ``qt5``: set ``QT_API`` as ipykernel does, unless set
    or a binding is loaded already (IPython's loader then takes that one)."""
    if os.environ.get("QT_API") or gui == "qt":
        return
    order = ("PyQt6", "PySide6") if gui == "qt6" else ("PyQt5", "PySide2")
    loaded = [m for m in order if m in sys.modules]
    for module in loaded or [m for m in order if importlib.util.find_spec(m) is not None][:1]:
        os.environ["QT_API"] = module.lower()
        return


_QT_MODULES = {"pyside6": "PySide6", "pyqt6": "PyQt6", "pyside2": "PySide2", "pyqt5": "PyQt5"}


def _probe_qt(gui: str, api: str) -> None:
    """Create a QApplication in a subprocess first: where Qt cannot load a
    platform plugin it aborts the process, and that would be the kernel."""
    if sys.platform.startswith("linux") and not any(
        os.environ.get(v) for v in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")
    ):
        raise GuiError(
            f"%gui {gui}: there is no display (DISPLAY and WAYLAND_DISPLAY are unset); "
            "for Qt without windows on screen set QT_QPA_PLATFORM=offscreen before starting the kernel"
        )
    module = _QT_MODULES.get(api)
    if module is None:
        raise GuiError(f"%gui {gui}: Qt binding {api!r} is not supported ({_SUPPORTED_TEXT})")
    code = f"from {module}.QtWidgets import QApplication\nQApplication(['trikernel-probe'])\n"
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GuiError(f"%gui {gui}: could not check that Qt starts ({exc})") from None
    if r.returncode != 0:
        lines = [line.strip() for line in r.stderr.splitlines() if line.strip()]
        reason = " / ".join(lines[:3]) or f"exit status {r.returncode}"
        raise GuiError(f"%gui {gui}: Qt ({module}) cannot start in this environment: {reason}")


def _report_callback_error(toolkit: str) -> None:
    """Show an error that escaped a GUI callback on stderr (the notebook,
    parented to the latest cell), as tkinter's report_callback_exception."""
    exc = sys.exc_info()[1]
    if isinstance(exc, KeyboardInterrupt):
        log.info("interrupt in the %s event loop while the kernel is idle: ignored", toolkit)
        return
    print(f"Exception in a {toolkit} callback:", file=sys.stderr)
    traceback.print_exc(file=sys.stderr)
