"""jupyter_kernel_test's full KernelTests set and IopubWelcomeTests, against the installed kernelspec."""

from __future__ import annotations

import os
import tempfile
from typing import Any, ClassVar

import jupyter_kernel_test as jkt
import pytest

pytestmark = pytest.mark.timeout(300)


class _OwnHistory:
    """The kernel gets an IPYTHONDIR of its own: jupyter_kernel_test's history
    search counts every match of ``code_history_pattern`` in the database,
    so cells other tests of the run executed (``"102 + 1"``) would count."""

    _saved: ClassVar[dict[str, Any]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        cls._saved["dir"] = tempfile.TemporaryDirectory(prefix="jkt-ipython-")
        cls._saved["old"] = os.environ.get("IPYTHONDIR")
        os.environ["IPYTHONDIR"] = cls._saved["dir"].name
        super().setUpClass()  # type: ignore[misc]

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()  # type: ignore[misc]
        old = cls._saved.pop("old")
        if old is None:
            os.environ.pop("IPYTHONDIR", None)
        else:
            os.environ["IPYTHONDIR"] = old
        cls._saved.pop("dir").cleanup()


class TestTrikernel(_OwnHistory, jkt.KernelTests):
    kernel_name = "trikernel"
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "print?"
    code_generate_error = "raise"
    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))", "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))", "mime": "text/latex"},
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "range", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"


class TestTrikernelWelcome(jkt.IopubWelcomeTests):
    kernel_name = "trikernel"
    support_iopub_welcome = True
