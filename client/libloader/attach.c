/* SPDX-License-Identifier: MIT */
/* libloader: ldr_attach() and ldr_detach(): the attach options, the layout of
 * the attach reply, the request contexts, the attachment's references.
 */
#include <stddef.h>

#include "libloader-private.h"
#include "config.h"
#include "devmap.h"
#include "slabmap.h"

static int req_open(struct ldr_client *c, struct req *r, struct ldr_attachment *a, bool is_release)
{
	int rv;

	r->att = a;
	r->is_release = is_release;
	if ((rv = nng_ctx_open(&r->ctx, c->sock)) != 0)
		return nng_to_errno(rv);
	if ((rv = nng_aio_alloc(&r->aio, req_cb, r)) != 0) {
		nng_ctx_close(r->ctx);
		return -ENOMEM;
	}
	r->open = true;
	return 0;
}

static void req_close(struct req *r)
{
	if (!r->open)
		return;
	nng_aio_stop(r->aio);
	if (r->state == REQ_SENDING) {
		nng_msg *m = nng_aio_get_msg(r->aio);
		if (m && nng_aio_result(r->aio) != 0)
			nng_msg_free(m);
	}
	nng_aio_free(r->aio);
	nng_ctx_close(r->ctx);
	r->open = false;
}

/*
 * The caller's options as this library knows them: the fields that lie
 * wholly within @in->size bytes (0: LDR_ATTACH_OPTS_SIZE_V1), the others 0
 * (their defaults). Fields this library does not know must be 0.
 */
static int read_attach_opts(const struct ldr_attach_opts *in, struct ldr_attach_opts *o)
{
	size_t n;

	memset(o, 0, sizeof(*o));
	if (!in)
		return 0;
	n = in->size ? in->size : LDR_ATTACH_OPTS_SIZE_V1;
	if (n < sizeof(in->size))
		return set_err(-EINVAL, "ldr_attach_opts.size %zu is below the smallest layout", n);
	if (n > sizeof(*o)) {
		const unsigned char *extra = (const unsigned char *)in + sizeof(*o);
		for (size_t i = 0; i < n - sizeof(*o); i++)
			if (extra[i])
				return set_err(-E2BIG, "ldr_attach_opts of %zu bytes sets options beyond the %zu "
				               "bytes this libloader (%s) knows", n, sizeof(*o), LOADERD_VERSION);
	}
#define OPT(f)                                                                          \
	do {                                                                            \
		if (n >= offsetof(struct ldr_attach_opts, f) + sizeof(o->f))             \
			o->f = in->f;                                                   \
	} while (0)
	OPT(mode);
	OPT(rank);
	OPT(world_size);
	OPT(has_start);
	OPT(start_epoch);
	OPT(start_batch);
	OPT(inflight);
	OPT(device_kind);
	OPT(device_index);
	/* V2's fields both or neither: a V1 caller's sizeof is V1 rounded up to
	 * 8, and has_augment_seed lies in that tail padding, whatever it holds */
	if (n >= LDR_ATTACH_OPTS_SIZE_V2) {
		o->has_augment_seed = in->has_augment_seed;
		o->augment_seed = in->augment_seed;
	}
	OPT(job);
	OPT(client_order);
	/* V5's fields both or neither: has_start_position may lie in a V4
	 * caller's tail padding */
	if (n >= LDR_ATTACH_OPTS_SIZE_V5) {
		o->has_start_position = in->has_start_position;
		o->start_position = in->start_position;
	}
#undef OPT
	o->size = sizeof(*o);
	return 0;
}

/*
 * The layout an attach reply gives (slots, epochs, fields) into @a: a new
 * attachment's, or the re-attached one's to compare (reattach()).
 */
