/* SPDX-License-Identifier: MIT */
/* fakecuda - an emulated CUDA driver, for logic tests on machines without a GPU
 *
 * THIS IS NOT A GPU AND NOT A SUBSTITUTE FOR tests/gpu/run.sh ON REAL HARDWARE.
 * It exists so that CI, which has no GPU, can drive loaderd's copy engine, its
 * device-memory export and the client's mapping end to end through the same
 * dlopen + cuGetProcAddress path that libcuda.so.1 takes (point
 * LOADERD_CUDA_LIBRARY at the built libfakecuda.so). It checks the logic --
 * which calls, in which order, with which arguments, in which context, which
 * process maps what -- never speed, DMA, pinning, asynchrony or the driver's
 * real limits.
 *
 * "Device memory" is plain host memory: every allocation is a memfd mapped
 * MAP_SHARED, and a device pointer is its host address, so a test can read and
 * write device memory directly. All work is synchronous: a copy is done when
 * the call returns, and an event is complete as soon as it is recorded.
 * Legacy IPC handles carry the exporter's pid and memfd number, and the
 * importer opens /proc/<pid>/fd/<n>; VMM POSIX-fd handles are dup'ed memfds.
 *
 * Errors follow the real driver where its documented or observed behaviour is
 * known (NOT_INITIALIZED before cuInit and in a child forked after it,
 * INVALID_CONTEXT without a current context, INVALID_CONTEXT for an IPC handle
 * opened in its own process, HOST_MEMORY_NOT_REGISTERED, ...). Where the real
 * driver would crash or corrupt memory (a copy past the end of an
 * allocation), this one returns CUDA_ERROR_INVALID_VALUE instead.
 *
 * Environment, read by cuInit (FAKECUDA_LOG when the library is loaded):
 *   FAKECUDA_DEVICES   number of devices, 0..16 (default 1; 0: cuInit fails
 *                      with CUDA_ERROR_NO_DEVICE)
 *   FAKECUDA_POSIX_FD  0: devices have no POSIX-fd handle support, cuMemCreate
 *                      asking for it fails with CUDA_ERROR_NOT_SUPPORTED (default 1)
 *   FAKECUDA_VMM       0: no virtual memory management at all (default 1)
 *   FAKECUDA_INIT_MS   cuInit takes this long, 0..60000 (default 0), as a real
 *                      one can on a GPU without persistence mode
 *   FAKECUDA_LOG       a file to append one line per call to: the plain name
 *                      ("cuMemAlloc", never "cuMemAlloc_v2")
 *
 * One global mutex serialises every call; the current context is per thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda.h>

/* cuda.h names the v1 cuGetProcAddress only for the driver's own build. */
#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

#define FAKE_DRIVER_VERSION 12040
#define FAKE_MAX_DEVICES 16
#define FAKE_TOTAL_MEM (16ull << 30)
#define FAKE_GRANULARITY (2ull << 20)
#define FAKE_CTX_STACK 32
#define IPC_MAGIC "fakecuIP"

/* --- state --------------------------------------------------------------- */

struct CUctx_st {
	CUdevice dev;
	int refs;                   /* primary context retains; 0: not active */
};

struct CUstream_st {
	struct CUstream_st *next;
	CUcontext ctx;
	unsigned int flags;
};

struct CUevent_st {
	struct CUevent_st *next;
	CUcontext ctx;
	unsigned int flags;
};

enum region_kind {
	REGION_ALLOC,               /* cuMemAlloc */
	REGION_IPC,                 /* cuIpcOpenMemHandle */
	REGION_MAP,                 /* cuMemMap */
};

/* A range of "device memory" that copies may touch. */
struct region {
	struct region *next;
	enum region_kind kind;
	uintptr_t base;
	size_t size;                /* as asked; copies past it fail */
	size_t map_size;            /* as mmapped (whole pages) */
	int prot;                   /* PROT_READ | PROT_WRITE, or less for a map */
	CUdevice dev;
	CUcontext ctx;              /* NULL for a map */
	int fd;                     /* REGION_ALLOC: its memfd, kept for IPC */
	uint64_t serial;            /* REGION_ALLOC: names the memfd */
	pid_t ipc_pid;              /* REGION_IPC: the exporter and its serial */
	uint64_t ipc_serial;
	int ipc_refs;
	struct vmm_handle *handle;  /* REGION_MAP */
};

struct vmm_handle {
	struct vmm_handle *next;
	CUmemGenericAllocationHandle id;
	int fd;
	size_t size;
	CUdevice dev;
	bool posix_fd;              /* may be exported */
	bool released;
	int maps;
	bool imported;
};

struct reservation {
	struct reservation *next;
	uintptr_t base;
	size_t size;
};

struct hostreg {
	struct hostreg *next;
	uintptr_t base;
	size_t size;
	CUcontext ctx;
};

static struct {
	pthread_mutex_t lock;
	bool initialised;
	pid_t init_pid;
	int ndevices;
	bool posix_fd;
	bool vmm;
	int log_fd;
	uint64_t serial;
	uint64_t used[FAKE_MAX_DEVICES];
	struct CUctx_st ctx[FAKE_MAX_DEVICES];
	struct region *regions;
	struct vmm_handle *handles;
	struct reservation *reservations;
	struct hostreg *hostregs;
	struct CUstream_st *streams;
	struct CUevent_st *events;
} g = { .lock = PTHREAD_MUTEX_INITIALIZER, .log_fd = -1 };

static __thread CUcontext tl_stack[FAKE_CTX_STACK];
static __thread int tl_depth;

static void atfork_prepare(void)
{
	pthread_mutex_lock(&g.lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&g.lock);
}

static void atfork_child(void)
{
	pthread_mutex_init(&g.lock, NULL);
}

