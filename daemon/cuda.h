/* SPDX-License-Identifier: MIT */
/* cuda - the CUDA driver loaded at run time, device slab sizing, device slot bookkeeping */
#ifndef LOADERD_CUDA_H
#define LOADERD_CUDA_H

/*
 * What exists today
 * -----------------
 * - cuda_driver_*: libcuda.so.1 opened with dlopen (never linked), every entry
 *   point resolved through cuGetProcAddress (dlsym as the fallback), cuInit(0)
 *   called once. Each failure becomes an errno and one sentence naming the
 *   cause: no driver library, the toolkit's stub library, no device, a device
 *   index out of range, any other CUresult by name and description.
 * - cuda_attach_check(): what an Attach with device_kind = CUDA runs before
 *   anything else; the process-wide driver is opened lazily, on the first CUDA
 *   attach, never at daemon start ($LOADERD_CUDA_LIBRARY names another path).
 * - cuda_slab_layout(): device slab sizing against the VMM allocation
 *   granularity (pure arithmetic).
 * - struct cuda_slots: which device slots are free, filling, held by which
 *   client leases, and waiting for which client release events (pure data
 *   structure, no driver call).
 *
 * The copy engine (to be written, on a machine with a GPU)
 * --------------------------------------------------------
 * - One engine per device that has attached clients: its own thread, its own
 *   context (the device's primary context, cuDevicePrimaryCtxRetain) and its
 *   own non-blocking stream. Device memory is touched by nothing else.
 * - Host slabs are registered once with cuMemHostRegister (pinned, PORTABLE)
 *   when the first CUDA client of a pipeline attaches; never per batch.
 * - Device slab: prefer VMM. cuMemCreate with
 *   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, sized by cuda_slab_layout()
 *   with the recommended granularity, cuMemAddressReserve + cuMemMap +
 *   cuMemSetAccess; cuMemExportToShareableHandle gives one fd that travels with
 *   the host slab's fd over the SCM_RIGHTS channel, once per attach. Where the
 *   device lacks CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
 *   (or VMM), fall back to legacy IPC: one cuMemAlloc of the whole slab and its
 *   cuIpcGetMemHandle in the AttachReply; batches are addressed by offset.
 *   status shows which of the two a device uses.
 * - A batch: cuda_slots_acquire(key) gives a device slot, one
 *   cuMemcpyHtoDAsync per field (host slot + field offset -> device slot +
 *   same offset: the device slot mirrors the host slot's layout), then
 *   cuEventRecord on the engine stream. The batch is published
 *   (cuda_slots_publish, then the Batch reply) only once that event completed:
 *   the engine thread waits on it (cuEventSynchronize) before it hands the
 *   completion to the loop thread. The cost is one event wait per batch on the
 *   engine thread, none in the client, and a client never sees a slot whose
 *   copy is in flight; the alternative (an interprocess event per slot that the
 *   client waits on with cuStreamWaitEvent) saves the latency of one wake-up
 *   but adds a driver call per batch in every client.
 * - Clients on the same device share one device copy (cuda_slots_find by
 *   batch key before acquiring); clients on different devices each get their
 *   own, from the same pinned host slot.
 * - A release may carry a client event (an interprocess event recorded on the
 *   client's stream after its last use of the batch): the slot waits in
 *   cuda_slots until the engine's cuEventQuery says it completed
 *   (cuda_slots_event_done). A client that dies loses its holds and its
 *   pending waits at once (cuda_slots_drop_client): the driver tears its
 *   context down, so its work on the slot has stopped.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --- the driver -------------------------------------------------------- */

/** Default driver library; $LOADERD_CUDA_LIBRARY overrides it. */
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
 *
 * Return: 0 for host delivery (go on with the attach); otherwise a negative
 * errno with @err set, to reply before attaching: -EINVAL unknown kind, the
 * errors of cuda_attach_check(), and for now -ENOTSUP "device delivery is not
 * implemented yet" naming the device that was found.
 */
int cuda_attach_device(uint32_t kind, int32_t index, char *err, size_t errsize);

/** Name of a CUresult without asking the driver ("CUDA_ERROR_STUB_LIBRARY"), or NULL. */
const char *cuda_result_name(int result);

/* --- device slab sizing -------------------------------------------------- */

/** Alignment of device slots packed below one granule (cudaMalloc's is 256). */
#define CUDA_SLOT_ALIGN 256

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
 * @slot_bytes rounded up to @gran_min), so that each slot could be a physical
 * allocation of its own; smaller slots are packed CUDA_SLOT_ALIGN apart so that
 * a 64 KiB slot does not take 2 MiB. The device slot mirrors the host slot's
 * field offsets (host fields are 256-aligned). The total is rounded up to
 * @gran_rec.
 *
 * Return: 0, -EINVAL (zero size or count, granularity not a power of two,
 * @gran_rec not a multiple of @gran_min), -EOVERFLOW.
 */
