/* SPDX-License-Identifier: MIT */
/* handlers - one function per request of docs/protocol.md
 *
 * A CUDA attach first loads the driver and a device's context on libuv's pool
 * (attach_work), so a slow cuInit parks only that request.
 */
#include "server-private.h"

/* --- requests ----------------------------------------------------------- */

static void handle_hello(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__Hello *h)
{
	Loaderd__Reply rep = LOADERD__REPLY__INIT;
	Loaderd__HelloReply hr = LOADERD__HELLO_REPLY__INIT;
	char msg[160];

	if (cl->refused) {
		/* over a connection quota (session.c): the client prints why, then
		 * closes; sessions_tick() closes it if it does not */
		client_refusal(srv, cl, msg, sizeof(msg));
		reply_error(srv, c, EUSERS, msg);
		return;
	}
	if (h->protocol != LDR_PROTOCOL_VERSION) {
		snprintf(msg, sizeof(msg), "protocol version %u is not supported (loaderd %s speaks %d)",
		         h->protocol, LOADERD_VERSION, LDR_PROTOCOL_VERSION);
		reply_error(srv, c, EPROTONOSUPPORT, msg);
		return;
	}
	/* status, logs, top and /metrics show it: printable UTF-8 only (an
	 * invalid byte made status drop the client, a C1 CSI reached terminals) */
	text_clean(cl->name, sizeof(cl->name), h->client_name ? h->client_name : "", '?');
	cl->hello = true;
	hr.protocol = LDR_PROTOCOL_VERSION;
	hr.daemon_version = (char *)LOADERD_VERSION;
	hr.client_id = cl->id;
	rep.body_case = LOADERD__REPLY__BODY_HELLO;
	rep.hello = &hr;
	send_reply(srv, c, &rep);
}

/* A create whose files are opened off the loop (engine_create_async()). */
struct create_ctx {
	struct server *srv;
	struct sctx *c;
	uint64_t client_id;
	bool parked;              /* handle_create() returned: the answer comes later */
	bool answered;            /* the answer came before it returned */
	char name[LDR_NAME_MAX + 1];
};

static void create_answer(void *userdata, int r, const char *err)
{
	struct create_ctx *x = userdata;
	struct server *srv = x->srv;
	Loaderd__Reply rep = LOADERD__REPLY__INIT;
	Loaderd__CreatePipelineReply cr = LOADERD__CREATE_PIPELINE_REPLY__INIT;
	struct client *cl;
	uid_t owner;

	for (cl = srv->clients; cl && cl->id != x->client_id; cl = cl->next)
		;
	if (!cl) {
		/* gone meanwhile: its hold on what it created goes too, and the
		 * reply goes nowhere (the context is free again) */
		if (r >= 0)
			engine_client_gone(srv->engine, x->client_id);
		reply_error(srv, x->c, ECONNRESET, "client gone");
	} else if (r < 0) {
		reply_error(srv, x->c, -r, err);
	} else {
		if (r && client_event_pass(srv, cl))
			log_event(LOG_INFO, "client.create", "client=%" PRIu64 " pid=%d uid=%u pipeline=%s",
			          cl->id, cl->pid, (unsigned)cl->uid, x->name);
		cr.name = x->name;
		cr.created = r == 1;
		/* whose it is, so a client sees what it joined */
		if (engine_owner(srv->engine, x->name, &owner) == 0) {
			cr.has_owner = true;
			cr.owner = (uint32_t)owner;
		}
		rep.body_case = LOADERD__REPLY__BODY_CREATE;
		rep.create = &cr;
		send_reply(srv, x->c, &rep);
	}
	if (reply_unpark(x->parked, &x->answered))
		free(x);
}

/* The keys of a request's StoreCredentials; the request's copy of the
 * secret and the token wiped. */
static int store_keys(Loaderd__StoreCredentials *sc, struct source_keys **keys, char *err, size_t errlen)
{
	int r = source_keys_new(keys, sc->access_key_id, sc->secret_access_key, sc->session_token, sc->region,
	                        sc->endpoint, sc->expires, err, errlen);

	if (sc->secret_access_key)
		explicit_bzero(sc->secret_access_key, strlen(sc->secret_access_key));
	if (sc->session_token)
		explicit_bzero(sc->session_token, strlen(sc->session_token));
	return r;
}

