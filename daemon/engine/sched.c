/* SPDX-License-Identifier: MIT */
/* sched - how the slots of a pipeline are shared between its streams
 *
 * The rule is the one docs/protocol.md writes down ("Sharing slots"): each
 * active stream (one an attachment reads) may hold N / S of the N slots; an
 * attachment may hold its share of leases (its stream's quota, split between
 * the attachments of the dynamic stream); a stream below its quota with no
 * slot free takes back the newest ready batches nobody has received from the
 * streams above theirs (they are rebuilt later, identical), and from a
 * broadcast stream any slot no lease holds, received or not (its batch is
 * built again for its clients that have not: stream_next_build()); an attachment
 * above its share is sent a Revoke on its watch and gives back what its
 * trainer has not taken. So no stream's prefetched batches, idle clients,
 * clients far apart or slow trainer can hold another stream's slots: only a trainer that holds
 * its whole share waits, and libloader then keeps (copies) its oldest batch.
 * The rule's numbers (pipeline_active_streams(), stream_quota(), att_share())
 * are stream.c's, as deliver.c and slow.c, below this file, read them too.
 */
#include "engine-private.h"

/* Would @s build another batch (or a slot of one) if slots were free? How
 * many it needs then in *@need. */
static bool stream_wants(const struct stream *s, uint32_t *need)
{
	struct batch *refill;

	if (s->dead)
		return false;
	if (s->mode == LDR_MODE_PARTITION && s->natts == 0)
		return false;
	/* Random transforms: a broadcast stream waiting for its min_clients
	 * builds nothing yet, so every seed group's first batch is the first
	 * (a batch has slots for the groups read when it is built). */
	if (s->mode == LDR_MODE_BROADCAST && !s->started && s->natts &&
	    s->natts < s->pl->spec->min_clients && source_augments(s->pl->src))
		return false;
	/* a batch takes a slot per seed group read (docs/spec.md, "Augment seeds") */
	*need = stream_next_build(s, &refill);
	return *need != UINT32_MAX && s->slots_held + *need <= stream_quota(s);
}

/* First seq none of @s's attachments has received. */
static uint64_t stream_unreceived(const struct stream *s)
{
	uint64_t hi = s->head_seq;

	if (s->mode == LDR_MODE_DYNAMIC)
		return s->cursor;
	for (const struct attachment *a = s->atts; a; a = a->next)
		if (a->cursor > hi)
			hi = a->cursor;
	return hi;
}

/* Can the newest batch of @s go back to the pool? Only a ready one that no
 * lease, device copy or attachment has touched: its slot's one reference is
 * the ring's. */
static struct batch *stream_reclaimable(struct stream *s)
{
	struct batch *b;

	if (!s->ring_len)
		return NULL;
	b = &s->ring[(s->ring_head + s->ring_len - 1) % s->pl->nslots];
	/* a failed batch holds no slot, and is not built twice */
	if (!b->ready || b->failed || b->seq < stream_unreceived(s))
		return NULL;
	for (uint32_t g = 0; g < AUG_GROUPS_MAX; g++) {
		const struct slot *slot = batch_slot(b, g);
		if (slot && (slot->refs != 1 || slot->leases))
			return NULL;
	}
	return b;
}

static void stream_reclaim(struct stream *s, struct batch *b)
{
	s->ring_len--;
	s->next_produce = b->seq; /* built again when it has room: the same bytes */
	s->reclaimed++;
	s->pl->reclaimed++;
	batch_unref(s->pl, b);
}

void stream_rebuild_unreceived(struct stream *s)
{
	struct batch *b;

	while ((b = stream_reclaimable(s)))
		stream_reclaim(s, b);
}

/* Batches handed back to a dynamic stream that nobody reads any more cannot
 * be rebuilt (the stream is past them) and would hold their slots until a
 * dynamic client came back: when a reader needs slots, they go. Dynamic
 * streams promise no fixed assignment; a later dynamic client misses them. */
static void pipeline_drop_orphan_returns(struct pipeline *pl, uint32_t need)
{
	for (struct stream *s = pl->streams; s && pl->nfree < need; s = s->next)
		while (!s->dead && !s->natts && s->nreturned && pl->nfree < need) {
			struct slot *slot = s->returned[--s->nreturned].slot;
			s->reclaimed++;
			pl->reclaimed++;
			slot_unref(pl, slot);
		}
}

/* The newest slot of broadcast stream @s that only its ring holds (no lease,
 * no device copy), whoever received its batch: given back, its batch is
 * built again for the clients that have not (stream_next_build()); those
 * that have do not wait for the others' slowest beyond the stream's quota. */
static bool stream_slot_reclaimable(struct stream *s, struct batch **bp, uint32_t *gp)
{
	for (uint32_t i = s->ring_len; i-- > 0;) {
		struct batch *b = &s->ring[(s->ring_head + i) % s->pl->nslots];
		if (!b->ready)
			continue;
		for (uint32_t g = 0; g < AUG_GROUPS_MAX; g++) {
			const struct slot *slot = batch_slot(b, g);
			if (slot && slot->refs == 1 && !slot->leases) {
				*bp = b;
				*gp = g;
				return true;
			}
		}
	}
	return false;
}

static bool batch_has_slots(const struct batch *b)
{
	for (uint32_t g = 0; g < AUG_GROUPS_MAX; g++)
		if (batch_slot(b, g))
			return true;
	return false;
}

