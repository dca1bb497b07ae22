# SPDX-License-Identifier: MIT
"""/metrics (settings metrics_address): Prometheus text exposition over TCP
and over a unix socket, scraped for real and parsed with prometheus_client's
own parser (Debian's python3-prometheus-client), checked against a known run.
"""

import errno
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ldrtest import LOADERD, python_client_env, random_tokens, token_spec
from users import open_to_all, users  # noqa: F401 (the fixture)

_VERSION = subprocess.run([LOADERD, "--version"], capture_output=True, text=True).stdout
pytestmark = pytest.mark.skipif("libmicrohttpd: not built in" in _VERSION,
                                reason="loaderd built without libmicrohttpd (-Dmetrics)")

# A trainer: reads one epoch of a pipeline, releasing each batch (after
# sleeping SLEEP seconds: its "compute"), says how many it read, then stays
# attached until stdin closes.
TRAINER = textwrap.dedent("""
    import sys, time
    import loaderd
    sock, pipeline, name, sleep_s = sys.argv[1:5]
    dl = loaderd.DataLoader(pipeline, socket=sock, as_numpy=True, name=name)
    n = 0
    for b in dl:
        time.sleep(float(sleep_s))
        b.release()
        n += 1
    print("consumed", n, flush=True)
    sys.stdin.readline()
""")


