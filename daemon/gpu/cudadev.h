/* SPDX-License-Identifier: MIT */
/* cudadev - device delivery: the attach check, device slabs, one copy engine per device
 *
 * The gpu layer: the CUDA driver (loaded at run time), device slabs and one
 * copy engine per device. It knows nothing of pipelines: the engine
 * (engine/devcopy.c) asks it for device slabs and copies, and hears a copy's
 * end through the cuda_copy_done_fn it passed; the server asks it whether a
 * client's device can be served. It includes only base/ besides common/.
 *
 * layer: daemon/gpu -> daemon/base common include
 */
#ifndef LOADERD_CUDADEV_H
#define LOADERD_CUDADEV_H

/*
 * How a batch reaches a GPU
 * -------------------------
 * - The driver (common/cudadrv.c) is opened on the first attach that asks for
 *   a CUDA device, never at daemon start; cuInit runs once per process.
 * - A pipeline that has clients on device N gets one device slab on N that
 *   mirrors its host slab: device slot i holds the batch of host slot i, at
 *   the same field offsets. A device slot is therefore reused exactly when the
 *   host slot is: after every holder released it (a client that dies loses its
 *   leases at once, as on the host path). Clients on the same device share the
 *   slab; clients on other devices have slabs of their own, filled from the
 *   same pinned host slot.
 * - Device memory: VMM when the device supports POSIX file-descriptor handles
 *   (cuMemCreate + cuMemAddressReserve/Map/SetAccess; one fd exported with
 *   cuMemExportToShareableHandle, sent with the host slab's fd over the fd
 *   channel); otherwise legacy IPC: one cuMemAlloc of the whole slab and its
 *   cuIpcGetMemHandle in the AttachReply, batches addressed by offset. status
 *   says which ("memory": "vmm" or "ipc").
 * - The host slab of a pipeline that feeds a GPU is registered once with
 *   cuMemHostRegister (PORTABLE), by the copy engine, before its first copy;
 *   it is unregistered when the pipeline is freed.
 * - One copy engine per device: its own thread, the device's primary context,
 *   its own non-blocking stream. A copy is one cuMemcpyHtoDAsync per field
 *   (rows x sample bytes, so a short last batch copies less) and an event; the
 *   engine thread waits for the event (cuEventSynchronize) and only then hands
 *   the completion to the loop thread, which publishes the batch to the
 *   device's clients. Clients thus never see a slot whose copy is in flight and
 *   make no driver call per batch to wait for it; the cost is one thread
 *   wake-up of latency per batch on the daemon side, hidden by prefetch. Copies
 *   queued together are all submitted before the first wait, so the stream
 *   never idles between them.
 * - The client's side of reuse: a client that used a batch on its own stream
 *   releases it only once the event it recorded there completed (libloader
 *   waits for it on its flusher thread), so the daemon never refills a slot
 *   the client's kernels still read.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "cudadrv.h"

/**
 * cuda_attach_check() - what an Attach asking for cuda:@index runs first.
 *
 * Opens the process-wide driver on its first call (the path from
 * $LOADERD_CUDA_LIBRARY, else libcuda.so.1), remembers the outcome (cuInit is
 * called once per process), and checks the device. Thread-safe.
 *
 * Return: as cuda_driver_open() and cuda_driver_device(), with @err set; 0
 * fills @info.
 */
int cuda_attach_check(int index, struct cuda_device_info *info, char *err, size_t errsize);

/**
 * cuda_attach_device() - the device part of an Attach request.
 * @kind: Attach.device_kind (LDR_DEVICE_HOST, LDR_DEVICE_CUDA)
 * @index: Attach.device_index
 * @info: filled for a CUDA device
 *
 * Return: 0 host delivery, 1 a usable CUDA device (@info set); otherwise a
 * negative errno with @err set, to reply before attaching: -EINVAL unknown
 * kind, -ENOTSUP built without CUDA or a driver that lacks an entry point
 * device delivery needs, and the errors of cuda_attach_check().
 */
int cuda_attach_device(uint32_t kind, int32_t index, struct cuda_device_info *info,
                       char *err, size_t errsize);

/**
 * cuda_attach_ready() - would cuda_attach_device() be quick now?
 *
 * False until the driver was opened (cuInit: up to seconds on a GPU without
 * persistence mode) and cuda:@index's primary context exists (hundreds of
 * milliseconds): the server then runs cuda_attach_prepare() on a thread of
 * libuv's pool, so the loop keeps serving everyone else meanwhile.
 */
bool cuda_attach_ready(uint32_t kind, int32_t index);
/**
 * cuda_attach_prepare() - cuda_attach_device(), and the device's primary
 * context retained for the daemon's life (the copy engine's then costs
 * nothing). Thread-safe; returns as cuda_attach_device().
 */
int cuda_attach_prepare(uint32_t kind, int32_t index, struct cuda_device_info *info,
                        char *err, size_t errsize);

/** The driver's state for status: {"driver": PATH} or {"error": MSG}, or NULL if never asked. */
struct json_t *cuda_status_json(void);

/* --- device slab sizing -------------------------------------------------- */

/** Alignment of device slots packed below one granule (cudaMalloc's is 256). */
#define CUDA_SLOT_ALIGN 256
/** Granularity used where the device reports none (no VMM: legacy IPC). */
#define CUDA_DEFAULT_GRANULARITY (2u << 20)

struct cuda_slab_layout {
	uint64_t slot_stride;      /* bytes from one device slot to the next */
	uint64_t slab_bytes;       /* one allocation: multiple of the recommended granularity */
	uint64_t waste_bytes;      /* slab_bytes - nslots * slot_bytes */
};

