# SPDX-License-Identifier: MIT
"""The Kubernetes manifests of deploy/kubernetes (docs/deploy.md): valid
YAML of the kinds they say, and a daemon that runs as they run it.

The DaemonSet's arguments and ConfigMap are what the built daemon is
started with here (its absolute paths moved under the test's directory,
the volumes' places); its readiness probe is run against it and must
answer; the trainer pod reaches the socket the daemon listens on.
"""

import json
import os
import signal
import stat
import subprocess
import time

import pytest

from loaderd_harness import LOADERCTL, LOADERD, REPO_ROOT, child_env, sanitizer_report

KUBE = os.path.join(REPO_ROOT, "deploy", "kubernetes")


def load(name):
    import yaml   # python3-yaml, scripts/bootstrap
    with open(os.path.join(KUBE, name)) as f:
        return {d["kind"]: d for d in yaml.safe_load_all(f) if d}


def flags(args):
    """{--flag: value} of an argument list of --flag VALUE pairs."""
    assert len(args) % 2 == 0 and all(a.startswith("--") for a in args[::2]), args
    return dict(zip(args[::2], args[1::2]))


def test_daemonset_runs_the_daemon_it_names(daemon, workdir):
    docs = load("loaderd-daemonset.yaml")
    assert set(docs) == {"Namespace", "ConfigMap", "DaemonSet"}
    ds = docs["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["hostPID"] is True  # clients' /proc (docs/deploy.md)
    (c,) = pod["containers"]
    assert c["command"] == ["loaderd"]
    args = flags(c["args"])
    # every flag is one the daemon documents
    helptext = subprocess.run([LOADERD, "--help"], capture_output=True, text=True, check=True).stdout
    for flag in args:
        assert f"  {flag} " in helptext or f", {flag} " in helptext, flag
    sec = c["securityContext"]
    assert sec["capabilities"] == {"drop": ["ALL"], "add": ["SETUID", "SETGID"]}
    assert sec["allowPrivilegeEscalation"] is False and c["resources"]["limits"]["memory"]

    # each path the arguments name lies in a volume of the right kind
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    sock_dir = os.path.dirname(args["--socket"])
    assert mounts[sock_dir]["hostPath"]["type"] == "DirectoryOrCreate"
    assert "hostPath" in mounts[args["--cache-dir"]]
    cfg_dir, cfg_name = os.path.split(args["--config"])
    cm = docs["ConfigMap"]
    assert mounts[cfg_dir]["configMap"]["name"] == cm["metadata"]["name"]
    config = json.loads(cm["data"][cfg_name])

    # the daemon started as the DaemonSet starts it, its paths moved here
    moved = lambda p: workdir + p  # noqa: E731
    os.makedirs(moved(cfg_dir))
    with open(moved(args["--config"]), "w") as f:
        f.write(cm["data"][cfg_name])
    r = subprocess.run([LOADERD, "--check-config=" + moved(args["--config"])],
                       capture_output=True, text=True, env=child_env())
    assert r.returncode == 0, r.stdout + r.stderr
    os.makedirs(moved(sock_dir), mode=0o755)
    argv = [x for k, v in args.items() for x in (k, moved(v))]
    d = daemon(*argv, workers=None, socket=moved(args["--socket"]))
    for probe in (c["readinessProbe"], c["livenessProbe"]):
        cmd = probe["exec"]["command"]
        assert cmd[0] == "loaderctl"
        r = subprocess.run([LOADERCTL] + [moved(a) if a.startswith("/") else a for a in cmd[1:]],
                           capture_output=True, text=True, env=child_env())
        assert r.returncode == 0, r.stderr
    st = d.status()
    oc = st["object_cache"]
    assert oc["cache_bytes"] == 500 << 30 and config["cache_bytes"] == "500G"
    assert stat.S_IMODE(os.stat(moved(args["--socket"])).st_mode) == int(config["socket_mode"], 8)

    # the trainer pod mounts that directory and names that socket
    tp = load("trainer-pod.yaml")["Pod"]["spec"]
    (t,) = tp["containers"]
    tvol = {v["name"]: v for v in tp["volumes"]}
    (m,) = [m for m in t["volumeMounts"] if tvol[m["name"]].get("hostPath")]
    assert tvol[m["name"]]["hostPath"]["path"] == mounts[sock_dir]["hostPath"]["path"]
    assert m["readOnly"] is True
    env = {e["name"]: e.get("value") for e in t["env"]}
    assert env["LOADERD_SOCKET"] == os.path.join(m["mountPath"], os.path.basename(args["--socket"]))
    assert tp["securityContext"]["runAsUser"] != 0


def test_daemon_without_the_hosts_pid_namespace_says_so(workdir):
    """Why the DaemonSet has hostPID: a daemon in a PID namespace of its own
    (a pod without it) gets pid 0 for a client outside that namespace (a
    trainer pod), and cannot read its /proc. It says so once, naming the
    fix."""
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot make a PID namespace here")
    sock, log_path = os.path.join(workdir, "ld.sock"), os.path.join(workdir, "ld.log")
    with open(log_path, "w") as log:
        p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM",
                              LOADERD, "--socket", sock, "--workers", "1",
                              "--cache-dir", os.path.join(workdir, "cache")],
                             stdout=log, stderr=subprocess.STDOUT, env=child_env())
    read_log = lambda: open(log_path, errors="replace").read()  # noqa: E731
    try:
        deadline = time.monotonic() + 10
        while subprocess.run([LOADERCTL, "--socket", sock, "status"], capture_output=True,
                             env=child_env()).returncode != 0:
            assert p.poll() is None and time.monotonic() < deadline, read_log()
            time.sleep(0.05)
        # a second client: one warning for the daemon's life
        assert subprocess.run([LOADERCTL, "--socket", sock, "status"], capture_output=True,
                              env=child_env()).returncode == 0
    finally:
        # the daemon (unshare's child; unshare itself holds SIGTERM back)
        # stops; unshare exits with its status
        with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
            inner = [int(x) for x in f.read().split()]
        for pid in inner:
            os.kill(pid, signal.SIGTERM)
        try:
            rc = p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()  # and --kill-child=SIGTERM stops the daemon
            p.wait()
            raise
    text = read_log()
    assert rc == 0 and not os.path.exists(sock), text
    assert text.count("has no pid here") == 1, text
    assert ("client 1 (uid 0) has no pid here: it runs in a PID namespace this daemon cannot see "
            "into, so its groups, its job and the slabs it maps cannot be read from /proc; run "
            "loaderd in the host's PID namespace (Kubernetes: hostPID, docs/deploy.md)") in text, text
    assert "stopped" in text and sanitizer_report(text) is None, text
