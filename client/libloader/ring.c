/* SPDX-License-Identifier: MIT */
/* libloader: the batch ring (common/bring.h; docs/protocol.md, "The batch
 * ring"). A host attachment of a daemon that offers one takes its deliveries
 * out of shared memory and puts its releases there, instead of Next and
 * Release requests: when the daemon is ahead, ldr_next() finds the next
 * delivery in the ring with a few atomic loads, no syscall and no message.
 * What the ring brings goes into the same window (a->ring, by delivery
 * number) as a Batches reply's would, through store_reply(), so taking,
 * revokes and keeping work as on the socket. The watch stays on the socket:
 * Revokes, and the errors that end an attachment, still come there.
 */
#include <sys/eventfd.h>

#include "libloader-private.h"

int ring_open(struct ldr_attachment *a, int fd, int efd, uint64_t bytes)
{
	char err[256];
	int r;

	if ((r = bring_map(&a->br, fd, bytes, err, sizeof(err))) < 0)
		return set_err(r, "%s", err);
	a->ring_efd = efd;
	a->ringed = true;
	return 0;
}

/* Wake the daemon's loop (it reads the ring when its eventfd says so). */
static void wake_daemon(struct ldr_attachment *a)
{
	eventfd_write(a->ring_efd, 1);
}

/*
 * Move what the daemon published into the window, as store_reply() does with
 * a Batches, End or Error reply; an End or Error is taken only once its
 * message is copied, and the daemon is told (it delivers again only then).
 * Called with c->lock held.
 */
void ring_pull(struct ldr_attachment *a, bool all)
{
	struct bring_desc d;
	int r = 0;

	/* one at a time, as the trainer takes them: what stays in the ring
	 * counts against the window the daemon keeps (@all: a revoke's) */
	while (a->ringed && a->arrived < MAX_INFLIGHT && (all || !a->ring[a->next_seq % MAX_INFLIGHT].present) &&
	       (r = bring_client_peek(&a->br, &d)) == 1) {
		Loaderd__Reply rep = LOADERD__REPLY__INIT;
		Loaderd__Batches bl = LOADERD__BATCHES__INIT;
		Loaderd__Batch bt = LOADERD__BATCH__INIT, *bp = &bt;
		Loaderd__End end = LOADERD__END__INIT;
		Loaderd__Error er = LOADERD__ERROR__INIT;
		char msg[BRING_MSG_BYTES];

		switch (d.kind) {
		case BRING_FAILED:
			/* a failed batch: a Batch with its error (lease, slot, rows 0) */
			memcpy(msg, a->br.msg, sizeof(msg));
			msg[sizeof(msg) - 1] = '\0';
			bt.error_code = d.err ? d.err : EIO;
			bt.error = msg;
			/* fall through */
		case BRING_BATCH:
			bt.seq = d.seq;
			bt.lease = d.lease;
			bt.epoch = d.epoch;
			bt.index = d.index;
			bt.slot = d.slot;
			bt.rows = d.rows;
			bl.n_batches = 1;
			bl.batches = &bp;
			bl.share = d.share;
			rep.body_case = LOADERD__REPLY__BODY_BATCHES;
			rep.batches = &bl;
			break;
		case BRING_END:
			end.seq = d.seq;
			rep.body_case = LOADERD__REPLY__BODY_END;
			rep.end = &end;
			break;
		case BRING_ERROR:
			memcpy(msg, a->br.msg, sizeof(msg));
			msg[sizeof(msg) - 1] = '\0';
			er.seq = d.seq;
			er.code = d.err;
			er.message = msg;
			rep.body_case = LOADERD__REPLY__BODY_ERROR;
			rep.error = &er;
			break;
		default:
			if (!a->err) {
				a->err = -EPROTO;
				snprintf(a->errmsg, sizeof(a->errmsg), "batch ring: delivery %" PRIu64 " of "
				         "unknown kind %u", d.seq, d.kind);
			}
			return;
		}
		store_reply(a, &rep, 0);
		if (bring_client_next(&a->br) || d.kind != BRING_BATCH)
			wake_daemon(a);
	}
	if (a->ringed && r < 0 && !a->err) {
		a->err = -EPROTO;
		snprintf(a->errmsg, sizeof(a->errmsg), "batch ring: the daemon's delivery head is "
		         "beyond what the ring holds");
	}
}

