# SPDX-License-Identifier: MIT
"""`pip install ./client/python` and `pip wheel ./client/python`, as a user
runs them: a fresh venv of Debian's /usr/bin/python3 (no system site-packages,
so no Debian numpy or torch), numpy from PyPI, libloader built by the
package's build backend and bundled in the wheel, and a checkout left exactly
as it was (docs/python.md, "Installing it").

The install test needs PyPI (numpy) or the mirror pip is configured for, and
fails, saying so, when it cannot reach one. Both tests carry the `install`
mark: `pytest -m "not install" tests/python` leaves them out. pip's download
cache lives in /tmp (loaderd-test-pip-cache-UID), never in the checkout.
"""

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile

import numpy as np
import pytest

from conftest import PYDIR, REPO_ROOT

pytestmark = pytest.mark.install

SYSTEM_PYTHON = "/usr/bin/python3"
PIP_CACHE = f"/tmp/loaderd-test-pip-cache-{os.getuid()}"
# what pip prints when it cannot reach the index (DNS, refused, timeout, proxy, TLS)
NETWORK_SIGNS = ("No matching distribution found for numpy", "NewConnectionError",
                 "Failed to establish a new connection", "Temporary failure in name resolution",
                 "Network is unreachable", "ConnectTimeoutError", "ProxyError", "Read timed out",
                 "CERTIFICATE_VERIFY_FAILED", "Max retries exceeded")


def clean_env(extra=None):
    """The environment of a user's shell: nothing of this test run's Python,
    library or sanitizer settings (conftest points PYTHONPATH at the checkout
    and $LOADERD_LIBRARY at the build; the sanitizer pass preloads ASan)."""
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE", "PYTHONSTARTUP",
              "VIRTUAL_ENV", "LOADERD_LIBRARY", "LOADERD_SOURCE_DIR", "LOADERD_SOCKET",
              "LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS",
              "LOADERD_CHILD_ASAN_OPTIONS"):
        env.pop(k, None)
    # bytecode is left on: a backend whose module writes __pycache__ into the
    # checkout must show up below
    if extra:
        env.update(extra)
    return env


def run(cmd, timeout, cwd, env=None, what=None):
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                       env=env or clean_env(), stdin=subprocess.DEVNULL)
    r.seconds = time.monotonic() - t0
    if what is not None and r.returncode != 0:
        pytest.fail(f"{what}: exit {r.returncode}: {' '.join(cmd)}\n{r.stdout[-4000:]}\n"
                    f"{r.stderr[-4000:]}", pytrace=False)
    return r


