# SPDX-License-Identifier: MIT
"""The ctypes mirrors of client/python/loaderd/_lib.py against the C header.

A small C program, compiled with the system compiler against the real
include/loader/loader.h, prints the size and every field's offset and size of
each struct _lib.py mirrors, and the constants _lib.py repeats; ctypes' view
must be the same. The inflight limit is one constant: the daemon's
ATTACH_MAX_CREDITS, loaderctl's bound and the Python package's all equal
LDR_INFLIGHT_MAX.
"""

import ctypes
import json
import os
import shutil
import subprocess

import pytest

from conftest import LOADERCTL, REPO_ROOT, child_env

from loaderd import _lib

INCLUDE = os.path.join(REPO_ROOT, "include")
DAEMON = os.path.join(REPO_ROOT, "daemon")

# struct name in C -> the ctypes mirror
STRUCTS = {
    "ldr_field": _lib.ldr_field,
    "ldr_attach_opts": _lib.ldr_attach_opts,
    "ldr_batch_info": _lib.ldr_batch_info,
}

CONSTANTS = ["LDR_EOF", "LDR_EFORKED", "LDR_EDISCONNECTED", "LDR_EVERSION", "LDR_NAME_MAX",
             "LDR_MAX_DIMS", "LDR_INFLIGHT_MAX", "LDR_DTYPE_BFLOAT16", "LDR_MODE_BROADCAST",
             "LDR_MODE_PARTITION", "LDR_MODE_DYNAMIC", "LDR_ATTACH_OPTS_SIZE_V1"]


def _program():
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include \"loader/loader.h\"",
             "int main(void)", "{", "\tprintf(\"{\\\"structs\\\": {\");"]
    for i, (name, mirror) in enumerate(STRUCTS.items()):
        t = f"struct {name}"
        lines.append(f"\tprintf(\"%s\\\"{name}\\\": {{\\\"size\\\": %zu, \\\"align\\\": %zu, "
                     f"\\\"fields\\\": {{\", \"{',' if i else ''}\", sizeof({t}), _Alignof({t}));")
        for j, (field, _ctype) in enumerate(mirror._fields_):
            lines.append(f"\tprintf(\"%s\\\"{field}\\\": [%zu, %zu]\", \"{',' if j else ''}\", "
                         f"offsetof({t}, {field}), sizeof((({t} *)0)->{field}));")
        lines.append("\tprintf(\"}}\");")
    lines.append("\tprintf(\"}, \\\"constants\\\": {\");")
    for i, c in enumerate(CONSTANTS):
        lines.append(f"\tprintf(\"%s\\\"{c}\\\": %lld\", \"{',' if i else ''}\", (long long)({c}));")
    lines += ["\tprintf(\"}}\\n\");", "\treturn 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("abi")
    src, exe = d / "abi.c", d / "abi"
    src.write_text(_program())
    subprocess.run([cc, "-std=gnu11", "-Wall", "-Werror", "-I", INCLUDE, "-o", str(exe), str(src)],
                   check=True, env=child_env())
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, env=child_env())
    return json.loads(out.stdout)


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_struct_layout(c_layout, name):
    mirror = STRUCTS[name]
    c = c_layout["structs"][name]
    assert ctypes.sizeof(mirror) == c["size"], name
    assert ctypes.alignment(mirror) == c["align"], name
    # every C field is mirrored: the C offsets cover the whole struct
    for field, ctype in mirror._fields_:
        off, size = c["fields"][field]
        assert getattr(mirror, field).offset == off, f"{name}.{field}"
        assert ctypes.sizeof(ctype) == size, f"{name}.{field}"
    last_field, last_ctype = mirror._fields_[-1]
    end = c["fields"][last_field][0] + c["fields"][last_field][1]
    assert c["size"] - end < c["align"], f"{name}: a C field after {last_field} is not mirrored"


def test_constants(c_layout):
    k = c_layout["constants"]
    assert _lib.LDR_EOF == k["LDR_EOF"]
    assert _lib.LDR_EFORKED == k["LDR_EFORKED"]
    assert _lib.LDR_EDISCONNECTED == k["LDR_EDISCONNECTED"]
    assert _lib.LDR_EVERSION == k["LDR_EVERSION"]
    assert _lib.LDR_NAME_MAX == k["LDR_NAME_MAX"]
    assert _lib.LDR_MAX_DIMS == k["LDR_MAX_DIMS"]
    assert _lib.LDR_INFLIGHT_MAX == k["LDR_INFLIGHT_MAX"]
    assert _lib.DTYPE_BFLOAT16 == k["LDR_DTYPE_BFLOAT16"]
    assert _lib.MODES == {"broadcast": k["LDR_MODE_BROADCAST"], "partition": k["LDR_MODE_PARTITION"],
                          "dynamic": k["LDR_MODE_DYNAMIC"]}


def test_attach_opts_size(c_layout):
    opts = _lib.ldr_attach_opts()
    assert opts.size == c_layout["structs"]["ldr_attach_opts"]["size"]
    assert c_layout["constants"]["LDR_ATTACH_OPTS_SIZE_V1"] <= opts.size


def test_inflight_limit_is_one_constant():
    # the daemon's limit is the public constant, not a number of its own
    with open(os.path.join(DAEMON, "engine", "engine.h")) as f:
        text = f.read()
    assert "#define ATTACH_MAX_CREDITS LDR_INFLIGHT_MAX" in text
    assert '#include "loader/loader.h"' in text


def test_loaderctl_inflight_bound(workdir):
    if not os.path.exists(LOADERCTL):
        pytest.skip("loaderctl not built")
    sock = os.path.join(workdir, "none.sock")

    def consume(k):
        return subprocess.run([LOADERCTL, "--socket", sock, "consume", "p", "--inflight", str(k)],
                              capture_output=True, text=True, env=child_env(), timeout=60)

    over = consume(_lib.LDR_INFLIGHT_MAX + 1)
    assert over.returncode == 2 and "inflight" in over.stderr
    at = consume(_lib.LDR_INFLIGHT_MAX)  # accepted: fails only to connect
    assert at.returncode == 1, at.stderr
