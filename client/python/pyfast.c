/* SPDX-License-Identifier: MIT */
/* pyfast - the loaderd Python package's per-batch path in C (loaderd._fast)
 *
 * What loaderd.DataLoader does for every host batch, in one call instead of
 * some twenty Python steps: ldr_next_described() (the GIL released while it
 * waits), a lease object whose last reference releases the batch, one base
 * object per field that numpy reads through __array_struct__ (no
 * __array_interface__ dict to build and parse), the arrays, the torch
 * tensors, and the Batch dict. It keeps the pure Python path's semantics
 * exactly (client/python/loaderd/loader.py: _Lease, _Mem, _next_raw): the
 * Python code reads and writes the same attributes (lease.ptr, .kept, .mems,
 * .release(); mem.lease; weak references to both), so keeping, releasing
 * and forking work on either path. The package falls back to Python where
 * this module is not built or LOADERD_PYFAST=0 (docs/python.md).
 *
 * It links with neither libloader nor numpy: the package hands it
 * libloader's functions as addresses (the copy ctypes loaded, never a
 * second one), and numpy's array struct interface (PyArrayInterface,
 * version 2) is a stable, documented layout.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include <errno.h>
#include <stdlib.h>

#include "loader/loader.h"

#if PY_VERSION_HEX < 0x030A0000 /* Python 3.9 */
static inline PyObject *Py_NewRef(PyObject *o)
{
	Py_INCREF(o);
	return o;
}
static inline int PyModule_AddObjectRef(PyObject *m, const char *name, PyObject *v)
{
	Py_INCREF(v);
	if (PyModule_AddObject(m, name, v) < 0) {
		Py_DECREF(v);
		return -1;
	}
	return 0;
}
#endif

typedef int (*next_fn)(void *att, int timeout_ms, void **out, struct ldr_batch_info *info,
                       struct ldr_field *fields, int nfields);
typedef void (*release_fn)(void *batch);

static release_fn ldr_release_p;

/* numpy's PyArrayInterface (numpy/ndarraytypes.h), the __array_struct__
 * capsule's pointer. */
typedef struct {
	int two;
	int nd;
	char typekind;
	int itemsize;
	int flags;
	Py_intptr_t *shape;
	Py_intptr_t *strides;
	void *data;
	PyObject *descr;
} array_iface;

#define IFACE_C_CONTIGUOUS 0x1
#define IFACE_ALIGNED 0x100
#define IFACE_NOTSWAPPED 0x200
#define IFACE_WRITEABLE 0x400

/* --- Lease: one ldr_batch*, released when its last reference goes -------- */

typedef struct {
	PyObject_HEAD
	void *raw;          /* the ldr_batch*, NULL once released */
	PyObject *ptr;      /* the same as an int (ctypes calls take it), or None */
	PyObject *att;
	PyObject *device;
	PyObject *kept;
	PyObject *mems;
	PyObject *weakrefs;
} Lease;

static void lease_release_raw(Lease *l)
{
	void *raw = l->raw;

	l->raw = NULL;
	Py_XSETREF(l->ptr, Py_NewRef(Py_None));
	Py_CLEAR(l->att);
	if (raw) {
		Py_BEGIN_ALLOW_THREADS
		ldr_release_p(raw);
		Py_END_ALLOW_THREADS
	}
}

static PyObject *lease_release(Lease *l, PyObject *const *args, Py_ssize_t nargs)
{
	(void)args;
	if (nargs > 1) {
		PyErr_SetString(PyExc_TypeError, "release(stream=None)");
		return NULL;
	}
	/* a host batch: the stream does not matter (device leases are the
	 * package's Python _Lease) */
	if (l->raw && l->ptr != Py_None)
		lease_release_raw(l);
	Py_RETURN_NONE;
}

static void lease_dealloc(Lease *l)
{
	PyObject_GC_UnTrack(l);
	if (l->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)l);
	if (l->raw)
		lease_release_raw(l);
	Py_CLEAR(l->ptr);
	Py_CLEAR(l->att);
	Py_CLEAR(l->device);
	Py_CLEAR(l->kept);
	Py_CLEAR(l->mems);
	Py_TYPE(l)->tp_free((PyObject *)l);
}

