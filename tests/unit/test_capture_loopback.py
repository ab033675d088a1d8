"""The rtnetlink request that puts `::6/128` on lo (`capture/loopback.py`), and reading the kernel's answer."""

from __future__ import annotations

import struct

import pytest

from istio_agent.capture.loopback import ack_errno, new_address_request

SIX = b"\x00" * 15 + b"\x06"


def test_the_request_is_iproute2s_new_address() -> None:
    body = struct.pack("=BBBBI", 10, 128, 0, 0, 1)  # AF_INET6, /128, no flags, scope 0, ifindex 1 (lo)
    body += struct.pack("=HH", 20, 2) + SIX + struct.pack("=HH", 20, 1) + SIX  # IFA_LOCAL, IFA_ADDRESS
    header = struct.pack("=IHHII", 16 + len(body), 20, 0x1 | 0x4 | 0x200 | 0x400, 1, 0)  # RTM_NEWADDR, create+excl
    assert new_address_request(1, SIX, 128) == header + body


def test_an_ipv4_address_is_padded_to_netlink_alignment() -> None:
    request = new_address_request(3, bytes([10, 0, 0, 1]), 32)
    assert len(request) % 4 == 0 and request[16] == 2  # AF_INET
    assert struct.unpack_from("=HH", request, 24) == (8, 2)


@pytest.mark.parametrize("errno", [0, 17, 13])
def test_the_acknowledgement_carries_the_errno(errno: int) -> None:
    reply = struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -errno) + bytes(16)
    assert ack_errno(reply) == errno


def test_anything_else_is_not_an_acknowledgement() -> None:
    with pytest.raises(ValueError, match="acknowledgement"):
        ack_errno(struct.pack("=IHHII", 20, 20, 0, 1, 0) + bytes(4))
