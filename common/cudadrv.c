/* SPDX-License-Identifier: MIT */
/* cudadrv - the CUDA driver, loaded at run time, for the daemon and libloader
 *
 * The driver is never linked (see cudadrv.h). It is opened only when a CUDA
 * device is asked for: cuInit alone costs a CUDA context's worth of host
 * memory and, on a GPU without persistence mode, seconds. Every entry point
 * but cuGetProcAddress itself is resolved through cuGetProcAddress, which
 * hands out the version of a function that matches the ABI we were written
 * against (CUDA_ABI_VERSION); dlsym of the exported name is the fallback (the
 * toolkit's stub library answers cuGetProcAddress with CUDA_ERROR_STUB_LIBRARY).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "config.h"
#include "cudadrv.h"

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

	if ((int)r == 34)
		return errfmt(-ENODEV, err, errsize,
		              "the CUDA driver at %s is the toolkit's stub library, not a real driver "
		              "(CUDA_ERROR_STUB_LIBRARY from %s)", drv->path, what);
	describe_result(drv, r, desc, sizeof(desc));
	if ((int)r == 100)
		return errfmt(result_errno(r), err, errsize, "no CUDA device: %s: %s", what, desc);
	return errfmt(result_errno(r), err, errsize, "CUDA driver %s: %s: %s", drv->path, what, desc);
}

/* Resolve @name through cuGetProcAddress, else dlsym(@dlname). */
static void *resolve(struct cuda_driver *drv, const char *name, const char *dlname)
{
	void *fn = NULL;

	if (drv->GetProcAddress_v2) {
		CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;

		if (drv->GetProcAddress_v2(name, &fn, CUDA_ABI_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS ||
		    st != CU_GET_PROC_ADDRESS_SUCCESS)
			fn = NULL;
	} else if (drv->GetProcAddress_v1) {
		if (drv->GetProcAddress_v1(name, &fn, CUDA_ABI_VERSION, CU_GET_PROC_ADDRESS_DEFAULT) != CUDA_SUCCESS)
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
	if (!drv)
		return errfmt(-ENOMEM, err, errsize, "out of memory");
	snprintf(drv->path, sizeof(drv->path), "%s", path);
	dlerror();
	drv->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!drv->lib) {
		const char *e = dlerror();

		if (!e)
			e = "dlopen failed";
		/* glibc's message starts with the path; say it once either way */
		if (!strncmp(e, path, strlen(path)))
			errfmt(-ENODEV, err, errsize, "CUDA driver not found: %s", e);
		else
			errfmt(-ENODEV, err, errsize, "CUDA driver not found: %s: %s", path, e);
		cuda_driver_free(drv);
		return -ENODEV;
	}

	/* Name the file we really got (a soname resolves to a full path). */
	sym = dlsym(drv->lib, "cuInit");
	if (sym && dladdr(sym, &dli) && dli.dli_fname && *dli.dli_fname)
		snprintf(drv->path, sizeof(drv->path), "%s", dli.dli_fname);

	set_fn(&drv->GetProcAddress_v2, dlsym(drv->lib, "cuGetProcAddress_v2"));
	if (!drv->GetProcAddress_v2)
		set_fn(&drv->GetProcAddress_v1, dlsym(drv->lib, "cuGetProcAddress"));
	/* cuDriverGetVersion works before cuInit; a driver older than
	 * cuGetProcAddress gets dlsym for everything. */
	set_fn(&drv->DriverGetVersion, dlsym(drv->lib, "cuDriverGetVersion"));
	if (drv->DriverGetVersion && drv->DriverGetVersion(&drv->driver_version) != CUDA_SUCCESS)
		drv->driver_version = 0;
	if (drv->driver_version && drv->driver_version < CUDA_GPA_MIN_DRIVER)
		drv->GetProcAddress_v2 = NULL, drv->GetProcAddress_v1 = NULL;

	RESOLVE(drv, Init, "cuInit", NULL);
	RESOLVE(drv, DeviceGetCount, "cuDeviceGetCount", NULL);
	RESOLVE(drv, DeviceGet, "cuDeviceGet", NULL);
	RESOLVE(drv, DeviceGetName, "cuDeviceGetName", NULL);
	RESOLVE(drv, DeviceGetAttribute, "cuDeviceGetAttribute", NULL);
	RESOLVE(drv, DeviceTotalMem, "cuDeviceTotalMem", "cuDeviceTotalMem_v2");
	RESOLVE(drv, GetErrorName, "cuGetErrorName", NULL);
	RESOLVE(drv, GetErrorString, "cuGetErrorString", NULL);
	RESOLVE(drv, MemGetAllocationGranularity, "cuMemGetAllocationGranularity", NULL);
	RESOLVE(drv, DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL);
	RESOLVE(drv, DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2");
	RESOLVE(drv, CtxSetCurrent, "cuCtxSetCurrent", NULL);
	RESOLVE(drv, CtxGetCurrent, "cuCtxGetCurrent", NULL);
	RESOLVE(drv, StreamCreate, "cuStreamCreate", NULL);
	RESOLVE(drv, StreamDestroy, "cuStreamDestroy", "cuStreamDestroy_v2");
	RESOLVE(drv, StreamSynchronize, "cuStreamSynchronize", NULL);
	RESOLVE(drv, EventCreate, "cuEventCreate", NULL);
	RESOLVE(drv, EventRecord, "cuEventRecord", NULL);
	RESOLVE(drv, EventQuery, "cuEventQuery", NULL);
	RESOLVE(drv, EventSynchronize, "cuEventSynchronize", NULL);
	RESOLVE(drv, EventDestroy, "cuEventDestroy", "cuEventDestroy_v2");
	RESOLVE(drv, MemHostRegister, "cuMemHostRegister", "cuMemHostRegister_v2");
	RESOLVE(drv, MemHostUnregister, "cuMemHostUnregister", NULL);
	RESOLVE(drv, MemAlloc, "cuMemAlloc", "cuMemAlloc_v2");
	RESOLVE(drv, MemFree, "cuMemFree", "cuMemFree_v2");
	RESOLVE(drv, MemcpyHtoDAsync, "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2");
	RESOLVE(drv, MemcpyDtoH, "cuMemcpyDtoH", "cuMemcpyDtoH_v2");
	RESOLVE(drv, IpcGetMemHandle, "cuIpcGetMemHandle", NULL);
	RESOLVE(drv, IpcOpenMemHandle, "cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2");
	RESOLVE(drv, IpcCloseMemHandle, "cuIpcCloseMemHandle", NULL);
	RESOLVE(drv, MemCreate, "cuMemCreate", NULL);
	RESOLVE(drv, MemRelease, "cuMemRelease", NULL);
	RESOLVE(drv, MemExportToShareableHandle, "cuMemExportToShareableHandle", NULL);
	RESOLVE(drv, MemImportFromShareableHandle, "cuMemImportFromShareableHandle", NULL);
	RESOLVE(drv, MemAddressReserve, "cuMemAddressReserve", NULL);
	RESOLVE(drv, MemAddressFree, "cuMemAddressFree", NULL);
	RESOLVE(drv, MemMap, "cuMemMap", NULL);
	RESOLVE(drv, MemUnmap, "cuMemUnmap", NULL);
	RESOLVE(drv, MemSetAccess, "cuMemSetAccess", NULL);
	if (!drv->Init || !drv->DeviceGetCount || !drv->DeviceGet) {
		errfmt(-ENODEV, err, errsize, "%s is not a CUDA driver: it lacks %s", drv->path,
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
	if (index < 0)
		return errfmt(-EINVAL, err, errsize, "cuda:%d: a device index is not negative", index);
	r = drv->DeviceGetCount(&count);
	if (r != CUDA_SUCCESS)
		return driver_fail(drv, "cuDeviceGetCount", r, err, errsize);
	info->count = count;
	if (count == 0)
		return errfmt(-ENODEV, err, errsize,
		              "no CUDA device: the driver at %s reports 0 devices", drv->path);
	if (index >= count)
		return errfmt(-ENXIO, err, errsize,
		              "cuda:%d requested, %d device%s present", index, count,
		              count == 1 ? "" : "s");
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

int cuda_driver_error(struct cuda_driver *drv, const char *what, int result, char *err, size_t errsize)
{
	char desc[256];

	describe_result(drv, (CUresult)result, desc, sizeof(desc));
	return errfmt(result_errno((CUresult)result), err, errsize, "%s: %s", what, desc);
}

int cuda_driver_require(struct cuda_driver *drv, bool vmm, char *err, size_t errsize)
{
	static const struct {
		size_t off;
		const char *name;
		bool vmm;
	} need[] = {
#define NEED(f, v) { offsetof(struct cuda_driver, f), "cu" #f, v }
		NEED(DevicePrimaryCtxRetain, false), NEED(DevicePrimaryCtxRelease, false),
		NEED(CtxSetCurrent, false), NEED(StreamCreate, false), NEED(StreamDestroy, false),
		NEED(StreamSynchronize, false), NEED(EventCreate, false), NEED(EventRecord, false),
		NEED(EventQuery, false), NEED(EventSynchronize, false), NEED(EventDestroy, false),
		NEED(MemHostRegister, false), NEED(MemHostUnregister, false), NEED(MemAlloc, false),
		NEED(MemFree, false), NEED(MemcpyHtoDAsync, false), NEED(IpcGetMemHandle, false),
		NEED(IpcOpenMemHandle, false), NEED(IpcCloseMemHandle, false),
		NEED(MemCreate, true), NEED(MemRelease, true), NEED(MemExportToShareableHandle, true),
		NEED(MemImportFromShareableHandle, true), NEED(MemAddressReserve, true),
		NEED(MemAddressFree, true), NEED(MemMap, true), NEED(MemUnmap, true), NEED(MemSetAccess, true),
#undef NEED
	};

	for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
		void *fn;

		if (need[i].vmm && !vmm)
			continue;
		memcpy(&fn, (const char *)drv + need[i].off, sizeof(fn));
		if (!fn)
			return errfmt(-ENOTSUP, err, errsize,
			              "the CUDA driver at %s lacks %s", drv->path, need[i].name);
	}
	return 0;
}

CUevent cuda_event_get(struct cuda_driver *drv, struct cuda_event_pool *p, CUresult *r)
{
	CUevent ev = NULL;

	if (p->n)
		return p->ev[--p->n];
	*r = drv->EventCreate(&ev, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC);
	return *r == CUDA_SUCCESS ? ev : NULL;
}

void cuda_event_put(struct cuda_driver *drv, struct cuda_event_pool *p, CUevent ev)
{
	if (!ev)
		return;
	if (p->n == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 16;
		CUevent *n = realloc(p->ev, cap * sizeof(*n));

		if (!n) {
			drv->EventDestroy(ev);
			return;
		}
		p->ev = n;
		p->cap = cap;
	}
	p->ev[p->n++] = ev;
}

void cuda_event_pool_clear(struct cuda_driver *drv, struct cuda_event_pool *p)
{
	for (size_t i = 0; i < p->n; i++)
		drv->EventDestroy(p->ev[i]);
	free(p->ev);
	*p = (struct cuda_event_pool){ 0 };
}

#else /* !HAVE_CUDA */

int cuda_driver_error(struct cuda_driver *drv, const char *what, int result, char *err, size_t errsize)
{
	return errfmt(-EIO, err, errsize, "%s: CUresult %d", what, result);
}

struct cuda_driver {
	int unused;
};

int cuda_driver_open(struct cuda_driver **out, const char *path, char *err, size_t errsize)
{
	*out = NULL;
	return errfmt(-ENOTSUP, err, errsize,
	              "this loaderd was built without CUDA support (-Dcuda=disabled or no cuda.h): "
	              "host delivery only");
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
	return errfmt(-ENOTSUP, err, errsize,
	              "this loaderd was built without CUDA support: host delivery only");
}

#endif /* HAVE_CUDA */


/* The process's driver. g_lock is held only while it opens (cuInit can take
 * seconds); g_tried, then g_ret, g_err and g_drv, are published once and
 * read without the lock after that. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool g_tried;
static int g_ret;
static char g_err[512];
static struct cuda_driver *g_drv;

int cuda_driver_process(struct cuda_driver **out, char *err, size_t errsize, bool *opened)
{
	if (opened)
		*opened = false;
	if (!atomic_load(&g_tried)) {
		pthread_mutex_lock(&g_lock);
		if (!atomic_load(&g_tried)) {
			const char *path = getenv(CUDA_ENV_LIBRARY);

			g_ret = cuda_driver_open(&g_drv, path && *path ? path : NULL, g_err, sizeof(g_err));
			atomic_store(&g_tried, true);
			if (opened)
				*opened = true;
		}
		pthread_mutex_unlock(&g_lock);
	}
	*out = g_drv;
	if (g_ret < 0)
		return errfmt(g_ret, err, errsize, "%s", g_err);
	return g_ret;
}

int cuda_driver_process_peek(struct cuda_driver **out, const char **why)
{
	if (!atomic_load(&g_tried))
		return -EAGAIN;
	*out = g_drv;
	*why = g_err;
	return g_ret;
}
