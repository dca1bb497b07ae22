/* SPDX-License-Identifier: MIT */
/* test-slabmap - libloader's copy-on-write slab mapping (client/libloader/slabmap.c)
 *
 * A memfd plays the daemon's slab: written through a MAP_SHARED mapping,
 * sealed against writes as the daemon seals it, and read back by the client
 * through its read-only fd mapped with slabmap_map(). Checks what libloader
 * relies on: writes are private, slabmap_discard brings back the file's
 * current bytes (only for the pages written), kept ranges do not see the
 * file change, both ways of keeping, and unkeep. Prints the cost of a
 * release's discard for a 512 KiB and a 38.5 MB slot.
 */
#undef NDEBUG
#include <assert.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "slabmap.h"

#define PAGE 4096

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

struct slab {
	int memfd, rofd;
	size_t size;
	unsigned char *w;    /* the daemon's view */
	unsigned char *cow;  /* the client's */
};

static void slab_open(struct slab *s, size_t size)
{
	char path[64];

	s->size = size;
	s->memfd = memfd_create("test-slabmap", MFD_ALLOW_SEALING | MFD_CLOEXEC);
	assert(s->memfd >= 0);
	assert(ftruncate(s->memfd, (off_t)size) == 0);
	s->w = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, s->memfd, 0);
	assert(s->w != MAP_FAILED);
	assert(fcntl(s->memfd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW) == 0);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", s->memfd);
	s->rofd = open(path, O_RDONLY | O_CLOEXEC);
	assert(s->rofd >= 0);
	s->cow = slabmap_map(s->rofd, size, 0);
	assert(s->cow);
}

static void slab_close(struct slab *s)
{
	munmap(s->cow, s->size);
	munmap(s->w, s->size);
	close(s->rofd);
	close(s->memfd);
}

static void fill(struct slab *s, size_t off, size_t len, unsigned char v)
{
	memset(s->w + off, v, len);
}

static int all(const unsigned char *p, size_t len, unsigned char v)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

static void test_discard(void)
{
	struct slab s;
	size_t slot = 64 * PAGE, got;

	slab_open(&s, 4 * slot);
	fill(&s, 0, s.size, 1);
	assert(all(s.cow, s.size, 1));
	/* a write is private */
	memset(s.cow + slot, 9, 3 * PAGE);
	s.cow[slot + 40 * PAGE] = 9;
	assert(s.w[slot] == 1 && s.w[slot + 40 * PAGE] == 1);
	/* the daemon's later bytes show where we did not write */
	fill(&s, slot, slot, 2);
	assert(s.cow[slot + 5 * PAGE] == 2 && s.cow[slot] == 9);
	/* discard: the four pages written, then the daemon's bytes */
	assert(slabmap_discard(s.cow + slot, slot, s.rofd, slot, &got) == 0);
	assert(got == 4 * PAGE);
	assert(all(s.cow + slot, slot, 2));
	/* written pages a few apart go in one call, with the pages between */
	s.cow[slot + 2 * PAGE] = 9;
	s.cow[slot + 12 * PAGE] = 9;
	assert(slabmap_discard(s.cow + slot, slot, s.rofd, slot, &got) == 0);
	assert(got == 11 * PAGE);
	assert(all(s.cow + slot, slot, 2));
	/* nothing written: nothing discarded; the neighbours untouched */
	memset(s.cow, 7, PAGE);
	assert(slabmap_discard(s.cow + slot, slot, s.rofd, slot, &got) == 0 && got == 0);
	assert(s.cow[0] == 7);
	fill(&s, slot, slot, 3);
	assert(all(s.cow + slot, slot, 3));
	slab_close(&s);
}