int att_read_reply(struct ldr_attachment *a, const Loaderd__AttachReply *ar)
{
	a->id = ar->attach_id;
	a->slot_bytes = ar->slot_bytes;
	a->nslots = ar->nslots;
	a->batch_size = ar->batch_size;
	a->bpe = ar->batches_per_epoch;
	a->epochs = ar->epochs;
	a->samples = ar->samples;
	a->share = ar->share;
	a->pos_epoch = ar->start_epoch;
	a->pos_batch = ar->start_batch;
	a->has_owner = ar->has_owner;
	a->owner = (uid_t)ar->owner;
	a->spec_hash = ar->spec_hash;
	if (ar->n_fields > MAX_FIELDS || ar->n_fields == 0)
		return set_err(-EPROTO, "attach reply has %zu fields", ar->n_fields);
	a->nfields = (int)ar->n_fields;
	for (size_t f = 0; f < ar->n_fields; f++) {
		const Loaderd__Field *fd_ = ar->fields[f];
		struct afield *af = &a->fields[f];
		if (fd_->n_sample_shape > LDR_MAX_DIMS - 1 || fd_->dtype >= LDR_DTYPE_COUNT ||
		    !field_fits(fd_->offset, a->batch_size, fd_->sample_bytes, a->slot_bytes))
			return set_err(-EPROTO, "attach reply: field %zu is malformed (offset %" PRIu64
			               ", %u samples of %" PRIu64 " bytes, slots of %" PRIu64 " bytes)", f,
			               fd_->offset, a->batch_size, fd_->sample_bytes, a->slot_bytes);
		memset(af, 0, sizeof(*af));
		snprintf(af->name, sizeof(af->name), "%s", fd_->name);
		af->dtype = (enum ldr_dtype)fd_->dtype;
		af->ndim = (int)fd_->n_sample_shape;
		for (size_t d = 0; d < fd_->n_sample_shape; d++)
			af->shape[d] = fd_->sample_shape[d];
		af->offset = fd_->offset;
		af->sample_bytes = fd_->sample_bytes;
	}
	return 0;
}

/*
 * Did the daemon take the tail an attach asked for (Attach.start_position)?
 * An older daemon ignores the field and would serve the plain share: other
 * samples than the resume needs, so the attach fails instead.
 */
int att_tail_taken(bool asked, uint64_t position, const Loaderd__AttachReply *ar)
{
	if (!asked || position == 0 || (ar->has_start_position && ar->start_position == position))
		return 0;
	return set_err(-EPROTONOSUPPORT, "the daemon did not take start_position %" PRIu64 " (an "
	               "elastic resume): it is older than this libloader (%s); upgrade the daemon",
	               position, LOADERD_VERSION);
}

/* Ask for a batch ring? Yes, unless $LOADERD_RING is 0 (the socket's batch
 * path, to compare them). */
bool ring_wanted(void)
{
	const char *v = getenv("LOADERD_RING");

	return !v || strcmp(v, "0") != 0;
}

/*
 * The job of an attach (docs/spec.md, "Jobs") into @buf: @job, else
 * torchrun's run id (its default "none" names no run), else "" (the daemon
 * takes the process as its job).
 */
static int attach_job(const char *job, char *buf, size_t len)
{
	const char *v = job && *job ? job : getenv("TORCHELASTIC_RUN_ID");

	if (!v || (v != job && strcmp(v, "none") == 0))
		v = "";
	if (strlen(v) > LDR_JOB_MAX)
		return set_err(-EINVAL, "job %s is %zu bytes, the most is %d", v == job ? "name" :
		               "$TORCHELASTIC_RUN_ID", strlen(v), LDR_JOB_MAX);
	for (const char *p = v; *p; p++)
		if (*p < 0x20 || *p > 0x7e)
			return set_err(-EINVAL, "job %s has byte 0x%02x at %zu: printable ASCII only",
			               v == job ? "name" : "$TORCHELASTIC_RUN_ID", (unsigned char)*p,
			               (size_t)(p - v));
	snprintf(buf, len, "%s", v);
	return 0;
}

/* Ask the daemon to attach to @pipeline with @opts, as job @job. */
static int attach_call(struct ldr_client *c, const char *pipeline, const struct ldr_attach_opts *opts,
                       char *job, Loaderd__Reply **rep)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Attach at = LOADERD__ATTACH__INIT;

	at.pipeline = (char *)pipeline;
	at.mode = (Loaderd__Mode)opts->mode;
	at.rank = opts->rank;
	at.world_size = opts->world_size;
	at.has_start = opts->has_start != 0;
	at.start_epoch = opts->start_epoch;
	at.start_batch = opts->start_batch;
	at.credits = opts->inflight; /* 0: the daemon sizes it from the batch bytes */
	at.device_kind = (uint32_t)opts->device_kind;
	at.device_index = opts->device_kind != LDR_DEVICE_HOST ? opts->device_index : 0;
	at.has_augment_seed = opts->has_augment_seed != 0;
	at.augment_seed = opts->augment_seed;
	at.ring = opts->device_kind == LDR_DEVICE_HOST && ring_wanted();
	at.job = job;
	at.client_order = opts->client_order != 0;
	at.has_start_position = opts->has_start_position != 0;
	at.start_position = opts->start_position;
	req.body_case = LOADERD__REQUEST__BODY_ATTACH;
	req.attach = &at;
	return call(c, &req, rep, LOADERD__REPLY__BODY_ATTACH);
}

