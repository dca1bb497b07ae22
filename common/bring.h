/* SPDX-License-Identifier: MIT */
/* bring - the batch ring: an attachment's deliveries and releases in shared
 * memory, shared by daemon and libloader
 *
 * One memfd per attachment, made by the daemon and sealed so that its size
 * can never change (a client that could shrink it would make the daemon's
 * next access a SIGBUS), mapped read-write by the daemon and by the client
 * process that redeemed the attachment's fd-channel token. It holds two
 * single-producer single-consumer rings (the shape of io_uring's and
 * PipeWire's):
 *   deliveries: the daemon writes batch descriptors, the client takes them;
 *   releases:   the client writes lease ids, the daemon reads them.
 * Each head and tail counts entries since the ring was made (64 bits: they
 * do not wrap); entry n lies at n % cap, cap a power of two. The producer
 * writes the entry, then stores its head with release order; the consumer
 * loads the head with acquire order, reads the entry, then stores its tail
 * with release order. A side that finds its ring full or empty makes no
 * syscall to find out.
 *
 * The client can write every byte of the mapping, so the daemon trusts none
 * of it: it keeps its own copies of what it writes (the delivery head, the
 * release tail, the sizes) and only ever reads the client's counters and
 * release entries, each checked against those copies
 * (bring_daemon_tail(), bring_daemon_take()): a counter that moves backwards
 * or past the other side's is an error naming the values, and the daemon
 * drops that attachment. A client's garbage reaches nobody else: every
 * attachment has its own memfd, and only its client and the daemon hold it.
 *
 * Waking: a consumer that finds its ring empty says so in its sleep word
 * (sequentially consistent), looks again, and only then sleeps: the client
 * on a futex (FUTEX_WAIT on d_wake, shared: the word lies in a memfd), the
 * daemon's loop on the attachment's eventfd. A producer publishes its head,
 * then (sequentially consistent) swaps the other side's sleep word to 0 and
 * wakes it only when it was set: one syscall per sleep, none while both run.
 *
 * The trainer's stall figures (TrainerStats, docs/protocol.md) lie in the
 * header too, when the daemon says it reads them there (BRING_F_STATS in
 * flags; a daemon before it leaves the word 0 and the client sends them on
 * the socket): libloader rewrites them after each ldr_next() under a
 * sequence count (odd while it writes), and the daemon reads them when it
 * shows them (status, /metrics, its once-a-second snapshots). So the batch
 * path sends no message at all while the pipeline is ahead. What the daemon
 * reads there is only ever the client's own figures, checked as a socket
 * report is (daemon/engine/stats.c): garbage is counted in its bad_reports, a count
 * left odd leaves its figures where they were.
 *
 * Layout (offsets in the mapping): struct bring_shared at 0 (the counters on
 * cache lines of their own), the message of the last error delivery at
 * BRING_MSG_OFF, the deliveries at BRING_DESC_OFF, then the releases.
 */
#pragma once

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BRING_MAGIC 0x474e524cu /* "LRNG" */
#define BRING_VERSION 1
#define BRING_MSG_OFF 4096
#define BRING_MSG_BYTES 16384   /* a Python worker's traceback fits */
#define BRING_DESC_OFF (BRING_MSG_OFF + BRING_MSG_BYTES)
#define BRING_CAP_MAX 4096      /* entries of either ring at most */

/* BRING_FAILED: the batch at (epoch, index) failed to build (on_error
 * "raise"): err and the text at BRING_MSG_OFF say why, there is no lease nor
 * slot; the daemon delivers nothing after it until the client took it. */
enum bring_kind { BRING_BATCH = 1, BRING_END = 2, BRING_ERROR = 3, BRING_FAILED = 4 };

/* bring_shared.flags: what the daemon that made the ring reads in it */
#define BRING_F_STATS 1u        /* the trainer's figures, in st */
#define BRING_STAT_BUCKETS 23   /* = WAIT_BUCKETS (common.h) */

/* The trainer's TrainerStats, totals since the attach (client-written). */
struct bring_stats {
	_Atomic uint64_t seq;     /* odd while the client writes; 0: nothing yet */
	_Atomic uint64_t wait_ns, compute_ns, calls;
	_Atomic uint64_t buckets[BRING_STAT_BUCKETS];
};

/* One delivery (64 bytes): what a Batches reply's Batch says, or its end. */
struct bring_desc {
	uint64_t seq;             /* the attachment's delivery number */
	uint64_t lease;
	uint64_t epoch;
	uint64_t index;
	uint32_t slot;
	uint32_t rows;
	uint32_t kind;            /* enum bring_kind */
	int32_t err;              /* BRING_ERROR, _FAILED: a positive errno; the text at BRING_MSG_OFF */
	uint32_t share;           /* BRING_BATCH: leases the attachment may hold now */
	uint32_t reserved[3];
};

