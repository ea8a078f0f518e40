"""Tracebacks as the user sees them: the user's frames, and never a formatting failure.

Runs on the main thread, inside the user trio run (shell.py calls it for
cells, formatter errors, background tasks of ``trikernel.nursery`` and comm
handlers).

Two rules:

- **Formatting never fails.** An exception whose ``__str__`` raises, odd
  ``__notes__``, a ``_render_traceback_`` that raises or returns the wrong
  shape: the traceback is still one list of lines and the ``evalue`` a str.
  A ``str()`` that raises is shown as CPython shows it,
  ``<exception str() failed>`` (:data:`STR_FAILED`). The ladder is IPython's
  own formatter → the standard library's ``traceback.TracebackException``
  (which is safe against such values) → one line ``Name: value``.
- **Machinery frames are hidden.** Frames whose code lives in the installed
  ``trikernel``, ``trio`` or ``outcome`` packages are left out, as IPython
  leaves out its own frames and ipykernel's never show. The user's frames
  and the final ``Name: value`` line stay. A frame is recognised by the file
  of its code object lying inside one of those packages' directories (as
  imported: ``module.__path__``), never by a substring of the path, so a
  clone in a folder named ``trikernel`` changes nothing. ``%xmode --show``
  (IPython's switch for hidden frames) shows them again; ``%xmode --hide``
  hides them.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from IPython.core.ultratb import AutoFormattedTB

log = logging.getLogger("trikernel.tracebacks")

#: What CPython prints for an exception whose ``str()`` raises.
STR_FAILED = "<exception str() failed>"

#: Packages whose frames are kernel machinery in a user's traceback.
MACHINERY_PACKAGES = ("trikernel", "trio", "outcome", "trio_asyncio")


def _safe(value: object, what: str, func: Any = str) -> str:
    """``func(value)``, or CPython's placeholder ``<{what} {func}() failed>``."""
    try:
        text = func(value)
        if not isinstance(text, str):
            raise TypeError("not a str")
        return text
    except Exception:
        return f"<{what} {func.__name__}() failed>"


def safe_str(value: object) -> str:
    """``str(exc)``, or ``<exception str() failed>`` when that raises (CPython's text)."""
    return _safe(value, "exception")


def safe_notes(value: object) -> list[str]:
    """The PEP 678 ``__notes__`` of ``value`` as strs, as CPython 3.13 prints them."""
    try:
        notes = getattr(value, "__notes__", None)
    except Exception:
        return ["<__notes__ getattr() failed>"]
    if notes is None:
        return []
    if not isinstance(notes, Sequence) or isinstance(notes, (str, bytes)):
        return [_safe(notes, "__notes__", repr)]
    return [n if isinstance(n, str) else _safe(n, "note") for n in notes]


def _package_dirs(names: Sequence[str]) -> tuple[str, ...]:
    """Directory prefixes (with a trailing separator) of imported packages,
    both as imported and with symlinks resolved."""
    dirs: set[str] = set()
    for name in names:
        mod = sys.modules.get(name)
        if mod is None:
            try:
                mod = __import__(name)
            except ImportError:
                continue
        for d in getattr(mod, "__path__", []):
            for form in (os.path.abspath(d), os.path.realpath(d)):
                dirs.add(form.rstrip(os.sep) + os.sep)
    return tuple(sorted(dirs))


class FrameFilter:
    """Decides whether a frame's file belongs to hidden packages (cached per filename)."""

    def __init__(self, packages: Sequence[str]):
        self.packages = tuple(packages)
        self._dirs: tuple[str, ...] | None = None
        self._cache: dict[str, bool] = {}

    def hidden(self, filename: str | None) -> bool:
        """Whether ``filename`` (a code object's ``co_filename``) lies inside one of the
        packages' directories, as imported or with symlinks resolved; False for None or
        ``""``. The package directories are found at the first call; answers are cached (up to
        4096 names)."""
        if not filename:
            return False
        try:
            return self._cache[filename]
        except KeyError:
            pass
        if self._dirs is None:
            self._dirs = _package_dirs(self.packages)
        result = filename.startswith(self._dirs) or (
            os.path.isabs(filename) and os.path.realpath(filename).startswith(self._dirs)
        )
        if len(self._cache) < 4096:
            self._cache[filename] = result
        return result


