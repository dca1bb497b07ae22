/* SPDX-License-Identifier: MIT */
/* test-bring - the batch ring (common/bring.c) between two real processes
 *
 * The daemon's end in this process, the client's in a forked child that maps
 * the memfd as libloader would: every delivery arrives exactly, in order,
 * through a ring far smaller than the stream (it wraps many times), and every
 * lease comes back exactly, with the futex and eventfd wake-ups of sides that
 * sleep. Then a client that scribbles on its ring: each kind of garbage the
 * daemon reads is refused with the message naming it, and the sizes cannot
 * change under the daemon (the memfd is sealed). And the trainer's figures,
 * rewritten by the client while the daemon reads them: each read is whole.
 */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bring.h"

#define N 20000

static struct bring_desc desc_of(uint64_t i)
{
	return (struct bring_desc){ .seq = i, .lease = 1000 + i, .epoch = i / 97, .index = i % 97,
		.slot = (uint32_t)(i % 8), .rows = (uint32_t)(1 + i % 32), .kind = BRING_BATCH,
		.share = 8 };
}

/* A second fd of the same memfd, as the fd channel hands one to a client. */
static int reopen(int fd, int flags)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return open(path, flags | O_CLOEXEC);
}

/* The client: take every delivery, check it, release its lease. */
static int client_main(int fd, uint64_t size, int efd)
{
	struct bring c;
	struct bring_desc d;
	char err[256];
	uint64_t want = 0, sleeps = 0;
	int r;

	if (bring_map(&c, fd, size, err, sizeof(err)) < 0) {
		fprintf(stderr, "client: %s\n", err);
		return 2;
	}
	for (;;) {
		r = bring_client_get(&c, &d);
		if (r < 0)
			return 3;
		if (r == 0) {
			sleeps++;
			if (bring_client_wait(&c, c.d_tail, 10000) == -ETIMEDOUT) {
				fprintf(stderr, "client: no delivery %" PRIu64 " within 10 s\n", want);
				return 4;
			}
			continue;
		}
		if (d.kind == BRING_END) {
			if (d.seq != N)
				return 5;
			break;
		}
		struct bring_desc e = desc_of(want);
		if (memcmp(&d, &e, sizeof(d)) != 0) {
			fprintf(stderr, "client: delivery %" PRIu64 " differs (seq %" PRIu64 ")\n", want, d.seq);
			return 6;
		}
		want++;
		while ((r = bring_client_release(&c, d.lease)) == -ENOSPC)
			usleep(50);
		if (r == 1 && eventfd_write(efd, 1) < 0)
			return 7;
	}
	fprintf(stderr, "client: %" PRIu64 " deliveries, slept %" PRIu64 " times\n", want, sleeps);
	bring_close(&c);
	return want == N ? 0 : 8;
}

