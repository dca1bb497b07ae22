/* SPDX-License-Identifier: MIT */
/* libloader: reconnecting to a restarted daemon: the flusher's reconnect_run()
 * dials and shakes hands again, creates the client's pipelines again and
 * re-attaches each attachment at the next batch its trainer has not taken.
 */
#include <stdarg.h>

#include "awscreds.h"
#include "libloader-private.h"

static double ms_since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) * 1000.0 + (double)(now.tv_nsec - t0->tv_nsec) / 1e6;
}

/* Tell the daemon we do not use attachment @id after all. */
static void detach_id(struct ldr_client *c, uint64_t id)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Detach det = LOADERD__DETACH__INIT;
	Loaderd__Reply *rep;
	char keep[sizeof(tls_err)];

	det.attach_id = id;
	req.body_case = LOADERD__REQUEST__BODY_DETACH;
	req.detach = &det;
	memcpy(keep, tls_err, sizeof(keep));
	if (call_gen(c, &req, &rep, LOADERD__REPLY__BODY_OK, CALL_TIMEOUT_MS, true) == 0)
		loaderd__reply__free_unpacked(rep, NULL);
	memcpy(tls_err, keep, sizeof(keep));
}

/* Drop what arrived from the old daemon and was not taken. Called with c->lock held. */
static void ring_clear(struct ldr_attachment *a)
{
	for (int i = 0; i < MAX_INFLIGHT; i++) {
		free(a->ring[i].msg);
		memset(&a->ring[i], 0, sizeof(a->ring[i]));
	}
	a->arrived = 0;
}

