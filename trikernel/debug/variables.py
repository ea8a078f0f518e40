"""The Variables panel while no thread is stopped, built in the user run.

Messaging spec "Additions to the DAP" (``inspectVariables``,
``richInspectVariables``) and DAP ``variables`` and ``modules``: what the
kernel answers itself while no thread is stopped (debugger.py). Each of
these touches user objects: ``repr()`` of every value, IPython's display
formatters (``_repr_html_`` and the like), ``__dict__`` (a property can
stand for it), ``len()``, ``isinstance`` (which reads ``__class__``), the
attributes of modules in ``sys.modules`` (a lazy module loads itself on
access), and the last reference to an object dropped here runs its
``__del__``. None of that may run on the io thread, which serves control,
shell, stdin and IOPub: a ``__repr__`` that sleeps 10 s would freeze the
whole kernel for 10 s (issue 26.2). So every function here runs inside a
:class:`~trikernel.core.job.Job` of the main user run (debugger.py
``_in_user_run``), with a deadline on the io side, and returns plain data
(str, int, bool, lists and dicts of them); an object that fails to
describe itself gets a placeholder, never a failed request.

Runs on: the main thread's user run, inside a Job (every function and
method); :class:`VariableExplorer` is created in the io run but touched
only there.
"""

from __future__ import annotations

import builtins
import itertools
import re
import reprlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

#: Children listed per variable.
MAX_CHILDREN = 300

#: Names the Variables panel leaves out (IPython's machinery; as ipykernel).
_HIDDEN_NAMES = frozenset(
    {
        "__name__", "__doc__", "__package__", "__loader__", "__spec__", "__annotations__",
        "__builtins__", "__builtin__", "__display__", "get_ipython", "debugpy", "exit", "quit",
        "In", "Out", "_oh", "_dh", "_", "__", "___",
    }
)  # fmt: skip
_HIDDEN_PATTERN = re.compile(r"^(_\d|_i)")


def accept_variable(name: str) -> bool:
    """Whether the Variables panel shows ``name`` (IPython's own names are left out). Any thread (pure)."""
    return bool(name) and name not in _HIDDEN_NAMES and not _HIDDEN_PATTERN.match(name)


def _failed(exc: BaseException) -> str:
    """The placeholder of a value whose description raised ``exc``."""
    return f"<repr failed: {type(exc).__name__}>"


def _type_name(value: Any) -> str:
    """``type(value).__name__`` read from the type itself (a metaclass cannot take it over)."""
    return str(type.__dict__["__name__"].__get__(type(value)))


