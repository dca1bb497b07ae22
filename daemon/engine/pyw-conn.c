/* SPDX-License-Identifier: MIT */
/* pyw-conn - the Python workers' socket: listening, accepting, a connection's bytes
 *
 * The side of pyworkers.c (pyworkers.h) that speaks to the socket
 * <socket>.workers: it accepts a connection only from a uid that may have one,
 * reads whole messages and hands them to pyworkers.c (through the struct
 * pyw_conn_ops it gave pyw_listen()), queues the answers when the socket is
 * full, and closes. Everything runs on the loop thread; connections are
 * non-blocking.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/sockpath.h"
#include "pyw-private.h"
#include "pyworkers.h"

/* --- sending ------------------------------------------------------------ */

static void on_conn_event(uv_poll_t *p, int status, int events);

static void conn_poll(struct pyw_conn *c)
{
	if (!c->closing)
		uv_poll_start(&c->poll, UV_READABLE | (c->out_len ? UV_WRITABLE : 0), on_conn_event);
}

static int conn_flush(struct pyw_conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		if (n < 0)
			return -errno;
		c->out_off += (size_t)n;
	}
	if (c->out_off == c->out_len)
		c->out_off = c->out_len = 0;
	if (c->want_write != (c->out_len != 0)) {
		c->want_write = c->out_len != 0;
		conn_poll(c);
	}
	return 0;
}

/* Queue one message (@a then @b as its payload) and send what the socket takes. */
int pyw_conn_send(struct pyw_conn *c, uint16_t type, const void *a, size_t alen, const void *b,
		     size_t blen)
{
	struct pyw_hdr h = { .magic = PYW_MAGIC, .type = type, .len = (uint32_t)(alen + blen) };
	size_t need = c->out_len + sizeof(h) + alen + blen;

	if (c->closing)
		return -EPIPE;
	if (need > c->out_cap) {
		size_t cap = c->out_cap ? c->out_cap : 4096;
		uint8_t *p;
		while (cap < need)
			cap *= 2;
		if (!(p = realloc(c->out, cap)))
			return -ENOMEM;
		c->out = p;
		c->out_cap = cap;
	}
	memcpy(c->out + c->out_len, &h, sizeof(h));
	if (alen)
		memcpy(c->out + c->out_len + sizeof(h), a, alen);
	if (blen)
		memcpy(c->out + c->out_len + sizeof(h) + alen, b, blen);
	c->out_len = need;
	return conn_flush(c);
}

void pyw_conn_refuse(struct pyw_conn *c, int status, const char *fmt, ...)
{
	char msg[512];
	int32_t st = status;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (log_limit_pass(&c->srv->lim_bad, uv_now(c->srv->loop)))
		log_warn("python workers: pid %d (uid %u): %s", (int)c->pid, (unsigned)c->uid, msg);
	pyw_conn_send(c, PYW_ERROR, &st, sizeof(st), msg, strlen(msg));
	pyw_conn_close(c);
}

static void conn_read(struct pyw_conn *c)
{
	for (;;) {
		ssize_t n;
		size_t off = 0;

		if (c->in_cap - c->in_len < 65536) {
			size_t cap = c->in_cap ? c->in_cap * 2 : 65536;
			uint8_t *q;
			if (cap > PYW_MAX_PAYLOAD + sizeof(struct pyw_hdr) + 65536) {
				pyw_conn_refuse(c, -EMSGSIZE, "message over %u bytes", PYW_MAX_PAYLOAD);
				return;
			}
			if (!(q = realloc(c->in, cap))) {
				pyw_conn_close(c);
				return;
			}
			c->in = q;
			c->in_cap = cap;
		}
		n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n <= 0) {
			pyw_conn_close(c);
			return;
		}
		c->in_len += (size_t)n;
		while (c->in_len - off >= sizeof(struct pyw_hdr)) {
			struct pyw_hdr h;
			memcpy(&h, c->in + off, sizeof(h));
			if (h.magic != PYW_MAGIC || h.flags) {
				pyw_conn_refuse(c, -EPROTO, "malformed message (magic %08x)", h.magic);
				return;
			}
			if (h.len > PYW_MAX_PAYLOAD) {
				pyw_conn_refuse(c, -EMSGSIZE, "message of %u bytes, the most is %u", h.len,
					    PYW_MAX_PAYLOAD);
				return;
			}
			if (c->in_len - off < sizeof(h) + h.len)
				break;
			if (!c->srv->ops->message(c, &h, c->in + off + sizeof(h)))
				return;
			off += sizeof(h) + h.len;
		}
		memmove(c->in, c->in + off, c->in_len - off);
		c->in_len -= off;
	}
}