struct bring_shared {
	uint32_t magic, version;
	uint32_t dcap, rcap;      /* entries of the delivery and release rings */
	uint64_t bytes;           /* of the mapping */
	uint32_t flags;           /* BRING_F_* (the daemon's, fixed at creation) */
	/* the daemon writes these */
	alignas(64) _Atomic uint64_t d_head;   /* deliveries published */
	_Atomic uint64_t r_tail;  /* releases read */
	/* the client writes these */
	alignas(64) _Atomic uint64_t d_tail;   /* deliveries taken out of the ring */
	_Atomic uint64_t r_head;  /* releases published */
	/* written by both: who sleeps, and the client's futex */
	alignas(64) _Atomic uint32_t d_sleep;  /* the client sleeps on d_wake */
	_Atomic uint32_t d_wake;  /* bumped by the daemon to wake it */
	_Atomic uint32_t r_sleep; /* the daemon waits on its eventfd for releases */
	_Atomic uint64_t d_room;  /* the daemon waits until the client's d_tail reaches this (0 no) */
	/* the daemon writes these: releases it could not apply (the attachment
	 * had ended), and the message of the last such (before the count) */
	alignas(64) _Atomic uint64_t r_refused;
	char r_msg[256];
	/* the client writes these (BRING_F_STATS) */
	alignas(64) struct bring_stats st;   /* at 576 (docs/protocol.md) */
};

/* One side's view of a ring: the mapping and its own counts. */
struct bring {
	struct bring_shared *sh;
	struct bring_desc *desc;
	_Atomic uint64_t *rel;
	char *msg;
	size_t bytes;
	uint32_t dcap, rcap;
	uint32_t flags;           /* the header's, as mapped */
	uint64_t st_seq;          /* the daemon's: the stats count it read last */
	int fd;                   /* the memfd (the daemon's; the client's once mapped) */
	/* what this side wrote, or last read and checked, of the counters */
	uint64_t d_head, d_tail, r_head, r_tail;
};

/* Bytes of a ring of @dcap deliveries and @rcap releases. */
size_t bring_bytes(uint32_t dcap, uint32_t rcap);

/*
 * The daemon's end. bring_create(): a sealed memfd of bring_bytes(), mapped
 * and initialized; @dcap and @rcap powers of two up to BRING_CAP_MAX.
 * bring_daemon_tail(): the client's delivery tail, checked (-EPROTO with
 * @err naming what is wrong); then bring_daemon_space() entries may be put.
 * bring_daemon_put() writes one delivery (the ring must have space);
 * bring_daemon_publish() makes those put visible and returns true when the
 * client sleeps (the caller then calls bring_wake_client()).
 * bring_daemon_take(): up to @max leases the client released, into @out
 * (*@n of them), checked; before it waits for the eventfd the daemon calls
 * bring_daemon_sleep() and takes again.
 */
int bring_create(struct bring *b, uint32_t dcap, uint32_t rcap, char *err, size_t errlen);
int bring_daemon_tail(struct bring *b, char *err, size_t errlen);
uint32_t bring_daemon_space(const struct bring *b);
void bring_daemon_put(struct bring *b, const struct bring_desc *d);
bool bring_daemon_publish(struct bring *b);
void bring_wake_client(struct bring *b);
int bring_daemon_take(struct bring *b, uint64_t *out, size_t max, size_t *n, char *err,
                      size_t errlen);
void bring_daemon_sleep(struct bring *b);
/* The daemon waits (on its eventfd) until the client has taken deliveries up
 * to @at; it checks the tail again after this (bring_daemon_tail()). */
void bring_daemon_want_room(struct bring *b, uint64_t at);

/*
 * The client's end. bring_map(): map @fd of @size bytes (the fd channel's),
 * its header checked against the size (-EPROTO naming what is wrong).
 * bring_client_get(): the next delivery into @out: 1, 0 when the ring is
 * empty, -EPROTO when the daemon's head is beyond what the ring holds;
 * bring_client_peek() the same without taking it, bring_client_next() takes
 * it (an error's text at b->msg stays until then) and returns true when the
 * daemon waits for that (bring_daemon_want_room(): wake it).
 * bring_client_wait(): sleep until the daemon publishes past @tail (a
 * snapshot of b->d_tail) or someone calls bring_wake_client(), at most
 * @timeout_ms (-1 forever: else -ETIMEDOUT); at once if it did meanwhile.
 * bring_client_release(): publish @lease: 1 when the daemon sleeps and must
 * be woken (its eventfd), 0, -ENOSPC when the ring is full.
 */
int bring_map(struct bring *b, int fd, uint64_t size, char *err, size_t errlen);
int bring_client_get(struct bring *b, struct bring_desc *out);
int bring_client_peek(const struct bring *b, struct bring_desc *out);
bool bring_client_next(struct bring *b);
int bring_client_wait(struct bring *b, uint64_t tail, int timeout_ms);
int bring_client_release(struct bring *b, uint64_t lease);

/*
 * The trainer's figures (BRING_F_STATS). bring_client_stats(): the client
 * publishes its totals (@buckets: BRING_STAT_BUCKETS of them); one thread at
 * a time. bring_daemon_stats(): the daemon copies them into @wait_compute_calls
 * and @buckets: 1 when they changed since its last read, 0 when they did not
 * or the client is writing them now (a later read gets them).
 */
void bring_client_stats(struct bring *b, uint64_t wait_ns, uint64_t compute_ns, uint64_t calls,
                        const uint64_t *buckets);
int bring_daemon_stats(struct bring *b, uint64_t wait_compute_calls[3], uint64_t *buckets);

/* Unmap and close (either end). */
void bring_close(struct bring *b);
