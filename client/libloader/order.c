/* SPDX-License-Identifier: MIT */
/* libloader: ldr_order(), a client_order attachment's batches, in requests
 * under the message limit; and what it gave, kept to give again.
 *
 * A sampler's epoch may list millions of indices; one Order request carries
 * at most ORDER_CHUNK_INDICES of them (10 bytes each at most on the wire,
 * with the sizes 5 bytes each: under LDR_MSG_MAX), whole batches only, so
 * the daemon can start on the first batches while the rest are on the way.
 *
 * A restarted daemon knows nothing of the order: each ldr_order() call's
 * chunk is kept (struct order_rec) until the trainer took its last batch,
 * and reattach() gives the new daemon what the trainer has not taken,
 * from its next batch on, before the trainer reads again. A chunk is kept
 * before it is sent, and sent on the connection it was kept on only
 * (call_on()): one that the connection's end cut short is the
 * reconnection's to give, never given twice.
 */
#include "libloader-private.h"

#define ORDER_CHUNK_INDICES 49152u

/* One Order request; @cut: on that connection only (ldr_order()), NULL:
 * the reconnection's own (orders_give_again()). */
static int order_send(struct ldr_attachment *a, uint64_t epoch, uint64_t first, const uint32_t *sizes,
                      size_t nbatches, const uint64_t *indices, size_t nindices, bool last,
                      const uint64_t *cut)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Order m = LOADERD__ORDER__INIT;
	Loaderd__Reply *rep;
	int r;

	m.attach_id = a->id;
	m.epoch = epoch;
	m.first_batch = first;
	m.sizes = (uint32_t *)sizes;
	m.n_sizes = nbatches;
	m.indices = (uint64_t *)indices;
	m.n_indices = nindices;
	m.last = last;
	req.body_case = LOADERD__REQUEST__BODY_ORDER;
	req.order = &m;
	r = cut ? call_on(a->c, &req, &rep, LOADERD__REPLY__BODY_OK, *cut)
	        : call_gen(a->c, &req, &rep, LOADERD__REPLY__BODY_OK, CALL_TIMEOUT_MS, true);
	if (r == 0)
		loaderd__reply__free_unpacked(rep, NULL);
	return r;
}

/* @nbatches batches in requests of whole batches up to the chunk's indices
 * (at least one each); the batches sent, into *@sent. */
static int order_send_all(struct ldr_attachment *a, uint64_t epoch, uint64_t first,
                          const uint32_t *sizes, size_t nbatches, const uint64_t *indices,
                          bool last, const uint64_t *cut, size_t *sent)
{
	size_t b = 0, off = 0;
	int r;

	*sent = 0;
	do {
		size_t n = 0, k = 0;
		while (b + n < nbatches && (n == 0 || k + sizes[b + n] <= ORDER_CHUNK_INDICES)) {
			k += sizes[b + n];
			n++;
		}
		if ((r = order_send(a, epoch, first + b, n ? sizes + b : NULL, n, k ? indices + off : NULL,
		                    k, last && b + n == nbatches, cut)) < 0)
			return r;
		b += n;
		off += k;
		*sent = b;
	} while (b < nbatches);
	return 0;
}

static void rec_free(struct order_rec *o)
{
	free(o->sizes);
	free(o->indices);
	free(o);
}

void orders_init(struct ldr_attachment *a)
{
	a->orders = NULL;
	a->orders_tail = &a->orders;
	a->opos_epoch = a->onext_epoch = a->pos_epoch;
	a->opos_batch = a->onext_batch = a->pos_batch;
	a->oopen = false;
}

void orders_free(struct ldr_attachment *a)
{
	while (a->orders) {
		struct order_rec *o = a->orders;

		a->orders = o->next;
		rec_free(o);
	}
	a->orders_tail = &a->orders;
}

/* Has the trainer taken every batch of @o (its position past them)? */
static bool rec_taken(const struct ldr_attachment *a, const struct order_rec *o)
{
	return o->epoch < a->opos_epoch ||
	       (o->epoch == a->opos_epoch && o->first + o->nbatches <= a->opos_batch);
}

void orders_taken(struct ldr_attachment *a, uint64_t epoch, uint64_t index)
{
	a->opos_epoch = epoch;
	a->opos_batch = index + 1;
	while (a->orders && rec_taken(a, a->orders)) {
		struct order_rec *o = a->orders;

		a->orders = o->next;
		if (!a->orders)
			a->orders_tail = &a->orders;
		rec_free(o);
	}
}

/* The batches of @o the trainer has taken (its position inside it). */
static size_t rec_skip(const struct ldr_attachment *a, const struct order_rec *o)
{
	if (o->epoch != a->opos_epoch || a->opos_batch <= o->first)
		return 0;
	return a->opos_batch - o->first < o->nbatches ? a->opos_batch - o->first : o->nbatches;
}

void orders_first(const struct ldr_attachment *a, uint64_t *epoch, uint64_t *batch)
{
	for (const struct order_rec *o = a->orders; o; o = o->next) {
		if (rec_taken(a, o))
			continue;
		*epoch = o->epoch;
		*batch = o->first + rec_skip(a, o);
		return;
	}
	/* all taken: where the next chunk goes */
	*epoch = a->onext_epoch;
	*batch = a->onext_batch;
}

