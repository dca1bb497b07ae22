/* SPDX-License-Identifier: MIT */
/* libloader: stall accounting: the TrainerStats (docs/protocol.md) ldr_next()
 * keeps, and the batch ring's header (common/bring.h) or else the Next and
 * Release requests carry.
 */
#include "libloader-private.h"

/* A ring that carries the figures (BRING_F_STATS) gets them after each
 * ldr_next(): no request carries them then, so the st_sent_* marks of the
 * socket's reports stay untouched (no clock read for them on the batch
 * path). Called with c->lock held. */
static void stats_to_ring(struct ldr_attachment *a)
{
	bring_client_stats(&a->br, a->st_wait_ns, a->st_compute_ns, a->st_calls, a->st_buckets);
}

/*
 * The TrainerStats a Next or Release carries: the totals, when a wait ended
 * since the last report. A Next carries them at most every STATS_EVERY_NS
 * (the daemon's rates are over seconds); a Release whenever they changed, so
 * that the trainer's last batch is counted once its lease went back (releases
 * go out at most every FLUSH_DELAY_MS). Called with c->lock held; NULL when
 * there is nothing to say.
 */
Loaderd__TrainerStats *stats_report(struct ldr_attachment *a, Loaderd__TrainerStats *st,
                                           bool release)
{
	uint64_t now = mono_ns();

	if (ring_has_stats(a))
		return NULL;
	if ((a->st_calls == a->st_sent_calls && a->st_wait_ns == a->st_sent_wait) ||
	    (!release && now - a->st_sent_ns < STATS_EVERY_NS))
		return NULL;
	a->st_sent_ns = now;
	a->st_sent_calls = a->st_calls;
	a->st_sent_wait = a->st_wait_ns;
	st->wait_ns = a->st_wait_ns;
	st->compute_ns = a->st_compute_ns;
	st->calls = a->st_calls;
	st->n_wait_buckets = WAIT_BUCKETS;
	st->wait_buckets = a->st_buckets;
	return st;
}

/* ldr_next() begins at @t0: the time since the last return was the
 * trainer's (compute), or still waiting when that return was a timeout. */
void stats_enter(struct ldr_attachment *a, uint64_t t0)
{
	a->st_counted = t0;
	if (!a->st_mark)
		return;
	if (a->st_waiting) {
		a->st_open += t0 - a->st_mark;
		a->st_wait_ns += t0 - a->st_mark;
	} else {
		a->st_compute_ns += t0 - a->st_mark;
	}
}

/*
 * A long wait is reported while it lasts: the waits a report carries are
 * those that ended, and a trainer starved for seconds would show no figure
 * at all (no request goes out while it waits). Once a second of a wait
 * (ldr_next()'s own slices, or the Python package's polls that time out), a
 * Release carries the time waited so far, with the leases queued if any.
 * Only a waiting trainer pays for it. Called with c->lock held. Return true
 * when that Release is due: the caller sends it (req_send() on a->relreq),
 * as stats.c sends nothing itself (req_send() asks it what to report).
 */
bool stats_live(struct ldr_attachment *a, uint64_t now)
{
	a->st_wait_ns += now - a->st_counted;
	a->st_counted = now;
	if (ring_has_stats(a)) {
		stats_to_ring(a);
		return false;
	}
	return now - a->st_sent_ns >= (uint64_t)STATS_LIVE_MS * 1000000u && !a->detached &&
	       !a->c->disconnected && a->relreq.open && a->relreq.state == REQ_IDLE;
}

/* ldr_next() that began at @t0 returns @r. A wait ends with anything but a
 * timeout: ldr_next with a timeout in a loop (the Python DataLoader polls in
 * slices) is one wait. True when a Release is due, as stats_live() says. */
bool stats_leave(struct ldr_attachment *a, uint64_t t0, int r)
{
	uint64_t t1 = mono_ns();

	a->st_wait_ns += t1 - a->st_counted;
	a->st_counted = t1;
	a->st_open += t1 - t0;
	a->st_mark = r == 0 || r == -ETIMEDOUT ? t1 : 0;
	a->st_waiting = r == -ETIMEDOUT;
	if (a->st_waiting)
		return stats_live(a, t1);
	a->st_buckets[wait_bucket(a->st_open)]++;
	a->st_calls++;
	a->st_open = 0;
	if (ring_has_stats(a))
		stats_to_ring(a);
	return false;
}
