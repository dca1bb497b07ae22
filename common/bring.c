/* SPDX-License-Identifier: MIT */
/* bring - the batch ring (see bring.h for the layout and who trusts what) */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bring.h"
#include "common.h"

_Static_assert(sizeof(struct bring_desc) == 64, "a delivery is one cache line");
_Static_assert(sizeof(struct bring_shared) <= BRING_MSG_OFF, "the header fits its page");
_Static_assert(BRING_STAT_BUCKETS == WAIT_BUCKETS, "the ring holds every wait bucket");
_Static_assert(offsetof(struct bring_shared, flags) == 24 && offsetof(struct bring_shared, st) == 576,
               "the offsets docs/protocol.md gives");

static bool pow2_cap(uint32_t n)
{
	return n >= 1 && n <= BRING_CAP_MAX && (n & (n - 1)) == 0;
}

size_t bring_bytes(uint32_t dcap, uint32_t rcap)
{
	size_t n = BRING_DESC_OFF + (size_t)dcap * sizeof(struct bring_desc) + (size_t)rcap * 8;

	return (n + 4095) & ~(size_t)4095;
}

/* Point @b's arrays into its mapping at @base. */
static void bring_layout(struct bring *b, void *base, size_t bytes, uint32_t dcap, uint32_t rcap)
{
	b->sh = base;
	b->msg = (char *)base + BRING_MSG_OFF;
	b->desc = (struct bring_desc *)((char *)base + BRING_DESC_OFF);
	b->rel = (_Atomic uint64_t *)((char *)base + BRING_DESC_OFF + (size_t)dcap * sizeof(struct bring_desc));
	b->bytes = bytes;
	b->dcap = dcap;
	b->rcap = rcap;
	b->d_head = b->d_tail = b->r_head = b->r_tail = 0;
}

int bring_create(struct bring *b, uint32_t dcap, uint32_t rcap, char *err, size_t errlen)
{
	size_t bytes = bring_bytes(dcap, rcap);
	void *base;
	int fd, e;

	memset(b, 0, sizeof(*b));
	b->fd = -1;
	if (!pow2_cap(dcap) || !pow2_cap(rcap))
		return errfmt(-EINVAL, err, errlen, "batch ring of %u deliveries and %u releases: each "
		              "must be a power of two from 1 to %d", dcap, rcap, BRING_CAP_MAX);
	fd = memfd_create("loaderd-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return errfmt(-errno, err, errlen, "batch ring: memfd_create: %s", strerror(errno));
	/* sealed before anyone else sees it: its size is fixed for good */
	if (ftruncate(fd, (off_t)bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		e = errno;
		close(fd);
		return errfmt(-e, err, errlen, "batch ring of %zu bytes: %s", bytes, strerror(e));
	}
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		e = errno;
		close(fd);
		return errfmt(-e, err, errlen, "batch ring: mmap of %zu bytes: %s", bytes, strerror(e));
	}
	bring_layout(b, base, bytes, dcap, rcap);
	b->fd = fd;
	b->sh->magic = BRING_MAGIC;
	b->sh->version = BRING_VERSION;
	b->sh->dcap = dcap;
	b->sh->rcap = rcap;
	b->sh->bytes = bytes;
	b->sh->flags = b->flags = BRING_F_STATS;
	return 0;
}

int bring_map(struct bring *b, int fd, uint64_t size, char *err, size_t errlen)
{
	struct bring_shared *sh, hdr;
	struct stat st;
	uint32_t dcap, rcap;
	void *base;

	memset(b, 0, sizeof(*b));
	b->fd = -1;
	if (size < BRING_DESC_OFF || size > bring_bytes(BRING_CAP_MAX, BRING_CAP_MAX))
		return errfmt(-EPROTO, err, errlen, "batch ring of %" PRIu64 " bytes: not a ring's size",
		              size);
	/* a mapping past the file's end would fault on its last pages */
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != size)
		return errfmt(-EPROTO, err, errlen, "batch ring: the fd holds %lld bytes, not the %" PRIu64
		              " announced", (long long)st.st_size, size);
	base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED)
		return errfmt(-errno, err, errlen, "batch ring: mmap of %" PRIu64 " bytes: %s", size,
		              strerror(errno));
	sh = base;
	hdr = *sh;
	dcap = hdr.dcap;
	rcap = hdr.rcap;
	if (hdr.magic != BRING_MAGIC || hdr.version != BRING_VERSION || !pow2_cap(dcap) ||
	    !pow2_cap(rcap) || hdr.bytes != size || bring_bytes(dcap, rcap) != size) {
		munmap(base, size);
		return errfmt(-EPROTO, err, errlen, "batch ring: bad header (magic %#x version %u, "
		              "%u deliveries, %u releases, %" PRIu64 " bytes in a mapping of %" PRIu64 ")",
		              hdr.magic, hdr.version, dcap, rcap, hdr.bytes, size);
	}
	bring_layout(b, base, size, dcap, rcap);
	b->fd = fd;
	b->flags = hdr.flags;
	/* a ring mapped again after a while: go on from where it is */
	b->d_tail = atomic_load_explicit(&sh->d_tail, memory_order_relaxed);
	b->r_head = atomic_load_explicit(&sh->r_head, memory_order_relaxed);
	return 0;
}