static void test_two_processes(void)
{
	struct bring d;
	char err[256];
	uint64_t put = 0, back = 0, wakes = 0, waits = 0, leases[64];
	size_t n;
	int efd, cfd, status;
	bool ended = false, pause = false;
	pid_t pid;

	assert(bring_create(&d, 8, 4, err, sizeof(err)) == 0);
	efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	assert(efd >= 0);
	cfd = reopen(d.fd, O_RDWR);
	assert(cfd >= 0);
	pid = fork();
	assert(pid >= 0);
	if (pid == 0)
		_exit(client_main(cfd, d.bytes, efd));
	close(cfd);
	while (back < N || !ended) {
		bool progress = false;
		assert(bring_daemon_tail(&d, err, sizeof(err)) == 0);
		while (bring_daemon_space(&d) > 0 && put < N && !pause) {
			struct bring_desc x = desc_of(put++);
			bring_daemon_put(&d, &x);
			progress = true;
			pause = put % 1000 == 0;
		}
		if (pause && put < N && !progress) {
			pause = false;
			/* every 1000: wait until the client, out of deliveries,
			 * sleeps; the next publish must wake it */
			while (!atomic_load(&d.sh->d_sleep)) {
				assert(bring_daemon_take(&d, leases, 64, &n, err, sizeof(err)) == 0);
				for (size_t i = 0; i < n; i++)
					assert(leases[i] == 1000 + back++);
				usleep(100);
			}
			struct bring_desc x = desc_of(put++);
			bring_daemon_put(&d, &x);
			assert(bring_daemon_publish(&d));
			bring_wake_client(&d);
			wakes++;
			continue;
		}
		if (put == N && !ended && bring_daemon_space(&d) > 0) {
			bring_daemon_put(&d, &(struct bring_desc){ .seq = N, .kind = BRING_END });
			ended = progress = true;
		}
		if (progress && bring_daemon_publish(&d)) {
			bring_wake_client(&d);
			wakes++;
		}
		assert(bring_daemon_take(&d, leases, 64, &n, err, sizeof(err)) == 0);
		for (size_t i = 0; i < n; i++)
			assert(leases[i] == 1000 + back++);
		if (n || progress)
			continue;
		/* nothing to do: sleep on the eventfd, having said so */
		bring_daemon_sleep(&d);
		assert(bring_daemon_take(&d, leases, 64, &n, err, sizeof(err)) == 0);
		for (size_t i = 0; i < n; i++)
			assert(leases[i] == 1000 + back++);
		if (n)
			continue;
		struct pollfd p = { .fd = efd, .events = POLLIN };
		waits++;
		if (poll(&p, 1, 10000) != 1) {
			fprintf(stderr, "daemon: no release after %" PRIu64 " of %d\n", back, N);
			abort();
		}
		eventfd_t v;
		eventfd_read(efd, &v);
	}
	assert(waitpid(pid, &status, 0) == pid);
	assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert(back == N);
	assert(wakes >= N / 1000 - 1); /* each pause's, and any other */
	printf("two processes: %d deliveries through 8 entries, %d leases back through 4; "
	       "%" PRIu64 " client wakes, %" PRIu64 " daemon waits\n", N, N, wakes, waits);
	close(efd);
	bring_close(&d);
}

/* What a client may write, and what the daemon says of it. */
static void test_garbage(void)
{
	struct bring d, c;
	struct bring_desc x;
	char err[256];
	uint64_t leases[8];
	size_t n;
	int cfd;

	assert(bring_create(&d, 4, 4, err, sizeof(err)) == 0);
	cfd = reopen(d.fd, O_RDWR);
	assert(bring_map(&c, cfd, d.bytes, err, sizeof(err)) == 0);
	for (uint64_t i = 0; i < 3; i++) {
		x = desc_of(i);
		bring_daemon_put(&d, &x);
	}
	assert(!bring_daemon_publish(&d));

	/* the delivery tail past the head, then backwards */
	atomic_store(&c.sh->d_tail, 5);
	assert(bring_daemon_tail(&d, err, sizeof(err)) == -EPROTO);
	assert(strcmp(err, "batch ring: the delivery tail 5 is past the 3 deliveries written") == 0);
	atomic_store(&c.sh->d_tail, 2);
	assert(bring_daemon_tail(&d, err, sizeof(err)) == 0);
	assert(bring_daemon_space(&d) == 3);
	atomic_store(&c.sh->d_tail, 1);
	assert(bring_daemon_tail(&d, err, sizeof(err)) == -EPROTO);
	assert(strcmp(err, "batch ring: the delivery tail moved back from 2 to 1") == 0);

	/* a release head far past the ring, then one that moves backwards */
	atomic_store(&c.sh->r_head, 1ull << 40);
	assert(bring_daemon_take(&d, leases, 8, &n, err, sizeof(err)) == -EPROTO && n == 0);
	assert(strcmp(err, "batch ring: the release head 1099511627776 is 1099511627776 entries past "
	                   "the 0 read, beyond the ring's 4") == 0);
	atomic_store(&c.sh->r_head, 0);
	assert(bring_client_release(&c, 7) == 0);
	assert(bring_client_release(&c, 8) == 0);
	assert(bring_daemon_take(&d, leases, 8, &n, err, sizeof(err)) == 0);
	assert(n == 2 && leases[0] == 7 && leases[1] == 8);
	atomic_store(&c.sh->r_head, 1);
	assert(bring_daemon_take(&d, leases, 8, &n, err, sizeof(err)) == -EPROTO);
	assert(strcmp(err, "batch ring: the release head moved back to 1, below the 2 releases read") == 0);

	/* scribbled counters the daemon never reads back cannot fool it: its
	 * own delivery head counts, whatever the mapping says */
	atomic_store(&c.sh->d_head, 999);
	atomic_store(&c.sh->d_tail, 3);
	assert(bring_daemon_tail(&d, err, sizeof(err)) == 0 && bring_daemon_space(&d) == 4);
	atomic_store(&c.sh->d_tail, 4);
	assert(bring_daemon_tail(&d, err, sizeof(err)) == -EPROTO);
	assert(strcmp(err, "batch ring: the delivery tail 4 is past the 3 deliveries written") == 0);

	/* the ring's size is sealed: a client cannot make the daemon fault */
	assert(ftruncate(cfd, 4096) < 0 && errno == EPERM);
	assert(ftruncate(cfd, (off_t)d.bytes * 2) < 0 && errno == EPERM);
	assert(fcntl(cfd, F_ADD_SEALS, F_SEAL_WRITE) < 0 && errno == EPERM);
	bring_close(&c);
	bring_close(&d);
	printf("garbage: each refused with its message; the size sealed\n");
}