/* @a cannot follow the daemon: its next() says why from now on. Called with c->lock held. */
static void att_lose(struct ldr_attachment *a, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void att_lose(struct ldr_attachment *a, int err, const char *fmt, ...)
{
	va_list ap;

	a->lost = true;
	a->err = err;
	ring_clear(a); /* the trainer gets the error at its next batch */
	va_start(ap, fmt);
	vsnprintf(a->errmsg, sizeof(a->errmsg), fmt, ap);
	va_end(ap);
}

/*
 * Is @n, attached again, the pipeline of the owner @a found before the
 * restart? Else set_err() says whose it is now.
 */
static int same_owner(const struct ldr_attachment *a, const struct ldr_attachment *n)
{
	char was[96], now[96];

	if (a->has_owner && (!n->has_owner || n->owner != a->owner)) {
		if (!n->has_owner)
			return set_err(-EACCES, "the restarted daemon does not say whose pipeline '%s' is "
			               "(it was %s's)", a->pipeline, uid_name(a->owner, was, sizeof(was)));
		return set_err(-EACCES, "pipeline '%s' now belongs to %s, not to %s as at the attach: "
		               "another user's pipeline of that name is never attached again",
		               a->pipeline, uid_name(n->owner, now, sizeof(now)),
		               uid_name(a->owner, was, sizeof(was)));
	}
	return 0;
}

/* ...and of the same spec (its fingerprint; the layout checked before, so
 * that a layout that changed is named)? */
static int same_spec(const struct ldr_attachment *a, const struct ldr_attachment *n)
{
	if (a->spec_hash && n->spec_hash != a->spec_hash)
		return set_err(-ESTALE, "pipeline '%s' now has another spec than at the attach "
		               "(fingerprint %016" PRIx64 ", was %016" PRIx64 ")", a->pipeline,
		               n->spec_hash, a->spec_hash);
	return 0;
}

/* Would the re-attached pipeline deliver the same batches into the same layout? */
static bool same_layout(const struct ldr_attachment *a, const struct ldr_attachment *n)
{
	if (a->nfields != n->nfields || a->slot_bytes != n->slot_bytes || a->batch_size != n->batch_size ||
	    a->bpe != n->bpe || a->epochs != n->epochs || a->samples != n->samples)
		return false;
	return memcmp(a->fields, n->fields, sizeof(a->fields[0]) * (size_t)a->nfields) == 0;
}

/* Wait (bounded) until on_pipe_rem()'s cancellations came back. Called with c->lock held. */
static void wait_requests_idle(struct ldr_attachment *a)
{
	struct timespec deadline;

	deadline_after(&deadline, REATTACH_IDLE_MS);
	for (;;) {
		bool busy = a->relreq.state != REQ_IDLE || a->watch.state != REQ_IDLE;
		for (int i = 0; i < a->inflight; i++)
			busy = busy || a->reqs[i].state != REQ_IDLE;
		if (!busy || pthread_cond_timedwait(&a->c->cond, &a->c->lock, &deadline) == ETIMEDOUT)
			return;
	}
}

/*
 * Start @a again on the new daemon with @n's attachment (its mapping @m): what
 * arrived from the old daemon and was not taken is dropped (it comes again),
 * what the trainer holds stays in the old mapping without its leases, which
 * went with the old daemon. Called with c->lock held.
 */
static void att_restart(struct ldr_attachment *a, struct ldr_attachment *n, struct amap *m,
                        const struct bring *br, int efd)
{
	while (a->held_head)
		held_del(a, a->held_head);
	ring_clear(a);
	/* the new daemon's ring, when it gave one; the old one goes out of use */
	if (br)
		ring_restart(a, br, efd);
	else
		ring_retire(a);
	a->next_seq = 0;
	a->outstanding = a->requested = 0;
	a->nrel = 0;
	a->rv_pending = a->has_ret = a->watching = false;
	a->nret = 0;
	a->ended = false;
	a->err = 0;
	a->errmsg[0] = '\0';
	a->id = n->id;
	a->share = n->share;
	a->share_seq = 0;
	a->nslots = n->nslots;
	free(a->rel);   /* empty: nrel is 0; the new one has room for the new slots */
	a->rel = n->rel;
	a->relcap = n->relcap;
	n->rel = NULL;
	amap_put(a, a->map);
	a->map = m;
	/* TrainerStats are totals since the attach: the new daemon's start at 0
	 * (a wait in progress goes on, and is its) */
	a->st_wait_ns = a->st_compute_ns = a->st_calls = 0;
	memset(a->st_buckets, 0, sizeof(a->st_buckets));
	a->st_sent_ns = a->st_sent_calls = 0;
}

/* A new daemon's ring that will not be used: unmapped (if mapped) and its
 * eventfd closed (if any). */
static void ring_drop(struct bring *br, int *efd)
{
	if (br->sh)
		bring_close(br);
	br->sh = NULL;
	if (*efd >= 0)
		close(*efd);
	*efd = -1;
}

/*
 * Attach @a again, at the next batch its trainer has not taken: partition
 * with its start; broadcast as the private stream of identical content
 * (partition rank 0 of 1) from there; dynamic where the new daemon's dynamic
 * stream is. @where receives "epoch E batch B". Return: 0 (done, or @a lost
 * for a reason of its own), LDR_EDISCONNECTED when the new connection went
 * too (reconnect_run() starts over).
 */
static int reattach(struct ldr_client *c, struct ldr_attachment *a, char *where, size_t wsize)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Attach at = LOADERD__ATTACH__INIT;
	Loaderd__Reply *rep;
	struct ldr_attachment *n;
	struct amap *m = NULL;
	struct bring br = { .fd = -1 };
	uint64_t size = 0, dev_size = 0;
	int r, fd, dev_fd = -1, ring_efd = -1;
	bool tail = false;

	*where = '\0';
	pthread_mutex_lock(&c->lock);
	if (a->detached || a->lost) {
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	if (a->dev) {
		att_lose(a, LDR_EDISCONNECTED, "the daemon at %s restarted, and an attachment in CUDA "
		         "device memory does not follow it (the device slab was the old daemon's): "
		         "attach pipeline '%s' again", c->path, a->pipeline);
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	wait_requests_idle(a);
	at.pipeline = a->pipeline;
	at.mode = (Loaderd__Mode)a->opts.mode;
	at.rank = a->opts.rank;
	at.world_size = a->opts.world_size;
	/* the window it has, named: its requests are open (status then says
	 * inflight_auto false for a window the old daemon chose) */
	at.credits = (uint32_t)a->inflight;
	/* its batch path in shared memory again, as at its first attach */
	at.ring = ring_wanted();
	/* the same seed: its stream goes on as it would have */
	at.has_augment_seed = a->opts.has_augment_seed != 0;
	at.augment_seed = a->opts.augment_seed;
	at.job = a->job; /* the same job: a dynamic stream goes on with it */
	if (a->opts.client_order) {
		/* its own order from the first batch it has not taken: the
		 * chunks kept are given again once attached (order.c) */
		at.client_order = true;
		at.has_start = true;
		orders_first(a, &at.start_epoch, &at.start_batch);
		snprintf(where, wsize, "epoch %" PRIu64 " batch %" PRIu64 " of its order",
		         at.start_epoch, at.start_batch);
	} else if (a->opts.mode != LDR_MODE_DYNAMIC) {
		at.mode = LOADERD__MODE__PARTITION;
		if (a->opts.mode == LDR_MODE_BROADCAST) {
			at.rank = 0;
			at.world_size = 1;
		}
		at.has_start = true;
		at.start_epoch = a->pos_epoch;
		at.start_batch = a->pos_batch;
		/* still in the tail of an elastic resume: the same tail */
		tail = a->opts.has_start_position && a->opts.start_position &&
		       a->pos_epoch == a->opts.start_epoch;
		at.has_start_position = tail;
		at.start_position = tail ? a->opts.start_position : 0;
		snprintf(where, wsize, "epoch %" PRIu64 " batch %" PRIu64, a->pos_epoch, a->pos_batch);
	} else {
		snprintf(where, wsize, "the dynamic stream's next batch");
	}
	pthread_mutex_unlock(&c->lock);

	req.body_case = LOADERD__REQUEST__BODY_ATTACH;
	req.attach = &at;
	r = call_gen(c, &req, &rep, LOADERD__REPLY__BODY_ATTACH, CALL_TIMEOUT_MS, true);
	if (r == LDR_EDISCONNECTED || r == -ETIMEDOUT)
		return LDR_EDISCONNECTED;
	if (r < 0) {
		pthread_mutex_lock(&c->lock);
		att_lose(a, r, "the daemon at %s restarted, and attaching to pipeline '%s' again at %s "
		         "failed: %s%s", c->path, a->pipeline, where, tls_err,
		         r == -EAGAIN ? " (a pipeline of your own Python Dataset does not follow a restart: "
		                        "its workers' host ended with the old daemon; create the loader "
		                        "again)" : "");
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	n = calloc(1, sizeof(*n));
	if (!n) {
		r = set_err(-ENOMEM, "out of memory");
	} else if ((r = att_read_reply(n, rep->attach)) == 0 &&
	           ((r = att_tail_taken(tail, at.start_position, rep->attach)) < 0 ||
	            (r = same_owner(a, n)) < 0)) {
		/* another owner's: never its batches */
	} else if (r == 0 && !same_layout(a, n)) {
		r = set_err(-ESTALE, "the pipeline's layout or length changed (%" PRIu64 " batches of %u per "
		            "epoch, %" PRIu64 " epochs, %d fields; now %" PRIu64 " of %u, %" PRIu64 ", %d)",
		            a->bpe, a->batch_size, a->epochs, a->nfields, n->bpe, n->batch_size, n->epochs,
		            n->nfields);
	} else if (r == 0 && (r = same_spec(a, n)) < 0) {
		/* the same layout, other batches (another file, seed...) */
	} else if (r == 0) {
		const Loaderd__AttachReply *ar = rep->attach;
		int ring_fd;
		char err[256] = "the fd channel brought a batch ring the attach reply did not announce";
		fd = fetch_slab_fd(ar->fd_path, c->daemon_uid, ar->fd_token.data, ar->fd_token.len, &size,
		                   &dev_fd, &dev_size, &ring_fd, &ring_efd);
		if (dev_fd >= 0)
			close(dev_fd);
		if (ring_fd >= 0 && (!ar->ring_bytes || bring_map(&br, ring_fd, ar->ring_bytes, err,
		                                                   sizeof(err)) < 0)) {
			/* a ring it cannot use: the socket's batch path, and the
			 * reconnection's line on stderr says why */
			close(ring_fd);
			ring_drop(&br, &ring_efd);
			size_t len = strlen(where);
			snprintf(where + len, wsize - len, " (on the socket's batch path: %s)", err);
		}
		if (fd < 0) {
			r = fd;
		} else if (size != ar->slab_bytes || size < (uint64_t)n->nslots * n->slot_bytes) {
			close(fd);
			r = set_err(-EPROTO, "slab size mismatch");
		} else if (!(m = amap_open(fd, size, n->nslots, n->slot_bytes, a->cow))) {
			r = set_err(-errno, "cannot map the slab: %s", strerror(errno));
			close(fd);
		} else if (rel_reserve(n, n->nslots) < 0) {
			r = set_err(-ENOMEM, "out of memory");
			amap_free(m, n->slot_bytes);
			m = NULL;
		}
	}
	loaderd__reply__free_unpacked(rep, NULL);
	if (r < 0 || !br.sh)
		ring_drop(&br, &ring_efd);
	pthread_mutex_lock(&c->lock);
	if (r == 0 && a->detached) {
		pthread_mutex_unlock(&c->lock);
		detach_id(c, n->id); /* detached meanwhile */
		amap_free(m, n->slot_bytes);
		ring_drop(&br, &ring_efd);
		free(n->rel);
		free(n);
		return 0;
	}
	if (r < 0)
		att_lose(a, r, "the daemon at %s restarted, and pipeline '%s' could not be attached again "
		         "at %s: %s", c->path, a->pipeline, where, tls_err);
	else
		att_restart(a, n, m, br.sh ? &br : NULL, ring_efd);
	pthread_mutex_unlock(&c->lock);
	if (r < 0 && n && n->id)
		detach_id(c, n->id);
	if (n)
		free(n->rel);
	free(n);
	if (r == 0 && a->opts.client_order) {
		/* before the trainer reads again (it waits for the reconnection) */
		r = orders_give_again(a);
		if (r == LDR_EDISCONNECTED || r == -ETIMEDOUT)
			return LDR_EDISCONNECTED;
		if (r < 0) {
			pthread_mutex_lock(&c->lock);
			att_lose(a, r, "the daemon at %s restarted, and pipeline '%s' was attached again at "
			         "%s, but it refused the order given again: %s", c->path, a->pipeline,
			         where, tls_err);
			pthread_mutex_unlock(&c->lock);
		}
	}
	return 0;
}

/*
 * Pipeline @name could not be created again (@r, why in tls_err): its
 * attachments do not follow the daemon, whatever now has that name.
 */
static void recreate_failed(struct ldr_client *c, const char *name, int r)
{
	pthread_mutex_lock(&c->lock);
	for (struct ldr_attachment *a = c->atts; a; a = a->next)
		if (!a->detached && !a->lost && strcmp(a->pipeline, name) == 0)
			att_lose(a, r, "the daemon at %s restarted, and pipeline '%s' could not be created "
			         "again: %s; not attached again", c->path, name, tls_err);
	pthread_mutex_unlock(&c->lock);
}

/*
 * Create again each pipeline this client created (or joined by creating).
 * One that the new daemon does not create, nor has as the same owner's
 * (another user's, another spec, any error), loses its attachments: they
 * never attach to whatever took the name (docs/security.md).
 */
static int recreate_pipelines(struct ldr_client *c)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__CreatePipeline cp = LOADERD__CREATE_PIPELINE__INIT;
	Loaderd__Reply *rep;
	char name[LDR_NAME_MAX + 1], was[96], now[96];
	bool has_owner;
	uid_t owner;
	char *json;
	int r;

	for (size_t i = 0;; i++) {
		struct spec_rec *sr;
		size_t j = 0;
		pthread_mutex_lock(&c->lock);
		for (sr = c->specs; sr && j < i; sr = sr->next)
			j++;
		json = sr ? strdup(sr->json) : NULL;
		if (sr) {
			snprintf(name, sizeof(name), "%s", sr->name);
			has_owner = sr->has_owner;
			owner = sr->owner;
		}
		pthread_mutex_unlock(&c->lock);
		if (!sr)
			return 0;
		if (!json)
			continue;
		{
			/* the trainer's keys as they are now: fresh ones if it renewed them */
			Loaderd__StoreCredentials sc;
			struct awscreds ac;
			int k = store_creds(json, &ac, &sc);

			cp.spec_json = json;
			cp.exist_ok = true;
			cp.has_owner = has_owner;
			cp.owner = (uint32_t)owner;
			cp.store = k > 0 ? &sc : NULL;
			req.body_case = LOADERD__REQUEST__BODY_CREATE;
			req.create = &cp;
			r = k < 0 ? k : call_gen(c, &req, &rep, LOADERD__REPLY__BODY_CREATE, CALL_TIMEOUT_MS, true);
			if (k > 0 && r == 0)
				keys_sent_note(c, name, &ac);
			if (k > 0)
				store_creds_clear(&ac);
			cp.store = NULL;
		}
		/* the owner it had (above): the daemon joins no other's */
		free(json);
		if (r == LDR_EDISCONNECTED || r == -ETIMEDOUT)
			return LDR_EDISCONNECTED;
		if (r == 0) {
			const Loaderd__CreatePipelineReply *cr = rep->create;
			/* created: ours, of the same spec; joined: only the owner's it had */
			if (!cr->created && has_owner && (!cr->has_owner || cr->owner != owner))
				r = set_err(-EEXIST, "it exists already, owned by %s, not by %s as before",
				            cr->has_owner ? uid_name(cr->owner, now, sizeof(now)) : "whom it does not say",
				            uid_name(owner, was, sizeof(was)));
			loaderd__reply__free_unpacked(rep, NULL);
		}
		if (r < 0) {
			fprintf(stderr, "loaderd: cannot create pipeline '%s' again in the restarted daemon at "
			        "%s: %s\n", name, c->path, tls_err);
			recreate_failed(c, name, r);
		}
	}
}

/*
 * After the Hello on the new connection: pipelines, then attachments. Return 0,
 * or LDR_EDISCONNECTED when that connection went too.
 */
static int restore(struct ldr_client *c, char *report, size_t rsize)
{
	struct ldr_attachment **v = NULL;
	size_t nv = 0, len = 0;
	char where[384]; /* "epoch E batch B", and why not through a ring */
	int r;

	if ((r = recreate_pipelines(c)) < 0)
		return r;
	pthread_mutex_lock(&c->lock);
	for (struct ldr_attachment *a = c->atts; a; a = a->next)
		nv++;
	v = calloc(nv ? nv : 1, sizeof(*v));
	nv = 0;
	for (struct ldr_attachment *a = c->atts; a && v; a = a->next) {
		atomic_fetch_add(&a->refs, 1); /* a detach meanwhile does not free it */
		v[nv++] = a;
	}
	pthread_mutex_unlock(&c->lock);
	if (!v)
		return LDR_EDISCONNECTED; /* out of memory: try again */
	report[0] = '\0';
	for (size_t i = 0; i < nv && r == 0; i++) {
		pthread_mutex_lock(&c->lock);
		bool closing = c->closing;
		pthread_mutex_unlock(&c->lock);
		if (closing) {
			r = LDR_EDISCONNECTED; /* reconnect_run() ends */
			break;
		}
		r = reattach(c, v[i], where, sizeof(where));
		pthread_mutex_lock(&c->lock);
		if (r == 0 && len < rsize && !v[i]->detached)
			len += (size_t)snprintf(report + len, rsize - len, "; attachment %" PRIu64 " (pipeline '%s') %s%s",
			                        v[i]->id, v[i]->pipeline, v[i]->lost ? "lost: " : "re-attached at ",
			                        v[i]->lost ? v[i]->errmsg : where);
		pthread_mutex_unlock(&c->lock);
	}
	for (size_t i = 0; i < nv; i++)
		att_unref(v[i]);
	free(v);
	return r;
}

/* Wait @ms between attempts, or until ldr_close() begins. */
static void reconnect_pause(struct ldr_client *c, int ms)
{
	struct timespec deadline;

	deadline_after(&deadline, ms);
	pthread_mutex_lock(&c->lock);
	while (!c->closing && pthread_cond_timedwait(&c->flush_cond, &c->lock, &deadline) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&c->lock);
}

/*
 * The flusher's work when the connection went (on_pipe_rem()): the dialer
 * redials by itself (every RECONNECT_MIN_MS, doubling up to RECONNECT_MAX_MS);
 * each Hello waits for its connection. Once one is answered, restore() follows
 * the new daemon; until c->reconnect_ms passed, when calls and next() fail.
 */
void reconnect_run(struct ldr_client *c)
{
	char report[2048], last[512] = "no answer";
	int pause_ms = RECONNECT_MIN_MS, r = 0;
	struct timespec t0;
	double limit;

	pthread_mutex_lock(&c->lock);
	t0 = c->went_at;
	limit = c->reconnect_ms;
	pthread_mutex_unlock(&c->lock);
	fprintf(stderr, "loaderd: the daemon at %s went away; reconnecting for up to %.3g s\n", c->path,
	        limit / 1000.0);
	for (;;) {
		double left = limit - ms_since(&t0);
		pthread_mutex_lock(&c->lock);
		bool closing = c->closing;
		pthread_mutex_unlock(&c->lock);
		if (closing || left <= 0)
			break;
		r = hello_call(c, left < RECONNECT_MAX_MS ? (int)left + 1 : RECONNECT_MAX_MS, true);
		if (r == 0 && (r = restore(c, report, sizeof(report))) == 0) {
			pthread_mutex_lock(&c->lock);
			c->reconnects++;
			c->disconnected = false;
			c->daemon_stopping = false;
			c->reconnecting = false;
			for (struct ldr_attachment *a = c->atts; a; a = a->next) {
				top_up(a);
				if (a->watch.open && !a->lost && !a->detached && a->share &&
				    req_send(a, &a->watch, 0) == 0)
					a->watching = true;
			}
			pthread_cond_broadcast(&c->cond);
			pthread_mutex_unlock(&c->lock);
			fprintf(stderr, "loaderd: reconnected to the daemon at %s after %.1f s (client id %" PRIu64
			        ")%s\n", c->path, ms_since(&t0) / 1000.0, c->id, report);
			return;
		}
		if (r != -ETIMEDOUT)
			snprintf(last, sizeof(last), "%.400s", tls_err);
		if (r != -ETIMEDOUT && r != LDR_EDISCONNECTED) {
			/* the daemon answered, and refused: no use trying again */
			break;
		}
		if (r == LDR_EDISCONNECTED) {
			reconnect_pause(c, pause_ms);
			pause_ms = pause_ms * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS : pause_ms * 2;
		}
	}
	pthread_mutex_lock(&c->lock);
	bool closing = c->closing;
	snprintf(c->gone_msg, sizeof(c->gone_msg), "the client is closed");
	if (!closing && r == -EPERM && c->refused[0])
		/* another uid's daemon took the socket (whose.c) */
		snprintf(c->gone_msg, sizeof(c->gone_msg), "disconnected: %.900s", c->refused);
	else if (!closing)
		snprintf(c->gone_msg, sizeof(c->gone_msg), "disconnected from the daemon at %s: it went away "
		         "and libloader could not reconnect within %.3g s (reconnect timeout, "
		         "LOADERD_RECONNECT_TIMEOUT): %s", c->path, limit / 1000.0, last);
	c->reconnecting = false;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	if (!closing)
		fprintf(stderr, "loaderd: %s\n", c->gone_msg);
	/* no more redials of a daemon we gave up on */
	nng_dialer_close(c->dialer);
}
