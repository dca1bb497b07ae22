/* SPDX-License-Identifier: MIT */
/* devmap - a daemon's device slab mapped into a client (libloader's CUDA side)
 *
 * The daemon allocates one device slab per (pipeline, device) and hands it to
 * each CUDA attachment once (cudadev.h): a POSIX fd of a VMM allocation over
 * the fd channel, or a legacy IPC handle in the attach reply. Here it is
 * imported and mapped into the device's primary context, the context torch
 * and every runtime-API program use, so the pointers are valid in the
 * trainer's own kernels. Batches are then plain offsets into the mapping.
 *
 * Events: a trainer that used a batch on its own stream releases it through
 * ldr_release_after(); devmap_record() puts an event on that stream and
 * libloader's waiter thread returns the lease only once devmap_wait() saw it
 * complete, so the daemon never refills a slot that queued kernels still read.
 * The events are blocking-sync: the waiter sleeps rather than spinning a core
 * of the trainer's.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "cudadrv.h"
#include "devmap.h"

#ifdef HAVE_CUDA

struct devmap {
	struct cuda_driver *drv;
	int device;
	CUdevice dev;
	CUcontext ctx;
	uint32_t kind;
	CUdeviceptr base;
	uint64_t size;
	pthread_mutex_t lock;     /* the event pool: recorded by trainers, recycled by the waiter */
	struct cuda_event_pool events;
};

static int driver(struct cuda_driver **out, char *err, size_t errsize)
{
	int r = cuda_driver_process(out, err, errsize, NULL);

	return r < 0 ? r : cuda_driver_require(*out, false, err, errsize);
}

/* Make @m's context current on this thread; *@saved gets the previous one. */
static CUresult ctx_enter(struct devmap *m, CUcontext *saved)
{
	*saved = NULL;
	if (m->drv->CtxGetCurrent && m->drv->CtxGetCurrent(saved) != CUDA_SUCCESS)
		*saved = NULL;
	if (*saved == m->ctx)
		return CUDA_SUCCESS;
	return m->drv->CtxSetCurrent(m->ctx);
}

static void ctx_leave(struct devmap *m, CUcontext saved)
{
	if (saved != m->ctx)
		m->drv->CtxSetCurrent(saved);
}

static int fail(struct devmap *m, const char *what, CUresult r, char *err, size_t errsize)
{
	char msg[384];
	int ret = cuda_driver_error(m->drv, what, r, msg, sizeof(msg));

	return errfmt(ret, err, errsize, "cuda:%d: cannot map the device slab: %s", m->device, msg);
}

