/* SPDX-License-Identifier: MIT */
/* endpoint - the daemon's nng REP endpoint: start, the loop's dispatch, stop
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
 *
 * The parts: rpc.c (nng events, contexts, replies), session.c (clients),
 * handlers.c (requests), nngfix.c (every nng 1.5.2 workaround), around
 * server-private.h.
 */
#include "server-private.h"

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
			srv->last_rem_ms = uv_now(srv->loop); /* nngfix.c: nng's reaper lives */
			if (cl)
				client_free(srv, cl);
			free(ev);
			break;
		}
		}
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
	free(srv->orphans);
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
	if (!srv)
		return errfmt(-ENOMEM, err, errlen, "out of memory");
	srv->loop = loop;
	srv->started_ms = uv_now(loop);
	wedged_init(&srv->wedged);
	server_init_locks(srv);
	if (snprintf(srv->path, sizeof(srv->path), "%s", cfg->socket_path) >= (int)sizeof(srv->path) - 5) {
		r = errfmt(-ENAMETOOLONG, err, errlen, "socket path too long (most %zu bytes): %s",
		           sizeof(srv->path) - 6, cfg->socket_path);
		server_free(srv);
		return r;
	}
	sockpath_fdchan(srv->fdpath, sizeof(srv->fdpath), srv->path);
	srv->sock_mode = cfg->socket_mode ? cfg->socket_mode : 0660;
	srv->sock_gid = cfg->socket_gid;
	srv->admin_gid = cfg->admin_gid;
	srv->max_conn_per_uid = cfg->max_conn_per_uid ? cfg->max_conn_per_uid : MAX_CLIENTS;

	r = sock_claim_path(srv->path, socket_probe, err, errlen);
	if (r < 0) {
		server_free(srv);
		return r;
	}
	{
		char why[256];
		if (sock_dir_check(srv->path, why, sizeof(why)) < 0)
			log_warn("%s: another user can take the socket's paths while loaderd is down; "
			         "use a directory only loaderd's user can write, e.g. /run/loaderd", why);
	}
	r = uv_async_init(loop, &srv->async, on_async);
	if (r < 0) {
		errfmt(r, err, errlen, "cannot set up the event loop: %s", uv_strerror(r));
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
		errfmt(r, err, errlen, "cannot start %u workers: %s", cfg->workers, strerror(-r));
		srv->engine = NULL;
		goto fail_handles;
	}
	engine_set_max_held(srv->engine, cfg->max_held_after_drop);
	engine_set_user_bounds(srv->engine, cfg->memory_limit_per_user, cfg->max_pipelines_per_user);
	r = fdchan_new(&srv->fdchan, loop, srv->fdpath, srv->sock_mode, srv->sock_gid, fd_lookup, srv,
	               err, errlen);
	if (r < 0)
		goto fail_engine;
	{
		char pywpath[sizeof(srv->path) + 16];
		char perr[256];
		snprintf(pywpath, sizeof(pywpath), "%s.workers", srv->path);
		r = pyw_server_new(&srv->pyw, loop, srv->engine, pywpath, srv->sock_mode, srv->sock_gid,
		                   perr, sizeof(perr));
		if (r == -EPERM) {
			/* another user's path: its listener would get our users' hosts */
			errfmt(r, err, errlen, "%s", perr);
			srv->pyw = NULL;
			goto fail_fdchan;
		}
		if (r < 0) {
			log_warn("no python pipelines: %s", perr);
			srv->pyw = NULL;
		}
	}

	if ((r = nng_rep0_open(&srv->sock)) != 0) {
		r = errfmt(-EIO, err, errlen, "nng: cannot open socket: %s", nng_strerror(r));
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
	pyw_server_close(srv->pyw);
	srv->pyw = NULL;
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

void server_set_access(struct server *srv, int admin_gid, unsigned max_conn_per_uid)
{
	srv->admin_gid = admin_gid;
	srv->max_conn_per_uid = max_conn_per_uid ? max_conn_per_uid : MAX_CLIENTS;
}

void server_set_reload(struct server *srv, server_reload_fn fn, void *userdata)
{
	srv->reload = fn;
	srv->reload_data = userdata;
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

	/* a CUDA attach still in cuInit, or a create still opening its files,
	 * holds a context and a pool thread: wait for them, a while */
	if (srv->attach_jobs || engine_creating(srv->engine)) {
		if (srv->stop_waits++ < STOP_CUDA_WAITS) {
			uv_timer_start(&srv->stop_timer, on_stop_timer, 100, 0);
			return;
		}
		log_warn("%s did not finish within %d ms; exiting without it",
		         srv->attach_jobs ? "the CUDA driver" : "opening a dataset", STOP_CUDA_WAITS * 100);
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
	pyw_server_close(srv->pyw);
	srv->pyw = NULL;
	fdchan_close(srv->fdchan);
	srv->fdchan = NULL;
	engine_shutdown(srv->engine);
	uv_timer_init(srv->loop, &srv->stop_timer);
	srv->stop_timer.data = srv;
	uv_timer_start(&srv->stop_timer, on_stop_timer, STOP_FLUSH_MS, 0);
}