__attribute__((constructor)) static void fake_load(void)
{
	const char *log = getenv("FAKECUDA_LOG");

	if (log && *log)
		g.log_fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* One line per call, one write(2), so processes sharing a log interleave whole lines. */
static void trace(const char *name)
{
	char line[128];
	int n;

	if (g.log_fd < 0)
		return;
	n = snprintf(line, sizeof(line), "%s\n", name);
	if (n > 0 && write(g.log_fd, line, (size_t)n) < 0) {
		/* a test that cannot log sees the count come up short */
	}
}

#define ENTER(name) do { trace(name); pthread_mutex_lock(&g.lock); } while (0)

static CUresult leave(CUresult r)
{
	pthread_mutex_unlock(&g.lock);
	return r;
}

/* Initialised in this process (a child forked after cuInit is not, as with libcuda). */
static bool ready(void)
{
	return g.initialised && g.init_pid == getpid();
}

#define CHECK_INIT() do { if (!ready()) return leave(CUDA_ERROR_NOT_INITIALIZED); } while (0)

static bool device_ok(CUdevice dev)
{
	return dev >= 0 && dev < g.ndevices;
}

static CUcontext current(void)
{
	return tl_depth ? tl_stack[tl_depth - 1] : NULL;
}

/* The thread's context, if it has one that is alive. */
static CUresult need_ctx(CUcontext *out)
{
	CUcontext c = current();

	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (c->refs <= 0)
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	if (out)
		*out = c;
	return CUDA_SUCCESS;
}

#define CHECK_CTX(c) do { CUresult cr_ = need_ctx(c); if (cr_ != CUDA_SUCCESS) return leave(cr_); } while (0)

static bool is_ctx(CUcontext c)
{
	return c >= &g.ctx[0] && c < &g.ctx[FAKE_MAX_DEVICES] && c - &g.ctx[0] < g.ndevices;
}

static size_t page_round(size_t n)
{
	size_t p = (size_t)sysconf(_SC_PAGESIZE);

	return (n + p - 1) / p * p;
}

static bool add_overflows(uintptr_t a, size_t b)
{
	return a + b < a;
}

/* --- regions of device memory -------------------------------------------- */

static struct region *region_at(uintptr_t p)
{
	for (struct region *r = g.regions; r; r = r->next)
		if (p >= r->base && p < r->base + r->size)
			return r;
	return NULL;
}

static struct region *region_base(uintptr_t p, enum region_kind kind)
{
	for (struct region *r = g.regions; r; r = r->next)
		if (r->kind == kind && r->base == p)
			return r;
	return NULL;
}

static void region_unlink(struct region *gone)
{
	for (struct region **pp = &g.regions; *pp; pp = &(*pp)->next)
		if (*pp == gone) {
			*pp = gone->next;
			return;
		}
}

/* [p, p+n) lies in known device memory that allows @prot. Only adjacent VMM
 * mappings (one reservation) may be crossed: two cuMemAlloc ranges that happen
 * to abut are still two allocations. */
static CUresult check_range(CUdeviceptr dptr, size_t n, int prot)
{
	uintptr_t p = (uintptr_t)dptr, end;

	if (!n)
		return CUDA_SUCCESS;
	if (add_overflows(p, n))
		return CUDA_ERROR_INVALID_VALUE;
	end = p + n;
	while (p < end) {
		struct region *r = region_at(p);

		if (!r || (r->prot & prot) != prot)
			return CUDA_ERROR_INVALID_VALUE;
		if (r->kind != REGION_MAP && end > r->base + r->size)
			return CUDA_ERROR_INVALID_VALUE;
		p = r->base + r->size;
	}
	return CUDA_SUCCESS;
}

static void region_free(struct region *r)
{
	if (r->kind == REGION_MAP)
		return; /* never freed with a context */
	munmap((void *)r->base, r->map_size);
	if (r->kind == REGION_ALLOC) {
		close(r->fd);
		g.used[r->dev] -= r->map_size;
	}
	region_unlink(r);
	free(r);
}

static CUresult check_stream(CUstream s, CUcontext ctx)
{
	if (!s)
		return CUDA_SUCCESS;
	for (struct CUstream_st *p = g.streams; p; p = p->next)
		if (p == s)
			return p->ctx == ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
	return CUDA_ERROR_INVALID_HANDLE;
}

static struct CUevent_st *find_event(CUevent e)
{
	for (struct CUevent_st *p = g.events; p; p = p->next)
		if (p == e)
			return p;
	return NULL;
}

/* A primary context whose last retain went: everything it owned goes with it. */
static void ctx_destroy(CUcontext c)
{
	struct region *r, *rn;
	struct hostreg **hp;
	struct CUstream_st **sp;
	struct CUevent_st **ep;

	for (r = g.regions; r; r = rn) {
		rn = r->next;
		if (r->ctx == c)
			region_free(r);
	}
	for (hp = &g.hostregs; *hp;) {
		struct hostreg *h = *hp;

		if (h->ctx == c) {
			*hp = h->next;
			free(h);
		} else {
			hp = &h->next;
		}
	}
	for (sp = &g.streams; *sp;) {
		struct CUstream_st *s = *sp;

		if (s->ctx == c) {
			*sp = s->next;
			free(s);
		} else {
			sp = &s->next;
		}
	}
	for (ep = &g.events; *ep;) {
		struct CUevent_st *e = *ep;

		if (e->ctx == c) {
			*ep = e->next;
			free(e);
		} else {
			ep = &e->next;
		}
	}
}

/* --- errors, version, init ----------------------------------------------- */

static const struct {
	CUresult code;
	const char *name;
	const char *text;
} results[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
	{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed" },
	{ CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM",
	  "OS call failed or operation not supported on this OS" },
	{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
	{ CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed" },
	{ CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	  "part or all of the requested memory range is already mapped" },
	{ CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	  "pointer does not correspond to a registered memory region" },
	{ CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted in the current state" },
	{ CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
	trace("cuGetErrorName");
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(results) / sizeof(results[0]); i++)
		if (results[i].code == error) {
			*pStr = results[i].name;
			return CUDA_SUCCESS;
		}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
	trace("cuGetErrorString");
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(results) / sizeof(results[0]); i++)
		if (results[i].code == error) {
			*pStr = results[i].text;
			return CUDA_SUCCESS;
		}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
	trace("cuDriverGetVersion");
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = FAKE_DRIVER_VERSION;
	return CUDA_SUCCESS;
}

/* An integer variable in @lo..@hi, @def when unset; -1 when malformed. */
static int env_int(const char *name, int def, int lo, int hi)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < lo || v > hi) {
		fprintf(stderr, "fakecuda: %s=%s is not a number from %d to %d\n", name, s, lo, hi);
		return -1;
	}
	return (int)v;
}

CUresult cuInit(unsigned int Flags)
{
	int n, posix_fd, vmm, init_ms;

	ENTER("cuInit");
	if (Flags)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (g.initialised)
		return leave(g.init_pid == getpid() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED);
	n = env_int("FAKECUDA_DEVICES", 1, 0, FAKE_MAX_DEVICES);
	posix_fd = env_int("FAKECUDA_POSIX_FD", 1, 0, 1);
	vmm = env_int("FAKECUDA_VMM", 1, 0, 1);
	init_ms = env_int("FAKECUDA_INIT_MS", 0, 0, 60000);
	if (n < 0 || posix_fd < 0 || vmm < 0 || init_ms < 0)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (init_ms)
		usleep((useconds_t)init_ms * 1000);
	if (n == 0)
		return leave(CUDA_ERROR_NO_DEVICE);
	g.ndevices = n;
	g.posix_fd = posix_fd;
	g.vmm = vmm;
	for (int i = 0; i < n; i++)
		g.ctx[i].dev = i;
	g.initialised = true;
	g.init_pid = getpid();
	return leave(CUDA_SUCCESS);
}

/* --- devices ------------------------------------------------------------- */

CUresult cuDeviceGetCount(int *count)
{
	ENTER("cuDeviceGetCount");
	CHECK_INIT();
	if (!count)
		return leave(CUDA_ERROR_INVALID_VALUE);
	*count = g.ndevices;
	return leave(CUDA_SUCCESS);
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	ENTER("cuDeviceGet");
	CHECK_INIT();
	if (!device)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (!device_ok(ordinal))
		return leave(CUDA_ERROR_INVALID_DEVICE);
	*device = ordinal;
	return leave(CUDA_SUCCESS);
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	ENTER("cuDeviceGetName");
	CHECK_INIT();
	if (!name || len <= 0)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (!device_ok(dev))
		return leave(CUDA_ERROR_INVALID_DEVICE);
	snprintf(name, (size_t)len, "loaderd fake CUDA device %d (host memory)", dev);
	return leave(CUDA_SUCCESS);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	ENTER("cuDeviceTotalMem");
	CHECK_INIT();
	if (!bytes)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (!device_ok(dev))
		return leave(CUDA_ERROR_INVALID_DEVICE);
	*bytes = FAKE_TOTAL_MEM;
	return leave(CUDA_SUCCESS);
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	int v = 0;

	ENTER("cuDeviceGetAttribute");
	CHECK_INIT();
	if (!pi || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (!device_ok(dev))
		return leave(CUDA_ERROR_INVALID_DEVICE);
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
		v = 9;
		break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
		v = 0;
		break;
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
		v = g.vmm;
		break;
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
		v = g.vmm && g.posix_fd;
		break;
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
	case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
	case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED:
		v = 1;
		break;
	default:
		v = 0;
		break;
	}
	*pi = v;
	return leave(CUDA_SUCCESS);
}

/* --- contexts ------------------------------------------------------------ */

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	ENTER("cuDevicePrimaryCtxRetain");
	CHECK_INIT();
	if (!pctx)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (!device_ok(dev))
		return leave(CUDA_ERROR_INVALID_DEVICE);
	g.ctx[dev].refs++;
	*pctx = &g.ctx[dev];
	return leave(CUDA_SUCCESS);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	ENTER("cuDevicePrimaryCtxRelease");
	CHECK_INIT();
	if (!device_ok(dev))
		return leave(CUDA_ERROR_INVALID_DEVICE);
	if (g.ctx[dev].refs <= 0)
		return leave(CUDA_ERROR_INVALID_CONTEXT);
	if (--g.ctx[dev].refs == 0)
		ctx_destroy(&g.ctx[dev]);
	return leave(CUDA_SUCCESS);
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
	ENTER("cuCtxSetCurrent");
	CHECK_INIT();
	if (ctx && !is_ctx(ctx))
		return leave(CUDA_ERROR_INVALID_CONTEXT);
	if (!ctx) {
		if (tl_depth)
			tl_depth--;
	} else if (tl_depth) {
		tl_stack[tl_depth - 1] = ctx;
	} else {
		tl_stack[tl_depth++] = ctx;
	}
	return leave(CUDA_SUCCESS);
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	ENTER("cuCtxGetCurrent");
	CHECK_INIT();
	if (!pctx)
		return leave(CUDA_ERROR_INVALID_VALUE);
	*pctx = current();
	return leave(CUDA_SUCCESS);
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	ENTER("cuCtxPushCurrent");
	CHECK_INIT();
	if (!ctx || !is_ctx(ctx))
		return leave(CUDA_ERROR_INVALID_CONTEXT);
	if (tl_depth == FAKE_CTX_STACK)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	tl_stack[tl_depth++] = ctx;
	return leave(CUDA_SUCCESS);
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	ENTER("cuCtxPopCurrent");
	CHECK_INIT();
	if (!tl_depth)
		return leave(CUDA_ERROR_INVALID_CONTEXT);
	tl_depth--;
	if (pctx)
		*pctx = tl_stack[tl_depth];
	return leave(CUDA_SUCCESS);
}

CUresult cuCtxGetDevice(CUdevice *device)
{
	CUcontext c;

	ENTER("cuCtxGetDevice");
	CHECK_INIT();
	if (!device)
		return leave(CUDA_ERROR_INVALID_VALUE);
	CHECK_CTX(&c);
	*device = c->dev;
	return leave(CUDA_SUCCESS);
}

CUresult cuCtxSynchronize(void)
{
	ENTER("cuCtxSynchronize");
	CHECK_INIT();
	CHECK_CTX(NULL);
	return leave(CUDA_SUCCESS);
}

/* --- streams and events: the work is done by the time they are asked ----- */

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	struct CUstream_st *s;
	CUcontext c;

	ENTER("cuStreamCreate");
	CHECK_INIT();
	CHECK_CTX(&c);
	if (!phStream || (Flags & ~(unsigned int)CU_STREAM_NON_BLOCKING))
		return leave(CUDA_ERROR_INVALID_VALUE);
	s = calloc(1, sizeof(*s));
	if (!s)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	s->ctx = c;
	s->flags = Flags;
	s->next = g.streams;
	g.streams = s;
	*phStream = s;
	return leave(CUDA_SUCCESS);
}

