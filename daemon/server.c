/* SPDX-License-Identifier: MIT */
/* server - the nng REP endpoint, client sessions and request dispatch
 *
 * nng runs its own threads; its completions only queue an event and wake the
 * loop with uv_async_send (which coalesces, so the loop drains the whole
 * queue). All state changes happen on the loop thread.
 *
 * Each request arrives on a REP context. A Next request that cannot be answered
 * yet parks its context with the engine, which answers it when a batch is ready;
 * meanwhile fresh contexts keep receiving, so a client's several requests in
 * flight and everyone else's requests are served. A connection is a client
 * session: nng's pipe events tell when it appeared (with the peer's pid and uid)
 * and when it went away, which releases every lease it held at once.
 */
#include <errno.h>
#include <signal.h>
#include <inttypes.h>
#include <jansson.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "cudadev.h"
#include "fdchan.h"
#include "nngclose.h"
#include "loader.pb-c.h"
#include "log.h"
#include "pipeline.h"
#include "server.h"
#include "source.h"
#include "wedged.h"

#define RECV_TARGET 16
#define MAX_CLIENTS 512
#define MAX_ATTACH_PER_CLIENT 16
#define STOP_CUDA_WAITS 50        /* x 100 ms */
#define MAX_RELEASES 4096
#define MAX_MSG_BYTES (1 << 20)
#define STOP_FLUSH_MS 100
#define CLOSE_WAIT_MS 2000
#define PROBE_EVERY_MS 2000
#define PROBE_WAIT_MS 2000

enum ev_type { EV_CTX, EV_PIPE_ADD, EV_PIPE_REM, EV_HEAL };

struct event {
	struct event *next;
	enum ev_type type;
	uint32_t pipe;
};

enum ctx_state { CTX_IDLE, CTX_RECV, CTX_PARKED, CTX_SEND };

struct sctx {
	struct event ev;          /* embedded: a completion needs no allocation */
	struct pending pending;
	struct sctx *all_next;
	struct sctx *free_next;
	struct server *srv;
	nng_ctx ctx;
	nng_aio *aio;
	enum ctx_state state;
	bool answered;            /* loop only: the request was answered or parked */
};

struct client {
	struct client *next;
	uint32_t pipe;
	uint64_t id;
	int pid;
	uid_t uid;
	char name[64];
	bool hello;
	uint64_t since_ms;
	struct attachment *atts[MAX_ATTACH_PER_CLIENT];
	unsigned natts;
	unsigned gone_seen;       /* sweeps that found its process gone */
};

struct server {
	uv_loop_t *loop;
	uv_async_t async;
	uv_timer_t stop_timer;
	unsigned attach_jobs;     /* CUDA attaches waiting for the driver (attach_work) */
	unsigned stop_waits;
	bool stop_flushed;
	nng_socket sock;
	nng_listener listener;
	bool sock_open;
	struct fdchan *fdchan;
	struct engine *engine;
	char path[108];
	char fdpath[112];
	pthread_mutex_t lock;
	struct event *ev_head, *ev_tail;
	struct sctx *all;
	struct sctx *idle;
	atomic_uint nrecv;          /* contexts waiting for a request */
	atomic_bool closing;        /* nng callbacks must not start new work */
	unsigned nctx;
	struct client *clients;
	unsigned nclients;
	uint64_t client_ctr;
	uint64_t started_ms;
	bool stopping;
	/* the listener watchdog, see probe_main() */
	pthread_t prober;
	bool prober_running;
	pthread_mutex_t probe_lock;
	pthread_cond_t probe_cond;
	bool probe_stop;
	unsigned heals;
	struct wedged wedged;     /* replaced listeners' fds, still nng's */
	uv_timer_t drain_timer;
	uv_timer_t sweep_timer;
	void (*stop_done)(void *);
	void *stop_userdata;
	unsigned pending_closes;
};

static void heal_listener(struct server *srv);
struct sctx;
static void sctx_drop_msg(struct sctx *c);

/* nng 1.5.2 never frees the connections queued on a wedged listener. */
static bool nng_leaks_memory;

bool server_nng_leaked(void)
{
	return nng_leaks_memory;
}

/* --- events from nng threads -------------------------------------------- */

static void push_event(struct server *srv, struct event *ev)
{
	ev->next = NULL;
	pthread_mutex_lock(&srv->lock);
	if (srv->ev_tail)
		srv->ev_tail->next = ev;
	else
		srv->ev_head = ev;
	srv->ev_tail = ev;
	pthread_mutex_unlock(&srv->lock);
	uv_async_send(&srv->async);
}

static void on_ctx_aio(void *arg)
{
	struct sctx *c = arg;
	struct server *srv = c->srv;

	/* A reply went out: this context receives the next request right here,
	 * on nng's thread, so a reply costs the loop no wake-up of its own. */
	if (c->state == CTX_SEND && !atomic_load(&srv->closing)) {
		sctx_drop_msg(c);
		c->state = CTX_RECV;
		atomic_fetch_add(&srv->nrecv, 1);
		nng_ctx_recv(c->ctx, c->aio);
		return;
	}
	push_event(srv, &c->ev);
}

static void on_pipe_event(nng_pipe p, nng_pipe_ev type, void *arg)
{
	struct server *srv = arg;
	struct event *ev = calloc(1, sizeof(*ev));

	if (!ev)
		return;
	ev->type = type == NNG_PIPE_EV_ADD_POST ? EV_PIPE_ADD : EV_PIPE_REM;
	ev->pipe = (uint32_t)nng_pipe_id(p);
	push_event(srv, ev);
}

