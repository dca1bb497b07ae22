/* SPDX-License-Identifier: MIT */
/* workers - the daemon's own worker threads
 *
 * Decoding and copying run here, not in libuv's shared threadpool: that pool is
 * sized for file system calls and shared with every uv_queue_work user, and its
 * size is fixed per process by an environment variable. Queues under one mutex
 * are enough: a unit of work is a slice of a batch (tens of microseconds or
 * more), so the lock is not contended.
 *
 * Works wait in queues (struct work_queue: one per pipeline, and the pool's
 * own); a free worker takes the first work of the queue with the least
 * worker time so far (workers.h), so pipelines share the pool by time.
 *
 * The pool is resized live (loaderctl set workers, a reload): new threads
 * take from the same queue; a shrink asks that many threads to leave, each
 * after the task it runs, so no queued task is lost or run twice. Threads
 * that left are joined by the next resize or by the stop.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "base/creds.h"
#include "workers.h"

struct workers {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct work_queue own;    /* works without a queue of their own */
	struct work_queue *first; /* queues with works, in the order they came */
	uint64_t vclock;          /* vtime of the queue served last */
	bool stop;
	unsigned n;               /* the pool's size: threads not asked to leave */
	unsigned retire;          /* threads asked to leave, not gone yet */
	pthread_t *threads;       /* every thread not joined yet (nthreads) */
	unsigned nthreads;
	pthread_t *gone;          /* threads that left, to join (ngone) */
	unsigned ngone;
	unsigned cap;             /* of both arrays */
};

/* The next work in turn: the first of the queue that had the least worker
 * time, or NULL when none is queued. Under the lock. */
static struct work *take(struct workers *w)
{
	struct work_queue **pp = NULL, *q;
	uint64_t cost;
	struct work *work;

	for (struct work_queue **p = &w->first; *p; p = &(*p)->next)
		if (!pp || (*p)->vtime < (*pp)->vtime)
			pp = p;
	if (!pp)
		return NULL;
	q = *pp;
	work = q->head;
	q->head = work->next;
	if (!q->head)
		q->tail = NULL;
	cost = atomic_load_explicit(&q->cost_ns, memory_order_relaxed);
	q->vtime += cost ? cost : 1;
	w->vclock = q->vtime;
	if (!q->head) {
		*pp = q->next;
		q->next = NULL;
		q->linked = 0;
	}
	return work;
}

void workers_queue_cost(struct work_queue *q, uint64_t ns)
{
	uint64_t old = atomic_load_explicit(&q->cost_ns, memory_order_relaxed);

	atomic_store_explicit(&q->cost_ns, old ? old - old / 8 + ns / 8 : ns, memory_order_relaxed);
}

static void *worker_main(void *arg)
{
	struct workers *w = arg;

	/* dataset files are opened with their pipeline's owner's credentials;
	 * keep them across samples (creds.h) */
	creds_thread_sticky();
	for (;;) {
		struct work *work;

		pthread_mutex_lock(&w->lock);
		while (!w->first && !w->stop && !w->retire)
			pthread_cond_wait(&w->cond, &w->lock);
		if (w->retire && !w->stop) {
			/* a shrink: the others take the queue from here */
			w->retire--;
			w->gone[w->ngone++] = pthread_self();
			pthread_mutex_unlock(&w->lock);
			return NULL;
		}
		if (!(work = take(w))) {
			pthread_mutex_unlock(&w->lock);
			return NULL;
		}
		pthread_mutex_unlock(&w->lock);
		work->next = NULL;
		work->fn(work);
	}
}

/* Make room for @n threads in both arrays. Under the lock. */
static int workers_reserve(struct workers *w, unsigned n)
{
	pthread_t *t, *g;

	if (n <= w->cap)
		return 0;
	if (!(t = realloc(w->threads, n * sizeof(*t))))
		return -ENOMEM;
	w->threads = t;
	if (!(g = realloc(w->gone, n * sizeof(*g))))
		return -ENOMEM;
	w->gone = g;
	w->cap = n;
	return 0;
}

