"""Tier 1: connection files and kernel tunables."""

from __future__ import annotations

import os

import pytest

from trikernel.errors import ConfigError
from trikernel.launch.config import KernelConfig
from trikernel.protocol.connection import ConnectionInfo, load_json_file, parse_connection, write_json_atomic

GOOD = {
    "shell_port": 1,
    "iopub_port": 2,
    "stdin_port": 3,
    "control_port": 4,
    "hb_port": 5,
    "ip": "127.0.0.1",
    "transport": "tcp",
    "key": "k",
    "signature_scheme": "hmac-sha256",
}


def test_parse_good():
    c = parse_connection(GOOD)
    assert c.ports == {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
    assert c.key == b"k"
    assert c.all_ports_given
    assert not c.curve
    assert c.url("iopub") == "tcp://127.0.0.1:2"


def test_curve_keys():
    c = parse_connection({**GOOD, "curve_publickey": "p" * 40, "curve_secretkey": "s" * 40})
    assert c.curve
    assert c.to_dict()["curve_secretkey"] == "s" * 40


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"key": None}, "key"),
        ({"hb_port": "5"}, "hb_port"),
        ({"hb_port": True}, "hb_port"),
        ({"stdin_port": -1}, "stdin_port"),
        ({"transport": "udp"}, "transport"),
        ({"ip": 127}, "ip"),
        ({"curve_publickey": "short", "curve_secretkey": "s" * 40}, "curve_publickey"),
    ],
)
def test_bad_fields_are_named(change, field):
    d = {**GOOD, **change}
    d = {k: v for k, v in d.items() if v is not None}
    with pytest.raises(ConfigError, match=field):
        parse_connection(d)


def test_missing_port_means_random():
    """docs/handshake.md, mode B: a missing *_port is bound at random, as 0 is."""
    d = dict(GOOD)
    del d["control_port"]
    assert parse_connection(d).control_port == 0


def test_atomic_write_is_0600_and_round_trips(tmp_path):
    p = tmp_path / "c.json"
    write_json_atomic(str(p), ConnectionInfo(key=b"x", shell_port=9).to_dict())
    assert oct(os.stat(p).st_mode & 0o777) == "0o600"
    assert load_json_file(str(p))["shell_port"] == 9
    assert [f for f in os.listdir(tmp_path) if f.startswith(".trikernel-")] == []


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_json_file(str(tmp_path / "missing.json"))
    (tmp_path / "a.json").write_text("[1]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_json_file(str(tmp_path / "a.json"))


def test_kernel_config_bounds():
    with pytest.raises(ConfigError, match="iopub-capacity"):
        KernelConfig(iopub_capacity=0)
    with pytest.raises(ConfigError, match="iopub-send-timeout"):
        KernelConfig(iopub_send_timeout=0)


def test_kernel_config_choices():
    """A string field with choices (``--autoawait``, issue 24) names the flag and the choices."""
    assert KernelConfig().autoawait == "asyncio"
    assert KernelConfig(autoawait="trio").autoawait == "trio"
    with pytest.raises(ConfigError, match=r"--autoawait must be one of asyncio, trio, got 'curio'"):
        KernelConfig(autoawait="curio")