void bring_close(struct bring *b)
{
	if (b->sh)
		munmap(b->sh, b->bytes);
	if (b->fd >= 0)
		close(b->fd);
	b->sh = NULL;
	b->fd = -1;
}

/* --- the daemon's end --------------------------------------------------- */

int bring_daemon_tail(struct bring *b, char *err, size_t errlen)
{
	uint64_t t = atomic_load_explicit(&b->sh->d_tail, memory_order_acquire);

	if (t < b->d_tail)
		return errfmt(-EPROTO, err, errlen, "batch ring: the delivery tail moved back from %"
		              PRIu64 " to %" PRIu64, b->d_tail, t);
	if (t > b->d_head)
		return errfmt(-EPROTO, err, errlen, "batch ring: the delivery tail %" PRIu64 " is past "
		              "the %" PRIu64 " deliveries written", t, b->d_head);
	b->d_tail = t;
	return 0;
}

uint32_t bring_daemon_space(const struct bring *b)
{
	return b->dcap - (uint32_t)(b->d_head - b->d_tail);
}

void bring_daemon_put(struct bring *b, const struct bring_desc *d)
{
	b->desc[b->d_head & (b->dcap - 1)] = *d;
	b->d_head++;
}

bool bring_daemon_publish(struct bring *b)
{
	/* seq_cst, both: the client either sees the head or its sleep is seen */
	atomic_store(&b->sh->d_head, b->d_head);
	return atomic_exchange(&b->sh->d_sleep, 0) != 0;
}