static void handle_create(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__CreatePipeline *m)
{
	struct create_ctx *x;
	struct spec *spec;
	char err[1024];
	struct principal who;
	int r;

	who_is(srv, cl, &who);
	who.has_join_owner = m->has_owner;
	who.join_owner = (uid_t)m->owner;
	r = spec_parse(&spec, m->spec_json, err, sizeof(err));
	if (r < 0) {
		reply_error(srv, c, -r, err);
		return;
	}
	/* the creator's own keys, for this pipeline only (docs/security.md) */
	if (m->store) {
		struct source_keys *keys;

		r = store_keys(m->store, &keys, err, sizeof(err));
		if (r < 0) {
			spec_free(spec);
			reply_error(srv, c, -r, err);
			return;
		}
		spec_set_store_keys(spec, keys);
	}
	if (!(x = calloc(1, sizeof(*x)))) {
		spec_free(spec);
		reply_error(srv, c, ENOMEM, "out of memory");
		return;
	}
	*x = (struct create_ctx){ .srv = srv, .c = c, .client_id = cl->id };
	snprintf(x->name, sizeof(x->name), "%s", spec->name);
	/* the pipeline is this connection's: it lingers once the connection
	 * closes and nobody reads it (docs/spec.md, "Lifetime"); its files are
	 * opened on libuv's pool, as its creator (docs/security.md) */
	engine_create_async(srv->engine, spec, &who, cl->id, m->exist_ok, create_answer, x);
	if (reply_park(c, &x->parked, x->answered))
		free(x);
}

/* SetStore: fresh credentials for a running pipeline (docs/storage.md) */
static void handle_set_store(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__SetStore *m)
{
	struct source_keys *keys;
	struct principal who;
	char err[512];
	int r;

	if (!m->name || !m->store) {
		reply_error(srv, c, EPROTO, "SetStore: a name and the credentials, both");
		return;
	}
	who_is(srv, cl, &who);
	r = store_keys(m->store, &keys, err, sizeof(err));
	if (r == 0)
		r = engine_set_store(srv->engine, m->name, &who, keys, err, sizeof(err));
	if (r < 0)
		reply_error(srv, c, -r, err);
	else
		reply_ok(srv, c);
}

static void handle_drop(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__DropPipeline *m)
{
	char err[256] = "";
	struct principal who;
	int r;

	who_is(srv, cl, &who);
	r = engine_drop(srv->engine, m->name, &who, m->force, err, sizeof(err));
	if (r < 0) {
		reply_error(srv, c, -r, err);
		return;
	}
	/* attachments of a dropped pipeline stay until their clients detach */
	reply_ok(srv, c);
}

/*
 * The rest of an Attach, once the device part is known: @r and @dinfo are
 * cuda_attach_device()'s answer (0 host, 1 CUDA, < 0 the error in @cuda_err).
 */
