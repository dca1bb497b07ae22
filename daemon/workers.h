/* SPDX-License-Identifier: MIT */
/* workers - the daemon's own worker threads */
#pragma once

struct work {
	struct work *next;
	void (*fn)(struct work *work);
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
/* Queue @work; some worker runs work->fn(work) once. Any thread may call it. */
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
