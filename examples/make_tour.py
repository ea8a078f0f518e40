"""Regenerate examples/tour.ipynb (the README's main job) from the cells below."""

from __future__ import annotations

import os

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = [
    new_markdown_cell("# A tour of trikernel\n\nPython in Jupyter, on trio. Run it with\n`jupyter execute --kernel_name=trikernel examples/tour.ipynb`."),
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
    new_markdown_cell("## Errors\n\nAn error caught in the cell, and one that reaches the kernel (the cell is tagged `raises-exception`, so `jupyter execute` carries on)."),
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
        "ticks = []\n"
        "ready = trio.Event()\n"
        "async def ticker():\n"
        "    for i in range(3):\n"
        "        ticks.append(i)\n"
        "        print('tick', i)  # goes to this cell, even when printed later\n"
        "        await trio.sleep(0.05)\n"
        "    ready.set()\n"
        "nursery.start_soon(ticker)"
    ),
    new_code_cell("await ready.wait()\nticks"),
    new_code_cell(
        "async def echo_server(stream):\n"
        "    async with stream:\n"
        "        async for data in stream:\n"
        "            await stream.send_all(data.upper())\n"
        "\n"
        "from functools import partial\n"
        "listeners = await nursery.start(partial(trio.serve_tcp, echo_server, 0, host='127.0.0.1'))\n"
        "port = listeners[0].socket.getsockname()[1]\n"
        "async with await trio.open_tcp_stream('127.0.0.1', port) as s:\n"
        "    await s.send_all(b'round trip through trio')\n"
        "    print((await s.receive_some(100)).decode())"
    ),
]

nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "trikernel", "display_name": "Python 3 (trikernel)", "language": "python"}})
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tour.ipynb")
nbformat.write(nb, out)
print("wrote", out)