#: trikernel, trio, outcome, trio_asyncio: hidden from every traceback shown to the user.
MACHINERY = FrameFilter(MACHINERY_PACKAGES)
#: The same plus IPython, for tracebacks formatted by the standard library
#: (IPython's own formatter already leaves out IPython's frames).
MACHINERY_AND_IPYTHON = FrameFilter((*MACHINERY_PACKAGES, "IPython"))


def without_hidden(tb: TracebackType | None, frames: FrameFilter) -> TracebackType | None:
    """A new traceback chain with the hidden frames of ``tb`` left out (``tb`` is not changed)."""
    kept = []
    while tb is not None:
        if not frames.hidden(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    chain: TracebackType | None = None
    for t in reversed(kept):
        chain = TracebackType(chain, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return chain


class TrikernelTB(AutoFormattedTB):
    """IPython's interactive traceback formatter (``shell.InteractiveTB``),
    with machinery frames hidden and exception text that cannot fail.

    Hidden while ``skip_hidden`` is true (IPython's flag for
    ``__tracebackhide__`` frames, toggled by ``%xmode --show/--hide``).
    """

    frame_filter = MACHINERY

    # Context/Verbose modes. Hidden frames are dropped before IPython reads
    # their source (stack_data parses each frame's whole file: trio's
    # _run.py is 3000 lines), so hiding also makes the traceback cheaper.
    def get_records(self, etb: TracebackType, context: int, tb_offset: int) -> Any:
        """``IPython.core.ultratb.VerboseTB.get_records`` (Context and Verbose modes): while
        ``skip_hidden`` is true, the frames of :attr:`frame_filter`'s packages (trikernel,
        trio, outcome, trio_asyncio) are dropped from ``etb`` first, so IPython never reads their source;
        ``[]`` when no frame is left. Otherwise IPython's."""
        if not self.skip_hidden:
            return super().get_records(etb, context, tb_offset)
        kept = without_hidden(etb, self.frame_filter)
        return super().get_records(kept, context, tb_offset) if kept is not None else []

    # Plain mode (and the chained exceptions of it)
    def _extract_tb(self, tb: TracebackType | None) -> traceback.StackSummary | None:
        if tb is not None and self.skip_hidden:
            tb = without_hidden(tb, self.frame_filter)
        return super()._extract_tb(tb)

    # The last line of a Context/Verbose traceback. IPython's replaces a
    # failing str() with the *secondary* exception's type and value.
    def format_exception(self, etype: Any, evalue: Any) -> list[str]:
        """``IPython.core.ultratb.VerboseTB.format_exception``, the last lines of a Context or
        Verbose traceback: ``Name: value`` in the theme's colours, then the PEP 678 notes.
        Unlike IPython's, an exception whose ``str()`` raises keeps its own name and shows
        ``<exception str() failed>``, and odd ``__notes__`` cannot make it raise."""
        from IPython.utils.PyColorize import theme_table
        from pygments.token import Token

        theme = theme_table[self._theme_name]
        name = etype if isinstance(etype, str) else getattr(etype, "__name__", _safe(etype, "type"))
        lines = [theme.format([(Token.ExcName, name), (Token, ": "), (Token, safe_str(evalue))])]
        lines.extend(theme.format([(Token, note)]) for note in safe_notes(evalue))
        return lines

    # The last line in Plain/Minimal mode and for exception-only output.
    def _some_str(self, value: Any) -> str:
        return safe_str(value)


def contains_group(value: BaseException | None) -> bool:
    """True if ``value`` or an exception in its ``__context__`` chain is a
    BaseExceptionGroup (IPython's formatter does not render groups)."""
    seen: set[int] = set()
    while value is not None and id(value) not in seen:
        if isinstance(value, BaseExceptionGroup):
            return True
        seen.add(id(value))
        value = value.__context__
    return False


def _prune(te: traceback.TracebackException, frames: FrameFilter) -> None:
    """Drop hidden frames from ``te`` and every exception it links to, in place."""
    todo = [te]
    seen: set[int] = set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        t.stack[:] = [f for f in t.stack if not frames.hidden(f.filename)]
        todo.extend(x for x in (t.__cause__, t.__context__) if x is not None)
        todo.extend(getattr(t, "exceptions", None) or ())


def stdlib_lines(
    etype: type[BaseException], value: BaseException, tb: TracebackType | None, *, hide: bool = True
) -> list[str]:
    """The standard library's rendering (exception groups included), one
    entry per line, with machinery and IPython frames left out when ``hide``."""
    te = traceback.TracebackException(etype, value, tb, compact=True)
    if hide:
        _prune(te, MACHINERY_AND_IPYTHON)
    return "".join(te.format()).rstrip("\n").split("\n")


def show_on_stderr(header: str, value: BaseException, tb: TracebackType | None, *, hide: bool = True) -> None:
    """Write a failure that is not the running cell's own to ``sys.stderr``:
    ``header`` (one or more lines), then the standard library's traceback
    (machinery and IPython frames left out when ``hide``), as ipykernel
    shows asyncio's "Task exception was never retrieved" (asyncio's
    ``default_exception_handler`` logs it, and with no handler configured
    logging's last resort writes it to ``sys.stderr``, ipykernel's
    ``OutStream``). Used for asyncio tasks nobody awaited and
    ``trikernel.nursery`` tasks: an ``error`` output says "this cell
    raised", and papermill fails a notebook for any, although the cell's
    reply was ok. The text goes to the cell of the current request
    (outstream.py), flushed at once. Never raises an Exception."""
    try:
        lines = stdlib_lines(type(value), value, tb, hide=hide)
    except Exception:
        log.debug("the standard library could not format %s", type(value), exc_info=True)
        lines = one_line(type(value), value)
    try:
        print(header, *lines, sep="\n", file=sys.stderr, flush=True)
    except Exception:
        log.exception("a background failure could not be written to stderr: %s", header)


def one_line(etype: type[BaseException], value: BaseException) -> list[str]:
    """The last resort: ``Name: value``."""
    return [f"{getattr(etype, '__name__', 'Exception')}: {safe_str(value)}"]


def _checked(stb: Any) -> list[str]:
    if not isinstance(stb, list) or not all(isinstance(s, str) for s in stb):
        raise TypeError(f"a traceback must be a list of str, not {type(stb).__name__}")
    return stb


def exception_lines(itb: AutoFormattedTB, etype: type[BaseException], value: BaseException) -> list[str]:
    """Only the ``Name: value`` lines (IPython's ``get_exception_only``). Never raises an Exception."""
    try:
        return _checked(itb.get_exception_only(etype, value))
    except Exception:
        log.debug("IPython could not format %s", etype, exc_info=True)
    try:
        return traceback.format_exception_only(etype, value)
    except Exception:
        return one_line(etype, value)


def structured(
    itb: AutoFormattedTB,
    etype: type[BaseException],
    value: BaseException,
    tb: TracebackType | None,
    *,
    tb_offset: int | None = None,
    exception_only: bool = False,
) -> list[str]:
    """The ``traceback`` field of an ``error`` message (messaging spec
    "Execution errors": a list of str) for one exception. Never raises an
    Exception.

    Args:
        itb: the shell's ``InteractiveTB`` (colours, mode, ``skip_hidden``).
        tb_offset: frames to skip at the top (IPython's meaning).
        exception_only: only the ``Name: value`` part (as IPython's
            ``showtraceback(exception_only=True)``, used for SystemExit).
    """
    if exception_only:
        return ["An exception has occurred, use %tb to see the full traceback.\n", *exception_lines(itb, etype, value)]
    hide = bool(getattr(itb, "skip_hidden", True))
    try:
        if contains_group(value):
            return stdlib_lines(etype, value, tb, hide=hide)
        if hasattr(value, "_render_traceback_"):
            return _checked(value._render_traceback_())
        return _checked(itb.structured_traceback(etype, value, tb, tb_offset=tb_offset))
    except Exception:
        log.debug("IPython could not format %s; using the standard library's format", etype, exc_info=True)
    try:
        return stdlib_lines(etype, value, tb, hide=hide)
    except Exception:
        log.debug("the standard library could not format %s either", etype, exc_info=True)
    return one_line(etype, value)