class Trainer:
    def __init__(self, d, pipeline, name, sleep_s=0.0):
        self.p = subprocess.Popen([sys.executable, "-c", TRAINER, d.socket, pipeline, name,
                                   str(sleep_s)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=python_client_env())
        line = self.p.stdout.readline()
        assert line.startswith("consumed "), \
            f"trainer: {line!r}\n{self.p.stderr.read()}\n{d.log()[-3000:]}"
        self.batches = int(line.split()[1])

    def exit(self):
        self.p.stdin.close()
        assert self.p.wait(timeout=30) == 0, self.p.stderr.read()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over AF_UNIX: http.client with the socket connected by hand."""

    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.unix_path)


def get_unix(path, url="/metrics", method="GET"):
    c = UnixHTTPConnection(path)
    try:
        c.request(method, url)
        r = c.getresponse()
        return r.status, r.getheader("Content-Type"), r.read().decode()
    finally:
        c.close()


def get_tcp(port, url="/metrics"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{url}", timeout=10) as r:
        return r.status, r.headers["Content-Type"], r.read().decode()


def parse(text):
    """{family name: family}; every family once, as the format wants."""
    fams = {}
    for f in text_string_to_metric_families(text):
        assert f.name not in fams, f"family {f.name} twice"
        fams[f.name] = f
    return fams


def samples(fams, family, name=None, **labels):
    """The samples of @family (sample name @name, default the family's)
    whose labels include @labels."""
    f = fams[family]
    name = name or f.name
    return [s for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def value(fams, family, name=None, **labels):
    got = samples(fams, family, name, **labels)
    assert len(got) == 1, (family, labels, got)
    return got[0].value


def check_histograms(fams):
    """Every loaderd_client_wait_seconds series is a valid histogram:
    cumulative buckets in rising le order, +Inf last and equal to _count."""
    f = fams["loaderd_client_wait_seconds"]
    assert f.type == "histogram"
    series = {}
    for s in f.samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        series.setdefault(key, {"buckets": [], "count": None, "sum": None})
        if s.name.endswith("_bucket"):
            series[key]["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_count"):
            series[key]["count"] = s.value
        elif s.name.endswith("_sum"):
            series[key]["sum"] = s.value
    for key, h in series.items():
        les = [b[0] for b in h["buckets"]]
        assert les == sorted(les) and les[-1] == float("inf"), (key, les)
        counts = [b[1] for b in h["buckets"]]
        assert counts == sorted(counts), (key, counts)
        assert counts[-1] == h["count"], key
        assert h["sum"] is not None and h["sum"] >= 0, key
    return series


@pytest.fixture
def tokens(workdir):
    """100 samples of 64 tokens."""
    tok = os.path.join(workdir, "t.bin")
    random_tokens(tok, 64 * 100 + 1, "uint16", seed=7)
    return tok


def loaderd_version():
    return _VERSION.splitlines()[0].split()[1]


def test_metrics_over_tcp_match_a_known_run(daemon, workdir, tokens):
    port = free_port()
    cfg = os.path.join(workdir, "loaderd.json")
    # one epoch of 3 batches (and a 10-sample rest, dropped)
    write_config(cfg, {"metrics_address": f"127.0.0.1:{port}", "pipelines": [
        token_spec("a", tokens, 64, "uint16", batch_size=30, drop_last=True, prefetch=4)]})
    d = daemon("--config", cfg)

    code, ctype, text = get_tcp(port)
    assert code == 200 and ctype == "text/plain; version=0.0.4; charset=utf-8"
    # loaderd_clients counts every connection, a `loaderctl status` poll's
    # too, until the daemon has handled its close (a moment after the poll
    # exited); so it is scraped until the harness's last poll is gone
    fams = scrape_until(port, lambda f: value(f, "loaderd_clients") == 0,
                        "no client but the exited status polls")
    assert fams["loaderd_build_info"].type == "gauge"
    info = samples(fams, "loaderd_build_info")
    assert len(info) == 1 and info[0].value == 1
    assert info[0].labels["version"] == loaderd_version()
    st = d.status()
    assert info[0].labels["protocol"] == str(st["protocol"])
    assert value(fams, "loaderd_workers") == st["workers"] == 2
    assert value(fams, "loaderd_memory_limit_bytes") == st["memory_limit"]
    assert value(fams, "loaderd_clients") == 0

    t = Trainer(d, "a", 'trainer "one"')
    try:
        assert t.batches == 3
        # its last Release travels on its own: the daemon has it when the
        # pipeline is done (every built batch delivered and released)
        d.wait_for(lambda st: st["pipelines"][0]["state"] == "done" and
                   st["clients"][0]["leases"] == 0, "the trainer's last release")
        # the trainer only, once wait_for's last status poll is gone too
        fams = scrape_until(port, lambda f: value(f, "loaderd_clients") == 1,
                            "the trainer the only client")
        pl = d.pipeline("a")
        assert value(fams, "loaderd_pipeline_batch_size", pipeline="a") == 30
        assert value(fams, "loaderd_pipeline_batches_per_epoch", pipeline="a") == 3
        assert value(fams, "loaderd_pipeline_dataset_samples", pipeline="a") == 100
        assert value(fams, "loaderd_pipeline_slot_bytes", pipeline="a") == pl["slot_bytes"]
        assert value(fams, "loaderd_pipeline_clients", pipeline="a") == 1
        assert value(fams, "loaderd_pipeline_state", pipeline="a", state="done") == 1
        assert value(fams, "loaderd_pipeline_state", pipeline="a", state="running") == 0
        # every batch read and released: every slot is free
        slots = {s.labels["state"]: s.value for s in samples(fams, "loaderd_pipeline_slots",
                                                              pipeline="a")}
        assert slots == {"ready": 0, "leased": 0, "filling": 0, "free": pl["slots_total"]}
        assert pl["slots_total"] == 4
        assert fams["loaderd_pipeline_batches"].type == "counter"
        assert value(fams, "loaderd_pipeline_batches", "loaderd_pipeline_batches_total",
                     pipeline="a") == 3

        assert value(fams, "loaderd_clients") == 1
        (cl,) = d.status()["clients"]
        labels = {"pipeline": "a", "client": str(cl["id"]), "client_name": 'trainer "one"',
                  "uid": str(os.getuid())}
        assert fams["loaderd_client_batches"].type == "counter"
        assert value(fams, "loaderd_client_batches", "loaderd_client_batches_total", **labels) == 3
        assert value(fams, "loaderd_client_leases", **labels) == 0
        # 3 batches of 30 samples, each an input and a target of 64 int64
        assert value(fams, "loaderd_client_samples", "loaderd_client_samples_total", **labels) == 90
        assert value(fams, "loaderd_client_bytes", "loaderd_client_bytes_total", **labels) == \
            90 * 2 * 64 * 8
        assert value(fams, "loaderd_pipeline_samples", "loaderd_pipeline_samples_total",
                     pipeline="a") == 90
        assert value(fams, "loaderd_pipeline_bytes", "loaderd_pipeline_bytes_total",
                     pipeline="a") == 90 * 2 * 64 * 8
        assert value(fams, "loaderd_pipeline_jobs", pipeline="a") == 0
        assert value(fams, "loaderd_pipeline_limited_by", pipeline="a", reason="done") == 1
        assert sum(s.value for s in samples(fams, "loaderd_pipeline_limited_by", pipeline="a")) == 1
        (h,) = check_histograms(fams).values()
        st = d.status()["clients"][0]["attachments"][0]["stats"]
        assert h["count"] == st["next_calls_total"] > 0
        assert h["sum"] == pytest.approx(st["wait_seconds_total"], rel=1e-12)
    finally:
        t.exit()
    # the trainer has exited; the daemon drops its series once it has handled
    # the closed connection (and a text that took 5 ms or more to build is
    # served again for ten times as long: docs/metrics.md)
    fams = scrape_until(port, lambda f: value(f, "loaderd_clients") == 0,
                        "the exited trainer gone")
    assert value(fams, "loaderd_clients") == 0
    assert samples(fams, "loaderd_client_batches", "loaderd_client_batches_total") == []


def test_metrics_over_a_unix_socket(daemon, workdir, tokens):
    path = os.path.join(workdir, "metrics.sock")
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"metrics_address": path, "socket_mode": "0600", "pipelines": [
        token_spec("u", tokens, 64, "uint16", batch_size=25)]})
    d = daemon("--config", cfg)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    code, ctype, text = get_unix(path)
    assert code == 200 and ctype.startswith("text/plain; version=0.0.4")
    fams = parse(text)
    assert value(fams, "loaderd_pipeline_batches_per_epoch", pipeline="u") == 4
    assert d.consume("u").json["batches"] == 4

    # only GET /metrics
    code, _, body = get_unix(path, "/")
    assert code == 404 and body == "not found: loaderd serves only /metrics\n"
    code, _, body = get_unix(path, "/metrics/x")
    assert code == 404
    code, _, body = get_unix(path, "/metrics", method="POST")
    assert code == 405 and body == "method not allowed: /metrics is read with GET\n"
    code, _, body = get_unix(path, "/metrics", method="HEAD")
    assert code == 200 and body == ""
    d.stop()
    assert not os.path.exists(path)


SCRAPE_AS = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sys.argv[1])
    except OSError as e:
        print("refused", e.errno)
        sys.exit(0)
    s.sendall(b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    print(data.split(b"\\r\\n")[0].decode())
""")


def test_a_unix_socket_keeps_the_metrics_to_its_group(daemon, workdir, users):
    """socket_group and socket_mode make /metrics as private as the
    control socket: the group's members read it, other users cannot connect."""
    alice, bob = users
    open_to_all(workdir)
    path = os.path.join(workdir, "metrics.sock")
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"metrics_address": path, "socket_group": alice.team.gr_name})
    daemon("--config", cfg)
    st = os.stat(path)
    assert st.st_mode & 0o777 == 0o660 and st.st_gid == alice.team.gr_gid
    for user, team, want in ((alice, True, "HTTP/1.1 200 OK"), (bob, True, "HTTP/1.1 200 OK"),
                             (alice, False, f"refused {errno.EACCES}"),
                             (bob, False, f"refused {errno.EACCES}")):
        r = user.run([sys.executable, "-c", SCRAPE_AS, path], team=team, check=True)
        assert r.stdout.strip() == want, (user.name, team, r.stdout, r.stderr)


