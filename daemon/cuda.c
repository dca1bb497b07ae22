/* SPDX-License-Identifier: MIT */
/* cuda - the CUDA driver loaded at run time, device slab sizing, device slot bookkeeping
 *
 * One loaderd binary runs on a machine with no GPU and on one with GPUs
 * (DESIGN.md, principle 6): the driver is never linked. libcuda.so.1 is opened
 * with dlopen on the first attach that asks for a CUDA device, never at daemon
 * start, so that a daemon that only ever serves host memory never touches the
 * driver (cuInit alone costs a CUDA context's worth of host memory and, on a
 * GPU without persistence mode, seconds). Every entry point but
 * cuGetProcAddress itself is resolved through cuGetProcAddress, which hands
 * out the version of a function that matches the ABI we were written against
 * (CUDA_ABI_VERSION), whatever `#define cuFoo cuFoo_v2` the header we were
 * built with says; dlsym of the exported name is the fallback (the toolkit's
 * stub library answers cuGetProcAddress with CUDA_ERROR_STUB_LIBRARY).
 *
 * The slab sizing and the slot bookkeeping below make no driver call: they are
 * plain arithmetic and a plain data structure, tested without a GPU, for the
 * copy engine to use (see cuda.h for its design).
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cuda.h"
#include "loader/loader.h"
#include "log.h"

#ifdef HAVE_CUDA
#include <cuda.h>
#endif

/* --- CUresult names, for drivers (the stub) that do not name them ------ */

