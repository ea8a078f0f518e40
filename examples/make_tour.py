"""Regenerate examples/tour.ipynb (the README's main job) from the cells below."""

from __future__ import annotations

import os

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = [
    new_markdown_cell(
        "# A tour of trikernel\n\nPython in Jupyter, on trio. Run it with\n"
        "`jupyter execute --kernel_name=trikernel examples/tour.ipynb`."
    ),
    new_code_cell("print('hello from trikernel')\nimport sys\nprint('stderr works too', file=sys.stderr)"),
    new_markdown_cell("## Rich display"),
    new_code_cell(
        "from IPython.display import HTML, Markdown, display\n"
        "display(HTML('<b>bold</b> HTML'))\n"
        "display(Markdown('*markdown* too'))\n"
        "h = display({'text/plain': 'progress: 0%'}, raw=True, display_id=True)\n"
        "for p in (50, 100):\n"
        "    h.update({'text/plain': f'progress: {p}%'}, raw=True)\n"
        "{'a dict': [1, 2, 3]}"
    ),
    new_markdown_cell(
        "## Errors\n\nAn error caught in the cell, and one that reaches the kernel "
        "(the cell is tagged `raises-exception`, so `jupyter execute` carries on)."
    ),
    new_code_cell("try:\n    1 / 0\nexcept ZeroDivisionError as exc:\n    print('caught:', repr(exc))"),
    new_code_cell("raise ValueError('shown as an error output')", metadata={"tags": ["raises-exception"]}),
    new_markdown_cell("## A widget\n\nIts model travels as comm messages on IOPub."),
    new_code_cell(
        "try:\n"
        "    import ipywidgets as widgets\n"
        "except ImportError:\n"
        "    print('ipywidgets is not installed; skipping')\n"
        "else:\n"
        "    slider = widgets.IntSlider(value=3, min=0, max=10, description='n')\n"
        "    display(slider)\n"
        "    print('slider value:', slider.value)"
    ),
    new_markdown_cell("## A plot (if matplotlib is installed)"),
    new_code_cell(
        "try:\n"
        "    import matplotlib.pyplot as plt\n"
        "except ImportError:\n"
        "    print('matplotlib is not installed; skipping')\n"
        "else:\n"
        "    %matplotlib inline\n"
        "    xs = list(range(20))\n"
        "    plt.plot(xs, [x * x for x in xs])\n"
        "    plt.title('squares')\n"
        "    plt.show()"
    ),
    new_markdown_cell(
        "## trio in the notebook\n\n"
        "Top-level `await` works in any cell, and `nursery` is a trio nursery that outlives cells."
    ),
    new_code_cell("import trio\nawait trio.sleep(0.1)\nprint('awaited without any magic')"),
    new_code_cell(
        "ticks = 0\n"
        "third_tick = trio.Event()\n"
        "\n"
        "async def ticker(n=5):\n"
        "    global ticks\n"
        "    while ticks < n:\n"
        "        await trio.sleep(0.05)\n"
        "        ticks += 1\n"
        "        # parented to this cell even when printed after it returned: a live\n"
        "        # frontend (JupyterLab) shows the ticks here; nbclient and\n"
        "        # `jupyter execute` stop listening at idle, so the saved notebook\n"
        "        # shows only what arrived before (see the next cell)\n"
        "        print(f'tick {ticks}')\n"
        "        if ticks == 3:\n"
        "            third_tick.set()\n"
        "\n"
        "nursery.start_soon(ticker)  # runs in the background; this cell returns at once\n"
        "print('ticker started')"
    ),
    new_code_cell(
        "with trio.fail_after(5):\n"
        "    await third_tick.wait()  # set by the background task at its third tick\n"
        "print('meanwhile the background ticker reached', ticks)"
    ),
    new_code_cell(
        "results = {}\n"
        "\n"
        "async def fetch(name, delay):\n"
        "    await trio.sleep(delay)\n"
        "    results[name] = delay\n"
        "\n"
        "start = trio.current_time()\n"
        "async with trio.open_nursery() as n:\n"
        "    for name, delay in [('a', 0.3), ('b', 0.1), ('c', 0.2)]:\n"
        "        n.start_soon(fetch, name, delay)\n"
        "print(sorted(results, key=results.get), f'in {trio.current_time() - start:.1f}s, not 0.6s')"
    ),
    new_code_cell(
        "async def echo(stream):\n"
        "    async with stream:\n"
        "        async for data in stream:\n"
        "            await stream.send_all(data.upper())\n"
        "\n"
        "async def echo_server(*, task_status=trio.TASK_STATUS_IGNORED):\n"
        "    global server_scope\n"
        "    with trio.CancelScope() as server_scope:\n"
        "        await trio.serve_tcp(echo, 0, host='127.0.0.1', task_status=task_status)\n"
        "\n"
        "listeners = await nursery.start(echo_server)  # the server outlives this cell\n"
        "port = listeners[0].socket.getsockname()[1]\n"
        "print('echo server listening on 127.0.0.1 port', port)"
    ),
    new_code_cell(
        "async with await trio.open_tcp_stream('127.0.0.1', port) as stream:\n"
        "    await stream.send_all(b'round trip through trio')\n"
        "    print((await stream.receive_some()).decode())\n"
        "server_scope.cancel()  # stop the background server"
    ),
    new_markdown_cell(
        "## asyncio beside trio\n"
        "\n"
        "asyncio code is awaited the same way, on one asyncio loop that lives as long as the "
        'kernel; one coroutine may await both (docs/trio.md, "asyncio beside trio").'
    ),
    new_code_cell(
        "import asyncio\n"
        "\n"
        "async def both(n):\n"
        "    await asyncio.sleep(0.05)  # asyncio\n"
        "    await trio.sleep(0.05)  # trio, in the same coroutine\n"
        "    return n * n\n"
        "\n"
        "print('gathered', await asyncio.gather(both(2), both(3)))\n"
        "task = asyncio.create_task(both(4))  # an asyncio task that outlives this cell"
    ),
    new_code_cell("print('the task of the last cell returned', await task)"),
]

nb = new_notebook(
    cells=cells,
    metadata={"kernelspec": {"name": "trikernel", "display_name": "Python 3 (trikernel)", "language": "python"}},
)
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tour.ipynb")
nbformat.write(nb, out)
print("wrote", out)
