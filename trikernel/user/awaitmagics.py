"""Top-level ``await`` under ``%time``, ``%%time``, ``%timeit``, ``%%timeit`` and ``%%capture``.

Main thread, inside the user trio run. IPython turns ``%time await f()`` into
a plain call, ``get_ipython().run_line_magic('time', 'await f()')``, and the
magic compiles its statement on its own, so ``await`` there fails with
"'await' outside function" (in ipykernel too); ``%%capture`` runs its body
with the synchronous ``run_cell``, which cannot enter the running trio loop.
trikernel registers an AST transformer (IPython's ``shell.ast_transformers``)
that rewrites such a call, when the magic's code needs ``await``, into
``await get_ipython().run_line_magic_async('time', 'await f()')``. The cell
is then a coroutine, and ``run_cell_async`` awaits it in the user trio run
like any other top-level ``await``: the timed code's awaits run in the
cell's own task, between other trio tasks, as the cell's would.

The async twins below follow IPython's ``ExecutionMagics.time``,
``.timeit`` and ``.capture`` (IPython/core/magics/execution.py): the same
options, the same clocks (wall: ``time.time`` for ``%time``, the timer of
``-t``/``-c`` or ``timeit.default_timer`` for ``%timeit``; CPU:
``resource.getrusage`` of the process through ``IPython.utils.timing``), the
same printed lines and return values (the expression's value; a
``TimeitResult`` with ``-o``). ``%timeit`` awaits the statement exactly
``-n`` times per run, ``-r`` runs, with the garbage collector off during a
run as ``timeit`` does (other trio tasks that run meanwhile run with it off
too). Only IPython's own magics are rewritten: a user's magic of the same
name is left alone, and code without ``await`` runs through IPython's magic
unchanged.

Runs on: the user run of the lane whose cell runs the magic (the main
thread, or a subshell's thread); :func:`loop_runner` on any thread that
calls ``run_cell`` synchronously.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import inspect
import itertools
import sys
import time
import timeit
from typing import TYPE_CHECKING, Any, NamedTuple

from IPython.core import magic_arguments
from IPython.core.displayhook import DisplayHook
from IPython.core.error import UsageError
from IPython.core.magic import MAGIC_OUTPUT_CAN_BE_SILENCED
from IPython.core.magics import execution as _execution
from IPython.core.magics.execution import ExecutionMagics, TimeitResult
from IPython.utils.timing import clock, clock2

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import CodeType

    from IPython.core.interactiveshell import InteractiveShell


def _plain_time(timespan: float, precision: int = 3) -> str:
    return f"{timespan:.{precision}g} s"


#: IPython's own formatting of durations ("1.23 ms"), private in IPython.
_format_time: Callable[[float], str] = getattr(_execution, "_format_time", _plain_time)

_TOP_LEVEL_AWAIT = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
#: IPython reports parse and compile times above this (seconds).
_REPORT_MIN = 0.1


def _compile(shell: InteractiveShell, tree: ast.AST, source: str, mode: str) -> CodeType:
    compiler: Any = shell.compile
    with compiler.extra_flags(_TOP_LEVEL_AWAIT):
        return compiler(tree, source, mode)  # type: ignore[no-any-return]


async def _run(shell: InteractiveShell, code: CodeType) -> Any:
    """Run ``code`` in the user namespace as IPython's run_code does; await it if it is a coroutine."""
    result = eval(code, shell.user_global_ns, shell.user_ns)  # the user's own code
    if code.co_flags & inspect.CO_COROUTINE:
        return await result
    return result


# ---------------------------------------------------------------- %time


def _time_source(line: str, cell: str | None) -> tuple[Any, str, str]:
    """(parsed options, the statement after the options, the code to time)."""
    args, extra = magic_arguments.parse_argstring(ExecutionMagics.time, line, partial=True)
    stmt = " ".join(extra)
    return args, stmt, cell if cell else stmt


