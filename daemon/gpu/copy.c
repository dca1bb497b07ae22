/* SPDX-License-Identifier: MIT */
/* copy - the copy engines: one thread per device, device slabs, host registration, copies
 *
 * The design is in cudadev.h. Every copy, host registration and slab free
 * runs on the device's engine thread, which owns the device's stream; the
 * slabs are allocated on the loop thread (the first attach of a pipeline on
 * a device). Completions go back to the loop thread through one uv_async,
 * and reach the engine's files only through the cuda_copy_done_fn they gave.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "cudadev.h"
#include "driver.h"
#include "loader/loader.h"
#include "base/log.h"

#define CUDA_MAX_SPANS 16

#ifdef HAVE_CUDA

enum cjob_kind { JOB_COPY, JOB_REGISTER, JOB_UNREGISTER, JOB_FREE };

struct cjob {
	struct cjob *next;
	enum cjob_kind kind;
	/* JOB_COPY */
	struct cuda_dslab *ds;
	uint32_t slot;
	const uint8_t *host;
	size_t nspans;
	struct cuda_span spans[CUDA_MAX_SPANS];
	cuda_copy_done_fn done;
	void *cookie;
	CUevent ev;
	uint64_t submitted_ns;     /* when its copies were queued on the stream */
	int err;
	char msg[256];
	/* JOB_REGISTER, JOB_UNREGISTER */
	void *base;
	size_t size;
	void (*then)(void *arg);
	void *arg;
};

struct cuda_engine {
	struct cuda_devices *d;
	int device;
	CUdevice dev;
	CUcontext ctx;
	CUstream stream;
	pthread_t thread;
	bool running;
	char name[128];
	struct cjob *head, *tail;  /* queue, under d->lock */
	uint32_t queued;
	uint64_t copies, bytes;    /* done, under d->lock */
	uint64_t busy_ns;          /* time the stream had copies in flight, under d->lock */
	uint64_t last_done_ns;     /* engine thread only */
	uint32_t registered;       /* host ranges pinned now */
	struct cuda_event_pool events; /* engine thread only */
};

struct cuda_devices {
	uv_loop_t *loop;
	uv_async_t *async;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct cuda_engine *eng[CUDA_MAX_DEVICES];
	struct cjob *done_head, *done_tail;
	bool stopping;
	bool stopped;
};

static void wake_loop(struct cuda_devices *d)
{
	uv_async_send(d->async);
}

