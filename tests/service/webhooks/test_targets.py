"""A refused webhook or judge target says only that it is not a public address (issue 34 item
11): never what its host name resolved to, which would make the refusal an oracle for the
operator's internal DNS."""

from __future__ import annotations

import ipaddress

import pytest

from service.webhooks import targets


@pytest.mark.parametrize("url", ["https://localhost/hook", "https://localhost:8443/v1"])
def test_a_name_resolving_to_a_private_address_is_refused_without_the_address(url: str) -> None:
    resolved = {str(ip) for ip in targets.addresses("localhost", 443)}
    assert resolved and not any(targets.is_public(ipaddress.ip_address(a)) for a in resolved)
    with pytest.raises(targets.TargetRefused) as refused:
        targets.resolve(url, allow_private=False)
    message = str(refused.value)
    assert "'localhost' is not a public address" in message
    assert not any(address in message for address in resolved)


def test_an_address_written_as_such_is_named_as_written() -> None:
    with pytest.raises(targets.TargetRefused, match=r"'10\.1\.2\.3' is not a public address"):
        targets.resolve("https://10.1.2.3/hook", allow_private=False)


def test_an_unresolvable_name_is_refused_as_a_private_one() -> None:
    """Told apart, the two would say which names exist on the operator's network."""
    refusals = {}
    for host in ("no-such-host.invalid", "localhost"):
        with pytest.raises(targets.TargetRefused) as refused:
            targets.resolve(f"https://{host}/hook", allow_private=False)
        refusals[host] = str(refused.value).replace(host, "HOST")
    assert refusals["no-such-host.invalid"] == refusals["localhost"]


def test_private_targets_pass_where_the_operator_allows_them() -> None:
    assert targets.resolve("https://localhost/hook", allow_private=True).address
    with pytest.raises(targets.TargetRefused, match="'no-such-host.invalid' does not resolve"):
        targets.resolve("https://no-such-host.invalid/hook", allow_private=True)