static void on_conn_event(uv_poll_t *p, int status, int events)
{
	struct pyw_conn *c = p->data;

	if (status < 0) {
		pyw_conn_close(c);
		return;
	}
	if ((events & UV_WRITABLE) && conn_flush(c) < 0) {
		pyw_conn_close(c);
		return;
	}
	if (events & UV_READABLE)
		conn_read(c);
}

static void on_hello_timeout(uv_timer_t *t)
{
	struct pyw_conn *c = t->data;

	pyw_conn_refuse(c, -ETIMEDOUT, "no HELLO within %d ms", HELLO_TIMEOUT_MS);
}

/* --- closing ------------------------------------------------------------ */

static void srv_maybe_free(struct pyw_server *srv)
{
	if (srv->closing && !srv->pending_closes && !srv->conns)
		free(srv);
}

static void on_conn_closed(uv_handle_t *h)
{
	struct pyw_conn *c = h->data;
	struct pyw_server *srv = c->srv;

	if (--c->closing > 0)
		return;
	close(c->fd);
	for (struct pyw_conn **pc = &srv->conns; *pc; pc = &(*pc)->next)
		if (*pc == c) {
			*pc = c->next;
			break;
		}
	srv->nconns--;
	free(c->in);
	free(c->idx);
	free(c->out);
	free(c);
	srv_maybe_free(srv);
}

void pyw_conn_close(struct pyw_conn *c)
{
	struct pyw_pipeline *pp = c->pp;

	if (c->closing)
		return;
	c->closing = 2;
	c->pp = NULL;
	uv_poll_stop(&c->poll);
	uv_close((uv_handle_t *)&c->poll, on_conn_closed);
	uv_close((uv_handle_t *)&c->timer, on_conn_closed);
	if (!pp || c->srv->closing)
		return;
	if (c->role == PYW_ROLE_WORKER)
		c->srv->ops->worker_gone(pp, c);
	else if (c->role == PYW_ROLE_HOST && pp->host == c)
		c->srv->ops->host_gone(pp, c);
}

/* --- accepting ---------------------------------------------------------- */

static unsigned conns_of(const struct pyw_server *srv, uid_t uid)
{
	unsigned n = 0;

	for (struct pyw_conn *c = srv->conns; c; c = c->next)
		if (c->uid == uid && !c->closing)
			n++;
	return n;
}

static void refuse(struct pyw_server *srv, int fd, const struct ucred *cred, const char *why)
{
	uint64_t now = uv_now(srv->loop);

	srv->refused++;
	if (now - srv->refused_logged_ms >= REFUSAL_LOG_MS || !srv->refused_logged_ms) {
		log_warn("python workers: refusing a connection of uid %u (pid %d): %s (%" PRIu64
			 " refused so far)", (unsigned)cred->uid, (int)cred->pid, why, srv->refused);
		srv->refused_logged_ms = now ? now : 1;
	}
	close(fd);
}

