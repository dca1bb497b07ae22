/* SPDX-License-Identifier: MIT */
/* order - a client's order: the batches of a client_order stream
 *
 * torch's samplers (a sampler=, a batch_sampler= with batches of varying
 * sizes, a RandomSampler drawing from the trainer's generator) decide their
 * order in the trainer, when an epoch starts. Such a trainer attaches with
 * client_order and sends each epoch's batches, as dataset indices, in
 * chunks (Order requests); its stream builds batch k only once k's chunk has
 * come, so it never runs ahead into an order it does not know. The seq of a
 * batch in the stream is its place among every batch the client gave.
 *
 * An order is untrusted input: every index must lie in the dataset, every
 * batch fit the slots (the spec's batch_size is their capacity), the chunks
 * continue one another, and what a stream keeps of it (the batches from the
 * oldest one still in use on) counts against its user's memory limit
 * (bounds.c). A refused chunk is answered with what was wrong, and changes
 * nothing.
 */
#include "engine-private.h"

uint64_t order_end(const struct stream *s)
{
	return s->corder.base_seq + s->corder.n;
}

const struct order_batch *order_at(const struct stream *s, uint64_t seq)
{
	const struct order *o = &s->corder;

	if (seq < o->base_seq || seq - o->base_seq >= o->n)
		return NULL;
	return &o->b[seq - o->base_seq];
}

const uint64_t *order_indices(const struct stream *s, const struct order_batch *b)
{
	return s->corder.idx + b->off;
}

void order_free(struct stream *s)
{
	free(s->corder.b);
	free(s->corder.idx);
	memset(&s->corder, 0, sizeof(s->corder));
}

/* Forget the batches below the oldest seq still in use: the ring's head (a
 * batch given back is built again from its seq, sched.c), the next to build,
 * and its clients' cursors. */
static void order_trim(struct stream *s)
{
	struct order *o = &s->corder;
	uint64_t keep = s->ring_len ? s->head_seq : s->next_produce, drop, off;

	if (s->next_produce < keep)
		keep = s->next_produce;
	for (const struct attachment *a = s->atts; a; a = a->next)
		if (a->cursor < keep)
			keep = a->cursor;
	if (keep <= o->base_seq || !o->n)
		return;
	drop = keep - o->base_seq;
	if (drop > o->n)
		drop = o->n;
	off = drop < o->n ? o->b[drop].off : o->nidx;
	memmove(o->b, o->b + drop, (o->n - drop) * sizeof(*o->b));
	o->n -= drop;
	for (size_t i = 0; i < o->n; i++)
		o->b[i].off -= off;
	memmove(o->idx, o->idx + off, (o->nidx - off) * sizeof(*o->idx));
	o->nidx -= off;
	o->base_seq += drop;
}

/* Grow @o to hold @nb more batches and @ni more indices: the new capacities
 * (not yet allocated) into *@cap and *@icap. */
static int order_room(const struct order *o, size_t nb, size_t ni, size_t *cap, size_t *icap)
{
	*cap = o->cap;
	*icap = o->idx_cap;
	if (o->n + nb > *cap)
		*cap = o->n + nb > 2 * *cap ? o->n + nb : 2 * *cap;
	if (o->nidx + ni > *icap)
		*icap = o->nidx + ni > 2 * *icap ? o->nidx + ni : 2 * *icap;
	if (*cap > SIZE_MAX / sizeof(*o->b) || *icap > SIZE_MAX / sizeof(*o->idx))
		return -ENOMEM;
	return 0;
}

/* Does @m continue what @s was given? */
static int order_follows(const struct stream *s, const struct order_msg *m, char *err, size_t errlen)
{
	const struct order *o = &s->corder;

	if (o->open && (m->epoch != o->next_epoch || m->first != o->next_batch))
		return errfmt(-EINVAL, err, errlen, "order: epoch %" PRIu64 " from batch %" PRIu64
		              " does not continue the order so far: epoch %" PRIu64 " is open, its next "
		              "batch is %" PRIu64 " (an epoch's chunks come in order, the last one with "
		              "last set)", m->epoch, m->first, o->next_epoch, o->next_batch);
	if (!o->open && m->epoch < o->next_epoch)
		return errfmt(-EINVAL, err, errlen, "order: epoch %" PRIu64 " has ended (or was skipped): "
		              "the next epoch is %" PRIu64 " or later", m->epoch, o->next_epoch);
	if (!o->open && m->first != (m->epoch == o->next_epoch ? o->next_batch : 0))
		return errfmt(-EINVAL, err, errlen, "order: epoch %" PRIu64 " has not started: its first "
		              "chunk begins at batch %" PRIu64 ", not %" PRIu64, m->epoch,
		              m->epoch == o->next_epoch ? o->next_batch : 0, m->first);
	if (s->pl->spec->epochs && m->epoch >= s->pl->spec->epochs)
		return errfmt(-EINVAL, err, errlen, "order: epoch %" PRIu64 " is past the %" PRIu64
		              " epochs of pipeline '%s'", m->epoch, s->pl->spec->epochs, s->pl->spec->name);
	if (m->nbatches == 0 && !m->last)
		return errfmt(-EINVAL, err, errlen, "order: a chunk of epoch %" PRIu64 " with no batch "
		              "(only the last chunk of an epoch may be empty)", m->epoch);
	if (m->nbatches > UINT64_MAX - m->first)
		return errfmt(-EINVAL, err, errlen, "order: batch numbers of epoch %" PRIu64 " overflow",
		              m->epoch);
	return 0;
}

