# SPDX-License-Identifier: MIT
"""Token corpora of many files (docs/spec.md, "source of kind tokens"):
`paths` with brace ranges and globs, boundaries file/document/none, `eos`,
and `"sampling": "random_offset"`, read through loaderd.DataLoader from the
real daemon and compared with what is computed here from the files (numpy),
the random offsets with a re-implementation of the documented formula."""

import os

import numpy as np
import pytest

import loaderd
from test_epochs import M64, epoch_order, splitmix64  # docs/spec.md, "The permutation"


def offset_draw(seed, epoch, i, w):
    """docs/spec.md, tokens, "Random-offset sampling": the r-th valid start."""
    key = splitmix64(splitmix64(splitmix64(seed ^ 0x746f6b656e73) ^ epoch) ^ i)
    floor = (1 << 64) % w
    n = 0
    while True:
        x = splitmix64((key + n) & M64)
        if x >= floor:
            return x % w
        n += 1


def write(path, tokens, dtype="uint16"):
    np.asarray(tokens, dtype=dtype).tofile(path)
    return np.asarray(tokens, dtype=dtype)


def segments(files, L, eos=None, boundaries="file"):
    """The token runs no window crosses, as arrays."""
    if boundaries == "none":
        return [np.concatenate(files)]
    out = []
    for t in files:
        if boundaries == "file":
            out.append(t)
            continue
        start = 0
        for j in np.flatnonzero(t == eos):
            out.append(t[start:j + 1])
            start = j + 1
        if start < len(t):
            out.append(t[start:])
    return out