static int lease_traverse(Lease *l, visitproc visit, void *arg)
{
	Py_VISIT(l->att);
	Py_VISIT(l->mems);
	return 0;
}

static int lease_clear(Lease *l)
{
	Py_CLEAR(l->att);
	Py_CLEAR(l->mems);
	return 0;
}

/* ptr: the Python side may set it to None (it released through ctypes) */
static int lease_set_ptr(Lease *l, PyObject *v, void *closure)
{
	(void)closure;
	if (!v || v != Py_None) {
		PyErr_SetString(PyExc_AttributeError, "a lease's ptr can only be set to None");
		return -1;
	}
	l->raw = NULL;
	Py_XSETREF(l->ptr, Py_NewRef(Py_None));
	return 0;
}

static PyObject *lease_get_ptr(Lease *l, void *closure)
{
	(void)closure;
	return Py_NewRef(l->ptr ? l->ptr : Py_None);
}

static PyMemberDef lease_members[] = {
	{ "att", T_OBJECT, offsetof(Lease, att), 0, NULL },
	{ "device", T_OBJECT, offsetof(Lease, device), 0, NULL },
	{ "kept", T_OBJECT, offsetof(Lease, kept), 0, NULL },
	{ "mems", T_OBJECT, offsetof(Lease, mems), 0, NULL },
	{ NULL }
};

static PyGetSetDef lease_getset[] = {
	{ "ptr", (getter)lease_get_ptr, (setter)lease_set_ptr, NULL, NULL },
	{ NULL }
};

static PyMethodDef lease_methods[] = {
	{ "release", (PyCFunction)(void (*)(void))lease_release, METH_FASTCALL, NULL },
	{ NULL }
};

static PyTypeObject LeaseType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "loaderd._fast.Lease",
	.tp_basicsize = sizeof(Lease),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "One host batch's ldr_batch*: released when the last reference goes.",
	.tp_dealloc = (destructor)lease_dealloc,
	.tp_traverse = (traverseproc)lease_traverse,
	.tp_clear = (inquiry)lease_clear,
	.tp_weaklistoffset = offsetof(Lease, weakrefs),
	.tp_members = lease_members,
	.tp_getset = lease_getset,
	.tp_methods = lease_methods,
};

/* --- Mem: one field's base object, read by numpy -------------------------- */

typedef struct {
	PyObject_HEAD
	PyObject *lease;
	PyObject *weakrefs;
	array_iface iface;
	Py_intptr_t shape[LDR_MAX_DIMS];
} Mem;

static void mem_dealloc(Mem *m)
{
	PyObject_GC_UnTrack(m);
	if (m->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)m);
	Py_CLEAR(m->lease);
	Py_TYPE(m)->tp_free((PyObject *)m);
}

static int mem_traverse(Mem *m, visitproc visit, void *arg)
{
	Py_VISIT(m->lease);
	return 0;
}

static int mem_clear(Mem *m)
{
	Py_CLEAR(m->lease);
	return 0;
}

static PyObject *mem_array_struct(Mem *m, void *closure)
{
	(void)closure;
	/* numpy copies what it needs and keeps @m as the array's base */
	return PyCapsule_New(&m->iface, NULL, NULL);
}

static PyMemberDef mem_members[] = {
	{ "lease", T_OBJECT, offsetof(Mem, lease), 0, NULL },
	{ NULL }
};

static PyGetSetDef mem_getset[] = {
	{ "__array_struct__", (getter)mem_array_struct, NULL, NULL, NULL },
	{ NULL }
};