/* --- contexts ----------------------------------------------------------- */

/*
 * A message in a context's aio belongs to that aio until taken: every taker
 * clears it (nng clears it itself when a send is accepted), so whatever is
 * left there is ours to free, whatever the state.
 */
static void sctx_drop_msg(struct sctx *c)
{
	nng_msg *m = nng_aio_get_msg(c->aio);

	if (m) {
		nng_aio_set_msg(c->aio, NULL);
		nng_msg_free(m);
	}
}

static struct sctx *sctx_get(struct server *srv)
{
	struct sctx *c = srv->idle;

	if (c) {
		srv->idle = c->free_next;
		return c;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->srv = srv;
	c->ev.type = EV_CTX;
	if (nng_ctx_open(&c->ctx, srv->sock) != 0) {
		free(c);
		return NULL;
	}
	if (nng_aio_alloc(&c->aio, on_ctx_aio, c) != 0) {
		nng_ctx_close(c->ctx);
		free(c);
		return NULL;
	}
	c->all_next = srv->all;
	srv->all = c;
	srv->nctx++;
	return c;
}

static void post_receivers(struct server *srv)
{
	while (!srv->stopping && atomic_load(&srv->nrecv) < RECV_TARGET) {
		struct sctx *c = sctx_get(srv);
		if (!c) {
			log_err("cannot open another nng context (%u open)", srv->nctx);
			return;
		}
		c->state = CTX_RECV;
		atomic_fetch_add(&srv->nrecv, 1);
		nng_ctx_recv(c->ctx, c->aio);
	}
}

static void sctx_idle(struct server *srv, struct sctx *c)
{
	c->state = CTX_IDLE;
	c->free_next = srv->idle;
	srv->idle = c;
}

static void send_reply(struct server *srv, struct sctx *c, const Loaderd__Reply *rep)
{
	size_t len = loaderd__reply__get_packed_size(rep);
	nng_msg *msg;

	c->answered = true;
	if (nng_msg_alloc(&msg, len) != 0) {
		log_err("out of memory for a reply of %zu bytes", len);
		sctx_idle(srv, c);
		return;
	}
	loaderd__reply__pack(rep, nng_msg_body(msg));
	nng_aio_set_msg(c->aio, msg);
	c->state = CTX_SEND;
	nng_ctx_send(c->ctx, c->aio);
}

static void reply_error(struct server *srv, struct sctx *c, int code, const char *msg)
{
	Loaderd__Reply rep = LOADERD__REPLY__INIT;
	Loaderd__Error e = LOADERD__ERROR__INIT;

	e.code = code;
	/* a failure that left no sentence (out of memory deep down) still says what */
	e.message = (char *)(msg && *msg ? msg : strerror(code));
	rep.body_case = LOADERD__REPLY__BODY_ERROR;
	rep.error = &e;
	send_reply(srv, c, &rep);
}

static void reply_ok(struct server *srv, struct sctx *c)
{
	Loaderd__Reply rep = LOADERD__REPLY__INIT;
	Loaderd__Ok ok = LOADERD__OK__INIT;

	rep.body_case = LOADERD__REPLY__BODY_OK;
	rep.ok = &ok;
	send_reply(srv, c, &rep);
}

static void reply_json(struct server *srv, struct sctx *c, json_t *obj)
{
	Loaderd__Reply rep = LOADERD__REPLY__INIT;
	Loaderd__JsonReply j = LOADERD__JSON_REPLY__INIT;
	char *text = json_dumps(obj, JSON_COMPACT);

	json_decref(obj);
	if (!text) {
		reply_error(srv, c, ENOMEM, "out of memory");
		return;
	}
	j.json = text;
	rep.body_case = LOADERD__REPLY__BODY_JSON;
	rep.json = &j;
	send_reply(srv, c, &rep);
	free(text);
}

/* The engine answers a parked Next. */
static void on_deliver(void *userdata, struct pending *p, const struct delivery *d)
{
	struct server *srv = userdata;
	struct sctx *c = (struct sctx *)((char *)p - offsetof(struct sctx, pending));
	Loaderd__Reply rep = LOADERD__REPLY__INIT;
	Loaderd__Batches bl = LOADERD__BATCHES__INIT;
	Loaderd__Batch bs[DELIVER_MAX_BATCHES], *bp[DELIVER_MAX_BATCHES];
	Loaderd__End e = LOADERD__END__INIT;
	Loaderd__Error er = LOADERD__ERROR__INIT;
	Loaderd__Revoke rv = LOADERD__REVOKE__INIT;

	switch (d->kind) {
	case DELIVER_BATCH:
		for (uint32_t i = 0; i < d->nbatches; i++) {
			bs[i] = (Loaderd__Batch)LOADERD__BATCH__INIT;
			bs[i].seq = d->batches[i].seq;
			bs[i].lease = d->batches[i].lease;
			bs[i].epoch = d->batches[i].epoch;
			bs[i].index = d->batches[i].index;
			bs[i].slot = d->batches[i].slot;
			bs[i].rows = d->batches[i].rows;
			bp[i] = &bs[i];
		}
		bl.n_batches = d->nbatches;
		bl.batches = bp;
		bl.share = d->share;
		rep.body_case = LOADERD__REPLY__BODY_BATCHES;
		rep.batches = &bl;
		break;
	case DELIVER_END:
		e.seq = d->seq;
		rep.body_case = LOADERD__REPLY__BODY_END;
		rep.end = &e;
		break;
	case DELIVER_REVOKE:
		rv.share = d->share;
		rv.upto_seq = d->upto_seq;
		rv.count = d->count;
		rep.body_case = LOADERD__REPLY__BODY_REVOKE;
		rep.revoke = &rv;
		break;
	case DELIVER_ERROR:
		er.seq = d->seq;
		er.code = d->err;
		er.message = (char *)(d->msg ? d->msg : "");
		rep.body_case = LOADERD__REPLY__BODY_ERROR;
		rep.error = &er;
		break;
	}
	send_reply(srv, c, &rep);
}

/* --- clients ------------------------------------------------------------ */

static struct client *client_find(struct server *srv, uint32_t pipe)
{
	for (struct client *cl = srv->clients; cl; cl = cl->next)
		if (cl->pipe == pipe)
			return cl;
	return NULL;
}

/*
 * nng may hand us a pipe's first message before its ADD_POST event, and its
 * ADD_POST after its REM_POST: the callbacks run on different threads. So a
 * session starts with whichever comes first, provided nng still knows the pipe
 * (a query of a removed pipe fails), and REM_POST ends it.
 */
static struct client *client_get(struct server *srv, nng_pipe p)
{
	uint32_t id = (uint32_t)nng_pipe_id(p);
	struct client *cl = client_find(srv, id);
	uint64_t pid = 0, uid = (uint64_t)-1;

