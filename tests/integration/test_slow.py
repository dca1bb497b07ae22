# SPDX-License-Identifier: MIT
"""A stopped broadcast client (docs/spec.md, "Slow broadcast clients"): one of
three broadcast consumers is SIGSTOPped mid-stream. Under "wait" the other two
go on once slow_client_timeout has passed without progress, and the stopped
one, continued, learns it was detached; under "skip" nobody waits, and the
stopped one, continued, reads on from where the stream is. The two others'
streams are whole and exact in both."""

import os
import re
import signal

from ldrtest import position_indices, position_tokens, token_spec

SEQ = 8
BATCH = 4
NSAMPLES = 240           # 60 batches an epoch, far more than the 8 slots


def make_pipeline(d, workdir, **kw):
    """8 slots named: the stream must run out of them to be held back."""
    tok = os.path.join(workdir, "pos.bin")
    position_tokens(tok, NSAMPLES * SEQ + 1)
    d.create(token_spec("bc", tok, SEQ, "uint32", batch_size=BATCH, min_clients=3, prefetch=8,
                        **kw))


def start_three(d, *args):
    """The victim attaches first and is stopped before the stream starts (it
    waits for min_clients 3); then the two others attach and read."""
    victim = d.popen_consume("bc", "--mode", "broadcast", *args)
    d.wait_for(lambda s: any(c["pid"] == victim.pid and c["attachments"] for c in s["clients"]),
               "the victim attached", timeout=30)
    victim.signal(signal.SIGSTOP)
    return victim