/*
 * Map what the attach reply @ar announces: the slab (its fd fetched over the
 * fd channel), the batch ring, the device slab of a CUDA attachment. On a
 * failure every fd it fetched is closed; the attachment's own state goes with
 * it (att_unref()). 0 or a negative errno, set_err() set.
 */
static int attach_map(struct ldr_attachment *a, const Loaderd__AttachReply *ar)
{
	uint64_t size = 0, dev_size = 0;
	int r = 0, fd, dev_fd = -1, ring_fd = -1, ring_efd = -1;
	char err[512];

	fd = fetch_slab_fd(ar->fd_path, a->c->daemon_uid, ar->fd_token.data, ar->fd_token.len, &size,
	                   &dev_fd, &dev_size, &ring_fd, &ring_efd);
	if (fd < 0)
		return fd;
	if (ar->ring_bytes && ring_fd < 0)
		r = set_err(-EPROTO, "attach reply: a batch ring of %" PRIu64 " bytes, but the fd channel "
		            "brought none", ar->ring_bytes);
	else if (ring_fd >= 0 && !ar->ring_bytes)
		r = set_err(-EPROTO, "the fd channel brought a batch ring the attach reply did not announce");
	else if (ring_fd >= 0)
		r = ring_open(a, ring_fd, ring_efd, ar->ring_bytes);
	if (r < 0 || (ring_fd >= 0 && !a->ringed)) {
		if (ring_fd >= 0) {
			close(ring_fd);
			close(ring_efd);
		}
		close(fd);
		if (dev_fd >= 0)
			close(dev_fd);
		return r;
	}
	if (size != ar->slab_bytes || size < (uint64_t)a->nslots * a->slot_bytes) {
		close(fd);
		if (dev_fd >= 0)
			close(dev_fd);
		return set_err(-EPROTO, "slab size mismatch");
	}
	if (ar->device_kind == LDR_DEVICE_CUDA) {
		a->device_kind = LDR_DEVICE_CUDA;
		a->device_index = ar->device_index;
		a->dstride = ar->device_slot_stride;
		if (a->dstride < a->slot_bytes || ar->device_slot_stride * a->nslots > ar->device_slab_bytes ||
		    (dev_fd >= 0 && dev_size != ar->device_slab_bytes)) {
			r = set_err(-EPROTO, "attach reply: device slab of %" PRIu64 " bytes cannot hold %u slots "
			            "%" PRIu64 " bytes apart", ar->device_slab_bytes, a->nslots, a->dstride);
			if (dev_fd >= 0)
				close(dev_fd);
		} else {
			r = devmap_open(&a->dev, ar->device_index, ar->device_memory, dev_fd, ar->device_slab_bytes,
			                ar->device_ipc_handle.data, ar->device_ipc_handle.len, err, sizeof(err));
			if (r < 0)
				set_err(r, "%s", err);
		}
		if (r < 0) {
			close(fd);
			return r;
		}
	} else if (dev_fd >= 0) {
		close(dev_fd);
	}
	/* Copy-on-write: the trainer may write into its batches (a written page
	 * becomes its own, and is discarded before the lease goes back). It
	 * needs slots of whole pages, as the daemon lays them out (4096 bytes). */
	a->cow = a->slot_bytes > 0 && a->slot_bytes % slabmap_page() == 0;
	if (!(a->map = amap_open(fd, size, a->nslots, a->slot_bytes, a->cow))) {
		r = set_err(-errno, "cannot map the slab: %s", strerror(errno));
		close(fd);
		return r;
	}
	return 0;
}