static void dslab_release(struct cuda_dslab *s)
{
	if (s->kind == CUDA_MEM_VMM) {
		if (s->dptr) {
			g_drv->MemUnmap((CUdeviceptr)s->dptr, s->bytes);
			g_drv->MemAddressFree((CUdeviceptr)s->dptr, s->bytes);
		}
		if (s->vmm_handle)
			g_drv->MemRelease((CUmemGenericAllocationHandle)s->vmm_handle);
		if (s->fd >= 0)
			close(s->fd);
	} else if (s->kind == CUDA_MEM_IPC && s->dptr) {
		g_drv->MemFree((CUdeviceptr)s->dptr);
	}
	free(s);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void submit_copy(struct cuda_engine *e, struct cjob *j)
{
	CUdeviceptr base = (CUdeviceptr)(j->ds->dptr + (uint64_t)j->slot * j->ds->slot_stride);
	CUresult r;

	j->submitted_ns = now_ns();
	for (size_t i = 0; i < j->nspans && !j->err; i++) {
		if (!j->spans[i].bytes)
			continue;
		r = g_drv->MemcpyHtoDAsync(base + j->spans[i].offset, j->host + j->spans[i].offset,
		                           j->spans[i].bytes, e->stream);
		if (r != CUDA_SUCCESS)
			j->err = cuda_driver_error(g_drv, "cuMemcpyHtoDAsync", r, j->msg, sizeof(j->msg));
	}
	if (j->err)
		return;
	/* blocking-sync events: the engine thread sleeps in cuEventSynchronize
	 * instead of spinning a core that the decoding workers need (a wake-up
	 * costs tens of microseconds, which prefetch hides) */
	j->ev = cuda_event_get(g_drv, &e->events, &r);
	if (!j->ev) {
		j->err = cuda_driver_error(g_drv, "cuEventCreate", r, j->msg, sizeof(j->msg));
		return;
	}
	r = g_drv->EventRecord(j->ev, e->stream);
	if (r != CUDA_SUCCESS)
		j->err = cuda_driver_error(g_drv, "cuEventRecord", r, j->msg, sizeof(j->msg));
}

/* Wait for the copies in @list, oldest first, and hand each to the loop. */
static void finish_copies(struct cuda_engine *e, struct cjob *list)
{
	struct cuda_devices *d = e->d;

	while (list) {
		struct cjob *j = list;
		uint64_t bytes = 0, done, busy;
		CUresult r;

		list = j->next;
		j->next = NULL;
		if (!j->err && j->ev) {
			r = g_drv->EventSynchronize(j->ev);
			if (r != CUDA_SUCCESS)
				j->err = cuda_driver_error(g_drv, "cuEventSynchronize", r, j->msg, sizeof(j->msg));
		}
		/* the stream was busy from the later of its submission and the
		 * previous completion (copies queued together run back to back) */
		done = now_ns();
		busy = done - (j->submitted_ns > e->last_done_ns ? j->submitted_ns : e->last_done_ns);
		e->last_done_ns = done;
		cuda_event_put(g_drv, &e->events, j->ev);
		j->ev = NULL;
		for (size_t i = 0; i < j->nspans; i++)
			bytes += j->spans[i].bytes;
		pthread_mutex_lock(&d->lock);
		if (!j->err) {
			e->copies++;
			e->bytes += bytes;
			e->busy_ns += busy;
		}
		if (d->done_tail)
			d->done_tail->next = j;
		else
			d->done_head = j;
		d->done_tail = j;
		pthread_mutex_unlock(&d->lock);
		wake_loop(d);
	}
}

static void run_other(struct cuda_engine *e, struct cjob *j)
{
	CUresult r;
	char msg[256];

	switch (j->kind) {
	case JOB_REGISTER:
		r = g_drv->MemHostRegister(j->base, j->size, CU_MEMHOSTREGISTER_PORTABLE);
		if (r != CUDA_SUCCESS) {
			cuda_driver_error(g_drv, "cuMemHostRegister", r, msg, sizeof(msg));
			log_warn("cuda:%d: pinning %zu bytes of host slab failed, copies go from pageable memory: %s",
			         e->device, j->size, msg);
		} else {
			e->registered++;
			log_debug("cuda:%d: host slab of %zu bytes pinned", e->device, j->size);
		}
		break;
	case JOB_UNREGISTER:
		r = g_drv->MemHostUnregister(j->base);
		if (r == CUDA_SUCCESS && e->registered)
			e->registered--;
		if (j->then)
			j->then(j->arg);
		break;
	case JOB_FREE:
		dslab_release(j->ds);
		break;
	case JOB_COPY:
		break;
	}
	free(j);
}

/* Run the jobs of @list in order: copies are submitted together and waited
 * for only when a job that must follow them, or the end of the list, comes. */
static void run_jobs(struct cuda_engine *e, struct cjob *list)
{
	struct cjob *inflight = NULL, **tail = &inflight;

	while (list) {
		struct cjob *j = list;

		list = j->next;
		j->next = NULL;
		if (j->kind == JOB_COPY) {
			submit_copy(e, j);
			*tail = j;
			tail = &j->next;
			continue;
		}
		finish_copies(e, inflight);
		inflight = NULL;
		tail = &inflight;
		run_other(e, j);
	}
	finish_copies(e, inflight);
}

static void *engine_main(void *arg)
{
	struct cuda_engine *e = arg;
	struct cuda_devices *d = e->d;
	CUresult r;

	r = g_drv->CtxSetCurrent(e->ctx);
	if (r != CUDA_SUCCESS) {
		char msg[256];

		cuda_driver_error(g_drv, "cuCtxSetCurrent", r, msg, sizeof(msg));
		log_err("cuda:%d: copy engine cannot start: %s", e->device, msg);
	}
	pthread_mutex_lock(&d->lock);
	for (;;) {
		struct cjob *list;

		while (!e->head && !d->stopping)
			pthread_cond_wait(&d->cond, &d->lock);
		if (!e->head)
			break;
		list = e->head;
		e->head = e->tail = NULL;
		e->queued = 0;
		pthread_mutex_unlock(&d->lock);
		run_jobs(e, list);
		pthread_mutex_lock(&d->lock);
	}
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

static void enqueue(struct cuda_engine *e, struct cjob *j)
{
	struct cuda_devices *d = e->d;

	pthread_mutex_lock(&d->lock);
	if (e->tail)
		e->tail->next = j;
	else
		e->head = j;
	e->tail = j;
	e->queued++;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

static void on_done(uv_async_t *h)
{
	struct cuda_devices *d = h->data;
	struct cjob *list;

	pthread_mutex_lock(&d->lock);
	list = d->done_head;
	d->done_head = d->done_tail = NULL;
	pthread_mutex_unlock(&d->lock);
	while (list) {
		struct cjob *j = list;

		list = j->next;
		j->done(j->cookie, j->err, j->msg);
		free(j);
	}
}

static void on_async_closed(uv_handle_t *h)
{
	free(h);
}

int cuda_devices_new(struct cuda_devices **out, uv_loop_t *loop)
{
	struct cuda_devices *d = calloc(1, sizeof(*d));
	int r;

	if (!d)
		return -ENOMEM;
	d->async = calloc(1, sizeof(*d->async));
	if (!d->async) {
		free(d);
		return -ENOMEM;
	}
	r = uv_async_init(loop, d->async, on_done);
	if (r < 0) {
		free(d->async);
		free(d);
		return r;
	}
	d->async->data = d;
	d->loop = loop;
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cond, NULL);
	*out = d;
	return 0;
}

void cuda_devices_stop(struct cuda_devices *d)
{
	if (!d || d->stopped)
		return;
	pthread_mutex_lock(&d->lock);
	d->stopping = true;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
	for (int i = 0; i < CUDA_MAX_DEVICES; i++)
		if (d->eng[i] && d->eng[i]->running) {
			pthread_join(d->eng[i]->thread, NULL);
			d->eng[i]->running = false;
		}
	while (d->done_head) {
		struct cjob *j = d->done_head;

		d->done_head = j->next;
		free(j);
	}
	d->done_tail = NULL;
	d->stopped = true;
}

struct cuda_devices *cuda_devices_free(struct cuda_devices *d)
{
	if (!d)
		return NULL;
	cuda_devices_stop(d);
	for (int i = 0; i < CUDA_MAX_DEVICES; i++) {
		struct cuda_engine *e = d->eng[i];

		if (!e)
			continue;
		g_drv->CtxSetCurrent(e->ctx);
		cuda_event_pool_clear(g_drv, &e->events);
		g_drv->StreamDestroy(e->stream);
		g_drv->CtxSetCurrent(NULL);
		g_drv->DevicePrimaryCtxRelease(e->dev);
		free(e);
	}
	pthread_mutex_destroy(&d->lock);
	pthread_cond_destroy(&d->cond);
	uv_close((uv_handle_t *)d->async, on_async_closed);
	free(d);
	return NULL;
}

struct json_t *cuda_devices_json(const struct cuda_devices *d)
{
	json_t *o = json_object();

	if (!d)
		return o;
	pthread_mutex_lock((pthread_mutex_t *)&d->lock);
	for (int i = 0; i < CUDA_MAX_DEVICES; i++) {
		const struct cuda_engine *e = d->eng[i];
		char key[32];

		if (!e)
			continue;
		snprintf(key, sizeof(key), "cuda:%d", i);
		json_object_set_new(o, key, json_pack("{s:s, s:I, s:I, s:f, s:i, s:i}",
			"name", e->name,
			"copies", (json_int_t)e->copies,
			"bytes", (json_int_t)e->bytes,
			"busy_s", (double)e->busy_ns / 1e9,
			"queued", (int)e->queued,
			"host_registered", (int)e->registered));
	}
	pthread_mutex_unlock((pthread_mutex_t *)&d->lock);
	return o;
}

/* The engine of device @info->index, started on first use. */
static int engine_get(struct cuda_devices *d, const struct cuda_device_info *info, struct cuda_engine **out,
                      char *err, size_t errsize)
{
	struct cuda_engine *e;
	CUresult r;
	int ret;

	if (info->index < 0 || info->index >= CUDA_MAX_DEVICES)
		return errfmt(-ENXIO, err, errsize, "cuda:%d: this loaderd serves devices 0 to %d",
		              info->index, CUDA_MAX_DEVICES - 1);
	if (d->stopping)
		return errfmt(-ESHUTDOWN, err, errsize, "daemon is shutting down");
	if ((e = d->eng[info->index])) {
		*out = e;
		return 0;
	}
	e = calloc(1, sizeof(*e));
	if (!e)
		return errfmt(-ENOMEM, err, errsize, "cuda:%d: out of memory", info->index);
	e->d = d;
	e->device = info->index;
	snprintf(e->name, sizeof(e->name), "%s", info->name);
	r = g_drv->DeviceGet(&e->dev, info->index);
	if (r != CUDA_SUCCESS) {
		ret = cuda_driver_error(g_drv, "cuDeviceGet", r, err, errsize);
		free(e);
		return ret;
	}
	r = g_drv->DevicePrimaryCtxRetain(&e->ctx, e->dev);
	if (r != CUDA_SUCCESS) {
		ret = cuda_driver_error(g_drv, "cuDevicePrimaryCtxRetain", r, err, errsize);
		free(e);
		return ret;
	}
	r = g_drv->CtxSetCurrent(e->ctx);
	if (r == CUDA_SUCCESS)
		r = g_drv->StreamCreate(&e->stream, CU_STREAM_NON_BLOCKING);
	if (r != CUDA_SUCCESS) {
		ret = cuda_driver_error(g_drv, "cuStreamCreate", r, err, errsize);
		g_drv->DevicePrimaryCtxRelease(e->dev);
		free(e);
		return ret;
	}
	ret = -pthread_create(&e->thread, NULL, engine_main, e);
	if (ret < 0) {
		errfmt(ret, err, errsize, "cuda:%d: cannot start the copy engine: %s", info->index,
		       strerror(-ret));
		g_drv->StreamDestroy(e->stream);
		g_drv->DevicePrimaryCtxRelease(e->dev);
		free(e);
		return ret;
	}
	e->running = true;
	d->eng[info->index] = e;
	log_info("cuda:%d (%s): copy engine started", info->index, info->name);
	*out = e;
	return 0;
}

static int vmm_alloc(const struct cuda_device_info *info, struct cuda_dslab *s, char *err, size_t errsize)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc access;
	CUmemGenericAllocationHandle h = 0;
	CUdeviceptr ptr = 0;
	const char *what;
	CUresult r;
	int fd = -1;

	s->kind = CUDA_MEM_VMM; /* dslab_release() undoes what succeeded */
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = info->index;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	what = "cuMemCreate";
	r = g_drv->MemCreate(&h, s->bytes, &prop, 0);
	if (r != CUDA_SUCCESS)
		goto fail;
	s->vmm_handle = (uint64_t)h;
	what = "cuMemAddressReserve";
	r = g_drv->MemAddressReserve(&ptr, s->bytes, info->gran_min ? info->gran_min : 0, 0, 0);
	if (r != CUDA_SUCCESS)
		goto fail;
	what = "cuMemMap";
	r = g_drv->MemMap(ptr, s->bytes, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		g_drv->MemAddressFree(ptr, s->bytes);
		goto fail;
	}
	s->dptr = (uint64_t)ptr;
	memset(&access, 0, sizeof(access));
	access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	access.location.id = info->index;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	what = "cuMemSetAccess";
	r = g_drv->MemSetAccess(ptr, s->bytes, &access, 1);
	if (r != CUDA_SUCCESS)
		goto fail;
	what = "cuMemExportToShareableHandle";
	r = g_drv->MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS)
		goto fail;
	s->fd = fd;
	return 0;

fail:
	return cuda_driver_error(g_drv, what, r, err, errsize);
}

