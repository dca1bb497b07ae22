/* SPDX-License-Identifier: MIT */
/* workers - the daemon's own worker threads
 *
 * Decoding and copying run here, not in libuv's shared threadpool: that pool is
 * sized for file system calls and shared with every uv_queue_work user, and its
 * size is fixed per process by an environment variable. A plain FIFO under one
 * mutex is enough: a unit of work is a slice of a batch (tens of microseconds or
 * more), so the lock is not contended.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "creds.h"
#include "workers.h"

struct workers {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct work *head, *tail;
	bool stop;
	unsigned n;
	pthread_t *threads;
};

static void *worker_main(void *arg)
{
	struct workers *w = arg;

	/* dataset files are opened with their pipeline's owner's credentials;
	 * keep them across samples (creds.h) */
	creds_thread_sticky();
	for (;;) {
		struct work *work;

		pthread_mutex_lock(&w->lock);
		while (!w->head && !w->stop)
			pthread_cond_wait(&w->cond, &w->lock);
		work = w->head;
		if (!work) {
			pthread_mutex_unlock(&w->lock);
			return NULL;
		}
		w->head = work->next;
		if (!w->head)
			w->tail = NULL;
		pthread_mutex_unlock(&w->lock);
		work->next = NULL;
		work->fn(work);
	}
}

int workers_new(struct workers **out, unsigned n)
{
	struct workers *w;
	int r;

	if (n < 1)
		return -EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->threads = calloc(n, sizeof(*w->threads));
	if (!w->threads) {
		free(w);
		return -ENOMEM;
	}
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	for (unsigned i = 0; i < n; i++) {
		r = pthread_create(&w->threads[i], NULL, worker_main, w);
		if (r) {
			w->n = i;
			workers_free(w);
			return -r;
		}
		w->n = i + 1;
	}
	*out = w;
	return 0;
}

void workers_submit(struct workers *w, struct work *work)
{
	work->next = NULL;
	pthread_mutex_lock(&w->lock);
	if (w->tail)
		w->tail->next = work;
	else
		w->head = work;
	w->tail = work;
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
	for (unsigned i = 0; i < w->n; i++) {
		if (pthread_timedjoin_np(w->threads[i], NULL, &deadline) != 0)
			w->threads[left++] = w->threads[i]; /* still running: keep it */
	}
	w->n = left;
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
	for (unsigned i = 0; i < w->n; i++)
		pthread_join(w->threads[i], NULL);
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	free(w->threads);
	free(w);
	return NULL;
}