CUresult cuStreamDestroy_v2(CUstream hStream)
{
	CUcontext c;

	ENTER("cuStreamDestroy");
	CHECK_INIT();
	CHECK_CTX(&c);
	if (!hStream)
		return leave(CUDA_ERROR_INVALID_HANDLE);
	for (struct CUstream_st **pp = &g.streams; *pp; pp = &(*pp)->next)
		if (*pp == hStream) {
			*pp = hStream->next;
			free(hStream);
			return leave(CUDA_SUCCESS);
		}
	return leave(CUDA_ERROR_INVALID_HANDLE);
}

CUresult cuStreamSynchronize(CUstream hStream)
{
	CUcontext c;

	ENTER("cuStreamSynchronize");
	CHECK_INIT();
	CHECK_CTX(&c);
	return leave(check_stream(hStream, c));
}

CUresult cuStreamQuery(CUstream hStream)
{
	CUcontext c;

	ENTER("cuStreamQuery");
	CHECK_INIT();
	CHECK_CTX(&c);
	return leave(check_stream(hStream, c));
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	const unsigned int known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
	struct CUevent_st *e;
	CUcontext c;

	ENTER("cuEventCreate");
	CHECK_INIT();
	CHECK_CTX(&c);
	if (!phEvent || (Flags & ~known) ||
	    ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
		return leave(CUDA_ERROR_INVALID_VALUE);
	e = calloc(1, sizeof(*e));
	if (!e)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	e->ctx = c;
	e->flags = Flags;
	e->next = g.events;
	g.events = e;
	*phEvent = e;
	return leave(CUDA_SUCCESS);
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	struct CUevent_st *e;
	CUcontext c;
	CUresult r;

	ENTER("cuEventRecord");
	CHECK_INIT();
	CHECK_CTX(&c);
	e = find_event(hEvent);
	if (!e)
		return leave(CUDA_ERROR_INVALID_HANDLE);
	r = check_stream(hStream, c);
	if (r != CUDA_SUCCESS)
		return leave(r);
	/* the event, the stream and the current context are one context */
	if (e->ctx != c)
		return leave(CUDA_ERROR_INVALID_HANDLE);
	return leave(CUDA_SUCCESS);
}

/* Recorded or never recorded, an event is complete: nothing is ever pending. */
CUresult cuEventQuery(CUevent hEvent)
{
	ENTER("cuEventQuery");
	CHECK_INIT();
	return leave(find_event(hEvent) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

CUresult cuEventSynchronize(CUevent hEvent)
{
	ENTER("cuEventSynchronize");
	CHECK_INIT();
	return leave(find_event(hEvent) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
	ENTER("cuEventDestroy");
	CHECK_INIT();
	for (struct CUevent_st **pp = &g.events; *pp; pp = &(*pp)->next)
		if (*pp == hEvent) {
			*pp = hEvent->next;
			free(hEvent);
			return leave(CUDA_SUCCESS);
		}
	return leave(CUDA_ERROR_INVALID_HANDLE);
}

/* --- host registration: bookkeeping only, nothing is pinned -------------- */

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
	const unsigned int known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
	                           CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
	uintptr_t base = (uintptr_t)p, pg, pend;
	struct hostreg *h;
	CUcontext c;

	ENTER("cuMemHostRegister");
	CHECK_INIT();
	CHECK_CTX(&c);
	if (!p || !bytesize || (Flags & ~known) || add_overflows(base, bytesize))
		return leave(CUDA_ERROR_INVALID_VALUE);
	for (h = g.hostregs; h; h = h->next)
		if (base < h->base + h->size && h->base < base + bytesize)
			return leave(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	/* the pages must exist: msync fails with ENOMEM on an unmapped range */
	pg = base & ~((uintptr_t)sysconf(_SC_PAGESIZE) - 1);
	pend = base + bytesize;
	if (msync((void *)pg, pend - pg, MS_ASYNC) < 0)
		return leave(CUDA_ERROR_INVALID_VALUE);
	h = calloc(1, sizeof(*h));
	if (!h)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	h->base = base;
	h->size = bytesize;
	h->ctx = c;
	h->next = g.hostregs;
	g.hostregs = h;
	return leave(CUDA_SUCCESS);
}

CUresult cuMemHostUnregister(void *p)
{
	ENTER("cuMemHostUnregister");
	CHECK_INIT();
	CHECK_CTX(NULL);
	if (!p)
		return leave(CUDA_ERROR_INVALID_VALUE);
	for (struct hostreg **pp = &g.hostregs; *pp; pp = &(*pp)->next)
		if ((*pp)->base == (uintptr_t)p) {
			struct hostreg *h = *pp;

			*pp = h->next;
			free(h);
			return leave(CUDA_SUCCESS);
		}
	return leave(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

/* --- cuMemAlloc memory --------------------------------------------------- */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	char name[64];
	struct region *r;
	size_t len;
	CUcontext c;
	void *p;
	int fd;

	ENTER("cuMemAlloc");
	CHECK_INIT();
	CHECK_CTX(&c);
	if (!dptr || !bytesize)
		return leave(CUDA_ERROR_INVALID_VALUE);
	len = page_round(bytesize);
	if (len < bytesize || len > FAKE_TOTAL_MEM - g.used[c->dev])
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	r = calloc(1, sizeof(*r));
	if (!r)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	r->serial = ++g.serial;
	snprintf(name, sizeof(name), "fakecuda-alloc-%llu", (unsigned long long)r->serial);
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)len) < 0 ||
	    (p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		if (fd >= 0)
			close(fd);
		free(r);
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	}
	r->kind = REGION_ALLOC;
	r->base = (uintptr_t)p;
	r->size = bytesize;
	r->map_size = len;
	r->prot = PROT_READ | PROT_WRITE;
	r->dev = c->dev;
	r->ctx = c;
	r->fd = fd;
	r->next = g.regions;
	g.regions = r;
	g.used[c->dev] += len;
	*dptr = (CUdeviceptr)r->base;
	return leave(CUDA_SUCCESS);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	struct region *r;

	ENTER("cuMemFree");
	CHECK_INIT();
	CHECK_CTX(NULL);
	r = region_base((uintptr_t)dptr, REGION_ALLOC);
	if (!r)
		return leave(CUDA_ERROR_INVALID_VALUE);
	region_free(r);
	return leave(CUDA_SUCCESS);
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	struct region *r;

	ENTER("cuMemGetAddressRange");
	CHECK_INIT();
	CHECK_CTX(NULL);
	r = region_at((uintptr_t)dptr);
	if (!r)
		return leave(CUDA_ERROR_NOT_FOUND);
	if (pbase)
		*pbase = (CUdeviceptr)r->base;
	if (psize)
		*psize = r->size;
	return leave(CUDA_SUCCESS);
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	CUcontext c;

	ENTER("cuMemGetInfo");
	CHECK_INIT();
	CHECK_CTX(&c);
	if (free_bytes)
		*free_bytes = FAKE_TOTAL_MEM - g.used[c->dev];
	if (total)
		*total = FAKE_TOTAL_MEM;
	return leave(CUDA_SUCCESS);
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	struct region *r;

	ENTER("cuPointerGetAttribute");
	CHECK_INIT();
	CHECK_CTX(NULL);
	if (!data)
		return leave(CUDA_ERROR_INVALID_VALUE);
	r = region_at((uintptr_t)ptr);
	if (!r)
		return leave(CUDA_ERROR_INVALID_VALUE);
	switch (attribute) {
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = r->dev;
		break;
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = r->ctx;
		break;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
		*(CUdeviceptr *)data = ptr;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = (CUdeviceptr)r->base;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = r->size;
		break;
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(int *)data = 1;
		break;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED:
		*(int *)data = 0;
		break;
	default:
		return leave(CUDA_ERROR_NOT_SUPPORTED);
	}
	return leave(CUDA_SUCCESS);
}

/* --- copies: synchronous memcpy/memset over checked ranges --------------- */

static CUresult copy_htod(const char *name, CUdeviceptr dst, const void *src, size_t n, CUstream s, bool async)
{
	CUcontext c;
	CUresult r;

	ENTER(name);
	CHECK_INIT();
	CHECK_CTX(&c);
	if (async && (r = check_stream(s, c)) != CUDA_SUCCESS)
		return leave(r);
	if (n && !src)
		return leave(CUDA_ERROR_INVALID_VALUE);
	r = check_range(dst, n, PROT_WRITE);
	if (r == CUDA_SUCCESS && n)
		memcpy((void *)(uintptr_t)dst, src, n);
	return leave(r);
}

static CUresult copy_dtoh(const char *name, void *dst, CUdeviceptr src, size_t n, CUstream s, bool async)
{
	CUcontext c;
	CUresult r;

	ENTER(name);
	CHECK_INIT();
	CHECK_CTX(&c);
	if (async && (r = check_stream(s, c)) != CUDA_SUCCESS)
		return leave(r);
	if (n && !dst)
		return leave(CUDA_ERROR_INVALID_VALUE);
	r = check_range(src, n, PROT_READ);
	if (r == CUDA_SUCCESS && n)
		memcpy(dst, (const void *)(uintptr_t)src, n);
	return leave(r);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	return copy_htod("cuMemcpyHtoD", dstDevice, srcHost, ByteCount, NULL, false);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
	return copy_htod("cuMemcpyHtoDAsync", dstDevice, srcHost, ByteCount, hStream, true);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	return copy_dtoh("cuMemcpyDtoH", dstHost, srcDevice, ByteCount, NULL, false);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	return copy_dtoh("cuMemcpyDtoHAsync", dstHost, srcDevice, ByteCount, hStream, true);
}

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	CUresult r;

	ENTER("cuMemsetD8");
	CHECK_INIT();
	CHECK_CTX(NULL);
	r = check_range(dstDevice, N, PROT_WRITE);
	if (r == CUDA_SUCCESS && N)
		memset((void *)(uintptr_t)dstDevice, uc, N);
	return leave(r);
}

/* --- legacy IPC: the exporter's pid and memfd number --------------------- */

struct ipc_wire {
	char magic[8];
	int32_t pid;
	int32_t fd;
	uint64_t serial;
	uint64_t size;              /* the allocation's, as asked */
	uint64_t offset;            /* of the pointer given, inside it (informative) */
	int32_t dev;
	uint32_t pad;
};
_Static_assert(sizeof(struct ipc_wire) <= CU_IPC_HANDLE_SIZE, "IPC handle too small");

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	struct ipc_wire w;
	struct region *r;

	ENTER("cuIpcGetMemHandle");
	CHECK_INIT();
	CHECK_CTX(NULL);
	if (!pHandle)
		return leave(CUDA_ERROR_INVALID_VALUE);
	r = region_at((uintptr_t)dptr);
	if (!r || r->kind != REGION_ALLOC)
		return leave(CUDA_ERROR_INVALID_VALUE);
	memset(&w, 0, sizeof(w));
	memcpy(w.magic, IPC_MAGIC, sizeof(w.magic));
	w.pid = (int32_t)getpid();
	w.fd = r->fd;
	w.serial = r->serial;
	w.size = r->size;
	w.offset = (uintptr_t)dptr - r->base;
	w.dev = r->dev;
	memset(pHandle, 0, sizeof(*pHandle));
	memcpy(pHandle->reserved, &w, sizeof(w));
	return leave(CUDA_SUCCESS);
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	char path[64], link[256], want[256];
	struct ipc_wire w;
	struct region *r;
	struct stat st;
	size_t len;
	CUcontext c;
	ssize_t n;
	void *p;
	int fd;

	ENTER("cuIpcOpenMemHandle");
	CHECK_INIT();
	CHECK_CTX(&c);
	memcpy(&w, handle.reserved, sizeof(w));
	if (!pdptr || (Flags & ~(unsigned int)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ||
	    memcmp(w.magic, IPC_MAGIC, sizeof(w.magic)) || w.pid <= 0 || w.fd < 0 || !w.size)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (w.pid == (int32_t)getpid())
		return leave(CUDA_ERROR_INVALID_CONTEXT);
	for (r = g.regions; r; r = r->next)
		if (r->kind == REGION_IPC && r->ctx == c && r->ipc_pid == w.pid && r->ipc_serial == w.serial) {
			r->ipc_refs++;
			*pdptr = (CUdeviceptr)r->base;
			return leave(CUDA_SUCCESS);
		}
	/* The exporter must still be alive and still hold that very allocation. */
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)w.pid, (int)w.fd);
	snprintf(want, sizeof(want), "/memfd:fakecuda-alloc-%llu (deleted)", (unsigned long long)w.serial);
	n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return leave(CUDA_ERROR_INVALID_HANDLE);
	link[n] = '\0';
	if (strcmp(link, want))
		return leave(CUDA_ERROR_INVALID_HANDLE);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return leave(CUDA_ERROR_INVALID_HANDLE);
	len = page_round(w.size);
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != len) {
		close(fd);
		return leave(CUDA_ERROR_INVALID_HANDLE);
	}
	r = calloc(1, sizeof(*r));
	p = r ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
	close(fd);
	if (p == MAP_FAILED) {
		free(r);
		return leave(CUDA_ERROR_MAP_FAILED);
	}
	r->kind = REGION_IPC;
	r->base = (uintptr_t)p;
	r->size = w.size;
	r->map_size = len;
	r->prot = PROT_READ | PROT_WRITE;
	r->dev = device_ok(w.dev) ? w.dev : c->dev;
	r->ctx = c;
	r->fd = -1;
	r->ipc_pid = w.pid;
	r->ipc_serial = w.serial;
	r->ipc_refs = 1;
	r->next = g.regions;
	g.regions = r;
	/* like libcuda: the base of the allocation, whatever pointer was exported */
	*pdptr = (CUdeviceptr)r->base;
	return leave(CUDA_SUCCESS);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	struct region *r;

	ENTER("cuIpcCloseMemHandle");
	CHECK_INIT();
	CHECK_CTX(NULL);
	r = region_base((uintptr_t)dptr, REGION_IPC);
	if (!r)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (--r->ipc_refs == 0)
		region_free(r);
	return leave(CUDA_SUCCESS);
}

