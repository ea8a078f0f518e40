"""jupyter_kernel_test's full KernelTests set and IopubWelcomeTests, against the installed kernelspec."""

from __future__ import annotations

import os
import shutil
import tempfile

import jupyter_kernel_test as jkt
import pytest

pytestmark = pytest.mark.timeout(300)


class TestTrikernel(jkt.KernelTests):
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

    @classmethod
    def setUpClass(cls) -> None:
        # A history database of its own: the search test counts every cell
        # in the database that matches code_history_pattern, and other tests
        # of the run write to the run's IPYTHONDIR (test_faults runs
        # "102 + 1" ... "142 + 1"): the search then found 6 cells instead
        # of 1 (seen on the debugger branch; on main the same pair of tests
        # passed, for a reason not pinned down).
        cls._ipython_dir = tempfile.mkdtemp(prefix="jkt-ipython-")
        old = os.environ.get("IPYTHONDIR")
        os.environ["IPYTHONDIR"] = cls._ipython_dir
        try:
            super().setUpClass()
        finally:
            if old is None:
                os.environ.pop("IPYTHONDIR", None)
            else:
                os.environ["IPYTHONDIR"] = old

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        shutil.rmtree(cls._ipython_dir, ignore_errors=True)


class TestTrikernelWelcome(jkt.IopubWelcomeTests):
    kernel_name = "trikernel"
    support_iopub_welcome = True