static void attach_finish(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__Attach *m,
                          int r, const struct cuda_device_info *dinfo, const char *cuda_err)
{
	Loaderd__Reply rep = LOADERD__REPLY__INIT;
	Loaderd__AttachReply ar = LOADERD__ATTACH_REPLY__INIT;
	Loaderd__Field fields[SOURCE_MAX_FIELDS], *fptrs[SOURCE_MAX_FIELDS];
	int64_t shapes[SOURCE_MAX_FIELDS][LDR_MAX_DIMS];
	struct attach_params p = {
		.mode = (int)m->mode, .rank = m->rank, .world = m->world_size,
		.has_start = m->has_start, .start_epoch = m->start_epoch, .start_batch = m->start_batch,
		.has_start_position = m->has_start_position, .start_position = m->start_position,
		.credits = m->credits, .has_seed = m->has_augment_seed, .seed = m->augment_seed,
		.client_id = cl->id, .uid = cl->uid, .pid = cl->pid,
		.ring = m->ring, .job = m->job, .client_order = m->client_order,
	};
	struct attachment *a;
	struct attach_info info;
	struct principal who;
	char err[512] = "";

	who_is(srv, cl, &who);
	p.who = &who;
	if (r < 0) {
		reply_error(srv, c, -r, cuda_err);
		return;
	}
	if (cl->natts >= MAX_ATTACH_PER_CLIENT) {
		snprintf(err, sizeof(err), "too many attachments on one connection (most %d)", MAX_ATTACH_PER_CLIENT);
		reply_error(srv, c, EMFILE, err);
		return;
	}
	p.cuda = r == 1 ? dinfo : NULL;
	r = engine_attach(srv->engine, m->pipeline, &p, &a, err, sizeof(err));
	if (r < 0) {
		reply_error(srv, c, -r, err);
		return;
	}
	cl->atts[cl->natts++] = a;
	attachment_get_info(a, &info);
	for (size_t f = 0; f < info.nfields; f++) {
		const struct field_desc *fd = &info.fields[f];
		fields[f] = (Loaderd__Field)LOADERD__FIELD__INIT;
		fields[f].name = (char *)fd->name;
		fields[f].dtype = (uint32_t)fd->dtype;
		for (int d = 0; d < fd->ndim; d++)
			shapes[f][d] = fd->shape[d];
		fields[f].n_sample_shape = (size_t)fd->ndim;
		fields[f].sample_shape = shapes[f];
		fields[f].offset = info.field_offsets[f];
		fields[f].sample_bytes = fd->sample_bytes;
		fptrs[f] = &fields[f];
	}
	ar.attach_id = info.id;
	ar.fd_token.data = info.token;
	ar.fd_token.len = sizeof(info.token);
	ar.slab_bytes = info.slab_bytes;
	ar.slot_bytes = info.slot_bytes;
	ar.nslots = info.nslots;
	ar.n_fields = info.nfields;
	ar.fields = fptrs;
	ar.batch_size = info.batch_size;
	ar.batches_per_epoch = info.batches_per_epoch;
	ar.epochs = info.epochs;
	ar.samples = info.samples;
	ar.start_epoch = info.start_epoch;
	ar.start_batch = info.start_batch;
	ar.has_start_position = info.has_start_position;
	ar.start_position = info.start_position;
	ar.share = info.share;
	ar.credits = info.credits;
	ar.ring_bytes = info.ring_bytes;
	ar.has_owner = true;
	ar.owner = (uint32_t)info.owner;
	ar.spec_hash = info.spec_hash;
	ar.fd_path = srv->fdpath;
	if (info.dslab) {
		ar.device_kind = LDR_DEVICE_CUDA;
		ar.device_index = info.dslab->device;
		ar.device_memory = (uint32_t)info.dslab->kind;
		ar.device_slab_bytes = info.dslab->bytes;
		ar.device_slot_stride = info.dslab->slot_stride;
		if (info.dslab->kind == CUDA_MEM_IPC) {
			ar.device_ipc_handle.data = (uint8_t *)info.dslab->ipc_handle;
			ar.device_ipc_handle.len = sizeof(info.dslab->ipc_handle);
		}
		ar.device_name = (char *)info.dslab->device_name;
	}
	rep.body_case = LOADERD__REPLY__BODY_ATTACH;
	rep.attach = &ar;
	if (client_event_pass(srv, cl)) {
		char dev[24] = "cpu";
		if (info.dslab)
			snprintf(dev, sizeof(dev), "cuda:%d", info.dslab->device);
		log_event(LOG_INFO, "client.attach", "client=%" PRIu64 " pid=%d uid=%u pipeline=%s "
		          "attachment=%" PRIu64 " mode=%s rank=%u world_size=%u device=%s", cl->id, cl->pid,
		          (unsigned)cl->uid, m->pipeline, ar.attach_id, mode_name((int)m->mode), m->rank,
		          m->world_size ? m->world_size : 1, dev);
	}
	send_reply(srv, c, &rep);
}

/*
 * A CUDA attach before the driver and the device are up: cuInit (seconds on a
 * GPU without persistence mode) and the device's primary context run on a
 * thread of libuv's pool while the loop serves everyone else; the request's
 * context stays parked until then.
 */
struct attach_job {
	uv_work_t work;
	struct server *srv;
	struct sctx *c;
	uint64_t client_id;
	Loaderd__Attach m;        /* its pipeline name is ours */
	struct cuda_device_info dinfo;
	int r;
	char err[512];
};