	if (cl)
		return cl;
	if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &pid) != 0)
		return NULL;
	nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid);
	if (srv->stopping || srv->nclients >= MAX_CLIENTS) {
		log_warn("refusing a connection from pid %d: %s", (int)pid,
		         srv->stopping ? "shutting down" : "too many clients");
		nng_pipe_close(p);
		return NULL;
	}
	cl = calloc(1, sizeof(*cl));
	if (!cl)
		return NULL;
	cl->pipe = id;
	cl->id = ++srv->client_ctr;
	cl->pid = (int)pid;
	cl->uid = (uid_t)uid;
	cl->since_ms = uv_now(srv->loop);
	cl->next = srv->clients;
	srv->clients = cl;
	srv->nclients++;
	log_debug("client %" PRIu64 " (pid %d, uid %u) connected", cl->id, cl->pid, (unsigned)cl->uid);
	return cl;
}

static void client_remove_att(struct client *cl, unsigned i)
{
	cl->atts[i] = cl->atts[--cl->natts];
}

static void client_free(struct server *srv, struct client *cl)
{
	struct client **pp;
	size_t leases = 0;

	for (pp = &srv->clients; *pp; pp = &(*pp)->next)
		if (*pp == cl) {
			*pp = cl->next;
			break;
		}
	srv->nclients--;
	while (cl->natts) {
		struct attachment *a = cl->atts[cl->natts - 1];
		leases += attachment_leases(a);
		client_remove_att(cl, cl->natts - 1);
		attachment_detach(a);
	}
	engine_client_gone(srv->engine, cl->id);
	log_msg(cl->pid == getpid() ? LOG_DEBUG : LOG_INFO,
	        "client %" PRIu64 " (pid %d) disconnected%s", cl->id, cl->pid,
	        leases ? ", its leases were released" : "");
	free(cl);
}

static struct attachment *client_att(struct client *cl, uint64_t id, unsigned *index)
{
	for (unsigned i = 0; i < cl->natts; i++)
		if (attachment_id(cl->atts[i]) == id) {
			if (index)
				*index = i;
			return cl->atts[i];
		}
	return NULL;
}

/* Every client but @self, the connection that asks. */
static json_t *clients_json(struct server *srv, const struct client *self)
{
	json_t *arr = json_array();

	for (struct client *cl = srv->clients; cl; cl = cl->next) {
		/* the caller, and the watchdog's probes (our own pid) */
		if (cl == self || cl->pid == getpid())
			continue;
		json_t *atts = json_array();
		json_t *last = NULL;
		json_int_t leases = 0, delivered = 0;

		for (unsigned i = 0; i < cl->natts; i++) {
			json_t *a = attachment_json(cl->atts[i]);
			leases += json_integer_value(json_object_get(a, "leases"));
			delivered += json_integer_value(json_object_get(a, "delivered"));
			last = a;
			json_array_append_new(atts, a);
		}
		json_array_append_new(arr, json_pack("{s:I, s:i, s:I, s:s, s:O, s:O, s:I, s:I, s:I, s:o}",
			"id", (json_int_t)cl->id,
			"pid", cl->pid,
			"uid", (json_int_t)cl->uid,
			"name", cl->name,
			"pipeline", last ? json_object_get(last, "pipeline") : json_null(),
			"mode", last ? json_object_get(last, "mode") : json_null(),
			"leases", leases,
			"delivered", delivered,
			"connected_s", (json_int_t)((uv_now(srv->loop) - cl->since_ms) / 1000),
			"attachments", atts));
	}
	return arr;
}

/* --- requests ----------------------------------------------------------- */

