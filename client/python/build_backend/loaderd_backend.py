# SPDX-License-Identifier: MIT
"""PEP 517 / PEP 660 build backend of the loaderd Python package.

`pip install ./client/python` and `pip wheel ./client/python` call this module
(pyproject.toml: ``build-backend = "loaderd_backend"``, ``backend-path``). It
builds libloader from the repository's C sources with the project's own meson
(``-Dlibloader-only=true``: client/, common/, proto/, linked against the
system's libnng and libprotobuf-c) in a temporary directory outside the
source tree, and writes a wheel that carries ``loaderd/libloader.so`` beside
the Python modules. Nothing is written into the checkout: no build/, no
*.egg-info, no bytecode of this module (removed below).

Where the C sources are, first match wins:

1. ``$LOADERD_SOURCE_DIR`` (a loaderd checkout);
2. ``csrc/`` beside pyproject.toml: an sdist made by build_sdist carries them;
3. two levels up: client/python in a loaderd checkout (pip >= 21.3 builds a
   local directory in place; an older pip copies it away first, and then only
   $LOADERD_SOURCE_DIR helps).

It needs meson (>= 1.0) and ninja on PATH, a C compiler, protoc-c and the
headers of nng and protobuf-c: on Debian ``meson ninja-build gcc cmake
pkg-config libnng-dev libprotobuf-c-dev protobuf-c-compiler``
(scripts/bootstrap installs them). With the headers of the Python that runs
the build (``python3-dev``) the wheel also carries ``loaderd/_fast*.so``
(client/python/pyfast.c, the per-batch path in C) for that Python; without, the
package takes its batches in pure Python. It needs nothing from PyPI on Python >=
3.11 (tomli on older ones, to read pyproject.toml).

Options (``pip install --config-settings setup-args=-Dcuda=enabled ...``):
``setup-args``: extra arguments of ``meson setup``, a string (split on
spaces) or a list.
"""

import base64
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.dirname(HERE)          # client/python, or the unpacked sdist
PACKAGE = "loaderd"
LIBNAME = "libloader.so"                 # inside the package: loaderd/libloader.so

# Python wrote this module's bytecode beside it when it was imported; the
# build leaves the source tree as it found it.
shutil.rmtree(os.path.join(HERE, "__pycache__"), ignore_errors=True)


class BuildError(RuntimeError):
    pass


# ------------------------------------------------------------------ metadata

