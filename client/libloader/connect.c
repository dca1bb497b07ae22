/* SPDX-License-Identifier: MIT */
/* libloader: connecting (ldr_connect()), the client's reconnect timeout,
 * losing the connection (on_pipe_rem()), ldr_close(). The handle itself and
 * the Hello are client.c's, below the attachments and the reconnection that
 * use them.
 */
#include "libloader-private.h"
#include <nng/protocol/reqrep0/req.h> /* after nng.h */
#include "nngclose.h"

/* The process that first used nng through this library. */
static _Atomic pid_t nng_pid;

static void on_pipe_rem(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct ldr_client *c = arg;

	(void)p;
	(void)ev;
	pthread_mutex_lock(&c->lock);
	c->disconnected = true;
	c->cuts++;
	/* a client in use reconnects (the flusher does it, reconnect_run());
	 * a connection of the reconnection that goes too just fails its call */
	if (c->ready && c->reconnect_ms > 0 && !c->closing && c->flusher_running && !c->reconnecting) {
		c->reconnecting = true;
		c->reconnect_wanted = true;
		clock_gettime(CLOCK_MONOTONIC, &c->went_at);
		pthread_cond_signal(&c->flush_cond);
	}
	for (struct sync_call *sc = c->sync_calls; sc; sc = sc->next)
		nng_aio_cancel(sc->aio);
	for (struct ldr_attachment *a = c->atts; a; a = a->next) {
		for (int i = 0; i < a->inflight; i++)
			if (a->reqs[i].open && a->reqs[i].state != REQ_IDLE)
				nng_aio_cancel(a->reqs[i].aio);
		if (a->relreq.open && a->relreq.state != REQ_IDLE)
			nng_aio_cancel(a->relreq.aio);
		if (a->watch.open && a->watch.state != REQ_IDLE)
			nng_aio_cancel(a->watch.aio);
		ring_poke(a);
	}
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

static int client_open_socket(struct ldr_client *c)
{
	int rv;

	if ((rv = nng_req0_open(&c->sock)) != 0)
		return rv;
	/* never resend: a Next may wait for a batch far longer than any timer */
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, LDR_MSG_MAX);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 1000);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 60000);
	nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, on_pipe_rem, c);
	return daemon_watch(c);
}

/*
 * Close the socket of a client that was never handed out, as ldr_close()
 * does: nng 1.5.2 can block in nng_close() forever. Returns true, and frees
 * @c, when the close finished; else @c is left to the close still going on
 * in the background (its pipe callback points at it) and to the exit.
 */
static bool client_drop(struct ldr_client *c)
{
	if (!nng_close_within(c->sock, CLOSE_WAIT_MS))
		return false;
	client_free(c);
	return true;
}

/*
 * The reconnect time from $LOADERD_RECONNECT_TIMEOUT (seconds, 0 never), else
 * RECONNECT_DEFAULT_MS; -EINVAL when it is not a number of seconds.
 */
static int reconnect_ms_from_env(int *ms)
{
	const char *v = getenv("LOADERD_RECONNECT_TIMEOUT");
	char *end;
	double sec;

	*ms = RECONNECT_DEFAULT_MS;
	if (!v || !*v)
		return 0;
	errno = 0;
	sec = strtod(v, &end);
	if (errno || end == v || *end || !(sec >= 0) || sec > 86400.0 * 24)
		return set_err(-EINVAL, "LOADERD_RECONNECT_TIMEOUT='%s' is not a number of seconds from 0 "
		               "(never reconnect) to 2073600", v);
	*ms = (int)(sec * 1000 + 0.5);
	if (sec > 0 && *ms == 0)
		*ms = 1;
	return 0;
}

