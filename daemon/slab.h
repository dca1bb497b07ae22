/* SPDX-License-Identifier: MIT */
/* slab - one sealed memfd of batch slots */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct slab {
	int fd;          /* read-write memfd, the daemon's */
	int ro_fd;       /* the same file reopened O_RDONLY: what clients get */
	uint8_t *base;   /* read-write mapping in the daemon */
	size_t size;
};

/**
 * slab_new() - create a memfd of @size bytes, seal its size, map it.
 * @name: shows in /proc/PID/maps as "memfd:loaderd:NAME"
 *
 * Seals F_SEAL_SHRINK | F_SEAL_GROW, so no holder can truncate it under a
 * mapping (SIGBUS) or grow it, then, once mapped here, F_SEAL_FUTURE_WRITE |
 * F_SEAL_SEAL: only the daemon's own mapping writes, through any descriptor
 * or reopen. Clients get ro_fd and map it MAP_PRIVATE (copy on write).
 */
int slab_new(struct slab **out, const char *name, size_t size);
struct slab *slab_free(struct slab *slab);
