/* SPDX-License-Identifier: MIT */
/* libloader: synchronous calls: one request, one reply, on a context of its own;
 * they wait while the client reconnects and are cancelled when the
 * connection goes (on_pipe_rem()).
 */
#include "libloader-private.h"

/*
 * A request over LDR_MSG_MAX would only make nng 1.5.2's daemon socket drop
 * the connection (a reset, then a reconnect that sends it again): refuse it
 * here with the limit. Sets the error.
 */
int pack_msg(const Loaderd__Request *req, nng_msg **out)
{
	size_t len = loaderd__request__get_packed_size(req);
	nng_msg *msg;

	if (len > LDR_MSG_MAX) {
		if (req->body_case == LOADERD__REQUEST__BODY_CREATE && req->create->spec_json)
			return set_err(-EMSGSIZE, "the create request is %zu bytes (its spec %zu): "
			               "a message to loaderd is at most %u bytes (1 MiB), a spec "
			               "at most 256 KiB; list fewer files (a directory, a glob)",
			               len, strlen(req->create->spec_json), LDR_MSG_MAX);
		return set_err(-EMSGSIZE, "the request is %zu bytes: a message to loaderd is at most "
		               "%u bytes (1 MiB)", len, LDR_MSG_MAX);
	}
	if (nng_msg_alloc(&msg, len) != 0)
		return set_err(-ENOMEM, "out of memory");
	loaderd__request__pack(req, nng_msg_body(msg));
	*out = msg;
	return 0;
}

static int reply_error(const Loaderd__Reply *rep)
{
	const Loaderd__Error *e = rep->error;
	int code = e->code > 0 && e->code < 4096 ? -e->code : -EIO;

	return set_err(code, "%s", e->message && *e->message ? e->message : error_name(code));
}

/*
 * on_pipe_rem() cancels the operations registered when the connection goes;
 * one started just after that (on the connection @cut counted) would wait for
 * a reconnection that it may not see. A reconnection's own call (@internal)
 * started as ldr_close() began is cancelled as those in flight were.
 */
static void cancel_if_cut(struct ldr_client *c, nng_aio *aio, uint64_t cut, bool internal)
{
	pthread_mutex_lock(&c->lock);
	if (c->cuts != cut || (internal && c->closing))
		nng_aio_cancel(aio);
	pthread_mutex_unlock(&c->lock);
}

/* The error of a client disconnected for good. Called with c->lock held. */
int disconnected_err(const struct ldr_client *c)
{
	if (c->gone_msg[0])
		return set_err(LDR_EDISCONNECTED, "%s", c->gone_msg);
	return set_err(LDR_EDISCONNECTED, "disconnected from the daemon at %s", c->path);
}

/*
 * Wait while the client reconnects, at most until @deadline (NULL: however
 * long it takes). Return: 0 connected, LDR_EDISCONNECTED for good, or
 * -ETIMEDOUT. Called with c->lock held.
 */
int wait_connected(struct ldr_client *c, const struct timespec *deadline)
{
	while (c->reconnecting) {
		if (!deadline)
			pthread_cond_wait(&c->cond, &c->lock);
		else if (pthread_cond_timedwait(&c->cond, &c->lock, deadline) == ETIMEDOUT)
			return -ETIMEDOUT;
	}
	return c->disconnected ? disconnected_err(c) : 0;
}

/*
 * Send @req and wait for its reply; *out must be freed with free_unpacked.
 * A call waits while the client reconnects (within @timeout_ms), except the
 * reconnection's own (@internal), which run while it is disconnected.
 */
static int call_cut(struct ldr_client *c, const Loaderd__Request *req, Loaderd__Reply **out,
                    Loaderd__Reply__BodyCase expect, int timeout_ms, bool internal,
                    const uint64_t *on_cut);

int call_gen(struct ldr_client *c, const Loaderd__Request *req, Loaderd__Reply **out,
                    Loaderd__Reply__BodyCase expect, int timeout_ms, bool internal)
{
	return call_cut(c, req, out, expect, timeout_ms, internal, NULL);
}

int call_on(struct ldr_client *c, const Loaderd__Request *req, Loaderd__Reply **out,
            Loaderd__Reply__BodyCase expect, uint64_t cut)
{
	return call_cut(c, req, out, expect, CALL_TIMEOUT_MS, false, &cut);
}