static void handle_hello(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__Hello *h)
{
	Loaderd__Reply rep = LOADERD__REPLY__INIT;
	Loaderd__HelloReply hr = LOADERD__HELLO_REPLY__INIT;
	char msg[128];

	if (h->protocol != LDR_PROTOCOL_VERSION) {
		snprintf(msg, sizeof(msg), "protocol version %u is not supported (loaderd %s speaks %d)",
		         h->protocol, LOADERD_VERSION, LDR_PROTOCOL_VERSION);
		reply_error(srv, c, EPROTONOSUPPORT, msg);
		return;
	}
	snprintf(cl->name, sizeof(cl->name), "%s", h->client_name);
	for (char *p = cl->name; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	cl->hello = true;
	hr.protocol = LDR_PROTOCOL_VERSION;
	hr.daemon_version = (char *)LOADERD_VERSION;
	hr.client_id = cl->id;
	rep.body_case = LOADERD__REPLY__BODY_HELLO;
	rep.hello = &hr;
	send_reply(srv, c, &rep);
}

static void handle_create(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__CreatePipeline *m)
{
	Loaderd__Reply rep = LOADERD__REPLY__INIT;
	Loaderd__CreatePipelineReply cr = LOADERD__CREATE_PIPELINE_REPLY__INIT;
	struct spec *spec;
	char err[1024], name[LDR_NAME_MAX + 1];
	int r;

	r = spec_parse(&spec, m->spec_json, err, sizeof(err));
	if (r < 0) {
		reply_error(srv, c, -r, err);
		return;
	}
	snprintf(name, sizeof(name), "%s", spec->name);
	/* the pipeline is this connection's: it lingers once the connection
	 * closes and nobody reads it (docs/spec.md, "Lifetime") */
	r = engine_create(srv->engine, spec, cl->uid, cl->id, m->exist_ok, err, sizeof(err));
	if (r < 0) {
		reply_error(srv, c, -r, err);
		return;
	}
	if (r)
		log_info("client %" PRIu64 " (pid %d) created pipeline %s", cl->id, cl->pid, name);
	cr.name = name;
	cr.created = r == 1;
	rep.body_case = LOADERD__REPLY__BODY_CREATE;
	rep.create = &cr;
	send_reply(srv, c, &rep);
}

static void handle_drop(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__DropPipeline *m)
{
	char err[256] = "";
	int r;

	r = engine_drop(srv->engine, m->name, cl->uid, m->force, err, sizeof(err));
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
		.credits = m->credits, .client_id = cl->id, .uid = cl->uid,
	};
	struct attachment *a;
	struct attach_info info;
	char err[512] = "";

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
	ar.share = info.share;
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
	if (info.dslab)
		log_info("client %" PRIu64 " (pid %d) attached to %s as %s on cuda:%d", cl->id, cl->pid,
		         m->pipeline, mode_name((int)m->mode), info.dslab->device);
	else
		log_info("client %" PRIu64 " (pid %d) attached to %s as %s", cl->id, cl->pid, m->pipeline,
		         mode_name((int)m->mode));
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

static void handle_next(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__Next *m)
{
	struct attachment *a = att_or_reply(srv, c, cl, m->attach_id, NULL);
	char err[256] = "";
	int r;

	if (!a || !releases_fit(srv, c, m->n_releases) || !releases_fit(srv, c, m->n_returned))
		return;
	c->state = CTX_PARKED;
	c->answered = true;
	c->pending.max = m->max_batches;
	r = attachment_next(a, &c->pending, &(struct next_req){ .releases = m->releases,
		.nreleases = m->n_releases, .watch = m->watch, .has_return = m->has_return,
		.return_from = m->return_from, .returned = m->returned, .nreturned = m->n_returned },
		err, sizeof(err));
	if (r < 0)
		reply_error(srv, c, -r, err);
}

static void handle_release(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__Release *m)
{
	struct attachment *a = att_or_reply(srv, c, cl, m->attach_id, NULL);
	char err[256] = "";
	int r;

	if (!a || !releases_fit(srv, c, m->n_leases))
		return;
	r = attachment_next(a, NULL, &(struct next_req){ .releases = m->leases, .nreleases = m->n_leases },
	                    err, sizeof(err));
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

static json_t *status_json(struct server *srv, const struct client *self)
{
	json_t *cuda = cuda_status_json();

	/* "cuda": absent until a client asked for a device; then the driver (or
	 * why there is none) and each device's copy engine */
	if (cuda)
		json_object_set_new(cuda, "devices", engine_cuda_json(srv->engine));
	return json_pack("{s:s, s:i, s:i, s:I, s:s, s:i, s:I, s:I, s:o, s:o, s:o*}",
		"version", LOADERD_VERSION,
		"protocol", LDR_PROTOCOL_VERSION,
		"pid", (int)getpid(),
		"uptime_s", (json_int_t)((uv_now(srv->loop) - srv->started_ms) / 1000),
		"socket", srv->path,
		"workers", (int)engine_workers(srv->engine),
		"memory_limit", (json_int_t)engine_memory_limit(srv->engine),
		"memory_used", (json_int_t)engine_memory_used(srv->engine),
		"pipelines", engine_pipelines_json(srv->engine),
		"clients", clients_json(srv, self),
		"cuda", cuda);
}

static void handle_request(struct server *srv, struct sctx *c, nng_msg *msg)
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
		log_warn("client %" PRIu64 " (pid %d): malformed request", cl->id, cl->pid);
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
	case LOADERD__REQUEST__BODY_LIST:
		reply_json(srv, c, json_pack("{s:o}", "pipelines", engine_pipelines_json(srv->engine)));
		break;
	case LOADERD__REQUEST__BODY_STATUS:
		reply_json(srv, c, status_json(srv, cl));
		break;
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
	default:
		reply_error(srv, c, EPROTO, "malformed request: empty or unknown request type");
		break;
	}
out:
	loaderd__request__free_unpacked(req, NULL);
}

