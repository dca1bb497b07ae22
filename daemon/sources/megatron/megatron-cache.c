/* SPDX-License-Identifier: MIT */
/* megatron-cache - GPTDataset's and BlendedDataset's indexes kept in the daemon's cache directory
 * (megatron.h)
 *
 * One file per key, CACHE_DIR/megatron-<FNV-1a 64 of the key>.index, mode
 * 0600 in a directory of mode 0700, both the daemon's. The key is a text
 * that names both files' identity (device, inode, size, mtime; for an
 * object in a store its endpoint, URL, ETag and size, so an object written
 * again is a new key and the same object a hit from any pipeline, create
 * or restart) and every
 * parameter that changes the index; the file holds that text, so a hash
 * collision or another version's file reads as a miss. Layout, native
 * endianness:
 *
 *   "LDRMGIX5" | u64 key length | key (padded to 8) | u64 ndoc, nsamples, epochs, nseq |
 *   boot id (40 bytes) | i32 doc[ndoc] (padded to 8) | i32 sample[2 (nsamples + 1)] |
 *   shuffle[nsamples] (u32, padded to 8; i64 when wide: megatron.h) |
 *   i32 lengths[nseq] (padded to 8) | i64 pointers[nseq] |
 *   u64 checksum of the five arrays | "LDRMGEND"
 *
 * lengths and pointers are the .idx's, as checked against the .bin when the
 * index was built: a warm open reads the .idx's header alone (its identity
 * is in the key) and maps this file, nothing copied, nothing rebuilt.
 *
 * A builder takes an exclusive flock on megatron-<hash>.lock and looks again
 * before it builds, so creates of the same corpus at once (any pipeline
 * name, any rank) build it once; the file is written to a mkstemp name and
 * renamed. It is not fsync'ed (that would cost a build of a small corpus
 * more than the build); instead it carries the kernel's boot id. A file of
 * this boot was written whole before its rename (the page cache does not
 * lose it when a process dies), so it is used as it is, as megatron-core
 * uses its .npy files: mapped, nothing read until a sample needs it. Only
 * a kernel crash or power loss can leave one torn or zero-filled, and
 * those change the boot id: a file of another boot (or when the boot id is
 * unknown) has its checksum and every position checked before it is used,
 * and once it passes its boot id is made this boot's (pwrite of that field
 * alone: readers never look at it again after their check), else it is
 * built again. Reads check the positions they follow (source-megatron.c),
 * so even a file changed behind the daemon's back is an error, never a
 * wild read. The dataset files themselves were opened as the pipeline's
 * owner before the cache is looked at.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/bootid.h"
#include "common.h"
#include "megatron.h"
#include "sources/source.h"

#define MAGIC "LDRMGIX5"          /* 5: megatron-core's int32 sample, uint32 shuffle */
#define TRAILER "LDRMGEND"

static uint64_t fnv1a(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
	return h;
}

/* A word-at-a-time FNV-style mix: one multiply per 8 bytes. */
static uint64_t mix(uint64_t h, const void *p, size_t len)
{
	const unsigned char *b = p;
	uint64_t w;

	for (; len >= 8; len -= 8, b += 8) {
		memcpy(&w, b, 8);
		h = (h ^ w) * 0x100000001b3ULL;
	}
	for (; len; len--, b++)
		h = (h ^ *b) * 0x100000001b3ULL;
	return h;
}

/*
 * The files' checksums: mix() in four independent lanes (word i into lane
 * i % 4), so that four multiplies are in flight, not one chain of them: the
 * arrays are hundreds of MB, and one multiply's latency per word bounded the
 * chain. The lanes and the last bytes fold into @h.
 */
static uint64_t sum_mix(uint64_t h, const void *p, size_t len)
{
	const unsigned char *b = p;
	uint64_t l[4] = { h, h ^ 1, h ^ 2, h ^ 3 }, w;

	for (; len >= 32; len -= 32, b += 32)
		for (int i = 0; i < 4; i++) {
			memcpy(&w, b + 8 * i, 8);
			l[i] = (l[i] ^ w) * 0x100000001b3ULL;
		}
	return mix(mix(h, l, sizeof(l)), b, len);
}