/* --- virtual memory management ------------------------------------------- */

#define CHECK_VMM() do { if (!g.vmm) return leave(CUDA_ERROR_NOT_SUPPORTED); } while (0)

static CUresult check_prop(const CUmemAllocationProp *prop)
{
	if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	if (!device_ok(prop->location.id))
		return CUDA_ERROR_INVALID_DEVICE;
	return CUDA_SUCCESS;
}

static struct vmm_handle *find_handle(CUmemGenericAllocationHandle id)
{
	for (struct vmm_handle *h = g.handles; h; h = h->next)
		if (h->id == id && !h->released)
			return h;
	return NULL;
}

static void handle_put(struct vmm_handle *gone)
{
	if (!gone->released || gone->maps)
		return;
	for (struct vmm_handle **pp = &g.handles; *pp; pp = &(*pp)->next)
		if (*pp == gone) {
			*pp = gone->next;
			break;
		}
	if (!gone->imported)
		g.used[gone->dev] -= gone->size;
	close(gone->fd);
	free(gone);
}

static struct vmm_handle *handle_add(int fd, size_t size, CUdevice dev, bool posix_fd, bool imported)
{
	struct vmm_handle *h = calloc(1, sizeof(*h));

	if (!h)
		return NULL;
	h->id = ++g.serial;
	h->fd = fd;
	h->size = size;
	h->dev = dev;
	h->posix_fd = posix_fd;
	h->imported = imported;
	h->next = g.handles;
	g.handles = h;
	return h;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
	CUresult r;