static int ipc_alloc(struct cuda_dslab *s, char *err, size_t errsize)
{
	CUipcMemHandle h;
	CUdeviceptr ptr = 0;
	CUresult r;

	r = g_drv->MemAlloc(&ptr, s->bytes);
	if (r != CUDA_SUCCESS)
		return cuda_driver_error(g_drv, "cuMemAlloc", r, err, errsize);
	s->dptr = (uint64_t)ptr;
	s->kind = CUDA_MEM_IPC;
	r = g_drv->IpcGetMemHandle(&h, ptr);
	if (r != CUDA_SUCCESS)
		return cuda_driver_error(g_drv, "cuIpcGetMemHandle", r, err, errsize);
	memcpy(s->ipc_handle, &h, sizeof(s->ipc_handle) < sizeof(h) ? sizeof(s->ipc_handle) : sizeof(h));
	return 0;
}

/* A device slab of @nslots slots of @slot_bytes on @info's device, sized for
 * the granularity @gmin/@grec, no memory yet. */
static int dslab_sized(const struct cuda_device_info *info, uint64_t slot_bytes, uint32_t nslots,
                       uint64_t gmin, uint64_t grec, struct cuda_dslab **out, char *err, size_t errsize)
{
	struct cuda_slab_layout l;
	struct cuda_dslab *s;
	int r = cuda_slab_layout(slot_bytes, nslots, gmin, grec, &l);

	if (r < 0)
		return errfmt(r, err, errsize,
		              "cuda:%d: cannot size a device slab of %u slots of %" PRIu64 " bytes",
		              info->index, nslots, slot_bytes);
	if (!(s = calloc(1, sizeof(*s))))
		return errfmt(-ENOMEM, err, errsize, "cuda:%d: out of memory", info->index);
	s->device = info->index;
	s->fd = -1;
	s->bytes = l.slab_bytes;
	s->slot_stride = l.slot_stride;
	s->nslots = nslots;
	snprintf(s->device_name, sizeof(s->device_name), "%s", info->name);
	*out = s;
	return 0;
}

