"""The local HTTP API's parameters: every bad value a 400 naming it (overlay/api.py).
Before 2026-11-24, `wait=nan` made GET /recv poll every 10 ms for good, `wait=abc`,
`lifetime=inf` and ids past SQLite's INTEGER were 500s."""

import json

import pytest

from c2dtn.overlay import api
from c2dtn.overlay.envelope import Priority


def test_a_good_send_recv_and_consumed_are_read_as_sent():
    a = api.parse_send({"dst": "gw4", "priority": "flash", "lifetime": "0.5", "supersede": "pos", "app": "mqtt"})
    assert a == api.SendArgs("gw4", Priority.FLASH, 500, "pos", "mqtt")
    assert api.parse_send({"dst": "gw4"}) == api.SendArgs("gw4", Priority.ROUTINE, 3_600_000, None, "raw")
    assert api.parse_recv({"wait": "2.5", "max": "10", "app": "pong"}) == (2.5, "pong", 10)
    assert api.parse_recv({}) == (0.0, None, 1000)
    assert api.parse_consumed(b'{"ids": [1, 7, 9223372036854775807]}') == [1, 7, (1 << 63) - 1]


@pytest.mark.parametrize(
    "query, says",
    [
        ({}, "missing dst"),
        ({"dst": "gw4", "priority": "urgent"}, "unknown priority 'urgent'"),
        ({"dst": "gw4", "lifetime": "abc"}, "lifetime must be a number, got 'abc'"),
        ({"dst": "gw4", "lifetime": "inf"}, "lifetime must be from 0.001 to 3.16224e+07, got 'inf'"),
        ({"dst": "gw4", "lifetime": "nan"}, "got 'nan'"),
        ({"dst": "gw4", "lifetime": "0"}, "got '0'"),
        ({"dst": "gw4", "lifetime": "1e300"}, "got '1e300'"),
    ],
)
def test_a_bad_send_names_the_bad_value(query, says):
    with pytest.raises(api.ApiError, match=says.replace("(", r"\(").replace("+", r"\+")):
        api.parse_send(query)


@pytest.mark.parametrize(
    "query, says",
    [
        ({"wait": "nan"}, "wait must be from 0 to 3600, got 'nan'"),
        ({"wait": "-1"}, "got '-1'"),
        ({"wait": "soon"}, "wait must be a number, got 'soon'"),
        ({"max": "0"}, "max must be from 1 to 100000, got '0'"),
        ({"max": "2.5"}, "max must be a whole number, got '2.5'"),
        ({"max": "1e30"}, "got '1e30'"),
    ],
)
def test_a_bad_recv_names_the_bad_value(query, says):
    with pytest.raises(api.ApiError, match=says):
        api.parse_recv(query)


@pytest.mark.parametrize(
    "body, says",
    [
        (b"", "got no JSON"),
        (b"\xff\xfe", "got no JSON"),
        (b"[1, 2]", 'expected {"ids": \\[...\\]}'),
        (json.dumps({"ids": 5}).encode(), "with up to 1000000 ids"),
        (json.dumps({"ids": [1, "2"]}).encode(), "got '2'"),
        (json.dumps({"ids": [1, True]}).encode(), "got True"),
        (json.dumps({"ids": [0]}).encode(), "got 0"),
        (json.dumps({"ids": [1 << 63]}).encode(), "got 9223372036854775808"),
        (b"[" * 100_000 + b"]" * 100_000, "got no JSON"),
    ],
)
def test_a_bad_consumed_names_the_bad_value(body, says):
    with pytest.raises(api.ApiError, match=says):
        api.parse_consumed(body)