int ldr_connect(struct ldr_client **out, const char *socket_path, const char *client_name)
{
	struct ldr_client *c;
	char url[128], name[64], path[sizeof(c->path)];
	int rv, r, reconnect_ms;

	/* nng keeps process-wide state and panics when a forked child uses it
	 * (even through a new socket): refuse before touching it. */
	pid_t self = getpid(), first = 0;
	if (!atomic_compare_exchange_strong(&nng_pid, &first, self) && first != self)
		return set_err(LDR_EFORKED, "libloader was used in process %d before this process forked "
		               "from it, and nng cannot start again in a forked child: connect before "
		               "forking only in the process that uses the connection, or start workers "
		               "with spawn", (int)first);
	if (ldr_socket_path(path, sizeof(path), socket_path) < 0)
		return set_err(-ENAMETOOLONG, "socket path too long");
	if ((r = reconnect_ms_from_env(&reconnect_ms)) < 0)
		return r;
	if (!client_name) {
		snprintf(name, sizeof(name), "pid %d", (int)self);
		client_name = name;
	}
	c = client_alloc(self, path, client_name);
	if (!c)
		return set_err(-ENOMEM, "out of memory");
	if ((r = daemon_user_init(c)) < 0) {
		client_free(c);
		return r;
	}
	if ((rv = client_open_socket(c)) != 0) {
		client_free(c);
		return set_err(nng_to_errno(rv), "nng: %s", nng_strerror(rv));
	}
	snprintf(url, sizeof(url), "ipc://%s", c->path);
	/* A Hello that goes unanswered for a few seconds, or whose connection
	 * the daemon cut, is retried on a fresh connection: the daemon replaces
	 * a listener that nng 1.5.2 wedged (daemon/server/nngfix.c), and cuts the
	 * connections queued on the old one, which are lost.
	 * Every close here is bounded (client_drop()), as in ldr_close(). */
	for (int timeouts = 0, cuts = 0;;) {
		bool last = timeouts == HELLO_ATTEMPTS - 1 || cuts == HELLO_CUTS - 1;
		rv = nng_dial(c->sock, url, &c->dialer, 0);
		if ((r = daemon_refused(c, 0)) < 0) {
			/* another user's daemon (whose.c): no retry changes that */
			client_drop(c);
			return r;
		}
		if (rv != 0) {
			/* a handshake the daemon cut (ECONNSHUT: the listener it
			 * replaces held this connection) is retried as a cut Hello is */
			if (nng_to_errno(rv) != LDR_EDISCONNECTED || last) {
				r = set_err(nng_to_errno(rv) == LDR_EDISCONNECTED ? -ECONNREFUSED : nng_to_errno(rv),
				            "cannot connect to loaderd at %s: %s", c->path, nng_strerror(rv));
				client_drop(c);
				return r;
			}
		} else {
			r = hello_call(c, HELLO_TIMEOUT_MS, false);
			if ((r != -ETIMEDOUT && r != LDR_EDISCONNECTED) || last)
				break;
		}
		if (rv == 0 && r == -ETIMEDOUT) {
			timeouts++;
		} else {
			/* cut: the daemon is replacing a wedged listener; a storm of
			 * replacements (garbage connections) may cut several in a row */
			cuts++;
			usleep(20000u * (unsigned)cuts);
		}
		/* go on with a fresh client: one whose close did not finish is
		 * left to it (its pipe callback may still run) */
		client_drop(c);
		if (!(c = client_alloc(self, path, client_name)))
			return set_err(-ENOMEM, "out of memory");
		daemon_user_init(c); /* it resolved before */
		if ((rv = client_open_socket(c)) != 0) {
			client_free(c);
			return set_err(nng_to_errno(rv), "nng: %s", nng_strerror(rv));
		}
	}
	if (r < 0) {
		client_drop(c);
		return r;
	}
	if (pthread_create(&c->flusher, NULL, flusher_main, c) == 0)
		c->flusher_running = true;
	ldr_client_set_reconnect(c, reconnect_ms);
	pthread_mutex_lock(&c->lock);
	c->ready = true;
	pthread_mutex_unlock(&c->lock);
	*out = c;
	return 0;
}

int ldr_client_set_reconnect(struct ldr_client *c, int timeout_ms)
{
	CHECK_PID(c);
	if (timeout_ms < 0)
		return set_err(-EINVAL, "reconnect timeout %d ms: must be 0 (never) or more", timeout_ms);
	pthread_mutex_lock(&c->lock);
	c->reconnect_ms = timeout_ms;
	pthread_mutex_unlock(&c->lock);
	/* the dialer redials by itself: soon when we reconnect, rarely else */
	nng_dialer_set_ms(c->dialer, NNG_OPT_RECONNMINT, timeout_ms ? RECONNECT_MIN_MS : 1000);
	nng_dialer_set_ms(c->dialer, NNG_OPT_RECONNMAXT, timeout_ms ? RECONNECT_MAX_MS : 60000);
	return 0;
}

int ldr_client_reconnect_timeout(const struct ldr_client *client)
{
	struct ldr_client *c = (struct ldr_client *)client;
	int ms;

	bool locked = reader_lock(c);
	ms = c->reconnect_ms;
	reader_unlock(c, locked);
	return ms;
}

uint64_t ldr_client_reconnects(const struct ldr_client *client)
{
	struct ldr_client *c = (struct ldr_client *)client;
	uint64_t n;

	bool locked = reader_lock(c);
	n = c->reconnects;
	reader_unlock(c, locked);
	return n;
}

uint32_t ldr_client_daemon_uid(const struct ldr_client *client)
{
	struct ldr_client *c = (struct ldr_client *)client;
	uint32_t uid;

	bool locked = reader_lock(c);
	uid = (uint32_t)c->daemon_uid;
	reader_unlock(c, locked);
	return uid;
}

unsigned ldr_client_calls_in_flight(const struct ldr_client *client)
{
	struct ldr_client *c = (struct ldr_client *)client;
	unsigned n = 0;

	bool locked = reader_lock(c);
	for (const struct sync_call *sc = c->sync_calls; sc; sc = sc->next)
		n++;
	reader_unlock(c, locked);
	return n;
}

uint64_t ldr_client_id(const struct ldr_client *client)
{
	struct ldr_client *c = (struct ldr_client *)client; /* its lock: a reconnection changes it */
	uint64_t id;

	bool locked = reader_lock(c);
	id = c->id;
	reader_unlock(c, locked);
	return id;
}

void ldr_close(struct ldr_client *c)
{
	if (!c)
		return;
	if (c->pid != self_pid())
		return; /* nng state of the parent: leave it alone */
	/* a reconnection going on gives up at its next step */
	pthread_mutex_lock(&c->lock);
	c->closing = true;
	for (struct sync_call *sc = c->sync_calls; sc; sc = sc->next)
		nng_aio_cancel(sc->aio);
	pthread_cond_broadcast(&c->flush_cond);
	pthread_mutex_unlock(&c->lock);
	while (c->atts)
		ldr_detach(c->atts);
	if (c->flusher_running) {
		pthread_mutex_lock(&c->lock);
		c->flusher_stop = true;
		pthread_cond_signal(&c->flush_cond);
		pthread_mutex_unlock(&c->lock);
		pthread_join(c->flusher, NULL);
		c->flusher_running = false;
	}
	if (!nng_close_within(c->sock, CLOSE_WAIT_MS))
		return; /* nng is stuck on a dead peer: leave it, and c, to the exit */
	/* batches still alive hold their attachments, and these the client:
	 * the last of them frees it */
	client_unref(c);
}