/* The shuffle index's bytes, unpadded. */
static uint64_t shuffle_bytes(const struct mg_index *ix)
{
	return ix->nsamples * (ix->shuffle_wide ? 8 : 4);
}

static uint64_t checksum(const struct mg_index *ix, uint64_t nseq)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	h = sum_mix(h, ix->doc, ix->ndoc * 4);
	h = sum_mix(h, ix->sample, (ix->nsamples + 1) * 8);
	h = sum_mix(h, ix->shuffle, shuffle_bytes(ix));
	h = sum_mix(h, ix->lengths, nseq * 4);
	return sum_mix(h, ix->pointers, nseq * 8);
}

#define BOOT_BYTES BOOT_ID_BYTES

static const char *boot(void)
{
	return boot_id();
}

/* A file checked whole in this boot: its boot id made this boot's. */
static void stamp(const char *path, uint64_t off)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0)
		return;
	if (pwrite(fd, boot(), BOOT_BYTES, (off_t)off) != BOOT_BYTES)
		(void)0;              /* checked again at the next open: no harm */
	close(fd);
}

static size_t pad8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

static size_t doc_bytes(uint64_t ndoc)
{
	return (size_t)((ndoc * 4 + 7) & ~(uint64_t)7);
}

static int read_all(int fd, void *buf, size_t len, uint64_t off)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -EIO;
		got += (size_t)n;
	}
	return 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
	while (len) {
		ssize_t n = write(fd, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		buf = (const char *)buf + n;
		len -= (size_t)n;
	}
	return 0;
}

/* @n pieces written to a mkstemp name in @dir, renamed to @path. */
static int write_file(const char *dir, const char *path, const struct iovec *v, size_t n)
{
	char tmp[4200];
	int fd, r = 0;

	snprintf(tmp, sizeof(tmp), "%s/.index.XXXXXX", dir);
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (size_t i = 0; !r && i < n; i++)
		r = write_all(fd, v[i].iov_base, v[i].iov_len);
	if (!r && rename(tmp, path) < 0)
		r = -errno;
	close(fd);
	if (r)
		unlink(tmp);
	return r;
}

/* What reads index with: positions in range, samples ascending. */
static bool index_sane(const struct mg_index *ix, const struct mg_params *p)
{
	for (uint64_t i = 0; i < ix->ndoc; i++)
		if ((uint64_t)ix->doc[i] < p->beg || (uint64_t)ix->doc[i] >= p->end)
			return false;
	for (uint64_t k = 0; k <= ix->nsamples; k++)
		if (ix->sample[2 * k] < 0 || (uint64_t)ix->sample[2 * k] >= ix->ndoc ||
		    ix->sample[2 * k + 1] < 0 ||
		    (k && ix->sample[2 * k] < ix->sample[2 * k - 2]))
			return false;
	for (uint64_t k = 0; k < ix->nsamples; k++)
		if (mg_shuffle_at(ix, k) >= ix->nsamples) /* a negative int64 too */
			return false;
	return true;
}

/*
 * 0: loaded; -ENOENT: no file; another negative errno: unusable. The file
 * is mapped, not copied (read-only, its pages the page cache's: no copy,
 * no page to clear, none touched before a read needs it): cache files are
 * only replaced by a rename (which leaves a mapped one as it was), never
 * written in place but for the boot id, which no reader looks at again.
 */
