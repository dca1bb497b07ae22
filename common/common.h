/* SPDX-License-Identifier: MIT */
/* common - small helpers shared by the daemon and libloader */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

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

/*
 * The one error idiom of the internal code (daemon/, common/, and libloader's
 * helpers in client/):
 *
 * Every function that takes `char *err, size_t errlen` and returns a negative
 * errno has written a sentence into err that names what was wrong (the key,
 * the file, the pipeline, the value). errfmt() returns its first argument so
 * the two happen in one statement:
 *
 *	return errfmt(-EINVAL, err, errlen, "batch_size: must be in 1..%d", max);
 *	r = errfmt(-ENOMEM, err, errlen, "attach: out of memory"); goto fail;
 *
 * Where cleanup comes before the return, errfmt() comes before the cleanup
 * (which may change errno) and returns into r. A function that returns what a callee
 * returned passes the callee's sentence on as it is, or writes its own over
 * it. err may be NULL with errlen 0: the caller wants the errno only. A
 * prefix helper (spec.c's spec_fail(), settings.c's settings_fail()) is
 * errfmt() with "spec: " or "FILE: " in front, through verrfmt(), and
 * nothing more.
 *
 * An empty err after a negative return means the callee broke this rule, or
 * ran out of memory too deep down to say where. A caller that shows err
 * starts it as "" (or the callee clears it on entry, as spec_parse() and
 * source_open_as() do), and says strerror(-r) in the place of an empty one
 * (reply_error(), loaderd's main()), never an empty message. After a
 * return of 0 or more err means nothing unless the function says otherwise
 * (engine_create()'s note for a pipeline that existed).
 *
 * The public API (include/loader/loader.h) takes no err buffers: it is
 * where this idiom ends. libloader's internal helpers (devmap.c, cudadrv.c)
 * fill a buffer this way; the ldr_* function that called them hands the
 * sentence to the thread's last error with set_err() (client/libloader/libloader.c),
 * which ldr_client_error() returns.
 */
int errfmt(int r, char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* errfmt with @prefix (may be NULL) written before the sentence, for the
 * prefix helpers; a prefix that does not fit is left out. */
int verrfmt(int r, char *err, size_t errlen, const char *prefix, const char *fmt, va_list ap)
	__attribute__((format(printf, 5, 0)));

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

/* Do @rows samples of @sample_bytes from @offset end within a slot of
 * @slot_bytes? Overflow-checked: the figures come from the wire. */
static inline bool field_fits(uint64_t offset, uint64_t rows, uint64_t sample_bytes, uint64_t slot_bytes)
{
	uint64_t len, end;

	return !__builtin_mul_overflow(rows, sample_bytes, &len) &&
	       !__builtin_add_overflow(offset, len, &end) && end <= slot_bytes;
}

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
/* The most bytes of one nng message either way (docs/protocol.md, "Limits"):
 * the daemon's socket drops the connection of a larger one, so libloader
 * refuses to send it and says so. */
#define LDR_MSG_MAX (1u << 20)
#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

/*
 * Stall accounting (docs/protocol.md, TrainerStats): libloader counts each
 * ldr_next() wait into one of WAIT_BUCKETS buckets, the first
 * WAIT_BUCKETS - 1 bounded above by wait_bucket_bound_ns[] (1 us, 2 us,
 * 5 us, ... 10 s: a 1-2-5 series), the last one unbounded. The daemon reads
 * percentiles and Prometheus's histogram from them.
 */
#define WAIT_BUCKETS 23
extern const uint64_t wait_bucket_bound_ns[WAIT_BUCKETS - 1];
/* The bucket of a wait of @ns. */
unsigned wait_bucket(uint64_t ns);
/* CLOCK_MONOTONIC in ns. */
uint64_t mono_ns(void);
/* getpid() without a system call (it is one in glibc, ~140 ns here, and
 * libloader asks on every call to tell a forked child): the pid, cached and
 * forgotten in a child by a pthread_atfork() handler. A child made without
 * fork() (a raw clone) that calls libloader is not told apart. */
pid_t self_pid(void);

/* The value of @name in @env ("NAME=VALUE" strings, NULL-terminated; an
 * environment handed over rather than this process's), NULL when unset or
 * empty. */
const char *env_value(const char *const *env, const char *name);

/*
 * text_clean() - @src as printable UTF-8 in @dst (@size > 0): valid UTF-8
 * characters are kept, and each byte of an invalid sequence, each control
 * character (C0, DEL, and the C1 range U+0080..U+009F, whose 8-bit CSI a
 * terminal obeys) becomes @repl. Cut at a character boundary to fit.
 * Names a client chooses go through it before status, logs or a terminal
 * show them. Returns @dst.
 */
char *text_clean(char *dst, size_t size, const char *src, char repl);
