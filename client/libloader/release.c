/* SPDX-License-Identifier: MIT */
/* libloader: an attachment's queue of releases (a->rel): queue_release()
 * hands a lease back, through the batch ring or with the next request, and
 * wakes the flusher (flusher.c) through c->flush_cond to send what is left;
 * flush_now() sends it at once.
 *
 * Below the files that release (next.c, keep.c, cudawait.c) and those that
 * attach and re-attach (attach.c, reconnect.c reserve its room); it calls
 * only the ring and the request it sends, never the flusher's thread, so
 * that the flusher can run a reconnection that calls back into here.
 */
#include "libloader-private.h"

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
