/* SPDX-License-Identifier: MIT */
/* deliver - parked Next requests, leases and answers
 *
 * Broadcast and partition attachments read their stream by their own cursor;
 * dynamic attachments queue on the stream and each batch goes to the first
 * request in line. A broadcast batch leaves the ring when every attached
 * client has received and released it, so the slowest client holds the stream
 * back (backpressure), a client that attaches later starts at the oldest
 * batch still held, and a client that leaves stops holding anyone back.
 */
#include "engine-private.h"

/* --- delivery ----------------------------------------------------------- */

void deliver(struct engine *eng, struct pending *p, const struct delivery *d)
{
	if (p->ring)
		attring_deliver(p, d);
	else
		eng->ops.deliver(eng->userdata, p, d);
}

static struct pending *att_pop_pending(struct attachment *a)
{
	struct pending *p = a->pend_head;

	if (p) {
		a->pend_head = p->next;
		if (!a->pend_head)
			a->pend_tail = NULL;
		a->npending--;
		p->next = NULL;
	}
	return p;
}

static void answer_error(struct attachment *a, struct pending *p, int err, const char *msg)
{
	struct delivery d = { .kind = DELIVER_ERROR, .seq = a->deliver_no++, .err = err, .msg = msg };
	deliver(a->eng, p, &d);
}

/* The end of @a's stream: End, or for a pipeline a reload removed, the
 * error that says so (its clients must not take it for the data's end). */
static void answer_end(struct attachment *a, struct pending *p)
{
	struct delivery d = { .kind = DELIVER_END, .seq = a->deliver_no++ };

	if (a->stream && a->stream->drained) {
		a->deliver_no--;
		answer_error(a, p, ENOENT, a->pl->retire_msg);
		return;
	}
	if (a->end_dno == UINT64_MAX)
		a->end_dno = d.seq; /* a Revoke may hand back the batches below it (sched.c) */
	deliver(a->eng, p, &d);
}

/* Lease @b to @a and describe the delivery in @out (a failed batch: its
 * error, no lease; the caller ends the delivery with it). */
static int lease_batch(struct attachment *a, struct batch *b, struct delivered_batch *out)
{
	struct pipeline *pl = a->pl;
	struct slot *slot = batch_slot(b, a->group); /* its seed group's */
	struct lease *l;

	if (b->failed) {
		/* on_error "raise": its error in its place, no lease (the
		 * delivery's last: a ring carries one error text at a time) */
		a->delivered++;
		*out = (struct delivered_batch){ .seq = a->deliver_no++, .epoch = b->epoch,
			.index = b->index, .err = b->err, .msg = b->errmsg };
		return 0;
	}
	if (!(l = malloc(sizeof(*l))))
		return -ENOMEM;
	*l = (struct lease){ .next = a->leases, .id = ++pl->lease_ctr, .slot = slot,
		.dseq = a->deliver_no, .seq = b->seq, .epoch = b->epoch, .index = b->index, .rows = b->rows };
	a->leases = l;
	a->nleases++;
	slot->refs++;
	slot->leases++;
	a->delivered++;
	a->st.samples += b->rows;
	a->st.bytes += (uint64_t)b->rows * pl->row_bytes;
	*out = (struct delivered_batch){
		.seq = a->deliver_no++,
		.lease = l->id,
		.epoch = b->epoch,
		.index = b->index,
		.slot = slot->idx,
		.rows = b->rows,
	};
	return 0;
}

static void answer_batches(struct attachment *a, struct pending *p,
                           const struct delivered_batch *out, uint32_t n)
{
	struct delivery d = { .kind = DELIVER_BATCH, .batches = out, .nbatches = n,
		.share = att_share(a) };

	if (n == 0) {
		answer_error(a, p, ENOMEM, "out of memory");
		return;
	}
	a->told_share = d.share;
	deliver(a->eng, p, &d);
}

/* May @a be delivered another batch now? Not at its share, nor while its
 * Revoke is out (the deliveries it would hand back must stay the newest). */
