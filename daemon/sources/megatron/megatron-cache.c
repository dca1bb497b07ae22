/* SPDX-License-Identifier: MIT */
/* megatron-cache - GPTDataset's indexes kept in the daemon's cache directory (megatron.h)
 *
 * One file per key, CACHE_DIR/megatron-<FNV-1a 64 of the key>.index, mode
 * 0600 in a directory of mode 0700, both the daemon's. The key is a text
 * that names both files' identity (device, inode, size, mtime) and every
 * parameter that changes the index; the file holds that text, so a hash
 * collision or another version's file reads as a miss. Layout, native
 * endianness:
 *
 *   "LDRMGIX1" | u64 key length | key | u64 ndoc, nsamples, epochs |
 *   i32 doc[ndoc] (padded to 8) | i64 sample[2 (nsamples + 1)] |
 *   i64 shuffle[nsamples] | u64 checksum of the three arrays | "LDRMGEND"
 *
 * A builder takes an exclusive flock on megatron-<hash>.lock and looks again
 * before it builds, so creates of the same corpus at once (any pipeline
 * name, any rank) build it once; the file is written to a mkstemp name and
 * renamed. It is not fsync'ed (that would cost a build of a small corpus
 * more than the build): a file that a crash left torn or zero-filled under
 * the real name fails its size, trailer or checksum when read back and is
 * built again. What reads rely on (every position in range) is checked too
 * before a file is used; the dataset files themselves were opened as the pipeline's
 * owner before the cache is looked at.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "megatron.h"
#include "sources/source.h"

#define MAGIC "LDRMGIX1"
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

static uint64_t checksum(const struct mg_index *ix)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	h = mix(h, ix->doc, ix->ndoc * 4);
	h = mix(h, ix->sample, (ix->nsamples + 1) * 16);
	return mix(h, ix->shuffle, ix->nsamples * 8);
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
		if (ix->shuffle[k] < 0 || (uint64_t)ix->shuffle[k] >= ix->nsamples)
			return false;
	return true;
}

/* 0: loaded; -ENOENT: no file; another negative errno: unusable. */
static int load(struct mg_index *ix, const char *path, const char *key,
		const struct mg_params *p)
{
	size_t klen = strlen(key);
	uint64_t hdr[4], off, want, sum;
	char *k = NULL, tail[8];
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW), r = -EINVAL;

	memset(ix, 0, sizeof(*ix));
	if (fd < 0)
		return errno == ENOENT ? -ENOENT : -errno;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
		goto out;
	if (read_all(fd, hdr, 16, 0) < 0 || memcmp(hdr, MAGIC, 8) != 0 || hdr[1] != klen)
		goto out;
	k = malloc(klen + 1);
	if (!k || read_all(fd, k, klen, 16) < 0 || memcmp(k, key, klen) != 0)
		goto out;
	off = 16 + klen;
	if (read_all(fd, hdr, 24, off) < 0)
		goto out;
	ix->ndoc = hdr[0];
	ix->nsamples = hdr[1];
	ix->epochs = (uint32_t)hdr[2];
	off += 24;
	if (ix->ndoc > (uint64_t)st.st_size / 4 || ix->nsamples > (uint64_t)st.st_size / 24)
		goto out;
	want = off + doc_bytes(ix->ndoc) + (ix->nsamples + 1) * 16 + ix->nsamples * 8 + 16;
	if (want != (uint64_t)st.st_size)
		goto out;
	ix->doc = malloc(doc_bytes(ix->ndoc) + 8);
	ix->sample = malloc((ix->nsamples + 1) * 16);
	ix->shuffle = malloc(ix->nsamples * 8 + 8);
	if (!ix->doc || !ix->sample || !ix->shuffle) {
		r = -ENOMEM;
		goto out;
	}
	if (read_all(fd, ix->doc, doc_bytes(ix->ndoc), off) < 0)
		goto out;
	off += doc_bytes(ix->ndoc);
	if (read_all(fd, ix->sample, (ix->nsamples + 1) * 16, off) < 0)
		goto out;
	off += (ix->nsamples + 1) * 16;
	if (read_all(fd, ix->shuffle, ix->nsamples * 8, off) < 0 ||
	    read_all(fd, &sum, 8, off + ix->nsamples * 8) < 0 ||
	    read_all(fd, tail, 8, off + ix->nsamples * 8 + 8) < 0 || memcmp(tail, TRAILER, 8) != 0 ||
	    sum != checksum(ix) || !index_sane(ix, p))
		goto out;
	r = 0;