static int load(struct mg_index *ix, const char *path, const char *key, uint64_t nseq,
		const struct mg_params *p)
{
	size_t klen = strlen(key);
	uint64_t hdr[4], off = 16 + pad8(klen), boot_off = off + 32, want, sum;
	const char *m, *b = boot();
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW), r = -EINVAL;
	bool stale;

	memset(ix, 0, sizeof(*ix));
	if (fd < 0)
		return errno == ENOENT ? -ENOENT : -errno;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (uint64_t)st.st_size < boot_off + BOOT_BYTES + 16 || read_all(fd, hdr, 16, 0) < 0 ||
	    memcmp(hdr, MAGIC, 8) != 0 || hdr[1] != klen)
		goto out;
	m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (m == MAP_FAILED) {
		r = -errno;
		goto out;
	}
	ix->map = (void *)m;
	ix->map_len = (size_t)st.st_size;
	if (memcmp(m + 16, key, klen) != 0)
		goto out;
	memcpy(hdr, m + off, 32);
	ix->ndoc = hdr[0];
	ix->nsamples = hdr[1];
	ix->epochs = (uint32_t)hdr[2];
	if (hdr[3] != nseq || ix->ndoc > (uint64_t)st.st_size / 4 ||
	    ix->nsamples > (uint64_t)st.st_size / 12 || nseq > (uint64_t)st.st_size / 12)
		goto out;
	ix->shuffle_wide = ix->nsamples > mg_shuffle32_max;
	off = boot_off + BOOT_BYTES;
	want = off + doc_bytes(ix->ndoc) + (ix->nsamples + 1) * 8 + pad8(shuffle_bytes(ix)) +
	       doc_bytes(nseq) + nseq * 8 + 16;
	if (want != (uint64_t)st.st_size || memcmp(m + want - 8, TRAILER, 8) != 0)
		goto out;
	/* every offset a multiple of 8 (the key padded): aligned in the mapping */
	ix->doc = (int32_t *)(void *)(m + off);
	ix->sample = (int32_t *)(void *)(m + off + doc_bytes(ix->ndoc));
	ix->shuffle = ix->sample + 2 * (ix->nsamples + 1);
	ix->lengths = (const int32_t *)(const void *)((const char *)ix->shuffle +
						      pad8(shuffle_bytes(ix)));
	ix->pointers = (const int64_t *)(const void *)((const char *)ix->lengths + doc_bytes(nseq));
	stale = !b || memcmp(m + boot_off, b, BOOT_BYTES) != 0;
	if (stale) {
		memcpy(&sum, m + want - 16, 8);
		if (sum != checksum(ix, nseq) || !index_sane(ix, p))
			goto out;
		if (b)
			stamp(path, boot_off);
	}
	r = 0;
out:
	if (r < 0)
		mg_index_free(ix);
	close(fd);
	return r;
}

static int store(const struct mg_index *ix, uint64_t nseq, const char *dir, const char *path,
		 const char *key)
{
	uint64_t hdr[4] = { ix->ndoc, ix->nsamples, ix->epochs, nseq }, klen = strlen(key);
	uint64_t sum = checksum(ix, nseq);
	static const char zero[BOOT_BYTES];
	const char *b = boot();
	const struct iovec v[] = {
		{ (void *)MAGIC, 8 }, { &klen, 8 }, { (void *)key, klen },
		{ (void *)zero, pad8(klen) - klen }, { hdr, sizeof(hdr) },
		{ (void *)(b ? b : zero), BOOT_BYTES },
		{ ix->doc, ix->ndoc * 4 }, { (void *)zero, doc_bytes(ix->ndoc) - ix->ndoc * 4 },
		{ ix->sample, (ix->nsamples + 1) * 8 }, { ix->shuffle, shuffle_bytes(ix) },
		{ (void *)zero, pad8(shuffle_bytes(ix)) - shuffle_bytes(ix) },
		{ (void *)ix->lengths, nseq * 4 }, { (void *)zero, doc_bytes(nseq) - nseq * 4 },
		{ (void *)ix->pointers, nseq * 8 },
		{ &sum, 8 }, { (void *)TRAILER, 8 },
	};

	return write_file(dir, path, v, ARRAY_SIZE(v));
}