static PyTypeObject MemType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "loaderd._fast.Mem",
	.tp_basicsize = sizeof(Mem),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "The base object of one field's array (copy-on-write slot memory).",
	.tp_dealloc = (destructor)mem_dealloc,
	.tp_traverse = (traverseproc)mem_traverse,
	.tp_clear = (inquiry)mem_clear,
	.tp_weaklistoffset = offsetof(Mem, weakrefs),
	.tp_members = mem_members,
	.tp_getset = mem_getset,
};

/* --- DLPack: a torch tensor straight from a Mem ---------------------------- */

/* dlpack.h (v0.x layout, what torch 1.13's torch._C._from_dlpack takes) */
typedef struct {
	void *data;
	struct { int32_t device_type, device_id; } device;
	int32_t ndim;
	struct { uint8_t code, bits; uint16_t lanes; } dtype;
	int64_t *shape;
	int64_t *strides;
	uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed {
	dl_tensor dl;
	void *manager_ctx;
	void (*deleter)(struct dl_managed *);
} dl_managed;

typedef struct {
	dl_managed m;
	int64_t shape[LDR_MAX_DIMS];
	int64_t strides[LDR_MAX_DIMS];
} dl_owned;

/* The tensor's storage is gone: its Mem goes (any thread: take the GIL). */
static void dl_deleter(dl_managed *m)
{
	PyGILState_STATE g = PyGILState_Ensure();

	Py_XDECREF((PyObject *)m->manager_ctx);
	PyMem_RawFree(m);
	PyGILState_Release(g);
}

/* A capsule torch never took: it frees what it holds. */
static void dl_capsule_free(PyObject *cap)
{
	if (PyCapsule_IsValid(cap, "dltensor")) {
		dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
		if (m && m->deleter)
			m->deleter(m);
	}
}

/* The DLPack type code of numpy's @typekind, or -1 (the package asks for
 * DLPack for integers and floats only). */
static int dl_code(char typekind)
{
	switch (typekind) {
	case 'i': return 0;     /* kDLInt */
	case 'u': return 1;     /* kDLUInt */
	case 'f': return 2;     /* kDLFloat */
	default: return -1;
	}
}

/* A capsule of @m's memory (a new reference to @m inside), or NULL. */
static PyObject *dl_capsule(Mem *m, int code)
{
	dl_owned *o = PyMem_RawMalloc(sizeof(*o));
	PyObject *cap;

	if (!o)
		return PyErr_NoMemory();
	for (int d = 0; d < m->iface.nd; d++)
		o->shape[d] = (int64_t)m->shape[d];
	/* C order, in elements (a consumer that reads NULL as compact, as the
	 * DLPack spec allows, and one that does not, both get it right) */
	int64_t st = 1;
	for (int d = m->iface.nd - 1; d >= 0; d--) {
		o->strides[d] = st;
		st *= o->shape[d];
	}
	o->m.dl = (dl_tensor){ .data = m->iface.data, .device = { 1, 0 } /* kDLCPU */,
		.ndim = m->iface.nd, .dtype = { (uint8_t)code, (uint8_t)(m->iface.itemsize * 8), 1 },
		.shape = o->shape, .strides = o->strides, .byte_offset = 0 };
	o->m.manager_ctx = Py_NewRef((PyObject *)m);
	o->m.deleter = dl_deleter;
	cap = PyCapsule_New(&o->m, "dltensor", dl_capsule_free);
	if (!cap) {
		Py_DECREF((PyObject *)m);
		PyMem_RawFree(o);
	}
	return cap;
}

/* --- Host: one attachment's next() --------------------------------------- */

struct field_meta {
	PyObject *name;      /* str */
	PyObject *conv;      /* callable or NULL: array -> tensor (or capsule -> tensor) */
	int dlpack;          /* >= 0: conv takes a DLPack capsule of this dtype code */
	char typekind;
	int itemsize;
};

typedef struct {
	PyObject_HEAD
	next_fn next;
	void *att;           /* ldr_attachment* */
	struct ldr_batch_info *info;
	struct ldr_field *fields;
	int nfields;
	struct field_meta *meta;
	PyObject *pyatt;     /* the package's _Attachment */
	PyObject *batch_type;
	PyObject *asarray;
} Host;

static PyObject *s_leases, *s_seq, *s_prune_at, *s_prune_leases, *s_epoch, *s_index, *s_rows,
	*s_lease, *one;

static void host_dealloc(Host *h)
{
	PyObject_GC_UnTrack(h);
	for (int i = 0; h->meta && i < h->nfields; i++) {
		Py_XDECREF(h->meta[i].name);
		Py_XDECREF(h->meta[i].conv);
	}
	PyMem_Free(h->meta);
	Py_CLEAR(h->pyatt);
	Py_CLEAR(h->batch_type);
	Py_CLEAR(h->asarray);
	Py_TYPE(h)->tp_free((PyObject *)h);
}

static int host_traverse(Host *h, visitproc visit, void *arg)
{
	Py_VISIT(h->pyatt);
	return 0;
}

static int host_clear(Host *h)
{
	Py_CLEAR(h->pyatt);
	return 0;
}

/*
 * Host(att, next_addr, att_ptr, info_addr, fields_addr, nfields, meta,
 *      batch_type, asarray): @meta a sequence of (name, typestr, conv).
 */
static PyObject *host_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	PyObject *pyatt, *meta, *batch_type, *asarray;
	unsigned long long next_addr, att_ptr, info_addr, fields_addr;
	int nfields;
	Host *h;

	(void)kw;
	if (!PyArg_ParseTuple(args, "OKKKKiOOO", &pyatt, &next_addr, &att_ptr, &info_addr,
	                      &fields_addr, &nfields, &meta, &batch_type, &asarray))
		return NULL;
	if (nfields < 1 || nfields > 64 || PySequence_Size(meta) != nfields) {
		PyErr_SetString(PyExc_ValueError, "Host: one (name, typestr, conv) per field, 1 to 64");
		return NULL;
	}
	h = (Host *)type->tp_alloc(type, 0);
	if (!h)
		return NULL;
	h->next = (next_fn)(uintptr_t)next_addr;
	h->att = (void *)(uintptr_t)att_ptr;
	h->info = (struct ldr_batch_info *)(uintptr_t)info_addr;
	h->fields = (struct ldr_field *)(uintptr_t)fields_addr;
	h->nfields = nfields;
	h->meta = PyMem_Calloc((size_t)nfields, sizeof(*h->meta));
	h->pyatt = Py_NewRef(pyatt);
	h->batch_type = Py_NewRef(batch_type);
	h->asarray = Py_NewRef(asarray);
	if (!h->meta) {
		Py_DECREF(h);
		return PyErr_NoMemory();
	}
	for (int i = 0; i < nfields; i++) {
		PyObject *t = PySequence_GetItem(meta, i), *name, *conv;
		const char *typestr;
		if (!t)
			goto fail;
		int dlpack = 0;
		if (!PyArg_ParseTuple(t, "UsO|p", &name, &typestr, &conv, &dlpack) || strlen(typestr) < 3) {
			Py_DECREF(t);
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_ValueError, "Host: a typestr such as '<f4'");
			goto fail;
		}
		h->meta[i].name = Py_NewRef(name);
		h->meta[i].conv = conv == Py_None ? NULL : Py_NewRef(conv);
		h->meta[i].typekind = typestr[1];
		h->meta[i].itemsize = atoi(typestr + 2);
		h->meta[i].dlpack = dlpack ? dl_code(h->meta[i].typekind) : -1;
		Py_DECREF(t);
		if (dlpack && (h->meta[i].dlpack < 0 || !h->meta[i].conv)) {
			PyErr_Format(PyExc_ValueError, "Host: no DLPack tensor of typestr '%s'", typestr);
			goto fail;
		}
		if (typestr[0] == '>' || h->meta[i].itemsize <= 0) {
			PyErr_Format(PyExc_ValueError, "Host: typestr '%s' is not native", typestr);
			goto fail;
		}
	}
	return (PyObject *)h;