out:
	if (r < 0)
		mg_index_free(ix);
	free(k);
	close(fd);
	return r;
}

static int store(const struct mg_index *ix, const char *dir, const char *path, const char *key)
{
	char tmp[4200];
	uint64_t hdr[3] = { ix->ndoc, ix->nsamples, ix->epochs }, klen = strlen(key);
	uint64_t sum = checksum(ix);
	static const char zero[8];
	int fd, r;

	snprintf(tmp, sizeof(tmp), "%s/.megatron-index.XXXXXX", dir);
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0)
		return -errno;
	r = write_all(fd, MAGIC, 8);
	if (!r)
		r = write_all(fd, &klen, 8);
	if (!r)
		r = write_all(fd, key, klen);
	if (!r)
		r = write_all(fd, hdr, sizeof(hdr));
	if (!r)
		r = write_all(fd, ix->doc, ix->ndoc * 4);
	if (!r)
		r = write_all(fd, zero, doc_bytes(ix->ndoc) - ix->ndoc * 4);
	if (!r)
		r = write_all(fd, ix->sample, (ix->nsamples + 1) * 16);
	if (!r)
		r = write_all(fd, ix->shuffle, ix->nsamples * 8);
	if (!r)
		r = write_all(fd, &sum, 8);
	if (!r)
		r = write_all(fd, TRAILER, 8);
	if (!r && rename(tmp, path) < 0)
		r = -errno;
	close(fd);
	if (r)
		unlink(tmp);
	return r;
}

static int build_timed(struct mg_index *ix, const int32_t *lengths, const struct mg_params *p,
		       struct mg_origin *o, const char *what, char *err, size_t errlen)
{
	struct timespec t0, t1;
	int r;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	r = mg_index_build(ix, lengths, p, what, err, errlen);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	o->build_s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	return r;
}

int mg_index_get(struct mg_index *ix, const int32_t *lengths, uint64_t nseq,
		 const struct mg_file_id *idx_id, const struct mg_file_id *bin_id,
		 const struct mg_params *p, struct mg_origin *o, const char *what, char *err,
		 size_t errlen)
{
	char dir[4096], key[512], path[4200], lock[4200];
	uint64_t h;
	int lfd, r;

	memset(o, 0, sizeof(*o));
	if (!source_cache_dir(dir, sizeof(dir))) {
		snprintf(o->note, sizeof(o->note), "not cached: the daemon has no cache_dir");
		return build_timed(ix, lengths, p, o, what, err, errlen);
	}
	snprintf(key, sizeof(key), "megatron index 1\n"
		 "idx %llu %llu %llu %lld\nbin %llu %llu %llu %lld\nsequences %llu\n"
		 "range %llu %llu\nseq_len %u\nseed %u\nnum_samples %llu\nextra %d\n",
		 (unsigned long long)idx_id->dev, (unsigned long long)idx_id->ino,
		 (unsigned long long)idx_id->size, (long long)idx_id->mtime_ns,
		 (unsigned long long)bin_id->dev, (unsigned long long)bin_id->ino,
		 (unsigned long long)bin_id->size, (long long)bin_id->mtime_ns,
		 (unsigned long long)nseq, (unsigned long long)p->beg, (unsigned long long)p->end,
		 p->seq_len, p->seed, (unsigned long long)p->num_samples, p->extra);
	h = fnv1a(key);
	snprintf(path, sizeof(path), "%s/megatron-%016llx.index", dir, (unsigned long long)h);
	snprintf(lock, sizeof(lock), "%s/megatron-%016llx.lock", dir, (unsigned long long)h);
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		snprintf(o->note, sizeof(o->note), "not cached: cache_dir %s: %s", dir,
			 strerror(errno));
		return build_timed(ix, lengths, p, o, what, err, errlen);
	}
	if (load(ix, path, key, p) == 0) {
		o->reused = true;
		return 0;
	}
	lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (lfd < 0) {
		snprintf(o->note, sizeof(o->note), "not cached: %s: %s", lock, strerror(errno));
		return build_timed(ix, lengths, p, o, what, err, errlen);
	}
	while (flock(lfd, LOCK_EX) < 0 && errno == EINTR)
		;
	if (load(ix, path, key, p) == 0) {
		o->reused = true;
		close(lfd);
		return 0;
	}
	r = build_timed(ix, lengths, p, o, what, err, errlen);
	if (r >= 0) {
		int w = store(ix, dir, path, key);

		if (w < 0)
			snprintf(o->note, sizeof(o->note), "not cached: %s: %s", path, strerror(-w));
	}
	close(lfd);
	return r;
}
