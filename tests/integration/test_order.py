# SPDX-License-Identifier: MIT
"""A client's order (docs/protocol.md, "Client order"): an attachment made
with client_order gets exactly the batches its ldr_order() calls list, of
any size up to the pipeline's batch_size, with their epoch and batch
numbers; a bad order is refused with what was wrong and changes nothing; a
client that dies with half an epoch sent takes nothing of the daemon's with
it.

The clients are /usr/bin/python3 processes that call libloader through the
package's ctypes binding (loaderd._lib), on a token pipeline of position
tokens: a row's tokens say which sample it is.
"""

import json
import os
import signal
import subprocess
import textwrap

from ldrtest import position_tokens, python_client_env, sequential_batches, token_dump, \
    random_tokens, token_spec

L = 8

CLIENT = textwrap.dedent("""
    import ctypes, json, sys
    import numpy as np
    from loaderd import _lib
    SOCK, NAME = sys.argv[1], sys.argv[2]
    L = _lib.lib()
    c = ctypes.c_void_p()
    assert L.ldr_connect(ctypes.byref(c), SOCK.encode(), b"order-test") == 0

    def attach(client_order=True, **kw):
        o = _lib.ldr_attach_opts()
        o.mode = _lib.MODES["partition"]
        o.client_order = int(client_order)
        for k, v in kw.items():
            setattr(o, k, v)
        a = ctypes.c_void_p()
        r = L.ldr_attach(c, NAME.encode(), ctypes.byref(o), ctypes.byref(a))
        if r < 0:
            raise RuntimeError(L.ldr_client_error(c).decode())
        return a

    def order(a, epoch, first, batches, last):
        sizes = (ctypes.c_uint32 * max(1, len(batches)))(*[len(b) for b in batches])
        flat = [i for b in batches for i in b]
        idx = (ctypes.c_uint64 * max(1, len(flat)))(*flat)
        r = L.ldr_order(a, epoch, first, sizes, len(batches), idx, int(last))
        return r, (L.ldr_client_error(c).decode() if r < 0 else "")

    def read(a, n, seq_len):
        out = []
        for _ in range(n):
            b = ctypes.c_void_p()
            r = L.ldr_next(a, 20000, ctypes.byref(b))
            assert r == 0, (r, L.ldr_client_error(c).decode())
            f = _lib.ldr_field()
            assert L.ldr_batch_field_host(b, 0, ctypes.byref(f)) == 0
            rows = L.ldr_batch_rows(b)
            arr = np.ctypeslib.as_array(ctypes.cast(f.data, ctypes.POINTER(ctypes.c_int64)),
                                        (rows, seq_len))
            out.append([int(L.ldr_batch_epoch(b)), int(L.ldr_batch_index(b)),
                        [int(x) // seq_len for x in arr[:, 0]]])
            L.ldr_release(b)
        return out

    def result(**kw):
        print("RESULT " + json.dumps(kw), flush=True)
""")