int cuda_slab_layout(uint64_t slot_bytes, uint32_t nslots, uint64_t gran_min, uint64_t gran_rec,
                     struct cuda_slab_layout *out);

/** @x rounded up to a multiple of @align (> 0); -EOVERFLOW leaves *out alone. */
int cuda_round_up(uint64_t x, uint64_t align, uint64_t *out);

/* --- device slot bookkeeping ----------------------------------------------- */

enum cuda_slot_state {
	CUDA_SLOT_FREE = 0,        /* holds nothing */
	CUDA_SLOT_FILLING,         /* the engine is copying batch `key` into it */
	CUDA_SLOT_READY,           /* holds batch `key`, may be delivered */
};

struct cuda_slot_info {
	enum cuda_slot_state state;
	uint64_t key;              /* batch identity, opaque here (FILLING, READY) */
	uint32_t pins;             /* the engine's own references */
	uint32_t holds;            /* leases of clients that hold it now */
	uint32_t waits;            /* released leases whose client event is pending */
};

/** A release that waits for a client's event (cuda_slots_next_wait()). */
struct cuda_slot_wait {
	uint32_t slot;
	uint64_t client;
	uint64_t lease;
	uint64_t event;            /* opaque to this module: the engine's event handle */
};

struct cuda_slots;

/**
 * cuda_slots_new() - bookkeeping of @nslots device slots.
 * @max_holds: lease records shared by all slots (holds + waits), the bound on
 * how many (client, lease) pairs can be outstanding at once.
 */
int cuda_slots_new(struct cuda_slots **out, uint32_t nslots, uint32_t max_holds);
struct cuda_slots *cuda_slots_free(struct cuda_slots *s);

/**
 * cuda_slots_acquire() - a slot to copy batch @key into (FREE -> FILLING, pinned once).
 *
 * Prefers a FREE slot, else the READY slot idle the longest (no pins, holds or
 * waits), whose batch is dropped: recently used batches stay cached for
 * clients that ask late (broadcast).
 * Return: the slot; -EEXIST @key is in a slot already (cuda_slots_find);
 * -EBUSY every slot is in use.
 */
int cuda_slots_acquire(struct cuda_slots *s, uint64_t key);
/** The slot that holds or is filling @key, or -ENOENT. */
int cuda_slots_find(const struct cuda_slots *s, uint64_t key);
/** FILLING -> READY once the copy completed on the device; -EINVAL otherwise. */
int cuda_slots_publish(struct cuda_slots *s, uint32_t slot);
/** FILLING -> FREE after a failed copy (drops the acquire pin); -EINVAL otherwise. */
int cuda_slots_abort(struct cuda_slots *s, uint32_t slot);
/** The engine's references: a pinned slot is never reused. */
int cuda_slots_pin(struct cuda_slots *s, uint32_t slot);
/** Return: 1 the slot became idle, 0 still used, -EINVAL not pinned. */
int cuda_slots_unpin(struct cuda_slots *s, uint32_t slot);

/**
 * cuda_slots_hold() - lease @lease of @client holds READY @slot.
 * Return: 0; -EINVAL not READY or out of range; -EEXIST that (client, lease)
 * exists; -ENOSPC no lease record left.
 */
int cuda_slots_hold(struct cuda_slots *s, uint32_t slot, uint64_t client, uint64_t lease);
/**
 * cuda_slots_release() - @client is done with @lease.
 * @event: 0, or the client's event to wait for before the slot is reused
 * Return: 1 the slot became idle, 0 not (still held, pinned or waiting),
 * -ENOENT no such hold (unknown or already released).
 */
int cuda_slots_release(struct cuda_slots *s, uint64_t client, uint64_t lease, uint64_t event);
/** The event of released @lease completed. Return: as cuda_slots_release(). */
int cuda_slots_event_done(struct cuda_slots *s, uint64_t client, uint64_t lease);
/**
 * cuda_slots_drop_client() - a client went away: its holds and waits vanish.
 * Return: how many records were dropped.
 */
int cuda_slots_drop_client(struct cuda_slots *s, uint64_t client);
/**
 * cuda_slots_next_wait() - iterate the pending release events.
 * @cursor: 0 to start; advanced by each call
 * Return: 1 with *out set, 0 at the end.
 */
int cuda_slots_next_wait(const struct cuda_slots *s, uint32_t *cursor, struct cuda_slot_wait *out);
/** Describe @slot; -EINVAL out of range. */
int cuda_slots_get(const struct cuda_slots *s, uint32_t slot, struct cuda_slot_info *out);
/** Slots that cuda_slots_acquire() could take now (FREE or idle READY). */
uint32_t cuda_slots_available(const struct cuda_slots *s);

#endif
