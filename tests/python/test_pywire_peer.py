# SPDX-License-Identifier: MIT
"""A Python pipeline's host and workers connect to <socket>.workers
themselves: only to a peer (SO_PEERCRED) of the daemon's uid, the one the
trainer's libloader checked (docs/security.md, "Whose pipeline, whose
daemon")."""

import os
import socket
import tempfile

import pytest

from loaderd import _pywire as W


@pytest.fixture
def listener():
    d = tempfile.mkdtemp(prefix="ldr-peer-")
    path = os.path.join(d, "x.workers")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(4)
    yield path
    s.close()
    os.unlink(path)
    os.rmdir(d)


def test_workers_socket_of_the_daemons_uid_is_used(listener):
    c = W.connect(listener, os.geteuid())
    c.close()


def test_workers_socket_of_another_uid_is_refused(listener):
    other = os.geteuid() + 4242
    with pytest.raises(W.ProtocolError) as e:
        W.connect(listener, other)
    assert str(e.value) == (f"{listener} is served by uid {os.geteuid()}, not by the daemon's uid "
                            f"{other}: refusing it")
