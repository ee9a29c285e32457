"""``tqbroker.auth.is_loopback``, where ``loopback_users`` (guest) may log in from: the
loopback ranges, in every spelling a socket may report them, and nothing else."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from tqbroker.auth import is_loopback

LOOPBACK_V4 = ipaddress.ip_network("127.0.0.0/8")


def test_ipv4_mapped_loopback_addresses_are_loopback() -> None:
    """A dual-stack (IPv6) socket reports an IPv4 peer as ``::ffff:a.b.c.d``: RabbitMQ's
    loopback check counts ``::ffff:127.x.y.z`` as loopback, so guest may log in from it."""
    for host in ("::ffff:127.0.0.1", "::FFFF:127.0.0.1", "::ffff:7f00:1", "::ffff:127.1.2.3"):
        assert is_loopback(host), host
    for host in ("::ffff:10.0.0.1", "::ffff:0.0.0.0", "::ffff:128.0.0.1", "::127.0.0.1"):
        assert not is_loopback(host), host


@given(st.ip_addresses(v=4))
def test_an_ipv4_address_is_loopback_alike_in_both_spellings(
    address: ipaddress.IPv4Address,
) -> None:
    expected = address in LOOPBACK_V4
    assert is_loopback(str(address)) is expected
    assert is_loopback(f"::ffff:{address}") is expected
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    assert is_loopback(mapped.compressed) is expected  # ::ffff:7f00:1
    assert is_loopback(mapped.exploded) is expected


IPV6 = st.one_of(
    st.ip_addresses(v=6),
    st.ip_addresses(network="::ffff:0:0/96"),  # IPv4-mapped
    st.ip_addresses(network="::ffff:127.0.0.0/104"),  # IPv4-mapped loopback
    st.just(ipaddress.IPv6Address("::1")),
)


@given(IPV6, st.sampled_from(["", "%eth0", "%1"]))
def test_an_ipv6_address_is_loopback_only_if_it_is_1_or_mapped_127(
    address: ipaddress.IPv6Address, scope: str
) -> None:
    mapped = address.ipv4_mapped
    expected = address == ipaddress.IPv6Address("::1") or (
        mapped is not None and mapped in LOOPBACK_V4
    )
    assert is_loopback(f"{address}{scope}") is expected


@given(st.text(max_size=40))
def test_anything_else_is_not_loopback(host: str) -> None:
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        assert not is_loopback(host)
