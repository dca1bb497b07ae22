/* SPDX-License-Identifier: MIT */
/* libloader: ldr_next(): taking the next delivery in order; ldr_release().
 */
#include "libloader-private.h"
#include "slabmap.h"

/* Milliseconds from now to @ts (CLOCK_MONOTONIC), rounded up, 0 if past. */
static int ms_until(const struct timespec *ts)
{
	struct timespec now;
	int64_t ns;

	clock_gettime(CLOCK_MONOTONIC, &now);
	ns = (int64_t)(ts->tv_sec - now.tv_sec) * 1000000000 + (ts->tv_nsec - now.tv_nsec);
	return ns <= 0 ? 0 : (int)((ns + 999999) / 1000000);
}

/* The trainer took the delivery of (@epoch, @index): its position is after it. */
static void advance_pos(struct ldr_attachment *a, uint64_t epoch, uint64_t index)
{
	if (a->opts.client_order)
		orders_taken(a, epoch, index); /* its order's position: epochs of its own length */
	a->pos_epoch = epoch;
	a->pos_batch = index + 1;
	if (a->pos_batch >= a->bpe) {
		a->pos_epoch++;
		a->pos_batch = 0;
	}
}

int ldr_next(struct ldr_attachment *a, int timeout_ms, struct ldr_batch **out)
{
	struct ldr_client *c = a->c;
	struct timespec deadline = { 0 };
	struct ldr_batch *b;
	uint64_t t0 = mono_ns();
	int r = 0;

	CHECK_PID(c);
	if (a->detached)
		return set_err(-EBADF, "attachment is detached");
	b = calloc(1, sizeof(*b));
	if (!b)
		return set_err(-ENOMEM, "out of memory");
	if (timeout_ms >= 0)
		deadline_after(&deadline, timeout_ms);
	pthread_mutex_lock(&c->lock);
	stats_enter(a, t0);
	for (;;) {
		if (a->ringed && !c->reconnecting)
			ring_pull(a, false);
		struct arrived *ar = &a->ring[a->next_seq % MAX_INFLIGHT];
		/* the daemon went away: what arrived from it is discarded when
		 * the attachment follows it (reattach()), so nothing is taken
		 * meanwhile; wait (within the timeout) */
		if (c->reconnecting && !a->lost) {
			r = wait_connected(c, timeout_ms < 0 ? NULL : &deadline);
			if (r == -ETIMEDOUT) {
				r = set_err(r, "no batch within %d ms: the daemon at %s went away, and libloader "
				            "is reconnecting", timeout_ms, c->path);
				break;
			}
			continue;
		}
		if (ar->present) {
			ar->present = false;
			a->next_seq++;
			a->arrived--;
			if (ar->kind == LOADERD__REPLY__BODY_BATCHES && ar->err) {
				/* this position's batch failed to build: its error
				 * once, in its place; the next call goes on */
				a->failed_err = ar->err;
				a->failed_epoch = ar->epoch;
				a->failed_index = ar->index;
				advance_pos(a, ar->epoch, ar->index);
				r = set_err(LDR_EBATCH, "%s", ar->msg && *ar->msg ? ar->msg : error_name(ar->err));
				free(ar->msg);
				ar->msg = NULL;
				if (needs_top_up(a))
					want_top_up(a);
				break;
			}
			if (ar->kind == LOADERD__REPLY__BODY_BATCHES) {
				b->att = a;
				b->lease = ar->lease;
				b->epoch = ar->epoch;
				b->index = ar->index;
				b->slot = ar->slot;
				b->rows = ar->rows;
				if (b->slot >= a->nslots || b->rows > a->batch_size) {
					/* this call fails, not the attachment; the lease
					 * goes back, so the daemon does not keep its slot */
					r = set_err(-EPROTO, "batch descriptor out of range: slot %u of %u, %u rows of "
					            "a batch of %u (lease %" PRIu64 " given back)", b->slot, a->nslots,
					            b->rows, a->batch_size, b->lease);
					queue_release(a, b->lease);
					if (needs_top_up(a))
						want_top_up(a);
					break;
				}
				b->data = a->map->slotaddr[b->slot];
				b->map = a->map;
				b->map->refs++;
				held_add(a, b);
				advance_pos(a, b->epoch, b->index);
				if (needs_top_up(a))
					want_top_up(a);
				atomic_fetch_add(&a->refs, 1);
				*out = b;
				b = NULL;
				r = 0;
				break;
			}
			if (ar->kind == LOADERD__REPLY__BODY_END) {
				a->ended = true;
				continue;
			}
			/* an error answering this request: report it once, then go on */
			r = set_err(ar->err, "%s", ar->msg ? ar->msg : error_name(ar->err));
			free(ar->msg);
			ar->msg = NULL;
			if (needs_top_up(a))
				want_top_up(a);
			break;
		}
		if (a->ended) {
			r = LDR_EOF;
			break;
		}
		if (a->err) {
			r = set_err(a->err, "%s", a->errmsg[0] ? a->errmsg : error_name(a->err));
			break;
		}
		if (c->disconnected) {
			r = disconnected_err(c);
			break;
		}
		if (a->arrived == 0 && a->nheld >= share_now(a)) {
			if ((r = make_room(a)) < 0)
				break;
			continue; /* the lock was dropped: look again */
		}
		top_up(a); /* in case a send failed earlier */
		/* in slices of STATS_LIVE_MS, so that a long wait is reported */
		struct timespec slice;
		deadline_after(&slice, STATS_LIVE_MS);
		bool last = timeout_ms >= 0 && (deadline.tv_sec < slice.tv_sec ||
		            (deadline.tv_sec == slice.tv_sec && deadline.tv_nsec <= slice.tv_nsec));
		int w = a->ringed ? ring_wait(a, ms_until(last ? &deadline : &slice))
		                  : pthread_cond_timedwait(&c->cond, &c->lock, last ? &deadline : &slice);
		if (w == ETIMEDOUT || w == -ETIMEDOUT) {
			if (last) {
				r = set_err(-ETIMEDOUT, "no batch within %d ms", timeout_ms);
				break;
			}
			if (stats_live(a, mono_ns()))
				req_send(a, &a->relreq, 0);
		}
	}
	if (stats_leave(a, t0, r))
		req_send(a, &a->relreq, 0);
	if (r == 0 && ring_stats_now(a))
		req_send(a, &a->relreq, 0);
	pthread_mutex_unlock(&c->lock);
	free(b);
	return r;
}

