/* SPDX-License-Identifier: MIT */
/* cudadrv - the CUDA driver, loaded at run time, for the daemon and libloader */
#pragma once

/*
 * One binary runs with or without a GPU (docs/gpu.md): libcuda is
 * never linked. cuda_driver_open() dlopens it, resolves every entry point
 * through cuGetProcAddress (the version of each function that CUDA 12.0
 * programs called, whatever `#define cuFoo cuFoo_v2` the header says; dlsym
 * of the exported name as the fallback) and calls cuInit(0). Every failure
 * becomes an errno and one sentence naming the cause.
 *
 * The function table is public only where the toolkit's cuda.h was found
 * (HAVE_CUDA); callers include "cudadrv.h" after "config.h".
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Default driver library; $LOADERD_CUDA_LIBRARY overrides it (tests, odd installs). */
#define CUDA_DRIVER_LIBRARY "libcuda.so.1"
#define CUDA_ENV_LIBRARY "LOADERD_CUDA_LIBRARY"

struct cuda_driver;

/** What the driver reports about one device (cuda_driver_device()). */
struct cuda_device_info {
	int index;
	int count;                 /* devices present */
	int driver_version;        /* e.g. 12040 for 12.4 */
	char name[128];
	uint64_t total_mem;
	int cc_major, cc_minor;
	bool vmm;                  /* CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
	bool vmm_posix_fd;         /* ... and POSIX file-descriptor handles */
	uint64_t gran_min;         /* cuMemGetAllocationGranularity, 0 when unknown */
	uint64_t gran_rec;
};

/**
 * cuda_driver_open() - dlopen a CUDA driver and cuInit(0) it.
 * @out: receives the driver; on failure *out stays NULL
 * @path: library to open, NULL for CUDA_DRIVER_LIBRARY
 * @err: receives a sentence naming the cause on failure
 *
 * Return: 0; -ENOTSUP built without CUDA; -ENODEV no library, the toolkit's
 * stub, CUDA_ERROR_NO_DEVICE or a driver too old for this build; -EIO any
 * other CUresult (named in @err); -ENOMEM.
 */
int cuda_driver_open(struct cuda_driver **out, const char *path, char *err, size_t errsize);
/** Close a driver that failed or is no longer needed (NULL is fine). */
struct cuda_driver *cuda_driver_free(struct cuda_driver *drv);
/** Path the driver was opened from. */
const char *cuda_driver_path(const struct cuda_driver *drv);

/**
 * cuda_driver_device() - check that device @index exists and describe it.
 * Return: 0; -EINVAL negative index; -ENXIO index out of range
 * ("cuda:3 requested, 1 device present"); -ENODEV no device; -EIO other.
 */
int cuda_driver_device(struct cuda_driver *drv, int index, struct cuda_device_info *info,
                       char *err, size_t errsize);

/**
 * cuda_driver_process() - the process's driver, opened on the first call.
 * @opened: if not NULL, set to true for the one call that opened it (to log once)
 *
 * From $LOADERD_CUDA_LIBRARY, else libcuda.so.1; the outcome (the driver, or
 * the error and its sentence) is remembered for the life of the process, so
 * cuInit runs once. Thread-safe: only calls made while it opens wait.
 * Return: as cuda_driver_open(), with @err set on failure.
 */
int cuda_driver_process(struct cuda_driver **out, char *err, size_t errsize, bool *opened);
/**
 * cuda_driver_process_peek() - what cuda_driver_process() found, without
 * opening or waiting: -EAGAIN not asked yet (or opening now); 0 with *@out;
 * the error with *@why its sentence.
 */
int cuda_driver_process_peek(struct cuda_driver **out, const char **why);

/** Name of a CUresult without asking the driver ("CUDA_ERROR_STUB_LIBRARY"), or NULL. */
const char *cuda_result_name(int result);

/**
 * cuda_driver_error() - put "@what: NAME (description)" for CUresult @result in @err.
 * Return: the errno that fits (-ENODEV no usable GPU, -ENXIO bad ordinal,
 * -ENOMEM out of memory, -EIO anything else).
 */
int cuda_driver_error(struct cuda_driver *drv, const char *what, int result, char *err, size_t errsize);

#ifdef HAVE_CUDA
#include <cuda.h>

/* The entry points loaderd uses, at their CUDA 12.0 ABI (the _v2 versions). */
struct cuda_driver {
	void *lib;
	char path[512];
	bool initialised;        /* cuInit(0) succeeded */
	int driver_version;
	CUresult (*GetProcAddress_v2)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
	CUresult (*GetProcAddress_v1)(const char *, void **, int, cuuint64_t);

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
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*DevicePrimaryCtxRelease)(CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*CtxGetCurrent)(CUcontext *);
	CUresult (*StreamCreate)(CUstream *, unsigned int);
	CUresult (*StreamDestroy)(CUstream);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*EventCreate)(CUevent *, unsigned int);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventQuery)(CUevent);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*EventDestroy)(CUevent);
	CUresult (*MemHostRegister)(void *, size_t, unsigned int);
	CUresult (*MemHostUnregister)(void *);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
	CUresult (*IpcCloseMemHandle)(CUdeviceptr);
	CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
	                      unsigned long long);
	CUresult (*MemRelease)(CUmemGenericAllocationHandle);
	CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
	                                       unsigned long long);
	CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *,
	                                         CUmemAllocationHandleType);
	CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*MemAddressFree)(CUdeviceptr, size_t);
	CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*MemUnmap)(CUdeviceptr, size_t);
	CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
};

/**
 * cuda_driver_require() - check that the entry points device delivery needs exist.
 * @vmm: also the VMM ones (cuMemCreate ... cuMemSetAccess)
 * Return: 0, or -ENOTSUP with @err naming the first one missing.
 */
int cuda_driver_require(struct cuda_driver *drv, bool vmm, char *err, size_t errsize);

/*
 * Recycled events (blocking-sync, no timing): the daemon's copy engines and
 * libloader's waiters record one per batch and reuse it once waited for.
 * Not locked: each pool has one owner or its owner's lock.
 */
struct cuda_event_pool {
	CUevent *ev;
	size_t n, cap;
};

/** A free event, or a new one (the calling thread's current context); NULL with *@r set. */
CUevent cuda_event_get(struct cuda_driver *drv, struct cuda_event_pool *p, CUresult *r);
/** Give @ev back (NULL is fine); destroyed when the pool cannot grow. */
void cuda_event_put(struct cuda_driver *drv, struct cuda_event_pool *p, CUevent ev);
/** Destroy the pool's events (in their context) and its array. */
void cuda_event_pool_clear(struct cuda_driver *drv, struct cuda_event_pool *p);
#endif