	ENTER("cuMemGetAllocationGranularity");
	CHECK_INIT();
	CHECK_VMM();
	if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
	                     option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
		return leave(CUDA_ERROR_INVALID_VALUE);
	r = check_prop(prop);
	if (r != CUDA_SUCCESS)
		return leave(r);
	*granularity = FAKE_GRANULARITY;
	return leave(CUDA_SUCCESS);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
	struct vmm_handle *h;
	char name[64];
	CUresult r;
	int fd;

	ENTER("cuMemCreate");
	CHECK_INIT();
	CHECK_VMM();
	if (!handle || !size || size % FAKE_GRANULARITY || flags)
		return leave(CUDA_ERROR_INVALID_VALUE);
	r = check_prop(prop);
	if (r != CUDA_SUCCESS)
		return leave(r);
	if (prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return leave(CUDA_ERROR_NOT_SUPPORTED); /* Win32, fabric */
	if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) && !g.posix_fd)
		return leave(CUDA_ERROR_NOT_SUPPORTED);
	if (size > FAKE_TOTAL_MEM - g.used[prop->location.id])
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	snprintf(name, sizeof(name), "fakecuda-vmm-dev%d-%llu", prop->location.id,
	         (unsigned long long)(g.serial + 1));
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
		if (fd >= 0)
			close(fd);
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	}
	h = handle_add(fd, size, prop->location.id,
	               prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, false);
	if (!h) {
		close(fd);
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	}
	g.used[h->dev] += size;
	*handle = h->id;
	return leave(CUDA_SUCCESS);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	struct vmm_handle *h;

	ENTER("cuMemRelease");
	CHECK_INIT();
	CHECK_VMM();
	h = find_handle(handle);
	if (!h)
		return leave(CUDA_ERROR_INVALID_VALUE);
	h->released = true;
	handle_put(h); /* the memory stays while it is mapped */
	return leave(CUDA_SUCCESS);
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags)
{
	struct vmm_handle *h;
	int fd;

	ENTER("cuMemExportToShareableHandle");
	CHECK_INIT();
	CHECK_VMM();
	if (!shareableHandle || flags)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !g.posix_fd)
		return leave(CUDA_ERROR_NOT_SUPPORTED);
	h = find_handle(handle);
	if (!h || !h->posix_fd)
		return leave(CUDA_ERROR_INVALID_VALUE);
	fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	*(int *)shareableHandle = fd;
	return leave(CUDA_SUCCESS);
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType)
{
	int fd = (int)(intptr_t)osHandle, dev = 0;
	char path[64], link[256];
	struct vmm_handle *h;
	unsigned long long serial;
	struct stat st;
	ssize_t n;

	ENTER("cuMemImportFromShareableHandle");
	CHECK_INIT();
	CHECK_VMM();
	if (!handle)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !g.posix_fd)
		return leave(CUDA_ERROR_NOT_SUPPORTED);
	/* only an fd that cuMemExportToShareableHandle made (here or in another process) */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = fd >= 0 ? readlink(path, link, sizeof(link) - 1) : -1;
	if (n < 0)
		return leave(CUDA_ERROR_INVALID_VALUE);
	link[n] = '\0';
	if (sscanf(link, "/memfd:fakecuda-vmm-dev%d-%llu", &dev, &serial) != 2 || fstat(fd, &st) < 0 ||
	    !st.st_size || (uint64_t)st.st_size % FAKE_GRANULARITY)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (!device_ok(dev))
		dev = 0; /* exported by a process that saw more devices */
	fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	h = handle_add(fd, (size_t)st.st_size, dev, true, true);
	if (!h) {
		close(fd);
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	}
	*handle = h->id;
	return leave(CUDA_SUCCESS);
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
	struct reservation *res;
	uintptr_t base, aligned;
	size_t len;
	void *p;

	ENTER("cuMemAddressReserve");
	CHECK_INIT();
	CHECK_VMM();
	if (!alignment)
		alignment = FAKE_GRANULARITY;
	if (!ptr || !size || size % FAKE_GRANULARITY || flags || (alignment & (alignment - 1)) ||
	    alignment % FAKE_GRANULARITY)
		return leave(CUDA_ERROR_INVALID_VALUE);
	/* @addr is a hint; this emulation takes wherever the kernel puts it */
	len = size + alignment;
	if (len < size)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	base = (uintptr_t)p;
	aligned = (base + alignment - 1) & ~(uintptr_t)(alignment - 1);
	if (aligned > base)
		munmap(p, aligned - base);
	if (base + len > aligned + size)
		munmap((void *)(aligned + size), base + len - (aligned + size));
	res = calloc(1, sizeof(*res));
	if (!res) {
		munmap((void *)aligned, size);
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	}
	res->base = aligned;
	res->size = size;
	res->next = g.reservations;
	g.reservations = res;
	*ptr = (CUdeviceptr)aligned;
	return leave(CUDA_SUCCESS);
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	ENTER("cuMemAddressFree");
	CHECK_INIT();
	CHECK_VMM();
	for (struct reservation **pp = &g.reservations; *pp; pp = &(*pp)->next) {
		struct reservation *res = *pp;

		if (res->base != (uintptr_t)ptr || res->size != size)
			continue;
		for (struct region *r = g.regions; r; r = r->next)
			if (r->kind == REGION_MAP && r->base >= res->base && r->base < res->base + res->size)
				return leave(CUDA_ERROR_INVALID_VALUE); /* still mapped: cuMemUnmap first */
		munmap((void *)res->base, res->size);
		*pp = res->next;
		free(res);
		return leave(CUDA_SUCCESS);
	}
	return leave(CUDA_ERROR_INVALID_VALUE);
}

