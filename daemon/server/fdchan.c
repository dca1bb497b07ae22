/* SPDX-License-Identifier: MIT */
/* fdchan - hands slab fds to clients over AF_UNIX with SCM_RIGHTS
 *
 * nng cannot pass file descriptors, so a client that attached fetches the
 * slab's fd here, once per attach, with the one-time token of its attach reply.
 * The peer's uid (SO_PEERCRED) must be the attaching client's. Connections are
 * non-blocking and polled by the loop; one that says nothing within a few
 * seconds is closed, so a stuck client cannot hold the loop or a descriptor.
 * One uid holds at most MAX_CONNS_PER_UID of the MAX_CONNS connections (root
 * and the daemon's own user aside), and when all are taken the uid holding
 * the most gives its oldest up to another uid's new one: idle connections of
 * one user cannot keep the others from their fds.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h"
#include "fdchan.h"
#include "base/log.h"
#include "base/sockpath.h"

#define CONN_TIMEOUT_MS 5000
#define MAX_CONNS 256
#define MAX_CONNS_PER_UID 32
#define REFUSAL_LOG_MS 1000       /* one warning a second about refusals */

struct conn {
	struct conn *next;
	struct fdchan *ch;
	uv_poll_t poll;
	uv_timer_t timer;
	int fd;
	uid_t uid;
	int closing;
	size_t got;
	struct fdchan_request req;
};

struct fdchan {
	uv_loop_t *loop;
	uv_poll_t poll;
	int fd;
	char path[108];
	fdchan_lookup_fn lookup;
	void *userdata;
	struct conn *conns;
	unsigned nconns;
	uint64_t refused, refused_logged_ms;
	/* warnings a peer provokes at will with requests, rate-limited
	 * (log.h): malformed requests, refused tokens (a silent peer costs a
	 * connection slot and CONN_TIMEOUT_MS: one line each) */
	struct log_limit lim_malformed, lim_refused;
	int pending_closes;
	int closing;
};

static void fdchan_maybe_free(struct fdchan *ch)
{
	if (ch->closing && ch->pending_closes == 0)
		free(ch);
}

static void on_conn_handle_closed(uv_handle_t *h)
{
	struct conn *c = h->data;
	struct fdchan *ch = c->ch;

	if (--c->closing == 0) {
		close(c->fd);
		free(c);
		ch->pending_closes--;
		fdchan_maybe_free(ch);
	}
}

