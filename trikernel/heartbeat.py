"""Heartbeat: a C-level echo on its own thread and ZeroMQ context.

Owns the hb ROUTER socket. ``zmq.proxy(sock, sock)`` echoes every ping in
libzmq's C loop with the GIL released, so the heartbeat keeps answering
while user code holds the GIL. Exits when its context is terminated
(ETERM), closing the socket on the way out.
"""

from __future__ import annotations

import errno
import logging
import signal
import threading

import zmq

log = logging.getLogger("trikernel.heartbeat")


class Heartbeat(threading.Thread):
    def __init__(self, sock: zmq.Socket[bytes]):
        super().__init__(name="trikernel-heartbeat", daemon=True)
        self.sock = sock

    def run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            zmq.proxy(self.sock, self.sock)
        except zmq.ZMQError as exc:
            if exc.errno != errno.ENOTSOCK and exc.errno != zmq.ETERM:
                log.error("heartbeat stopped: %s", exc)
        finally:
            self.sock.close(linger=0)