static struct reservation *reservation_of(uintptr_t p, size_t size)
{
	for (struct reservation *res = g.reservations; res; res = res->next)
		if (p >= res->base && p + size <= res->base + res->size)
			return res;
	return NULL;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
	uintptr_t p = (uintptr_t)ptr;
	struct vmm_handle *h;
	struct region *r;

	ENTER("cuMemMap");
	CHECK_INIT();
	CHECK_VMM();
	if (!size || flags || p % FAKE_GRANULARITY || size % FAKE_GRANULARITY || offset % FAKE_GRANULARITY ||
	    add_overflows(p, size))
		return leave(CUDA_ERROR_INVALID_VALUE);
	h = find_handle(handle);
	if (!h || offset > h->size || size > h->size - offset || !reservation_of(p, size))
		return leave(CUDA_ERROR_INVALID_VALUE);
	for (r = g.regions; r; r = r->next)
		if (r->kind == REGION_MAP && p < r->base + r->size && r->base < p + size)
			return leave(CUDA_ERROR_INVALID_VALUE); /* already mapped there */
	r = calloc(1, sizeof(*r));
	if (!r)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	if (mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)offset) == MAP_FAILED) {
		free(r);
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	}
	r->kind = REGION_MAP;
	r->base = p;
	r->size = size;
	r->map_size = size;
	r->prot = PROT_NONE;        /* until cuMemSetAccess */
	r->dev = h->dev;
	r->fd = -1;
	r->handle = h;
	r->next = g.regions;
	g.regions = r;
	h->maps++;
	return leave(CUDA_SUCCESS);
}