static void conn_close(struct conn *c)
{
	struct fdchan *ch = c->ch;
	struct conn **pp;

	if (c->closing)
		return;
	for (pp = &ch->conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	ch->nconns--;
	ch->pending_closes++;
	c->closing = 2;
	uv_poll_stop(&c->poll);
	uv_timer_stop(&c->timer);
	uv_close((uv_handle_t *)&c->poll, on_conn_handle_closed);
	uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

static void conn_reply(struct conn *c, int status, int fd, uint64_t size, int dev_fd, uint64_t dev_size,
                       int ring_fd, int ring_efd)
{
	struct fdchan_reply rep = { .magic = FDCHAN_MAGIC, .status = status, .size = size };
	struct iovec iov = { .iov_base = &rep, .iov_len = sizeof(rep) };
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (status == 0) {
		int fds[4] = { fd };
		struct cmsghdr *cm;

		rep.nfds = 1;
		if (dev_fd >= 0)
			fds[rep.nfds++] = dev_fd;
		if (ring_fd >= 0 && ring_efd >= 0) {
			fds[rep.nfds++] = ring_fd;
			fds[rep.nfds++] = ring_efd;
			rep.ring_fds = 2;
		}
		rep.device_size = dev_fd >= 0 ? dev_size : 0;
		memset(&u, 0, sizeof(u));
		msg.msg_control = u.buf;
		msg.msg_controllen = CMSG_SPACE(rep.nfds * sizeof(int));
		cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(rep.nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, rep.nfds * sizeof(int));
	}
	/* a fresh socket buffer always takes these few bytes at once */
	if (sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		log_debug("fd channel: send failed: %s", strerror(errno));
}

/* Whether to write this occurrence of a warning a peer can repeat at will;
 * otherwise it is counted, and the count written once an interval. */
static bool warn_limited(struct fdchan *ch, struct log_limit *l, const char *what, bool final)
{
	uint64_t now = uv_now(ch->loop), span_ms = 0, n;

	if (!final && log_limit_pass(l, now))
		return true;
	n = log_limit_due(l, now, final, &span_ms);
	if (n)
		log_warn("fd channel: %" PRIu64 " more %s in %.1f s", n, what, (double)span_ms / 1000.0);
	return false;
}

static void on_conn_readable(uv_poll_t *p, int status, int events)
{
	struct conn *c = p->data;
	struct fdchan *ch = c->ch;
	struct ucred cred;
	socklen_t len = sizeof(cred);
	ssize_t n;
	int fd = -1, dev_fd = -1, ring_fd = -1, ring_efd = -1, r;
	bool fd_close = false;
	uint64_t size = 0, dev_size = 0;

	if (status < 0) {
		conn_close(c);
		return;
	}
	n = recv(c->fd, (char *)&c->req + c->got, sizeof(c->req) - c->got, MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		conn_close(c);
		return;
	}
	c->got += (size_t)n;
	if (c->got < sizeof(c->req))
		return;
	if (c->req.magic != FDCHAN_MAGIC || c->req.version != FDCHAN_VERSION) {
		if (warn_limited(c->ch, &c->ch->lim_malformed, "malformed requests", false))
			log_warn("fd channel: malformed request (magic %08x, version %u)", c->req.magic,
			         c->req.version);
		conn_reply(c, -EPROTO, -1, 0, -1, 0, -1, -1);
		conn_close(c);
		return;
	}
	if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		conn_reply(c, -errno, -1, 0, -1, 0, -1, -1);
		conn_close(c);
		return;
	}
	r = ch->lookup(ch->userdata, c->req.token, cred.uid, cred.pid, &fd, &fd_close, &size, &dev_fd,
	               &dev_size, &ring_fd, &ring_efd);
	if (r < 0 && warn_limited(c->ch, &c->ch->lim_refused, "refused tokens", false))
		log_warn("fd channel: pid %d: token refused: %s", (int)cred.pid, strerror(-r));
	conn_reply(c, r, fd, size, dev_fd, dev_size, ring_fd, ring_efd);
	if (r == 0 && fd_close)
		close(fd);
	conn_close(c);
}

static void on_conn_timeout(uv_timer_t *t)
{
	struct conn *c = t->data;

	log_warn("fd channel: peer sent no request within %d ms", CONN_TIMEOUT_MS);
	conn_close(c);
}

/* @uid's connections; *oldest receives the oldest (the list is newest first). */
static unsigned conns_of(const struct fdchan *ch, uid_t uid, struct conn **oldest)
{
	unsigned n = 0;

	for (struct conn *c = ch->conns; c; c = c->next)
		if (c->uid == uid) {
			n++;
			*oldest = c;
		}
	return n;
}

/* Channel full: the oldest connection of the uid that holds the most, if that
 * uid holds more than @uid does (@n). */
static struct conn *evictable(const struct fdchan *ch, uid_t uid, unsigned n)
{
	struct conn *best = NULL, *oldest = NULL;
	unsigned most = n + 1;

	for (struct conn *c = ch->conns; c; c = c->next) {
		unsigned k;
		if (c->uid == uid)
			continue;
		k = conns_of(ch, c->uid, &oldest);
		if (k > most) {
			most = k;
			best = oldest;
		}
	}
	return best;
}

static void refuse(struct fdchan *ch, int fd, const struct ucred *cred, const char *why)
{
	uint64_t now = uv_now(ch->loop);

	ch->refused++;
	if (now - ch->refused_logged_ms >= REFUSAL_LOG_MS || !ch->refused_logged_ms) {
		log_warn("fd channel: refusing a connection of uid %u (pid %d): %s (%" PRIu64
		         " refused so far)", (unsigned)cred->uid, (int)cred->pid, why, ch->refused);
		ch->refused_logged_ms = now ? now : 1;
	}
	close(fd);
}

static void on_accept(uv_poll_t *p, int status, int events)
{
	struct fdchan *ch = p->data;

	if (status < 0)
		return;
	for (;;) {
		int fd = accept4(ch->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct conn *c;
		int pr;

		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("fd channel: accept: %s", strerror(errno));
			return;
		}
		struct ucred cred = { .pid = 0, .uid = (uid_t)-1 };
		socklen_t clen = sizeof(cred);
		struct conn *mine = NULL, *victim;
		unsigned n;

		getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen);
		n = conns_of(ch, cred.uid, &mine);
		if (n >= MAX_CONNS_PER_UID && cred.uid != 0 && cred.uid != geteuid()) {
			refuse(ch, fd, &cred, "too many connections of that uid");
			continue;
		}
		if (ch->nconns >= MAX_CONNS) {
			if (!(victim = evictable(ch, cred.uid, n))) {
				refuse(ch, fd, &cred, "too many connections");
				continue;
			}
			log_debug("fd channel: closing an idle connection of uid %u for uid %u",
			          (unsigned)victim->uid, (unsigned)cred.uid);
			conn_close(victim);
		}
		if (!(c = calloc(1, sizeof(*c)))) {
			refuse(ch, fd, &cred, "out of memory");
			continue;
		}
		if ((pr = uv_poll_init(ch->loop, &c->poll, fd)) < 0) {
			free(c);
			refuse(ch, fd, &cred, uv_strerror(pr));
			continue;
		}
		c->ch = ch;
		c->fd = fd;
		c->uid = cred.uid;
		uv_timer_init(ch->loop, &c->timer); /* libuv's cannot fail: it returns 0 */
		c->poll.data = c->timer.data = c;
		c->next = ch->conns;
		ch->conns = c;
		ch->nconns++;
		uv_poll_start(&c->poll, UV_READABLE, on_conn_readable);
		uv_timer_start(&c->timer, on_conn_timeout, CONN_TIMEOUT_MS, 0);
	}
}

int fdchan_new(struct fdchan **out, uv_loop_t *loop, const char *path, unsigned mode, int gid,
               fdchan_lookup_fn lookup, void *userdata, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct fdchan *ch;
	int r;

	r = sock_claim_path(path, NULL, err, errlen);
	if (r < 0)
		return r;
	ch = calloc(1, sizeof(*ch));
	if (!ch)
		return errfmt(-ENOMEM, err, errlen, "cannot listen on %s: out of memory", path);
	ch->loop = loop;
	ch->lookup = lookup;
	ch->userdata = userdata;
	snprintf(ch->path, sizeof(ch->path), "%s", path);
	strcpy(sa.sun_path, ch->path);
	ch->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (ch->fd < 0)
		goto fail;
	if (bind(ch->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto fail;
	if (chmod(ch->path, mode) < 0 || (gid >= 0 && chown(ch->path, (uid_t)-1, (gid_t)gid) < 0) ||
	    listen(ch->fd, 128) < 0) {
		r = -errno;
		unlink(ch->path);
		errno = -r;
		goto fail;
	}
	if ((r = uv_poll_init(loop, &ch->poll, ch->fd)) < 0) {
		unlink(ch->path);
		errno = -r;
		goto fail;
	}
	ch->poll.data = ch;
	uv_poll_start(&ch->poll, UV_READABLE, on_accept);
	*out = ch;
	return 0;

fail:
	r = errfmt(-errno, err, errlen, "cannot listen on %s: %s", path, strerror(errno));
	if (ch->fd >= 0)
		close(ch->fd);
	free(ch);
	return r;
}

static void on_listener_closed(uv_handle_t *h)
{
	struct fdchan *ch = h->data;

	close(ch->fd);
	ch->pending_closes--;
	fdchan_maybe_free(ch);
}

void fdchan_close(struct fdchan *ch)
{
	if (!ch)
		return;
	ch->closing = 1;
	warn_limited(ch, &ch->lim_malformed, "malformed requests", true);
	warn_limited(ch, &ch->lim_refused, "refused tokens", true);
	unlink(ch->path);
	while (ch->conns)
		conn_close(ch->conns);
	ch->pending_closes++;
	uv_poll_stop(&ch->poll);
	uv_close((uv_handle_t *)&ch->poll, on_listener_closed);
}