static void on_ctx_done(struct server *srv, struct sctx *c)
{
	int rv = nng_aio_result(c->aio);

	if (c->state == CTX_RECV) {
		atomic_fetch_sub(&srv->nrecv, 1);
		if (rv != 0) {
			if (rv != NNG_ECLOSED && rv != NNG_ECANCELED)
				log_warn("nng receive: %s", nng_strerror(rv));
			sctx_idle(srv, c);
		} else {
			nng_msg *m = nng_aio_get_msg(c->aio);
			nng_aio_set_msg(c->aio, NULL);
			c->answered = false;
			handle_request(srv, c, m);
			/* after an answer, c belongs to nng's callback; read nothing */
			if (!c->answered) /* a request from a gone pipe */
				sctx_idle(srv, c);
		}
	} else if (c->state == CTX_SEND) {
		sctx_drop_msg(c);
		sctx_idle(srv, c);
	}
	post_receivers(srv);
}

static void on_async(uv_async_t *h)
{
	struct server *srv = h->data;

	for (;;) {
		struct event *ev;

		pthread_mutex_lock(&srv->lock);
		ev = srv->ev_head;
		if (ev) {
			srv->ev_head = ev->next;
			if (!srv->ev_head)
				srv->ev_tail = NULL;
		}
		pthread_mutex_unlock(&srv->lock);
		if (!ev)
			return;
		switch (ev->type) {
		case EV_CTX:
			on_ctx_done(srv, (struct sctx *)ev);
			break;
		case EV_PIPE_ADD: {
			nng_pipe p = NNG_PIPE_INITIALIZER;
			memcpy(&p, &ev->pipe, sizeof(ev->pipe));
			client_get(srv, p);
			free(ev);
			break;
		}
		case EV_HEAL:
			heal_listener(srv);
			free(ev);
			break;
		case EV_PIPE_REM: {
			struct client *cl = client_find(srv, ev->pipe);
			if (cl)
				client_free(srv, cl);
			free(ev);
			break;
		}
		}
	}
}

static int fd_lookup(void *userdata, const uint8_t *token, uid_t uid, int *fd, uint64_t *size,
                     int *dev_fd, uint64_t *dev_size)
{
	struct server *srv = userdata;
	return engine_take_token(srv->engine, token, uid, fd, size, dev_fd, dev_size);
}

/* --- life cycle --------------------------------------------------------- */

/*
 * Is a daemon listening on @path, and does its nng listener answer? Asked with
 * a complete SP handshake over a plain AF_UNIX socket: the 8-byte header of a
 * REQ peer out, a REP peer's back, within @timeout_ms, then a clean close.
 * Never a bare connect(): nng 1.5.2's ipc listener stops accepting after a
 * peer that hangs up in the middle of the handshake (nng issue #1518, fixed in
 * 1.6), so a bare probe would break the very daemon it finds. And never an nng
 * socket of our own: nng_close() of a REQ socket can block for good in 1.5.2,
 * and in the daemon it blocks nng's one reaper thread, after which no
 * connection is ever reaped (clients that went away stay listed, stop hangs).
 * Return: 0 answered; -ECONNREFUSED nobody listens; -EIO no handshake.
 */
static bool recv_all(int fd, void *buf, size_t len)
{
	size_t n = 0;

	while (n < len) {
		ssize_t r = recv(fd, (char *)buf + n, len - n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		n += (size_t)r;
	}
	return true;
}

/*
 * With @hello, also one request through the whole daemon: a Hello framed as
 * nng's ipc transport frames a REQ message (type 1, 64-bit big-endian length,
 * the 32-bit request id with its top bit set, the body), answered with the
 * same request id. A listener wedged by #1518 can still complete the
 * transport handshake while its pipe never reaches the socket.
 */
static int sp_probe(const char *path, int timeout_ms, bool hello)
{
	static const uint8_t req_hdr[8] = { 0, 'S', 'P', 0, 0x00, 0x30, 0, 0 }; /* REQ0 */
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = timeout_ms % 1000 * 1000 };
	uint8_t got[8];
	int fd, e;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -EIO;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -EIO;
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		e = errno;
		close(fd);
		return e == ECONNREFUSED || e == ENOENT ? -ECONNREFUSED : -EIO;
	}
	if (send(fd, req_hdr, sizeof(req_hdr), MSG_NOSIGNAL) != (ssize_t)sizeof(req_hdr)) {
		close(fd);
		return -EIO;
	}
	/* a REP peer: 0 'S' 'P' 0, protocol 0x31 */
	if (!recv_all(fd, got, sizeof(got)) || memcmp(got, "\0SP\0", 4) || got[4] != 0x00 || got[5] != 0x31) {
		close(fd);
		return -EIO;
	}
	if (hello) {
		Loaderd__Request req = LOADERD__REQUEST__INIT;
		Loaderd__Hello h = LOADERD__HELLO__INIT;
		uint8_t msg[128], head[9];
		size_t len;
		uint64_t rlen;
		bool ok;

		h.protocol = LDR_PROTOCOL_VERSION;
		h.client_name = "loaderd-watchdog";
		req.body_case = LOADERD__REQUEST__BODY_HELLO;
		req.hello = &h;
		len = loaderd__request__pack(&req, msg + 13);
		msg[0] = 1;
		for (int i = 0; i < 8; i++)
			msg[1 + i] = (uint8_t)((uint64_t)(len + 4) >> (56 - 8 * i));
		memcpy(msg + 9, "\x80\x00\x00\x01", 4); /* request id 1, top bit set */
		ok = send(fd, msg, 13 + len, MSG_NOSIGNAL) == (ssize_t)(13 + len) && recv_all(fd, head, sizeof(head)) &&
		     head[0] == 1;
		rlen = 0;
		for (int i = 0; ok && i < 8; i++)
			rlen = rlen << 8 | head[1 + i];
		ok = ok && rlen >= 4 && rlen <= sizeof(msg) && recv_all(fd, msg, (size_t)rlen) &&
		     !memcmp(msg, "\x80\x00\x00\x01", 4);
		if (!ok) {
			close(fd);
			return -EIO;
		}
	}
	close(fd);
	return 0;
}