def whole(res):
    rows = [BATCH] * (NSAMPLES // BATCH)
    return position_indices(res.dump, SEQ, rows) == [list(range(i, i + BATCH))
                                                      for i in range(0, NSAMPLES, BATCH)]


def test_wait_detaches_a_stopped_client(daemon, workdir):
    d = daemon()
    make_pipeline(d, workdir, slow_client_timeout=1.5)
    victim = start_three(d)
    others = [d.popen_consume("bc", "--mode", "broadcast") for _ in range(2)]
    st = d.wait_for(lambda s: (s["pipelines"][0]["held_back_by"] or {}).get("pid") == victim.pid,
                    "the stream held back", timeout=30)
    held = st["pipelines"][0]["held_back_by"]
    assert held["pid"] == victim.pid and held["lag"] >= 8, held
    for c in others:                      # they go on, whole
        res = c.wait(timeout=60, check=True)
        assert res.json["batches"] == NSAMPLES // BATCH and whole(res)
    st = d.status()
    assert st["pipelines"][0]["slow_clients_detached"] == 1
    assert st["pipelines"][0]["held_back_by"] is None
    victim.signal(signal.SIGCONT)
    res = victim.wait(timeout=60)
    assert res.rc != 0
    assert "detached: " in res.stderr and "batches behind and no progress for 1.5 s " \
        "(slow_client_timeout, docs/spec.md)" in res.stderr, res.stderr
    assert re.search(r"client\.slow_detach pipeline=bc client=\d+ pid=%d lag=\d+ idle_s=1\.5 "
                     r"why=\"detached: " % victim.pid, d.log())
    # what it had been given before it was detached it reads whole: the
    # slots of the batches it held were not rebuilt under it
    nb = len(res.dump) // (BATCH * SEQ * 8 * 2)
    assert nb >= 1 and len(res.dump) == nb * BATCH * SEQ * 16, len(res.dump)
    assert position_indices(res.dump, SEQ, [BATCH] * nb) == \
        [list(range(i, i + BATCH)) for i in range(0, nb * BATCH, BATCH)]


def verbose_seqs(stderr, bpe):
    """Stream positions of each batch, from consume --verbose lines."""
    out = []
    for line in stderr.splitlines():
        m = re.match(r"epoch (\d+) batch (\d+) rows", line)
        if m:
            out.append(int(m.group(1)) * bpe + int(m.group(2)))
    return out


def test_skip_serves_a_stopped_client_from_where_the_stream_is(daemon, workdir):
    d = daemon()
    make_pipeline(d, workdir, slow_clients="skip", slow_client_timeout=1, epochs=0)
    bpe = NSAMPLES // BATCH
    victim = start_three(d, "--batches", 30, "--verbose")
    others = [d.popen_consume("bc", "--mode", "broadcast", "--batches", 2 * bpe) for _ in range(2)]
    for c in others:                      # nobody waits: they finish while it is stopped
        res = c.wait(timeout=60, check=True)
        assert res.json["batches"] == 2 * bpe
        assert position_indices(res.dump, SEQ, [BATCH] * 2 * bpe) == \
            2 * [list(range(i, i + BATCH)) for i in range(0, NSAMPLES, BATCH)]
    st = d.status()
    (a,) = [c for c in st["clients"] if c["pid"] == victim.pid]
    skipped = a["attachments"][0]["skipped"]
    assert skipped > 0, a
    assert st["pipelines"][0]["slow_clients_detached"] == 0
    victim.signal(signal.SIGCONT)
    res = victim.wait(timeout=60, check=True)
    seqs = verbose_seqs(res.stderr, bpe)
    assert len(seqs) == 30 == res.json["batches"]
    # what its parked requests got before it was set aside (from the start:
    # they waited for min_clients), then one gap, then on from where the
    # others had got to when it read again
    gaps = [j for j in range(1, 30) if seqs[j] != seqs[j - 1] + 1]
    assert len(gaps) == 1, seqs
    k = gaps[0]
    assert seqs[:k] == list(range(k)) and seqs[k:] == list(range(seqs[k], seqs[k] + 30 - k)), seqs
    assert seqs[k] >= 2 * bpe - 8, seqs       # the others read 2 epochs meanwhile
    assert 0 < skipped <= seqs[k] - k, (skipped, seqs)
    # every batch it got is the stream's batch of that position
    got = position_indices(res.dump, SEQ, [BATCH] * 30)
    assert got == [list(range((q % bpe) * BATCH, (q % bpe) * BATCH + BATCH)) for q in seqs]
    assert re.search(r"client\.slow_skip pipeline=bc client=\d+ pid=%d lag=\d+ why=\"no "
                     r"progress: served from where the stream is" % victim.pid, d.log())
    assert re.search(r"client\.slow_resume pipeline=bc client=\d+ pid=%d skipped=\d+"
                     % victim.pid, d.log())


def test_slow_but_live_client_is_never_detached(daemon, workdir):
    """A client that keeps reading, however slowly, sets the pace: nobody is
    detached even with a short timeout."""
    d = daemon()
    make_pipeline(d, workdir, slow_client_timeout=0.5)
    slow = d.popen_consume("bc", "--mode", "broadcast", "--batches", 20, "--delay", 100)
    fast = [d.popen_consume("bc", "--mode", "broadcast") for _ in range(2)]
    for c in fast:
        assert whole(c.wait(timeout=120, check=True))
    res = slow.wait(timeout=120, check=True)
    assert position_indices(res.dump, SEQ, [BATCH] * 20) == [list(range(i, i + BATCH))
                                                             for i in range(0, 20 * BATCH, BATCH)]
    assert d.status()["pipelines"][0]["slow_clients_detached"] == 0


def test_slow_client_spec_errors(ld, workdir):
    tok = os.path.join(workdir, "pos.bin")
    position_tokens(tok, 100 * SEQ + 1)
    for bad, msg in (({"slow_clients": "drop"}, 'slow_clients: must be "wait" or "skip"'),
                     ({"slow_client_timeout": 0}, "slow_client_timeout: must be a number of seconds "
                                                   "in 0.1..86400"),
                     ({"max_lag": 0}, "max_lag: must be an integer in 1..1024")):
        r = ld.create(token_spec("x", tok, SEQ, "uint32", **bad), check=False)
        assert r.returncode != 0 and msg in r.stderr, (bad, r.stderr)


def test_a_revoke_after_a_skip_returns_batches_from_both_sides(daemon, workdir):
    """A skipped client, continued, holds deliveries from before the jump
    (untaken) and gets new ones from after it; a client attaching then
    of a second stream (partition) halves its share, and the deliveries it hands back for the Revoke
    straddle the jump (the soak found it). Those after the jump come again, those before it are
    skipped as the jump was (the stream has moved on): its stream stays in
    order with exact contents, never "return: lease ... is not delivery"."""
    d = daemon()
    make_pipeline(d, workdir, slow_clients="skip", slow_client_timeout=1, epochs=0)
    bpe = NSAMPLES // BATCH
    victim = start_three(d, "--batches", 12, "--verbose", "--inflight", 6, "--delay", 700)
    others = [d.popen_consume("bc", "--mode", "broadcast", "--batches", 2 * bpe) for _ in range(2)]
    for c in others:
        c.wait(timeout=60, check=True)

    def victim_att(s):
        (a,) = [c for c in s["clients"] if c["pid"] == victim.pid]
        return a["attachments"][0]

    before = victim_att(d.status())
    assert before["skipped"] > 0 and before["leases"] == 6, before
    victim.signal(signal.SIGCONT)
    # it takes one, shows progress, and is delivered from where the stream is
    d.wait_for(lambda s: victim_att(s)["delivered"] > before["delivered"],
               "a delivery after the jump", timeout=30)
    # a stream of its own (partition): the slots are split between the two
    late = d.popen_consume("bc", "--mode", "partition", "--rank", 0, "--world-size", 1,
                           "--batches", 4)
    d.wait_for(lambda s: victim_att(s)["returned"] > 0, "the victim's answer to a revoke",
               timeout=30)
    res = victim.wait(timeout=60, check=True)
    late.wait(timeout=60, check=True)
    seqs = verbose_seqs(res.stderr, bpe)
    assert len(seqs) == 12 == res.json["batches"], seqs
    assert seqs == sorted(set(seqs)) and seqs[:2] == [0, 1], seqs
    assert seqs[-1] >= 2 * bpe - 8, seqs           # it read on from where the others were
    got = position_indices(res.dump, SEQ, [BATCH] * 12)
    assert got == [list(range((q % bpe) * BATCH, (q % bpe) * BATCH + BATCH)) for q in seqs]
    assert "is not delivery" not in d.log()
