"""What an HTTP delivery's answer means (the contract's table), the waits between
attempts, when a delivery gives up; the endpoints' settings, refused in one line that
never quotes a secret; which addresses a connection may open to; the signature, as the
Standard Webhooks library verifies it."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import socket
from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks.webhooks import Webhook

from service.adapters.http.webhook_sender import Sender, allowed, public
from service.core import webhook_policy
from service.core.webhook_policy import RetryPolicy, Verdict
from service.settings import ConfigError, Endpoint, Settings, load_settings

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("status", "verdict", "error_class"),
    [
        (200, Verdict.DELIVERED, None),
        (204, Verdict.DELIVERED, None),
        (299, Verdict.DELIVERED, None),
        (408, Verdict.RETRY, webhook_policy.UNAVAILABLE),
        (425, Verdict.RETRY, webhook_policy.UNAVAILABLE),
        (429, Verdict.RETRY, webhook_policy.RATE_LIMITED),
        (500, Verdict.RETRY, webhook_policy.UNAVAILABLE),
        (503, Verdict.RETRY, webhook_policy.UNAVAILABLE),
        (301, Verdict.RETRY, webhook_policy.REDIRECTED),
        (302, Verdict.RETRY, webhook_policy.REDIRECTED),
        (307, Verdict.RETRY, webhook_policy.REDIRECTED),
        (400, Verdict.RETRY, webhook_policy.REJECTED),
        (401, Verdict.RETRY, webhook_policy.REJECTED),
        (404, Verdict.RETRY, webhook_policy.REJECTED),
        (422, Verdict.RETRY, webhook_policy.REJECTED),
        (410, Verdict.GONE, webhook_policy.GONE),
    ],
)
def test_each_status_means_what_the_contract_says(
    status: int, verdict: Verdict, error_class: str | None
) -> None:
    """A 2xx is delivered, 410 disables the endpoint, and every other status is a failure
    tried again (the Standard Webhooks specification), with the Retry-After it came with."""
    answer = webhook_policy.of_status(status, retry_after=7.0)
    assert (answer.verdict, answer.error_class, answer.status) == (verdict, error_class, status)
    assert answer.retry_after == (7.0 if verdict is Verdict.RETRY else None)


def test_a_destination_not_allowed_is_a_failure_tried_again() -> None:
    answer = webhook_policy.not_allowed("an address not allowed")
    assert (answer.verdict, answer.error_class) == (Verdict.RETRY, webhook_policy.NOT_ALLOWED)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, None),
        ("2", 2.0),
        (" 120 ", 120.0),
        ("Fri, 04 Dec 2026 12:00:30 GMT", 30.0),
        ("Fri, 04 Dec 2026 11:00:00 GMT", 0.0),  # in the past: at once
        ("soon", None),
        ("-5", None),
        ("1e9", None),
    ],
)
def test_retry_after_is_read_as_seconds_or_a_date(
    header: str | None, seconds: float | None
) -> None:
    assert webhook_policy.retry_after_seconds(header, NOW) == seconds


POLICY = RetryPolicy(
    max_attempts=5,
    max_age_seconds=100,
    backoff_seconds=1,
    backoff_cap_seconds=8,
    retry_after_cap_seconds=30,
)


@pytest.mark.parametrize("draw", [0.0, 0.5, 0.999])
def test_the_backoff_doubles_with_jitter_up_to_its_cap(draw: float) -> None:
    failed = webhook_policy.of_status(503)
    delays = [POLICY.delay(attempts, failed, lambda: draw) for attempts in range(1, 7)]
    for attempts, delay in enumerate(delays, start=1):
        step = min(8.0, 2.0 ** (attempts - 1))
        assert step / 2 <= delay <= step


def test_a_retry_after_is_the_least_wait_up_to_its_cap_and_holds_the_endpoint() -> None:
    """The next attempt comes no sooner than the backoff nor than the Retry-After (up to
    its cap), whichever is longer; the endpoint is held back for the Retry-After."""
    assert POLICY.delay(1, webhook_policy.of_status(429, 2.0), lambda: 0.0) == 2.0
    assert POLICY.delay(1, webhook_policy.of_status(429, 3600.0), lambda: 0.0) == 30.0
    assert POLICY.delay(5, webhook_policy.of_status(503, 1.0), lambda: 1.0) == 8.0  # backoff
    assert POLICY.hold(webhook_policy.of_status(429, 2.0)) == 2.0
    assert POLICY.hold(webhook_policy.of_status(429, 3600.0)) == 30.0
    assert POLICY.hold(webhook_policy.of_status(503)) == 0.0


def test_a_delivery_gives_up_out_of_attempts_or_of_age() -> None:
    assert POLICY.give_up(4, age_seconds=10, delay=2) is None
    assert POLICY.give_up(5, age_seconds=10, delay=2) == webhook_policy.ATTEMPTS_EXHAUSTED
    assert POLICY.give_up(2, age_seconds=99, delay=2) == webhook_policy.AGE_EXHAUSTED


def test_a_dead_letter_key_names_the_endpoint_and_the_event() -> None:
    key = webhook_policy.dead_letter_key("orders", "expired:abc:1")
    assert key == "webhook:orders:expired:abc:1"
    assert webhook_policy.of_dead_letter_key(key) == ("orders", "expired:abc:1")
    assert webhook_policy.of_dead_letter_key("expire:abc:1") is None


def _environment(monkeypatch: pytest.MonkeyPatch, endpoints: object) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("EXPIRY_"):
            monkeypatch.delenv(name)
    text = endpoints if isinstance(endpoints, str) else json.dumps(endpoints)
    monkeypatch.setenv("EXPIRY_WEBHOOKS", text)


@pytest.mark.parametrize(
    ("endpoint", "said"),
    [
        ({"name": "x", "url": "ftp://h/", "secret": SECRET}, "url: must be an https:// URL"),
        ({"name": "x", "url": "https://h/", "secret": "whsec_c2hvcnQ="}, "secret: must be"),
        ({"name": "x", "url": "https://h/", "secret": "plain-" + SECRET}, "secret: must be"),
        ({"name": "X Y", "url": "https://h/", "secret": SECRET}, "name: must be 1 to 63"),
        ({"name": "x", "url": "http://h/", "secret": SECRET}, "http:// only to an address"),
        (
            {"name": "x", "url": "https://h/", "secret": SECRET, "allow_networks": ["nope"]},
            "allow_networks: 'nope' is not a CIDR",
        ),
        (
            {"name": "x", "url": "https://h/", "secret": SECRET, "rate_per_second": 0},
            "rate_per_second",
        ),
        ({"name": "x", "url": "https://h/", "secret": SECRET, "colour": 1}, "colour: Extra"),
        (
            {"name": "x", "url": "https://h/", "secret": [SECRET, "whsec_c2hvcnQ="]},
            "secret: must be",
        ),
        ({"name": "x", "url": "https://h/", "secret": [SECRET, SECRET]}, "the same secret"),
        ({"name": "x", "url": "https://h/", "secret": []}, "a list of 1 to 5 secrets"),
        ({"name": "x", "url": "https://h/", "secret": [SECRET] * 6}, "a list of 1 to 5"),
    ],
)
def test_a_bad_endpoint_is_refused_in_one_line_without_its_secret(
    monkeypatch: pytest.MonkeyPatch, endpoint: dict[str, object], said: str
) -> None:
    _environment(monkeypatch, [endpoint])
    with pytest.raises(ConfigError) as refused:
        load_settings()
    line = str(refused.value)
    assert line.startswith("EXPIRY_WEBHOOKS: endpoint 1 ('")
    assert said in line
    assert "\n" not in line
    assert SECRET.removeprefix("whsec_") not in line


def test_endpoints_are_a_json_array_with_distinct_names(monkeypatch: pytest.MonkeyPatch) -> None:
    one = {"name": "x", "url": "https://h/", "secret": SECRET}
    for text, said in [
        ("{", "EXPIRY_WEBHOOKS: not JSON"),
        ('{"name": "x"}', "EXPIRY_WEBHOOKS: must be a JSON array"),
        (json.dumps([one, one]), "EXPIRY_WEBHOOKS: two endpoints are named 'x'"),
    ]:
        _environment(monkeypatch, text)
        with pytest.raises(ConfigError, match="^" + said):
            load_settings()


def test_endpoints_come_from_a_file_or_the_variable_not_both(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from pathlib import Path

    file = Path(str(tmp_path)) / "webhooks.json"
    file.write_text(json.dumps([{"name": "x", "url": "https://h/", "secret": SECRET}]))
    _environment(monkeypatch, "")
    monkeypatch.setenv("EXPIRY_WEBHOOKS_FILE", str(file))
    assert [endpoint.name for endpoint in load_settings().webhooks] == ["x"]
    _environment(monkeypatch, file.read_text())
    monkeypatch.setenv("EXPIRY_WEBHOOKS_FILE", str(file))
    with pytest.raises(ConfigError, match="both set"):
        load_settings()
    _environment(monkeypatch, "")
    monkeypatch.setenv("EXPIRY_WEBHOOKS_FILE", str(file) + ".missing")
    with pytest.raises(ConfigError, match=r"^EXPIRY_WEBHOOKS_FILE: cannot read it"):
        load_settings()


def test_an_endpoint_off_the_host_allow_list_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _environment(monkeypatch, [{"name": "x", "url": "https://a.example.com/", "secret": SECRET}])
    monkeypatch.setenv("EXPIRY_WEBHOOK_ALLOWED_HOSTS", "*.example.com")
    assert load_settings().webhook_allowed_hosts == ("*.example.com",)
    monkeypatch.setenv("EXPIRY_WEBHOOK_ALLOWED_HOSTS", "b.example.com,example.com")
    with pytest.raises(ConfigError, match=r"^EXPIRY_WEBHOOK_ALLOWED_HOSTS: endpoint 'x'"):
        load_settings()


def _endpoint(url: str = "https://hooks.example.com/in", **fields: object) -> Endpoint:
    return Endpoint.model_validate({"name": "x", "url": url, "secret": SECRET, **fields})


@pytest.mark.parametrize(
    ("address", "is_public"),
    [
        ("93.184.216.34", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # the cloud metadata address
        ("100.100.100.200", False),  # shared address space (another cloud's metadata)
        ("224.0.0.1", False),  # multicast, though ipaddress calls it global
        ("ff0e::1", False),
        ("0.0.0.0", False),
        ("::1", False),
        ("fe80::1", False),
        ("fd00:ec2::254", False),  # a cloud's IPv6 metadata address
        ("::ffff:127.0.0.1", False),  # mapped IPv4
        ("64:ff9b::a01:203", False),  # NAT64 of 10.1.2.3
        ("64:ff9b::5db8:d822", True),  # NAT64 of a public address
    ],
)
def test_only_public_addresses_are_public(address: str, is_public: bool) -> None:
    assert public(ipaddress.ip_address(address)) is is_public


def test_a_connection_opens_only_to_the_urls_host_at_an_allowed_address() -> None:
    https = _endpoint()
    assert allowed(https, "hooks.example.com", ipaddress.ip_address("93.184.216.34"))
    assert not allowed(https, "other.example.com", ipaddress.ip_address("93.184.216.34"))
    assert not allowed(https, "hooks.example.com", ipaddress.ip_address("10.0.0.1"))
    assert not allowed(
        https, "hooks.example.com", ipaddress.ip_address("93.184.216.34"), ("a.example.org",)
    )
    inside = _endpoint(allow_networks=["10.0.0.0/8"])
    assert allowed(inside, "hooks.example.com", ipaddress.ip_address("10.0.0.1"))
    assert not allowed(inside, "hooks.example.com", ipaddress.ip_address("192.168.0.1"))
    plain = _endpoint("http://hooks.example.com/in", allow_networks=["10.0.0.0/8"])
    assert allowed(plain, "hooks.example.com", ipaddress.ip_address("10.0.0.1"))
    assert not allowed(plain, "hooks.example.com", ipaddress.ip_address("93.184.216.34"))


async def test_the_signature_verifies_with_the_library() -> None:
    sender = Sender(_endpoint(), concurrency=1)
    try:
        body = b'{"event":"reservation.expired"}'
        now = datetime.now(UTC)
        headers = sender.headers("expired:abc:1", body, now)
    finally:
        await sender.close()
    assert headers["webhook-id"] == "expired:abc:1"
    assert headers["webhook-signature"].startswith("v1,")
    Webhook(SECRET).verify(body, headers)  # raises when it does not verify
    stale = {**headers, "webhook-timestamp": str(int((now - timedelta(hours=1)).timestamp()))}
    with pytest.raises(Exception, match="too old"):
        Webhook(SECRET).verify(body, stale)


async def test_each_secret_of_a_rotation_signs_and_either_verifies() -> None:
    """A list of secrets (a rotation): one v1 signature per secret, space-separated, and
    a receiver that knows either one verifies it (the library's own verifier)."""
    new = "whsec_" + base64.b64encode(b"n" * 32).decode()
    sender = Sender(_endpoint(secret=[SECRET, new]), concurrency=1)
    try:
        body = b'{"event":"reservation.expired"}'
        headers = sender.headers("expired:abc:1", body, datetime.now(UTC))
    finally:
        await sender.close()
    signatures = headers["webhook-signature"].split(" ")
    assert [signature[:3] for signature in signatures] == ["v1,", "v1,"]
    Webhook(SECRET).verify(body, headers)  # the receiver not rotated yet
    Webhook(new).verify(body, headers)  # the receiver already rotated
    other = "whsec_" + base64.b64encode(b"o" * 32).decode()
    with pytest.raises(Exception, match="No matching signature"):
        Webhook(other).verify(body, headers)


def test_settings_show_no_secret() -> None:
    settings = Settings(webhooks=(_endpoint(),))
    assert SECRET not in repr(settings)
    assert SECRET not in str(settings.model_dump())


async def test_an_attempt_that_fails_otherwise_is_retried_within_its_budget() -> None:
    """Whatever else an attempt raises (not the network's error, not the guard's) is an
    answer too, retryable, so that it counts against the delivery's attempts and age
    rather than leaving it to its lease for ever."""
    sender = Sender(_endpoint(), concurrency=1)

    def broken(*_args: object, **_kwargs: object) -> object:
        raise RuntimeError("something unforeseen")

    sender._connections.request = broken  # type: ignore[method-assign,assignment]
    try:
        answer = await sender.post("expired:abc:1", b"{}", datetime.now(UTC))
    finally:
        await sender.close()
    assert (answer.verdict, answer.error_class) == (Verdict.RETRY, webhook_policy.UNREACHABLE)
    assert answer.reason == "connection failed (RuntimeError)"


@pytest.mark.parametrize(
    ("host", "allow"),
    [
        ("localhost", []),  # a name that resolves to the loopback, which is not allowed
        ("127.0.0.1", []),  # the address itself
        ("127.0.0.1", ["10.0.0.0/8"]),  # another range allowed
    ],
)
async def test_no_connection_is_ever_opened_to_an_address_not_allowed(
    host: str, allow: list[str]
) -> None:
    """A listening socket on the loopback behind an endpoint that may not reach it: the
    attempt is refused (webhook.not-allowed) and the socket never sees a connection, not
    even one opened to pick an address and closed (a port scanner's oracle)."""
    trap = socket.create_server(("127.0.0.1", 0))
    trap.settimeout(0.5)
    url = f"https://{host}:{trap.getsockname()[1]}/hook"
    sender = Sender(_endpoint(url, allow_networks=allow), concurrency=1)
    try:
        answer = await sender.post("expired:abc:1", b"{}", datetime.now(UTC))
        with pytest.raises(TimeoutError):
            trap.accept()  # nothing ever knocked
    finally:
        await sender.close()
        trap.close()
    assert (answer.verdict, answer.error_class) == (Verdict.RETRY, webhook_policy.NOT_ALLOWED)


async def test_an_allowed_address_is_connected_to_and_the_answer_read() -> None:
    """The same loopback, allowed: the request arrives there (to the URL's path, with its
    Host and the signature headers), and the answer's status is what it said."""
    received: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://user:p%40ss@localhost:{port}/hook?x=1"
    sender = Sender(_endpoint(url, allow_networks=["127.0.0.0/8"]), concurrency=1)
    try:
        got = await sender.post("expired:abc:1", b"{}", datetime.now(UTC))
    finally:
        await sender.close()
        server.close()
    assert (got.verdict, got.status, got.retry_after) == (Verdict.RETRY, 503, 7.0)
    [head] = received
    assert head.startswith(b"POST /hook?x=1 HTTP/1.1\r\n")
    assert f"host: localhost:{port}\r\n".encode() in head.lower()
    assert b"authorization: basic dxnlcjpwqhnz" in head.lower()  # user:p@ss
    assert b"webhook-signature: v1," in head.lower()