fail:
	Py_DECREF(h);
	return NULL;
}

/* att.leases[att.seq] = weakref(lease); att.seq += 1; prune now and then:
 * _Attachment.add_lease() */
static int add_lease(Host *h, PyObject *lease)
{
	PyObject *leases = NULL, *seq = NULL, *next = NULL, *wr = NULL, *at = NULL;
	int r = -1;

	if (!(leases = PyObject_GetAttr(h->pyatt, s_leases)) || !(seq = PyObject_GetAttr(h->pyatt, s_seq)) ||
	    !(wr = PyWeakref_NewRef(lease, NULL)) || PyObject_SetItem(leases, seq, wr) < 0)
		goto out;
	if (!(next = PyNumber_Add(seq, one)) || PyObject_SetAttr(h->pyatt, s_seq, next) < 0)
		goto out;
	if (!(at = PyObject_GetAttr(h->pyatt, s_prune_at)))
		goto out;
	Py_ssize_t n = PyObject_Size(leases);
	long lim = PyLong_AsLong(at);
	if (n < 0 || (lim == -1 && PyErr_Occurred()))
		goto out;
	if (n >= lim) {
		PyObject *x = PyObject_CallMethodNoArgs(h->pyatt, s_prune_leases);
		if (!x)
			goto out;
		Py_DECREF(x);
	}
	r = 0;
out:
	Py_XDECREF(leases);
	Py_XDECREF(seq);
	Py_XDECREF(next);
	Py_XDECREF(wr);
	Py_XDECREF(at);
	return r;
}

