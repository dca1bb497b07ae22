/* SPDX-License-Identifier: MIT */
/* libloader: the client's own thread: it tops the windows up off the trainer's
 * path, sends the releases left FLUSH_DELAY_MS after the first, and runs a
 * reconnection. The releases it sends are queued by release.c, which wakes it
 * through c->flush_cond and never calls it.
 */
#include "libloader-private.h"

/*
 * The client's own thread. It sends the Next requests that ldr_next() makes
 * room for, so that a trainer's next() only takes a batch that is already here
 * and never waits on a socket write. And it returns leases: they normally ride
 * on the next Next, but a trainer that stops asking (end of an epoch, a batch
 * kept past the loop) must still give its slots back soon, so what is left is
 * sent FLUSH_DELAY_MS after the first pending release. It wakes at most once
 * per delay for releases, however fast batches go.
 */
void *flusher_main(void *arg)
{
	struct ldr_client *c = arg;
	struct timespec deadline;
	bool timing = false;

	pthread_mutex_lock(&c->lock);
	while (!c->flusher_stop) {
		if (c->reconnect_wanted) {
			c->reconnect_wanted = false;
			pthread_mutex_unlock(&c->lock);
			reconnect_run(c);
			pthread_mutex_lock(&c->lock);
			continue;
		}
		if (c->topup_wanted) {
			c->topup_wanted = false;
			for (struct ldr_attachment *a = c->atts; a; a = a->next)
				top_up(a);
			continue;
		}
		if (!c->flush_wanted) {
			c->flusher_idle = true;
			pthread_cond_wait(&c->flush_cond, &c->lock);
			c->flusher_idle = false;
			continue;
		}
		if (!timing) {
			deadline_after(&deadline, FLUSH_DELAY_MS);
			timing = true;
		}
		if (pthread_cond_timedwait(&c->flush_cond, &c->lock, &deadline) != ETIMEDOUT)
			continue; /* a top-up, or stop */
		timing = false;
		c->flush_wanted = false;
		for (struct ldr_attachment *a = c->atts; a; a = a->next)
			if ((a->nrel || ring_stats_due(a)) && !a->detached && !c->disconnected &&
			    a->relreq.state == REQ_IDLE)
				req_send(a, &a->relreq, 0);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}
