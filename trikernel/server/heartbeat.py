"""Heartbeat: a C-level echo on its own thread and ZeroMQ context.

Owns the hb ROUTER socket. ``zmq.proxy(sock, sock)`` echoes every ping in
libzmq's C loop with the GIL released, so the heartbeat keeps answering
while user code holds the GIL. Exits when its context is terminated
(ETERM), closing the socket on the way out.

Runs on: the "trikernel-heartbeat" thread (its own pyzmq context;
C-level zmq.proxy); the main thread only creates and starts it.
"""

from __future__ import annotations

import errno
import logging
import signal
import threading

import zmq

log = logging.getLogger("trikernel.heartbeat")


class Heartbeat(threading.Thread):
    """The heartbeat thread, "trikernel-heartbeat" (daemon): echoes every ping on ``sock``, the
    hb ROUTER, which belongs to its own pyzmq context (sockets.py ``hb_context``); the thread
    owns the socket once started (messaging spec "Heartbeat for kernels"). Started by the main
    thread (launch/kernel.py); stopped by terminating that context."""

    def __init__(self, sock: zmq.Socket[bytes]):
        super().__init__(name="trikernel-heartbeat", daemon=True)
        self.sock = sock

    def run(self) -> None:
        """The thread's body: block SIGINT (a process-directed SIGINT must reach the main
        thread), then ``zmq.proxy(sock, sock)``, libzmq's C loop, which echoes each ping with
        the GIL released. Returns when the context is terminated (ETERM) or the socket closed;
        any other ZMQError is logged. Closes the socket (LINGER 0) on the way out. Heartbeat
        thread only."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            zmq.proxy(self.sock, self.sock)
        except zmq.ZMQError as exc:
            if exc.errno != errno.ENOTSOCK and exc.errno != zmq.ETERM:
                log.error("heartbeat stopped: %s", exc)
        finally:
            self.sock.close(linger=0)
