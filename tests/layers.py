#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/layers.py - the layering check: which folder's code may include which.

    tests/layers.py [ROOT]        check the tree at ROOT (default: the repository)
    tests/layers.py --self-test   a deliberately wrong include and a circle in a
                                  temporary tree must fail the check

A layer is a folder whose public header declares, in its top comment, the
layers its files may include (docs/architecture.md, "Layers"):

     * layer: daemon/engine -> daemon/sources daemon/gpu daemon/base common include

A C file or header belongs to the deepest folder above it that declares a
layer; a folder without a declaration anywhere above it is not checked. An
`#include "..."` (or `<loader/...>`, the public headers) is resolved to a file
of the tree: beside the including file, else from the root, include/ or
common/, else the one file of the tree that ends with that path. The check
fails, one line per finding, when
  - a file includes a file of another layer that its layer does not list;
  - the declared directions run in a circle (a layer reaching itself);
  - the files of declared layers include each other in a circle: a file and
    its header (the same name, .c and .h, in one folder) are one unit, a unit
    reaches another when one of its files includes the other's header.
  - the C files of declared layers call each other in a circle: file A
    reaches file B when A calls (or takes the address of) a function that B
    defines and does not make static; a circle among files that share one
    private header is invisible to the include check and found here.
An include that names no file of the tree, or several, is a finding too,
unless it names a file the build makes (an `output :` of a meson.build:
config.h, loader.pb-c.h).

tests/layers-circles.txt lists the circles of calls not cut yet, one per
line (its files, space-separated): a circle whose files are all on one such
line is reported but not a finding; any other circle is, and so is a line
that no longer matches a circle (the list only shrinks).
Exit status: 0 clean, 1 findings, 2 usage.
"""

import os
import re
import sys
import tempfile

TOP = ("daemon", "client", "common", "include")
LAYER_RE = re.compile(r"^\s*\*?\s*layer:\s*(\S+)\s*->\s*(.*?)\s*(\*/)?\s*$")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def sources(root):
    for top in TOP:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x != "python")
            for f in sorted(files):
                if f.endswith((".c", ".h")):
                    yield os.path.relpath(os.path.join(d, f), root)


def declarations(root, files):
    """{layer folder: (allowed folders, the header that says so)}"""
    layers, problems = {}, []
    for f in files:
        if not f.endswith(".h"):
            continue
        with open(os.path.join(root, f), errors="replace") as fh:
            head = fh.read(8192)
        for line in head.splitlines():
            m = LAYER_RE.match(line)
            if not m:
                continue
            name, allowed = m.group(1).rstrip("/"), m.group(2).split()
            if os.path.dirname(f) != name and not os.path.dirname(f).startswith(name + "/"):
                problems.append(f"{f}: declares layer {name}, but lies outside that folder")
            elif name in layers and layers[name][1] != f:
                problems.append(f"{f}: layer {name} is declared again (first in {layers[name][1]})")
            else:
                layers[name] = ([a.rstrip("/") for a in allowed], f)
    return layers, problems


def layer_of(path, layers):
    d = os.path.dirname(path)
    while d:
        if d in layers:
            return d
        d = os.path.dirname(d)
    for top in ("include", "common"):  # undeclared shared folders are layers of their own name
        if path.startswith(top + "/"):
            return top
    return None


def resolve(root, f, name, by_suffix):
    for base in (os.path.dirname(f), "", "include", "common"):
        cand = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, cand)):
            return cand, None
    hits = by_suffix.get(os.path.basename(name), [])
    hits = [h for h in hits if h == name or h.endswith("/" + name)]
    if len(hits) == 1:
        return hits[0], None
    if len(hits) > 1:
        return None, f"names several files ({', '.join(hits)})"
    return None, "names no file of the tree"


OUTPUT_RE = re.compile(r"\boutput\s*:\s*(\[[^\]]*\]|'[^']*')")


def generated(root):
    """The names of the files that the tree's meson.build files make."""
    out = set()
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and not x.startswith("build"))
        if "meson.build" in files:
            with open(os.path.join(d, "meson.build"), errors="replace") as fh:
                for m in OUTPUT_RE.finditer(fh.read()):
                    out.update(re.findall(r"'([^']+)'", m.group(1)))
    return out


def unit(path):
    return os.path.splitext(path)[0]