/* One cached thing: how to look for it, build it and write it. */
struct cached_ops {
	int (*load)(void *ctx, const char *path);       /* 0: a usable file */
	int (*build)(void *ctx, char *err, size_t errlen);
	int (*store)(void *ctx, const char *dir, const char *path);
};

static void took(struct timespec t0, double *s)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	*s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
}

static int build_now(const struct cached_ops *ops, void *ctx, struct mg_origin *o, char *err,
		     size_t errlen)
{
	struct timespec t0;
	int r;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	r = ops->build(ctx, err, errlen);
	took(t0, &o->build_s);
	return r;
}

/*
 * CACHE_DIR/@name-<@h>.index: read when there, else built under the lock
 * CACHE_DIR/@name-<@h>.lock (and looked for again once it is held) and
 * written; without a usable directory built all the same, @o->note why.
 */
static int cached(const char *name, uint64_t h, const struct cached_ops *ops, void *ctx,
		  struct mg_origin *o, char *err, size_t errlen)
{
	char dir[4096], path[4200], lock[4200];
	int lfd, r;

	memset(o, 0, sizeof(*o));
	if (!source_cache_dir(dir, sizeof(dir))) {
		snprintf(o->note, sizeof(o->note), "not cached: the daemon has no cache_dir");
		return build_now(ops, ctx, o, err, errlen);
	}
	snprintf(path, sizeof(path), "%s/%s-%016llx.index", dir, name, (unsigned long long)h);
	snprintf(lock, sizeof(lock), "%s/%s-%016llx.lock", dir, name, (unsigned long long)h);
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		snprintf(o->note, sizeof(o->note), "not cached: cache_dir %s: %s", dir,
			 strerror(errno));
		return build_now(ops, ctx, o, err, errlen);
	}
	if (ops->load(ctx, path) == 0) {
		o->reused = true;
		return 0;
	}
	lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (lfd < 0) {
		snprintf(o->note, sizeof(o->note), "not cached: %s: %s", lock, strerror(errno));
		return build_now(ops, ctx, o, err, errlen);
	}
	while (flock(lfd, LOCK_EX) < 0 && errno == EINTR)
		;
	if (ops->load(ctx, path) == 0) {
		o->reused = true;
		close(lfd);
		return 0;
	}
	r = build_now(ops, ctx, o, err, errlen);
	if (r >= 0) {
		int w = ops->store(ctx, dir, path);

		if (w < 0)
			snprintf(o->note, sizeof(o->note), "not cached: %s: %s", path, strerror(-w));
	}
	close(lfd);
	return r;
}

/* ---- GPTDataset's indexes ---- */

struct gpt_ctx {
	struct mg_index *ix;
	const int32_t *lengths;
	const int64_t *pointers;
	uint64_t nseq;
	const struct mg_params *p;
	const char *key, *what;
};

static int gpt_load(void *ctx, const char *path)
{
	struct gpt_ctx *c = ctx;

	return load(c->ix, path, c->key, c->nseq, c->p);
}

static int gpt_build(void *ctx, char *err, size_t errlen)
{
	struct gpt_ctx *c = ctx;
	int r = mg_index_build(c->ix, c->lengths, c->p, c->what, err, errlen);

	c->ix->lengths = c->lengths;  /* the caller's, for store() */
	c->ix->pointers = c->pointers;
	return r;
}

static int gpt_store(void *ctx, const char *dir, const char *path)
{
	struct gpt_ctx *c = ctx;

	return store(c->ix, c->nseq, dir, path, c->key);
}

/* an object's endpoint, URL and ETag: a URL is at most a few KB */
#define KEY_FILE_MAX 4800
#define KEY_MAX (2 * KEY_FILE_MAX + 512)

/* One file's part of the key: its identity on disk, or the object's. */
static void file_key(char *buf, size_t len, const struct mg_file_id *id)
{
	if (id->object)
		snprintf(buf, len, "object %s", id->object);
	else
		snprintf(buf, len, "%llu %llu %llu %lld", (unsigned long long)id->dev,
			 (unsigned long long)id->ino, (unsigned long long)id->size,
			 (long long)id->mtime_ns);
}