void bring_wake_client(struct bring *b)
{
	atomic_fetch_add(&b->sh->d_wake, 1);
	syscall(SYS_futex, &b->sh->d_wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

int bring_daemon_take(struct bring *b, uint64_t *out, size_t max, size_t *n, char *err,
                      size_t errlen)
{
	uint64_t h = atomic_load(&b->sh->r_head);
	size_t k = 0;

	*n = 0;
	if (h < b->r_tail)
		return errfmt(-EPROTO, err, errlen, "batch ring: the release head moved back to %" PRIu64
		              ", below the %" PRIu64 " releases read", h, b->r_tail);
	if (h - b->r_tail > b->rcap)
		return errfmt(-EPROTO, err, errlen, "batch ring: the release head %" PRIu64 " is %" PRIu64
		              " entries past the %" PRIu64 " read, beyond the ring's %u", h, h - b->r_tail,
		              b->r_tail, b->rcap);
	b->r_head = h;
	while (k < max && b->r_tail < h) {
		out[k++] = atomic_load_explicit(&b->rel[b->r_tail & (b->rcap - 1)], memory_order_relaxed);
		b->r_tail++;
	}
	atomic_store_explicit(&b->sh->r_tail, b->r_tail, memory_order_release);
	*n = k;
	return 0;
}

void bring_daemon_sleep(struct bring *b)
{
	atomic_store(&b->sh->r_sleep, 1);
}

void bring_daemon_want_room(struct bring *b, uint64_t at)
{
	atomic_store(&b->sh->d_room, at);
}

/* --- the client's end --------------------------------------------------- */

int bring_client_peek(const struct bring *b, struct bring_desc *out)
{
	uint64_t h = atomic_load_explicit(&b->sh->d_head, memory_order_acquire);

	if (h == b->d_tail)
		return 0;
	if (h < b->d_tail || h - b->d_tail > b->dcap)
		return -EPROTO;
	*out = b->desc[b->d_tail & (b->dcap - 1)];
	return 1;
}

bool bring_client_next(struct bring *b)
{
	uint64_t w;

	b->d_tail++;
	/* seq_cst, both: the daemon either sees the tail or its wish is seen */
	atomic_store(&b->sh->d_tail, b->d_tail);
	w = atomic_load(&b->sh->d_room);
	return w && b->d_tail >= w && atomic_exchange(&b->sh->d_room, 0) != 0;
}

int bring_client_get(struct bring *b, struct bring_desc *out)
{
	int r = bring_client_peek(b, out);

	if (r == 1)
		bring_client_next(b);
	return r;
}

int bring_client_wait(struct bring *b, uint64_t tail, int timeout_ms)
{
	struct timespec ts = { .tv_sec = timeout_ms / 1000, .tv_nsec = (long)(timeout_ms % 1000) * 1000000L };
	uint32_t w;
	long r;

	atomic_store(&b->sh->d_sleep, 1);
	w = atomic_load(&b->sh->d_wake);
	if (atomic_load(&b->sh->d_head) != tail) {
		atomic_store(&b->sh->d_sleep, 0);
		return 0;
	}
	r = syscall(SYS_futex, &b->sh->d_wake, FUTEX_WAIT, w, timeout_ms < 0 ? NULL : &ts, NULL, 0);
	if (r < 0 && errno == ETIMEDOUT) {
		atomic_store(&b->sh->d_sleep, 0);
		return -ETIMEDOUT;
	}
	return 0; /* woken, or the word had changed (EAGAIN), or a signal (EINTR) */
}

int bring_client_release(struct bring *b, uint64_t lease)
{
	uint64_t t = atomic_load_explicit(&b->sh->r_tail, memory_order_acquire);

	if (b->r_head - t >= b->rcap)
		return -ENOSPC;
	atomic_store_explicit(&b->rel[b->r_head & (b->rcap - 1)], lease, memory_order_relaxed);
	b->r_head++;
	atomic_store(&b->sh->r_head, b->r_head);
	return atomic_exchange(&b->sh->r_sleep, 0) != 0;
}

/* --- the trainer's figures ---------------------------------------------- */

/* A sequence lock: the count goes odd, the figures are written, it goes
 * even; a reader that saw the same even count before and after its copy
 * has figures from one write. */
void bring_client_stats(struct bring *b, uint64_t wait_ns, uint64_t compute_ns, uint64_t calls,
                        const uint64_t *buckets)
{
	struct bring_stats *st = &b->sh->st;
	/* on from the count there, whatever wrote it last: the daemon reads
	 * only a count it has not read */
	uint64_t odd = atomic_load_explicit(&st->seq, memory_order_relaxed) | 1;

	atomic_store_explicit(&st->seq, odd, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	atomic_store_explicit(&st->wait_ns, wait_ns, memory_order_relaxed);
	atomic_store_explicit(&st->compute_ns, compute_ns, memory_order_relaxed);
	atomic_store_explicit(&st->calls, calls, memory_order_relaxed);
	for (size_t i = 0; i < BRING_STAT_BUCKETS; i++)
		atomic_store_explicit(&st->buckets[i], buckets[i], memory_order_relaxed);
	atomic_store_explicit(&st->seq, odd + 1, memory_order_release);
}

int bring_daemon_stats(struct bring *b, uint64_t wait_compute_calls[3], uint64_t *buckets)
{
	struct bring_stats *st = &b->sh->st;
	uint64_t seq = atomic_load_explicit(&st->seq, memory_order_acquire);

	if (!(b->flags & BRING_F_STATS) || seq == 0 || (seq & 1) || seq == b->st_seq)
		return 0;
	wait_compute_calls[0] = atomic_load_explicit(&st->wait_ns, memory_order_relaxed);
	wait_compute_calls[1] = atomic_load_explicit(&st->compute_ns, memory_order_relaxed);
	wait_compute_calls[2] = atomic_load_explicit(&st->calls, memory_order_relaxed);
	for (size_t i = 0; i < BRING_STAT_BUCKETS; i++)
		buckets[i] = atomic_load_explicit(&st->buckets[i], memory_order_relaxed);
	atomic_thread_fence(memory_order_acquire);
	if (atomic_load_explicit(&st->seq, memory_order_relaxed) != seq)
		return 0;
	b->st_seq = seq;
	return 1;
}