def test_404_and_405_over_tcp(daemon, workdir):
    port = free_port()
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"metrics_address": f"127.0.0.1:{port}"})
    daemon("--config", cfg)
    with pytest.raises(urllib.error.HTTPError) as e:
        get_tcp(port, "/")
    assert e.value.code == 404
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405 and e.value.headers["Allow"] == "GET, HEAD"


def test_garbage_and_idle_scrapers_leave_the_daemon_serving(daemon, workdir, tokens):
    port = free_port()
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"metrics_address": f"127.0.0.1:{port}", "pipelines": [
        token_spec("g", tokens, 64, "uint16", batch_size=25)]})
    d = daemon("--config", cfg)
    # not HTTP at all, left open: libmicrohttpd closes it after its idle
    # timeout; meanwhile everything else goes on
    garbage = socket.create_connection(("127.0.0.1", port), timeout=30)
    garbage.sendall(b"\x00\xff garbage\r\n\r\n")
    # each is answered with an HTTP error
    for junk, status in ((b"GET /metrics HTTP/9.9\r\n\r\n", b"505"),
                         (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", b"400"),
                         (b"GET " + b"/x" * 20000 + b" HTTP/1.1\r\n\r\n", b"414")):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            try:
                c.sendall(junk)
                c.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass  # it answered and closed before the rest was sent
            reply = b""
            try:
                while chunk := c.recv(65536):
                    reply += chunk
            except ConnectionResetError:
                pass
        assert reply.startswith(b"HTTP/1.1 " + status + b" "), (junk[:40], reply[:80])
    # more idle connections than it takes: the control socket is not theirs
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
    try:
        assert d.consume("g").json["batches"] == 4
    finally:
        for c in idle:
            c.close()
    d.wait_for(lambda st: get_tcp(port)[0] == 200, "a scrape once the idle ones are gone")
    garbage.close()
    assert d.alive()


@pytest.mark.parametrize("addr, needle", [
    ("127.0.0.1", "no port"),
    ("127.0.0.1:0", "the port must be a number in 1..65535"),
    ("127.0.0.1:70000", "the port must be a number in 1..65535"),
    ("127.0.0.1:94x", "the port must be a number in 1..65535"),
    (":9464", "no host"),
    ("::1:9464", "an IPv6 address goes in brackets"),
    ("[::1:9464", "an IPv6 address needs the form [ADDR]:PORT"),
    ("relative/metrics.sock", "no port"),
    ("/" + "x" * 120, "socket path too long"),
    (9464, "metrics_address: must be a string"),
])
def test_bad_metrics_address_is_a_settings_error(workdir, addr, needle):
    cfg = os.path.join(workdir, "c.json")
    sock = os.path.join(workdir, "s.sock")
    write_config(cfg, {"metrics_address": addr})
    for args in (["--config", cfg, "--socket", sock], ["--check-config=" + cfg]):
        p = subprocess.run([LOADERD] + args, capture_output=True, text=True, timeout=30)
        assert p.returncode == 1, p
        assert f"{cfg}: metrics_address: " in p.stderr and needle in p.stderr, p.stderr
    assert not os.path.exists(sock)


def test_an_unresolvable_host_stops_the_start_and_the_check(workdir):
    cfg = os.path.join(workdir, "c.json")
    sock = os.path.join(workdir, "s.sock")
    write_config(cfg, {"metrics_address": "no-such-host.invalid:9464"})
    p = subprocess.run([LOADERD, "--config", cfg, "--socket", sock], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 1
    assert ("loaderd: metrics_address no-such-host.invalid:9464: host no-such-host.invalid: "
            in p.stderr), p.stderr
    assert not os.path.exists(sock)
    p = subprocess.run([LOADERD, "--check-config=" + cfg], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 1
    assert (f'loaderd: {cfg}: metrics_address: "no-such-host.invalid:9464": host '
            f'no-such-host.invalid: ' in p.stderr), p.stderr
    assert "ok:" not in p.stdout
    # set by a drop-in: the error names the drop-in
    write_config(cfg, {"metrics_address": "127.0.0.1:9464"})
    os.mkdir(os.path.join(workdir, "conf.d"))
    drop = os.path.join(workdir, "conf.d", "50-metrics.json")
    write_config(drop, {"metrics_address": "no-such-host.invalid:9464"})
    p = subprocess.run([LOADERD, "--check-config=" + cfg], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 1
    assert f'loaderd: {drop}: metrics_address: "no-such-host.invalid:9464": host ' in p.stderr, \
        p.stderr


def test_port_in_use_is_a_clear_startup_error(workdir):
    cfg = os.path.join(workdir, "c.json")
    sock = os.path.join(workdir, "s.sock")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        write_config(cfg, {"metrics_address": f"127.0.0.1:{port}"})
        p = subprocess.run([LOADERD, "--config", cfg, "--socket", sock], capture_output=True,
                           text=True, timeout=30)
    assert p.returncode == 1
    assert f"loaderd: metrics_address 127.0.0.1:{port}: cannot listen: Address already in use" \
        in p.stderr, p.stderr
    # the control socket it had bound is gone again
    assert not os.path.exists(sock)


def forbid_ip_sockets():
    """In the child before exec: socket(AF_INET or AF_INET6) fails with
    EAFNOSUPPORT, by a seccomp filter, as systemd's RestrictAddressFamilies=
    makes it fail (x86_64 only)."""
    import ctypes
    import struct
    libc = ctypes.CDLL(None, use_errno=True)
    ld_abs, jeq, ret = 0x20, 0x15, 0x06
    prog = [(ld_abs, 0, 0, 4), (jeq, 0, 5, 0xC000003E),     # arch x86_64, else allow
            (ld_abs, 0, 0, 0), (jeq, 0, 3, 41),             # socket(), else allow
            (ld_abs, 0, 0, 16), (jeq, 2, 0, socket.AF_INET), (jeq, 1, 0, socket.AF_INET6),
            (ret, 0, 0, 0x7FFF0000),                        # allow
            (ret, 0, 0, 0x00050000 | 97)]                   # errno EAFNOSUPPORT
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog))
    fprog = struct.pack("HxxxxxxP", len(prog), ctypes.addressof(code))
    fbuf = ctypes.create_string_buffer(fprog)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, fbuf, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the seccomp filter is x86_64's")
def test_tcp_forbidden_by_the_unit_says_what_to_do(workdir):
    cfg = os.path.join(workdir, "c.json")
    sock = os.path.join(workdir, "s.sock")
    write_config(cfg, {"metrics_address": "127.0.0.1:9"})
    p = subprocess.run([LOADERD, "--config", cfg, "--socket", sock], capture_output=True,
                       text=True, timeout=30, preexec_fn=forbid_ip_sockets)
    assert p.returncode == 1
    assert ("loaderd: metrics_address 127.0.0.1:9: cannot listen: Address family not supported "
            "by protocol (loaderd.service allows unix sockets only: use a socket path, or see "
            "docs/metrics.md)") in p.stderr, p.stderr


def test_a_new_address_on_reload_waits_for_a_restart(daemon, workdir):
    port, other = free_port(), free_port()
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"metrics_address": f"127.0.0.1:{port}"})
    d = daemon("--config", cfg)
    write_config(cfg, {"metrics_address": f"127.0.0.1:{other}"})
    os.kill(d.pid, signal.SIGHUP)
    def warned(st):
        return any(line.split()[2:4] == ["config.restart_needed", "key=metrics_address"] and
                   f"file=127.0.0.1:{other}" in line and
                   'why="it takes effect when loaderd restarts"' in line
                   for line in d.log().splitlines())
    d.wait_for(warned, "the reload's warning")
    assert get_tcp(port)[0] == 200
    with pytest.raises(OSError):
        get_tcp(other)


