/* SPDX-License-Identifier: MIT */
/* kinds - where samples come from: the kind table and what every kind shares (source.h) */

/*
 * Each kind lives in its own file (source-tokens.c, source-npy.c,
 * source-images.c) behind a struct source_ops; this file maps spec kinds to
 * them, dispatches open, read and free, and holds the file helpers.
 *
 * Dataset files are read with pread only, never mapped: a file truncated or
 * replaced under a running pipeline then gives a clear error with -EIO
 * instead of SIGBUS in a worker thread. Every worker reads concurrently from
 * the same descriptors; pread keeps no shared file offset, so no lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "source-private.h"
#include "spec.h"

/* A new kind: its file, its enum source_kind value and a line here. */
const struct source_kind_entry source_kinds[] = {
	{ "tokens", SOURCE_TOKENS, &source_tokens_ops },
	{ "npy", SOURCE_NPY, &source_npy_ops },
	{ "image_folder", SOURCE_IMAGE_FOLDER, &source_images_ops },
	{ "webdataset", SOURCE_WEBDATASET, &source_images_ops },
	{ "python", SOURCE_PYTHON, &source_python_ops },
	{ "blend", SOURCE_BLEND, &source_blend_ops },
	{ "megatron", SOURCE_MEGATRON, &source_megatron_ops },
};
const size_t source_nkinds = ARRAY_SIZE(source_kinds);

const struct source_kind_entry *source_kind_named(const char *name)
{
	for (size_t i = 0; i < source_nkinds; i++)
		if (strcmp(source_kinds[i].name, name) == 0)
			return &source_kinds[i];
	return NULL;
}

const struct source_ops *source_kind_ops(enum source_kind kind)
{
	for (size_t i = 0; i < source_nkinds; i++)
		if (source_kinds[i].kind == kind)
			return source_kinds[i].ops;
	return NULL;
}

int source_read_full(int fd, const char *path, void *buf, size_t len, uint64_t off, char *err,
		     size_t errlen)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errfmt(-errno, err, errlen, "%s: read failed at offset %llu: %s", path,
				    (unsigned long long)(off + got), strerror(errno));
		}
		if (n == 0)
			return errfmt(-EIO, err, errlen,
				    "%s: truncated: wanted %zu bytes at offset %llu, got %zu", path,
				    len, (unsigned long long)off, got);
		got += (size_t)n;
	}
	return 0;
}

int source_open_file(const struct source *src, const char *path, int *fd_out, uint64_t *size_out,
		     char *err, size_t errlen)
{
	struct stat st;
	int fd = source_open_path(src, path, &st, err, errlen);

	if (fd < 0)
		return fd;
	*fd_out = fd;
	*size_out = (uint64_t)st.st_size;
	return 0;
}

/* ---- the interface ---- */

int source_open(struct source **out, const struct spec *spec, char *err, size_t errlen)
{
	struct creds self;

	creds_self(&self);
	return source_open_as(out, spec, &self, err, errlen);
}

int source_open_as(struct source **out, const struct spec *spec, const struct creds *who,
		   char *err, size_t errlen)
{
	return source_open_part(out, spec, spec, who, err, errlen);
}

int source_open_part(struct source **out, const struct spec *spec, const struct spec *keys_of,
		     const struct creds *who, char *err, size_t errlen)
{
	const struct source_ops *ops = source_kind_ops(spec->kind);
	struct source *src;
	int r;

	if (err && errlen)
		err[0] = '\0';
	if (!ops)
		return errfmt(-EINVAL, err, errlen, "unknown source kind %d", (int)spec->kind);
	src = calloc(1, ops->size);
	if (!src)
		return errfmt(-ENOMEM, err, errlen, "source: out of memory");
	src->ops = ops;
	src->who = *who;
	r = source_objects_new(src, keys_of);
	if (r < 0) {
		/* never opened: the kind's close would see fds of 0 (stdin) */
		source_objects_free(src);
		free(src);
		return errfmt(r, err, errlen, "source: out of memory");
	}
	r = ops->open(src, spec, err, errlen);
	if (r < 0) {
		if (r == -ENOMEM && err && errlen && !err[0])
			errfmt(r, err, errlen, "source: out of memory");
		source_free(src);
		return r;
	}
	*out = src;
	return 0;
}