static void attach_work(uv_work_t *w)
{
	struct attach_job *j = w->data;

	j->r = cuda_attach_prepare(j->m.device_kind, j->m.device_index, &j->dinfo, j->err, sizeof(j->err));
}

static void attach_after(uv_work_t *w, int status)
{
	struct attach_job *j = w->data;
	struct server *srv = j->srv;
	struct client *cl;

	srv->attach_jobs--;
	for (cl = srv->clients; cl && cl->id != j->client_id; cl = cl->next)
		;
	if (srv->stopping)
		reply_error(srv, j->c, ESHUTDOWN, "daemon is shutting down");
	else if (!cl) /* gone meanwhile: the reply goes nowhere, the context is free again */
		reply_error(srv, j->c, ECONNRESET, "client gone");
	else
		attach_finish(srv, j->c, cl, &j->m, j->r, &j->dinfo, j->err);
	free(j->m.pipeline);
	free(j);
}

static void handle_attach(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__Attach *m)
{
	struct cuda_device_info dinfo;
	struct attach_job *j;
	char err[512] = "";
	int r;

	if (!cuda_attach_ready(m->device_kind, m->device_index) && (j = calloc(1, sizeof(*j)))) {
		j->work.data = j;
		j->srv = srv;
		j->c = c;
		j->client_id = cl->id;
		j->m = *m;
		j->m.pipeline = strdup(m->pipeline ? m->pipeline : "");
		if (j->m.pipeline && uv_queue_work(srv->loop, &j->work, attach_work, attach_after) == 0) {
			c->state = CTX_PARKED;
			c->answered = true;
			srv->attach_jobs++;
			return;
		}
		free(j->m.pipeline);
		free(j);
	}
	r = cuda_attach_device(m->device_kind, m->device_index, &dinfo, err, sizeof(err));
	attach_finish(srv, c, cl, m, r, &dinfo, err);
}

/* The attachment @id of @cl, or NULL after answering the request with ENOENT. */
static struct attachment *att_or_reply(struct server *srv, struct sctx *c, struct client *cl,
                                       uint64_t id, unsigned *index)
{
	struct attachment *a = client_att(cl, id, index);
	char err[96] = "";

	if (!a) {
		snprintf(err, sizeof(err), "no attachment %" PRIu64 " on this connection", id);
		reply_error(srv, c, ENOENT, err);
	}
	return a;
}

static bool releases_fit(struct server *srv, struct sctx *c, size_t n)
{
	if (n <= MAX_RELEASES)
		return true;
	reply_error(srv, c, E2BIG, "too many releases in one request");
	return false;
}

/* The TrainerStats of a Next or Release, or NULL. */
static const struct trainer_stats *trainer_stats(const Loaderd__TrainerStats *m, struct trainer_stats *st)
{
	if (!m)
		return NULL;
	*st = (struct trainer_stats){ .wait_ns = m->wait_ns, .compute_ns = m->compute_ns,
		.calls = m->calls, .buckets = m->wait_buckets, .nbuckets = m->n_wait_buckets };
	return st;
}

static void handle_next(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__Next *m)
{
	struct attachment *a = att_or_reply(srv, c, cl, m->attach_id, NULL);
	struct trainer_stats st;
	char err[256] = "";
	int r;

	if (!a || !releases_fit(srv, c, m->n_releases) || !releases_fit(srv, c, m->n_returned))
		return;
	c->state = CTX_PARKED;
	c->answered = true;
	c->pending.max = m->max_batches;
	r = attachment_next(a, &c->pending, &(struct next_req){ .releases = m->releases,
		.nreleases = m->n_releases, .watch = m->watch, .has_return = m->has_return,
		.return_from = m->return_from, .returned = m->returned, .nreturned = m->n_returned,
		.stats = trainer_stats(m->stats, &st) }, err, sizeof(err));
	if (r < 0)
		reply_error(srv, c, -r, err);
}

