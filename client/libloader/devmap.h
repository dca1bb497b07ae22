/* SPDX-License-Identifier: MIT */
/* devmap - a daemon's device slab mapped into a client (libloader's CUDA side) */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* AttachReply.device_memory */
#define DEVMAP_VMM 1
#define DEVMAP_IPC 2

struct devmap;

/**
 * devmap_open() - map the device slab of an attachment on cuda:@device.
 * @kind: DEVMAP_VMM (@fd, the exported allocation; taken over, closed here)
 *        or DEVMAP_IPC (@ipc, a CUipcMemHandle of @ipclen bytes)
 *
 * Opens the CUDA driver once per process ($LOADERD_CUDA_LIBRARY, else
 * libcuda.so.1), retains the device's primary context (the one torch and
 * the runtime API use) and maps the slab once; no driver call is needed per
 * batch. Return: 0, or a negative errno with @err naming the cause.
 */
int devmap_open(struct devmap **out, int device, uint32_t kind, int fd, uint64_t size,
                const uint8_t *ipc, size_t ipclen, char *err, size_t errsize);
/** Unmap and release the context (NULL is fine). */
void devmap_close(struct devmap *m);
/** The device address of the slab's first byte. */
uint64_t devmap_base(const struct devmap *m);

/**
 * devmap_record() - record an event on @stream (a CUstream, NULL the legacy
 * default stream) after the work queued there so far.
 * Return: the event for devmap_wait(), or NULL with @err set.
 */
void *devmap_record(struct devmap *m, void *stream, char *err, size_t errsize);
/** Wait for @event (from devmap_record) and recycle it. Return: 0 or -EIO. */
int devmap_wait(struct devmap *m, void *event);