static bool att_has_room(const struct attachment *a)
{
	/* one set aside ("slow_clients": "skip", slow.c) holds one batch at most
	 * until it reads again: a stopped client keeps only that slot */
	return !a->revoking && a->nleases < att_share(a) && !(a->skip_hold && a->nleases);
}

static void dyn_unlink(struct stream *s, struct pending **pp, struct pending *prev)
{
	struct pending *p = *pp;

	*pp = p->next;
	if (s->dyn_tail == p)
		s->dyn_tail = prev;
	p->next = NULL;
	p->att->npending--;
}

void att_fail_pending(struct attachment *a, int err, const char *msg)
{
	struct pending *p;

	if (a->stream && a->mode == LDR_MODE_DYNAMIC) {
		struct stream *s = a->stream;
		struct pending **pp = &s->dyn_head, *prev = NULL;
		while (*pp) {
			p = *pp;
			if (p->att != a) {
				prev = p;
				pp = &p->next;
				continue;
			}
			dyn_unlink(s, pp, prev);
			answer_error(a, p, err, msg);
		}
	}
	while ((p = att_pop_pending(a)))
		answer_error(a, p, err, msg);
	if ((p = a->watch)) {
		/* a watch answers no delivery: it takes no delivery number */
		a->watch = NULL;
		deliver(a->eng, p, &(struct delivery){ .kind = DELIVER_ERROR, .err = err, .msg = msg });
	}
}

/* The next batch of dynamic stream @s: one handed back first, then the ring's. */
static struct batch *dyn_next(struct stream *s)
{
	if (s->nreturned)
		return &s->returned[0];
	if (s->cursor >= s->end_seq)
		return NULL;
	return ring_at(s, s->cursor);
}

/* @b, from dyn_next(), was leased: it leaves the stream. */
static void dyn_taken(struct stream *s, struct batch *b)
{
	if (s->nreturned && b == &s->returned[0]) {
		struct slot *slot = b->slot;
		memmove(&s->returned[0], &s->returned[1], (s->nreturned - 1) * sizeof(s->returned[0]));
		s->nreturned--;
		slot_unref(s->pl, slot);
		return;
	}
	s->cursor++;
	ring_pop_head(s);
}

/* Each batch to the first request in line whose attachment has room. */
static void dynamic_dispatch(struct stream *s)
{
	bool ended = s->cursor >= s->end_seq && s->nreturned == 0;
	struct batch *next = ended ? NULL : dyn_next(s);
	struct pending **pp, *prev, *p;

	for (pp = &s->dyn_head, prev = NULL; (p = *pp);) {
		struct attachment *a = p->att;
		if (!a->revoking && (ended || (a->dev && a->dev->failed))) {
			dyn_unlink(s, pp, prev);
			if (ended)
				answer_end(a, p);
			else
				answer_error(a, p, EIO, a->dev->error);
			continue;
		}
		if (!a->revoking && next && next->refused &&
		    (a->told_seq != next->seq || a->told_parks != next->parks)) {
			/* the next batch's job waits for fresh store keys
			 * (stream.c, job_park()): each reader in line is told
			 * the store's words once, as in the other modes; the
			 * batch stays next, for whoever asks once the keys come */
			a->told_seq = next->seq;
			a->told_parks = next->parks;
			dyn_unlink(s, pp, prev);
			answer_error(a, p, EACCES, next->errmsg);
			continue;
		}
		prev = p;
		pp = &p->next;
	}
	for (;;) {
		struct delivered_batch out[DELIVER_MAX_BATCHES];
		struct batch *b = dyn_next(s);
		uint32_t n = 0;

		for (pp = &s->dyn_head, prev = NULL; (p = *pp) && !att_has_room(p->att); pp = &p->next)
			prev = p;
		if (!p || !b || !batch_ready(p->att, b))
			return;
		dyn_unlink(s, pp, prev);
		struct batch *failed = NULL;
		while (n < p->max && att_has_room(p->att) && (b = dyn_next(s)) && batch_ready(p->att, b) &&
		       lease_batch(p->att, b, &out[n]) == 0) {
			if (out[n++].err) {
				failed = b; /* its words go with the answer: taken after it */
				break;
			}
			dyn_taken(s, b);
		}
		answer_batches(p->att, p, out, n);
		if (failed)
			dyn_taken(s, failed);
	}
}

