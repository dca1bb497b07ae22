/* SPDX-License-Identifier: MIT */
/* attachment - an attachment's life: releasing leases, its requests, leaving
 *
 * An attachment is one client's reading of a pipeline in one mode. It holds
 * leases on the slots it was delivered, and its fd-channel token. attach.c
 * makes it; here it takes Next and Release requests, hands its fds out,
 * reports itself, and leaves.
 */
#include "engine-private.h"

static void att_unlink(struct attachment *a)
{
	struct attachment **pp;

	for (pp = &a->eng->atts; *pp; pp = &(*pp)->all_next)
		if (*pp == a) {
			*pp = a->all_next;
			break;
		}
}

/* Cut an attachment off its pipeline: leases released, requests answered. */
void att_leave(struct attachment *a, int err, const char *msg)
{
	struct pipeline *pl = a->pl;
	struct stream *s = a->stream;
	struct attachment **pp;

	if (!pl || a->left)
		return;
	if (pl->held_by == a)
		pl->held_by = NULL;
	att_fail_pending(a, err, msg);
	if (a->dev) {
		a->dev->natts--;
		devcopy_maybe_free(a->dev);
		a->dev = NULL;
	}
	for (pp = &s->atts; *pp; pp = &(*pp)->next)
		if (*pp == a) {
			*pp = a->next;
			break;
		}
	s->natts--;
	s->groups[a->group].natts--;
	pl->natts--;
	a->left = true;
	a->stream = NULL;
	if (s->mode == LDR_MODE_BROADCAST && s->natts == 0) {
		/* what the last client received is consumed: keep only the rest */
		while (s->ring_len && s->head_seq < a->cursor && s->ring[s->ring_head].ready &&
		       !batch_leased(&s->ring[s->ring_head]))
			ring_pop_head(s);
	}
	if (s->mode == LDR_MODE_BROADCAST && !s->groups[a->group].natts)
		stream_drop_unread(s); /* its seed group's slots go back */
	if (s->mode == LDR_MODE_PARTITION) {
		s->dead = true;
		pl->nstreams--;
		/* drop ready batches now; in-flight ones when their job ends */
		while (s->ring_len && s->ring[s->ring_head].ready)
			ring_pop_head(s);
		stream_maybe_free(s);
	}
	pl->eng->hooks->lifetime(pl);
}

static void att_release_all(struct attachment *a, struct pipeline *pl)
{
	while (a->leases) {
		struct lease *l = a->leases;
		a->leases = l->next;
		l->slot->leases--;
		slot_unref(pl, l->slot);
		free(l);
	}
	a->nleases = 0;
}

void att_disconnect(struct attachment *a, int err, const char *msg)
{
	struct pipeline *pl = a->pl;

	if (!pl)
		return;
	att_release_all(a, pl);   /* first, so that the ring keeps none of them */
	att_leave(a, err, msg);   /* nothing when it left already (slow.c) */
	a->pl = NULL;
	pl->eng->hooks->lifetime(pl);
}

void attachment_detach(struct attachment *a)
{
	struct pipeline *pl;

	if (!a)
		return;
	pl = a->pl;
	att_disconnect(a, ECANCELED, "detached");
	attring_close(a);
	att_unlink(a);
	free(a);
	if (pl)
		pipeline_update(pl);
}

void attachment_get_info(struct attachment *a, struct attach_info *info)
{
	const struct pipeline *pl = a->pl;
	const struct stream *s = a->stream;

	memset(info, 0, sizeof(*info));
	info->id = a->id;
	memcpy(info->token, a->token, sizeof(info->token));
	if (!pl)
		return;
	info->slab_bytes = pl->slab->size;
	info->slot_bytes = pl->slot_bytes;
	info->nslots = pl->nslots;
	info->batch_size = pl->spec->batch_size;
	info->batches_per_epoch = s->bpe;
	info->epochs = pl->spec->epochs;
	if (s->client_order) {
		/* its client's order says how many (0 here) and where it starts */
		info->start_epoch = s->corder.next_epoch;
		info->start_batch = s->corder.next_batch;
	} else {
		info->samples = sampler_samples_per_epoch(&s->sampler);
		info->start_epoch = a->start_seq / s->bpe;
		info->start_batch = a->start_seq % s->bpe;
		info->has_start_position = s->sampler.tail_start != 0;
		info->start_position = s->sampler.tail_start;
	}
	info->nfields = pl->nfields;
	info->fields = pl->fields;
	info->field_offsets = pl->field_off;
	if (a->dev)
		info->dslab = a->dev->ds;
	info->share = att_share(a);
	info->credits = a->credits;
	a->told_share = info->share;
	info->ring_bytes = attring_bytes(a);
	info->owner = pl->owner;
	info->spec_hash = spec_hash(pl->spec);
}

