"""Code the checks run in the kernel, per language (``language_info.name``).

Most checks need the kernel to do something observable: print, sleep, wait
for ``input()``, raise, register a comm target. :class:`Python` says how in
Python; it runs unchanged on ipykernel, xeus-python and trikernel (only the
standard library, ``IPython.display`` and ``comm``). A kernel whose language
has no profile here gets SKIP for every check that needs code; the checks of
the envelope, heartbeat, IOPub welcome, bad input and shutdown still run.

Pure; any thread.

Runs on: any thread (pure: code strings per language); the code itself
runs in the kernel under test.
"""

from __future__ import annotations

from string import Formatter


class Snippet:
    """A code template of a profile: ``snippet(*values)`` is the code.

    Args:
        template: :meth:`str.format` text; ``{name!r}`` writes a value as its
            repr, ``{name}`` as its str; literal braces are doubled.
        doc: what the code does in the kernel (the snippet's ``__doc__``).

    Calling it takes the values positionally, in the order their fields first
    appear in the template, or by name; returns the code (str). Raises
    KeyError when a field has no value, TypeError for more values than
    fields. Runs on: any thread (pure).
    """

    def __init__(self, template: str, doc: str):
        self.template = template
        self.__doc__ = doc
        self.fields = tuple(dict.fromkeys(field for _, field, _, _ in Formatter().parse(template) if field))

    def __call__(self, *values: object, **named: object) -> str:
        if len(values) > len(self.fields):
            raise TypeError(f"{len(values)} values for the fields {self.fields}")
        return self.template.format(**dict(zip(self.fields, values, strict=False)), **named)


class Python:
    """Snippets for ``language_info.name == "python"``."""

    #: ename of the error :meth:`error` raises, of an interrupted cell.
    error_ename = "ZeroDivisionError"
    interrupt_ename = "KeyboardInterrupt"
    #: :meth:`result` evaluates to this text/plain.
    result_text = "42"

    noop = "pass"
    error = "1/0"
    result = "6*7"

    # is_complete samples (messaging "Code completeness")
    complete_code = "x = 1"
    incomplete_code = "for i in range(3):"
    invalid_code = "x = )"

    # inspect (messaging "Introspection")
    inspect_found = "print"
    inspect_missing = "conformance_no_such_name_xyz"

    say = Snippet("print({text!r})", "Print ``text`` on stdout: one stream message.")
    assign = Snippet("{name} = {value!r}", "Set global ``name`` to ``value`` (written as its repr).")
    increment = Snippet(
        "{name} = globals().get({name!r}, 0) + 1", "Add 1 to global ``name``, counting from 0 (:attr:`show` reads it)."
    )
    show = Snippet("print(globals().get({name!r}, 0))", "Print the value of global ``name`` (0 if undefined).")
    sleep_then_fail = Snippet(
        "import time\ntime.sleep({seconds})\nraise RuntimeError('conformance: a failing cell')",
        "Sleep ``seconds``, then raise RuntimeError: a failing cell that takes a while.",
    )
    marker_sleep = Snippet(
        "import time\nprint({marker!r}, flush=True)\ntime.sleep({seconds})",
        "Print ``marker`` at once (the check sees the cell start), then sleep ``seconds``.",
    )
    marker_loop = Snippet(
        "print({marker!r}, flush=True)\nwhile True:\n    pass",
        "Print ``marker``, then spin forever: a cell only an interrupt ends.",
    )
    busy = Snippet(
        "import time\n_t = time.monotonic() + {seconds}\nwhile time.monotonic() < _t:\n    pass",
        "Spin the CPU (no sleep) for ``seconds``.",
    )
    read_input = Snippet(
        "conformance_in = input({prompt!r})\nprint(conformance_in)",
        "``input(prompt)`` (an input_request on stdin), then print the answer.",
    )
    read_password = Snippet(
        "import getpass\nconformance_pw = getpass.getpass({prompt!r})\nprint(len(conformance_pw))",
        "``getpass.getpass(prompt)`` (input_request with password), then print its length.",
    )
    flood = Snippet("for _i in range({lines}):\n    print(_i)", "Print the numbers 0..lines-1, one per line.")
    displays = Snippet(
        "from IPython.display import display\nfor _i in range({count}):\n    display(_i)",
        "``count`` separate display_data messages, text/plain '0'..'count-1'.",
    )
    padded_displays = Snippet(
        "from IPython.display import display\nfor _i in range({count}):\n    display('x' * {width} + str(_i))",
        "``count`` display_data messages whose text/plain is the repr of ``'x' * width + str(i)``, i = 0..count-1.",
    )
    ticker = Snippet(
        "import time\nfor _i in range({count}):\n    print(_i, flush=True)\n    time.sleep({interval})",
        "A line every ``interval`` s, ``count`` times.",
    )
    update_display = Snippet(
        "from IPython.display import display\n"
        "_conformance_h = display({first!r}, display_id=True)\n"
        "_conformance_h.update({second!r})",
        "Display ``first`` with a display_id, then update it to ``second``.",
    )
    echo_comm_target = Snippet(
        "import comm\n"
        "def _conformance_target(c, open_msg):\n"
        "    c.on_msg(lambda m: c.send({{'echo': m['content']['data']}}))\n"
        "    c.send({{'opened': True}})\n"
        "comm.get_comm_manager().register_target({target!r}, _conformance_target)",
        "Register comm target ``target``: on open it sends {'opened': True}; "
        "every comm_msg is echoed back as {'echo': data}.",
    )


PROFILES: dict[str, type[Python]] = {"python": Python}


def for_language(name: str | None) -> type[Python] | None:
    """The snippet profile for a ``language_info.name``, or None."""
    return PROFILES.get((name or "").lower())