/* Has a client of @s reached its failed batch (stream.c, job_done())? */
static bool stream_failed(const struct stream *s)
{
	if (s->fail_seq == UINT64_MAX)
		return false;
	if (s->mode == LDR_MODE_DYNAMIC)
		return s->cursor >= s->fail_seq && s->nreturned == 0;
	for (const struct attachment *a = s->atts; a; a = a->next)
		if (a->cursor >= s->fail_seq)
			return true;
	return false;
}

static void stream_dispatch(struct stream *s)
{
	struct pipeline *pl = s->pl;
	struct pending *p;

	if (!pl->failed && stream_failed(s)) {
		/* every batch before it was delivered: now the error, to all */
		pl->eng->hooks->fail_pipeline(pl, s->fail_err, s->fail_msg);
		return;
	}
	if (pl->failed) {
		for (struct attachment *a = s->atts; a; a = a->next)
			att_fail_pending(a, EIO, pl->error);
		return;
	}
	if (s->mode == LDR_MODE_DYNAMIC) {
		dynamic_dispatch(s);
		return;
	}

	if (s->mode == LDR_MODE_BROADCAST && !s->started) {
		if (s->natts < pl->spec->min_clients)
			return;
		s->started = true;
	}
	uint64_t min_cursor = UINT64_MAX;
	for (struct attachment *a = s->atts; a; a = a->next) {
		if (a->dev && a->dev->failed)
			att_fail_pending(a, EIO, a->dev->error);
		while (a->pend_head && !a->revoking) {
			struct delivered_batch out[DELIVER_MAX_BATCHES];
			struct batch *b;
			uint32_t n = 0;
			if (a->cursor >= s->end_seq) {
				answer_end(a, att_pop_pending(a));
				continue;
			}
			b = ring_at(s, a->cursor);
			if (b && b->refused && (a->told_seq != b->seq || a->told_parks != b->parks)) {
				/* its job waits for fresh store keys (stream.c,
				 * job_park()): the store's words, once; the cursor
				 * stays, the batch comes once the keys do */
				a->told_seq = b->seq;
				a->told_parks = b->parks;
				answer_error(a, att_pop_pending(a), EACCES, b->errmsg);
				continue;
			}
			if (!att_has_room(a) || !b || !batch_ready(a, b))
				break;
			p = att_pop_pending(a);
			while (n < p->max && a->cursor < s->end_seq && att_has_room(a) &&
			       (b = ring_at(s, a->cursor)) && batch_ready(a, b) && lease_batch(a, b, &out[n]) == 0) {
				a->cursor++;
				if (out[n++].err)
					break;
			}
			answer_batches(a, p, out, n);
		}
		if (a->cursor < min_cursor)
			min_cursor = a->cursor;
	}
	if (s->natts == 0)
		return;
	/* Batches every client has received leave the ring. One that somebody
	 * still holds stays, so a late joiner starts there, unless a later one
	 * is free to go: a batch kept for long must not block the ring. (The
	 * deliveries a Revoke hands back are each attachment's newest, all
	 * leased until then: they are still in the ring when they come back.) */
	uint32_t drop = 0;
	for (uint32_t i = 0; i < s->ring_len; i++) {
		const struct batch *b = &s->ring[(s->ring_head + i) % pl->nslots];
		if (b->seq >= min_cursor || !b->ready)
			break;
		if (!batch_leased(b))
			drop = i + 1;
	}
	while (drop--)
		ring_pop_head(s);
}

void pipeline_dispatch(struct pipeline *pl)
{
	for (struct stream *s = pl->streams; s; s = s->next)
		if (!s->dead)
			stream_dispatch(s);
}