void attachment_fail(struct attachment *a, int err, const char *msg)
{
	struct pipeline *pl = a->pl;

	if (!pl)
		return;
	a->dead = true;
	a->dead_err = err;
	snprintf(a->dead_msg, sizeof(a->dead_msg), "%s", msg);
	att_disconnect(a, err, msg);
	/* what it held back (a broadcast stream's slots it had not read)
	 * goes to the others now: they may send nothing that would look */
	pipeline_update(pl);
}

uint64_t attachment_id(const struct attachment *a)
{
	return a->id;
}

uint64_t attachment_client(const struct attachment *a)
{
	return a->client_id;
}

size_t attachment_leases(const struct attachment *a)
{
	return a->nleases;
}

json_t *attachment_json(const struct attachment *a)
{
	json_t *o = json_pack("{s:I, s:s?, s:s, s:I, s:I, s:I}",
		"id", (json_int_t)a->id,
		"pipeline", a->pl ? a->pl->spec->name : NULL,
		"mode", mode_name(a->mode),
		"leases", (json_int_t)a->nleases,
		"delivered", (json_int_t)a->delivered,
		"pending", (json_int_t)a->npending);
	if (a->has_seed)
		json_object_set_new(o, "augment_seed", json_integer((json_int_t)a->seed));
	json_object_set_new(o, "job", json_string(a->job));
	/* its window, and whether the daemon chose it (the client asked for 0) */
	json_object_set_new(o, "inflight", json_integer(a->credits));
	json_object_set_new(o, "inflight_auto", json_boolean(a->credits_auto));
	if (a->mode == LDR_MODE_PARTITION) {
		json_object_set_new(o, "rank", json_integer(a->rank));
		json_object_set_new(o, "world_size", json_integer(a->world));
		if (a->stream && a->stream->sampler.tail_start)
			/* an elastic resume: that epoch is the tail from that position */
			json_object_set_new(o, "tail", json_pack("{s:I, s:I}",
				"epoch", (json_int_t)a->stream->sampler.tail_epoch,
				"position", (json_int_t)a->stream->sampler.tail_start));
	}
	if (a->stream && a->stream->bpe) {
		uint64_t pos = a->mode == LDR_MODE_DYNAMIC ? a->stream->cursor : a->cursor;
		json_object_set_new(o, "position", json_pack("{s:I, s:I}",
			"epoch", (json_int_t)(pos / a->stream->bpe),
			"batch", (json_int_t)(pos % a->stream->bpe)));
	}
	if (a->stream && a->stream->client_order) {
		/* where its next batch and its next Order stand (order.c) */
		const struct stream *s = a->stream;
		const struct order_batch *ob = order_at(s, a->cursor);
		if (ob)
			json_object_set_new(o, "position", json_pack("{s:I, s:I}",
				"epoch", (json_int_t)ob->epoch, "batch", (json_int_t)ob->index));
		json_object_set_new(o, "client_order", json_pack("{s:I, s:I, s:b, s:I, s:I}",
			"next_epoch", (json_int_t)s->corder.next_epoch,
			"next_batch", (json_int_t)s->corder.next_batch,
			"open", s->corder.open,
			"batches_ahead", (json_int_t)(order_end(s) - a->cursor),
			"bytes", (json_int_t)order_bytes(s)));
	}
	if (a->stream) {
		json_object_set_new(o, "share", json_integer(att_share(a)));
		json_object_set_new(o, "revokes", json_integer((json_int_t)a->revokes));
		json_object_set_new(o, "returned", json_integer((json_int_t)a->returned));
	}
	json_object_set_new(o, "bad_releases", json_integer((json_int_t)a->bad_releases));
	if (a->mode == LDR_MODE_BROADCAST)
		json_object_set_new(o, "skipped", json_integer((json_int_t)a->skipped));
	json_object_set_new(o, "ring", json_boolean(a->ring != NULL));
	if (a->pl)
		json_object_set_new(o, "stats", stats_att_json(a));
	if (a->dead)
		json_object_set_new(o, "error", json_string(a->dead_msg));
	return o;
}

static struct lease **att_find_lease(struct attachment *a, uint64_t id)
{
	struct lease **pp = &a->leases;