static void handle_release(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__Release *m)
{
	struct attachment *a = att_or_reply(srv, c, cl, m->attach_id, NULL);
	struct trainer_stats st;
	char err[256] = "";
	int r;

	if (!a || !releases_fit(srv, c, m->n_leases))
		return;
	r = attachment_next(a, NULL, &(struct next_req){ .releases = m->leases, .nreleases = m->n_leases,
		.stats = trainer_stats(m->stats, &st) }, err, sizeof(err));
	if (r < 0)
		reply_error(srv, c, -r, err);
	else
		reply_ok(srv, c);
}

static void handle_detach(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__Detach *m)
{
	unsigned i;
	struct attachment *a = att_or_reply(srv, c, cl, m->attach_id, &i);

	if (!a)
		return;
	client_remove_att(cl, i);
	attachment_detach(a);
	reply_ok(srv, c);
}

static void handle_order(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__Order *m)
{
	struct attachment *a = att_or_reply(srv, c, cl, m->attach_id, NULL);
	char err[512] = "";
	int r;

	if (!a)
		return;
	r = attachment_order(a, &(struct order_msg){ .epoch = m->epoch, .first = m->first_batch,
		.sizes = m->sizes, .nbatches = m->n_sizes, .indices = m->indices,
		.nindices = m->n_indices, .last = m->last }, err, sizeof(err));
	if (r < 0)
		reply_error(srv, c, -r, err);
	else
		reply_ok(srv, c);
}

/* Is a client of clients_json() one @who may see: its own user's, or one
 * attached to a pipeline @who may use? */
static bool client_visible(struct server *srv, json_t *c, const struct principal *who)
{
	json_t *a;
	size_t i;

	if (who->admin || json_integer_value(json_object_get(c, "uid")) == (json_int_t)who->creds.uid)
		return true;
	json_array_foreach(json_object_get(c, "attachments"), i, a) {
		const char *name = json_string_value(json_object_get(a, "pipeline"));
		if (name && engine_may_use(srv->engine, name, who))
			return true;
	}
	return false;
}

/* The Status reply for @who; @self (the connection that asks, or NULL) is
 * left out of its clients. */
static json_t *status_json(struct server *srv, const struct client *self, const struct principal *who)
{
	json_t *cuda = cuda_status_json();
	json_t *clients;

	engine_stats_pull(srv->engine); /* the figures batch rings carry, fresh */
	clients = clients_json(srv, self);

	for (size_t i = json_array_size(clients); i-- > 0;)
		if (!client_visible(srv, json_array_get(clients, i), who))
			json_array_remove(clients, i);

	/* "cuda": absent until a client asked for a device; then the driver (or
	 * why there is none) and each device's copy engine */
	if (cuda)
		json_object_set_new(cuda, "devices", engine_cuda_json(srv->engine));
	json_t *held = engine_holds_json(srv->engine); /* first: it lets released slabs go */
	json_t *o = json_pack("{s:s, s:i, s:i, s:I, s:s, s:i, s:I, s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:o, s:o, s:o*}",
		"version", LOADERD_VERSION,
		"protocol", LDR_PROTOCOL_VERSION,
		"pid", (int)getpid(),
		"uptime_s", (json_int_t)((uv_now(srv->loop) - srv->started_ms) / 1000),
		"socket", srv->path,
		"workers", (int)engine_workers(srv->engine),
		"memory_limit", (json_int_t)engine_memory_limit(srv->engine),
		"memory_used", (json_int_t)engine_memory_used(srv->engine),
		/* dropped pipelines' slabs that clients still map: part of memory_used */
		"memory_held_after_drop", (json_int_t)engine_memory_held(srv->engine),
		"held_after_drop", held,
		"max_held_after_drop", (json_int_t)holds_max_held(srv->engine),
		/* clients whose close nng 1.5.2 never reported (nngfix.c, the sweep) */
		"clients_released_by_sweep", (json_int_t)srv->ghosts,
		"probes_released_by_sweep", (json_int_t)srv->probes_swept,
		"nng_fds_closed_by_sweep", (json_int_t)srv->orphans_closed,
		"pipelines", engine_pipelines_json(srv->engine, who),
		"clients", clients,
		"cuda", cuda);
	if (o)
		engine_bounds_status(srv->engine, o, who);
	/* the node's object cache (docs/storage.md) */
	if (o)
		json_object_set_new(o, "object_cache", source_object_cache_json());
	return o;
}

