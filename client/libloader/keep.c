/* SPDX-License-Identifier: MIT */
/* libloader: batches held, kept (copy-on-write: ldr_batch_keep()) and the room a
 * trainer holding its whole share needs (make_room()).
 */
#include "libloader-private.h"
#include "slabmap.h"

/* The effective share: what the daemon said, nslots while it says nothing. */
uint32_t share_now(const struct ldr_attachment *a)
{
	return a->share && a->share < a->nslots ? a->share : a->nslots;
}

/* Called with c->lock held. */
void held_add(struct ldr_attachment *a, struct ldr_batch *b)
{
	b->next = NULL;
	b->prev = a->held_tail;
	if (a->held_tail)
		a->held_tail->next = b;
	else
		a->held_head = b;
	a->held_tail = b;
	b->in_held = true;
	a->nheld++;
}

/* Called with c->lock held. */
void held_del(struct ldr_attachment *a, struct ldr_batch *b)
{
	if (!b->in_held)
		return;
	if (b->prev)
		b->prev->next = b->next;
	else
		a->held_head = b->next;
	if (b->next)
		b->next->prev = b->prev;
	else
		a->held_tail = b->prev;
	b->prev = b->next = NULL;
	b->in_held = false;
	a->nheld--;
}

/*
 * Keep @b: the pages of the fields in @mask become private at the batch's
 * addresses (slabmap_keep), slot b->slot is served from another view from now
 * on, and the lease goes back (@release; ldr_detach drops them all at once).
 * A batch of a retired mapping (its daemon is gone) has no lease and its slot
 * no future. Called with c->lock held, which it drops during the copy;
 * b->busy makes ldr_release() of @b from another thread wait meanwhile.
 */
int keep_locked(struct ldr_attachment *a, struct ldr_batch *b, uint64_t mask, bool release)
{
	struct ldr_client *c = a->c;
	struct amap *m = b->map;
	struct slabmap_range rs[MAX_FIELDS];
	uint64_t off = (uint64_t)b->slot * a->slot_bytes;
	uint8_t *view = NULL;
	bool need_view, fresh = false;
	size_t copied = 0;
	int n = 0, how;

	while (b->busy)
		pthread_cond_wait(&c->cond, &c->lock);
	if (b->kept)
		return 0;
	if (a->dev)
		return set_err(-ENOTSUP, "a batch in CUDA device memory cannot be kept: copy (clone) it "
		               "and release it instead");
	if (!a->cow)
		return set_err(-ENOTSUP, "batches of this pipeline cannot be kept: its slots of %" PRIu64
		               " bytes are not whole pages of %zu bytes", a->slot_bytes, slabmap_page());
	/* a fresh view needs room in m->views before the lock goes */
	if (m->nviews == m->viewcap) {
		size_t cap = m->viewcap ? m->viewcap * 2 : 8;
		void **v = realloc(m->views, cap * sizeof(*v));
		if (!v)
			return set_err(-ENOMEM, "out of memory");
		m->views = v;
		m->viewcap = cap;
	}
	for (int f = 0; f < a->nfields && f < 64; f++)
		if (mask & (1ULL << f)) {
			rs[n].off = a->fields[f].offset;
			rs[n].len = a->fields[f].sample_bytes * b->rows;
			n++;
		}
	/* after detach (or a restart) no batch comes any more in this mapping:
	 * the slot needs no other view */
	need_view = !a->detached && m == a->map && m->slotaddr[b->slot] == b->data;
	if (need_view)
		view = spare_pop(m, b->slot);
	b->busy = true;
	pthread_mutex_unlock(&c->lock);
	how = 0;
	if (need_view && !view) {
		view = slabmap_map(m->fd, a->slot_bytes, off);
		fresh = view != NULL;
		if (!view)
			how = -errno;
	}
	if (how == 0)
		how = slabmap_keep(b->data, a->slot_bytes, rs, n, &copied);
	pthread_mutex_lock(&c->lock);
	if (fresh)
		m->views[m->nviews++] = view;
	b->busy = false;
	pthread_cond_broadcast(&c->cond);
	if (how < 0) {
		if (view)
			spare_push(m, b->slot, view);
		return set_err(how, "cannot keep the batch (epoch %" PRIu64 ", index %" PRIu64 "): %s",
		               b->epoch, b->index, strerror(-how));
	}
	/* the daemon may have restarted while the lock was dropped */
	if (need_view && m == a->map)
		m->slotaddr[b->slot] = view;
	else if (need_view)
		spare_push(m, b->slot, view);
	b->kept = how;
	held_del(a, b);
	a->kept_batches++;
	a->kept_bytes += copied;
	if (release && m == a->map)
		queue_release(a, b->lease);
	return 0;
}

int ldr_batch_keep(struct ldr_batch *b, uint64_t field_mask)
{
	struct ldr_attachment *a = b->att;
	struct ldr_client *c = a->c;
	int r;

	CHECK_PID(c);
	pthread_mutex_lock(&c->lock);
	r = keep_locked(a, b, field_mask, true);
	pthread_mutex_unlock(&c->lock);
	return r;
}

int ldr_batch_is_kept(const struct ldr_batch *b)
{
	struct ldr_client *c = b->att->c;
	int r;

	bool locked = reader_lock(c);
	r = b->kept != 0;
	reader_unlock(c, locked);
	return r;
}

/*
 * The trainer holds its whole share and nothing is on its way: no batch can
 * come until it gives one back. Keep the oldest it holds (a copy each) until
 * it holds share - 1, and send their releases at once. Called with c->lock
 * held (dropped while copying).
 */
int make_room(struct ldr_attachment *a)
{
	uint32_t share = share_now(a);
	int r = 0;

	if (a->dev || !a->cow)
		return set_err(-ENOBUFS, "this process holds %u batches of the pipeline, its share of "
		               "the %u slots, and %s: release batches before asking for more, or give "
		               "the pipeline a larger prefetch", a->nheld, a->nslots,
		               a->dev ? "batches in CUDA device memory cannot be kept (copied)"
		                      : "this pipeline's slots are not whole pages, so they cannot be kept");
	while (a->held_head && a->nheld >= share) {
		r = keep_locked(a, a->held_head, ~(uint64_t)0, true);
		if (r < 0)
			break;
	}
	flush_now(a);
	return r;
}
