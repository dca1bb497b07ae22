/* SPDX-License-Identifier: MIT */
/* libloader: the client's own thread: it tops the windows up off the trainer's
 * path, sends the releases left FLUSH_DELAY_MS after the first, and runs a
 * reconnection; queue_release() hands it a lease.
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

/* Hand @lease back with the next request. Called with c->lock held. */
void queue_release(struct ldr_attachment *a, uint64_t lease)
{
	struct ldr_client *c = a->c;

	if (a->detached || a->lost)
		return;
	/* through the batch ring: nothing to send, unless the ring does not
	 * carry the trainer's figures (an older daemon's): then the flusher
	 * sends a Release, with no lease, for those of the batch just done */
	if (a->ringed && ring_release(a, lease)) {
		if (ring_has_stats(a))
			return;
		goto flush;
	}
	/* Never full: a lease is a slot, and rel_reserve() made room for
	 * every slot at the attach, so no allocation here can fail and lose
	 * a lease (the daemon would never get its slot back). Only a daemon
	 * that leases one slot twice over would need more. */
	if (a->nrel == a->relcap && rel_reserve(a, (uint32_t)a->relcap * 2 + 16) < 0)
		a->rel_lost++;
	else
		a->rel[a->nrel++] = lease;
flush:
	if (!c->flush_wanted && c->flusher_running) {
		c->flush_wanted = true;
		if (c->flusher_idle)
			pthread_cond_signal(&c->flush_cond);
	}
}

int rel_reserve(struct ldr_attachment *a, uint32_t nslots)
{
	uint64_t *n;

	if (nslots <= a->relcap)
		return 0;
	if (!(n = realloc(a->rel, nslots * sizeof(*n))))
		return -ENOMEM;
	a->rel = n;
	a->relcap = nslots;
	return 0;
}

/* Send the queued releases now rather than in FLUSH_DELAY_MS (the relreq
 * callback sends what came meanwhile). Called with c->lock held. */
void flush_now(struct ldr_attachment *a)
{
	if (a->nrel && !a->detached && !a->c->disconnected && a->relreq.open &&
	    a->relreq.state == REQ_IDLE)
		req_send(a, &a->relreq, 0);
}