static int call_cut(struct ldr_client *c, const Loaderd__Request *req, Loaderd__Reply **out,
                    Loaderd__Reply__BodyCase expect, int timeout_ms, bool internal,
                    const uint64_t *on_cut)
{
	nng_ctx ctx;
	nng_aio *aio = NULL;
	nng_msg *msg;
	Loaderd__Reply *rep;
	struct sync_call sc = { .next = NULL };
	struct timespec deadline;
	uint64_t cut;
	int rv, r;

	deadline_after(&deadline, timeout_ms);
	pthread_mutex_lock(&c->lock);
	if (on_cut && c->cuts != *on_cut) {
		pthread_mutex_unlock(&c->lock);
		return set_err(LDR_EDISCONNECTED, "disconnected from the daemon at %s", c->path);
	}
	if (!on_cut && !internal && (r = wait_connected(c, &deadline)) < 0) {
		pthread_mutex_unlock(&c->lock);
		if (r == -ETIMEDOUT)
			return set_err(r, "the daemon at %s went away and libloader is still reconnecting "
			               "after %d ms", c->path, timeout_ms);
		return r;
	}
	cut = c->cuts;
	pthread_mutex_unlock(&c->lock);
	if ((rv = nng_ctx_open(&ctx, c->sock)) != 0)
		return set_err(nng_to_errno(rv), "nng: %s", nng_strerror(rv));
	if ((rv = nng_aio_alloc(&aio, NULL, NULL)) != 0) {
		nng_ctx_close(ctx);
		return set_err(-ENOMEM, "out of memory");
	}
	nng_aio_set_timeout(aio, timeout_ms);
	r = pack_msg(req, &msg);
	if (r < 0)
		goto out;
	/* registered, however many run at once: on_pipe_rem() cancels them all */
	sc.aio = aio;
	pthread_mutex_lock(&c->lock);
	sc.next = c->sync_calls;
	sc.pprev = &c->sync_calls;
	if (c->sync_calls)
		c->sync_calls->pprev = &sc.next;
	c->sync_calls = &sc;
	pthread_mutex_unlock(&c->lock);

	nng_aio_set_msg(aio, msg);
	nng_ctx_send(ctx, aio);
	cancel_if_cut(c, aio, cut, internal);
	nng_aio_wait(aio);
	rv = nng_aio_result(aio);
	if (rv != 0) {
		nng_msg_free(nng_aio_get_msg(aio));
	} else {
		nng_ctx_recv(ctx, aio);
		cancel_if_cut(c, aio, cut, internal);
		nng_aio_wait(aio);
		rv = nng_aio_result(aio);
	}
	pthread_mutex_lock(&c->lock);
	*sc.pprev = sc.next;
	if (sc.next)
		sc.next->pprev = sc.pprev;
	bool disc = c->cuts != cut;
	pthread_mutex_unlock(&c->lock);
	if (rv != 0) {
		if (disc || rv == NNG_ECLOSED)
			r = set_err(LDR_EDISCONNECTED, "disconnected from the daemon at %s", c->path);
		else
			r = set_err(nng_to_errno(rv), "no reply from the daemon: %s", nng_strerror(rv));
		goto out;
	}
	msg = nng_aio_get_msg(aio);
	rep = loaderd__reply__unpack(NULL, nng_msg_len(msg), nng_msg_body(msg));
	nng_msg_free(msg);
	if (!rep) {
		r = set_err(-EPROTO, "malformed reply from the daemon");
		goto out;
	}
	if (rep->body_case == LOADERD__REPLY__BODY_ERROR) {
		r = reply_error(rep);
		loaderd__reply__free_unpacked(rep, NULL);
		goto out;
	}
	if (rep->body_case != expect) {
		loaderd__reply__free_unpacked(rep, NULL);
		r = set_err(-EPROTO, "unexpected reply from the daemon");
		goto out;
	}
	*out = rep;
	r = 0;
out:
	nng_aio_free(aio);
	nng_ctx_close(ctx);
	return r;
}

static int call_timeout(struct ldr_client *c, const Loaderd__Request *req, Loaderd__Reply **out,
                        Loaderd__Reply__BodyCase expect, int timeout_ms)
{
	return call_gen(c, req, out, expect, timeout_ms, false);
}

int call(struct ldr_client *c, const Loaderd__Request *req, Loaderd__Reply **out,
                Loaderd__Reply__BodyCase expect)
{
	return call_timeout(c, req, out, expect, CALL_TIMEOUT_MS);
}

int json_call_timeout(struct ldr_client *c, Loaderd__Request *req, char **json_out,
                             int timeout_ms)
{
	Loaderd__Reply *rep;
	int r;

	r = call_timeout(c, req, &rep, LOADERD__REPLY__BODY_JSON, timeout_ms);
	if (r < 0)
		return r;
	*json_out = strdup(rep->json->json);
	loaderd__reply__free_unpacked(rep, NULL);
	return *json_out ? 0 : set_err(-ENOMEM, "out of memory");
}

int json_call(struct ldr_client *c, Loaderd__Request *req, char **json_out)
{
	return json_call_timeout(c, req, json_out, CALL_TIMEOUT_MS);
}
