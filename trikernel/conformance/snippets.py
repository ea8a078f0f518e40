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

    @staticmethod
    def say(text: str) -> str:
        """Print ``text`` on stdout: one stream message."""
        return f"print({text!r})"

    @staticmethod
    def assign(name: str, value: object) -> str:
        """Set global ``name`` to ``value`` (written as its repr)."""
        return f"{name} = {value!r}"

    @staticmethod
    def increment(name: str) -> str:
        """Add 1 to global ``name``, counting from 0 (:meth:`show` reads it)."""
        return f"{name} = globals().get({name!r}, 0) + 1"

    @staticmethod
    def show(name: str) -> str:
        """Print the value of global ``name`` (0 if undefined)."""
        return f"print(globals().get({name!r}, 0))"

    @staticmethod
    def sleep_then_fail(seconds: float) -> str:
        """Sleep ``seconds``, then raise RuntimeError: a failing cell that takes a while."""
        return f"import time\ntime.sleep({seconds})\nraise RuntimeError('conformance: a failing cell')"

    @staticmethod
    def marker_sleep(marker: str, seconds: float) -> str:
        """Print ``marker`` at once (the check sees the cell start), then sleep ``seconds``."""
        return f"import time\nprint({marker!r}, flush=True)\ntime.sleep({seconds})"

    @staticmethod
    def marker_loop(marker: str) -> str:
        """Print ``marker``, then spin forever: a cell only an interrupt ends."""
        return f"print({marker!r}, flush=True)\nwhile True:\n    pass"

    @staticmethod
    def busy(seconds: float) -> str:
        """Spin the CPU (no sleep) for ``seconds``."""
        return f"import time\n_t = time.monotonic() + {seconds}\nwhile time.monotonic() < _t:\n    pass"

    @staticmethod
    def read_input(prompt: str) -> str:
        """``input(prompt)`` (an input_request on stdin), then print the answer."""
        return f"conformance_in = input({prompt!r})\nprint(conformance_in)"

    @staticmethod
    def read_password(prompt: str) -> str:
        """``getpass.getpass(prompt)`` (input_request with password), then print its length."""
        return f"import getpass\nconformance_pw = getpass.getpass({prompt!r})\nprint(len(conformance_pw))"

    @staticmethod
    def flood(lines: int) -> str:
        """Print the numbers 0..lines-1, one per line."""
        return f"for _i in range({lines}):\n    print(_i)"

    @staticmethod
    def displays(count: int) -> str:
        """``count`` separate display_data messages, text/plain '0'..'count-1'."""
        return f"from IPython.display import display\nfor _i in range({count}):\n    display(_i)"

    @staticmethod
    def padded_displays(count: int, width: int) -> str:
        """``count`` display_data messages whose text/plain is the repr of
        ``'x' * width + str(i)``, i = 0..count-1."""
        return f"from IPython.display import display\nfor _i in range({count}):\n    display('x' * {width} + str(_i))"

    @staticmethod
    def ticker(count: int, interval: float) -> str:
        """A line every ``interval`` s, ``count`` times."""
        return f"import time\nfor _i in range({count}):\n    print(_i, flush=True)\n    time.sleep({interval})"

    @staticmethod
    def update_display(first: str, second: str) -> str:
        """Display ``first`` with a display_id, then update it to ``second``."""
        return (
            "from IPython.display import display\n"
            f"_conformance_h = display({first!r}, display_id=True)\n"
            f"_conformance_h.update({second!r})"
        )

    @staticmethod
    def echo_comm_target(target: str) -> str:
        """Register comm target ``target``: on open it sends {'opened': True};
        every comm_msg is echoed back as {'echo': data}."""
        return (
            "import comm\n"
            "def _conformance_target(c, open_msg):\n"
            "    c.on_msg(lambda m: c.send({'echo': m['content']['data']}))\n"
            "    c.send({'opened': True})\n"
            f"comm.get_comm_manager().register_target({target!r}, _conformance_target)"
        )


PROFILES: dict[str, type[Python]] = {"python": Python}


def for_language(name: str | None) -> type[Python] | None:
    """The snippet profile for a ``language_info.name``, or None."""
    return PROFILES.get((name or "").lower())