json_t *server_status_json(struct server *srv)
{
	/* what root would see: /metrics is for the machine's operators, and
	 * who may read it is the address's business (docs/security.md) */
	struct principal self;

	principal_daemon(&self);
	return status_json(srv, NULL, &self);
}

void handle_request(struct server *srv, struct sctx *c, nng_msg *msg)
{
	struct client *cl = client_get(srv, nng_msg_get_pipe(msg));
	Loaderd__Request *req;

	if (!cl) {
		/* its connection is gone already: nobody to answer */
		nng_msg_free(msg);
		return;
	}
	req = loaderd__request__unpack(NULL, nng_msg_len(msg), nng_msg_body(msg));
	nng_msg_free(msg);
	if (!req) {
		/* a client may send them at will: the first few, then a count */
		if (log_limit_pass(&cl->malformed, uv_now(srv->loop)))
			log_warn("client %" PRIu64 " (pid %d): malformed request%s", cl->id, cl->pid,
			         cl->malformed.logged == LOG_LIMIT_BURST
			                 ? " (more of its malformed requests are counted, one line every 10 s)"
			                 : "");
		else
			client_log_summary(srv, cl, false);
		reply_error(srv, c, EPROTO, "malformed request: not a loaderd.Request message");
		return;
	}
	if (!cl->hello && req->body_case != LOADERD__REQUEST__BODY_HELLO) {
		reply_error(srv, c, EPROTO, "protocol error: the first request must be Hello");
		goto out;
	}
	if (srv->stopping) {
		reply_error(srv, c, ESHUTDOWN, "daemon is shutting down");
		goto out;
	}
	switch (req->body_case) {
	case LOADERD__REQUEST__BODY_HELLO:
		handle_hello(srv, c, cl, req->hello);
		break;
	case LOADERD__REQUEST__BODY_CREATE:
		handle_create(srv, c, cl, req->create);
		break;
	case LOADERD__REQUEST__BODY_DROP:
		handle_drop(srv, c, cl, req->drop);
		break;
	case LOADERD__REQUEST__BODY_LIST: {
		struct principal who;
		who_is(srv, cl, &who);
		reply_json(srv, c, json_pack("{s:o}", "pipelines", engine_pipelines_json(srv->engine, &who)));
		break;
	}
	case LOADERD__REQUEST__BODY_STATUS: {
		struct principal who;
		who_is(srv, cl, &who);
		reply_json(srv, c, status_json(srv, cl, &who));
		break;
	}
	case LOADERD__REQUEST__BODY_ATTACH:
		handle_attach(srv, c, cl, req->attach);
		break;
	case LOADERD__REQUEST__BODY_NEXT:
		handle_next(srv, c, cl, req->next);
		break;
	case LOADERD__REQUEST__BODY_RELEASE:
		handle_release(srv, c, cl, req->release);
		break;
	case LOADERD__REQUEST__BODY_DETACH:
		handle_detach(srv, c, cl, req->detach);
		break;
	case LOADERD__REQUEST__BODY_SET:
		handle_set(srv, c, cl, req->set);
		break;
	case LOADERD__REQUEST__BODY_RELOAD:
		handle_reload(srv, c, cl);
		break;
	case LOADERD__REQUEST__BODY_ORDER:
		handle_order(srv, c, cl, req->order);
		break;
	case LOADERD__REQUEST__BODY_SET_STORE:
		handle_set_store(srv, c, cl, req->set_store);
		break;
	default:
		reply_error(srv, c, EPROTO, "malformed request: empty or unknown request type");
		break;
	}
out:
	loaderd__request__free_unpacked(req, NULL);
}

int fd_lookup(void *userdata, const uint8_t *token, uid_t uid, pid_t pid, int *fd, bool *fd_close,
              uint64_t *size, int *dev_fd, uint64_t *dev_size, int *ring_fd, int *ring_efd)
{
	struct server *srv = userdata;
	*fd_close = true; /* a fresh description per hand-out: the client's hold (holds.c) */
	return engine_take_token(srv->engine, token, uid, pid, fd, size, dev_fd, dev_size, ring_fd,
	                         ring_efd);
}