static const struct {
	int code;
	const char *name;
	const char *text;
} cu_results[] = {
	{ 0, "CUDA_SUCCESS", "no error" },
	{ 1, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ 3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ 4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
	{ 34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library" },
	{ 35, "CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA driver version is insufficient for CUDA runtime version" },
	{ 36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", "API call requires a newer CUDA driver" },
	{ 46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable" },
	{ 100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ 304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS" },
	{ 500, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ 800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted" },
	{ 801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ 802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized" },
	{ 803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination" },
	{ 804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility was attempted on non supported HW" },
	{ 999, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

const char *cuda_result_name(int result)
{
	for (size_t i = 0; i < sizeof(cu_results) / sizeof(cu_results[0]); i++)
		if (cu_results[i].code == result)
			return cu_results[i].name;
	return NULL;
}

__attribute__((unused)) static const char *cuda_result_text(int result)
{
	for (size_t i = 0; i < sizeof(cu_results) / sizeof(cu_results[0]); i++)
		if (cu_results[i].code == result)
			return cu_results[i].text;
	return NULL;
}

/* --- the driver ---------------------------------------------------------- */

#ifdef HAVE_CUDA

/* The ABI the function types below are written against: cuGetProcAddress
 * returns, for each name, the version that CUDA 12.0 programs called. */
#define CUDA_ABI_VERSION 12000
/* cuGetProcAddress appeared in 11.3; older drivers get dlsym only. */
#define CUDA_GPA_MIN_DRIVER 11030

typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);

struct cuda_driver {
	void *lib;
	char path[512];
	bool initialised;        /* cuInit(0) succeeded */
	int driver_version;
	gpa_v2_fn gpa_v2;
	gpa_v1_fn gpa_v1;
	CUresult (*Init)(unsigned int);
	CUresult (*DriverGetVersion)(int *);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DeviceGetName)(char *, int, CUdevice);
	CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
	CUresult (*DeviceTotalMem)(size_t *, CUdevice);
	CUresult (*GetErrorName)(CUresult, const char **);
	CUresult (*GetErrorString)(CUresult, const char **);
	CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
	                                        CUmemAllocationGranularity_flags);
};

/* Name of @r, from the driver when it knows, else from our table. */
static void describe_result(struct cuda_driver *drv, CUresult r, char *buf, size_t size)
{
	const char *name = NULL, *text = NULL;

	if (drv && drv->GetErrorName && drv->GetErrorName(r, &name) != CUDA_SUCCESS)
		name = NULL;
	if (drv && drv->GetErrorString && drv->GetErrorString(r, &text) != CUDA_SUCCESS)
		text = NULL;
	if (!name)
		name = cuda_result_name((int)r);
	if (!text)
		text = cuda_result_text((int)r);
	if (name && text)
		snprintf(buf, size, "%s (%s)", name, text);
	else if (name)
		snprintf(buf, size, "%s", name);
	else
		snprintf(buf, size, "CUresult %d", (int)r);
}

/* errno for a failed driver call: "no usable GPU here" causes are ENODEV. */
static int result_errno(CUresult r)
{
	switch ((int)r) {
	case 34:  /* STUB_LIBRARY */
	case 35:  /* INSUFFICIENT_DRIVER */
	case 100: /* NO_DEVICE */
	case 803: /* SYSTEM_DRIVER_MISMATCH */
	case 804: /* COMPAT_NOT_SUPPORTED_ON_DEVICE */
		return -ENODEV;
	case 101: /* INVALID_DEVICE */
		return -ENXIO;
	case 2:   /* OUT_OF_MEMORY */
		return -ENOMEM;
	default:
		return -EIO;
	}
}

/* Fail @what with @r: the stub and "no device" get sentences of their own. */
static int driver_fail(struct cuda_driver *drv, const char *what, CUresult r, char *err, size_t errsize)
{
	char desc[256];

	if ((int)r == 34) {
		snprintf(err, errsize, "the CUDA driver at %s is the toolkit's stub library, not a real driver "
		         "(CUDA_ERROR_STUB_LIBRARY from %s)", drv->path, what);
		return -ENODEV;
	}
	describe_result(drv, r, desc, sizeof(desc));
	if ((int)r == 100)
		snprintf(err, errsize, "no CUDA device: %s: %s", what, desc);
	else
		snprintf(err, errsize, "CUDA driver %s: %s: %s", drv->path, what, desc);
	return result_errno(r);
}

/* Resolve @name through cuGetProcAddress, else dlsym(@dlname). */
static void *resolve(struct cuda_driver *drv, const char *name, const char *dlname)
{
	void *fn = NULL;

	if (drv->gpa_v2) {
		CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;

		if (drv->gpa_v2(name, &fn, CUDA_ABI_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS ||
		    st != CU_GET_PROC_ADDRESS_SUCCESS)
			fn = NULL;
	} else if (drv->gpa_v1) {
		if (drv->gpa_v1(name, &fn, CUDA_ABI_VERSION, CU_GET_PROC_ADDRESS_DEFAULT) != CUDA_SUCCESS)
			fn = NULL;
	}
	if (!fn)
		fn = dlsym(drv->lib, dlname ? dlname : name);
	return fn;
}

struct cuda_driver *cuda_driver_free(struct cuda_driver *drv)
{
	if (!drv)
		return NULL;
	/* A driver that initialised stays loaded: libcuda does not unload cleanly. */
	if (drv->lib && !drv->initialised)
		dlclose(drv->lib);
	free(drv);
	return NULL;
}

const char *cuda_driver_path(const struct cuda_driver *drv)
{
	return drv ? drv->path : "";
}

/* Store the object pointer @p (from dlsym) into function pointer @field. */
static void set_fn(void *field, void *p)
{
	memcpy(field, &p, sizeof(p));
}

#define RESOLVE(drv, field, name, dlname) set_fn(&(drv)->field, resolve((drv), (name), (dlname)))

int cuda_driver_open(struct cuda_driver **out, const char *path, char *err, size_t errsize)
{
	struct cuda_driver *drv;
	Dl_info dli;
	CUresult r;
	void *sym;

	*out = NULL;
	if (!path || !*path)
		path = CUDA_DRIVER_LIBRARY;
	drv = calloc(1, sizeof(*drv));
	if (!drv) {
		snprintf(err, errsize, "out of memory");
		return -ENOMEM;
	}
	snprintf(drv->path, sizeof(drv->path), "%s", path);
	dlerror();
	drv->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!drv->lib) {
		const char *e = dlerror();

		if (!e)
			e = "dlopen failed";
		/* glibc's message starts with the path; say it once either way */
		if (!strncmp(e, path, strlen(path)))
			snprintf(err, errsize, "CUDA driver not found: %s", e);
		else
			snprintf(err, errsize, "CUDA driver not found: %s: %s", path, e);
		cuda_driver_free(drv);
		return -ENODEV;
	}

	/* Name the file we really got (a soname resolves to a full path). */
	sym = dlsym(drv->lib, "cuInit");
	if (sym && dladdr(sym, &dli) && dli.dli_fname && *dli.dli_fname)
		snprintf(drv->path, sizeof(drv->path), "%s", dli.dli_fname);

	set_fn(&drv->gpa_v2, dlsym(drv->lib, "cuGetProcAddress_v2"));
	if (!drv->gpa_v2)
		set_fn(&drv->gpa_v1, dlsym(drv->lib, "cuGetProcAddress"));
	/* cuDriverGetVersion works before cuInit; a driver older than
	 * cuGetProcAddress gets dlsym for everything. */
	set_fn(&drv->DriverGetVersion, dlsym(drv->lib, "cuDriverGetVersion"));
	if (drv->DriverGetVersion && drv->DriverGetVersion(&drv->driver_version) != CUDA_SUCCESS)
		drv->driver_version = 0;
	if (drv->driver_version && drv->driver_version < CUDA_GPA_MIN_DRIVER)
		drv->gpa_v2 = NULL, drv->gpa_v1 = NULL;

	RESOLVE(drv, Init, "cuInit", NULL);
	RESOLVE(drv, DeviceGetCount, "cuDeviceGetCount", NULL);
	RESOLVE(drv, DeviceGet, "cuDeviceGet", NULL);
	RESOLVE(drv, DeviceGetName, "cuDeviceGetName", NULL);
	RESOLVE(drv, DeviceGetAttribute, "cuDeviceGetAttribute", NULL);
	RESOLVE(drv, DeviceTotalMem, "cuDeviceTotalMem", "cuDeviceTotalMem_v2");
	RESOLVE(drv, GetErrorName, "cuGetErrorName", NULL);
	RESOLVE(drv, GetErrorString, "cuGetErrorString", NULL);
	RESOLVE(drv, MemGetAllocationGranularity, "cuMemGetAllocationGranularity", NULL);
	if (!drv->Init || !drv->DeviceGetCount || !drv->DeviceGet) {
		snprintf(err, errsize, "%s is not a CUDA driver: it lacks %s", drv->path,
		         !drv->Init ? "cuInit" : !drv->DeviceGetCount ? "cuDeviceGetCount" : "cuDeviceGet");
		cuda_driver_free(drv);
		return -ENODEV;
	}

	r = drv->Init(0);
	if (r != CUDA_SUCCESS) {
		int ret = driver_fail(drv, "cuInit", r, err, errsize);

		cuda_driver_free(drv);
		return ret;
	}
	drv->initialised = true;
	*out = drv;
	return 0;
}

int cuda_driver_device(struct cuda_driver *drv, int index, struct cuda_device_info *info,
                       char *err, size_t errsize)
{
	CUdevice dev;
	CUresult r;
	int count = 0, v;

	memset(info, 0, sizeof(*info));
	info->index = index;
	info->driver_version = drv->driver_version;
	if (index < 0) {
		snprintf(err, errsize, "cuda:%d: a device index is not negative", index);
		return -EINVAL;
	}
	r = drv->DeviceGetCount(&count);
	if (r != CUDA_SUCCESS)
		return driver_fail(drv, "cuDeviceGetCount", r, err, errsize);
	info->count = count;
	if (count == 0) {
		snprintf(err, errsize, "no CUDA device: the driver at %s reports 0 devices", drv->path);
		return -ENODEV;
	}
	if (index >= count) {
		snprintf(err, errsize, "cuda:%d requested, %d device%s present", index, count,
		         count == 1 ? "" : "s");
		return -ENXIO;
	}
	r = drv->DeviceGet(&dev, index);
	if (r != CUDA_SUCCESS)
		return driver_fail(drv, "cuDeviceGet", r, err, errsize);
	if (!drv->DeviceGetName || drv->DeviceGetName(info->name, (int)sizeof(info->name), dev) != CUDA_SUCCESS)
		snprintf(info->name, sizeof(info->name), "?");
	if (drv->DeviceTotalMem) {
		size_t bytes = 0;

		if (drv->DeviceTotalMem(&bytes, dev) == CUDA_SUCCESS)
			info->total_mem = bytes;
	}
	if (drv->DeviceGetAttribute) {
		if (drv->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) == CUDA_SUCCESS)
			info->cc_major = v;
		if (drv->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) == CUDA_SUCCESS)
			info->cc_minor = v;
		if (drv->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) == CUDA_SUCCESS)
			info->vmm = v != 0;
		if (drv->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
		                            dev) == CUDA_SUCCESS)
			info->vmm_posix_fd = info->vmm && v != 0;
	}
	if (info->vmm && drv->MemGetAllocationGranularity) {
		CUmemAllocationProp prop;
		size_t g = 0;

		memset(&prop, 0, sizeof(prop));
		prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop.location.id = index;
		if (info->vmm_posix_fd)
			prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
		if (drv->MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS)
			info->gran_min = g;
		if (drv->MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS)
			info->gran_rec = g;
	}
	return 0;
}

#else /* !HAVE_CUDA */

struct cuda_driver {
	int unused;
};

int cuda_driver_open(struct cuda_driver **out, const char *path, char *err, size_t errsize)
{
	*out = NULL;
	snprintf(err, errsize, "this loaderd was built without CUDA support (-Dcuda=disabled or no cuda.h): "
	         "host delivery only");
	return -ENOTSUP;
}

struct cuda_driver *cuda_driver_free(struct cuda_driver *drv)
{
	free(drv);
	return NULL;
}

const char *cuda_driver_path(const struct cuda_driver *drv)
{
	return "";
}

int cuda_driver_device(struct cuda_driver *drv, int index, struct cuda_device_info *info,
                       char *err, size_t errsize)
{
	memset(info, 0, sizeof(*info));
	snprintf(err, errsize, "this loaderd was built without CUDA support: host delivery only");
	return -ENOTSUP;
}

#endif /* HAVE_CUDA */

/* The process-wide driver: opened once, on the first CUDA attach. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static bool g_tried;
static int g_ret;
static char g_err[512];
static struct cuda_driver *g_drv;

int cuda_attach_check(int index, struct cuda_device_info *info, char *err, size_t errsize)
{
	int r;

	pthread_mutex_lock(&g_lock);
	if (!g_tried) {
		const char *path = getenv(CUDA_ENV_LIBRARY);

		g_tried = true;
		g_ret = cuda_driver_open(&g_drv, path && *path ? path : NULL, g_err, sizeof(g_err));
		if (g_ret < 0)
			log_notice("CUDA unavailable, host delivery only: %s", g_err);
		else
			log_info("CUDA driver loaded from %s", cuda_driver_path(g_drv));
	}
	if (g_ret < 0) {
		memset(info, 0, sizeof(*info));
		snprintf(err, errsize, "%s", g_err);
		r = g_ret;
	} else {
		r = cuda_driver_device(g_drv, index, info, err, errsize);
	}
	pthread_mutex_unlock(&g_lock);
	return r;
}

int cuda_attach_device(uint32_t kind, int32_t index, char *err, size_t errsize)
{
	struct cuda_device_info info;
	int r;

	if (kind == LDR_DEVICE_HOST)
		return 0;
	if (kind != LDR_DEVICE_CUDA) {
		snprintf(err, errsize, "unknown device kind %u (0 host, 1 cuda)", kind);
		return -EINVAL;
	}
	r = cuda_attach_check(index, &info, err, errsize);
	if (r < 0)
		return r;
	snprintf(err, errsize,
	         "device delivery is not implemented yet on this build: host delivery only "
	         "(found cuda:%d of %d: %s, compute capability %d.%d, %.1f GiB, driver %d.%d, %s)",
	         index, info.count, info.name, info.cc_major, info.cc_minor,
	         (double)info.total_mem / (1024.0 * 1024.0 * 1024.0),
	         info.driver_version / 1000, info.driver_version % 1000 / 10,
	         info.vmm_posix_fd ? "VMM with POSIX fd handles" :
	         info.vmm ? "VMM without POSIX fd handles: legacy IPC" : "no VMM: legacy IPC");
	return -ENOTSUP;
}

/* --- device slab sizing -------------------------------------------------- */

static bool pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

int cuda_round_up(uint64_t x, uint64_t align, uint64_t *out)
{
	uint64_t r;

	if (!align)
		return -EINVAL;
	r = x % align;
	if (!r) {
		*out = x;
		return 0;
	}
	if (x > UINT64_MAX - (align - r))
		return -EOVERFLOW;
	*out = x + (align - r);
	return 0;
}

int cuda_slab_layout(uint64_t slot_bytes, uint32_t nslots, uint64_t gran_min, uint64_t gran_rec,
                     struct cuda_slab_layout *out)
{
	uint64_t stride, total;

	if (!slot_bytes || !nslots || !pow2(gran_min))
		return -EINVAL;
	if (!gran_rec)
		gran_rec = gran_min;
	if (gran_rec % gran_min)
		return -EINVAL;
	if (cuda_round_up(slot_bytes, slot_bytes >= gran_min ? gran_min : CUDA_SLOT_ALIGN, &stride) < 0)
		return -EOVERFLOW;
	if (stride > UINT64_MAX / nslots)
		return -EOVERFLOW;
	if (cuda_round_up(stride * nslots, gran_rec, &total) < 0)
		return -EOVERFLOW;
	out->slot_stride = stride;
	out->slab_bytes = total;
	out->waste_bytes = total - slot_bytes * nslots;
	return 0;
}

/* --- device slot bookkeeping --------------------------------------------- */

enum hold_state { HOLD_UNUSED = 0, HOLD_HELD, HOLD_WAIT };

struct hold {
	uint64_t client;
	uint64_t lease;
	uint64_t event;
	uint32_t slot;
	uint8_t state;
};

struct slot {
	enum cuda_slot_state state;
	uint64_t key;
	uint32_t pins, holds, waits;
	uint64_t idle_since;       /* tick at which it last became idle */
};

struct cuda_slots {
	uint32_t nslots;
	uint32_t max_holds;
	uint64_t tick;
	struct slot *slots;
	struct hold *h;            /* linear scans: a few hundred records at most */
};

int cuda_slots_new(struct cuda_slots **out, uint32_t nslots, uint32_t max_holds)
{
	struct cuda_slots *s;

	if (!nslots || !max_holds)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->slots = calloc(nslots, sizeof(*s->slots));
	s->h = calloc(max_holds, sizeof(*s->h));
	if (!s->slots || !s->h) {
		cuda_slots_free(s);
		return -ENOMEM;
	}
	s->nslots = nslots;
	s->max_holds = max_holds;
	*out = s;
	return 0;
}

struct cuda_slots *cuda_slots_free(struct cuda_slots *s)
{
	if (!s)
		return NULL;
	free(s->slots);
	free(s->h);
	free(s);
	return NULL;
}

static bool slot_idle(const struct slot *sl)
{
	return sl->state == CUDA_SLOT_READY && !sl->pins && !sl->holds && !sl->waits;
}

/* Call after any count of @sl went down: 1 when it just became idle. */
static int settle(struct cuda_slots *s, struct slot *sl)
{
	if (!slot_idle(sl))
		return 0;
	sl->idle_since = ++s->tick;
	return 1;
}

int cuda_slots_find(const struct cuda_slots *s, uint64_t key)
{
	for (uint32_t i = 0; i < s->nslots; i++)
		if (s->slots[i].state != CUDA_SLOT_FREE && s->slots[i].key == key)
			return (int)i;
	return -ENOENT;
}

int cuda_slots_acquire(struct cuda_slots *s, uint64_t key)
{
	int best = -1;

	if (cuda_slots_find(s, key) >= 0)
		return -EEXIST;
	for (uint32_t i = 0; i < s->nslots; i++) {
		const struct slot *sl = &s->slots[i];

		if (sl->state == CUDA_SLOT_FREE) {
			best = (int)i;
			break;
		}
		if (slot_idle(sl) && (best < 0 || sl->idle_since < s->slots[best].idle_since))
			best = (int)i;
	}
	if (best < 0)
		return -EBUSY;
	s->slots[best] = (struct slot){ .state = CUDA_SLOT_FILLING, .key = key, .pins = 1 };
	return best;
}

int cuda_slots_publish(struct cuda_slots *s, uint32_t slot)
{
	if (slot >= s->nslots || s->slots[slot].state != CUDA_SLOT_FILLING)
		return -EINVAL;
	s->slots[slot].state = CUDA_SLOT_READY;
	return 0;
}

int cuda_slots_abort(struct cuda_slots *s, uint32_t slot)
{
	if (slot >= s->nslots || s->slots[slot].state != CUDA_SLOT_FILLING)
		return -EINVAL;
	/* nobody can hold a slot that was never published */
	s->slots[slot] = (struct slot){ .state = CUDA_SLOT_FREE };
	return 0;
}

int cuda_slots_pin(struct cuda_slots *s, uint32_t slot)
{
	if (slot >= s->nslots || s->slots[slot].state == CUDA_SLOT_FREE)
		return -EINVAL;
	s->slots[slot].pins++;
	return 0;
}

int cuda_slots_unpin(struct cuda_slots *s, uint32_t slot)
{
	if (slot >= s->nslots || !s->slots[slot].pins)
		return -EINVAL;
	s->slots[slot].pins--;
	return settle(s, &s->slots[slot]);
}

static struct hold *hold_find(const struct cuda_slots *s, uint64_t client, uint64_t lease)
{
	for (uint32_t i = 0; i < s->max_holds; i++)
		if (s->h[i].state != HOLD_UNUSED && s->h[i].client == client && s->h[i].lease == lease)
			return &s->h[i];
	return NULL;
}

int cuda_slots_hold(struct cuda_slots *s, uint32_t slot, uint64_t client, uint64_t lease)
{
	struct hold *h = NULL;

	if (slot >= s->nslots || s->slots[slot].state != CUDA_SLOT_READY)
		return -EINVAL;
	if (hold_find(s, client, lease))
		return -EEXIST;
	for (uint32_t i = 0; i < s->max_holds && !h; i++)
		if (s->h[i].state == HOLD_UNUSED)
			h = &s->h[i];
	if (!h)
		return -ENOSPC;
	*h = (struct hold){ .client = client, .lease = lease, .slot = slot, .state = HOLD_HELD };
	s->slots[slot].holds++;
	return 0;
}

int cuda_slots_release(struct cuda_slots *s, uint64_t client, uint64_t lease, uint64_t event)
{
	struct hold *h = hold_find(s, client, lease);
	struct slot *sl;

	if (!h || h->state != HOLD_HELD)
		return -ENOENT;
	sl = &s->slots[h->slot];
	sl->holds--;
	if (event) {
		h->state = HOLD_WAIT;
		h->event = event;
		sl->waits++;
		return 0;
	}
	h->state = HOLD_UNUSED;
	return settle(s, sl);
}

int cuda_slots_event_done(struct cuda_slots *s, uint64_t client, uint64_t lease)
{
	struct hold *h = hold_find(s, client, lease);
	struct slot *sl;

	if (!h || h->state != HOLD_WAIT)
		return -ENOENT;
	sl = &s->slots[h->slot];
	sl->waits--;
	h->state = HOLD_UNUSED;
	return settle(s, sl);
}

int cuda_slots_drop_client(struct cuda_slots *s, uint64_t client)
{
	int n = 0;

	for (uint32_t i = 0; i < s->max_holds; i++) {
		struct hold *h = &s->h[i];
		struct slot *sl;

		if (h->state == HOLD_UNUSED || h->client != client)
			continue;
		sl = &s->slots[h->slot];
		if (h->state == HOLD_HELD)
			sl->holds--;
		else
			sl->waits--;
		h->state = HOLD_UNUSED;
		settle(s, sl);
		n++;
	}
	return n;
}

int cuda_slots_next_wait(const struct cuda_slots *s, uint32_t *cursor, struct cuda_slot_wait *out)
{
	for (uint32_t i = *cursor; i < s->max_holds; i++) {
		const struct hold *h = &s->h[i];

		if (h->state != HOLD_WAIT)
			continue;
		*out = (struct cuda_slot_wait){ .slot = h->slot, .client = h->client, .lease = h->lease,
		                                .event = h->event };
		*cursor = i + 1;
		return 1;
	}
	*cursor = s->max_holds;
	return 0;
}

int cuda_slots_get(const struct cuda_slots *s, uint32_t slot, struct cuda_slot_info *out)
{
	const struct slot *sl;

	if (slot >= s->nslots)
		return -EINVAL;
	sl = &s->slots[slot];
	*out = (struct cuda_slot_info){ .state = sl->state, .key = sl->key, .pins = sl->pins,
	                                .holds = sl->holds, .waits = sl->waits };
	return 0;
}

uint32_t cuda_slots_available(const struct cuda_slots *s)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->nslots; i++)
		n += s->slots[i].state == CUDA_SLOT_FREE || slot_idle(&s->slots[i]);
	return n;
}