def _pyproject():
    try:
        import tomllib
    except ImportError:  # Python < 3.11: pyproject.toml asks for tomli then
        import tomli as tomllib
    with open(os.path.join(PROJECT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _is_source_tree(d):
    mb = os.path.join(d, "meson.build")
    lib = os.path.join(d, "client", "libloader", "libloader.c")
    if not (os.path.isfile(mb) and os.path.isfile(lib)):
        return False
    with open(mb, encoding="utf-8") as f:
        return re.search(r"project\(\s*'loaderd'", f.read()) is not None


def _source_tree():
    env = os.environ.get("LOADERD_SOURCE_DIR")
    cands = ([env] if env else []) + [os.path.join(PROJECT, "csrc"),
                                      os.path.dirname(os.path.dirname(PROJECT))]
    for d in cands:
        if _is_source_tree(d):
            return os.path.abspath(d)
    raise BuildError(
        "loaderd: cannot find the C sources of libloader (a loaderd checkout's meson.build "
        f"and client/libloader/libloader.c); looked in {', '.join(cands)}. Install from the checkout "
        "(pip install <checkout>/client/python with pip >= 21.3, which builds the directory "
        "in place) or set LOADERD_SOURCE_DIR to the checkout.")


def _version():
    # One version for the project: meson.build's project(..., version : 'X').
    with open(os.path.join(_source_tree(), "meson.build"), encoding="utf-8") as f:
        m = re.search(r"project\([^)]*?version\s*:\s*'([^']+)'", f.read(), re.S)
    if not m:
        raise BuildError("loaderd: no version : '...' in project() of meson.build")
    return m.group(1)


def _requirement(req, extra=None):
    if extra is None:
        return req
    if ";" in req:
        req, marker = req.split(";", 1)
        return f'{req.strip()}; ({marker.strip()}) and extra == "{extra}"'
    return f'{req}; extra == "{extra}"'


def _metadata_text():
    p = _pyproject()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {_version()}"]
    if "description" in p:
        lines.append(f"Summary: {p['description']}")
    lic = p.get("license", {})
    if isinstance(lic, dict) and "text" in lic:
        lines.append(f"License: {lic['text']}")
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    for req in p.get("dependencies", []):
        lines.append(f"Requires-Dist: {_requirement(req)}")
    for extra, reqs in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for req in reqs:
            lines.append(f"Requires-Dist: {_requirement(req, extra)}")
    return "\n".join(lines) + "\n"


def _wheel_text(tag):
    return ("Wheel-Version: 1.0\nGenerator: loaderd_backend\n"
            f"Root-Is-Purelib: {'true' if tag.endswith('-any') else 'false'}\nTag: {tag}\n")


def _platform_tag():
    # ctypes, no extension module: any Python 3, but this machine's libloader.so.
    # Linked against the system's libnng and libprotobuf-c, so not manylinux.
    return "py3-none-" + re.sub(r"[-.]", "_", sysconfig.get_platform())


def _dist_info():
    return f"{PACKAGE}-{_version()}.dist-info"


# --------------------------------------------------------------- libloader

def _setup_args(config_settings):
    v = (config_settings or {}).get("setup-args", [])
    return v.split() if isinstance(v, str) else list(v)


def _tool(name, pkg):
    path = shutil.which(name)
    if not path:
        raise BuildError(f"loaderd: building libloader needs {name} on PATH "
                         f"(Debian: apt-get install {pkg}, or scripts/bootstrap)")
    return path


def _tool_env():
    env = dict(os.environ)
    # pip's isolated build environment puts a sitecustomize on PYTHONPATH that
    # hides the system's site-packages, and with them Debian's meson (a
    # /usr/bin/python3 script). Keep it only for a meson installed there.
    try:
        import mesonbuild  # noqa: F401
    except ImportError:
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONNOUSERSITE", None)
    return env


def _build_libloader(dest, config_settings):
    """Build libloader.so into the file dest, and loaderd._fast for this
    interpreter beside it when its headers are there (the package runs
    without it: pure Python); returns the files built. The build tree is
    temporary."""
    src = _source_tree()
    meson = _tool("meson", "meson")
    ninja = _tool("ninja", "ninja-build")
    env = _tool_env()
    tmp = tempfile.mkdtemp(prefix="loaderd-libloader-")
    try:
        bld = os.path.join(tmp, "build")
        cmd = ([meson, "setup", bld, src, "-Dlibloader-only=true", "-Dpython=" + sys.executable]
               + _setup_args(config_settings))
        print("loaderd_backend:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=env, stdin=subprocess.DEVNULL)
        subprocess.run([ninja, "-C", bld], check=True, env=env, stdin=subprocess.DEVNULL)
        built = os.path.realpath(os.path.join(bld, "client", LIBNAME))
        if not os.path.isfile(built):
            raise BuildError(f"loaderd: meson built no {built}")
        shutil.copyfile(built, dest)
        os.chmod(dest, 0o755)
        out = [dest]
        fast = os.path.join(bld, "client", "_fast" + sysconfig.get_config_var("EXT_SUFFIX"))
        if os.path.isfile(fast):
            out.append(os.path.join(os.path.dirname(dest), os.path.basename(fast)))
            shutil.copyfile(fast, out[-1])
        else:
            print("loaderd_backend: no loaderd._fast for this Python (no Python.h: on Debian "
                  "python3-dev); the package takes its batches in pure Python", flush=True)
        return out
    except subprocess.CalledProcessError as e:
        raise BuildError(f"loaderd: building libloader failed ({' '.join(e.cmd)}: exit "
                         f"{e.returncode}); the meson output above says why") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------ archives

def _epoch():
    return max(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")), 315532800)  # >= 1980


def _package_files():
    """(path, name in the archive) of the package's Python modules."""
    root = os.path.join(PROJECT, PACKAGE)
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py") or f == "py.typed":
                p = os.path.join(d, f)
                out.append((p, os.path.relpath(p, PROJECT).replace(os.sep, "/")))
    return out


class _Wheel:
    def __init__(self, path):
        self.zf = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.record = []
        self.date = time.gmtime(_epoch())[:6]

    def add(self, arcname, data, mode=0o644):
        zi = zipfile.ZipInfo(arcname, self.date)
        zi.external_attr = (0o100000 | mode) << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        self.zf.writestr(zi, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append(f"{arcname},sha256={digest},{len(data)}")

    def close(self, dist_info):
        rec = f"{dist_info}/RECORD"
        data = ("\n".join(self.record + [f"{rec},,"]) + "\n").encode()
        zi = zipfile.ZipInfo(rec, self.date)
        zi.external_attr = 0o100644 << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        self.zf.writestr(zi, data)
        self.zf.close()


def _write_wheel(wheel_directory, tag, payload):
    """payload: [(arcname, bytes, mode)]; returns the wheel's file name."""
    name = f"{PACKAGE}-{_version()}-{tag}.whl"
    dist_info = _dist_info()
    path = os.path.join(wheel_directory, name)
    w = _Wheel(path)
    try:
        for arcname, data, mode in payload:
            w.add(arcname, data, mode)
        w.add(f"{dist_info}/METADATA", _metadata_text().encode())
        w.add(f"{dist_info}/WHEEL", _wheel_text(tag).encode())
        w.add(f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode())
        w.close(dist_info)
    except BaseException:
        w.zf.close()
        os.unlink(path)
        raise
    return name


def _read(path):
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------- PEP 517

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(_metadata_text())
    with open(os.path.join(d, "WHEEL"), "w") as f:
        f.write(_wheel_text(_platform_tag()))
    return os.path.basename(d)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    payload = [(arc, _read(p), 0o644) for p, arc in _package_files()]
    tmp = tempfile.mkdtemp(prefix="loaderd-wheel-")
    try:
        for built in _build_libloader(os.path.join(tmp, LIBNAME), config_settings):
            payload.append((f"{PACKAGE}/{os.path.basename(built)}", _read(built), 0o755))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _write_wheel(wheel_directory, _platform_tag(), payload)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # The package stays in this directory (a .pth names it) and, as when run
    # from the tree, finds libloader in <checkout>/build/client (scripts/build)
    # or through $LOADERD_LIBRARY: no copy of the library to go stale.
    pth = (PROJECT + "\n").encode()
    return _write_wheel(wheel_directory, "py3-none-any", [(f"__editable__.{PACKAGE}.pth", pth, 0o644)])


def build_sdist(sdist_directory, config_settings=None):
    """The Python package plus the C sources of libloader (in csrc/)."""
    src = _source_tree()
    base = f"{PACKAGE}-{_version()}"
    files = [(os.path.join(PROJECT, "pyproject.toml"), "pyproject.toml"),
             (os.path.abspath(__file__), "build_backend/loaderd_backend.py")]
    files += _package_files()
    for f in ("meson.build", "meson_options.txt"):
        files.append((os.path.join(src, f), f"csrc/{f}"))
    for sub in ("include", "common", "proto", "client"):
        for d, dirs, names in os.walk(os.path.join(src, sub)):
            # client/python is this package, already in the sdist's root
            dirs[:] = sorted(x for x in dirs if x != "__pycache__" and
                             not (d == os.path.join(src, "client") and x == "python"))
            for n in sorted(names):
                p = os.path.join(d, n)
                files.append((p, "csrc/" + os.path.relpath(p, src).replace(os.sep, "/")))
    # but loaderd._fast's C source lies there too, built by client/meson.build
    files.append((os.path.join(src, "client", "python", "pyfast.c"), "csrc/client/python/pyfast.c"))
    name = base + ".tar.gz"
    epoch = _epoch()

    def add(tf, arcname, data):
        ti = tarfile.TarInfo(f"{base}/{arcname}")
        ti.size, ti.mtime, ti.mode = len(data), epoch, 0o644
        tf.addfile(ti, io.BytesIO(data))

    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for p, arc in files:
            add(tf, arc, _read(p))
        add(tf, "PKG-INFO", _metadata_text().encode())
    return name