/* Every byte of [p, p+size) lies in a cuMemMap mapping; with @whole, each of
 * those mappings lies wholly inside it too. */
static bool maps_cover(uintptr_t p, size_t size, bool whole)
{
	uintptr_t end = p + size;

	while (p < end) {
		struct region *r = region_at(p);

		if (!r || r->kind != REGION_MAP)
			return false;
		if (whole && (r->base < (uintptr_t)(end - size) || r->base + r->size > end))
			return false;
		p = r->base + r->size;
	}
	return true;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	uintptr_t p = (uintptr_t)ptr, end;
	int prot = PROT_NONE;

	ENTER("cuMemSetAccess");
	CHECK_INIT();
	CHECK_VMM();
	if (!desc || !count || !size || add_overflows(p, size))
		return leave(CUDA_ERROR_INVALID_VALUE);
	for (size_t i = 0; i < count; i++) {
		if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
			return leave(CUDA_ERROR_INVALID_VALUE);
		if (!device_ok(desc[i].location.id))
			return leave(CUDA_ERROR_INVALID_DEVICE);
		switch (desc[i].flags) {
		case CU_MEM_ACCESS_FLAGS_PROT_NONE:
			break;
		case CU_MEM_ACCESS_FLAGS_PROT_READ:
			prot |= PROT_READ;
			break;
		case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
			prot |= PROT_READ | PROT_WRITE;
			break;
		default:
			return leave(CUDA_ERROR_INVALID_VALUE);
		}
	}
	if (!maps_cover(p, size, false))
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (mprotect((void *)p, size, prot) < 0)
		return leave(CUDA_ERROR_INVALID_VALUE);
	/* a mapping partly covered takes the new protection as a whole: good
	 * enough for the granule-sized ranges callers use */
	end = p + size;
	while (p < end) {
		struct region *r = region_at(p);

		r->prot = prot;
		p = r->base + r->size;
	}
	return leave(CUDA_SUCCESS);
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	uintptr_t p = (uintptr_t)ptr, end;

	ENTER("cuMemUnmap");
	CHECK_INIT();
	CHECK_VMM();
	if (!size || add_overflows(p, size) || !maps_cover(p, size, true))
		return leave(CUDA_ERROR_INVALID_VALUE);
	/* back to reserved address space */
	if (mmap((void *)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
	         -1, 0) == MAP_FAILED)
		return leave(CUDA_ERROR_INVALID_VALUE);
	end = p + size;
	while (p < end) {
		struct region *r = region_at(p);
		struct vmm_handle *h = r->handle;

		p = r->base + r->size;
		region_unlink(r);
		free(r);
		h->maps--;
		handle_put(h);
	}
	return leave(CUDA_SUCCESS);
}