static void test_bad_rings(void)
{
	struct bring d, c;
	char err[256];
	int fd;

	assert(bring_create(&d, 3, 4, err, sizeof(err)) == -EINVAL);
	assert(strcmp(err, "batch ring of 3 deliveries and 4 releases: each must be a power of two "
	                   "from 1 to 4096") == 0);
	assert(bring_create(&d, 8, 8, err, sizeof(err)) == 0);
	fd = reopen(d.fd, O_RDWR);
	assert(bring_map(&c, fd, d.bytes + 4096, err, sizeof(err)) == -EPROTO);
	assert(strcmp(err, "batch ring: the fd holds 24576 bytes, not the 28672 announced") == 0);
	d.sh->magic = 0;
	assert(bring_map(&c, fd, d.bytes, err, sizeof(err)) == -EPROTO);
	assert(strstr(err, "bad header (magic 0 version 1, 8 deliveries, 8 releases") != NULL);
	assert(bring_map(&c, fd, 100, err, sizeof(err)) == -EPROTO);
	assert(strcmp(err, "batch ring of 100 bytes: not a ring's size") == 0);
	close(fd);
	bring_close(&d);
	printf("bad rings: refused by name\n");
}

/* An empty ring's wait times out; a publish wakes it at once. */
static void test_wait(void)
{
	struct bring d, c;
	struct bring_desc x = desc_of(0), y;
	char err[256];

	assert(bring_create(&d, 2, 2, err, sizeof(err)) == 0);
	assert(bring_map(&c, reopen(d.fd, O_RDWR), d.bytes, err, sizeof(err)) == 0);
	assert(bring_client_get(&c, &y) == 0);
	assert(bring_client_wait(&c, c.d_tail, 20) == -ETIMEDOUT);
	assert(atomic_load(&c.sh->d_sleep) == 0);
	bring_daemon_put(&d, &x);
	assert(!bring_daemon_publish(&d)); /* nobody sleeps */
	assert(bring_client_wait(&c, c.d_tail, 20) == 0);
	assert(bring_client_get(&c, &y) == 1 && memcmp(&x, &y, sizeof(x)) == 0);
	bring_close(&c);
	bring_close(&d);
	printf("wait: times out empty, returns at once when published\n");
}

/* The trainer's figures, as libloader writes them after each ldr_next(). */
#define STAT_WRITES 300000