/* The batch just taken, as _next_raw() builds it. */
static PyObject *host_batch(Host *h, void *raw)
{
	const struct ldr_batch_info *info = h->info;
	PyObject *b = NULL, *mems = NULL, *v;
	Lease *l;

	l = PyObject_GC_New(Lease, &LeaseType);
	if (!l) {
		Py_BEGIN_ALLOW_THREADS
		ldr_release_p(raw);
		Py_END_ALLOW_THREADS
		return NULL;
	}
	l->raw = raw;
	l->ptr = PyLong_FromVoidPtr(raw);
	l->att = Py_NewRef(h->pyatt);
	l->device = Py_NewRef(Py_None);
	l->kept = Py_NewRef(Py_False);
	l->mems = PyTuple_New(0);
	l->weakrefs = NULL;
	PyObject_GC_Track(l);
	if (!l->ptr || !l->mems || add_lease(h, (PyObject *)l) < 0)
		goto fail;
	if (!(b = PyObject_CallNoArgs(h->batch_type)) || PyObject_SetAttr(b, s_lease, (PyObject *)l) < 0)
		goto fail;
	if (!(v = PyLong_FromUnsignedLongLong(info->epoch)) || PyObject_SetAttr(b, s_epoch, v) < 0)
		goto fail_v;
	Py_DECREF(v);
	if (!(v = PyLong_FromUnsignedLongLong(info->index)) || PyObject_SetAttr(b, s_index, v) < 0)
		goto fail_v;
	Py_DECREF(v);
	if (!(v = PyLong_FromUnsignedLong(info->rows)) || PyObject_SetAttr(b, s_rows, v) < 0)
		goto fail_v;
	Py_DECREF(v);
	if (!(mems = PyTuple_New(h->nfields)))
		goto fail;
	for (int i = 0; i < h->nfields; i++) {
		const struct ldr_field *f = &h->fields[i];
		const struct field_meta *fm = &h->meta[i];
		Mem *m = PyObject_GC_New(Mem, &MemType);
		PyObject *arr, *out;
		int nd = f->ndim < 1 ? 1 : f->ndim > LDR_MAX_DIMS ? LDR_MAX_DIMS : f->ndim;

		if (!m)
			goto fail;
		m->lease = Py_NewRef((PyObject *)l);
		m->weakrefs = NULL;
		m->shape[0] = info->rows;
		for (int d = 1; d < nd; d++)
			m->shape[d] = (Py_intptr_t)f->shape[d];
		m->iface = (array_iface){ .two = 2, .nd = nd, .typekind = fm->typekind,
			.itemsize = fm->itemsize, .shape = m->shape, .strides = NULL,
			/* writable: the slot is mapped copy-on-write */
			.flags = IFACE_C_CONTIGUOUS | IFACE_ALIGNED | IFACE_NOTSWAPPED | IFACE_WRITEABLE,
			.data = f->data };
		PyObject_GC_Track(m);
		PyObject *wr = PyWeakref_NewRef((PyObject *)m, NULL);
		if (!wr) {
			Py_DECREF(m);
			goto fail;
		}
		PyTuple_SET_ITEM(mems, i, wr);
		if (fm->dlpack >= 0) {
			/* a tensor straight from the memory: no numpy array between */
			arr = dl_capsule(m, fm->dlpack);
			Py_DECREF(m); /* the capsule holds it, then the tensor */
			if (!arr)
				goto fail;
			out = PyObject_CallOneArg(fm->conv, arr);
			Py_DECREF(arr);
		} else {
			arr = PyObject_CallOneArg(h->asarray, (PyObject *)m);
			Py_DECREF(m); /* the array holds it */
			if (!arr)
				goto fail;
			out = fm->conv ? PyObject_CallOneArg(fm->conv, arr) : Py_NewRef(arr);
			Py_DECREF(arr);
		}
		if (!out || PyDict_SetItem(b, fm->name, out) < 0) {
			Py_XDECREF(out);
			goto fail;
		}
		Py_DECREF(out);
	}
	Py_SETREF(l->mems, mems);
	Py_DECREF(l);
	return b;
fail_v:
	Py_XDECREF(v);
fail:
	Py_XDECREF(mems);
	Py_XDECREF(b);
	Py_DECREF(l); /* releases the batch when nothing else holds it */
	return NULL;
}

