"""A URL option with a bad value fails when the brake is built, not at its first connection (issue 12.12).

`rediss://...?ssl_cert_reqs=maybe` used to build fine and fail only when a
check connected, where a brake that falls back ("local", the default) fell
back silently, forever. Now every option value redis-py would refuse is
refused by `from_url` (sync and asyncio, every URL kind), with the URL
redacted; the CLI exits 4 with the reason, and good values still connect to a
real TLS server (`ssl_min_version` as a TLS version name).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import pytest

from distbrake import AsyncDistributedBrake, DistributedBrake, InvalidURLError
from tests.servers import HOST, TLSRedisServer
from tests.test_cli import as_json, no_secret, one_line_error, run

PW = "url-opt-pw-93"

BAD: list[tuple[str, str]] = [
    ("ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of none, optional, required"),
    ("ssl_cert_reqs=", "ssl_cert_reqs must be one of none, optional, required"),
    ("ssl_min_version=TLSv1.9", "ssl_min_version must be a TLS version"),
    ("ssl_min_version=771", "ssl_min_version must be a TLS version"),
    ("ssl_check_hostname=perhaps", "ssl_check_hostname must be true or false"),
    ("ssl_ca_certs=", "ssl_ca_certs must name a file or directory"),
    ("client_name=on%20call", "client_name may hold only printable ASCII characters"),
    ("client_name=tab%09bed", "client_name may hold only printable ASCII characters"),
    ("max_connections=0", "max_connections must be a number from 1"),
]
KINDS = [
    "rediss://:{pw}@127.0.0.1:1/0?{option}",
    "rediss+cluster://:{pw}@127.0.0.1:1,127.0.0.1:2?{option}",
    "rediss+sentinel://:{pw}@127.0.0.1:1/mymaster?{option}",
]


@pytest.mark.parametrize("kind", KINDS, ids=["single", "cluster", "sentinel"])
@pytest.mark.parametrize(("option", "why"), BAD, ids=[b[0] for b in BAD])
async def test_bad_option_values_fail_when_the_brake_is_built(kind: str, option: str, why: str) -> None:
    url = kind.format(pw=PW, option=option)
    for build in (DistributedBrake.from_url, AsyncDistributedBrake.from_url):
        with pytest.raises(InvalidURLError) as caught:
            build(url)  # nothing listens on these ports: raised before any connection
        message = str(caught.value)
        assert why in message, message
        assert PW not in message and ":***@127.0.0.1:1" in message


@pytest.mark.parametrize(("option", "value"), [
    ("ssl_cert_reqs=REQUIRED", "required"),
    ("ssl_cert_reqs=none", "none"),
    ("ssl_min_version=TLSv1.2", ssl.TLSVersion.TLSv1_2),
    ("ssl_min_version=tlsv1_3", ssl.TLSVersion.TLSv1_3),
])
def test_good_values_are_passed_on_as_redis_py_takes_them(option: str, value: object) -> None:
    brake = DistributedBrake.from_url(f"rediss://127.0.0.1:1?{option}")
    try:
        name = option.split("=", 1)[0]
        assert brake.client.connection_pool.connection_kwargs[name] == value
    finally:
        brake.close()


def test_the_cli_exits_4_with_the_reason() -> None:
    url = f"rediss://:{PW}@127.0.0.1:1?ssl_cert_reqs=maybe"
    listed = run("--url", url, "list")
    assert listed.returncode == 4
    line = one_line_error(listed)
    assert line.startswith("distbrake: configuration error: invalid backend URL")
    assert "ssl_cert_reqs must be one of none, optional, required" in line
    checked = run("check", "t", "{}", "--session", "s", "--json", DISTBRAKE_URL=url)
    assert checked.returncode == 4 and as_json(checked)["error"]["kind"] == "configuration"
    doctor = run("--url", url, "doctor", "--json")
    assert doctor.returncode == 4
    configuration = next(c for c in as_json(doctor)["checks"] if c["name"] == "configuration")
    assert configuration["status"] == "fail" and "ssl_cert_reqs must be one of" in configuration[
        "detail"]
    for result in (listed, checked, doctor):
        no_secret(result, PW)


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TLSRedisServer]:
    with TLSRedisServer(name="url-options-tls") as server:
        yield server


def test_a_tls_version_name_connects_to_a_real_tls_server(tls_server: TLSRedisServer) -> None:
    """`ssl_min_version=TLSv1.2` reaches redis-py as `ssl.TLSVersion` (a string failed at connect)."""
    url = (f"rediss://{HOST}:{tls_server.port}/0?ssl_ca_certs={tls_server.ca_path}"
           "&ssl_cert_reqs=required&ssl_check_hostname=false&ssl_min_version=TLSv1.2")
    with DistributedBrake.from_url(url, on_backend_error="closed") as brake:
        verdict = brake.check("search", {"q": 1}, session_id="tls")
    assert verdict.decided_by == "redis" and verdict.count == 1
    result = run("--url", url, "check", "search", '{"q": 1}', "--session", "tls", "--json")
    assert result.returncode == 0, result.stderr
    assert as_json(result)["count"] == 2
