/* SPDX-License-Identifier: MIT */
/* common - small helpers shared by the daemon and libloader */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "loader/loader.h"

/* Names of enum ldr_dtype, as in numpy ("uint16", "float32", "bfloat16"...). */
const char *dtype_name(int dtype);
size_t dtype_size(int dtype);
/* Parse a dtype name; returns the dtype or -EINVAL. */
int dtype_from_name(const char *name);

const char *mode_name(int mode);
int mode_from_name(const char *name);

/* Socket path resolution (README, "Running the daemon"); returns the length or -ENAMETOOLONG. */
int sockpath_resolve(char *buf, size_t size, const char *explicit_path);
/* Path of the fd channel that belongs to the nng socket at @sock. */
int sockpath_fdchan(char *buf, size_t size, const char *sock);

/* Format an error message into @err (if any) and return @r: the one way
 * modules report what was wrong with untrusted input. */
int errfmt(int r, char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Error names for negative errno and LDR_E* codes. */
const char *error_name(int err);

/* splitmix64's finaliser and step: the one mixer behind every seeded draw
 * (the epoch permutation, augmentation parameters). Changing it changes
 * every batch of every seeded pipeline. */
static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t splitmix64(uint64_t x)
{
	return mix64(x + 0x9e3779b97f4a7c15ull);
}

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))