static int socket_probe(const char *path)
{
	return sp_probe(path, PROBE_WAIT_MS, false);
}

/*
 * Listen on @path: bind a fresh listener under a temporary name, then rename
 * it over the public path, so that clients never see the path missing.
 */
static int listener_start(struct server *srv, nng_listener *out, char *err, size_t errlen)
{
	char tmp[128], url[160];
	nng_listener l;
	int rv;

	snprintf(tmp, sizeof(tmp), "%s.%u", srv->path, srv->heals);
	unlink(tmp);
	snprintf(url, sizeof(url), "ipc://%s", tmp);
	if ((rv = nng_listener_create(&l, srv->sock, url)) != 0 ||
	    (rv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, 0660)) != 0 ||
	    (rv = nng_listener_start(l, 0)) != 0) {
		snprintf(err, errlen, "cannot listen on %s: %s", srv->path, nng_strerror(rv));
		return -EADDRNOTAVAIL;
	}
	chmod(tmp, 0660);
	if (rename(tmp, srv->path) < 0) {
		int e = errno;
		snprintf(err, errlen, "cannot move %s to %s: %s", tmp, srv->path, strerror(e));
		nng_listener_close(l);
		return -e;
	}
	*out = l;
	return 0;
}

/* An SP handshake with our own socket, answered within PROBE_WAIT_MS. */
static bool probe_once(struct server *srv)
{
	return sp_probe(srv->path, PROBE_WAIT_MS, true) == 0;
}

/*
 * The listener watchdog. nng 1.5.2 (Debian 12's) stops accepting on an ipc
 * listener after a peer hangs up in the middle of the SP handshake (nng issue
 * #1518, fixed in 1.6): a trainer killed while it connects would leave the
 * daemon deaf to every new client. So a thread checks every PROBE_EVERY_MS that
 * a handshake with our own socket completes; when one does not, the loop
 * starts a fresh listener and renames it over the path. Connected clients keep
 * their connections. Probes cost one connection each, no request.
 */
static void *probe_main(void *arg)
{
	struct server *srv = arg;
	struct timespec deadline;

	pthread_mutex_lock(&srv->probe_lock);
	while (!srv->probe_stop) {
		clock_gettime(CLOCK_MONOTONIC, &deadline);
		deadline.tv_sec += PROBE_EVERY_MS / 1000;
		while (!srv->probe_stop &&
		       pthread_cond_timedwait(&srv->probe_cond, &srv->probe_lock, &deadline) != ETIMEDOUT)
			;
		if (srv->probe_stop)
			break;
		pthread_mutex_unlock(&srv->probe_lock);
		bool ok = probe_once(srv);
		pthread_mutex_lock(&srv->probe_lock);
		if (!ok && !srv->probe_stop) {
			struct event *ev = calloc(1, sizeof(*ev));
			if (ev) {
				ev->type = EV_HEAL;
				push_event(srv, ev);
			}
		}
	}
	pthread_mutex_unlock(&srv->probe_lock);
	return NULL;
}

/* The fd of our current nng listener: the unix socket bound to its name. */
static int find_listen_fd(struct server *srv)
{
	char want[128];
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int found = -1;

	snprintf(want, sizeof(want), "%s.%u", srv->path, srv->heals);
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		struct sockaddr_un sa;
		socklen_t len = sizeof(sa);
		int fd = atoi(e->d_name), acc = 0;
		socklen_t alen = sizeof(acc);
		if (fd <= 2 || fd == dirfd(d))
			continue;
		memset(&sa, 0, sizeof(sa));
		if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0 || sa.sun_family != AF_UNIX)
			continue;
		if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &alen) < 0 || !acc)
			continue;
		if (strcmp(sa.sun_path, want) == 0) {
			found = fd;
			break;
		}
	}
	closedir(d);
	return found;
}

static void on_drain_timer(uv_timer_t *t)
{
	struct server *srv = t->data;

	wedged_drain(&srv->wedged);
}

