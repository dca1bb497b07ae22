/* SPDX-License-Identifier: MIT */
/* slab - one sealed memfd of batch slots */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct slab {
	int fd;          /* read-write memfd, the daemon's */
	int ro_fd;       /* the same file reopened O_RDONLY: what clients get */
	uint8_t *base;   /* read-write mapping in the daemon */
	size_t size;
	bool sealed;      /* F_SEAL_FUTURE_WRITE is on */
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
/* The same, mapped here but not yet sealed: a python pipeline's, whose
 * worker host maps it read-write before slab_seal() (pyworkers.c). */
int slab_new_unsealed(struct slab **out, const char *name, size_t size);
/* Add F_SEAL_FUTURE_WRITE | F_SEAL_SEAL; -ENOTSUP before Linux 5.1. */
int slab_seal(struct slab *slab);
struct slab *slab_free(struct slab *slab);