/* The cache key of @p over the pair; its FNV-1a names the file. */
static void gpt_key(char *key, size_t len, uint64_t nseq, const struct mg_file_id *idx_id,
		    const struct mg_file_id *bin_id, const struct mg_params *p)
{
	char idx[KEY_FILE_MAX], bin[KEY_FILE_MAX];

	file_key(idx, sizeof(idx), idx_id);
	file_key(bin, sizeof(bin), bin_id);
	snprintf(key, len, "megatron index 2\n"
		 "idx %s\nbin %s\nsequences %llu\n"
		 "range %llu %llu\nseq_len %u\nseed %u\nnum_samples %llu\nextra %d\n",
		 idx, bin, (unsigned long long)nseq, (unsigned long long)p->beg, (unsigned long long)p->end,
		 p->seq_len, p->seed, (unsigned long long)p->num_samples, p->extra);
}

int mg_index_find(struct mg_index *ix, uint64_t nseq, const struct mg_file_id *idx_id,
		  const struct mg_file_id *bin_id, const struct mg_params *p)
{
	char dir[4096], path[4200], key[KEY_MAX];

	memset(ix, 0, sizeof(*ix));
	if (!source_cache_dir(dir, sizeof(dir)))
		return -ENOENT;
	gpt_key(key, sizeof(key), nseq, idx_id, bin_id, p);
	snprintf(path, sizeof(path), "%s/megatron-%016llx.index", dir,
		 (unsigned long long)fnv1a(key));
	return load(ix, path, key, nseq, p);
}

int mg_index_get(struct mg_index *ix, const int32_t *lengths, const int64_t *pointers,
		 uint64_t nseq, const struct mg_file_id *idx_id, const struct mg_file_id *bin_id,
		 const struct mg_params *p, struct mg_origin *o, const char *what, char *err,
		 size_t errlen)
{
	static const struct cached_ops ops = { gpt_load, gpt_build, gpt_store };
	char key[KEY_MAX];
	struct gpt_ctx c = { ix, lengths, pointers, nseq, p, key, what };

	gpt_key(key, sizeof(key), nseq, idx_id, bin_id, p);
	return cached("megatron", fnv1a(key), &ops, &c, o, err, errlen);
}

/* ---- BlendedDataset's indexes ----
 *
 * CACHE_DIR/blend-<hash>.index, written, read and trusted as above:
 *
 *   "LDRBLIX3" | u64 key length | key (padded to 8) | u64 size, parts | boot id (40 bytes) |
 *   u16 part[size] (padded to 8) | u64 sample[size] | u64 per_epoch[parts] |
 *   u64 checksum of the three arrays | "LDRBLEND"
 *
 * The key is every input of the build (source-blend.c): the index is a
 * function of it alone, so a file is never stale, and nothing in it is
 * more than what the key's holder would build.
 */
#define BLEND_MAGIC "LDRBLIX3"    /* 3: mix() in lanes */
#define BLEND_TRAILER "LDRBLEND"

struct blend_ctx {
	struct mg_blend *b;
	const void *key;
	size_t klen;
	int (*build)(void *ctx, char *err, size_t errlen);
	void *ctx;
};

static uint64_t blend_sum(const struct mg_blend *b)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	h = sum_mix(h, b->part, b->size * 2);
	h = sum_mix(h, b->sample, b->size * 8);
	return sum_mix(h, b->per_epoch, b->n * 8);
}

void mg_blend_free(struct mg_blend *b)
{
	if (b->map) {
		munmap(b->map, b->map_len);
	} else {
		mg_array_free(b->part, b->size * sizeof(*b->part));
		mg_array_free(b->sample, b->size * sizeof(*b->sample));
	}
	b->part = NULL;
	b->sample = NULL;
	b->map = NULL;
	b->map_len = 0;
}