static void heal_listener(struct server *srv)
{
	char err[256] = "";
	nng_listener l;
	int old_fd;

	if (srv->stopping)
		return;
	old_fd = find_listen_fd(srv);
	srv->heals++;
	nng_leaks_memory = true;
	if (listener_start(srv, &l, err, sizeof(err)) < 0) {
		log_err("listener on %s does not accept; replacing it failed: %s", srv->path, err);
		return;
	}
	/* The wedged one keeps its connected clients, so it stays open; but nng
	 * polls its unaccepted backlog in a busy loop, so empty that backlog now
	 * and shortly after (new peers reach the new socket only). */
	wedged_add(&srv->wedged, old_fd);
	srv->listener = l;
	wedged_drain(&srv->wedged);
	uv_timer_start(&srv->drain_timer, on_drain_timer, 1000, 0);
	log_warn("listener on %s stopped accepting (a peer hung up during the handshake); replaced it", srv->path);
}

/*
 * Clients whose process is gone while nng still reports their connection
 * open. nng 1.5.2 can wedge its one reaper thread (a reply racing the close of
 * a killed client's connection), after which no connection is ever reported
 * closed: such a client would keep its leases, and hold a broadcast pipeline
 * back, for good. A client whose pid (SO_PEERCRED) has been gone in two
 * sweeps a second apart is released as if it had disconnected; a connection
 * nng does report closed in the meantime is released the normal way.
 */
static void on_sweep_timer(uv_timer_t *t)
{
	struct server *srv = t->data;
	struct client *cl, *next;

	if (srv->stopping)
		return;
	for (cl = srv->clients; cl; cl = next) {
		next = cl->next;
		if (cl->pid <= 0 || cl->pid == getpid() || kill(cl->pid, 0) == 0 || errno != ESRCH) {
			cl->gone_seen = 0;
			continue;
		}
		if (++cl->gone_seen < 2)
			continue;
		log_warn("client %" PRIu64 " (pid %d) exited but its connection was never reported closed "
		         "(nng); releasing it", cl->id, cl->pid);
		client_free(srv, cl);
	}
}

static void on_handle_closed(uv_handle_t *h);

static void server_init_locks(struct server *srv)
{
	pthread_condattr_t ca;

	pthread_mutex_init(&srv->lock, NULL);
	pthread_mutex_init(&srv->probe_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&srv->probe_cond, &ca);
	pthread_condattr_destroy(&ca);
}

static void server_free(struct server *srv)
{
	pthread_cond_destroy(&srv->probe_cond);
	pthread_mutex_destroy(&srv->probe_lock);
	pthread_mutex_destroy(&srv->lock);
	free(srv);
}

/*
 * Every failure says what failed in @err: main prints it, and a message left
 * unset would print whatever the stack held.
 */
int server_new(struct server **out, uv_loop_t *loop, const struct server_config *cfg,
               char *err, size_t errlen)
{
	static const struct engine_ops ops = { .deliver = on_deliver };
	struct server *srv;
	int r;

	srv = calloc(1, sizeof(*srv));
	if (!srv) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	srv->loop = loop;
	srv->started_ms = uv_now(loop);
	wedged_init(&srv->wedged);
	server_init_locks(srv);
	if (snprintf(srv->path, sizeof(srv->path), "%s", cfg->socket_path) >= (int)sizeof(srv->path) - 5) {
		snprintf(err, errlen, "socket path too long (most %zu bytes): %s", sizeof(srv->path) - 6,
		         cfg->socket_path);
		server_free(srv);
		return -ENAMETOOLONG;
	}
	sockpath_fdchan(srv->fdpath, sizeof(srv->fdpath), srv->path);

	r = sock_claim_path(srv->path, socket_probe, err, errlen);
	if (r < 0) {
		server_free(srv);
		return r;
	}
	r = uv_async_init(loop, &srv->async, on_async);
	if (r < 0) {
		snprintf(err, errlen, "cannot set up the event loop: %s", uv_strerror(r));
		server_free(srv);
		return r;
	}
	srv->async.data = srv;
	uv_timer_init(loop, &srv->drain_timer);
	srv->drain_timer.data = srv;
	uv_timer_init(loop, &srv->sweep_timer);
	srv->sweep_timer.data = srv;
	r = engine_new(&srv->engine, loop, cfg->workers, cfg->memory_limit, &ops, srv);
	if (r < 0) {
		snprintf(err, errlen, "cannot start %u workers: %s", cfg->workers, strerror(-r));
		srv->engine = NULL;
		goto fail_handles;
	}
	r = fdchan_new(&srv->fdchan, loop, srv->fdpath, fd_lookup, srv, err, errlen);
	if (r < 0)
		goto fail_engine;

	if ((r = nng_rep0_open(&srv->sock)) != 0) {
		snprintf(err, errlen, "nng: cannot open socket: %s", nng_strerror(r));
		r = -EIO;
		goto fail_fdchan;
	}
	srv->sock_open = true;
	nng_socket_set_size(srv->sock, NNG_OPT_RECVMAXSZ, MAX_MSG_BYTES);
	nng_pipe_notify(srv->sock, NNG_PIPE_EV_ADD_POST, on_pipe_event, srv);
	nng_pipe_notify(srv->sock, NNG_PIPE_EV_REM_POST, on_pipe_event, srv);
	if ((r = listener_start(srv, &srv->listener, err, errlen)) < 0)
		goto fail_sock;
	post_receivers(srv);
	if (!getenv("LOADERD_NO_LISTENER_WATCHDOG") &&
	    pthread_create(&srv->prober, NULL, probe_main, srv) == 0)
		srv->prober_running = true;
	uv_timer_start(&srv->sweep_timer, on_sweep_timer, 1000, 1000);
	*out = srv;
	return 0;

fail_sock:
	/* bounded, as everywhere: nng 1.5.2 can block in nng_close() for good */
	atomic_store(&srv->closing, true);
	if (!nng_close_within(srv->sock, CLOSE_WAIT_MS))
		log_warn("nng did not close within %d ms", CLOSE_WAIT_MS);
	srv->sock_open = false;
	while (srv->all) {
		struct sctx *c = srv->all;
		srv->all = c->all_next;
		nng_aio_free(c->aio);
		free(c);
	}
fail_fdchan:
	fdchan_close(srv->fdchan);
	srv->fdchan = NULL;
fail_engine:
	if (srv->engine) {
		engine_shutdown(srv->engine);
		srv->engine = engine_free(srv->engine);
	}
fail_handles:
	/* libuv frees nothing of ours: srv goes in the last close callback,
	 * once the caller runs the loop (main does, before uv_loop_close) */
	srv->pending_closes = 3;
	uv_close((uv_handle_t *)&srv->sweep_timer, on_handle_closed);
	uv_close((uv_handle_t *)&srv->drain_timer, on_handle_closed);
	uv_close((uv_handle_t *)&srv->async, on_handle_closed);
	return r;
}