def check(root):
    files = list(sources(root))
    layers, findings = declarations(root, files)
    made = generated(root)
    by_suffix = {}
    for f in files:
        by_suffix.setdefault(os.path.basename(f), []).append(f)
    edges = {}  # unit -> {unit: the include that makes the edge}
    for f in files:
        mine = layer_of(f, layers)
        with open(os.path.join(root, f), errors="replace") as fh:
            lines = fh.read().splitlines()
        for n, line in enumerate(lines, 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            kind, name = m.groups()
            if kind == "<" and not name.startswith("loader/"):
                continue  # the system's and the libraries'
            target, why = resolve(root, f, name, by_suffix)
            if target is None:
                if kind == '"' and mine in layers and os.path.basename(name) not in made:
                    findings.append(f"{f}:{n}: #include \"{name}\" {why}")
                continue
            theirs = layer_of(target, layers)
            if mine in layers and theirs is not None and theirs != mine and \
                    theirs not in layers[mine][0]:
                findings.append(f"{f}:{n}: includes {target}: layer {mine} may include "
                                f"{' '.join(layers[mine][0]) or 'no other layer'} "
                                f"({layers[mine][1]}), not {theirs}")
            if mine in layers and unit(target) != unit(f):
                edges.setdefault(unit(f), {}).setdefault(unit(target), f"{f}:{n}")
    # the declared directions: no layer reaches itself
    for name in sorted(layers):
        seen, todo = set(), list(layers[name][0])
        while todo:
            x = todo.pop()
            if x == name:
                findings.append(f"{layers[name][1]}: layer {name} reaches itself through the "
                                "declared directions")
                break
            if x in seen or x not in layers:
                continue
            seen.add(x)
            todo.extend(layers[x][0])
    findings.extend(file_circles(edges))
    findings.extend(call_circles(root, files, layers))
    return findings


DEF_RE = re.compile(r"^((?:[A-Za-z_]\w*[ \t*]+)+?)\**([A-Za-z_]\w*)\s*"
                    r"\(((?:[^;{}()]|\([^()]*\))*)\)\s*\{", re.M)
USE_RE = re.compile(r"(?<![\w.>])([A-Za-z_]\w*)\s*\(|[=,{&]\s*([A-Za-z_]\w*)\s*[,;}]")
NOISE_RE = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
KEYWORDS = {"if", "while", "for", "switch", "return", "sizeof", "else"}


def call_edges(root, files, layers):
    """{C file: {C file it calls: the first function that makes it so}}:
    the functions a file defines without static, found by name in the
    other files of the same program (the daemon's, the client's: the first
    folder of the path; comments and strings left out; a member call, `->f(`
    or `.f(`, is no call of a function f; a file's own function of the same
    name shadows another's)."""
    public, own, texts = {}, {}, {}  # public: {(program, name): file}
    for f in files:
        if not f.endswith(".c") or layer_of(f, layers) not in layers:
            continue
        with open(os.path.join(root, f), errors="replace") as fh:
            t = NOISE_RE.sub(" ", fh.read())
        texts[f], own[f] = t, set()
        for m in DEF_RE.finditer(t):
            name = m.group(2)
            if name in KEYWORDS:
                continue
            own[f].add(name)
            if not re.search(r"\bstatic\b", m.group(1)):
                public.setdefault((f.split("/")[0], name), f)
    edges = {}
    for f, t in texts.items():
        prog = f.split("/")[0]
        for m in USE_RE.finditer(t):
            name = m.group(1) or m.group(2)
            g = public.get((prog, name))
            if g is not None and g != f and name not in own[f]:
                edges.setdefault(f, {}).setdefault(g, f"{f} calls {name}")
    return edges


def call_circles(root, files, layers):
    allowed = []
    path = os.path.join(root, "tests", "layers-circles.txt")
    if os.path.exists(path):
        with open(path) as fh:
            allowed = [set(ln.split()) for ln in fh if ln.strip() and not ln.startswith("#")]
    out, used = [], set()
    for group, text in file_circles(call_edges(root, files, layers), groups=True):
        hit = [i for i, a in enumerate(allowed) if set(group) <= a]
        if hit:
            used.add(hit[0])
            print("known, not cut yet: " + text.replace("a circle of files", "a circle of calls"))
        else:
            out.append(text.replace("a circle of files", "a circle of calls"))
    for i, a in enumerate(allowed):
        if i not in used:
            out.append(f"tests/layers-circles.txt: line {' '.join(sorted(a))} is no circle any "
                       "more: remove it")
    return out


def file_circles(edges, groups=False):
    """One finding per circle of units (Tarjan's strongly connected sets)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                group.sort()
                where = [edges[a][b] for a in group for b in edges.get(a, {}) if b in group]
                text = (f"a circle of files: {' '.join(group)} (through "
                        f"{', '.join(sorted(where)[:6])})")
                out.append((group, text) if groups else text)

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def self_test():
    """A tree with one wrong include and one circle: both must be found."""
    with tempfile.TemporaryDirectory() as d:
        def put(path, text):
            os.makedirs(os.path.dirname(os.path.join(d, path)), exist_ok=True)
            with open(os.path.join(d, path), "w") as fh:
                fh.write(text)
        put("daemon/base/base.h", "/* base\n * layer: daemon/base -> common\n */\n")
        put("daemon/engine/engine.h", "/* engine\n * layer: daemon/engine -> daemon/base\n */\n")
        put("daemon/engine/a.h", '#include "b.h"\n')
        put("daemon/engine/b.h", '#include "a.h"\n')
        put("daemon/engine/a.c", '#include "a.h"\n#include "base.h"\n#include "config.h"\n')
        put("meson.build", "configure_file(output : 'config.h', configuration : conf)\n")
        put("daemon/base/bad.c", '#include "base.h"\n#include "engine.h"\n')
        # two files of one private header calling each other; a static
        # function of the same name elsewhere is no call of theirs
        put("daemon/engine/x.c", '#include "engine.h"\nint x_go(int n)\n{\n\treturn n ? y_go(n - 1) : w_go(0);\n}\n')
        put("daemon/engine/y.c", '#include "engine.h"\nint y_go(int n)\n{\n\treturn x_go(n); /* y_go() */\n}\n')
        put("daemon/base/z.c", '#include "base.h"\nstatic int x_go(void)\n{\n\treturn 0;\n}\n'
                               'int z(void)\n{\n\treturn x_go();\n}\n')
        # a member call of x_go's name, and a function of another program
        # (client/): neither is a call, so w.c is in no circle
        put("daemon/engine/w.c", '#include "engine.h"\nint w_go(struct h *h)\n{\n'
                                 '\treturn h->x_go(1) + h->ops.x_go(2) + v_only();\n}\n')
        put("client/lib/lib.h", "/* lib\n * layer: client/lib -> include\n */\n")
        put("client/lib/v.c", '#include "lib.h"\nint v_only(void)\n{\n\treturn w_go(0);\n}\n')
        got = check(d)
        want = ["daemon/base/bad.c:2: includes daemon/engine/engine.h: layer daemon/base may "
                "include common (daemon/base/base.h), not daemon/engine",
                "a circle of files: daemon/engine/a daemon/engine/b (through "
                "daemon/engine/a.h:1, daemon/engine/b.h:1)",
                "a circle of calls: daemon/engine/x.c daemon/engine/y.c (through "
                "daemon/engine/x.c calls y_go, daemon/engine/y.c calls x_go)"]
        if got != want:
            print("layers --self-test: expected\n  " + "\n  ".join(want) + "\ngot\n  " +
                  "\n  ".join(got))
            return 1
        os.remove(os.path.join(d, "daemon/base/bad.c"))
        os.remove(os.path.join(d, "daemon/engine/b.h"))
        put("daemon/engine/b.h", "\n")
        put("tests/layers-circles.txt", "# not cut yet\ndaemon/engine/x.c daemon/engine/y.c\n")
        got = check(d)
        if got:
            print("layers --self-test: a clean tree (its circle of calls listed) gave\n  " +
                  "\n  ".join(got))
            return 1
        put("daemon/engine/y.c", "int y_go(int n)\n{\n\treturn n;\n}\n")  # the circle cut
        got = check(d)
        want = ["tests/layers-circles.txt: line daemon/engine/x.c daemon/engine/y.c is no "
                "circle any more: remove it"]
        if got != want:
            print("layers --self-test: expected\n  " + "\n  ".join(want) + "\ngot\n  " +
                  "\n  ".join(got))
            return 1
    print("layers --self-test: ok (a wrong include, a circle of includes and one of calls "
          "found, a listed circle known, a cut one to be unlisted)")
    return 0


def main(argv):
    if argv[1:2] == ["--self-test"]:
        return self_test()
    if len(argv) > 2 or argv[1:2] in (["-h"], ["--help"]):
        print(__doc__.strip().splitlines()[0] + "\n" + "\n".join(__doc__.splitlines()[2:4]))
        return 2 if len(argv) > 2 else 0
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    findings = check(root)
    layers, _ = declarations(root, list(sources(root)))
    for f in findings:
        print(f)
    print(f"layers: {len(layers)} declared, {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
