"""Tier 3: hypothesis drives the fuzzer (tests/fuzzer.py) against a real
trikernel on all five sockets; invariants after every burst (issue 17).

A burst is one rule: up to 20 messages of one kind (random frames, missing
delimiters, bad and replayed signatures, invalid/deep/non-UTF-8/huge JSON,
lone surrogates, bad content for every request type, subscription frames,
heartbeat bytes ...) sent from raw pyzmq peers. After every burst:

- the kernel process is alive;
- once the fuzz requests already queued are done (a barrier request),
  kernel_info on control and ``1+1`` on shell are answered within 1 s, and
  ``1+1``'s execute_result is ``2``;
- a new IOPub subscriber gets its iopub_welcome within 1 s;
- the well-behaved client (a schema-validating jupyter_client client) read
  every IOPub message the kernel sent meanwhile, each one valid;
- RSS returns (within SETTLE_SECONDS) to within RSS_SLACK plus
  RSS_PER_MESSAGE per message sent of the baseline,
  taken after a warm-up that
  completes and inspects every code snippet the fuzzer uses (jedi's caches
  are ~50 MiB, once). The accepted cells are kept by IPython; the
  issue's "within a few MiB" for dropped input alone is asserted by
  test_fuzz_regressions.py's plateau test (docs/robustness.md).

Derandomized (a failure reproduces: hypothesis prints the steps) and
bounded to about a minute: FUZZ_EXAMPLES examples of FUZZ_STEPS bursts, and
no burst starts after FUZZ_BUDGET seconds.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any, ClassVar

import psutil
import pytest
import zmq
from conftest import TIMEOUT, execute, start_kernel, stop_kernel
from fuzzer import HEAVY, KINDS, SAFE_CODE, Fuzzer, Peers, generate, load_connection
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

pytestmark = pytest.mark.timeout(240)

FUZZ_EXAMPLES = int(os.environ.get("TRIKERNEL_FUZZ_EXAMPLES", "30"))
FUZZ_STEPS = int(os.environ.get("TRIKERNEL_FUZZ_STEPS", "25"))
FUZZ_BUDGET = float(os.environ.get("TRIKERNEL_FUZZ_BUDGET", "45"))
#: RSS growth allowed over the baseline (taken after a warm-up), bytes. The
#: bursts mix accepted requests (cells, history and comms IPython keeps, as
#: any IPython kernel does: 0.3-1 MiB per 100) with dropped ones; that
#: dropped input returns to a plateau of a few MiB is checked on its own in
#: test_fuzz_regressions.py (docs/robustness.md, "Memory of dropped input").
RSS_SLACK = 32 << 20
#: ... plus this many bytes per message sent: what an accepted request keeps
#: (a cell in history and Out, a comm) measured 3-10 KiB; the fuzzer sends
#: 2,000-6,000 messages in its budget, depending on the machine's speed.
RSS_PER_MESSAGE = 8 << 10
#: Seconds RSS is given to come back under the bound after a burst: the
#: kernel returns freed heap at most once a second (heap.MIN_INTERVAL), so
#: right after a burst of large frames it can still be high.
SETTLE_SECONDS = 2.5


class Shared:
    """One kernel for the whole run (restarted if an example left it dead)."""

    km: Any = None
    kc: Any = None
    conn: ClassVar[dict[str, Any]] = {}
    peers: Peers | None = None
    baseline = 0
    deadline = 0.0
    bursts = 0
    sent = 0
    max_growth = 0
    last = ""

    @classmethod
    def ensure(cls) -> None:
        if cls.km is not None and cls.km.is_alive():
            return
        cls.close()
        cls.km, cls.kc = start_kernel("trikernel-test-signal")
        cls.conn = load_connection(cls.km.connection_file)
        cls.peers = Peers(cls.conn)
        cls.baseline = 0

    @classmethod
    def close(cls) -> None:
        if cls.peers is not None:
            cls.peers.close()
            cls.peers = None
        if cls.km is not None:
            stop_kernel(cls.km, cls.kc)
            cls.km = None


def control_kernel_info(kc: Any) -> None:
    msg = kc.session.msg("kernel_info_request")
    kc.control_channel.send(msg)
    while kc.get_control_msg(timeout=TIMEOUT)["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
        pass


def barrier(kc: Any, timeout: float = 60) -> None:
    """Wait until every fuzz request queued before it on shell has run."""
    msg_id = kc.execute("pass", silent=True, store_history=False)
    deadline = time.monotonic() + timeout
    while kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))["parent_header"].get("msg_id") != msg_id:
        pass


def welcome(conn: dict[str, Any], ctx: zmq.Context[Any]) -> None:
    sub = ctx.socket(zmq.SUB)
    sub.linger = 0
    try:
        sub.subscribe(b"")
        sub.connect(f"tcp://{conn['ip']}:{conn['iopub_port']}")
        deadline = time.monotonic() + 1.0
        while True:
            assert sub.poll(max(1, int((deadline - time.monotonic()) * 1000))), "no iopub_welcome within 1 s"
            frames = sub.recv_multipart()
            i = frames.index(b"<IDS|MSG>")
            if json.loads(frames[i + 2])["msg_type"] == "iopub_welcome":
                return
    finally:
        sub.close(0)


class KernelFuzz(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        Shared.ensure()
        self.fuzzer = Fuzzer(Shared.conn)
        self.ctx = zmq.Context.instance()

    @initialize()
    def baseline(self) -> None:
        if not Shared.baseline:
            # warm up what the first requests load, so growth measures the
            # fuzz, not one-time caches: completing the fuzzer's code snippets
            # costs jedi ~50 MiB of stubs and caches once (ipykernel alike;
            # measured), a first traceback loads stack_data
            kc = Shared.kc
            sends: list[Any] = [
                lambda: kc.history(hist_access_type="tail", n=3),
                lambda: kc.is_complete("x = ("),
                lambda: kc.comm_info(),
                lambda: kc.execute("1/0"),
            ]
            for code in SAFE_CODE:
                sends.append(lambda code=code: kc.complete(code, len(code)))
                sends.append(lambda code=code: kc.inspect(code, len(code), 1))
            for send in sends:
                msg_id = send()
                while kc.get_shell_msg(timeout=30)["parent_header"].get("msg_id") != msg_id:
                    pass
            self._check()
            Shared.baseline = psutil.Process(Shared.km.provisioner.pid).memory_info().rss

    @rule(kind=st.sampled_from(sorted(KINDS)), seed=st.integers(0, 2**32 - 1), n=st.integers(1, 20))
    def burst(self, kind: str, seed: int, n: int) -> None:
        if time.monotonic() > Shared.deadline:
            return  # out of time: still draw the same data (a precondition on time would be flaky)
        rnd = random.Random(seed)
        peers = Shared.peers
        assert peers is not None
        for _ in range(min(n, 2) if kind in HEAVY else n):
            channel = rnd.choice(KINDS[kind][1])
            peers.send(channel, generate(self.fuzzer, rnd, kind, channel))
            Shared.sent += 1
        Shared.bursts += 1
        Shared.last = f"{min(n, 2) if kind in HEAVY else n} x {kind}"
        peers.drain(10)

    @rule(
        kinds=st.lists(st.sampled_from(sorted(set(KINDS) - HEAVY)), min_size=2, max_size=6),
        seed=st.integers(0, 2**32 - 1),
    )
    def mixed_burst(self, kinds: list[str], seed: int) -> None:
        if time.monotonic() > Shared.deadline:
            return
        rnd = random.Random(seed)
        peers = Shared.peers
        assert peers is not None
        for kind in kinds * 3:
            channel = rnd.choice(KINDS[kind][1])
            peers.send(channel, generate(self.fuzzer, rnd, kind, channel))
            Shared.sent += 1
        Shared.bursts += 1
        Shared.last = "mixed " + ",".join(kinds)
        peers.drain(10)

    @invariant()
    def check(self) -> None:
        if Shared.baseline and time.monotonic() > Shared.deadline:
            return
        try:
            self._check()
        except BaseException as exc:
            # the kernel is shared, so hypothesis' replay may not fail the same
            # way: say what failed first, with the burst that led to it
            print(f"fuzz invariant failed after burst {Shared.bursts}: {exc!r}", file=sys.stderr)
            raise

    def _check(self) -> None:
        km, kc = Shared.km, Shared.kc
        assert km.is_alive(), "the kernel died"
        barrier(kc)
        assert Shared.peers is not None
        Shared.peers.drain(0)
        # answered at all is the invariant: a wall-clock bound fails on a loaded machine (issue 26)
        control_kernel_info(kc)
        reply, out = execute(kc, "1+1")
        if reply["content"].get("ename") in ("KeyboardInterrupt", "ExecutionAborted"):
            # The fuzzer's own valid input reached this cell, correctly: an
            # interrupt_request it sent while the kernel was idle lands at the
            # next checkpoint (trio), or a failing stop_on_error execute of its
            # own aborted this one. The barrier orders only kc's connection:
            # the ROUTER fair-queues connections, so a fuzz request sent before
            # it can still be read after it. Ask again.
            reply, out = execute(kc, "1+1")
        assert reply["content"]["status"] == "ok", reply["content"]
        assert [m["content"]["data"]["text/plain"] for m in out if m["msg_type"] == "execute_result"] == ["2"]
        welcome(Shared.conn, self.ctx)
        if Shared.baseline:
            proc = psutil.Process(km.provisioner.pid)
            growth = proc.memory_info().rss - Shared.baseline
            settle = time.monotonic() + SETTLE_SECONDS
            bound = RSS_SLACK + RSS_PER_MESSAGE * Shared.sent
            while growth >= bound and time.monotonic() < settle:
                time.sleep(0.1)  # the kernel trims the heap at most once a second (heap.py)
                growth = proc.memory_info().rss - Shared.baseline
            if growth > Shared.max_growth + (4 << 20):
                print(
                    f"fuzz: RSS +{growth / 2**20:.1f} MiB after burst {Shared.bursts} ({Shared.last})", file=sys.stderr
                )
            Shared.max_growth = max(Shared.max_growth, growth)
            assert growth < bound, f"RSS grew by {growth / 2**20:.1f} MiB after {Shared.sent} messages"


@pytest.fixture
def isolated_ipython(tmp_path, monkeypatch):
    """Fuzzed cells write IPython history: keep it out of the user's profile."""
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))


def test_fuzz_all_sockets(jupyter_path, isolated_ipython, capsys):
    Shared.deadline = time.monotonic() + FUZZ_BUDGET
    try:
        run_state_machine_as_test(
            KernelFuzz,
            settings=settings(
                max_examples=FUZZ_EXAMPLES,
                stateful_step_count=FUZZ_STEPS,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
        assert Shared.km.is_alive()
    finally:
        with capsys.disabled():
            print(
                f"\nfuzz: {Shared.sent} messages in {Shared.bursts} bursts; "
                f"max RSS growth {Shared.max_growth / 2**20:.1f} MiB"
            )
        Shared.close()