def test_a_reload_does_not_resolve_the_address(daemon, workdir):
    """A reload checks metrics_address's syntax only: a host that does not
    resolve is not the reload's error (the resolver stays off the loop), it
    waits for a restart like any other new address."""
    port = free_port()
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"metrics_address": f"127.0.0.1:{port}"})
    d = daemon("--config", cfg)
    write_config(cfg, {"metrics_address": "no-such-host.invalid:9464"})
    rep = d.ctl_json("reload")
    assert rep["restart_needed"] == [{"key": "metrics_address", "running": f"127.0.0.1:{port}",
                                      "file": "no-such-host.invalid:9464"}], rep
    assert get_tcp(port)[0] == 200
    write_config(cfg, {"metrics_address": "127.0.0.1:0"})
    r = d.ctl("reload", check=False)
    assert r.returncode != 0 and "metrics_address: " in r.stderr and \
        "the port must be a number in 1..65535" in r.stderr, r.stderr


def test_a_replaced_pipeline_and_its_successor_are_told_apart(daemon, workdir, tokens):
    """While a reload's replaced pipeline still has a client, it and its
    successor have the same name: the generation label keeps their series
    apart (else Prometheus refuses the whole scrape), and the state gauge is
    1 for "replaced" and "draining"."""
    port = free_port()
    cfg = os.path.join(workdir, "loaderd.json")
    spec_a = token_spec("a", tokens, 64, "uint16", batch_size=4, epochs=0)
    spec_b = token_spec("b", tokens, 64, "uint16", batch_size=4, epochs=0)
    write_config(cfg, {"metrics_address": f"127.0.0.1:{port}", "pipelines": [spec_a, spec_b]})
    d = daemon("--config", cfg)
    # each holds its first batch for an hour: attached until killed
    readers = [d.popen_consume(name, "--delay", "3600000", dump=False) for name in ("a", "b")]
    d.wait_for(lambda st: sorted(a["pipeline"] for c in st["clients"] for a in c["attachments"]
                                 if a["delivered"] >= 1) == ["a", "b"], "both read")
    write_config(cfg, {"metrics_address": f"127.0.0.1:{port}",
                       "pipelines": [dict(spec_b, batch_size=5)]})
    rep = d.ctl_json("reload")
    assert rep["pipelines"]["replaced"] == [{"name": "b", "changed": "batch_size 5 (it has 4)"}]
    assert rep["pipelines"]["draining"] == [{"name": "a", "clients": 1}]
    gens = {(p["name"], p["state"]): p["generation"] for p in d.status()["pipelines"]}
    assert gens == {("a", "draining"): 0, ("b", "replaced"): 0, ("b", "running"): 1}, gens

    status, _, text = get_tcp(port)
    assert status == 200
    fams = parse(text)
    for f in fams.values():
        keys = [(s.name, tuple(sorted(s.labels.items()))) for s in f.samples]
        assert len(keys) == len(set(keys)), f"{f.name}: a label set twice"
    assert value(fams, "loaderd_pipeline_batch_size", pipeline="b", generation="0") == 4
    assert value(fams, "loaderd_pipeline_batch_size", pipeline="b", generation="1") == 5
    assert value(fams, "loaderd_pipeline_clients", pipeline="b", generation="0") == 1
    assert value(fams, "loaderd_pipeline_clients", pipeline="b", generation="1") == 0
    states = {(s.labels["pipeline"], s.labels["generation"], s.labels["state"]): s.value
              for s in samples(fams, "loaderd_pipeline_state")}
    values = ("starting", "running", "done", "failed", "draining", "replaced")
    want = {("a", "0", "draining"), ("b", "0", "replaced"), ("b", "1", "running")}
    assert states == {(pl, g, v): float((pl, g, v) in want)
                      for pl, g in (("a", "0"), ("b", "0"), ("b", "1")) for v in values}, states

    for r in readers:
        r.signal(signal.SIGKILL)
        r.wait()
    d.wait_for(lambda st: sorted((p["name"], p["generation"]) for p in st["pipelines"]) ==
               [("b", 1)], "the retired pipelines dropped")
    # the scrape above may be served again as it was for ten times as long as
    # it took to build, when that was 5 ms or more (docs/metrics.md): a text
    # without the retired pipelines is a fresh one
    fams = scrape_until(port, lambda f: all(s.labels["pipeline"] != "a" for s in
                                            samples(f, "loaderd_pipeline_state")),
                        "a scrape after the retired pipelines went")
    assert [s.labels for s in samples(fams, "loaderd_pipeline_state", state="running")] == \
        [{"pipeline": "b", "generation": "1", "state": "running"}]