int cuda_dslab_new(struct cuda_devices *d, const struct cuda_device_info *info, uint64_t slot_bytes,
                   uint32_t nslots, struct cuda_dslab **out, char *err, size_t errsize)
{
	const char *force_ipc = getenv("LOADERD_CUDA_IPC");
	struct cuda_engine *e = NULL;
	struct cuda_dslab *s;
	char why[256];
	CUresult r;
	int ret;

	ret = engine_get(d, info, &e, err, errsize);
	if (ret < 0)
		return ret;
	r = g_drv->CtxSetCurrent(e->ctx);
	if (r != CUDA_SUCCESS)
		return cuda_driver_error(g_drv, "cuCtxSetCurrent", r, err, errsize);
	if (info->vmm_posix_fd && !(force_ipc && !strcmp(force_ipc, "1")) &&
	    cuda_driver_require(g_drv, true, why, sizeof(why)) == 0) {
		uint64_t gmin = info->gran_min ? info->gran_min : CUDA_DEFAULT_GRANULARITY;

		s = NULL;
		ret = dslab_sized(info, slot_bytes, nslots, gmin, info->gran_rec ? info->gran_rec : gmin, &s,
		                  why, sizeof(why));
		if (ret == 0 && vmm_alloc(info, s, why, sizeof(why)) == 0)
			goto done;
		log_warn("cuda:%d: VMM device slab failed, using legacy IPC: %s", info->index, why);
		if (s)
			dslab_release(s);
	}
	/* legacy IPC sizes with the default granularity */
	ret = dslab_sized(info, slot_bytes, nslots, CUDA_DEFAULT_GRANULARITY, CUDA_DEFAULT_GRANULARITY, &s,
	                  err, errsize);
	if (ret < 0)
		return ret;
	ret = ipc_alloc(s, err, errsize);
	if (ret < 0) {
		dslab_release(s);
		return ret;
	}
done:
	log_info("cuda:%d: device slab of %u slots x %" PRIu64 " bytes (%.1f MiB, %s)", info->index, nslots,
	         s->slot_stride, (double)s->bytes / (1024.0 * 1024.0), s->kind == CUDA_MEM_VMM ? "vmm" : "ipc");
	*out = s;
	return 0;
}