struct source *source_free(struct source *src)
{
	if (!src)
		return NULL;
	/* first: its fetch-ahead threads stop asking the kind for objects */
	source_objects_free(src);
	src->ops->close(src);
	free(src->shard_first);
	free(src);
	return NULL;
}

uint64_t source_nsamples(const struct source *src)
{
	return src->nsamples;
}

const uint64_t *source_shard_first(const struct source *src, uint32_t *nshards)
{
	*nshards = src->nshards;
	return src->shard_first;
}

size_t source_nfields(const struct source *src)
{
	return src->nfields;
}

const struct field_desc *source_field(const struct source *src, size_t i)
{
	return i < src->nfields ? &src->fields[i] : NULL;
}

int source_read(struct source *src, const struct sample_ctx *ctx, uint64_t idx, void *const *dsts,
		char *err, size_t errlen)
{
	if (idx >= src->nsamples)
		return errfmt(-EINVAL, err, errlen, "sample %llu out of range (%llu samples)",
			    (unsigned long long)idx, (unsigned long long)src->nsamples);
	return src->ops->read(src, ctx, idx, dsts, err, errlen);
}

uint64_t source_skipped(const struct source *src)
{
	return atomic_load_explicit(&((struct source *)src)->skipped, memory_order_relaxed);
}

uint64_t source_decoded(const struct source *src)
{
	return atomic_load_explicit(&((struct source *)src)->decoded, memory_order_relaxed);
}

bool source_augments(const struct source *src)
{
	return src->augments;
}

bool source_external(const struct source *src)
{
	return src->ops->external;
}

void source_add_skipped(struct source *src, uint64_t n)
{
	atomic_fetch_add_explicit(&src->skipped, n, memory_order_relaxed);
}

int source_check_limit(const struct spec *spec, uint64_t limit, char *err, size_t errlen)
{
	const struct source_ops *ops = source_kind_ops(spec->kind);

	return ops && ops->check_limit ? ops->check_limit(spec, limit, err, errlen) : 0;
}

uint64_t source_index_bytes(const struct source *src)
{
	return src->index_bytes;
}

uint64_t source_memory_bytes(const struct source *src)
{
	return src->memory_bytes;
}

json_t *source_cache_json(const struct source *src)
{
	return src->ops->cache_json ? src->ops->cache_json(src) : NULL;
}

json_t *source_status_json(const struct source *src)
{
	return src->ops->status_json ? src->ops->status_json(src) : NULL;
}

/* ---- the cache directory (source.h) ---- */

static pthread_mutex_t cache_dir_lock = PTHREAD_MUTEX_INITIALIZER;
static char *cache_dir;

int source_set_cache_dir(const char *dir)
{
	char *copy = dir && *dir ? strdup(dir) : NULL;

	if (dir && *dir && !copy)
		return -ENOMEM;
	pthread_mutex_lock(&cache_dir_lock);
	free(cache_dir);
	cache_dir = copy;
	pthread_mutex_unlock(&cache_dir_lock);
	return 0;
}

size_t source_cache_dir(char *buf, size_t len)
{
	size_t n = 0;

	pthread_mutex_lock(&cache_dir_lock);
	if (cache_dir && strlen(cache_dir) < len) {
		n = strlen(cache_dir);
		memcpy(buf, cache_dir, n + 1);
	}
	pthread_mutex_unlock(&cache_dir_lock);
	return n;
}

/* ---- a worker thread's scratch buffer (source-private.h) ---- */

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

struct scratch {
	size_t cap;
	_Alignas(16) unsigned char data[];
};

static void scratch_init(void)
{
	if (pthread_key_create(&scratch_key, free) != 0)
		abort();
}

void *source_scratch(size_t len)
{
	struct scratch *b;

	pthread_once(&scratch_once, scratch_init);
	b = pthread_getspecific(scratch_key);
	if (b && b->cap >= len)
		return b->data;
	free(b);
	pthread_setspecific(scratch_key, NULL);
	b = malloc(sizeof(*b) + len);
	if (!b)
		return NULL;
	b->cap = len;
	if (pthread_setspecific(scratch_key, b) != 0) {
		free(b);
		return NULL;
	}
	return b->data;
}
