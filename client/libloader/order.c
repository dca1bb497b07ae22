/* SPDX-License-Identifier: MIT */
/* libloader: ldr_order(), a client_order attachment's batches, in requests
 * under the message limit.
 *
 * A sampler's epoch may list millions of indices; one Order request carries
 * at most ORDER_CHUNK_INDICES of them (10 bytes each at most on the wire,
 * with the sizes 5 bytes each: under LDR_MSG_MAX), whole batches only, so
 * the daemon can start on the first batches while the rest are on the way.
 */
#include "libloader-private.h"

#define ORDER_CHUNK_INDICES 49152u

static int order_send(struct ldr_attachment *a, uint64_t epoch, uint64_t first, const uint32_t *sizes,
                      size_t nbatches, const uint64_t *indices, size_t nindices, bool last)
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
	r = call(a->c, &req, &rep, LOADERD__REPLY__BODY_OK);
	if (r == 0)
		loaderd__reply__free_unpacked(rep, NULL);
	return r;
}

int ldr_order(struct ldr_attachment *a, uint64_t epoch, uint64_t first_batch,
              const uint32_t *sizes, size_t nbatches, const uint64_t *indices, int last)
{
	struct ldr_client *c;
	size_t b = 0, off = 0;
	int r;

	if (!a)
		return set_err(-EINVAL, "ldr_order: no attachment");
	c = a->c;
	CHECK_PID(c);
	if (nbatches && (!sizes || !indices))
		return set_err(-EINVAL, "ldr_order: %zu batches without their sizes or indices", nbatches);
	pthread_mutex_lock(&c->lock);
	r = a->detached ? set_err(-EBADF, "ldr_order: the attachment was detached")
	    : a->lost ? set_err(a->err, "%s", a->errmsg)
	    : !a->opts.client_order ? set_err(-EINVAL, "ldr_order: the attachment was not made "
	                                      "with client_order: it reads the pipeline's order")
	    : 0;
	pthread_mutex_unlock(&c->lock);
	if (r < 0)
		return r;
	do {
		size_t n = 0, k = 0;
		/* whole batches up to the chunk's indices, at least one */
		while (b + n < nbatches && (n == 0 || k + sizes[b + n] <= ORDER_CHUNK_INDICES)) {
			k += sizes[b + n];
			n++;
		}
		if ((r = order_send(a, epoch, first_batch + b, n ? sizes + b : NULL, n,
		                    k ? indices + off : NULL, k, last && b + n == nbatches)) < 0)
			return r;
		b += n;
		off += k;
	} while (b < nbatches);
	return 0;
}