/* The request contexts: the window's, the Release's, and the watch's when
 * @watch. 0 or a negative errno, set_err() set. */
static int attach_open_reqs(struct ldr_attachment *a, bool watch)
{
	int r;

	for (int i = 0; i < a->inflight; i++)
		if ((r = req_open(a->c, &a->reqs[i], a, false)) < 0)
			return set_err(r, "cannot open request contexts");
	if ((r = req_open(a->c, &a->relreq, a, true)) < 0)
		return set_err(r < 0 ? r : -ENOMEM, "cannot open request contexts");
	/* A daemon that reports a share parks watches; an older one would take
	 * a watch for a Next asking for one batch. */
	if (watch) {
		if ((r = req_open(a->c, &a->watch, a, false)) < 0)
			return set_err(r, "cannot open request contexts");
		a->watch.is_watch = true;
	}
	return 0;
}

/* A failed attach: close what it opened, tell the daemon, drop @a. */
static void attach_undo(struct ldr_attachment *a)
{
	Loaderd__Request dreq = LOADERD__REQUEST__INIT;
	Loaderd__Detach det = LOADERD__DETACH__INIT;
	Loaderd__Reply *drep;
	char keep[sizeof(tls_err)];

	for (int i = 0; i < MAX_INFLIGHT; i++)
		req_close(&a->reqs[i]);
	req_close(&a->relreq);
	req_close(&a->watch);
	/* tell the daemon, so it does not keep a slot for us (the attach's
	 * error stays the thread's) */
	det.attach_id = a->id;
	dreq.body_case = LOADERD__REQUEST__BODY_DETACH;
	dreq.detach = &det;
	memcpy(keep, tls_err, sizeof(keep));
	if (call(a->c, &dreq, &drep, LOADERD__REPLY__BODY_OK) == 0)
		loaderd__reply__free_unpacked(drep, NULL);
	memcpy(tls_err, keep, sizeof(keep));
	att_unref(a);
}

int ldr_attach(struct ldr_client *c, const char *pipeline, const struct ldr_attach_opts *user_opts,
               struct ldr_attachment **out)
{
	char job[LDR_JOB_MAX + 1];
	struct ldr_attach_opts opts_buf;
	const struct ldr_attach_opts *opts = &opts_buf;
	Loaderd__Reply *rep;
	Loaderd__AttachReply *ar;
	struct ldr_attachment *a;
	int r;

	CHECK_PID(c);
	if ((r = read_attach_opts(user_opts, &opts_buf)) < 0 ||
	    (r = attach_job(opts_buf.job, job, sizeof(job))) < 0)
		return r;
	opts_buf.job = NULL; /* the caller's: a->job keeps the copy */
	if (!pipeline || strlen(pipeline) > LDR_NAME_MAX)
		return set_err(-EINVAL, "invalid pipeline name");
	if (opts->inflight > MAX_INFLIGHT)
		return set_err(-EINVAL, "inflight %u above the limit of %d", opts->inflight, MAX_INFLIGHT);
	r = attach_call(c, pipeline, opts, job, &rep);
	if (r < 0)
		return r;
	ar = rep->attach;

	a = calloc(1, sizeof(*a));
	if (!a) {
		r = set_err(-ENOMEM, "out of memory");
		goto fail_rep;
	}
	a->c = c;
	atomic_fetch_add(&c->refs, 1);
	atomic_init(&a->refs, 1);
	pthread_cond_init(&a->ev_cond, NULL);
	a->ring_efd = -1;
	snprintf(a->pipeline, sizeof(a->pipeline), "%s", pipeline);
	a->opts = *opts;
	snprintf(a->job, sizeof(a->job), "%s", job);
	if ((r = att_read_reply(a, ar)) < 0 ||
	    (r = att_tail_taken(opts->has_start_position != 0, opts->start_position, ar)) < 0)
		goto fail;
	orders_init(a);
	if (rel_reserve(a, a->nslots) < 0) {
		r = set_err(-ENOMEM, "out of memory");
		goto fail;
	}
	/* the daemon says which window it took (an older one says nothing,
	 * and takes 4 for a 0) */
	a->inflight = ar->credits ? (int)ar->credits : opts->inflight ? (int)opts->inflight : 4;
	if (a->inflight > MAX_INFLIGHT || (opts->inflight && ar->credits && ar->credits != opts->inflight)) {
		r = set_err(-EPROTO, "attach reply: a window of %u requests, asked for %u (most %d)",
		            ar->credits, opts->inflight, MAX_INFLIGHT);
		goto fail;
	}
	if ((r = attach_map(a, ar)) < 0)
		goto fail;
	if ((r = attach_open_reqs(a, ar->share != 0)) < 0)
		goto fail;
	loaderd__reply__free_unpacked(rep, NULL);

