/* SPDX-License-Identifier: MIT */
/* libloader: the window of Next requests (top_up()), sending them with the
 * releases they carry, and storing the deliveries of their replies by
 * delivery number (req_cb(), store_reply()).
 */
#include "libloader-private.h"

/* Called with c->lock held. @ask: batches a Next may bring back. */
int req_send(struct ldr_attachment *a, struct req *r, uint32_t ask)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Next next = LOADERD__NEXT__INIT;
	Loaderd__Release rel = LOADERD__RELEASE__INIT;
	Loaderd__TrainerStats st = LOADERD__TRAINER_STATS__INIT;
	nng_msg *msg;
	int e;

	if (r->is_watch) {
		/* no releases: they would wait with it until a Revoke */
		next.attach_id = a->id;
		next.watch = true;
		if (a->has_ret) {
			next.has_return = true;
			next.return_from = a->ret_from;
			next.n_returned = a->nret;
			next.returned = a->ret;
		}
		req.body_case = LOADERD__REQUEST__BODY_NEXT;
		req.next = &next;
	} else if (r->is_release) {
		rel.attach_id = a->id;
		rel.n_leases = a->nrel;
		rel.leases = a->rel;
		rel.stats = stats_report(a, &st, true);
		req.body_case = LOADERD__REQUEST__BODY_RELEASE;
		req.release = &rel;
	} else {
		next.attach_id = a->id;
		next.n_releases = a->nrel;
		next.releases = a->rel;
		next.max_batches = ask;
		next.stats = stats_report(a, &st, false);
		req.body_case = LOADERD__REQUEST__BODY_NEXT;
		req.next = &next;
	}
	if ((e = pack_msg(&req, &msg)) < 0)
		return e;
	if (r->is_watch) {
		a->has_ret = false;
		a->nret = 0;
	} else {
		a->nrel = 0;
	}
	nng_aio_set_msg(r->aio, msg);
	r->state = REQ_SENDING;
	if (!r->is_release && !r->is_watch) {
		r->asked = ask;
		a->outstanding++;
		a->requested += (int)ask;
	}
	nng_ctx_send(r->ctx, r->aio);
	return 0;
}

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

/*
 * A request that failed because the connection went (nng fails it before or
 * after on_pipe_rem() runs) is not an error of its attachment when the client
 * reconnects: reattach() asks again. Called with c->lock held.
 */
static bool will_reconnect(const struct ldr_client *c)
{
	return c->reconnecting || (c->ready && c->reconnect_ms > 0 && !c->closing && c->flusher_running);
}

static bool lost_with_connection(const struct ldr_client *c, int rv)
{
	if (rv != NNG_ECLOSED && rv != NNG_ECANCELED && rv != NNG_ECONNSHUT && rv != NNG_ECONNRESET)
		return false;
	return will_reconnect(c);
}

/* Put one delivery in its place by seq; false if it is out of the window. */
static bool store_one(struct ldr_attachment *a, uint64_t seq, int kind, const Loaderd__Batch *b,
                      const Loaderd__Error *e)
{
	struct arrived *ar;

	if (seq < a->next_seq || seq - a->next_seq >= MAX_INFLIGHT || a->ring[seq % MAX_INFLIGHT].present) {
		if (!a->err) {
			a->err = -EPROTO;
			snprintf(a->errmsg, sizeof(a->errmsg), "reply out of sequence");
		}
		return false;
	}
	ar = &a->ring[seq % MAX_INFLIGHT];
	memset(ar, 0, sizeof(*ar));
	ar->present = true;
	ar->kind = kind;
	if (b) {
		ar->lease = b->lease;
		ar->epoch = b->epoch;
		ar->index = b->index;
		ar->slot = b->slot;
		ar->rows = b->rows;
		if (b->error_code) {
			/* a failed batch (on_error "raise"): its error in its place */
			ar->err = b->error_code > 0 && b->error_code < 4096 ? -b->error_code : -EIO;
			ar->msg = strdup(b->error ? b->error : "");
			ar->lease = 0;
		}
	} else if (e) {
		ar->err = e->code > 0 ? -e->code : -EIO;
		ar->msg = strdup(e->message ? e->message : "");
	}
	a->arrived++;
	return true;
}

void store_reply(struct ldr_attachment *a, const Loaderd__Reply *rep, int rv)
{
	if (lost_with_connection(a->c, rv))
		return; /* reattach() asks again */
	if (rv != 0 || !rep) {
		if (!a->err) {
			a->err = a->c->disconnected || rv == NNG_ECLOSED || rv == NNG_ECANCELED
			                 ? LDR_EDISCONNECTED : nng_to_errno(rv ? rv : NNG_EPROTO);
			if (a->err == LDR_EDISCONNECTED)
				snprintf(a->errmsg, sizeof(a->errmsg), "disconnected from the daemon at %s",
				         a->c->path);
			else
				snprintf(a->errmsg, sizeof(a->errmsg), "%s",
				         rep ? "" : "malformed reply from the daemon");
		}
		return;
	}
	switch (rep->body_case) {
	case LOADERD__REPLY__BODY_BATCHES:
		if (rep->batches->n_batches == 0 && !a->err) {
			a->err = -EPROTO;
			snprintf(a->errmsg, sizeof(a->errmsg), "empty batch list from the daemon");
		}
		/* answers may be handled out of order: the newest delivery's
		 * share is the current one */
		if (rep->batches->n_batches && rep->batches->share &&
		    rep->batches->batches[0]->seq >= a->share_seq) {
			a->share = rep->batches->share;
			a->share_seq = rep->batches->batches[0]->seq;
		}
		for (size_t i = 0; i < rep->batches->n_batches; i++)
			if (!store_one(a, rep->batches->batches[i]->seq, LOADERD__REPLY__BODY_BATCHES,
			               rep->batches->batches[i], NULL))
				return;
		return;
	case LOADERD__REPLY__BODY_END:
		store_one(a, rep->end->seq, LOADERD__REPLY__BODY_END, NULL, NULL);
		return;
	case LOADERD__REPLY__BODY_ERROR: {
		uint64_t seq = rep->error->seq;
		if (rep->error->code == ECANCELED && a->detached)
			return;
		if (rep->error->code == ESHUTDOWN && will_reconnect(a->c)) {
			/* a daemon that stops (a restart, an upgrade): nothing is
			 * asked of it any more, and the attachment follows the
			 * next one (reattach()) */
			a->c->daemon_stopping = true;
			return;
		}
		if (seq < a->next_seq || seq - a->next_seq >= MAX_INFLIGHT) {
			/* an error not tied to a delivery: it stops the attachment */
			if (!a->err) {
				a->err = rep->error->code > 0 ? -rep->error->code : -EIO;
				snprintf(a->errmsg, sizeof(a->errmsg), "%s", rep->error->message);
			}
			return;
		}
		store_one(a, seq, LOADERD__REPLY__BODY_ERROR, NULL, rep->error);
		return;
	}
	default:
		if (!a->err) {
			a->err = -EPROTO;
			snprintf(a->errmsg, sizeof(a->errmsg), "unexpected reply to Next");
		}
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
		watch_reply(a, rep, rv);
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
			answer_revoke(a);
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
