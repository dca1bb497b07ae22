/* SPDX-License-Identifier: MIT */
/* slabmap - a client's copy-on-write mapping of a daemon slab (see slabmap.h)
 *
 * Measured (docs/protocol.md, tests/unit/libloader/test-slabmap.c prints it
 * again): for a 512 KiB slot, scanning pagemap costs about 2 us and
 * MADV_DONTNEED with the re-faults of every page about 20 us, so a release
 * scans and gives back only what was written.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "slabmap.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define PM_PRESENT (1ULL << 63)
#define PM_SWAPPED (1ULL << 62)
#define PM_FILE (1ULL << 61)
#define PM_CHUNK 512 /* pagemap entries read per pread */
/* Pages not written between two written ones that one madvise takes along:
 * a syscall costs more than re-faulting a few pages that were never copied. */
#define PM_GAP 16

static pthread_mutex_t pm_lock = PTHREAD_MUTEX_INITIALIZER;
static int pm_fd = -1;
static pid_t pm_pid;  /* the process pm_fd describes: /proc/self binds at open */
static bool pm_failed;

size_t slabmap_page(void)
{
	static size_t page;

	if (!page)
		page = (size_t)sysconf(_SC_PAGESIZE);
	return page;
}

void *slabmap_map(int fd, size_t len, uint64_t off)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, (off_t)off);

	return p == MAP_FAILED ? NULL : p;
}

/* This process's pagemap, opened once (again in a forked child), or -1. */
static int pagemap_fd(void)
{
	pid_t self = self_pid();
	int fd;

	pthread_mutex_lock(&pm_lock);
	if (pm_pid != self) {
		if (pm_fd >= 0)
			close(pm_fd); /* the parent's */
		pm_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
		pm_failed = pm_fd < 0;
		pm_pid = self;
	}
	fd = pm_fd;
	pthread_mutex_unlock(&pm_lock);
	return fd;
}

static int remap_fixed(void *addr, size_t len, int fd, uint64_t off)
{
	void *p = mmap(addr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE | MAP_FIXED, fd,
	               (off_t)off);

	return p == MAP_FAILED ? -errno : 0;
}

static int dontneed(void *addr, size_t len, int fd, uint64_t off)
{
	if (madvise(addr, len, MADV_DONTNEED) == 0)
		return 0;
	return remap_fixed(addr, len, fd, off);
}

/* Give back pages [@lo, @hi) of the range. */
static int discard_run(void *addr, size_t lo, size_t hi, int fd, uint64_t off, size_t *done)
{
	size_t page = slabmap_page();

	*done += (hi - lo) * page;
	return dontneed((char *)addr + lo * page, (hi - lo) * page, fd, off + lo * page);
}

int slabmap_discard(void *addr, size_t len, int fd, uint64_t off, size_t *discarded)
{
	size_t page = slabmap_page(), npages = len / page, done = 0;
	uint64_t ent[PM_CHUNK];
	uintptr_t first = (uintptr_t)addr / page;
	int pm = pagemap_fd(), r = 0, e;
	bool open_run = false;
	size_t lo = 0, hi = 0; /* the run of written pages, gaps of PM_GAP at most bridged */

	if (pm < 0) {
		if (discarded)
			*discarded = len;
		return dontneed(addr, len, fd, off);
	}
	for (size_t i = 0; i < npages; i += PM_CHUNK) {
		size_t n = npages - i < PM_CHUNK ? npages - i : PM_CHUNK;
		ssize_t got = pread(pm, ent, n * sizeof(ent[0]), (off_t)((first + i) * sizeof(ent[0])));

		if (got != (ssize_t)(n * sizeof(ent[0]))) {
			/* cannot tell: give back the rest, from the run on */
			e = discard_run(addr, open_run ? lo : i, npages, fd, off, &done);
			if (discarded)
				*discarded = done;
			return r < 0 ? r : e;
		}
		for (size_t k = 0; k < n; k++) {
			uint64_t v = ent[k];

			if (!((v & (PM_PRESENT | PM_SWAPPED)) && !(v & PM_FILE)))
				continue;
			if (open_run && i + k - hi <= PM_GAP) {
				hi = i + k + 1;
				continue;
			}
			if (open_run && (e = discard_run(addr, lo, hi, fd, off, &done)) < 0)
				r = e;
			open_run = true;
			lo = i + k;
			hi = lo + 1;
		}
	}
	if (open_run && (e = discard_run(addr, lo, hi, fd, off, &done)) < 0)
		r = e;
	if (discarded)
		*discarded = done;
	return r;
}

static int cmp_range(const void *x, const void *y)
{
	const struct slabmap_range *a = x, *b = y;

	return a->off < b->off ? -1 : a->off > b->off;
}

/* Round @keep out to pages within @len, sort and merge; returns the count. */
static int merge_ranges(struct slabmap_range *out, const struct slabmap_range *keep, int nkeep,
                        size_t len)
{
	size_t page = slabmap_page();
	int n = 0;

	for (int i = 0; i < nkeep; i++) {
		size_t lo = keep[i].off / page * page;
		size_t hi = keep[i].off + keep[i].len;

		if (keep[i].len == 0 || keep[i].off >= len)
			continue;
		hi = hi > len ? len : (hi + page - 1) / page * page;
		if (hi > len)
			hi = len;
		out[n].off = lo;
		out[n].len = hi - lo;
		n++;
	}
	qsort(out, (size_t)n, sizeof(out[0]), cmp_range);
	int m = 0;
	for (int i = 0; i < n; i++) {
		if (m && out[i].off <= out[m - 1].off + out[m - 1].len) {
			size_t end = out[i].off + out[i].len;
			if (end > out[m - 1].off + out[m - 1].len)
				out[m - 1].len = end - out[m - 1].off;
		} else {
			out[m++] = out[i];
		}
	}
	return m;
}

int slabmap_keep(void *addr, size_t len, const struct slabmap_range *keep, int nkeep, size_t *copied)
{
	struct slabmap_range *rs;
	size_t total = 0;
	int n, r = SLABMAP_POPULATED;
	char *p;

	*copied = 0;
	rs = malloc((size_t)(nkeep > 0 ? nkeep : 1) * sizeof(*rs));
	if (!rs)
		return -ENOMEM;
	n = merge_ranges(rs, keep, nkeep, len);
	for (int i = 0; i < n; i++)
		total += rs[i].len;
	for (int i = 0; i < n; i++)
		if (madvise((char *)addr + rs[i].off, rs[i].len, MADV_POPULATE_WRITE) != 0) {
			r = -errno;
			break;
		}
	if (r == -ENOMEM || r == -EHWPOISON || r == -EINTR) {
		free(rs);
		return r == -EINTR ? -EAGAIN : r;
	}
	if (r < 0) {
		/* EINVAL (a kernel before 5.14) or EFAULT (a range not writable):
		 * copy into anonymous memory and move it over the range */
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED) {
			free(rs);
			return -ENOMEM;
		}
		for (int i = 0; i < n; i++)
			memcpy(p + rs[i].off, (char *)addr + rs[i].off, rs[i].len);
		if (mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, addr) == MAP_FAILED) {
			r = -errno;
			munmap(p, len);
			free(rs);
			return r;
		}
		r = SLABMAP_COPIED;
	}
	free(rs);
	*copied = total;
	return r;
}

int slabmap_unkeep(void *addr, size_t len, int how, int fd, uint64_t off)
{
	if (how == SLABMAP_POPULATED && madvise(addr, len, MADV_DONTNEED) == 0)
		return 0;
	return remap_fixed(addr, len, fd, off);
}