def aligned_windows(segs, L):
    return [s[j * L:j * L + L + 1] for s in segs for j in range((len(s) - 1) // L)]


def random_windows(segs, L, seed, epoch, n):
    segs = [s for s in segs if len(s) >= L + 1]
    w = [len(s) - L for s in segs]
    cum = np.concatenate([[0], np.cumsum(w)])
    out = []
    for i in range(n):
        r = offset_draw(seed, epoch, i, int(cum[-1]))
        k = int(np.searchsorted(cum, r, side="right")) - 1
        off = r - int(cum[k])
        out.append(segs[k][off:off + L + 1])
    return out


def read_epochs(ld, spec, epochs=1):
    """[(input, target) numpy int64 arrays of every sample] per epoch."""
    got = []
    with loaderd.DataLoader(spec, socket=ld.socket, timeout=30) as dl:
        for _ in range(epochs):
            xs, ys = [], []
            for b in dl:
                x, y = b
                xs.append(x.numpy().copy())
                ys.append(y.numpy().copy())
            got.append((np.concatenate(xs), np.concatenate(ys)))
    return got


def check(got, windows):
    x, y = got
    want = np.stack([w.astype(np.int64) for w in windows])
    assert x.dtype == np.int64 and x.shape == (len(windows), want.shape[1] - 1)
    assert np.array_equal(x, want[:, :-1])
    assert np.array_equal(y, want[:, 1:])


def tok_spec(name, L, bs=7, **src):
    return {"name": name, "source": dict({"kind": "tokens", "seq_len": L}, **src),
            "batch_size": bs}


def shards(workdir, n, lens, dtype="uint16", seed=0, name="shard-{:03d}.bin", vocab=50000):
    rng = np.random.default_rng(seed)
    files = []
    for i in range(n):
        files.append(write(os.path.join(workdir, name.format(i)),
                           rng.integers(0, vocab, size=lens[i % len(lens)]), dtype))
    return files


def test_paths_brace_and_glob_aligned(ld, workdir):
    """12 shards named by a brace range, and by a glob (sorted): each shard
    contributes (T_f - 1) div L windows, none across a file; a list keeps
    its order."""
    L = 16
    files = shards(workdir, 12, [100, 17, 16, 250, 33])   # 16 tokens: no window
    want = aligned_windows(segments(files, L), L)
    assert len(want) == sum((len(f) - 1) // L for f in files)
    spec = tok_spec("brace", L, paths=[os.path.join(workdir, "shard-{000..011}.bin")])
    check(read_epochs(ld, spec)[0], want)
    spec = tok_spec("glob", L, paths=[os.path.join(workdir, "shard-*.bin")])
    check(read_epochs(ld, spec)[0], want)
    # what the patterns expanded to (not part of the spec: its status)
    assert ld.pipeline("glob")["corpus"] == {"files": 12, "tokens": sum(len(f) for f in files),
                                             "documents": None}
    # the list order is kept (a file named twice is read twice): the last
    # shard first, then all by two globs
    order = [files[11]] + files
    spec = tok_spec("list", L, paths=[os.path.join(workdir, "shard-011.bin"),
                                       os.path.join(workdir, "shard-00?.bin"),
                                       os.path.join(workdir, "shard-01[01].bin")])
    check(read_epochs(ld, spec)[0], aligned_windows(segments(order, L), L))


def test_boundaries_none_and_uint32(ld, workdir):
    """boundaries "none": the files as one stream, windows across files."""
    L = 10
    files = shards(workdir, 5, [23, 4, 0, 41], dtype="uint32", vocab=1 << 31)
    spec = tok_spec("none", L, paths=[os.path.join(workdir, "shard-{000..004}.bin")],
                    dtype="uint32", boundaries="none")
    got = read_epochs(ld, spec)[0]
    cat = np.concatenate(files)
    assert len(got[0]) == (len(cat) - 1) // L
    check(got, aligned_windows([cat], L))


def test_document_boundaries(ld, workdir):
    """eos ends a document (the eos is its last token); a file's end ends
    one too; no window crosses a document."""
    L, eos = 8, 7
    rng = np.random.default_rng(3)
    files = []
    for i in range(4):
        t = rng.integers(0, 20, size=300)
        files.append(write(os.path.join(workdir, f"d{i}.bin"), t, "int32"))
    spec = tok_spec("doc", L, paths=[os.path.join(workdir, "d{0..3}.bin")], dtype="int32",
                    eos=eos, boundaries="document")
    want = aligned_windows(segments(files, L, eos, "document"), L)
    got = read_epochs(ld, spec)[0]
    assert 0 < len(want) < sum((len(f) - 1) // L for f in files)
    check(got, want)
    for w in want:
        assert not np.any(w[:-1] == eos)
    assert ld.pipeline("doc")["corpus"] == {
        "files": 4, "tokens": 1200,
        "documents": len(segments(files, L, eos, "document"))}


def test_random_offset_formula_and_coverage(ld, workdir):
    """Sample i of epoch e starts at offset_draw(seed, e, i, W) among the
    W valid starts (T_f - L per file), the same bytes as computed here;
    with many samples every valid start is drawn and none other."""
    L, seed, n = 8, 1234, 3000
    files = shards(workdir, 3, [30, 8, 25], seed=5)      # the 8-token file: no start
    spec = tok_spec("ro", L, bs=64, paths=[os.path.join(workdir, "shard-{000..002}.bin")],
                    sampling="random_offset", samples_per_epoch=n)
    spec["seed"] = seed
    spec["epochs"] = 2
    got = read_epochs(ld, spec, epochs=2)
    segs = segments(files, L)
    for e in range(2):
        check(got[e], random_windows(segs, L, seed, e, n))
    assert not np.array_equal(got[0][0], got[1][0])
    # coverage: 22 + 17 starts, each drawn; every window is one file's
    starts = {(f, o): files[f][o:o + L + 1] for f in (0, 2) for o in range(len(files[f]) - L)}
    assert len(starts) == 39
    seen = set()
    for x, y in got:
        for k in range(n):
            w = np.concatenate([x[k], y[k][-1:]])
            hit = [s for s, t in starts.items() if np.array_equal(t, w)]
            assert hit, "a window that starts nowhere valid"
            seen.update(hit)
    assert seen == set(starts)
    # the status and the canonical form
    p = ld.pipeline("ro")
    assert p["samples"] == n
    assert p["spec"]["source"] == {"kind": "tokens", "paths": spec["source"]["paths"],
                                   "dtype": "uint16", "seq_len": L, "output_dtype": "int64",
                                   "boundaries": "file", "sampling": "random_offset",
                                   "samples_per_epoch": n}


def test_random_offset_documents_shuffled(ld, workdir):
    """random_offset within documents, with shuffle: the sampler orders the
    samples, sample i is still the formula's."""
    L, seed, n, eos = 4, 7, 200, 0
    files = shards(workdir, 2, [60, 45], seed=9, vocab=6)
    spec = tok_spec("rod", L, bs=10, paths=[os.path.join(workdir, "shard-00{0,1}.bin")],
                    eos=eos, boundaries="document", sampling="random_offset",
                    samples_per_epoch=n)
    spec.update(seed=seed, shuffle=True)
    x, y = read_epochs(ld, spec)[0]
    want = random_windows(segments(files, L, eos, "document"), L, seed, 0, n)
    rows = sorted(tuple(np.concatenate([a, b[-1:]])) for a, b in zip(x, y))
    assert rows == sorted(tuple(int(v) for v in w) for w in want)
    for w in want:
        assert not np.any(w[:-1] == eos)


def create_error(ld, spec):
    with pytest.raises(loaderd.Error) as ei:
        loaderd.DataLoader(spec, socket=ld.socket, timeout=30)
    return str(ei.value)


def test_errors(ld, workdir):
    files = shards(workdir, 2, [50])
    d = workdir
    odd = os.path.join(d, "odd.bin")
    with open(odd, "wb") as f:
        f.write(b"\0" * 7)
    cases = [
        (dict(paths=[os.path.join(d, "nothing-*.bin")]),
         f"{d}/nothing-*.bin: no file matches"),
        (dict(paths=[os.path.join(d, "shard-*.bin"), odd]),
         f"{odd}: size 7 is not a multiple of 2 bytes (uint16 tokens)"),
        (dict(paths=[os.path.join(d, "shard-000.bin")], path=odd),
         "spec: source: give path or paths, not both"),
        (dict(paths=[]),
         "spec: source.paths: must be an array of 1..100000 strings (paths, brace ranges, globs)"),
        (dict(paths=[os.path.join(d, "*", "x.bin")]),
         f"spec: source.paths[0]: glob characters only in the file name: \"{d}/*/x.bin\""),
        (dict(path=files and os.path.join(d, "shard-000.bin"), eos=65536),
         "spec: source.eos: must be an integer in 0..65535 (a uint16 token id)"),
        (dict(path=os.path.join(d, "shard-000.bin"), eos=-1),
         "spec: source.eos: must be an integer in 0..65535 (a uint16 token id)"),
        (dict(path=os.path.join(d, "shard-000.bin"), dtype="int32", eos=1 << 31),
         "spec: source.eos: must be an integer in 0..2147483647 (a int32 token id)"),
        (dict(path=os.path.join(d, "shard-000.bin"), boundaries="document"),
         "spec: source.boundaries: \"document\" needs source.eos"),
        (dict(path=os.path.join(d, "shard-000.bin"), boundaries="files"),
         "spec: source.boundaries: must be one of file, document, none"),
        (dict(path=os.path.join(d, "shard-000.bin"), sampling="random_offset"),
         "spec: source.samples_per_epoch: is required with sampling \"random_offset\""),
        (dict(path=os.path.join(d, "shard-000.bin"), samples_per_epoch=5),
         "spec: source.samples_per_epoch: only with sampling \"random_offset\""),
        (dict(path=os.path.join(d, "shard-000.bin"), sampling="random"),
         "spec: source.sampling: must be one of aligned, random_offset"),
        (dict(path=os.path.join(d, "shard-000.bin"), sampling="random_offset",
              samples_per_epoch=0),
         "spec: source.samples_per_epoch: must be an integer in 1..1099511627776"),
        (dict(paths=[os.path.join(d, "shard-{000..001}.bin")], seq_len=50),
         f"{d}/shard-{{000..001}}.bin: too small for seq_len 50: no file holds 51 tokens "
         "(2 files)"),
        (dict(paths=[os.path.join(d, "shard-{000..001}.bin")], seq_len=100, boundaries="none"),
         f"{d}/shard-{{000..001}}.bin: too small for seq_len 100: 100 tokens"),
        (dict(paths=[os.path.join(d, "shard-{000..001}.bin")], seq_len=49, eos=0,
              boundaries="document"),
         None),      # fine unless a token is 0: checked below
    ]
    for src, msg in cases:
        spec = tok_spec("bad", src.pop("seq_len", 4), **src)
        if msg is None:
            continue
        text = create_error(ld, spec)
        assert msg in text, (msg, text)
    # eos 0 everywhere: documents of one token, none long enough
    write(os.path.join(d, "zeros.bin"), np.zeros(30), "uint16")
    text = create_error(ld, tok_spec("z", 4, path=os.path.join(d, "zeros.bin"), eos=0,
                                     boundaries="document"))
    assert f"{d}/zeros.bin: too small for seq_len 4: no document holds 5 tokens " \
           "(30 documents)" in text
    # the daemon serves on
    assert len(read_epochs(ld, tok_spec("ok", 4, path=os.path.join(d, "shard-000.bin")))[0][0]) \
        == 12


def test_many_files(ld, workdir):
    """10^5 files named by one brace range (hard links of two files) read,
    each file's windows in order; a list of 10^5 paths is over what a
    client may send (a spec of at most 256 KiB) and says so (the list limit
    itself is tests/unit/sources/test-source.c's)."""
    L = 4
    d = os.path.join(workdir, "m")
    os.mkdir(d)
    t = write(os.path.join(workdir, "s0.bin"), np.arange(9))       # 2 windows a file
    u = write(os.path.join(workdir, "s1.bin"), np.arange(9) + 100)
    for i in range(100000):                     # ext4: at most 65000 links a file
        os.link(os.path.join(workdir, f"s{i // 50000}.bin"), os.path.join(d, f"{i:05d}"))
    spec = tok_spec("many", L, bs=1000, paths=[os.path.join(d, "{00000..99999}")])
    got = read_epochs(ld, spec)[0]
    assert len(got[0]) == 200000
    check((got[0][99998:100002], got[1][99998:100002]), aligned_windows([t, u], L))
    spec = tok_spec("toomany", L, paths=[os.path.join(d, "00000")] * 100000)
    text = create_error(ld, spec)
    assert "a spec at most 256 KiB; list fewer files (a directory, a glob)" in text


# ------------------------------------------------------------------ packing

def pack_reference(files, L, eos):
    """docs/spec.md, "Packing": documents cut into pieces of at most L+1
    tokens, first-fit in corpus order into rows of L+1 slots."""
    cap = L + 1
    pieces = [d[s:s + cap] for d in segments(files, L, eos, "document")
              for s in range(0, len(d), cap)]
    rows, free = [], []
    for p in pieces:
        for r, f in enumerate(free):
            if f >= len(p):
                rows[r].append(p)
                free[r] -= len(p)
                break
        else:
            rows.append([p])
            free.append(cap - len(p))
    return rows


def row_fields(row, L, eos):
    slots = np.full(L + 1, eos, dtype=np.int64)
    pos = np.zeros(L, dtype=np.int64)
    mask = np.zeros(L, dtype=np.float32)
    cu = [0]
    used = 0
    for p in row:
        s, e = used, used + len(p)
        slots[s:e] = p
        for j in range(s, min(e, L)):
            pos[j] = j - s
            mask[j] = 1.0 if j + 1 < e else 0.0
        if s < L:
            cu.append(min(e, L))
        used = e
    cu += [-1] * (L + 1 - len(cu))
    return slots[:L], slots[1:], pos, np.array(cu, dtype=np.int32), mask


def test_packing(ld, workdir):
    """Documents of 1..3L tokens packed first-fit into rows, shuffled by the
    sampler: every field as computed here; position_ids restart after every
    eos; each document token once in the epoch (the rest is eos padding);
    the efficiency in status exact."""
    L, eos, bs, seed = 16, 1, 5, 3
    rng = np.random.default_rng(11)
    files = []
    for f in range(3):
        docs = [np.append(rng.integers(2, 100, size=rng.integers(0, 3 * L)), eos)
                for _ in range(12)]
        t = np.concatenate(docs)
        if f == 2:
            t = t[:-1]                         # the last document ends at the file's end
        files.append(write(os.path.join(workdir, f"p{f}.bin"), t, "uint32"))
    spec = {"name": "pack", "source": {"kind": "tokens", "paths": [os.path.join(workdir, "p*.bin")],
                                       "dtype": "uint32", "eos": eos, "packing": {"seq_len": L}},
            "batch_size": bs, "shuffle": True, "seed": seed}
    rows = pack_reference(files, L, eos)
    assert any(len(r) > 1 for r in rows) and any(len(p) == L + 1 for r in rows for p in r)
    with loaderd.DataLoader(spec, socket=ld.socket, timeout=30) as dl:
        got = [(b.epoch, b.index, {k: b[k].numpy().copy() for k in
                                   ("input", "target", "position_ids", "cu_seqlens", "loss_mask")})
               for b in dl]
    p = ld.pipeline("pack")
    assert p["samples"] == len(rows)
    ntok = sum(len(t) for t in files)
    assert p["packing"] == {"rows": len(rows), "documents": 36,
                            "pieces": sum(len(r) for r in rows), "tokens": ntok,
                            "capacity": len(rows) * (L + 1),
                            # status's reals have 15 significant digits
                            "efficiency": float("%.15g" % (ntok / (len(rows) * (L + 1))))}
    assert p["spec"]["source"]["packing"] == {"seq_len": L} and "seq_len" not in p["spec"]["source"]
    assert p["spec"]["source"]["boundaries"] == "document"
    order = epoch_order(len(rows), bs, 0, seed=seed)
    slots = []
    for e, i, f in got:
        for k, rid in enumerate(order[i]):
            want = row_fields(rows[rid], L, eos)
            for name, w in zip(("input", "target", "position_ids", "cu_seqlens", "loss_mask"), want):
                assert f[name][k].dtype == w.dtype and np.array_equal(f[name][k], w), (name, rid)
            x, pos, mask = f["input"][k], f["position_ids"][k], f["loss_mask"][k]
            for j in np.flatnonzero(x[:-1] == eos):
                assert pos[j + 1] == 0 and mask[j] == 0
            slots.append(np.append(x, f["target"][k][-1]))
    assert len(slots) == len(rows)
    vals, counts = np.unique(np.concatenate(slots), return_counts=True)
    wvals, wcounts = np.unique(np.concatenate(files), return_counts=True)
    pad = len(rows) * (L + 1) - ntok
    wcounts = wcounts + np.where(wvals == eos, pad, 0)
    assert np.array_equal(vals, wvals) and np.array_equal(counts, wcounts)


def test_packing_errors(ld, workdir):
    path = os.path.join(workdir, "t.bin")
    write(path, np.arange(40) % 5)
    base = {"kind": "tokens", "path": path}
    cases = [
        (dict(packing={"seq_len": 8}), "spec: source.packing: needs source.eos (where documents end)"),
        (dict(packing={"seq_len": 8}, eos=0, seq_len=8),
         "spec: source.seq_len: not with source.packing (its rows are packing.seq_len long)"),
        (dict(packing={"seq_len": 8}, eos=0, boundaries="file"),
         "spec: source.boundaries: packing packs documents: must be \"document\""),
        (dict(packing={"seq_len": 8}, eos=0, sampling="random_offset", samples_per_epoch=3),
         "spec: source.sampling: packing reads whole rows: must be \"aligned\""),
        (dict(packing={"seq_len": 8, "pad": 0}, eos=0), "spec: unknown key \"source.packing.pad\""),
        (dict(packing={}, eos=0), "spec: source.packing.seq_len: is required"),
        (dict(packing=8, eos=0), "spec: source.packing: must be an object ({\"seq_len\": N})"),
        (dict(packing={"seq_len": 0}, eos=0),
         "spec: source.packing.seq_len: must be an integer in 1..16777216"),
    ]
    for extra, msg in cases:
        text = create_error(ld, {"name": "bad", "source": dict(base, **extra)})
        assert msg in text, (msg, text)


def test_nanogpt_get_batch_random_offset(ld, workdir):
    """nanoGPT's train.py with its get_batch (np.memmap, torch.randint over
    len(data) - block_size, x/y stacked as int64) replaced by a loaderd
    pipeline of random offsets over the same train.bin: the loop gets x, y
    int64 [B, L] as before, each batch the documented draws, epoch after
    epoch of an endless pipeline."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    vocab, block_size, batch_size, seed = 50, 32, 8, 1337
    path = os.path.join(workdir, "train.bin")
    data = write(path, np.random.default_rng(0).integers(0, vocab, size=5000))
    spe = 10 * batch_size
    spec = {"name": "owt", "source": {"kind": "tokens", "path": path, "seq_len": block_size,
                                      "sampling": "random_offset", "samples_per_epoch": spe},
            "batch_size": batch_size, "seed": seed, "epochs": 0}
    loader = loaderd.DataLoader(spec, socket=ld.socket, timeout=30)
    it = iter(loader)
    log = []

    def get_batch(split):
        # was: data = np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')
        #      ix = torch.randint(len(data) - block_size, (batch_size,))
        #      x = torch.stack([torch.from_numpy((data[i:i+block_size]).astype(np.int64)) for i in ix])
        #      y = torch.stack([torch.from_numpy((data[i+1:i+1+block_size]).astype(np.int64)) for i in ix])
        nonlocal it
        while True:
            try:
                b = next(it)
                break
            except StopIteration:
                it = iter(loader)
        x, y = b
        log.append((b.epoch, b.index, x.clone(), y.clone()))
        return x, y

    model = torch.nn.Embedding(vocab, vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    X, Y = get_batch('train')
    for iter_num in range(25):
        logits = model(X)
        loss = F.cross_entropy(logits.view(-1, vocab), Y.view(-1), ignore_index=-1)
        X, Y = get_batch('train')
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    loader.close()
    assert [(e, i) for e, i, _, _ in log] == [divmod(k, 10) for k in range(26)]
    w = len(data) - block_size
    for e, i, x, y in log:
        assert x.dtype == torch.int64 and x.shape == (batch_size, block_size) == y.shape
        ix = [offset_draw(seed, e, i * batch_size + k, w) for k in range(batch_size)]
        want_x = torch.stack([torch.from_numpy(data[j:j + block_size].astype(np.int64)) for j in ix])
        want_y = torch.stack([torch.from_numpy(data[j + 1:j + 1 + block_size].astype(np.int64))
                              for j in ix])
        assert torch.equal(x, want_x) and torch.equal(y, want_y)