/*
 * Sleep until the daemon publishes or ring_poke() is called, at most @ms.
 * Called with c->lock held, which it drops meanwhile. Return 0 or -ETIMEDOUT.
 */
int ring_wait(struct ldr_attachment *a, int ms)
{
	/* a copy: a reconnection may give the attachment a new daemon's ring
	 * meanwhile (ring_restart()); this one stays mapped, and is woken */
	struct bring b = a->br;
	int r;

	pthread_mutex_unlock(&a->c->lock);
	r = bring_client_wait(&b, b.d_tail, ms);
	pthread_mutex_lock(&a->c->lock);
	return r;
}

/* Wake a ldr_next() sleeping in ring_wait(): something came over the socket. */
void ring_poke(struct ldr_attachment *a)
{
	if (a->ringed)
		bring_wake_client(&a->br);
}

/* Hand @lease back through the ring: false when it is full (the socket takes
 * it then). Called with c->lock held. */
bool ring_release(struct ldr_attachment *a, uint64_t lease)
{
	int r = bring_client_release(&a->br, lease);

	if (r == 1)
		wake_daemon(a);
	return r >= 0;
}

/* Does the ring carry the trainer's figures (a daemon that reads them
 * there)? Then no request does. Called with c->lock held. */
bool ring_has_stats(const struct ldr_attachment *a)
{
	return a->ringed && (a->br.flags & BRING_F_STATS);
}

/* A ring without them (an older daemon's): has the attachment figures to
 * report? No Next carries them: the flusher sends a Release for them after
 * a release (queue_release()). Called with c->lock held. */
bool ring_stats_due(const struct ldr_attachment *a)
{
	return a->ringed && !ring_has_stats(a) &&
	       (a->st_calls != a->st_sent_calls || a->st_wait_ns != a->st_sent_wait);
}

/* ... and ldr_next() one at most every STATS_EVERY_NS while batches are
 * taken but kept (no release): true when it is due now (ldr_next() sends
 * it). Called with c->lock held. */
bool ring_stats_now(const struct ldr_attachment *a)
{
	return a->ringed && !ring_has_stats(a) && mono_ns() - a->st_sent_ns >= STATS_EVERY_NS &&
	       !a->detached && !a->c->disconnected && a->relreq.open && a->relreq.state == REQ_IDLE;
}

void ring_retire(struct ldr_attachment *a)
{
	struct old_ring *o;

	a->ringed = false;
	if (a->ring_efd >= 0)
		close(a->ring_efd); /* the old daemon's loop is gone */
	a->ring_efd = -1;
	if (!a->br.sh)
		return;
	/* kept mapped: a ldr_next() in ring_wait() sleeps on it; wake it */
	bring_wake_client(&a->br);
	o = malloc(sizeof(*o));
	if (!o)
		return; /* then it stays mapped, its fd open, for good: a few pages */
	o->br = a->br;
	o->next = a->old_rings;
	a->old_rings = o;
	memset(&a->br, 0, sizeof(a->br));
	a->br.fd = -1;
}

void ring_restart(struct ldr_attachment *a, const struct bring *br, int efd)
{
	ring_retire(a);
	a->br = *br;
	a->ring_efd = efd;
	a->ringed = true;
}

/* Unmap the ring, and those of daemons it followed away from: only with the
 * attachment itself, so that a ldr_next() returning from ring_wait() never
 * finds one gone. */
void ring_close(struct ldr_attachment *a)
{
	a->ringed = false;
	if (a->br.sh)
		bring_close(&a->br);
	if (a->ring_efd >= 0)
		close(a->ring_efd);
	a->ring_efd = -1;
	while (a->old_rings) {
		struct old_ring *o = a->old_rings;
		a->old_rings = o->next;
		bring_close(&o->br);
		free(o);
	}
}
