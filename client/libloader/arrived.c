/* SPDX-License-Identifier: MIT */
/* libloader: the deliveries that arrived (a->ring, by delivery number):
 * store_reply() puts a Batches, End or Error reply's deliveries in their
 * place, whether the reply came over the socket (window.c, revoke.c) or out
 * of the batch ring (ring.c). It changes the attachment's state only and
 * calls nothing of the library but nng_to_errno(), so all three can use it.
 */
#include "libloader-private.h"

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