int devmap_open(struct devmap **out, int device, uint32_t kind, int fd, uint64_t size,
                const uint8_t *ipc, size_t ipclen, char *err, size_t errsize)
{
	struct cuda_driver *drv;
	struct devmap *m;
	CUcontext saved;
	CUresult r;
	int ret;

	*out = NULL;
	ret = driver(&drv, err, errsize);
	if (ret < 0) {
		if (fd >= 0)
			close(fd);
		return ret;
	}
	if ((kind == DEVMAP_VMM && fd < 0) || (kind == DEVMAP_IPC && ipclen != sizeof(CUipcMemHandle)) ||
	    (kind != DEVMAP_VMM && kind != DEVMAP_IPC) || !size) {
		if (fd >= 0)
			close(fd);
		return errfmt(-EPROTO, err, errsize,
		              "attach reply: malformed device slab (memory kind %u, %zu handle bytes)",
		              kind, ipclen);
	}
	if (kind == DEVMAP_VMM && (ret = cuda_driver_require(drv, true, err, errsize)) < 0) {
		close(fd);
		return ret;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		if (fd >= 0)
			close(fd);
		return errfmt(-ENOMEM, err, errsize, "cuda:%d: out of memory", device);
	}
	m->drv = drv;
	m->device = device;
	m->kind = kind;
	m->size = size;
	pthread_mutex_init(&m->lock, NULL);
	r = drv->DeviceGet(&m->dev, device);
	if (r != CUDA_SUCCESS) {
		ret = fail(m, "cuDeviceGet", r, err, errsize);
		goto out_free;
	}
	r = drv->DevicePrimaryCtxRetain(&m->ctx, m->dev);
	if (r != CUDA_SUCCESS) {
		ret = fail(m, "cuDevicePrimaryCtxRetain", r, err, errsize);
		goto out_free;
	}
	r = ctx_enter(m, &saved);
	if (r != CUDA_SUCCESS) {
		ret = fail(m, "cuCtxSetCurrent", r, err, errsize);
		goto out_ctx;
	}
	if (kind == DEVMAP_VMM) {
		CUmemGenericAllocationHandle h;
		CUmemAccessDesc access;

		r = drv->MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
		                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		close(fd);
		fd = -1;
		if (r != CUDA_SUCCESS) {
			ret = fail(m, "cuMemImportFromShareableHandle", r, err, errsize);
			goto out_leave;
		}
		r = drv->MemAddressReserve(&m->base, size, 0, 0, 0);
		if (r != CUDA_SUCCESS) {
			drv->MemRelease(h);
			ret = fail(m, "cuMemAddressReserve", r, err, errsize);
			goto out_leave;
		}
		r = drv->MemMap(m->base, size, 0, h, 0);
		/* the mapping holds the memory from here on */
		drv->MemRelease(h);
		if (r != CUDA_SUCCESS) {
			drv->MemAddressFree(m->base, size);
			ret = fail(m, "cuMemMap", r, err, errsize);
			goto out_leave;
		}
		memset(&access, 0, sizeof(access));
		access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		access.location.id = device;
		access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		r = drv->MemSetAccess(m->base, size, &access, 1);
		if (r != CUDA_SUCCESS) {
			drv->MemUnmap(m->base, size);
			drv->MemAddressFree(m->base, size);
			ret = fail(m, "cuMemSetAccess", r, err, errsize);
			goto out_leave;
		}
	} else {
		CUipcMemHandle h;

		memcpy(&h, ipc, sizeof(h));
		r = drv->IpcOpenMemHandle(&m->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
		if (r != CUDA_SUCCESS) {
			ret = fail(m, "cuIpcOpenMemHandle", r, err, errsize);
			goto out_leave;
		}
	}
	ctx_leave(m, saved);
	*out = m;
	return 0;

out_leave:
	ctx_leave(m, saved);
out_ctx:
	drv->DevicePrimaryCtxRelease(m->dev);
out_free:
	if (fd >= 0)
		close(fd);
	pthread_mutex_destroy(&m->lock);
	free(m);
	return ret;
}

void devmap_close(struct devmap *m)
{
	CUcontext saved;

	if (!m)
		return;
	if (ctx_enter(m, &saved) == CUDA_SUCCESS) {
		cuda_event_pool_clear(m->drv, &m->events);
		if (m->kind == DEVMAP_VMM) {
			m->drv->MemUnmap(m->base, m->size);
			m->drv->MemAddressFree(m->base, m->size);
		} else {
			m->drv->IpcCloseMemHandle(m->base);
		}
		ctx_leave(m, saved);
	}
	m->drv->DevicePrimaryCtxRelease(m->dev);
	free(m->events.ev);
	pthread_mutex_destroy(&m->lock);
	free(m);
}

uint64_t devmap_base(const struct devmap *m)
{
	return (uint64_t)m->base;
}

void *devmap_record(struct devmap *m, void *stream, char *err, size_t errsize)
{
	CUevent ev = NULL;
	CUcontext saved;
	CUresult r;

	r = ctx_enter(m, &saved);
	if (r != CUDA_SUCCESS) {
		cuda_driver_error(m->drv, "cuCtxSetCurrent", r, err, errsize);
		return NULL;
	}
	pthread_mutex_lock(&m->lock);
	ev = cuda_event_get(m->drv, &m->events, &r);
	pthread_mutex_unlock(&m->lock);
	if (!ev) {
		cuda_driver_error(m->drv, "cuEventCreate", r, err, errsize);
		ctx_leave(m, saved);
		return NULL;
	}
	r = m->drv->EventRecord(ev, (CUstream)stream);
	ctx_leave(m, saved);
	if (r != CUDA_SUCCESS) {
		cuda_driver_error(m->drv, "cuEventRecord", r, err, errsize);
		m->drv->EventDestroy(ev);
		return NULL;
	}
	return ev;
}

int devmap_wait(struct devmap *m, void *event)
{
	CUevent ev = event;
	CUcontext saved;
	CUresult r;

	if (ctx_enter(m, &saved) != CUDA_SUCCESS)
		return -EIO;
	r = m->drv->EventSynchronize(ev);
	ctx_leave(m, saved);
	pthread_mutex_lock(&m->lock);
	cuda_event_put(m->drv, &m->events, ev);
	pthread_mutex_unlock(&m->lock);
	return r == CUDA_SUCCESS ? 0 : -EIO;
}

#else /* !HAVE_CUDA */

int devmap_open(struct devmap **out, int device, uint32_t kind, int fd, uint64_t size,
                const uint8_t *ipc, size_t ipclen, char *err, size_t errsize)
{
	*out = NULL;
	if (fd >= 0)
		close(fd);
	return errfmt(-ENOTSUP, err, errsize,
	              "this libloader was built without CUDA support: host delivery only");
}

void devmap_close(struct devmap *m)
{
}

uint64_t devmap_base(const struct devmap *m)
{
	return 0;
}

void *devmap_record(struct devmap *m, void *stream, char *err, size_t errsize)
{
	errfmt(-ENOTSUP, err, errsize, "built without CUDA support");
	return NULL;
}

int devmap_wait(struct devmap *m, void *event)
{
	return -ENOTSUP;
}

#endif