/* --- cuGetProcAddress ---------------------------------------------------- */

#define FN(f) ((void *)(uintptr_t)&(f))

/* The plain names, each with the function a program built against
 * @since or later gets (what libcuda hands out for the _v2 generations). */
static const struct {
	const char *name;
	void *fn;
	int since;
} procs[] = {
	{ "cuInit", FN(cuInit), 2000 },
	{ "cuDriverGetVersion", FN(cuDriverGetVersion), 2020 },
	{ "cuGetProcAddress", FN(cuGetProcAddress_v2), 12000 },
	{ "cuGetProcAddress", FN(cuGetProcAddress), 11030 },
	{ "cuGetErrorName", FN(cuGetErrorName), 6000 },
	{ "cuGetErrorString", FN(cuGetErrorString), 6000 },
	{ "cuDeviceGetCount", FN(cuDeviceGetCount), 2000 },
	{ "cuDeviceGet", FN(cuDeviceGet), 2000 },
	{ "cuDeviceGetName", FN(cuDeviceGetName), 2000 },
	{ "cuDeviceTotalMem", FN(cuDeviceTotalMem_v2), 3020 },
	{ "cuDeviceGetAttribute", FN(cuDeviceGetAttribute), 2000 },
	{ "cuDevicePrimaryCtxRetain", FN(cuDevicePrimaryCtxRetain), 7000 },
	{ "cuDevicePrimaryCtxRelease", FN(cuDevicePrimaryCtxRelease_v2), 11000 },
	{ "cuCtxSetCurrent", FN(cuCtxSetCurrent), 4000 },
	{ "cuCtxGetCurrent", FN(cuCtxGetCurrent), 4000 },
	{ "cuCtxPushCurrent", FN(cuCtxPushCurrent_v2), 4000 },
	{ "cuCtxPopCurrent", FN(cuCtxPopCurrent_v2), 4000 },
	{ "cuCtxGetDevice", FN(cuCtxGetDevice), 2000 },
	{ "cuCtxSynchronize", FN(cuCtxSynchronize), 2000 },
	{ "cuStreamCreate", FN(cuStreamCreate), 2000 },
	{ "cuStreamDestroy", FN(cuStreamDestroy_v2), 4000 },
	{ "cuStreamSynchronize", FN(cuStreamSynchronize), 2000 },
	{ "cuStreamQuery", FN(cuStreamQuery), 2000 },
	{ "cuEventCreate", FN(cuEventCreate), 2000 },
	{ "cuEventRecord", FN(cuEventRecord), 2000 },
	{ "cuEventQuery", FN(cuEventQuery), 2000 },
	{ "cuEventSynchronize", FN(cuEventSynchronize), 2000 },
	{ "cuEventDestroy", FN(cuEventDestroy_v2), 4000 },
	{ "cuMemHostRegister", FN(cuMemHostRegister_v2), 6050 },
	{ "cuMemHostUnregister", FN(cuMemHostUnregister), 4000 },
	{ "cuMemAlloc", FN(cuMemAlloc_v2), 3020 },
	{ "cuMemFree", FN(cuMemFree_v2), 3020 },
	{ "cuMemGetAddressRange", FN(cuMemGetAddressRange_v2), 3020 },
	{ "cuMemGetInfo", FN(cuMemGetInfo_v2), 3020 },
	{ "cuPointerGetAttribute", FN(cuPointerGetAttribute), 4000 },
	{ "cuMemcpyHtoD", FN(cuMemcpyHtoD_v2), 3020 },
	{ "cuMemcpyHtoDAsync", FN(cuMemcpyHtoDAsync_v2), 3020 },
	{ "cuMemcpyDtoH", FN(cuMemcpyDtoH_v2), 3020 },
	{ "cuMemcpyDtoHAsync", FN(cuMemcpyDtoHAsync_v2), 3020 },
	{ "cuMemsetD8", FN(cuMemsetD8_v2), 3020 },
	{ "cuIpcGetMemHandle", FN(cuIpcGetMemHandle), 4010 },
	{ "cuIpcOpenMemHandle", FN(cuIpcOpenMemHandle_v2), 11000 },
	{ "cuIpcCloseMemHandle", FN(cuIpcCloseMemHandle), 4010 },
	{ "cuMemGetAllocationGranularity", FN(cuMemGetAllocationGranularity), 10020 },
	{ "cuMemCreate", FN(cuMemCreate), 10020 },
	{ "cuMemRelease", FN(cuMemRelease), 10020 },
	{ "cuMemExportToShareableHandle", FN(cuMemExportToShareableHandle), 10020 },
	{ "cuMemImportFromShareableHandle", FN(cuMemImportFromShareableHandle), 10020 },
	{ "cuMemAddressReserve", FN(cuMemAddressReserve), 10020 },
	{ "cuMemAddressFree", FN(cuMemAddressFree), 10020 },
	{ "cuMemMap", FN(cuMemMap), 10020 },
	{ "cuMemSetAccess", FN(cuMemSetAccess), 10020 },
	{ "cuMemUnmap", FN(cuMemUnmap), 10020 },
};

static CUresult lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
	const cuuint64_t known = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;

	if (!symbol || !pfn || (flags & ~known) || cudaVersion > FAKE_DRIVER_VERSION)
		return CUDA_ERROR_INVALID_VALUE;
	*pfn = NULL;
	/* the first entry of a name is its newest generation */
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]) && st != CU_GET_PROC_ADDRESS_SUCCESS; i++) {
		if (strcmp(procs[i].name, symbol))
			continue;
		if (cudaVersion >= procs[i].since) {
			*pfn = procs[i].fn;
			st = CU_GET_PROC_ADDRESS_SUCCESS;
		} else {
			st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
		}
	}
	if (status)
		*status = st;
	return st == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
	trace("cuGetProcAddress");
	return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	trace("cuGetProcAddress");
	return lookup(symbol, pfn, cudaVersion, flags, NULL);
}