static void test_keep(void)
{
	struct slab s;
	size_t slot = 16 * PAGE, copied;
	struct slabmap_range r[2] = { { 100, 3 * PAGE }, { 8 * PAGE, 10 } };
	int how;

	slab_open(&s, 2 * slot);
	fill(&s, 0, s.size, 4);
	s.cow[2 * PAGE] = 8; /* written before the keep: kept too */
	how = slabmap_keep(s.cow, slot, r, 2, &copied);
	assert(how == SLABMAP_POPULATED);
	assert(copied == 5 * PAGE); /* [0, 4) pages and page 8 */
	fill(&s, 0, s.size, 5);
	assert(all(s.cow, 2 * PAGE, 4) && s.cow[2 * PAGE] == 8 && all(s.cow + 3 * PAGE, PAGE, 4));
	assert(all(s.cow + 8 * PAGE, PAGE, 4));
	assert(s.cow[5 * PAGE] == 5); /* not kept: follows the file */
	assert(all(s.cow + slot, slot, 5));
	/* unkept: the file's bytes again, and its later ones */
	assert(slabmap_unkeep(s.cow, slot, how, s.rofd, 0) == 0);
	assert(all(s.cow, slot, 5));
	fill(&s, 0, s.size, 6);
	assert(all(s.cow, s.size, 6));

	/* a range that cannot be written (EFAULT): the copy, moved over it */
	assert(mprotect(s.cow + slot, slot, PROT_READ) == 0);
	struct slabmap_range whole = { 0, slot };
	how = slabmap_keep(s.cow + slot, slot, &whole, 1, &copied);
	assert(how == SLABMAP_COPIED && copied == slot);
	fill(&s, slot, slot, 7);
	assert(all(s.cow + slot, slot, 6));
	s.cow[slot] = 1; /* writable now */
	assert(slabmap_unkeep(s.cow + slot, slot, how, s.rofd, slot) == 0);
	assert(all(s.cow + slot, slot, 7));
	slab_close(&s);
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return a < b ? -1 : a > b;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return v[n / 2];
}

/* The cost of a release's discard (a scan, and the written pages): medians,
 * the machine may be shared. */
static void measure(size_t slot, const char *name)
{
	enum { REPS = 201 };
	static double scan[REPS], wrote[REPS], whole[REPS];
	struct slab s;
	int reps = slot > (1 << 24) ? 21 : REPS;
	double t;
	volatile unsigned char sink = 0;

	slab_open(&s, slot);
	fill(&s, 0, slot, 1);
	for (int i = 0; i < reps; i++) {
		for (size_t o = 0; o < slot; o += PAGE)
			sink += s.cow[o];
		t = now_us();
		assert(slabmap_discard(s.cow, slot, s.rofd, 0, NULL) == 0);
		scan[i] = now_us() - t;
		for (size_t o = 0; o < slot; o += 4 * PAGE)
			s.cow[o] = 2; /* a quarter of the pages written */
		t = now_us();
		assert(slabmap_discard(s.cow, slot, s.rofd, 0, NULL) == 0);
		wrote[i] = now_us() - t;
		for (size_t o = 0; o < slot; o += PAGE)
			sink += s.cow[o];
		t = now_us();
		assert(madvise(s.cow, slot, MADV_DONTNEED) == 0);
		for (size_t o = 0; o < slot; o += PAGE)
			sink += s.cow[o];
		whole[i] = now_us() - t;
	}
	assert(all(s.cow, slot, 1));
	(void)sink;
	printf("discard at release, %s slot (median of %d): %.1f us nothing written, %.1f us a quarter of "
	       "its pages written; MADV_DONTNEED of the whole slot and re-faulting it %.1f us\n",
	       name, reps, median(scan, reps), median(wrote, reps), median(whole, reps));
	slab_close(&s);
}

int main(void)
{

	assert(slabmap_page() == PAGE || !"these cases assume 4 KiB pages");
	test_discard();
	test_keep();
	measure(512 * 1024, "512 KiB");
	measure(64 * 3 * 224 * 224 * 4, "38.5 MB");
	printf("test-slabmap: ok\n");
	return 0;
}
