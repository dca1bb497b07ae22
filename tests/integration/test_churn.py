# SPDX-License-Identifier: MIT
"""No leaks under churn (issue 13): the short version of tests/stress/churn.py.

60 `loaderctl consume` SIGKILLed at random moments (8 at a time, broadcast
and dynamic, some holding leases), then 60 create/drop cycles without
--exist-ok; after each phase, once status lists exactly no client, no lease
and no pipeline but the first, the daemon's fds and mappings are back to the
baseline taken after a warm-up (+16) and its RSS grew at most 32 MiB. Only
deadlines, no speed: it is meant to pass on a loaded 2-core machine.
"""

import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "stress"))

import churn  # noqa: E402

N = 60
SLACK = 16
RSS_MIB = 32


def sanitizer_slack():
    """(maps slack, RSS MiB) allowed: more under a sanitizer, whose runtime
    maps and keeps memory of its own (ASan's quarantine alone holds up to
    256 MiB of freed memory, as tests/stress/soak.py allows for)."""
    from loaderd_harness import LOADERD
    r = subprocess.run(["ldd", LOADERD], capture_output=True, text=True)
    if "libasan" in r.stdout or "libtsan" in r.stdout:
        return 200, RSS_MIB + 512
    return SLACK, RSS_MIB


def test_sigkilled_consumers_and_create_drop_cycles_leak_nothing(ld):
    lines = []
    maps_slack, rss_mib = sanitizer_slack()
    _, res = churn.run(ld, N, N, 8, random.Random(13), slack=SLACK, rss_mib=rss_mib,
                       log=lines.append)
    report = "\n".join(lines)
    print(report)
    base = res["baseline"]
    for phase in ("consumers", "create_drop"):
        m = res[phase]
        assert m["fds"] <= base["fds"] + SLACK, f"fds leaked after {phase}:\n{report}"
        assert m["maps"] <= base["maps"] + maps_slack, f"mappings leaked after {phase}:\n{report}"
        assert m["rss_kib"] <= base["rss_kib"] + rss_mib * 1024, f"RSS grew after {phase}:\n{report}"
    # settle() returned only once these were exact; say so once more
    st = churn.raw_status(ld)
    assert st["clients"] == [] or all(churn_ghost(c) for c in st["clients"]), st["clients"]
    assert sum(c.get("leases", 0) for c in st["clients"]) == 0
    assert sum(p["slots_leased"] for p in st["pipelines"]) == 0
    assert [p["name"] for p in st["pipelines"]] == ["churn"]


def churn_ghost(c):
    """An exited status poller not yet swept (no attachments, pid gone)."""
    if c.get("attachments") or c.get("leases"):
        return False
    try:
        os.kill(c["pid"], 0)
        return False
    except ProcessLookupError:
        return True
