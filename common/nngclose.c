/* SPDX-License-Identifier: MIT */
/* nngclose - nng_close() with a time limit */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "nngclose.h"

struct closer {
	nng_socket sock;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	atomic_int refs;          /* the waiter and the closing thread */
};

static void closer_unref(struct closer *cl)
{
	if (atomic_fetch_sub(&cl->refs, 1) != 1)
		return;
	pthread_cond_destroy(&cl->cond);
	pthread_mutex_destroy(&cl->lock);
	free(cl);
}

static void *closer_main(void *arg)
{
	struct closer *cl = arg;

	nng_close(cl->sock);
	pthread_mutex_lock(&cl->lock);
	cl->done = true;
	pthread_cond_signal(&cl->cond);
	pthread_mutex_unlock(&cl->lock);
	closer_unref(cl);
	return NULL;
}

bool nng_close_within(nng_socket sock, int ms)
{
	struct closer *cl = calloc(1, sizeof(*cl));
	pthread_condattr_t ca;
	struct timespec deadline;
	pthread_t t;
	bool done;

	if (!cl) {
		nng_close(sock);
		return true;
	}
	cl->sock = sock;
	atomic_init(&cl->refs, 2);
	pthread_mutex_init(&cl->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&cl->cond, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&t, NULL, closer_main, cl) != 0) {
		nng_close(sock);
		cl->refs = 1;
		closer_unref(cl);
		return true;
	}
	pthread_detach(t);
	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += ms / 1000;
	deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (deadline.tv_nsec >= 1000000000L) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&cl->lock);
	while (!cl->done && pthread_cond_timedwait(&cl->cond, &cl->lock, &deadline) != ETIMEDOUT)
		;
	done = cl->done;
	pthread_mutex_unlock(&cl->lock);
	closer_unref(cl);
	return done;
}
