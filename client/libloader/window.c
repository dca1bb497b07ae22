/* SPDX-License-Identifier: MIT */
/* libloader: the window of Next requests (top_up()) and their completions
 * (req_cb()), which hand each reply to where it belongs: the deliveries to
 * arrived.c, the watch's to revoke.c. A request is sent by request.c.
 */
#include "libloader-private.h"

/*
 * Keep the window full. The window (ldr_attach_opts.inflight) bounds the
 * deliveries asked for plus those received and not yet taken. A Next asks for
 * up to half the window, so when the daemon is ahead each answer brings several
 * batches and costs one round trip for all of them; two requests stay out, so
 * one is always parked at the daemon while the other's answer travels.
 * Called with c->lock held.
 */
/* Would top_up() send anything? Called with c->lock held. */
bool needs_top_up(const struct ldr_attachment *a)
{
	int half = a->inflight / 2 > 0 ? a->inflight / 2 : 1;
	int budget = a->inflight - a->arrived - a->requested;

	return !a->ringed && budget > 0 && (a->outstanding == 0 || budget >= half);
}

void top_up(struct ldr_attachment *a)
{
	int half = a->inflight / 2 > 0 ? a->inflight / 2 : 1;

	if (a->ringed)
		return; /* the daemon writes deliveries into the ring unasked */
	while (!a->ended && !a->err && !a->detached && !a->c->disconnected && !a->c->daemon_stopping) {
		int budget = a->inflight - a->arrived - a->requested;
		int ask = budget;
		struct req *r = NULL;

		if (budget <= 0 || (a->outstanding > 0 && budget < half))
			return;
		if (a->outstanding == 0 && budget > half)
			ask = half;
		for (int i = 0; i < a->inflight; i++)
			if (a->reqs[i].state == REQ_IDLE) {
				r = &a->reqs[i];
				break;
			}
		if (!r || req_send(a, r, (uint32_t)ask) < 0)
			return;
	}
}

void req_cb(void *arg)
{
	struct req *r = arg;
	struct ldr_attachment *a = r->att;
	struct ldr_client *c = a->c;
	int rv = nng_aio_result(r->aio);

	pthread_mutex_lock(&c->lock);
	if (r->state == REQ_SENDING && rv == 0) {
		r->state = REQ_RECEIVING;
		nng_ctx_recv(r->ctx, r->aio);
		pthread_mutex_unlock(&c->lock);
		return;
	}
	if (r->state == REQ_SENDING) {
		nng_msg *m = nng_aio_get_msg(r->aio);
		if (m)
			nng_msg_free(m);
	}
	Loaderd__Reply *rep = NULL;
	if (rv == 0) {
		nng_msg *m = nng_aio_get_msg(r->aio);
		rep = loaderd__reply__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
		nng_msg_free(m);
	}
	r->state = REQ_IDLE;
	if (r->is_watch) {
		if (watch_reply(a, rep, rv))
			top_up(a);
	} else if (r->is_release) {
		if (rep && rep->body_case == LOADERD__REPLY__BODY_ERROR && !a->detached) {
			/* a refused release is a bug of ours (or the pipeline was
			 * dropped with force), not the trainer's: keep going, but
			 * let it be seen (ldr_attachment_release_refused()) */
			a->rel_refused++;
			snprintf(a->rel_msg, sizeof(a->rel_msg), "%s",
			         rep->error->message && *rep->error->message ? rep->error->message
			                 : error_name(rep->error->code > 0 ? -rep->error->code : -EIO));
		}
		if (a->nrel && !a->detached && !c->disconnected && rv == 0)
			req_send(a, r, 0);
	} else {
		a->outstanding--;
		a->requested -= (int)r->asked;
		store_reply(a, rep, rv);
		if (a->rv_pending)
			answer_revoke(a); /* the room it makes, top_up() fills */
		top_up(a);
	}
	if (rep)
		loaderd__reply__free_unpacked(rep, NULL);
	pthread_cond_broadcast(&c->cond);
	ring_poke(a);
	pthread_mutex_unlock(&c->lock);
}

/* Have the flusher top the windows up. Called with c->lock held. */
void want_top_up(struct ldr_attachment *a)
{
	struct ldr_client *c = a->c;

	/* Nothing left here: the trainer will wait for the answer, so ask now.
	 * Otherwise the flusher asks, off the trainer's path. */
	if (!c->flusher_running || a->arrived == 0) {
		top_up(a);
		return;
	}
	if (!c->topup_wanted) {
		c->topup_wanted = true;
		pthread_cond_signal(&c->flush_cond);
	}
}