void cuda_dslab_free(struct cuda_devices *d, struct cuda_dslab *s)
{
	struct cuda_engine *e;
	struct cjob *j;

	if (!s)
		return;
	e = d->eng[s->device];
	if (!d->stopping && (j = calloc(1, sizeof(*j)))) {
		j->kind = JOB_FREE;
		j->ds = s;
		enqueue(e, j);
		return;
	}
	/* engines stopped (or no memory for a job): nothing of ours runs on the device */
	g_drv->CtxSetCurrent(e->ctx);
	dslab_release(s);
}

void cuda_host_register(struct cuda_devices *d, int device, void *base, size_t size)
{
	struct cuda_engine *e = device >= 0 && device < CUDA_MAX_DEVICES ? d->eng[device] : NULL;
	struct cjob *j;

	if (!e || d->stopping || !(j = calloc(1, sizeof(*j))))
		return;
	j->kind = JOB_REGISTER;
	j->base = base;
	j->size = size;
	enqueue(e, j);
}

void cuda_host_unregister(struct cuda_devices *d, int device, void *base, void (*then)(void *arg), void *arg)
{
	struct cuda_engine *e = device >= 0 && device < CUDA_MAX_DEVICES ? d->eng[device] : NULL;
	struct cjob *j;

	if (e && !d->stopping && (j = calloc(1, sizeof(*j)))) {
		j->kind = JOB_UNREGISTER;
		j->base = base;
		j->then = then;
		j->arg = arg;
		enqueue(e, j);
		return;
	}
	if (e) {
		g_drv->CtxSetCurrent(e->ctx);
		if (g_drv->MemHostUnregister(base) == CUDA_SUCCESS && e->registered)
			e->registered--;
	}
	if (then)
		then(arg);
}

