/* SPDX-License-Identifier: MIT */
/* libloader: sharing slots (docs/protocol.md): the parked watch, and answering
 * the daemon's Revoke with the deliveries the trainer has not taken.
 */
#include "libloader-private.h"
#include "slabmap.h"

/* Discard what may have been written in the slot of a delivery the trainer
 * never saw (cheap: a pagemap scan). Called with c->lock held. */
static void discard_unseen(struct ldr_attachment *a, const struct arrived *ar)
{
	if (a->cow && ar->slot < a->nslots)
		slabmap_discard(a->map->slotaddr[ar->slot], a->slot_bytes, a->map->fd,
		                (uint64_t)ar->slot * a->slot_bytes, NULL);
}

/*
 * Where the run handed back ends: upto_seq, or the Revoke's ends_from when
 * the deliveries from there to upto_seq are the Ends the daemon delivered
 * after the attachment's last batch, here and not taken (then the batches
 * below them can come back: the Ends go with them, and come again after the
 * batches). Called with c->lock held, every delivery below upto here.
 */
static uint64_t run_top(const struct ldr_attachment *a)
{
	uint64_t upto = a->rv_upto, ends = a->rv_ends;

	if (ends == 0 || ends >= upto || ends <= a->next_seq)
		return upto;
	for (uint64_t s = ends; s < upto; s++)
		if (a->ring[s % MAX_INFLIGHT].kind != LOADERD__REPLY__BODY_END)
			return upto;
	return ends;
}

/*
 * Answer a Revoke (docs/protocol.md, "Sharing slots"), once every delivery
 * below its upto_seq has arrived (answers to the Next requests may be handled
 * in any order): hand back, unread, the longest run of deliveries just below
 * upto_seq (or below the Ends there, run_top()), at most count, that the
 * trainer has not taken and that are batches. They leave the ring; the
 * daemon rewinds and delivers them again from return_from, which the ring
 * then accepts like any new delivery, and the window has room for them again.
 * Called with c->lock held: from the watch's callback, so the trainer's
 * thread need not be in the library. Return true when it answered: the
 * caller then tops the window up (top_up(), window.c, which calls here: so
 * this file never calls it back).
 */
bool answer_revoke(struct ldr_attachment *a)
{
	uint64_t upto = a->rv_upto, from, top;
	uint32_t j = 0;

	if (!a->rv_pending || !a->watching || a->watch.state != REQ_IDLE || a->detached ||
	    a->c->disconnected)
		return false;
	ring_pull(a, true); /* the deliveries below upto_seq are in the ring, or here */
	if (upto > a->next_seq) {
		if (upto - a->next_seq > MAX_INFLIGHT)
			return false;
		for (uint64_t s = a->next_seq; s < upto; s++)
			if (!a->ring[s % MAX_INFLIGHT].present)
				return false; /* on its way */
	}
	top = run_top(a);
	while (j < a->rv_count && j < MAX_INFLIGHT && top - j > a->next_seq) {
		const struct arrived *ar = &a->ring[(top - j - 1) % MAX_INFLIGHT];
		/* a failed batch has no lease to hand back: the run stops there */
		if (!ar->present || ar->kind != LOADERD__REPLY__BODY_BATCHES || ar->err)
			break;
		j++;
	}
	if (j == 0)
		top = upto; /* nothing to hand back: the Ends stay */
	for (uint64_t s = top; s < upto; s++) {
		/* the Ends above the run: the daemon delivers its End again */
		a->ring[s % MAX_INFLIGHT].present = false;
		a->arrived--;
	}
	from = top - j;
	for (uint64_t s = from; s < top; s++) {
		struct arrived *ar = &a->ring[s % MAX_INFLIGHT];
		a->ret[s - from] = ar->lease;
		ar->present = false;
		a->arrived--;
		discard_unseen(a, ar);
	}
	a->rv_pending = false;
	a->has_ret = true;
	a->ret_from = from;
	a->nret = j;
	a->share_seq = from; /* the re-deliveries tell the share from now on */
	if (req_send(a, &a->watch, 0) < 0) {
		a->watching = false;
		if (!a->err) {
			a->err = -ENOMEM;
			snprintf(a->errmsg, sizeof(a->errmsg), "cannot answer the daemon's revoke: out of memory");
		}
	}
	return true;
}

/* The watch came back. Called with c->lock held. True when the window
 * has room again (answer_revoke()). */
bool watch_reply(struct ldr_attachment *a, const Loaderd__Reply *rep, int rv)
{
	if (rv != 0 || !rep) {
		a->watching = false; /* cancelled, or the connection went */
		return false;
	}
	switch (rep->body_case) {
	case LOADERD__REPLY__BODY_REVOKE:
		if (rep->revoke->share)
			a->share = rep->revoke->share;
		a->share_seq = rep->revoke->upto_seq;
		a->rv_pending = true;
		a->rv_upto = rep->revoke->upto_seq;
		a->rv_count = rep->revoke->count;
		a->rv_ends = rep->revoke->ends_from;
		return answer_revoke(a);
	case LOADERD__REPLY__BODY_ERROR: {
		int code = rep->error->code;
		a->watching = false; /* detached, shutting down...: not sent again */
		if (code != ECANCELED && code != ESHUTDOWN && !a->detached && !a->err) {
			a->err = code > 0 && code < 4096 ? -code : -EIO;
			/* a failed pipeline or a detach reaches the watch first:
			 * its message as the daemon wrote it; only a refusal of
			 * the watch itself says so */
			snprintf(a->errmsg, sizeof(a->errmsg), "%s%s",
			         code == EINVAL || code == EPROTO ? "the daemon refused this client's watch: " : "",
			         rep->error->message && *rep->error->message ? rep->error->message
			                                                     : error_name(a->err));
		}
		return false;
	}
	case LOADERD__REPLY__BODY_BATCHES:
	case LOADERD__REPLY__BODY_END:
		/* a daemon that took the watch for a plain Next: keep what it
		 * delivered, and send no more watches */
		a->watching = false;
		store_reply(a, rep, 0);
		return false;
	default:
		a->watching = false;
		return false;
	}
}
