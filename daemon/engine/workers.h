/* SPDX-License-Identifier: MIT */
/* workers - the daemon's own worker threads */
#pragma once

#include <stdatomic.h>
#include <stdint.h>

/*
 * A queue of works that shares the pool fairly by time with the other
 * queues: the pool runs next a work of the queue that has had the least
 * worker time, as its owner reports what its works cost
 * (workers_queue_cost()). So a pipeline with many slow works queued (batches
 * of large images) does not hold back one whose works are quick (token
 * windows): the quick one's works run as soon as a worker is free, and each
 * of two busy pipelines gets half the workers' time. Queues that report no
 * cost take turns, one work each. Zero-initialized is ready; it must outlive
 * its queued works.
 */
struct work_queue {
	struct work *head, *tail;
	struct work_queue *next;  /* in the pool's list of queues with works */
	int linked;
	uint64_t vtime;           /* worker ns it was given (estimated), under the pool's lock */
	_Atomic uint64_t cost_ns; /* what one of its works costs, a running mean */
};

/* One work of @q took @ns: the queue's cost estimate follows (any thread,
 * while @q lives: a work reports before it signals its completion). */
void workers_queue_cost(struct work_queue *q, uint64_t ns);

struct work {
	struct work *next;
	void (*fn)(struct work *work);
	struct work_queue *queue; /* whose turn it takes; NULL: the pool's own queue */
};

struct workers;

/* Most threads a pool may have (the config's "workers" key, --workers). */
#define WORKERS_MAX 1024

/* Start @n threads (1..WORKERS_MAX). */
int workers_new(struct workers **out, unsigned n);
/*
 * workers_resize() - make the pool @n threads (1..WORKERS_MAX), now.
 * A shrink lets the threads that leave finish the task they run; nothing
 * queued is dropped. The loop thread only (with workers_count()).
 * Return: 0, -EINVAL out of range, or -errno when fewer threads could be
 * started (the pool then has what started).
 */
int workers_resize(struct workers *w, unsigned n);
/* Queue @work (on work->queue); some worker runs work->fn(work) once. Any
 * thread may call it. */
void workers_submit(struct workers *w, struct work *work);
unsigned workers_count(const struct workers *w);
/*
 * Run what is queued, then stop, joining the threads for at most @ms: 0 and
 * @w freed, or -ETIMEDOUT with *@stuck threads still in their work (a read
 * of a file that does not answer): @w is then left to the process's exit,
 * and nothing they use may be freed.
 */
int workers_stop_within(struct workers *w, unsigned ms, unsigned *stuck);
/* Run what is queued, then stop and join the threads. NULL is fine. */
struct workers *workers_free(struct workers *w);