def client(ld, name, body, check=True, wait=True):
    ld._spec_no += 1
    path = os.path.join(ld.dir, f"order{ld._spec_no}.py")
    with open(path, "w") as f:
        f.write(CLIENT + textwrap.dedent(body))
    cmd = ["/usr/bin/python3", path, ld.socket, name]
    if not wait:
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=python_client_env())
    r = subprocess.run(cmd, capture_output=True, text=True, env=python_client_env(), timeout=120)
    res = [line[7:] for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if check:
        assert r.returncode == 0 and res, (f"client failed ({r.returncode}):\n{r.stdout[-3000:]}"
                                           f"\n{r.stderr[-3000:]}\ndaemon log:\n{ld.log()[-3000:]}")
    return json.loads(res[-1]) if res else None


def pos_pipeline(ld, name, n, batch_size, **kw):
    path = os.path.join(ld.dir, f"{name}.bin")
    position_tokens(path, n * L + 1)
    ld.create(token_spec(name, path, L, "uint32", batch_size=batch_size, **kw))


def test_client_order_exact(ld):
    """Variable batch sizes, two chunks, two epochs, an order of more indices
    than one request carries (repeats, as WeightedRandomSampler draws):
    delivered exactly as given, with the order's epoch and batch numbers."""
    pos_pipeline(ld, "co", 2000, 500, shuffle=True, seed=5, epochs=0)
    res = client(ld, "co", """
        import random
        rnd = random.Random(7)
        a = attach()
        e0 = [[5, 1, 1999], [0], [7, 8, 9, 10], [3, 3]]
        assert order(a, 0, 0, e0[:2], False) == (0, "")
        assert order(a, 0, 2, e0[2:], True) == (0, "")
        got0 = read(a, 4, 8)
        # 120 batches of 500: 60000 indices, over one request's chunk
        e1 = [[rnd.randrange(2000) for _ in range(500)] for _ in range(120)]
        assert order(a, 1, 0, e1, True) == (0, "")
        got1 = read(a, 120, 8)
        result(got0=got0, got1=got1, e0=e0, e1=e1)
    """)
    assert res["got0"] == [[0, k, b] for k, b in enumerate(res["e0"])]
    assert res["got1"] == [[1, k, b] for k, b in enumerate(res["e1"])]


def test_bad_orders_refused(ld):
    """Each bad order is answered with what was wrong, takes nothing, and the
    attachment goes on with a good one."""
    pos_pipeline(ld, "bad", 100, 8)
    res = client(ld, "bad", """
        a = attach()
        errs = {}
        errs["range"] = order(a, 0, 0, [[1, 2], [3, 100]], False)
        errs["oversize"] = order(a, 0, 0, [list(range(9))], False)
        errs["empty"] = order(a, 0, 0, [[]], False)
        errs["not_started"] = order(a, 0, 4, [[1]], False)
        assert order(a, 0, 0, [[1, 2]], False) == (0, "")
        errs["open"] = order(a, 1, 0, [[1]], True)
        errs["gap"] = order(a, 0, 2, [[1]], True)
        assert order(a, 0, 1, [[4, 5, 6]], True) == (0, "")
        errs["ended"] = order(a, 0, 0, [[1]], True)
        got = read(a, 2, 8)
        plain = attach(client_order=False)
        errs["plain"] = order(plain, 0, 0, [[1]], True)
        try:
            attach(rank=1, world_size=2)
        except RuntimeError as e:
            errs["rank"] = (-22, str(e))
        result(errs=errs, got=got)
    """)
    errs = res["errs"]
    assert errs["range"][0] < 0 and "batch 1 of epoch 0, row 1: index 100 is out of range for " \
        "the 100 samples of pipeline 'bad'" in errs["range"][1]
    assert errs["oversize"][0] < 0 and "batch 0 of epoch 0 has 9 samples, more than the 8 a " \
        "slot of pipeline 'bad' holds (its batch_size)" in errs["oversize"][1]
    assert "batch 0 of epoch 0 is empty" in errs["empty"][1]
    assert "epoch 0 has not started: its first chunk begins at batch 0, not 4" \
        in errs["not_started"][1]
    assert "epoch 1 from batch 0 does not continue the order so far: epoch 0 is open, its " \
        "next batch is 1" in errs["open"][1]
    assert "epoch 0 from batch 2 does not continue" in errs["gap"][1]
    assert "epoch 0 has ended" in errs["ended"][1]
    assert "the attachment was not made with client_order" in errs["plain"][1]
    assert "client_order is for a partition attachment of rank 0 of 1" in errs["rank"][1]
    # nothing of the refused ones was taken
    assert res["got"] == [[0, 0, [1, 2]], [0, 1, [4, 5, 6]]]


def test_client_dies_mid_order(ld):
    """A client killed with half an epoch of its order sent: the daemon goes
    on serving another pipeline, and the pipeline itself takes a new client."""
    pos_pipeline(ld, "half", 400, 16)
    path = os.path.join(ld.dir, "other.bin")
    tok = random_tokens(path, 200 * L + 1, "uint16")
    ld.create(token_spec("other", path, L, "uint16", batch_size=10, epochs=1))
    p = client(ld, "half", """
        import os, signal
        a = attach()
        assert order(a, 0, 0, [[i] for i in range(40)], False) == (0, "")
        read(a, 3, 8)
        print("SENT", flush=True)
        sys.stdin.readline()
        os.kill(os.getpid(), signal.SIGKILL)
    """, wait=False)
    assert p.stdout.readline().strip() == "SENT"
    me = [c for c in ld.status()["clients"] if c["pid"] == p.pid][0]["attachments"][0]
    co = me["client_order"]
    assert (co["next_epoch"], co["next_batch"], co["open"]) == (0, 40, True)
    # the next delivery (libloader keeps a window of them), and what is left
    pos = me["position"]
    assert pos["epoch"] == 0 and 3 <= pos["batch"] < 40
    assert co["batches_ahead"] == 40 - pos["batch"] and co["bytes"] > 0
    out, _ = p.communicate("go\n", timeout=120)
    assert p.returncode == -signal.SIGKILL
    ld.wait_for(lambda s: not any(c["pid"] == p.pid for c in s["clients"]),
                "the killed client gone", timeout=20)
    r = ld.consume("other")
    assert r.dump == token_dump(tok, L, sequential_batches(200, 10))
    res = client(ld, "half", """
        a = attach()
        assert order(a, 0, 0, [[399, 0]], True) == (0, "")
        result(got=read(a, 1, 8))
    """)
    assert res["got"] == [[0, 0, [399, 0]]]
    assert "half" in [x["name"] for x in ld.status()["pipelines"]]


def test_order_bytes_bounded(daemon):
    """What a stream keeps of its client's order counts against the memory
    limit (root's: --memory-limit): an epoch of more indices than it allows is
    refused with the limit and what is held (at the chunk that passes it),
    and the daemon goes on."""
    d = daemon(memory_limit=8 << 20)
    pos_pipeline(d, "big", 100, 4, prefetch=2)
    res = client(d, "big", """
        a = attach()
        n = 1 << 20                                # 8 MiB of indices: over the limit
        sizes = (ctypes.c_uint32 * (n // 4))(*([4] * (n // 4)))
        idx = (ctypes.c_uint64 * n)()
        r = L.ldr_order(a, 0, 0, sizes, n // 4, idx, 1)
        err = L.ldr_client_error(c).decode()
        # the chunks before the refused one were taken: a new attachment
        L.ldr_detach(a)
        a = attach()
        ok = order(a, 0, 0, [[7, 8, 9]], True)
        result(r=r, err=err, ok=ok, got=read(a, 1, 8))
    """)
    assert res["r"] < 0 and "more bytes of sampler order would pass the memory_limit of" \
        in res["err"], res
    assert res["ok"] == [0, ""] and res["got"] == [[0, 0, [7, 8, 9]]]


def test_client_order_followed_across_a_restart(daemon):
    """The order a client gave is kept by libloader until its batches are
    taken, and given again to a restarted daemon from the first batch the
    trainer has not taken: every batch exactly once, in the order given,
    with its epoch and batch numbers; an order refused before the restart
    is not given again; orders after it go on where the last one ended."""
    d1 = daemon()
    position_tokens(os.path.join(d1.dir, "r.bin"), 2000 * L + 1)
    spec = token_spec("r", os.path.join(d1.dir, "r.bin"), L, "uint32", batch_size=500, epochs=0)
    env = python_client_env()
    env["LOADERD_RECONNECT_TIMEOUT"] = "60"
    path = os.path.join(d1.dir, "restart.py")
    with open(path, "w") as f:
        f.write(CLIENT + textwrap.dedent("""
            import random
            rnd = random.Random(3)
            # created by this client: libloader creates it again
            assert L.ldr_create_pipeline(c, sys.argv[3].encode(), 1, None, 0) == 1
            a = attach()
            # 120 batches of 500 (more indices than one request carries)
            # in two chunks, then one more; one refused
            e0 = [[rnd.randrange(2000) for _ in range(500)] for _ in range(120)]
            assert order(a, 0, 0, e0[:100], False) == (0, "")
            assert order(a, 0, 100, e0[100:], False) == (0, "")
            assert order(a, 0, 120, [[1, 2000]], True)[0] < 0
            assert order(a, 0, 120, [[11, 12, 13]], True) == (0, "")
            before = read(a, 3, 8)
            print("took", flush=True)
            sys.stdin.readline()
            after = read(a, 118, 8)
            assert order(a, 1, 0, [[7, 8], [9]], True) == (0, "")
            e1 = read(a, 2, 8)
            result(e0=e0, before=before, after=after, e1=e1,
                   reconnects=int(L.ldr_client_reconnects(c)))
        """))
    p = subprocess.Popen(["/usr/bin/python3", path, d1.socket, "r", json.dumps(spec)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    assert p.stdout.readline() == "took\n", p.stderr.read()
    d1.kill9()
    daemon(socket=d1.socket)
    out, err = p.communicate("\n", timeout=120)
    res = [line[7:] for line in out.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and res, (out, err)
    res = json.loads(res[0])
    want = [[0, k, b] for k, b in enumerate(res["e0"] + [[11, 12, 13]])]
    assert res["before"] + res["after"] == want
    assert res["e1"] == [[1, 0, [7, 8]], [1, 1, [9]]]
    assert res["reconnects"] == 1