	while (*pp && (*pp)->id != id)
		pp = &(*pp)->next;
	return *pp ? pp : NULL;
}

/*
 * The client's answer to a Revoke: the deliveries return_from .. upto - 1,
 * which its trainer never took, come back. Checked whole before anything
 * changes: they must be exactly the newest deliveries, in order, or the
 * newest batches below the Ends it was delivered after them (a return that
 * ends at end_dno: the client dropped those Ends). Then the attachment
 * rewinds, so they are delivered again, and the End after them; a dynamic
 * stream puts them first in line for whoever asks.
 */
static int att_take_back(struct attachment *a, const struct next_req *rq, char *err, size_t errlen)
{
	struct pipeline *pl = a->pl;
	struct stream *s = a->stream;
	size_t n = rq->nreturned;
	bool rewind = a->deliver_no == a->revoke_upto;
	/* with the Ends above them (the Revoke's ends_from) */
	bool ends = n > 0 && a->end_dno < a->revoke_upto && rq->return_from + n == a->end_dno;
	uint64_t returned_rows = 0;
	size_t again = 0;

	if (!a->revoking)
		return errfmt(-EPROTO, err, errlen,
		              "return: no Revoke is out on attachment %" PRIu64, a->id);
	a->revoking = false;
	a->rv_dno = UINT64_MAX; /* refused: the next watch is sent the Revoke again */
	if (n > a->nleases || (rq->return_from + n != a->revoke_upto && !ends))
		return errfmt(-EPROTO, err, errlen,
		              "return: %zu deliveries from %" PRIu64 " do not end at %" PRIu64
		              ", where the Revoke was sent", n, rq->return_from, a->revoke_upto);
	for (size_t i = 0; i < n; i++) {
		struct lease **pp = att_find_lease(a, rq->returned[i]);
		if (!pp || (*pp)->dseq != rq->return_from + i)
			return errfmt(-EPROTO, err, errlen,
			              "return: lease %" PRIu64 " is not delivery %" PRIu64
			              " of attachment %" PRIu64, rq->returned[i], rq->return_from + i, a->id);
	}
	/*
	 * What is delivered again: the run of returned batches that ends at the
	 * cursor, in stream order. Usually all of them; but a slow_clients skip
	 * (slow.c follow()) moves a broadcast client's cursor past batches it
	 * never received while older deliveries wait in its window, so the
	 * deliveries returned may straddle the jump. The cursor cannot go back
	 * over the jump (those batches may be gone from the stream): the older
	 * ones are given back without coming again, skipped as the jump was.
	 */
	if (s->mode != LDR_MODE_DYNAMIC && rewind)
		while (again < n && att_find_lease(a, rq->returned[n - 1 - again])[0]->seq ==
		       a->cursor - 1 - again)
			again++;
	for (size_t i = 0; i < n; i++) {
		struct lease **pp = att_find_lease(a, rq->returned[i]);
		struct lease *l = *pp;
		returned_rows += l->rows;
		*pp = l->next;
		a->nleases--;
		l->slot->leases--;
		if (s->mode == LDR_MODE_DYNAMIC && rewind && s->nreturned < pl->nslots)
			/* the lease's slot reference becomes the returned batch's */
			s->returned[s->nreturned++] = (struct batch){ .seq = l->seq, .epoch = l->epoch,
				.index = l->index, .rows = l->rows, .ready = true, .slot = l->slot };
		else
			slot_unref(pl, l->slot);
		free(l);
	}
	if (rewind) {
		if (s->mode != LDR_MODE_DYNAMIC) {
			a->cursor -= again;
			a->skipped += n - again;
		}
		a->deliver_no = rq->return_from;
		if (a->end_dno != UINT64_MAX && n > 0)
			a->end_dno = UINT64_MAX; /* it comes again, after them */
		a->delivered -= n;
		a->returned += n;
		a->st.samples -= returned_rows;
		a->st.bytes -= returned_rows * pl->row_bytes;
	}
	a->rv_dno = att_batches_dno(a);
	return 0;
}

static void att_queue(struct attachment *a, struct pending *p)
{
	p->att = a;
	p->next = NULL;
	if (p->max < 1)
		p->max = 1;
	if (p->max > DELIVER_MAX_BATCHES)
		p->max = DELIVER_MAX_BATCHES;
	a->npending++;
	if (a->mode == LDR_MODE_DYNAMIC) {
		struct stream *s = a->stream;
		if (s->dyn_tail)
			s->dyn_tail->next = p;
		else
			s->dyn_head = p;
		s->dyn_tail = p;
	} else {
		if (a->pend_tail)
			a->pend_tail->next = p;
		else
			a->pend_head = p;
		a->pend_tail = p;
	}
}

