/* SPDX-License-Identifier: MIT */
/* rpc - nng's events on the loop, the REP context pool, replies
 *
 * nng runs its own threads; its completions only queue an event and wake the
 * loop with uv_async_send (which coalesces, so the loop drains the whole
 * queue). Each request arrives on a REP context; a Next that cannot be answered
 * yet parks its context with the engine, which answers it through on_deliver().
 */
#include "server-private.h"

/* --- events from nng threads -------------------------------------------- */

void push_event(struct server *srv, struct event *ev)
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

__attribute__((weak)) struct event *pipe_event_new(nng_pipe_ev type)
{
	(void)type;
	return calloc(1, sizeof(struct event));
}

void on_pipe_event(nng_pipe p, nng_pipe_ev type, void *arg)
{
	struct server *srv = arg;
	struct event *ev = pipe_event_new(type);

	if (type == NNG_PIPE_EV_ADD_POST) {
		uint64_t pid = 0;
		/* the watchdog's probe sees its connection reach the socket here,
		 * on nng's thread, however busy the loop is (nngfix.c) */
		if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &pid) == 0 && pid == (uint64_t)getpid())
			atomic_fetch_add(&srv->self_pipes, 1);
	}
	if (!ev) {
		/* A lost connect is harmless: the first request makes its
		 * client. A lost disconnect would keep the client and its
		 * leases for good: the sweep looks for it (pipes_sweep_lost()). */
		if (type == NNG_PIPE_EV_REM_POST)
			atomic_fetch_add(&srv->rem_lost, 1);
		return;
	}
	ev->type = type == NNG_PIPE_EV_ADD_POST ? EV_PIPE_ADD : EV_PIPE_REM;
	ev->pipe = (uint32_t)nng_pipe_id(p);
	push_event(srv, ev);
}

/*
 * After a lost disconnect, the clients whose pipe nng no longer knows
 * (NNG_ENOENT) are gone: free them, one sweep after another until as many
 * were found, or until 10 sweeps found none (another path freed it).
 */
void pipes_sweep_lost(struct server *srv)
{
	unsigned lost = atomic_load(&srv->rem_lost), found = 0;
	struct client *cl, *next;

	if (!lost)
		return;
	for (cl = srv->clients; cl && found < lost; cl = next) {
		nng_pipe p = NNG_PIPE_INITIALIZER;
		uint64_t pid;
		next = cl->next;
		memcpy(&p, &cl->pipe, sizeof(cl->pipe));
		if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &pid) != NNG_ENOENT)
			continue;
		log_warn("client %" PRIu64 " (pid %d): its disconnect was lost (out of memory); "
		         "released now", cl->id, cl->pid);
		client_free(srv, cl);
		found++;
	}
	srv->rem_scans_idle = found ? 0 : srv->rem_scans_idle + 1;
	if (found || srv->rem_scans_idle >= 10) {
		atomic_fetch_sub(&srv->rem_lost, found ? found : lost);
		srv->rem_scans_idle = 0;
	}
}

/* --- contexts ----------------------------------------------------------- */

/*
 * A message in a context's aio belongs to that aio until taken: every taker
 * clears it (nng clears it itself when a send is accepted), so whatever is
 * left there is ours to free, whatever the state.
 */
void sctx_drop_msg(struct sctx *c)
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

void post_receivers(struct server *srv)
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

void sctx_idle(struct server *srv, struct sctx *c)
{
	c->state = CTX_IDLE;
	c->free_next = srv->idle;
	srv->idle = c;
}

void send_reply(struct server *srv, struct sctx *c, const Loaderd__Reply *rep)
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

void reply_error(struct server *srv, struct sctx *c, int code, const char *msg)
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

void reply_ok(struct server *srv, struct sctx *c)
{
	Loaderd__Reply rep = LOADERD__REPLY__INIT;
	Loaderd__Ok ok = LOADERD__OK__INIT;

	rep.body_case = LOADERD__REPLY__BODY_OK;
	rep.ok = &ok;
	send_reply(srv, c, &rep);
}

void reply_json(struct server *srv, struct sctx *c, json_t *obj)
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
void on_deliver(void *userdata, struct pending *p, const struct delivery *d)
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
			bs[i].error_code = d->batches[i].err;
			if (d->batches[i].err)
				bs[i].error = (char *)(d->batches[i].msg ? d->batches[i].msg : "");
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
		rv.ends_from = d->ends_from;
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

bool reply_park(struct sctx *c, bool *parked, bool answered)
{
	if (answered)
		return true;
	*parked = true;
	c->state = CTX_PARKED;
	c->answered = true;
	return false;
}

bool reply_unpark(bool parked, bool *answered)
{
	*answered = true;
	return parked;
}