def tree_state():
    """The untracked and ignored entries of the checkout as git lists them
    (`git status --porcelain --ignored`): a new build/, *.egg-info or
    __pycache__, ignored by .gitignore or not, changes it. Changes to tracked
    files are left out: in a shared working tree they are someone's edits."""
    r = subprocess.run(["git", "-C", REPO_ROOT, "status", "--porcelain", "--ignored"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        return {line for line in r.stdout.splitlines() if line[:2] in ("??", "!!")}
    # not a git checkout (an unpacked tarball): every path below the root
    out = set()
    for d, dirs, files in os.walk(REPO_ROOT):
        dirs[:] = [x for x in dirs if x != ".git"]
        out.update(os.path.relpath(os.path.join(d, f), REPO_ROOT) for f in dirs + files)
    return out


def assert_tree_unchanged(before, what):
    new = tree_state() - before
    if new:
        pytest.fail(f"{what} left new files in the checkout {REPO_ROOT}:\n" +
                    "\n".join(sorted(new)), pytrace=False)


def inside(path, d):
    path, d = os.path.realpath(path), os.path.realpath(d)
    return os.path.commonpath([path, d]) == d


def platform_tag():
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


# The installed package in the venv's python, started outside the checkout:
# one epoch of a tokens pipeline with the default output (no torch: numpy).
CHILD = r"""
import json, sys
import numpy as np
import loaderd
spec, sock, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
try:
    import torch
except ImportError:
    torch = None
res = {"file": loaderd.__file__, "lib": loaderd.library_path(), "numpy": np.__version__,
       "torch": torch is not None, "version": loaderd.version(), "types": [], "index": [],
       "rows": [], "leases": []}
fast = loaderd._lib.fast()
res["fast"] = fast.__file__ if fast is not None else loaderd._lib.fast_error
inp, tgt = [], []
with loaderd.DataLoader(spec, socket=sock) as dl:
    res["len"] = len(dl)
    for b in dl:
        for k in ("input", "target"):
            a = b[k]
            res["types"].append([type(a).__module__, type(a).__name__, str(a.dtype),
                                 list(a.shape)])
        res["index"].append(b.index)
        res["leases"].append(type(b._lease).__module__)
        res["rows"].append(b.rows)
        inp.append(np.array(b["input"]))
        tgt.append(np.array(b["target"]))
np.savez(out, input=np.concatenate(inp), target=np.concatenate(tgt))
print(json.dumps(res))
"""


def test_pip_install_fresh_venv(ld, workdir):
    before = tree_state()
    venv = os.path.join(workdir, "venv")
    py = os.path.join(venv, "bin", "python")
    r = run([SYSTEM_PYTHON, "-m", "venv", venv], 120, workdir,
            what="python3 -m venv (Debian: apt-get install python3-venv, or scripts/bootstrap)")
    t_venv = r.seconds

    r = run([py, "-m", "pip", "install", "--cache-dir", PIP_CACHE, "--no-input",
             "--disable-pip-version-check", "--progress-bar", "off", "--timeout", "30",
             "--retries", "2", PYDIR], 900, workdir)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        if any(s in out for s in NETWORK_SIGNS):
            pytest.fail("pip install ./client/python could not fetch numpy: PyPI (or the index "
                        "pip is configured for) is unreachable from here. This test needs it; "
                        "leave it out with -m 'not install'.\n" + out[-4000:], pytrace=False)
        pytest.fail(f"pip install ./client/python: exit {r.returncode}\n{out[-6000:]}",
                    pytrace=False)
    t_install = r.seconds
    assert_tree_unchanged(before, "pip install ./client/python")

    # a tokens dataset and one unshuffled epoch of it through the installed package
    rng = np.random.default_rng(3)
    t = rng.integers(0, 65535, size=5000, dtype=np.uint16)
    path = os.path.join(workdir, "tok.bin")
    t.tofile(path)
    L, B = 32, 8
    n = (len(t) - 1) // L
    spec = {"name": "inst", "source": {"kind": "tokens", "path": path, "dtype": "uint16",
                                       "seq_len": L}, "batch_size": B}
    npz = os.path.join(workdir, "got.npz")
    r = run([py, "-c", CHILD, json.dumps(spec), ld.socket, npz], 120, workdir,
            what="the installed package")
    t_read = r.seconds
    res = json.loads(r.stdout.strip().splitlines()[-1])

    assert inside(res["file"], venv), res["file"]
    assert inside(res["lib"], venv), f"library_path() {res['lib']} is not the venv's copy"
    assert os.path.basename(res["lib"]) == "libloader.so"
    assert int(res["numpy"].split(".")[0]) >= 2, res["numpy"]
    assert res["torch"] is False
    assert res["version"]["libloader"] == res["version"]["loaderd"]
    # the wheel's per-batch path in C, built for this Python (scripts/bootstrap
    # installs python3-dev), with PyPI's numpy 2: every batch after the first
    assert inside(res["fast"], venv), res["fast"]
    assert res["leases"][1:] == ["loaderd._fast"] * (len(res["leases"]) - 1), res["leases"]

    nb = -(-n // B)
    assert res["len"] == nb
    assert res["index"] == list(range(nb))
    assert res["rows"] == [B] * (nb - 1) + [n - B * (nb - 1)]
    for (mod, cls, dtype, shape), rows in zip(res["types"], np.repeat(res["rows"], 2)):
        assert (mod, cls, dtype, shape) == ("numpy", "ndarray", "int64", [int(rows), L])
    got = np.load(npz)
    want_in = np.stack([t[i * L:i * L + L] for i in range(n)]).astype(np.int64)
    want_tg = np.stack([t[i * L + 1:i * L + L + 1] for i in range(n)]).astype(np.int64)
    np.testing.assert_array_equal(got["input"], want_in)
    np.testing.assert_array_equal(got["target"], want_tg)

    # $LOADERD_LIBRARY still comes before the bundled copy
    other = os.path.join(workdir, "elsewhere", "libloader.so")
    os.makedirs(os.path.dirname(other))
    shutil.copyfile(res["lib"], other)
    r = run([py, "-c", "import loaderd; print(loaderd.library_path())"], 60, workdir,
            env=clean_env({"LOADERD_LIBRARY": other}), what="LOADERD_LIBRARY")
    assert r.stdout.strip() == other

    print(f"venv {t_venv:.1f} s, pip install {t_install:.1f} s, read {t_read:.1f} s")


def test_pip_wheel_bundles_libloader(workdir):
    """Debian's own pip (no venv): `pip wheel` builds offline (the backend
    needs nothing from PyPI) into a platform wheel that carries libloader."""
    before = tree_state()
    wheels = os.path.join(workdir, "wheels")
    r = run([SYSTEM_PYTHON, "-m", "pip", "wheel", "--no-deps", "--no-input",
             "--disable-pip-version-check", "-w", wheels, PYDIR], 600, workdir,
            what="pip wheel ./client/python")
    t_wheel = r.seconds
    assert_tree_unchanged(before, "pip wheel ./client/python")

    names = os.listdir(wheels)
    assert len(names) == 1, names
    m = re.fullmatch(r"loaderd-([0-9][^-]*)-py3-none-(.+)\.whl", names[0])
    assert m and m.group(2) == platform_tag(), names[0]
    version = m.group(1)
    dist_info = f"loaderd-{version}.dist-info"
    with zipfile.ZipFile(os.path.join(wheels, names[0])) as z:
        files = set(z.namelist())
        modules = {f"loaderd/{f}" for f in os.listdir(os.path.join(PYDIR, "loaderd"))
                   if f.endswith(".py")}
        assert modules <= files, modules - files
        assert "loaderd/libloader.so" in files
        # loaderd._fast for the Python that built it (Debian's python3-dev)
        fast = "loaderd/_fast" + sysconfig.get_config_var("EXT_SUFFIX")
        assert fast in files, files
        assert z.read(fast)[:4] == b"\x7fELF"
        assert {f.split("/")[0] for f in files} == {"loaderd", dist_info}, files
        assert not any("__pycache__" in f for f in files)
        info = z.getinfo("loaderd/libloader.so")
        assert (info.external_attr >> 16) & 0o777 == 0o755
        lib = z.read("loaderd/libloader.so")
        assert lib[:4] == b"\x7fELF"
        meta = z.read(f"{dist_info}/METADATA").decode()
        assert "Name: loaderd" in meta and "Requires-Dist: numpy" in meta
        assert "Root-Is-Purelib: false" in z.read(f"{dist_info}/WHEEL").decode()
        # RECORD: every file, with its hash
        record = {}
        for line in z.read(f"{dist_info}/RECORD").decode().splitlines():
            name, digest, size = line.rsplit(",", 2)
            record[name] = digest
        assert set(record) == files
        for name in files - {f"{dist_info}/RECORD"}:
            d = base64.urlsafe_b64encode(hashlib.sha256(z.read(name)).digest()).rstrip(b"=")
            assert record[name] == "sha256=" + d.decode(), name

    # the bundled library loads on its own, with the system's nng and protobuf-c
    so = os.path.join(workdir, "libloader.so")
    with open(so, "wb") as f:
        f.write(lib)
    r = run([SYSTEM_PYTHON, "-c", "import ctypes, sys; L = ctypes.CDLL(sys.argv[1]); "
             "L.ldr_version.restype = ctypes.c_char_p; print(L.ldr_version().decode())", so],
            60, workdir, what="loading the bundled libloader.so")
    assert r.stdout.strip() == version
    print(f"pip wheel {t_wheel:.1f} s")