/**
 * cuda_slab_layout() - size a device slab of @nslots slots of @slot_bytes.
 * @gran_min: minimum allocation granularity of the device (a power of two)
 * @gran_rec: recommended granularity (a multiple of @gran_min; 0 = @gran_min)
 *
 * A slot of at least one minimum granule gets whole granules (its stride is
 * @slot_bytes rounded up to @gran_min); smaller slots are packed
 * CUDA_SLOT_ALIGN apart so that a 64 KiB slot does not take 2 MiB. The device
 * slot mirrors the host slot's field offsets (host fields are 256-aligned).
 * The total is rounded up to @gran_rec.
 *
 * Return: 0, -EINVAL (zero size or count, granularity not a power of two,
 * @gran_rec not a multiple of @gran_min), -EOVERFLOW.
 */
int cuda_slab_layout(uint64_t slot_bytes, uint32_t nslots, uint64_t gran_min, uint64_t gran_rec,
                     struct cuda_slab_layout *out);

/** @x rounded up to a multiple of @align (> 0); -EOVERFLOW leaves *out alone. */
int cuda_round_up(uint64_t x, uint64_t align, uint64_t *out);

/* --- device slabs and copy engines (loop thread unless said otherwise) ---- */

enum cuda_mem_kind {
	CUDA_MEM_NONE = 0,
	CUDA_MEM_VMM = 1,          /* cuMemCreate, exported as a POSIX fd */
	CUDA_MEM_IPC = 2,          /* cuMemAlloc + cuIpcGetMemHandle */
};

#define CUDA_IPC_HANDLE_BYTES 64

struct cuda_devices;

/** A device slab: what a client needs to map it, and the daemon's own mapping. */
struct cuda_dslab {
	int device;
	enum cuda_mem_kind kind;
	uint64_t bytes;            /* the whole allocation */
	uint64_t slot_stride;
	uint32_t nslots;
	uint64_t dptr;             /* CUdeviceptr of slot 0 in the daemon */
	int fd;                    /* CUDA_MEM_VMM: the exported fd (the daemon's), else -1 */
	uint8_t ipc_handle[CUDA_IPC_HANDLE_BYTES]; /* CUDA_MEM_IPC */
	char device_name[128];
	uint64_t vmm_handle;       /* private: CUmemGenericAllocationHandle */
};

/** One range of a copy: @bytes from host slot + @offset to device slot + @offset. */
struct cuda_span {
	uint64_t offset;
	uint64_t bytes;
};

/**
 * Completion of cuda_copy(), on the loop thread. @err is 0 or a negative
 * errno with @msg naming the failed driver call.
 */
typedef void (*cuda_copy_done_fn)(void *cookie, int err, const char *msg);

/** The daemon's copy engines; started lazily, one per device used. */
int cuda_devices_new(struct cuda_devices **out, uv_loop_t *loop);
/**
 * cuda_devices_stop() - let every engine finish its queue, then join it.
 * Completions not yet delivered are dropped. After it, cuda_dslab_free() and
 * cuda_host_unregister() work synchronously on the calling thread.
 */
void cuda_devices_stop(struct cuda_devices *d);
/** Stop (if not yet) and free; call after every slab was freed. */
struct cuda_devices *cuda_devices_free(struct cuda_devices *d);
/**
 * cuda_devices_json() - {"cuda:0": {"name", "copies", "bytes", "busy_s",
 * "queued", "host_registered"}, ...}; bytes / busy_s is the rate of the copies
 * themselves (busy_s: time the engine's stream had a copy in flight).
 */
struct json_t *cuda_devices_json(const struct cuda_devices *d);

/**
 * cuda_dslab_new() - allocate a device slab of @nslots slots of @slot_bytes on @info->index.
 *
 * Starts the device's copy engine if needed. VMM with a POSIX fd where the
 * device has it, legacy IPC otherwise ($LOADERD_CUDA_IPC=1 forces legacy IPC).
 * Return: 0; a negative errno with @err naming the failed call.
 */
int cuda_dslab_new(struct cuda_devices *d, const struct cuda_device_info *info, uint64_t slot_bytes,
                   uint32_t nslots, struct cuda_dslab **out, char *err, size_t errsize);
/** Free @s after the copies queued before this call (asynchronous while the engine runs). */
void cuda_dslab_free(struct cuda_devices *d, struct cuda_dslab *s);

/**
 * cuda_host_register() - pin [@base, @base + @size) for @device's engine, once.
 * Queued before any later copy of that engine. A failure is logged and the
 * copies go on from pageable memory (slower, still correct).
 */
void cuda_host_register(struct cuda_devices *d, int device, void *base, size_t size);
/**
 * cuda_host_unregister() - undo cuda_host_register() after the copies queued
 * before it, then call @then(@arg) on the engine thread (or at once when the
 * engines are stopped): the memory may be unmapped only then.
 */
void cuda_host_unregister(struct cuda_devices *d, int device, void *base,
                          void (*then)(void *arg), void *arg);

/**
 * cuda_copy() - copy @nspans ranges of the host slot at @host into slot @slot of @s.
 * @done: called on the loop thread once the data is on the device (or failed)
 * Return: 0 queued; -ENOMEM, -ESHUTDOWN (engines stopped), -EINVAL (a span
 * outside the slot).
 */
int cuda_copy(struct cuda_devices *d, struct cuda_dslab *s, uint32_t slot, const void *host,
              const struct cuda_span *spans, size_t nspans, cuda_copy_done_fn done, void *cookie);

#endif