static int blend_load(void *ctx, const char *path)
{
	struct blend_ctx *c = ctx;
	struct mg_blend *b = c->b;
	uint64_t hdr[2], sum, off = 16 + pad8(c->klen), boot_off = off + 16;
	uint64_t size = boot_off + BOOT_BYTES + pad8(b->size * 2) + b->size * 8 + b->n * 8 + 16;
	const char *m, *boot_now = boot();
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW), r = -EINVAL;

	mg_blend_free(b);
	if (fd < 0)
		return errno == ENOENT ? -ENOENT : -errno;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (uint64_t)st.st_size != size)
		goto out;
	if (read_all(fd, hdr, 16, 0) < 0 || memcmp(hdr, BLEND_MAGIC, 8) != 0 || hdr[1] != c->klen)
		goto out;
	m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (m == MAP_FAILED) {
		r = -errno;
		goto out;
	}
	b->map = (void *)m;
	b->map_len = (size_t)size;
	memcpy(hdr, m + off, 16);
	if (memcmp(m + 16, c->key, c->klen) != 0 || hdr[0] != b->size || hdr[1] != b->n ||
	    memcmp(m + size - 8, BLEND_TRAILER, 8) != 0)
		goto out;
	off = boot_off + BOOT_BYTES;
	b->part = (uint16_t *)(void *)(m + off);
	b->sample = (uint64_t *)(void *)(m + off + pad8(b->size * 2));
	memcpy(b->per_epoch, m + off + pad8(b->size * 2) + b->size * 8, b->n * 8);
	if (!boot_now || memcmp(m + boot_off, boot_now, BOOT_BYTES) != 0) {
		/* another boot's: checked whole (source-blend.c checks the part
		 * numbers it reads, this the rest) */
		memcpy(&sum, m + size - 16, 8);
		if (sum != blend_sum(b))
			goto out;
		for (uint64_t i = 0; i < b->size; i++)
			if (b->part[i] >= b->n)
				goto out;
		if (boot_now)
			stamp(path, boot_off);
	}
	r = 0;
out:
	if (r < 0)
		mg_blend_free(b);
	close(fd);
	return r;
}

static int blend_build(void *ctx, char *err, size_t errlen)
{
	struct blend_ctx *c = ctx;

	return c->build(c->ctx, err, errlen);
}

static int blend_store(void *ctx, const char *dir, const char *path)
{
	struct blend_ctx *c = ctx;
	const struct mg_blend *b = c->b;
	uint64_t hdr[2] = { b->size, b->n }, klen = c->klen, sum = blend_sum(b);
	static const char zero[BOOT_BYTES];
	const char *boot_now = boot();
	const struct iovec v[] = {
		{ (void *)BLEND_MAGIC, 8 }, { &klen, 8 }, { (void *)c->key, c->klen },
		{ (void *)zero, pad8(c->klen) - c->klen }, { hdr, sizeof(hdr) },
		{ (void *)(boot_now ? boot_now : zero), BOOT_BYTES },
		{ b->part, b->size * 2 }, { (void *)zero, pad8(b->size * 2) - b->size * 2 },
		{ b->sample, b->size * 8 }, { b->per_epoch, b->n * 8 }, { &sum, 8 },
		{ (void *)BLEND_TRAILER, 8 },
	};

	return write_file(dir, path, v, ARRAY_SIZE(v));
}

int mg_blend_get(struct mg_blend *b, const void *key, size_t klen,
		 int (*build)(void *ctx, char *err, size_t errlen), void *ctx,
		 struct mg_origin *o, char *err, size_t errlen)
{
	static const struct cached_ops ops = { blend_load, blend_build, blend_store };
	struct blend_ctx c = { b, key, klen, build, ctx };

	return cached("blend", mix(0xcbf29ce484222325ULL, key, klen), &ops, &c, o, err, errlen);
}