struct engine *server_engine(struct server *srv)
{
	return srv->engine;
}

static void on_handle_closed(uv_handle_t *h)
{
	struct server *srv = h->data;

	if (--srv->pending_closes == 0) {
		void (*done)(void *) = srv->stop_done;
		void *ud = srv->stop_userdata;
		server_free(srv);
		if (done)
			done(ud);
	}
}

static void exit_stopped(void)
{
	log_notice("stopped");
	_exit(0);
}

static void on_stop_timer(uv_timer_t *t)
{
	struct server *srv = t->data;
	struct event *ev;

	/* a CUDA attach still in cuInit holds a context: wait for it, a while */
	if (srv->attach_jobs) {
		if (srv->stop_waits++ < STOP_CUDA_WAITS) {
			uv_timer_start(&srv->stop_timer, on_stop_timer, 100, 0);
			return;
		}
		log_warn("the CUDA driver did not answer within %d ms; exiting without it",
		         STOP_CUDA_WAITS * 100);
		unlink(srv->path);
		exit_stopped();
	}
	if (srv->stop_waits && !srv->stop_flushed) {
		/* the attach that waited was answered just now: let that leave too */
		srv->stop_flushed = true;
		uv_timer_start(&srv->stop_timer, on_stop_timer, STOP_FLUSH_MS, 0);
		return;
	}

	/* replies had their chance to leave; now cut everything */
	while (srv->clients)
		client_free(srv, srv->clients);
	atomic_store(&srv->closing, true);
	if (!nng_close_within(srv->sock, CLOSE_WAIT_MS)) {
		/* nng 1.5.2 can wait forever on a peer that is stopped with its
		 * socket buffer full (SIGSTOP). We are leaving: the kernel frees
		 * what nng holds. */
		log_warn("nng did not close within %d ms (a client stopped with unread replies?); "
		         "exiting without it", CLOSE_WAIT_MS);
		unlink(srv->path);
		exit_stopped();
	}
	srv->sock_open = false;
	for (struct sctx *c = srv->all; c; c = c->all_next)
		nng_aio_stop(c->aio);
	pthread_mutex_lock(&srv->lock);
	ev = srv->ev_head;
	srv->ev_head = srv->ev_tail = NULL;
	pthread_mutex_unlock(&srv->lock);
	while (ev) {
		struct event *n = ev->next;
		if (ev->type != EV_CTX)
			free(ev);
		ev = n;
	}
	while (srv->all) {
		struct sctx *c = srv->all;
		srv->all = c->all_next;
		/* a request nobody handled, or a reply that could not leave */
		sctx_drop_msg(c);
		nng_aio_free(c->aio);
		free(c);
	}
	srv->engine = engine_free(srv->engine);
	unlink(srv->path);
	srv->pending_closes = 4;
	uv_close((uv_handle_t *)&srv->sweep_timer, on_handle_closed);
	uv_close((uv_handle_t *)&srv->drain_timer, on_handle_closed);
	uv_close((uv_handle_t *)&srv->async, on_handle_closed);
	uv_close((uv_handle_t *)&srv->stop_timer, on_handle_closed);
}

void server_stop(struct server *srv, void (*done)(void *), void *userdata)
{
	if (srv->stopping)
		return;
	srv->stopping = true;
	srv->stop_done = done;
	srv->stop_userdata = userdata;
	log_notice("stopping: %u clients connected", srv->nclients);
	if (srv->prober_running) {
		pthread_mutex_lock(&srv->probe_lock);
		srv->probe_stop = true;
		pthread_cond_signal(&srv->probe_cond);
		pthread_mutex_unlock(&srv->probe_lock);
		pthread_join(srv->prober, NULL);
		srv->prober_running = false;
	}
	nng_listener_close(srv->listener);
	fdchan_close(srv->fdchan);
	srv->fdchan = NULL;
	engine_shutdown(srv->engine);
	uv_timer_init(srv->loop, &srv->stop_timer);
	srv->stop_timer.data = srv;
	uv_timer_start(&srv->stop_timer, on_stop_timer, STOP_FLUSH_MS, 0);
}