static void stream_reclaim_slot(struct stream *s, struct batch *b, uint32_t g)
{
	struct slot *slot = batch_slot(b, g);

	if (g)
		b->more[g - 1] = NULL;
	else
		b->slot = NULL;
	s->reclaimed++;
	s->pl->reclaimed++;
	slot_unref(s->pl, slot);
	/* the newest batches left without a slot leave the ring: built again
	 * (the same bytes) when the stream has room */
	while (s->ring_len) {
		struct batch *t = &s->ring[(s->ring_head + s->ring_len - 1) % s->pl->nslots];
		if (!t->ready || t->failed || batch_has_slots(t))
			break;
		s->ring_len--;
		s->next_produce = t->seq;
	}
}

/* Free as many slots as the streams below their quota can use, from the
 * streams above theirs: streams nobody reads first, then the most above. A
 * broadcast stream gives back single slots, received or not: so no stream's
 * slow client holds another stream's slots. */
static void pipeline_reclaim(struct pipeline *pl)
{
	uint32_t need = 0, n;

	for (struct stream *s = pl->streams; s; s = s->next)
		if (s->natts && stream_wants(s, &n))
			need += stream_quota(s) - s->slots_held;
	while (pl->nfree < need) {
		struct stream *victim = NULL;
		struct batch *vb = NULL;
		uint32_t vg = 0;
		int64_t most = 0;
		for (struct stream *t = pl->streams; t; t = t->next) {
			int64_t over;
			struct batch *b;
			uint32_t g = AUG_GROUPS_MAX;
			if (t->dead)
				continue;
			over = (int64_t)t->slots_held - (t->natts ? stream_quota(t) : 0);
			if (over <= 0)
				continue;
			if (t->mode == LDR_MODE_BROADCAST && t->natts) {
				if (!stream_slot_reclaimable(t, &b, &g))
					continue;
			} else if (!(b = stream_reclaimable(t))) {
				continue;
			}
			if (!t->natts)
				over += pl->nslots;
			if (over > most) {
				most = over;
				victim = t;
				vb = b;
				vg = g;
			}
		}
		if (!victim)
			break;
		if (vg < AUG_GROUPS_MAX)
			stream_reclaim_slot(victim, vb, vg);
		else
			stream_reclaim(victim, vb);
	}
	pipeline_drop_orphan_returns(pl, need);
}

/* After `set prefetch` lowered the quotas: the ready batches nobody received
 * above a stream's quota go back to the pool (also those a Revoke handed
 * back), so the slots in use fall to the prefetch, not only their growth. */
static void pipeline_trim(struct pipeline *pl)
{
	if (pl->prefetch == pl->nslots)
		return;
	for (struct stream *s = pl->streams; s; s = s->next) {
		struct batch *b;
		while (!s->dead && s->slots_held > stream_quota(s) && (b = stream_reclaimable(s)))
			stream_reclaim(s, b);
	}
}

/* Ask every attachment above its share to hand back what its trainer has
 * not taken. One Revoke at a time; another only after new deliveries of
 * batches or a smaller share, so a trainer that holds its whole share is not
 * asked again and again. An attachment delivered its End too (its whole
 * stream is out) is told where its Ends begin (ends_from): the batches below
 * them can come back with them, and come again before the End. */
static void pipeline_revoke(struct pipeline *pl)
{
	for (struct stream *s = pl->streams; s; s = s->next) {
		if (s->dead)
			continue;
		for (struct attachment *a = s->atts; a; a = a->next) {
			uint32_t share = att_share(a);
			struct pending *p = a->watch;
			/* also when it holds just its new share: the client must learn
			 * it, or it waits for deliveries its old share would allow */
			bool stale = share < a->told_share && a->nleases >= share;
			if ((a->nleases <= share && !stale) || a->revoking || !p)
				continue;
			if (att_batches_dno(a) == a->rv_dno && share >= a->rv_share)
				continue;
			a->watch = NULL;
			a->revoking = true;
			a->revoke_upto = a->deliver_no;
			a->rv_dno = att_batches_dno(a);
			a->rv_share = share;
			a->told_share = share;
			a->revokes++;
			deliver(pl->eng, p, &(struct delivery){ .kind = DELIVER_REVOKE, .share = share,
				.upto_seq = a->deliver_no, .count = (uint32_t)(a->nleases - share),
				.ends_from = a->end_dno != UINT64_MAX ? a->end_dno : 0 });
		}
	}
}

static void pipeline_pump(struct pipeline *pl)
{
	struct engine *eng = pl->eng;
	bool progress = true;

	if (pl->failed || pl->dropped || eng->shutdown)
		return;
	pipeline_revoke(pl);
	pipeline_trim(pl);
	pipeline_reclaim(pl);
	/* one batch per stream per round: the free slots go round the streams */
	while (progress) {
		progress = false;
		for (struct stream *s = pl->streams; s; s = s->next) {
			uint32_t need;
			if (!stream_wants(s, &need) || pl->nfree < need)
				continue;
			if (stream_start_batch(s) < 0)
				return;
			progress = true;
		}
	}
	/* Report how long a slow broadcast client held the stream back. */
	struct stream *bs = pl->shared[LDR_MODE_BROADCAST];
	bool blocked = bs && bs->natts > 1 && bs->next_produce < bs->end_seq &&
	               (bs->slots_held + stream_batch_slots(bs) > stream_quota(bs) ||
	                pl->nfree < stream_batch_slots(bs)) &&
	               bs->ring_len > 0 && bs->ring[bs->ring_head].ready;
	uint64_t now = uv_now(eng->loop);
	if (blocked && !pl->blocked_since)
		pl->blocked_since = now ? now : 1;
	else if (!blocked && pl->blocked_since) {
		pl->backpressure_ms += now - pl->blocked_since;
		pl->blocked_since = 0;
	}
}

void pipeline_update(struct pipeline *pl)
{
	pipeline_dispatch(pl);
	pipeline_pump(pl);
	pipeline_dispatch(pl);
	pipeline_check_slow(pl);
}