async def time_async(magics: Any, line: str = "", cell: str | None = None) -> Any:
    """``%time`` / ``%%time`` whose code awaits: IPython's output, run in the user trio run.

    Raises:
        UsageError: a statement after ``%%time`` (as IPython).
        KeyboardInterrupt: re-raised after the times are printed.
        Exception: the timed code's, unless ``--no-raise-error``.
    """
    shell = magics.shell
    args, stmt, src = _time_source(line, cell)
    if stmt and cell:
        raise UsageError("Can't use statement directly after '%%time'!")
    expr = shell.transform_cell(src)
    t0 = clock()
    tree = shell.compile.ast_parse(expr)
    tp = clock() - t0
    tree = shell.transform_ast(tree)

    last: ast.Expression | None = None
    if len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr):
        mode, source = "eval", "<timed eval>"
        timed: ast.AST = ast.Expression(tree.body[0].value)
    else:
        mode, source = "exec", "<timed exec>"
        timed = tree
        if len(tree.body) > 1 and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body[-1].value)
            timed = ast.Module(tree.body[:-1], [])
    t0 = clock()
    code = _compile(shell, timed, source, mode)
    last_code = _compile(shell, last, source, "eval") if last is not None else None
    tc = clock() - t0

    out: Any = None
    captured: BaseException | None = None
    reraise = False
    wall_st = time.time()
    st = clock2()
    try:
        out = await _run(shell, code)
        if last_code is not None:
            out = await _run(shell, last_code)
    except KeyboardInterrupt as exc:
        captured, reraise = exc, True
    except Exception as exc:
        captured, reraise = exc, not args.no_raise_error
    end = clock2()
    wall_end = time.time()

    cpu_user = end[0] - st[0]
    cpu_sys = end[1] - st[1]
    cpu_tot = cpu_user + cpu_sys
    if sys.platform != "win32":
        print(f"CPU times: user {_format_time(cpu_user)}, sys: {_format_time(cpu_sys)}, total: {_format_time(cpu_tot)}")
    else:
        print(f"CPU times: total: {_format_time(cpu_tot)}")
    print(f"Wall time: {_format_time(wall_end - wall_st)}")
    if tc > _REPORT_MIN:
        print(f"Compiler : {_format_time(tc)}")
    if tp > _REPORT_MIN:
        print(f"Parser   : {_format_time(tp)}")
    if captured is not None:
        if reraise:
            raise captured
        return None
    return out


# -------------------------------------------------------------- %timeit

_TIMEIT_OPTIONS = "n:r:tcp:qov:"
_TIMEIT_TEMPLATE = """\
async def inner(_it, _timer):
    setup
    _t0 = _timer()
    for _i in _it:
        stmt
    _t1 = _timer()
    return _t1 - _t0
"""


def _timeit_sources(magics: Any, line: str, cell: str | None) -> tuple[Any, list[str]]:
    opts, stmt = magics.parse_options(line, _TIMEIT_OPTIONS, posix=False, strict=False, preserve_non_opts=True)
    return opts, [stmt] if cell is None else [stmt, cell]


def _timeit_function(setup: ast.Module, stmt: ast.Module) -> ast.Module:
    """IPython's timeit template as an ``async def`` with the user's setup and statement filled in."""
    template = ast.parse(_TIMEIT_TEMPLATE)
    fn = template.body[0]
    assert isinstance(fn, ast.AsyncFunctionDef)
    fn.body[0:1] = setup.body or [ast.Pass()]
    loop = next(n for n in fn.body if isinstance(n, ast.For))
    loop.body = stmt.body or [ast.Pass()]
    return ast.fix_missing_locations(template)


async def timeit_async(magics: Any, line: str = "", cell: str | None = None) -> TimeitResult | None:
    """``%timeit`` / ``%%timeit`` whose statement or setup awaits.

    The statement is awaited ``-n`` times per run (chosen as IPython does
    when not given: the first power of ten whose run takes 0.2 s or more),
    for ``-r`` runs (default 7), all in the user trio run; IPython's output.
    Returns the ``TimeitResult`` with ``-o`` (and stores it with ``-v``).
    """
    shell = magics.shell
    opts, sources = _timeit_sources(magics, line, cell)
    stmt = sources[0]
    if stmt == "" and cell is None:
        return None
    timefunc: Callable[[], float] = timeit.default_timer
    number = int(getattr(opts, "n", 0))
    repeat = int(getattr(opts, "r", max(getattr(timeit, "default_repeat", 5), 7)))
    precision = int(getattr(opts, "p", 3))
    quiet = "q" in opts
    if hasattr(opts, "t"):
        timefunc = time.time
    if hasattr(opts, "c"):
        timefunc = clock

    transform = shell.transform_cell
    if cell is None:
        ast_setup = shell.compile.ast_parse("pass")
        ast_stmt = shell.compile.ast_parse(transform(stmt))
    else:
        ast_setup = shell.compile.ast_parse(transform(stmt))
        ast_stmt = shell.compile.ast_parse(transform(cell))
    ast_setup = shell.transform_ast(ast_setup)
    ast_stmt = shell.transform_ast(ast_stmt)
    # each must be valid on its own, as in IPython (ipython/ipython#10636)
    _compile(shell, ast_setup, "<magic-timeit-setup>", "exec")
    _compile(shell, ast_stmt, "<magic-timeit-stmt>", "exec")

    t0 = clock()
    code = shell.compile(_timeit_function(ast_setup, ast_stmt), "<magic-timeit>", "exec")
    tc = clock() - t0
    ns: dict[str, Any] = {}
    exec(code, shell.user_ns, ns)  # defines ``inner`` from the user's code
    inner: Callable[[Any, Callable[[], float]], Awaitable[float]] = ns["inner"]

    async def one_run(n: int) -> float:
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            return await inner(itertools.repeat(None, n), timefunc)
        finally:
            if gc_was_on:
                gc.enable()

    if number == 0:
        for index in range(10):
            number = 10**index
            if await one_run(number) >= 0.2:
                break
    all_runs = [await one_run(number) for _ in range(repeat)]
    best = min(all_runs) / number
    worst = max(all_runs) / number
    result = TimeitResult(number, repeat, best, worst, all_runs, tc, precision)

    if not quiet:
        if worst > 4 * best and best > 0 and worst > 1e-6:
            print(
                f"The slowest run took {worst / best:0.2f} times longer than the fastest. "
                "This could mean that an intermediate result is being cached."
            )
        print(result)
        if tc > _REPORT_MIN:
            print(f"Compiler time: {tc:.2f} s")
    if "v" in opts:
        shell.user_ns[opts.v] = result
    if "o" in opts:
        return result
    return None