/* next(wait_ms): the Batch, or libloader's negative return (no batch). */
static PyObject *host_next(Host *h, PyObject *arg)
{
	long w = PyLong_AsLong(arg);
	int wait = w > INT32_MAX ? INT32_MAX : w < -1 ? -1 : (int)w;
	void *raw = NULL;
	int r;

	if (w == -1 && PyErr_Occurred())
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	r = h->next(h->att, wait, &raw, h->info, h->fields, h->nfields);
	Py_END_ALLOW_THREADS
	if (r != 0 || !raw)
		return PyLong_FromLong(r != 0 ? r : -EPROTO);
	return host_batch(h, raw);
}

static PyMethodDef host_methods[] = {
	{ "next", (PyCFunction)host_next, METH_O, "next(wait_ms): a Batch, or a negative errno" },
	{ NULL }
};

static PyTypeObject HostType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "loaderd._fast.Host",
	.tp_basicsize = sizeof(Host),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "One host attachment's next(), in C.",
	.tp_new = host_new,
	.tp_dealloc = (destructor)host_dealloc,
	.tp_traverse = (traverseproc)host_traverse,
	.tp_clear = (inquiry)host_clear,
	.tp_methods = host_methods,
};

/* --- a worker's per-sample seeding of Python's random ---------------------- */

/* CPython's _random.Random object (Modules/_randommodule.c): the Mersenne
 * Twister's 624 words and its position. random.seed(int) fills them with
 * MT's init_by_array, about 7 us a call, more than anything else a worker
 * does for a near-free sample; loaderd's per-sample seeding fills them from
 * splitmix64 instead (docs/python.md, "Seeding"): pair k of words is
 * splitmix64(s + k), low half first, the position at the end (the next draw
 * regenerates). The package checks once per process that this layout is
 * the running interpreter's (getstate() after a fill, against the words
 * computed in Python) and otherwise seeds through random.setstate(). */
#define MT_N 624
typedef struct {
	PyObject_HEAD
	int index;
	uint32_t state[MT_N];
} MTObject;

static PyTypeObject *mt_type; /* _random.Random, from mt_setup() */

