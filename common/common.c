/* SPDX-License-Identifier: MIT */
/* common - dtype and mode names, socket path resolution, error names */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

static const struct {
	const char *name;
	size_t size;
} dtypes[LDR_DTYPE_COUNT] = {
	[LDR_DTYPE_BOOL] = { "bool", 1 },
	[LDR_DTYPE_INT8] = { "int8", 1 },
	[LDR_DTYPE_UINT8] = { "uint8", 1 },
	[LDR_DTYPE_INT16] = { "int16", 2 },
	[LDR_DTYPE_UINT16] = { "uint16", 2 },
	[LDR_DTYPE_INT32] = { "int32", 4 },
	[LDR_DTYPE_UINT32] = { "uint32", 4 },
	[LDR_DTYPE_INT64] = { "int64", 8 },
	[LDR_DTYPE_UINT64] = { "uint64", 8 },
	[LDR_DTYPE_FLOAT16] = { "float16", 2 },
	[LDR_DTYPE_BFLOAT16] = { "bfloat16", 2 },
	[LDR_DTYPE_FLOAT32] = { "float32", 4 },
	[LDR_DTYPE_FLOAT64] = { "float64", 8 },
};

const char *dtype_name(int dtype)
{
	if (dtype < 0 || dtype >= LDR_DTYPE_COUNT)
		return NULL;
	return dtypes[dtype].name;
}

size_t dtype_size(int dtype)
{
	if (dtype < 0 || dtype >= LDR_DTYPE_COUNT)
		return 0;
	return dtypes[dtype].size;
}

int dtype_from_name(const char *name)
{
	for (int i = 0; i < LDR_DTYPE_COUNT; i++)
		if (strcmp(dtypes[i].name, name) == 0)
			return i;
	return -EINVAL;
}

static const char *const modes[] = { "broadcast", "partition", "dynamic" };

const char *mode_name(int mode)
{
	if (mode < 0 || mode >= (int)ARRAY_SIZE(modes))
		return NULL;
	return modes[mode];
}

int mode_from_name(const char *name)
{
	for (size_t i = 0; i < ARRAY_SIZE(modes); i++)
		if (strcmp(modes[i], name) == 0)
			return (int)i;
	return -EINVAL;
}

static int put(char *buf, size_t size, const char *a, const char *b)
{
	int n = snprintf(buf, size, "%s%s", a, b);
	if (n < 0 || (size_t)n >= size)
		return -ENAMETOOLONG;
	return n;
}

int sockpath_resolve(char *buf, size_t size, const char *explicit_path)
{
	const char *env;

	if (explicit_path && *explicit_path)
		return put(buf, size, explicit_path, "");
	env = getenv("LOADERD_SOCKET");
	if (env && *env)
		return put(buf, size, env, "");
	env = getenv("RUNTIME_DIRECTORY");
	if (env && *env) {
		/* systemd may list several directories separated by ':' */
		char dir[4096];
		size_t n = strcspn(env, ":");
		if (n >= sizeof(dir))
			return -ENAMETOOLONG;
		memcpy(dir, env, n);
		dir[n] = '\0';
		return put(buf, size, dir, "/loaderd.sock");
	}
	env = getenv("XDG_RUNTIME_DIR");
	if (env && *env)
		return put(buf, size, env, "/loaderd.sock");
	return put(buf, size, "/run/loaderd/loaderd.sock", "");
}

int sockpath_fdchan(char *buf, size_t size, const char *sock)
{
	return put(buf, size, sock, ".fds");
}

const char *error_name(int err)
{
	switch (err) {
	case 0:
		return "success";
	case LDR_EOF:
		return "end of stream";
	case LDR_EFORKED:
		return "handle used in a forked child: create the client in this process";
	case LDR_EDISCONNECTED:
		return "disconnected from the daemon";
	case LDR_EVERSION:
		return "protocol version mismatch between client and daemon";
	case LDR_EBATCH:
		return "this batch failed to build (the stream goes on)";
	default:
		if (err < 0 && err > -4096)
			return strerror(-err);
		return "unknown error";
	}
}

int verrfmt(int r, char *err, size_t errlen, const char *prefix, const char *fmt, va_list ap)
{
	int n = 0;

	if (!err || !errlen)
		return r;
	if (prefix) {
		n = snprintf(err, errlen, "%s", prefix);
		if (n < 0 || (size_t)n >= errlen)
			n = 0;
	}
	vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
	return r;
}

int errfmt(int r, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	verrfmt(r, err, errlen, NULL, fmt, ap);
	va_end(ap);
	return r;
}

const uint64_t wait_bucket_bound_ns[WAIT_BUCKETS - 1] = {
	1000, 2000, 5000, 10000, 20000, 50000,
	100000, 200000, 500000, 1000000, 2000000, 5000000,
	10000000, 20000000, 50000000, 100000000, 200000000, 500000000,
	1000000000, 2000000000, 5000000000, 10000000000,
};

unsigned wait_bucket(uint64_t ns)
{
	unsigned i = 0;

	while (i < WAIT_BUCKETS - 1 && ns > wait_bucket_bound_ns[i])
		i++;
	return i;
}

uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The length of the valid UTF-8 character at @s (1..4), or 0. */
static size_t utf8_len(const unsigned char *s)
{
	size_t n;
	uint32_t cp;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		n = 2, cp = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		n = 3, cp = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		n = 4, cp = s[0] & 0x07;
	else
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	/* overlong, surrogates, beyond U+10FFFF */
	if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

char *text_clean(char *dst, size_t size, const char *src, char repl)
{
	const unsigned char *s = (const unsigned char *)src;
	size_t o = 0;

	while (*s) {
		size_t n = utf8_len(s);
		bool control = n == 1 ? (*s < 0x20 || *s == 0x7f) : n == 2 && s[0] == 0xc2 && s[1] < 0xa0;
		if (n == 0 || control) {
			/* one @repl for each invalid byte, or for the whole control character */
			if (o + 1 >= size)
				break;
			dst[o++] = repl;
			s += n ? n : 1;
			continue;
		}
		if (o + n >= size)
			break;
		memcpy(dst + o, s, n);
		o += n;
		s += n;
	}
	dst[o] = '\0';
	return dst;
}

static _Atomic pid_t self_pid_cached;
static pthread_once_t self_pid_once = PTHREAD_ONCE_INIT;

static void self_pid_forked(void)
{
	atomic_store_explicit(&self_pid_cached, 0, memory_order_relaxed);
}

static void self_pid_hook(void)
{
	pthread_atfork(NULL, NULL, self_pid_forked);
}

pid_t self_pid(void)
{
	pid_t p = atomic_load_explicit(&self_pid_cached, memory_order_relaxed);

	if (p)
		return p;
	pthread_once(&self_pid_once, self_pid_hook);
	p = getpid();
	atomic_store_explicit(&self_pid_cached, p, memory_order_relaxed);
	return p;
}

const char *env_value(const char *const *env, const char *name)
{
	size_t n = strlen(name);

	for (; env && *env; env++)
		if (!strncmp(*env, name, n) && (*env)[n] == '=' && (*env)[n + 1])
			return *env + n + 1;
	return NULL;
}