# ------------------------------------------------------------- %%capture


def _capture_sources(magics: Any, line: str, cell: str | None) -> list[str]:
    return [cell or ""]


def transform_cell(shell: InteractiveShell, code: str) -> tuple[str, Any]:
    """``(transformed, preprocessing_exc_tuple)`` for ``shell.run_cell_async``,
    as IPython's ``run_cell`` makes them: a transform that raises leaves the
    cell as it is and hands the ``sys.exc_info()`` triple on, for
    ``run_cell_async`` to show (the exc tuple is None otherwise). Main thread.
    """
    try:
        return shell.transform_cell(code), None
    except Exception:  # as IPython's run_cell: shown by run_cell_async
        return code, sys.exc_info()


async def capture_async(magics: Any, line: str = "", cell: str | None = None) -> None:
    """``%%capture [output]`` whose body awaits: the body runs as a nested cell
    (``run_cell_async``, as IPython's ``run_cell`` runs it) in the user trio run."""
    from IPython.utils.capture import capture_output

    shell = magics.shell
    args = magic_arguments.parse_argstring(ExecutionMagics.capture, line)
    body = cell or ""
    with capture_output(not args.no_stdout, not args.no_stderr, not args.no_display) as io:
        transformed, preprocessing_exc_tuple = transform_cell(shell, body)
        try:
            await shell.run_cell_async(
                body, store_history=False, transformed_cell=transformed, preprocessing_exc_tuple=preprocessing_exc_tuple
            )
        finally:
            shell.events.trigger("post_execute")
            shell.events.trigger("post_run_cell", shell.last_execution_result)
    if DisplayHook.semicolon_at_end_of_expression(body):
        shell.user_ns.pop(args.output, None)
    elif args.output:
        shell.user_ns[args.output] = io


# ------------------------------------------- synchronous run_cell that awaits


def loop_runner(coro: Any) -> Any:
    """``shell.loop_runner``: what IPython's synchronous ``run_cell`` uses for code that awaits.

    Called from the user trio run (``get_ipython().run_cell("await x")`` in
    a cell) it cannot start a second loop: RuntimeError saying so, instead
    of trio's "Attempted to call run() from inside a run()". Called from
    another thread it runs the code in a trio run of its own, as IPython's
    trio runner does.
    """
    import trio

    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:

        async def run() -> Any:
            return await coro

        return trio.run(run)
    coro.close()
    raise RuntimeError(
        "get_ipython().run_cell() cannot run code that awaits from inside trikernel's running trio loop; "
        "put the code in the cell itself, or await a coroutine function"
    )


# ------------------------------------------------------- the rewrite


class Twin(NamedTuple):
    """The awaitable counterpart of one of IPython's magics."""

    sources: Callable[[Any, str, str | None], list[str]]  # (magics, line, cell) -> code it runs
    run: Callable[..., Awaitable[Any]]  # (magics, line, cell) -> the magic's value


def _time_sources(magics: Any, line: str, cell: str | None) -> list[str]:
    return [_time_source(line, cell)[2]]


def _timeit_code(magics: Any, line: str, cell: str | None) -> list[str]:
    return _timeit_sources(magics, line, cell)[1]


#: IPython's magic functions that have an async twin here.
TWINS: dict[Any, Twin] = {
    ExecutionMagics.time: Twin(_time_sources, time_async),
    ExecutionMagics.timeit: Twin(_timeit_code, timeit_async),
    ExecutionMagics.capture: Twin(_capture_sources, capture_async),
}


def _ipython_magic(shell: InteractiveShell, kind: str, name: str) -> Any:
    """The registered magic ``name`` if it is one of IPython's with a twin here, else None."""
    fn = shell.magics_manager.magics[kind].get(name)
    return fn if getattr(fn, "__func__", None) in TWINS else None


