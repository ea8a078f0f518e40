import sys, time, socket
import trio
sys.path.insert(0, "/work/wt/mon/tests")
from test_iopub_queue import running, _raw_sub, _until, rig_factory  # noqa

def test_stale(rig_factory):
    rig = rig_factory(hold_bytes=1 << 20, monitor=True)
    async def main():
        async with running(rig):
            results = []
            for i in range(20):
                t = _raw_sub(rig.url, [b"\x01"])
                t.shutdown(socket.SHUT_WR)
                try:
                    while t.recv(4096): pass
                except OSError: pass
                t.close()
                with trio.move_on_after(3):
                    while not (rig.publisher.connections == 0 and rig.stats.welcomes == i + 1):
                        await trio.sleep(0.001)
                await trio.sleep(0.05)
                results.append((rig.publisher.connections, rig.stats.welcomes, rig.publisher.holding))
            print(results)
            assert all(r[2] for r in results)
    trio.run(main)