@pytest.mark.parametrize("host, url_host", [("[::1]", "[::1]"), ("localhost", "localhost")])
def test_ipv6_and_a_host_name(daemon, workdir, host, url_host):
    port = free_port()
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"metrics_address": f"{host}:{port}"})
    d = daemon("--config", cfg)
    assert f"metrics on http://{host}:{port}/metrics" in d.log()
    with urllib.request.urlopen(f"http://{url_host}:{port}/metrics", timeout=10) as r:
        fams = parse(r.read().decode())
    assert samples(fams, "loaderd_build_info")[0].labels["version"] == loaderd_version()
    d.stop()


# A trainer that reads until it is killed: SLEEP seconds of "compute" per
# batch; it says when it has its first batch.
STREAMER = textwrap.dedent("""
    import sys, time
    import loaderd
    sock, pipeline, name, sleep_s = sys.argv[1:5]
    dl = loaderd.DataLoader(pipeline, socket=sock, as_numpy=True, name=name)
    first = True
    while True:
        for b in dl:
            if first:
                print("reading", flush=True)
                first = False
            time.sleep(float(sleep_s))
            b.release()
""")


class Streamer:
    def __init__(self, d, pipeline, name, sleep_s):
        self.p = subprocess.Popen([sys.executable, "-c", STREAMER, d.socket, pipeline, name,
                                   str(sleep_s)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=python_client_env())
        line = self.p.stdout.readline()
        assert line == "reading\n", f"streamer: {line!r}\n{self.p.stderr.read()}\n{d.log()[-3000:]}"

    def kill(self):
        self.p.kill()
        self.p.wait(timeout=30)


def att_stats(st, name):
    (cl,) = [c for c in st["clients"] if c["name"] == name]
    (a,) = cl["attachments"]
    return a.get("stats")


def scrape_until(port, pred, what, timeout=60.0):
    """Scrape until @pred(families) holds; the families then."""
    import time
    end = time.monotonic() + timeout
    while True:
        fams = parse(get_tcp(port)[2])
        if pred(fams):
            return fams
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def bucket_quantile(fams, q, **labels):
    """The upper bound of the bucket where quantile @q of a wait histogram falls."""
    f = fams["loaderd_client_wait_seconds"]
    buckets = sorted((float(s.labels["le"]), s.value) for s in f.samples
                     if s.name.endswith("_bucket")
                     and all(s.labels.get(k) == v for k, v in labels.items()))
    total = buckets[-1][1]
    return next(le for le, n in buckets if n >= q * total)


def test_slow_trainer_and_starved_trainer_told_apart(daemon, workdir, tokens):
    """One worker: a trainer that sleeps 200 ms a batch on a token pipeline,
    and one that computes nothing on an image pipeline (PNGs to decode).
    The first hardly waits, the second mostly waits, and /metrics says so:
    orderings only, no speed is asserted."""
    from imgtest import make_folder
    root = os.path.join(workdir, "img")
    make_folder(root, ["a", "b"], 4, [(480, 640)], fmt="PNG", ext=".png")
    port = free_port()
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"metrics_address": f"127.0.0.1:{port}", "pipelines": [
        token_spec("fast", tokens, 64, "uint16", batch_size=10, epochs=0),
        # few image jobs queued at once, so the token pipeline's jobs get the
        # one worker soon even in a sanitizer build
        {"name": "heavy", "source": {"kind": "image_folder", "path": root}, "batch_size": 4,
         "epochs": 0, "prefetch": 4, "decode": {"dct_scaling": False},
         "transforms": [{"op": "random_resized_crop", "size": 224},
                        {"op": "horizontal_flip", "p": 0.5}],
         "output": {"dtype": "float32", "layout": "NCHW"}}]})
    d = daemon("--config", cfg, workers=1)
    slow = Streamer(d, "fast", "slow-trainer", 0.2)
    starved = Streamer(d, "heavy", "starved-trainer", 0)
    trainers = ("slow-trainer", "starved-trainer")

    def of(fams, family, name, trainer):
        return value(fams, family, name, client_name=trainer)

    def told_apart(fams):
        # start-up waits (the first token batches queue behind image jobs
        # on the one worker) leave the daemon's window after a few seconds
        calls = [samples(fams, "loaderd_client_next_calls", "loaderd_client_next_calls_total",
                         client_name=t) for t in trainers]
        return (all(c and c[0].value >= 12 for c in calls) and
                samples(fams, "loaderd_pipeline_limited_by", pipeline="fast",
                        reason="consumers")[0].value == 1 and
                samples(fams, "loaderd_pipeline_limited_by", pipeline="heavy",
                        reason="workers")[0].value == 1)
    try:
        fams = scrape_until(port, told_apart, "the fast pipeline limited by its consumer and "
                            "the heavy one by its worker", timeout=120)
        check_histograms(fams)
        ratio = {t: of(fams, "loaderd_client_wait_ratio", None, t) for t in trainers}
        assert ratio["starved-trainer"] > ratio["slow-trainer"], ratio
        waited = {t: of(fams, "loaderd_client_wait_seconds", "loaderd_client_wait_seconds_sum", t)
                  for t in trainers}
        computed = {t: of(fams, "loaderd_client_compute_seconds",
                          "loaderd_client_compute_seconds_total", t) for t in trainers}
        assert waited["starved-trainer"] > computed["starved-trainer"], (waited, computed)
        assert computed["slow-trainer"] > waited["slow-trainer"], (waited, computed)
        for q in (0.5, 0.99):
            assert bucket_quantile(fams, q, client_name="slow-trainer") <= \
                bucket_quantile(fams, q, client_name="starved-trainer"), q
        assert value(fams, "loaderd_pipeline_workers_busy_ratio", pipeline="heavy") > \
            value(fams, "loaderd_pipeline_workers_busy_ratio", pipeline="fast")
        assert value(fams, "loaderd_pipeline_workers", pipeline="heavy") == 1
        decode = value(fams, "loaderd_pipeline_stage_seconds", "loaderd_pipeline_stage_seconds_total",
                       pipeline="heavy", stage="decode")
        assert decode > value(fams, "loaderd_pipeline_stage_seconds",
                              "loaderd_pipeline_stage_seconds_total", pipeline="fast",
                              stage="decode") == 0
        # the histogram counts every ldr_next() the trainer reported
        for t in trainers:
            assert of(fams, "loaderd_client_wait_seconds", "loaderd_client_wait_seconds_count", t) \
                == of(fams, "loaderd_client_next_calls", "loaderd_client_next_calls_total", t)
            assert of(fams, "loaderd_client_bad_reports", "loaderd_client_bad_reports_total", t) == 0
    finally:
        slow.kill()
        starved.kill()

def test_grafana_dashboard_queries_only_exported_metrics(daemon, workdir, tokens):
    """docs/grafana-dashboard.json is a dashboard whose every query names
    metrics that /metrics has."""
    import re
    from ldrtest import REPO_ROOT
    with open(os.path.join(REPO_ROOT, "docs", "grafana-dashboard.json")) as f:
        dash = json.load(f)
    assert dash["title"] and dash["uid"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for want in ("stall", "p99", "samples/s", "workers busy", "limited by"):
        assert want in titles, want
    port = free_port()
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"metrics_address": f"127.0.0.1:{port}"})
    daemon("--config", cfg)
    fams = parse(get_tcp(port)[2])
    names = set()
    for f in fams.values():
        names.add(f.name)
        if f.type == "counter":
            names.add(f.name + "_total")
        if f.type == "histogram":
            names.update(f.name + s for s in ("_bucket", "_sum", "_count"))
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert exprs
    for e in exprs:
        for m in re.findall(r"\bloaderd_[a-z_]+", e):
            assert m in names, (m, e)