def magic_needs_await(shell: InteractiveShell, kind: str, name: str, line: str, cell: str | None) -> bool:
    """Whether ``%name line`` (``kind`` "line") or ``%%name line\\ncell`` must be awaited."""
    fn = _ipython_magic(shell, kind, name)
    if fn is None or not shell.autoawait:  # %autoawait off: no top-level await anywhere, as in IPython
        return False
    sources = TWINS[fn.__func__].sources(fn.__self__, line, cell)
    return any(_code_needs_await(shell, s) for s in sources if s.strip())


def _code_needs_await(shell: InteractiveShell, src: str) -> bool:
    """needs_await of magic code after IPython's input transforms and this
    module's own rewrite (``%%time`` over a line ``%time await ...``)."""
    try:
        tree = ast.parse(shell.transform_cell(src))
    except (SyntaxError, ValueError, OverflowError, MemoryError):
        return False
    tree = AwaitInMagics(shell).visit_Module(tree)
    try:
        code = compile(tree, "<timed>", "exec", flags=_TOP_LEVEL_AWAIT, dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, MemoryError):
        return False
    return bool(code.co_flags & inspect.CO_COROUTINE)


async def run_magic_async(shell: InteractiveShell, kind: str, name: str, line: str, cell: str | None) -> Any:
    """Run one of IPython's magics through its async twin, as
    ``run_line_magic``/``run_cell_magic`` run a magic (builtins trap, a
    trailing ``;`` silences the value).

    Raises:
        UsageError: ``name`` is not one of IPython's magics with a twin.
    """
    fn = _ipython_magic(shell, kind, name)
    if fn is None:
        raise UsageError(f"%{name} cannot await in trikernel")
    with shell.builtin_trap:
        result = await TWINS[fn.__func__].run(fn.__self__, line, cell)
    if getattr(fn, MAGIC_OUTPUT_CAN_BE_SILENCED, False) and DisplayHook.semicolon_at_end_of_expression(
        line if cell is None else cell
    ):
        return None
    return result


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class AwaitInMagics(ast.NodeTransformer):
    """Rewrites top-level ``get_ipython().run_line_magic(name, ...)`` (and
    ``run_cell_magic``) of a magic in :data:`TWINS` into ``await
    get_ipython().run_*_magic_async(...)`` when the magic's code needs ``await``.

    Only statements are visited (the calls IPython generates are whole
    expression statements or assignment values), never function or class
    bodies, so a cell's cost is one look at each statement. Never raises:
    IPython unregisters an AST transformer that does.
    """

    def __init__(self, shell: InteractiveShell):
        super().__init__()
        self.shell = shell

    def visit_Module(self, node: ast.Module) -> ast.Module:
        """``ast.NodeTransformer`` hook, the entry IPython's ``ast_transformers`` call for each
        cell: instead of the generic walk, rewrites only the cell's top-level statements and
        the blocks nested in them (never function or class bodies), in place, and returns
        ``node``. Never raises: on any error the cell is left as IPython made it."""
        with contextlib.suppress(Exception):  # leave the cell as IPython made it
            self._block(node.body)
        return node

    def _block(self, stmts: list[Any]) -> None:
        for stmt in stmts:
            if isinstance(stmt, _SCOPES):
                continue
            if isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign)) and stmt.value is not None:
                stmt.value = self._maybe_await(stmt.value)
                continue
            for field in _BLOCKS:
                inner = getattr(stmt, field, None)
                if isinstance(inner, list):
                    self._block(inner)

    def _maybe_await(self, value: ast.expr) -> ast.expr:
        call = _magic_call(value)
        if call is None:
            return value
        kind, name, line, cell = call
        if not magic_needs_await(self.shell, kind, name, line, cell):
            return value
        assert isinstance(value, ast.Call)
        assert isinstance(value.func, ast.Attribute)
        value.func.attr = f"run_{kind}_magic_async"
        return ast.copy_location(ast.Await(value=value), value)


def _magic_call(node: ast.AST) -> tuple[str, str, str, str | None] | None:
    """``(kind, name, line, cell)`` if ``node`` is ``get_ipython().run_line_magic(name, line)``
    or ``get_ipython().run_cell_magic(name, line, cell)`` with literal strings."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.keywords):
        return None
    target = node.func.value
    if not (
        isinstance(target, ast.Call)
        and isinstance(target.func, ast.Name)
        and target.func.id == "get_ipython"
        and not target.args
    ):
        return None
    kind = {"run_line_magic": "line", "run_cell_magic": "cell"}.get(node.func.attr)
    want = 2 if kind == "line" else 3
    if kind is None or len(node.args) != want:
        return None
    if not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
        return None
    values = [a.value for a in node.args]  # type: ignore[attr-defined]
    return kind, values[0], values[1], values[2] if kind == "cell" else None