/*
 * The trainer is done with @b (c->lock not held). Its slot's written pages
 * are discarded before the lease goes back, so the next batch in that slot
 * reads the daemon's bytes; a kept batch's range instead becomes a pristine
 * view of its slot again, for a later keep.
 */
void batch_done(struct ldr_batch *b, bool give_lease)
{
	struct ldr_attachment *a = b->att;
	struct ldr_client *c = a->c;
	struct amap *m = b->map;
	uint64_t off = (uint64_t)b->slot * a->slot_bytes;
	bool idle;
	int kept;

	pthread_mutex_lock(&c->lock);
	while (b->busy)
		pthread_cond_wait(&c->cond, &c->lock);
	held_del(a, b);
	kept = b->kept;
	/* detached, or from a daemon that is gone (its mapping goes with
	 * its last batch): no lease to give, no slot to reuse */
	idle = a->detached || m != a->map;
	pthread_mutex_unlock(&c->lock);
	if (kept) {
		/* the copy's memory goes now, however long the mapping stays */
		if (slabmap_unkeep(b->data, a->slot_bytes, kept, m->fd, off) == 0) {
			pthread_mutex_lock(&c->lock);
			spare_push(m, b->slot, b->data);
			pthread_mutex_unlock(&c->lock);
		}
		return;
	}
	if (idle)
		return;
	if (a->cow)
		slabmap_discard(b->data, a->slot_bytes, m->fd, off, NULL);
	if (give_lease) {
		pthread_mutex_lock(&c->lock);
		if (m == a->map)
			queue_release(a, b->lease);
		pthread_mutex_unlock(&c->lock);
	}
}

/* Free @b, done with: its mapping and attachment lose a reference. */
void batch_free(struct ldr_batch *b)
{
	struct ldr_attachment *a = b->att;
	struct ldr_client *c = a->c;

	if (c->pid == self_pid()) {
		pthread_mutex_lock(&c->lock);
		amap_put(a, b->map);
		pthread_mutex_unlock(&c->lock);
	}
	free(b);
	att_unref(a);
}

void ldr_release(struct ldr_batch *b)
{
	struct ldr_attachment *a;

	if (!b)
		return;
	a = b->att;
	if (a->c->pid == self_pid())
		batch_done(b, true);
	batch_free(b);
}

int ldr_attachment_failed(const struct ldr_attachment *a, uint64_t *epoch, uint64_t *index)
{
	struct ldr_client *c = a->c;
	int err;

	CHECK_PID(c);
	pthread_mutex_lock(&c->lock);
	err = a->failed_err;
	if (epoch)
		*epoch = a->failed_epoch;
	if (index)
		*index = a->failed_index;
	pthread_mutex_unlock(&c->lock);
	return err;
}