/* Are @m's batches ones the stream's slots and source can build? */
static int order_valid(const struct stream *s, const struct order_msg *m, char *err, size_t errlen)
{
	const struct pipeline *pl = s->pl;
	uint64_t nsamples = source_nsamples(pl->src), total = 0, cap = pl->spec->batch_size;

	for (size_t i = 0; i < m->nbatches; i++) {
		uint32_t rows = m->sizes[i];
		if (rows == 0)
			return errfmt(-EINVAL, err, errlen, "order: batch %" PRIu64 " of epoch %" PRIu64
			              " is empty", m->first + i, m->epoch);
		if (rows > cap)
			return errfmt(-E2BIG, err, errlen, "order: batch %" PRIu64 " of epoch %" PRIu64 " has "
			              "%u samples, more than the %" PRIu64 " a slot of pipeline '%s' holds (its "
			              "batch_size): create the pipeline with batch_size at least the sampler's "
			              "largest batch", m->first + i, m->epoch, rows, cap, pl->spec->name);
		total += rows;
	}
	if (total != m->nindices)
		return errfmt(-EINVAL, err, errlen, "order: the sizes of epoch %" PRIu64 "'s batches %"
		              PRIu64 ".. add up to %" PRIu64 " samples, but %zu indices came", m->epoch,
		              m->first, total, m->nindices);
	for (size_t i = 0, k = 0; i < m->nbatches; i++)
		for (uint32_t r = 0; r < m->sizes[i]; r++, k++)
			if (m->indices[k] >= nsamples)
				return errfmt(-ERANGE, err, errlen, "order: batch %" PRIu64 " of epoch %" PRIu64
				              ", row %u: index %" PRIu64 " is out of range for the %" PRIu64
				              " samples of pipeline '%s'", m->first + i, m->epoch, r,
				              m->indices[k], nsamples, pl->spec->name);
	return 0;
}

int attachment_order(struct attachment *a, const struct order_msg *m, char *err, size_t errlen)
{
	struct stream *s = a->stream;
	struct order *o;
	size_t cap, icap;
	uint64_t grow;
	int r;

	if (a->dead || !a->pl)
		return errfmt(a->dead_err ? -a->dead_err : -ENOENT, err, errlen, "order: %s",
		              a->dead_msg[0] ? a->dead_msg : "the attachment's pipeline is gone");
	if (!s || !s->client_order)
		return errfmt(-EINVAL, err, errlen, "order: attachment %" PRIu64 " takes the pipeline's "
		              "order; attach with client_order to give yours", a->id);
	o = &s->corder;
	if ((r = order_follows(s, m, err, errlen)) < 0 || (r = order_valid(s, m, err, errlen)) < 0)
		return r;
	order_trim(s);
	if (order_room(o, m->nbatches, m->nindices, &cap, &icap) < 0)
		return errfmt(-ENOMEM, err, errlen, "order: out of memory");
	grow = (cap - o->cap) * sizeof(*o->b) + (icap - o->idx_cap) * sizeof(*o->idx);
	if (grow && (r = bounds_may_order(a->eng, a->uid, a->admin, grow, err, errlen)) < 0)
		return r;
	if (cap > o->cap) {
		struct order_batch *b = realloc(o->b, cap * sizeof(*b));
		if (!b)
			return errfmt(-ENOMEM, err, errlen, "order: out of memory");
		o->b = b;
		o->cap = cap;
	}
	if (icap > o->idx_cap) {
		uint64_t *idx = realloc(o->idx, icap * sizeof(*idx));
		if (!idx)
			return errfmt(-ENOMEM, err, errlen, "order: out of memory");
		o->idx = idx;
		o->idx_cap = icap;
	}
	for (size_t i = 0; i < m->nbatches; i++) {
		o->b[o->n++] = (struct order_batch){ .epoch = m->epoch, .index = m->first + i,
			.off = o->nidx, .rows = m->sizes[i] };
		o->nidx += m->sizes[i];
	}
	if (m->nindices)
		memcpy(o->idx + o->nidx - m->nindices, m->indices, m->nindices * sizeof(*m->indices));
	o->started = true;
	o->open = !m->last;
	o->next_epoch = m->last ? m->epoch + 1 : m->epoch;
	o->next_batch = m->last ? 0 : m->first + m->nbatches;
	s->pl->eng->hooks->update(s->pl);
	return 0;
}