int orders_give_again(struct ldr_attachment *a)
{
	struct ldr_client *c = a->c;
	struct order_rec **v = NULL;
	size_t n = 0, cap = 0, sent;
	int r = 0;

	/* the chunks not taken (none is freed meanwhile: nothing is taken while
	 * the client reconnects, and ldr_order() waits for it) */
	pthread_mutex_lock(&c->lock);
	for (struct order_rec *o = a->orders; o; o = o->next) {
		if (rec_taken(a, o))
			continue;
		if (n == cap) {
			struct order_rec **nv = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof(*v));
			if (!nv) {
				r = set_err(-ENOMEM, "out of memory");
				break;
			}
			v = nv;
		}
		v[n++] = o;
	}
	pthread_mutex_unlock(&c->lock);
	for (size_t i = 0; i < n && r == 0; i++) {
		const struct order_rec *o = v[i];
		size_t skip = rec_skip(a, o), off = 0;

		for (size_t b = 0; b < skip; b++)
			off += o->sizes[b];
		r = order_send_all(a, o->epoch, o->first + skip, o->sizes + skip, o->nbatches - skip,
		                   o->indices + off, o->last, NULL, &sent);
	}
	free(v);
	return r;
}

int ldr_order(struct ldr_attachment *a, uint64_t epoch, uint64_t first_batch,
              const uint32_t *sizes, size_t nbatches, const uint64_t *indices, int last)
{
	struct ldr_client *c;
	struct order_rec *o;
	struct timespec deadline;
	size_t nindices = 0, sent;
	uint64_t cut, next_epoch, next_batch;
	bool open;
	int r;

	if (!a)
		return set_err(-EINVAL, "ldr_order: no attachment");
	c = a->c;
	CHECK_PID(c);
	if (nbatches && (!sizes || !indices))
		return set_err(-EINVAL, "ldr_order: %zu batches without their sizes or indices", nbatches);
	for (size_t b = 0; b < nbatches; b++)
		nindices += sizes[b];
	o = calloc(1, sizeof(*o));
	if (o) {
		*o = (struct order_rec){ .epoch = epoch, .first = first_batch, .nbatches = nbatches,
		                         .nindices = nindices, .last = last != 0 };
		o->sizes = malloc(nbatches ? nbatches * sizeof(*sizes) : 1);
		o->indices = malloc(nindices ? nindices * sizeof(*indices) : 1);
	}
	if (!o || !o->sizes || !o->indices) {
		if (o)
			rec_free(o);
		return set_err(-ENOMEM, "ldr_order: out of memory");
	}
	if (nbatches)
		memcpy(o->sizes, sizes, nbatches * sizeof(*sizes));
	if (nindices)
		memcpy(o->indices, indices, nindices * sizeof(*indices));
	deadline_after(&deadline, CALL_TIMEOUT_MS);
	pthread_mutex_lock(&c->lock);
	r = a->detached ? set_err(-EBADF, "ldr_order: the attachment was detached")
	    : !a->opts.client_order ? set_err(-EINVAL, "ldr_order: the attachment was not made "
	                                      "with client_order: it reads the pipeline's order")
	    : wait_connected(c, &deadline);
	if (r == -ETIMEDOUT)
		r = set_err(r, "ldr_order: the daemon at %s went away and libloader is still "
		            "reconnecting after %d ms", c->path, CALL_TIMEOUT_MS);
	if (r == 0 && a->lost)
		r = set_err(a->err, "%s", a->errmsg);
	if (r < 0) {
		pthread_mutex_unlock(&c->lock);
		rec_free(o);
		return r;
	}
	/* kept first: a restarted daemon is given it (reattach()) if this
	 * connection goes before it is all sent */
	*a->orders_tail = o;
	a->orders_tail = &o->next;
	next_epoch = a->onext_epoch;
	next_batch = a->onext_batch;
	open = a->oopen;
	a->onext_epoch = last ? epoch + 1 : epoch;
	a->onext_batch = last ? 0 : first_batch + nbatches;
	a->oopen = !last;
	cut = c->cuts;
	pthread_mutex_unlock(&c->lock);

	r = order_send_all(a, epoch, first_batch, sizes, nbatches, indices, last != 0, &cut, &sent);
	if (r == LDR_EDISCONNECTED) {
		pthread_mutex_lock(&c->lock);
		/* the reconnection gives it (a client that reconnects) */
		if (c->reconnecting || (c->reconnect_ms > 0 && !c->closing && c->cuts != cut))
			r = 0;
		pthread_mutex_unlock(&c->lock);
	}
	if (r < 0) {
		/* refused: the daemon has what it took of it, no more */
		pthread_mutex_lock(&c->lock);
		if (sent) {
			size_t k = 0;
			for (size_t b = 0; b < sent; b++)
				k += o->sizes[b];
			o->nbatches = sent;
			o->nindices = k;
			o->last = false;
			a->onext_epoch = epoch;
			a->onext_batch = first_batch + sent;
			a->oopen = true;
		} else {
			struct order_rec **pp = &a->orders;
			while (*pp && *pp != o)
				pp = &(*pp)->next;
			if (*pp) {
				*pp = o->next;
				if (a->orders_tail == &o->next)
					a->orders_tail = pp;
				rec_free(o);
			}
			a->onext_epoch = next_epoch;
			a->onext_batch = next_batch;
			a->oopen = open;
		}
		pthread_mutex_unlock(&c->lock);
	}
	return r;
}