static void stats_of(uint64_t i, uint64_t v[3], uint64_t *buckets)
{
	memset(buckets, 0, BRING_STAT_BUCKETS * sizeof(*buckets));
	/* i calls, spread over the buckets: they add up to calls */
	for (uint64_t k = 0; k < BRING_STAT_BUCKETS; k++)
		buckets[k] = i / BRING_STAT_BUCKETS + (k < i % BRING_STAT_BUCKETS);
	v[0] = 3 * i;
	v[1] = 5 * i;
	v[2] = i;
}

/*
 * A client process rewrites its figures STAT_WRITES times as fast as it can
 * while the daemon reads them: every read the daemon takes is one whole
 * write (calls = the buckets' sum, wait and compute of the same write),
 * reads never go back, and the last read is the last write, exactly. A ring
 * the client never wrote has nothing to read; a count left odd (a client
 * stopped mid-write, or lying) reads as nothing new.
 */
static void test_stats(void)
{
	struct bring d;
	char err[256];
	uint64_t v[3], b[BRING_STAT_BUCKETS], w[3], wb[BRING_STAT_BUCKETS], last = 0, reads = 0;
	int cfd, status;
	pid_t pid;

	assert(bring_create(&d, 8, 8, err, sizeof(err)) == 0);
	assert(d.sh->flags == BRING_F_STATS);
	assert(bring_daemon_stats(&d, v, b) == 0); /* nothing written yet */
	cfd = reopen(d.fd, O_RDWR);
	assert(cfd >= 0);
	pid = fork();
	assert(pid >= 0);
	if (pid == 0) {
		struct bring c;
		if (bring_map(&c, cfd, d.bytes, err, sizeof(err)) < 0 || !(c.flags & BRING_F_STATS))
			_exit(2);
		for (uint64_t i = 1; i <= STAT_WRITES; i++) {
			stats_of(i, w, wb);
			bring_client_stats(&c, w[0], w[1], w[2], wb);
		}
		_exit(0);
	}
	close(cfd);
	for (;;) {
		bool done = waitpid(pid, &status, WNOHANG) == pid;
		if (bring_daemon_stats(&d, v, b) == 1) {
			uint64_t sum = 0;
			for (size_t k = 0; k < BRING_STAT_BUCKETS; k++)
				sum += b[k];
			stats_of(v[2], w, wb);
			assert(v[2] >= last && v[2] >= 1 && v[2] <= STAT_WRITES);
			assert(sum == v[2] && memcmp(v, w, sizeof(w)) == 0 && memcmp(b, wb, sizeof(b)) == 0);
			last = v[2];
			reads++;
		}
		if (done)
			break;
	}
	assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	if (bring_daemon_stats(&d, v, b) == 1)
		last = v[2];
	assert(last == STAT_WRITES);
	assert(bring_daemon_stats(&d, v, b) == 0); /* nothing new */
	/* a writer stopped mid-write: its count stays odd, nothing is read */
	atomic_store(&d.sh->st.seq, atomic_load(&d.sh->st.seq) + 1);
	atomic_store(&d.sh->st.calls, 7);
	assert(bring_daemon_stats(&d, v, b) == 0);
	/* the next write goes on after the count there, odd or not */
	struct bring c;
	assert(bring_map(&c, reopen(d.fd, O_RDWR), d.bytes, err, sizeof(err)) == 0);
	stats_of(STAT_WRITES + 1, w, wb);
	bring_client_stats(&c, w[0], w[1], w[2], wb);
	assert(atomic_load(&d.sh->st.seq) % 2 == 0);
	assert(bring_daemon_stats(&d, v, b) == 1 && v[2] == STAT_WRITES + 1);
	bring_close(&c);
	bring_close(&d);
	printf("stats: %d writes, %" PRIu64 " whole reads, the last exact\n", STAT_WRITES, reads);
}

int main(void)
{
	test_stats();
	test_bad_rings();
	test_garbage();
	test_wait();
	test_two_processes();
	printf("ok\n");
	return 0;
}