	pthread_mutex_lock(&c->lock);
	a->next = c->atts;
	c->atts = a;
	top_up(a);
	if (a->watch.open && !c->disconnected && req_send(a, &a->watch, 0) == 0)
		a->watching = true;
	pthread_mutex_unlock(&c->lock);
	*out = a;
	return 0;

fail:
	attach_undo(a);
fail_rep:
	loaderd__reply__free_unpacked(rep, NULL);
	return r;
}

void att_unref(struct ldr_attachment *a)
{
	struct ldr_client *c = a->c;

	if (atomic_fetch_sub(&a->refs, 1) != 1)
		return;
	if (a->waiter_running && c->pid == self_pid()) {
		/* it waits for the events still queued, then ends */
		pthread_mutex_lock(&c->lock);
		a->waiter_stop = true;
		pthread_cond_signal(&a->ev_cond);
		pthread_mutex_unlock(&c->lock);
		pthread_join(a->waiter, NULL);
	}
	devmap_close(a->dev);
	ring_close(a);
	pthread_cond_destroy(&a->ev_cond);
	amap_put(a, a->map);
	for (int i = 0; i < MAX_INFLIGHT; i++)
		free(a->ring[i].msg);
	orders_free(a);
	free(a->rel);
	free(a);
	if (c->pid == self_pid())
		client_unref(c);
}

int ldr_detach(struct ldr_attachment *a)
{
	struct ldr_client *c;
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Detach det = LOADERD__DETACH__INIT;
	Loaderd__Reply *rep;
	struct ldr_attachment **pp;
	struct timespec deadline;
	int r = 0;

	if (!a)
		return 0;
	c = a->c;
	CHECK_PID(c);
	pthread_mutex_lock(&c->lock);
	bool was_detached = a->detached;
	a->detached = true; /* nothing more goes out for it */
	/* The batches still held stay valid and unchanged: the daemon reuses
	 * their slots once we are gone. Their leases go with the attachment. */
	if (!a->dev && a->cow && !was_detached) {
		char keep[sizeof(tls_err)];
		memcpy(keep, tls_err, sizeof(keep));
		for (;;) {
			struct ldr_batch *b = a->held_head;
			while (b && b->keep_failed)
				b = b->next;
			if (!b)
				break;
			if (keep_locked(a, b, ~(uint64_t)0, false) < 0)
				b->keep_failed = true;
		}
		memcpy(tls_err, keep, sizeof(keep));
	}
	bool disc = c->disconnected; /* or reconnecting: it went with the old daemon */
	bool lost = a->lost;
	pthread_mutex_unlock(&c->lock);
	if (!disc && !lost) {
		det.attach_id = a->id;
		req.body_case = LOADERD__REQUEST__BODY_DETACH;
		req.detach = &det;
		r = call(c, &req, &rep, LOADERD__REPLY__BODY_OK);
		if (r == 0)
			loaderd__reply__free_unpacked(rep, NULL);
	}
	/* the daemon answers every parked Next of a detached attachment */
	deadline_after(&deadline, 5000);
	pthread_mutex_lock(&c->lock);
	while (a->outstanding > 0 && !c->disconnected && r == 0)
		if (pthread_cond_timedwait(&c->cond, &c->lock, &deadline) == ETIMEDOUT)
			break;
	for (pp = &c->atts; *pp; pp = &(*pp)->next)
		if (*pp == a) {
			*pp = a->next;
			break;
		}
	pthread_mutex_unlock(&c->lock);
	for (int i = 0; i < a->inflight; i++)
		req_close(&a->reqs[i]);
	req_close(&a->relreq);
	req_close(&a->watch);
	att_unref(a);
	return r == LDR_EDISCONNECTED ? 0 : r;
}