static void on_accept(uv_poll_t *p, int status, int events)
{
	struct pyw_server *srv = p->data;

	(void)events;
	if (status < 0)
		return;
	for (;;) {
		int fd = accept4(srv->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct ucred cred = { .pid = 0, .uid = (uid_t)-1 };
		socklen_t clen = sizeof(cred);
		struct pyw_conn *c;
		int pr;

		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("python workers: accept: %s", strerror(errno));
			return;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
			refuse(srv, fd, &cred, "no peer credentials");
			continue;
		}
		if (srv->nconns >= MAX_CONNS) {
			refuse(srv, fd, &cred, "too many connections");
			continue;
		}
		if (conns_of(srv, cred.uid) >= MAX_CONNS_PER_UID) {
			refuse(srv, fd, &cred, "too many connections of that uid");
			continue;
		}
		if (!(c = calloc(1, sizeof(*c)))) {
			refuse(srv, fd, &cred, "out of memory");
			continue;
		}
		if ((pr = uv_poll_init(srv->loop, &c->poll, fd)) < 0) {
			free(c);
			refuse(srv, fd, &cred, uv_strerror(pr));
			continue;
		}
		c->srv = srv;
		c->fd = fd;
		c->uid = cred.uid;
		c->pid = cred.pid;
		uv_timer_init(srv->loop, &c->timer); /* libuv's cannot fail: it returns 0 */
		c->poll.data = c->timer.data = c;
		c->next = srv->conns;
		srv->conns = c;
		srv->nconns++;
		uv_poll_start(&c->poll, UV_READABLE, on_conn_event);
		uv_timer_start(&c->timer, on_hello_timeout, HELLO_TIMEOUT_MS, 0);
	}
}

int pyw_listen(struct pyw_server **out, uv_loop_t *loop, struct engine *eng, const char *path,
	       unsigned mode, int gid, const struct pyw_conn_ops *ops, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct pyw_server *srv;
	int r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return errfmt(-ENAMETOOLONG, err, errlen, "%s: socket path too long", path);
	r = sock_claim_path(path, NULL, err, errlen);
	if (r < 0)
		return r;
	if (!(srv = calloc(1, sizeof(*srv))))
		return errfmt(-ENOMEM, err, errlen, "cannot listen on %s: out of memory", path);
	srv->loop = loop;
	srv->eng = eng;
	srv->ops = ops;
	snprintf(srv->path, sizeof(srv->path), "%s", path);
	strcpy(sa.sun_path, srv->path);
	srv->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (srv->fd < 0 || bind(srv->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto fail;
	if (chmod(srv->path, mode) < 0 || (gid >= 0 && chown(srv->path, (uid_t)-1, (gid_t)gid) < 0) ||
	    listen(srv->fd, 128) < 0) {
		r = -errno;
		unlink(srv->path);
		errno = -r;
		goto fail;
	}
	if ((r = uv_poll_init(loop, &srv->poll, srv->fd)) < 0) {
		unlink(srv->path);
		errno = -r;
		goto fail;
	}
	srv->poll.data = srv;
	uv_poll_start(&srv->poll, UV_READABLE, on_accept);
	eng->pyw = srv;
	*out = srv;
	return 0;

fail:
	r = errfmt(-errno, err, errlen, "cannot listen on %s: %s", path, strerror(errno));
	if (srv->fd >= 0)
		close(srv->fd);
	free(srv);
	return r;
}

static void on_listener_closed(uv_handle_t *h)
{
	struct pyw_server *srv = h->data;

	close(srv->fd);
	srv->pending_closes--;
	srv_maybe_free(srv);
}

void pyw_server_close(struct pyw_server *srv)
{
	if (!srv)
		return;
	srv->closing = true;
	if (srv->eng && srv->eng->pyw == srv)
		srv->eng->pyw = NULL;
	unlink(srv->path);
	/* the pipelines keep their tasks: engine_free() frees them with the jobs */
	for (struct pyw_conn *c = srv->conns; c; c = c->next) {
		if (c->pp) {
			if (c->pp->host == c)
				c->pp->host = NULL;
			for (struct pyw_conn **pc = &c->pp->workers; *pc; pc = &(*pc)->pnext)
				if (*pc == c) {
					*pc = c->pnext;
					break;
				}
			for (struct ptask *t = c->pp->tasks; t; t = t->next)
				if (t->on == c)
					t->on = NULL;
		}
		pyw_conn_close(c);
	}
	srv->pending_closes++;
	uv_poll_stop(&srv->poll);
	uv_close((uv_handle_t *)&srv->poll, on_listener_closed);
}