static uint64_t splitmix64(uint64_t x)
{
	uint64_t z = x + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* mt_setup(_random.Random): the type mt_seed() fills. */
static PyObject *fast_mt_setup(PyObject *self, PyObject *arg)
{
	(void)self;
	if (!PyType_Check(arg) || ((PyTypeObject *)arg)->tp_basicsize < (Py_ssize_t)sizeof(MTObject)) {
		PyErr_SetString(PyExc_TypeError, "mt_setup: _random.Random, of CPython's layout");
		return NULL;
	}
	Py_XSETREF(mt_type, (PyTypeObject *)Py_NewRef(arg));
	Py_RETURN_NONE;
}

/* mt_seed(random_instance, s): its state from the 64-bit seed s. */
static PyObject *fast_mt_seed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	unsigned long long s;
	MTObject *m;

	(void)self;
	if (nargs != 2 || !mt_type || !PyObject_TypeCheck(args[0], mt_type)) {
		PyErr_SetString(PyExc_TypeError, "mt_seed(random instance, seed) after mt_setup()");
		return NULL;
	}
	s = PyLong_AsUnsignedLongLongMask(args[1]);
	if (s == (unsigned long long)-1 && PyErr_Occurred())
		return NULL;
	m = (MTObject *)args[0];
	for (unsigned k = 0; k < MT_N / 2; k++) {
		uint64_t z = splitmix64((uint64_t)s + k);

		m->state[2 * k] = (uint32_t)z;
		m->state[2 * k + 1] = (uint32_t)(z >> 32);
	}
	m->index = MT_N;
	Py_RETURN_NONE;
}

/* --- the module ------------------------------------------------------------ */

/* setup(release_addr): libloader's ldr_release, as ctypes loaded it. */
static PyObject *fast_setup(PyObject *self, PyObject *arg)
{
	unsigned long long addr = PyLong_AsUnsignedLongLong(arg);

	(void)self;
	if (PyErr_Occurred())
		return NULL;
	if (!addr) {
		PyErr_SetString(PyExc_ValueError, "setup: the address of ldr_release");
		return NULL;
	}
	ldr_release_p = (release_fn)(uintptr_t)addr;
	Py_RETURN_NONE;
}

static PyMethodDef fast_methods[] = {
	{ "setup", fast_setup, METH_O, "setup(ldr_release address)" },
	{ "mt_setup", fast_mt_setup, METH_O, "mt_setup(_random.Random)" },
	{ "mt_seed", (PyCFunction)(void (*)(void))fast_mt_seed, METH_FASTCALL,
	  "mt_seed(random instance, seed): its state from splitmix64(seed + k)" },
	{ NULL }
};

static struct PyModuleDef fast_module = {
	PyModuleDef_HEAD_INIT,
	.m_name = "_fast",
	.m_doc = "loaderd's per-batch path in C (client/python/pyfast.c)",
	.m_size = -1,
	.m_methods = fast_methods,
};

PyMODINIT_FUNC PyInit__fast(void);
PyMODINIT_FUNC PyInit__fast(void)
{
	PyObject *m;

#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL
	INTERN(s_leases, "leases");
	INTERN(s_seq, "seq");
	INTERN(s_prune_at, "prune_at");
	INTERN(s_prune_leases, "prune_leases");
	INTERN(s_epoch, "epoch");
	INTERN(s_index, "index");
	INTERN(s_rows, "rows");
	INTERN(s_lease, "_lease");
#undef INTERN
	if (!(one = PyLong_FromLong(1)))
		return NULL;
	if (PyType_Ready(&LeaseType) < 0 || PyType_Ready(&MemType) < 0 || PyType_Ready(&HostType) < 0)
		return NULL;
	if (!(m = PyModule_Create(&fast_module)))
		return NULL;
	if (PyModule_AddObjectRef(m, "Lease", (PyObject *)&LeaseType) < 0 ||
	    PyModule_AddObjectRef(m, "Mem", (PyObject *)&MemType) < 0 ||
	    PyModule_AddObjectRef(m, "Host", (PyObject *)&HostType) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