int attachment_next(struct attachment *a, struct pending *p, const struct next_req *rq,
                    char *err, size_t errlen)
{
	struct pipeline *pl = a->pl;
	int r = 0;

	if (!pl)
		return errfmt(a->dead ? -(a->dead_err ? a->dead_err : ENOENT) : -ECANCELED, err, errlen, "%s",
		              a->dead ? a->dead_msg : "detached");
	if (rq->stats)
		stats_report(a, rq->stats);
	for (size_t i = 0; i < rq->nreleases; i++) {
		struct lease **pp = att_find_lease(a, rq->releases[i]);
		if (!pp) {
			r = errfmt(-ENOENT, err, errlen,
			           "release: no lease %" PRIu64 " on attachment %" PRIu64,
			           rq->releases[i], a->id);
			/* a Next still counts (below): the count and a line at
			 * the 1st, 2nd, 4th... are what is left of it */
			a->bad_releases++;
			if (!(a->bad_releases & (a->bad_releases - 1)))
				log_event(LOG_WARNING, "client.bad_release", "pipeline=%s attachment=%" PRIu64
				          " client=%" PRIu64 " pid=%d lease=%" PRIu64 " bad_releases=%" PRIu64
				          ": it holds no such lease", pl->spec->name, a->id, a->client_id,
				          a->pid, rq->releases[i], a->bad_releases);
			continue;
		}
		struct lease *l = *pp;
		*pp = l->next;
		a->nleases--;
		l->slot->leases--;
		slot_unref(pl, l->slot);
		free(l);
	}
	if (a->left) {
		/* Detached for being slow (slow.c), it keeps the slots of the
		 * batches it still holds until it releases them, detaches or goes:
		 * its trainer may read them still, delivered before it learnt. */
		if (!a->nleases)
			att_disconnect(a, a->dead_err, a->dead_msg);
		pipeline_update(pl);
		return errfmt(-(a->dead_err ? a->dead_err : ETIMEDOUT), err, errlen, "%s", a->dead_msg);
	}
	if (p)
		r = 0; /* a bad release is the client's bug; its request still counts */
	if (rq->has_return && (r = att_take_back(a, rq, err, errlen)) < 0)
		p = NULL;
	if (p && rq->watch) {
		if (a->watch) {
			r = errfmt(-EAGAIN, err, errlen,
			           "attachment %" PRIu64 " has a watch parked already", a->id);
		} else {
			p->att = a;
			p->next = NULL;
			a->watch = p;
		}
	} else if (p) {
		if (a->npending >= a->credits) {
			r = errfmt(-EAGAIN, err, errlen,
			           "too many requests in flight: %u (credits %u)", a->npending + 1,
			           a->credits);
		} else {
			att_queue(a, p);
		}
	}
	pipeline_update(pl);
	return r;
}

int engine_take_token(struct engine *eng, const uint8_t *token, uid_t uid, pid_t pid, int *fd,
                      uint64_t *size, int *dev_fd, uint64_t *dev_size, int *ring_fd, int *ring_efd)
{
	int r;

	uint64_t now = uv_now(eng->loop);

	for (struct attachment *a = eng->atts; a; a = a->all_next) {
		if (!a->token_valid || memcmp(a->token, token, FD_TOKEN_BYTES) != 0)
			continue;
		/* spent only once the fd is out: after EPERM (another uid tried
		 * it), EAGAIN or EMFILE/ENOMEM its client may still redeem it */
		if (now > a->token_expiry || !a->pl) {
			a->token_valid = false;
			return -ETIMEDOUT;
		}
		if (uid != a->uid && uid != 0)
			return -EPERM;
		if (!a->pl->slab->sealed)
			return -EAGAIN;
		if ((r = holds_hand_out(a->pl, pid, uid, fd)) < 0)
			return r;
		a->token_valid = false;
		*size = a->pl->slab->size;
		*dev_fd = -1;
		*dev_size = 0;
		attring_fds(a, ring_fd, ring_efd);
		if (a->dev && a->dev->ds->kind == CUDA_MEM_VMM) {
			*dev_fd = a->dev->ds->fd;
			*dev_size = a->dev->ds->bytes;
		}
		return 0;
	}
	return -ENOENT;
}