class _Repr(reprlib.Repr):
    """reprlib, with the kernel's placeholder for an object whose ``__repr__`` raises
    (reprlib's own is ``<X instance at 0x…>``, which hides that it failed)."""

    def repr_instance(self, x: Any, level: int) -> str:
        try:
            s = builtins.repr(x)
        except Exception as exc:
            return _failed(exc)
        if len(s) > self.maxother:
            i = max(0, (self.maxother - 3) // 2)
            j = max(0, self.maxother - 3 - i)
            s = s[:i] + "..." + s[len(s) - j :]
        return s


class VariableExplorer:
    """Variables of the user namespace while no thread is stopped
    (``inspectVariables``, then ``variables`` on its references).

    References (the objects behind ``variablesReference``) are kept here,
    in the user run, and are valid until the next listing or :meth:`reset`:
    dropping them runs ``__del__`` of what only they held, so it happens
    here too. ``repr`` of values is bounded by :mod:`reprlib`.

    Runs on: the main thread's user run only (inside a Job).
    """

    def __init__(self) -> None:
        self._refs: dict[int, Any] = {}
        self._next = itertools.count(1)
        self._repr = _Repr()
        self._repr.maxstring = 200
        self._repr.maxother = 200
        self._repr.maxlong = 200

    def reset(self) -> None:
        """Forget every reference handed out so far; a later ``variables`` request on one of them
        gets no children. Called before each listing and at ``disconnect``."""
        self._refs.clear()

    def listing(self, shell: InteractiveShell) -> list[dict[str, Any]]:
        """The Variables panel's top level for ``inspectVariables``: one DAP Variable (``name``,
        bounded ``value`` repr, ``type``, ``variablesReference``, ``evaluateName``) per name of
        ``shell.user_ns``, minus IPython's own names and ``user_ns_hidden``."""
        self.reset()
        hidden = shell.user_ns_hidden
        items = list(shell.user_ns.items())
        return [self._var(k, v, k) for k, v in items if isinstance(k, str) and accept_variable(k) and k not in hidden]

    def children(self, ref: int) -> list[dict[str, Any]] | None:
        """The children of reference ``ref`` (DAP Variables); None for an unknown reference."""
        if ref not in self._refs:
            return None
        obj = self._refs[ref]
        try:
            if isinstance(obj, dict):
                items: list[tuple[str, Any]] = [
                    (self._safe_repr(k), v) for k, v in itertools.islice(dict(obj).items(), MAX_CHILDREN)
                ]
            elif isinstance(obj, (list, tuple)):
                items = [(str(i), v) for i, v in enumerate(obj[:MAX_CHILDREN])]
            elif isinstance(obj, (set, frozenset)):
                items = [(str(i), v) for i, v in enumerate(itertools.islice(obj, MAX_CHILDREN))]
            else:
                attrs = getattr(obj, "__dict__", None)
                items = list(itertools.islice(dict(attrs).items(), MAX_CHILDREN)) if isinstance(attrs, dict) else []
        except Exception as exc:
            return [{"name": "…", "value": _failed(exc), "type": "", "variablesReference": 0}]
        return [self._var(name, value, None) for name, value in items]

    def _var(self, name: str, value: Any, evaluate: str | None) -> dict[str, Any]:
        try:
            ref = 0
            if (isinstance(value, (dict, list, tuple, set, frozenset)) and len(value) > 0) or _has_attrs(value):
                ref = next(self._next)
                self._refs[ref] = value
            var: dict[str, Any] = {
                "name": name,
                "value": self._safe_repr(value),
                "type": _type_name(value),
                "variablesReference": ref,
            }
        except Exception as exc:  # len(), __class__, __dict__ of the user's raised
            var = {"name": name, "value": _failed(exc), "type": _type_name(value), "variablesReference": 0}
        if evaluate is not None:
            var["evaluateName"] = evaluate
        return var

    def _safe_repr(self, value: Any) -> str:
        try:
            return str(self._repr.repr(value))
        except Exception as exc:
            return _failed(exc)


def _has_attrs(value: Any) -> bool:
    if isinstance(value, (type, int, float, complex, str, bytes, bool)) or value is None:
        return False
    attrs = getattr(value, "__dict__", None)
    return isinstance(attrs, dict) and len(attrs) > 0


def rich_inspect(shell: InteractiveShell, name: str) -> dict[str, Any] | str:
    """``richInspectVariables`` of ``name`` in ``shell.user_ns`` while no thread is stopped:
    ``{"data": mime bundle, "metadata": ...}`` from IPython's display formatter (which
    reports a raising formatter itself and leaves its type out), or the message of a
    failed response for a name that is not defined. A bundle without ``text/plain``
    gets a placeholder there."""
    from trikernel.user.shell import clean_bundle

    ns = shell.user_ns
    if name not in ns:
        return f"name {name!r} is not defined"
    value = ns[name]
    try:
        formatter = shell.display_formatter
        assert formatter is not None
        data, metadata = formatter.format(value)
    except Exception as exc:
        data, metadata = {"text/plain": _failed(exc)}, {}
    data = clean_bundle(data or {})
    data.setdefault("text/plain", "<repr failed>")
    return {"data": data, "metadata": {k: v for k, v in (metadata or {}).items() if k in data}}


def list_modules(start: int, count: int) -> dict[str, Any]:
    """DAP ``modules``: the modules of ``sys.modules`` from ``start`` (``count`` of them, all
    if 0) that come from a ``.py`` file, and how many there are. Reading a module's
    ``__spec__`` can run code (a lazy module loads itself): so here, not on the io thread."""
    modules = list(sys.modules.copy().values())
    stop = start + count if count > 0 else len(modules)
    out = []
    for i, module in enumerate(modules[start:stop], start):
        try:
            origin = getattr(getattr(module, "__spec__", None), "origin", None)
            if isinstance(origin, str) and origin.endswith(".py"):
                out.append({"id": i, "name": str(module.__name__), "path": origin})
        except Exception:  # a module object that fails to describe itself is left out
            continue
    return {"modules": out, "totalModules": len(modules)}


def accept_stopped_variable(var: dict[str, Any], ns: dict[str, Any], hidden: dict[str, Any]) -> bool:
    """Whether the Variables panel shows debugpy's DAP Variable ``var`` at a
    stop: not IPython's own names (:func:`accept_variable`), nor a name the
    kernel hides in the user's namespace (``hidden``: ``user_ns_hidden``, with
    ``nursery`` and ``trio``) while ``ns`` still holds that hidden object and
    the variable has its type — a local of the same name and another type
    stays. io run; ``ns`` may change meanwhile on the main thread."""
    name = str(var.get("name", ""))
    if not accept_variable(name):
        return False
    if name not in hidden:
        return True
    value = hidden[name]
    return ns.get(name) is not value or var.get("type") != type(value).__name__
