/* SPDX-License-Identifier: MIT */
/* fdchan-wire - the bytes of the fd channel, shared by daemon and libloader */
#pragma once

#include <stdint.h>

/*
 * The exchange, one per attach, on a fresh connection to <socket>.fds:
 *   client -> daemon: struct fdchan_request (magic, version, token)
 *   daemon -> client: struct fdchan_reply (magic, status, size, nfds,
 *                     ring_fds, device_size) with, when status == 0, the
 *                     slab's read-only fd in SCM_RIGHTS, followed by the VMM
 *                     device slab's fd of a CUDA attachment, then
 *                     (ring_fds == 2) the batch ring's memfd and eventfd
 * then the daemon closes the connection. Both ends are on one machine, so
 * the structs travel in host byte order.
 */
#define FDCHAN_MAGIC 0x4644444cu /* "LDDF" */
#define FDCHAN_VERSION 2
#define FDCHAN_TOKEN_BYTES 16

struct fdchan_request {
	uint32_t magic;
	uint32_t version;
	uint8_t token[FDCHAN_TOKEN_BYTES];
};

struct fdchan_reply {
	uint32_t magic;
	int32_t status;   /* 0 or a negative errno */
	uint64_t size;
	uint32_t nfds;    /* fds in SCM_RIGHTS: 1, +1 with a device slab, +ring_fds */
	uint32_t ring_fds; /* 2: the last two are the batch ring's memfd and eventfd */
	uint64_t device_size; /* bytes of the device slab (nfds == 2) */
};