/* Start threads until the pool has @n. Under the lock. */
static int workers_grow(struct workers *w, unsigned n)
{
	int r;

	if ((r = workers_reserve(w, w->nthreads + (n - w->n))) < 0)
		return r;
	while (w->n < n) {
		r = pthread_create(&w->threads[w->nthreads], NULL, worker_main, w);
		if (r)
			return -r;
		w->nthreads++;
		w->n++;
	}
	return 0;
}

int workers_new(struct workers **out, unsigned n)
{
	struct workers *w;
	int r;

	if (n < 1 || n > WORKERS_MAX)
		return -EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	pthread_mutex_lock(&w->lock);
	r = workers_grow(w, n);
	pthread_mutex_unlock(&w->lock);
	if (r < 0) {
		workers_free(w);
		return r;
	}
	*out = w;
	return 0;
}

int workers_resize(struct workers *w, unsigned n)
{
	pthread_t gone[64];
	unsigned ngone = 0;
	int r = 0;

	if (n < 1 || n > WORKERS_MAX)
		return -EINVAL;
	pthread_mutex_lock(&w->lock);
	/* who left since the last resize: out of the list, joined below */
	while (w->ngone && ngone < sizeof(gone) / sizeof(gone[0])) {
		pthread_t t = w->gone[--w->ngone];
		for (unsigned i = 0; i < w->nthreads; i++)
			if (pthread_equal(w->threads[i], t)) {
				w->threads[i] = w->threads[--w->nthreads];
				break;
			}
		gone[ngone++] = t;
	}
	if (n > w->n) {
		/* threads asked to leave and still here stay instead */
		unsigned keep = w->retire < n - w->n ? w->retire : n - w->n;
		w->retire -= keep;
		w->n += keep;
		r = workers_grow(w, n);
	} else if (n < w->n) {
		w->retire += w->n - n;
		w->n = n;
		pthread_cond_broadcast(&w->cond);
	}
	pthread_mutex_unlock(&w->lock);
	for (unsigned i = 0; i < ngone; i++)
		pthread_join(gone[i], NULL);
	return r;
}

void workers_submit(struct workers *w, struct work *work)
{
	struct work_queue *q = work->queue ? work->queue : &w->own;

	work->next = NULL;
	pthread_mutex_lock(&w->lock);
	if (q->tail)
		q->tail->next = work;
	else
		q->head = work;
	q->tail = work;
	if (!q->linked) {
		struct work_queue **p = &w->first;
		/* a queue that was idle does not get the time it did not use */
		if (q->vtime < w->vclock)
			q->vtime = w->vclock;
		q->linked = 1;
		q->next = NULL;
		while (*p)
			p = &(*p)->next;
		*p = q;
	}
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

unsigned workers_count(const struct workers *w)
{
	return w->n;
}

static void workers_release(struct workers *w)
{
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	free(w->threads);
	free(w->gone);
	free(w);
}

int workers_stop_within(struct workers *w, unsigned ms, unsigned *stuck)
{
	struct timespec deadline;
	unsigned left = 0;

	*stuck = 0;
	if (!w)
		return 0;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += ms / 1000;
	deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (deadline.tv_nsec >= 1000000000L) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000L;
	}
	for (unsigned i = 0; i < w->nthreads; i++) {
		if (pthread_timedjoin_np(w->threads[i], NULL, &deadline) != 0)
			w->threads[left++] = w->threads[i]; /* still running: keep it */
	}
	w->nthreads = left;
	if (left) {
		*stuck = left;
		return -ETIMEDOUT;
	}
	workers_release(w);
	return 0;
}

struct workers *workers_free(struct workers *w)
{
	if (!w)
		return NULL;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	for (unsigned i = 0; i < w->nthreads; i++)
		pthread_join(w->threads[i], NULL);
	workers_release(w);
	return NULL;
}
