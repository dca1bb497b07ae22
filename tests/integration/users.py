# SPDX-License-Identifier: MIT
"""Real second (and third) Unix users for the multi-user tests.

The tests run as root (CI does); they create, once per machine, the users
ldr-alice and ldr-bob (each with its own group, as Debian's useradd makes
them) and the group ldr-team that both belong to, and run loaderctl or a
Python client as one of them through subprocess's user=/group=/extra_groups=.
Skipped where the tests do not run as root (no useradd, no setuid).
"""

import grp
import os
import pwd
import subprocess

import pytest

from ldrtest import sanitizer_report

USERS = ("ldr-alice", "ldr-bob")
TEAM = "ldr-team"


def _ensure_group(name):
    try:
        return grp.getgrnam(name)
    except KeyError:
        subprocess.run(["groupadd", name], check=True, capture_output=True)
        return grp.getgrnam(name)


def _ensure_user(name, team):
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", name],
                       check=True, capture_output=True)
        pw = pwd.getpwnam(name)
    if name not in grp.getgrnam(team).gr_mem:
        subprocess.run(["usermod", "-a", "-G", team, name], check=True, capture_output=True)
    return pw


class User:
    def __init__(self, pw, team):
        self.name = pw.pw_name
        self.uid = pw.pw_uid
        self.gid = pw.pw_gid
        self.team = team

    def popen_kwargs(self, team=True, env=None):
        e = dict(env if env is not None else os.environ)
        e["HOME"] = "/tmp"
        e["USER"] = e["LOGNAME"] = self.name
        return dict(user=self.uid, group=self.gid,
                    extra_groups=[self.team.gr_gid] if team else [], env=e)

    def run(self, cmd, check=False, timeout=120, team=True, env=None, **kw):
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                           **self.popen_kwargs(team=team, env=env), **kw)
        marker = sanitizer_report(r.stderr)
        assert marker is None, f"{cmd[0]} as {self.name} printed a {marker} report:\n{r.stderr}"
        if check and r.returncode != 0:
            raise AssertionError(f"$ {' '.join(map(str, cmd))} (as {self.name})\nexit {r.returncode}\n"
                                 f"stdout: {r.stdout}\nstderr: {r.stderr}")
        return r

    def ctl(self, daemon, *args, check=False, json_out=False, **kw):
        return self.run(daemon.ctl_cmd(*args, json_out=json_out), check=check, **kw)


@pytest.fixture(scope="session")
def users():
    """(alice, bob): two real users, both in the group ldr-team."""
    if os.geteuid() != 0:
        pytest.skip("the multi-user tests create Unix users: they need root")
    team = _ensure_group(TEAM)
    out = tuple(User(_ensure_user(n, TEAM), team) for n in USERS)
    team = grp.getgrnam(TEAM)
    for u in out:
        u.team = team
    return out


def open_to_all(path):
    """Let every user reach @path (a test's private directory) and the
    directories above it."""
    os.chmod(path, 0o755)
    return path


def shared_config(workdir, **keys):
    """A config file whose sockets every user may connect to."""
    import json
    cfg = {"socket_mode": "0666"}
    cfg.update(keys)
    path = os.path.join(workdir, "loaderd-shared.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    os.chmod(path, 0o644)
    return path