int cuda_copy(struct cuda_devices *d, struct cuda_dslab *s, uint32_t slot, const void *host,
              const struct cuda_span *spans, size_t nspans, cuda_copy_done_fn done, void *cookie)
{
	struct cuda_engine *e = d->eng[s->device];
	struct cjob *j;

	if (!e || d->stopping)
		return -ESHUTDOWN;
	if (slot >= s->nslots || nspans > CUDA_MAX_SPANS)
		return -EINVAL;
	for (size_t i = 0; i < nspans; i++)
		if (spans[i].offset > s->slot_stride || spans[i].bytes > s->slot_stride - spans[i].offset)
			return -EINVAL;
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->kind = JOB_COPY;
	j->ds = s;
	j->slot = slot;
	j->host = host;
	j->nspans = nspans;
	memcpy(j->spans, spans, nspans * sizeof(*spans));
	j->done = done;
	j->cookie = cookie;
	enqueue(e, j);
	return 0;
}

#else /* !HAVE_CUDA */

int cuda_devices_new(struct cuda_devices **out, uv_loop_t *loop)
{
	*out = NULL;
	return -ENOTSUP;
}

void cuda_devices_stop(struct cuda_devices *d)
{
}

struct cuda_devices *cuda_devices_free(struct cuda_devices *d)
{
	return NULL;
}

struct json_t *cuda_devices_json(const struct cuda_devices *d)
{
	return json_object();
}

int cuda_dslab_new(struct cuda_devices *d, const struct cuda_device_info *info, uint64_t slot_bytes,
                   uint32_t nslots, struct cuda_dslab **out, char *err, size_t errsize)
{
	return errfmt(-ENOTSUP, err, errsize,
	              "this loaderd was built without CUDA support: host delivery only");
}

void cuda_dslab_free(struct cuda_devices *d, struct cuda_dslab *s)
{
}

void cuda_host_register(struct cuda_devices *d, int device, void *base, size_t size)
{
}

void cuda_host_unregister(struct cuda_devices *d, int device, void *base, void (*then)(void *arg), void *arg)
{
	if (then)
		then(arg);
}

int cuda_copy(struct cuda_devices *d, struct cuda_dslab *s, uint32_t slot, const void *host,
              const struct cuda_span *spans, size_t nspans, cuda_copy_done_fn done, void *cookie)
{
	return -ENOTSUP;
}

#endif /* HAVE_CUDA */
