/* SPDX-License-Identifier: MIT */
/* metrics - the Prometheus /metrics endpoint (settings key metrics_address)
 *
 * libmicrohttpd serves HTTP, in its "external polling" mode with epoll: it has
 * no thread of its own, the loop watches its one epoll fd (uv_poll) and calls
 * MHD_run() when it is readable or when MHD's timeout is due (uv_timer). The
 * request handler therefore runs on the loop, the thread that owns the engine,
 * and reads the same status the Status request returns, with no lock and no
 * hand-off. A scrape costs one status walk; the text is built in memory.
 *
 * The listening socket is ours (bound here, handed over with
 * MHD_OPTION_LISTEN_SOCKET): so one code path serves IPv4, IPv6 and unix
 * sockets, and a port in use is our error message, not MHD's log line.
 *
 * Built without libmicrohttpd (meson -Dmetrics=disabled, or auto without it)
 * the key is refused at load, saying so.
 */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "base/sockpath.h"
#include "base/log.h"
#include "metrics.h"

#if HAVE_MICROHTTPD
#include <microhttpd.h>
#endif

#define METRICS_CONN_LIMIT 32      /* scrapers at once; more are refused by MHD */
#define METRICS_CONN_TIMEOUT_S 10  /* an idle keep-alive connection is closed */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
/* A scrape whose text took at least this long to build is served again,
 * as it is, for METRICS_REUSE_FACTOR times that long: however often
 * scrapers ask, building the text takes at most about 1/factor of the loop
 * (a status of thousands of attachments takes tens of ms). Small statuses
 * are built afresh at every scrape. */
#define METRICS_REUSE_MIN_NS 5000000ull
#define METRICS_REUSE_FACTOR 10

#if HAVE_MICROHTTPD
struct metrics {
	uv_loop_t *loop;
	struct MHD_Daemon *mhd;
	uv_poll_t poll;           /* MHD's epoll fd */
	uv_timer_t timer;         /* MHD's next timeout */
	int fd;                   /* the listening socket, MHD's once it started */
	struct metrics_addr addr;
	char name[300];           /* the address as the log and errors say it */
	metrics_status_fn status;
	void *userdata;
	char *last;               /* the last text, while it is reused */
	size_t last_len;
	uint64_t last_until_ns;   /* uv_hrtime() until which it is */
	int pending_closes;
};
#endif

static int addr_fail(const char *text, char *err, size_t errlen, const char *why)
{
	return errfmt(-EINVAL, err, errlen, "\"%s\": %s; want HOST:PORT (\"127.0.0.1:9464\", "
	              "\"[::1]:9464\", \"localhost:9464\") or an absolute unix socket path", text, why);
}

int metrics_parse_address(const char *text, struct metrics_addr *out, char *err, size_t errlen)
{
	struct metrics_addr a = { 0 };
	const char *colon, *host, *port;
	size_t hostlen;
	char *end;
	long n;

#if !HAVE_MICROHTTPD
	return errfmt(-ENOTSUP, err, errlen, "this loaderd was built without libmicrohttpd, "
	              "so without /metrics (meson -Dmetrics=enabled)");
#endif
	if (text[0] == '/') {
		/* the path and ".new" (listen_unix()) fit in sun_path */
		if (strlen(text) + 4 >= sizeof(a.path))
			return addr_fail(text, err, errlen, "socket path too long (most 103 bytes)");
		a.is_unix = true;
		snprintf(a.path, sizeof(a.path), "%s", text);
		*out = a;
		return 0;
	}
	if (text[0] == '[') {
		/* [IPv6]:PORT */
		const char *close = strchr(text, ']');
		if (!close || close[1] != ':')
			return addr_fail(text, err, errlen, "an IPv6 address needs the form [ADDR]:PORT");
		host = text + 1;
		hostlen = (size_t)(close - host);
		port = close + 2;
	} else {
		colon = strrchr(text, ':');
		if (!colon)
			return addr_fail(text, err, errlen, "no port");
		if (memchr(text, ':', (size_t)(colon - text)))
			return addr_fail(text, err, errlen, "an IPv6 address goes in brackets");
		host = text;
		hostlen = (size_t)(colon - text);
		port = colon + 1;
	}
	if (hostlen == 0)
		return addr_fail(text, err, errlen, "no host (for every address say 0.0.0.0 or [::])");
	if (hostlen >= sizeof(a.host))
		return addr_fail(text, err, errlen, "host name too long");
	errno = 0;
	n = strtol(port, &end, 10);
	if (!*port || *end || errno || strspn(port, "0123456789") != strlen(port) || n < 1 || n > 65535)
		return addr_fail(text, err, errlen, "the port must be a number in 1..65535");
	memcpy(a.host, host, hostlen);
	snprintf(a.port, sizeof(a.port), "%ld", n);
	*out = a;
	return 0;
}

/* @a as the log and the errors say it: the path, HOST:PORT or [ADDR]:PORT. */
static void addr_name(const struct metrics_addr *a, char *buf, size_t len)
{
	if (a->is_unix)
		snprintf(buf, len, "%s", a->path);
	else if (strchr(a->host, ':'))
		snprintf(buf, len, "[%s]:%s", a->host, a->port);
	else
		snprintf(buf, len, "%s:%s", a->host, a->port);
}

int metrics_resolve_address(const struct metrics_addr *a, char *err, size_t errlen)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
	struct addrinfo *res = NULL;
	char name[300], why[300];
	int r;

	if (a->is_unix)
		return 0;
	r = getaddrinfo(a->host, a->port, &hints, &res);
	if (r == 0) {
		freeaddrinfo(res);
		return 0;
	}
	addr_name(a, name, sizeof(name));
	snprintf(why, sizeof(why), "host %s: %s", a->host, gai_strerror(r));
	return addr_fail(name, err, errlen, why);
}

const char *metrics_version(void)
{
#if HAVE_MICROHTTPD
	return MHD_get_version();
#else
	return NULL;
#endif
}

#if HAVE_MICROHTTPD
/* A TCP listening socket on the first of @a's addresses that binds. */
static int listen_tcp(struct metrics *m, char *err, size_t errlen)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | AI_PASSIVE };
	struct addrinfo *res = NULL, *ai;
	int r, fd = -1, e = EADDRNOTAVAIL, one = 1;

	r = getaddrinfo(m->addr.host, m->addr.port, &hints, &res);
	if (r != 0)
		return errfmt(-EADDRNOTAVAIL, err, errlen, "metrics_address %s: host %s: %s", m->name,
		              m->addr.host, gai_strerror(r));
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			e = errno;
			continue;
		}
		/* a restart rebinds at once; [::] means IPv6 only, as written */
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (ai->ai_family == AF_INET6)
			setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0)
			break;
		e = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return errfmt(-e, err, errlen, "metrics_address %s: cannot listen: %s%s", m->name, strerror(e),
		              /* what systemd's RestrictAddressFamilies= answers */
		              e == EAFNOSUPPORT ? " (loaderd.service allows unix sockets only: "
		              "use a socket path, or see docs/metrics.md)" : "");
	m->fd = fd;
	return 0;
}

/* A unix listening socket at @a's path, with the control socket's mode and
 * group, set under a temporary name before it is renamed to the path (so
 * nobody ever finds it open wider); a stale socket file is replaced, a live
 * one is an error. */
static int listen_unix(struct metrics *m, unsigned mode, int gid, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char why[512];
	int r, fd;

	if ((r = sock_claim_path(m->addr.path, NULL, why, sizeof(why))) < 0)
		return errfmt(r, err, errlen, "metrics_address %s: %s", m->name, why);
	if (snprintf(sa.sun_path, sizeof(sa.sun_path), "%s.new", m->addr.path) >= (int)sizeof(sa.sun_path))
		return errfmt(-ENAMETOOLONG, err, errlen, "metrics_address %s: socket path too long "
		              "(most %zu bytes)", m->name, sizeof(sa.sun_path) - 5);
	unlink(sa.sun_path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		goto fail;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto fail_fd;
	if (chmod(sa.sun_path, mode) < 0 || (gid >= 0 && chown(sa.sun_path, (uid_t)-1, (gid_t)gid) < 0) ||
	    listen(fd, 64) < 0 || rename(sa.sun_path, m->addr.path) < 0) {
		r = errno;
		unlink(sa.sun_path);
		errno = r;
		goto fail_fd;
	}
	m->fd = fd;
	return 0;
fail_fd:
	r = errno;
	close(fd);
	errno = r;
fail:
	r = errno;
	return errfmt(-r, err, errlen, "metrics_address %s: cannot listen: %s", m->name, strerror(r));
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned code, char *body, size_t len,
                               const char *type, const char *allow)
{
	struct MHD_Response *rsp;
	enum MHD_Result ret;

	rsp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!rsp) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(rsp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	if (allow)
		MHD_add_response_header(rsp, MHD_HTTP_HEADER_ALLOW, allow);
	ret = MHD_queue_response(conn, code, rsp);
	MHD_destroy_response(rsp);
	return ret;
}

static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned code, const char *msg,
                                    const char *allow)
{
	char *body = strdup(msg);

	if (!body)
		return MHD_NO;
	return respond(conn, code, body, strlen(body), "text/plain; charset=utf-8", allow);
}

/* Keep a copy of @text for reuse if it took long to build (METRICS_REUSE_*). */
static void keep_if_costly(struct metrics *m, const char *text, size_t len, uint64_t start)
{
	uint64_t now = uv_hrtime(), took = now - start;

	free(m->last);
	m->last = NULL;
	if (took < METRICS_REUSE_MIN_NS || !(m->last = malloc(len ? len : 1)))
		return;
	memcpy(m->last, text, len);
	m->last_len = len;
	m->last_until_ns = now + METRICS_REUSE_FACTOR * took;
	log_debug("metrics: the text took %" PRIu64 " ms to build: served as it is for %" PRIu64 " ms",
	          took / 1000000, METRICS_REUSE_FACTOR * took / 1000000);
}

/* Every request, on the loop (MHD_run() runs from on_poll/on_timer). */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
	struct metrics *m = cls;
	json_t *status;
	uint64_t start;
	char *text;
	size_t len;

	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
		return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
		                    "method not allowed: /metrics is read with GET\n", "GET, HEAD");
	if (strcmp(url, "/metrics") != 0)
		return respond_text(conn, MHD_HTTP_NOT_FOUND, "not found: loaderd serves only /metrics\n",
		                    NULL);
	if (!m->status)
		return respond_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "loaderd is starting\n", NULL);
	start = uv_hrtime();
	if (m->last && start < m->last_until_ns) {
		text = malloc(m->last_len ? m->last_len : 1);
		if (!text)
			return respond_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n", NULL);
		memcpy(text, m->last, m->last_len);
		return respond(conn, MHD_HTTP_OK, text, m->last_len, METRICS_CONTENT_TYPE, NULL);
	}
	status = m->status(m->userdata);
	text = status ? metrics_text(status, &len) : NULL;
	json_decref(status);
	if (!text)
		return respond_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n", NULL);
	keep_if_costly(m, text, len, start);
	return respond(conn, MHD_HTTP_OK, text, len, METRICS_CONTENT_TYPE, NULL);
}

/* MHD's own complaints (a malformed request, a refused connection). */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	char line[512];
	size_t n;

	vsnprintf(line, sizeof(line), fmt, ap);
	n = strlen(line);
	while (n && line[n - 1] == '\n')
		line[--n] = '\0';
	log_debug("metrics: %s", line);
}

static void on_timer(uv_timer_t *t);

/* Let MHD do what is due, then wait no longer than it asks. */
static void mhd_step(struct metrics *m)
{
	MHD_UNSIGNED_LONG_LONG ms;

	MHD_run(m->mhd);
	if (MHD_get_timeout(m->mhd, &ms) == MHD_YES)
		uv_timer_start(&m->timer, on_timer, (uint64_t)ms, 0);
	else
		uv_timer_stop(&m->timer);
}

static void on_timer(uv_timer_t *t)
{
	mhd_step(t->data);
}

static void on_poll(uv_poll_t *p, int status, int events)
{
	mhd_step(p->data);
}

int metrics_new(struct metrics **out, uv_loop_t *loop, const struct metrics_addr *addr,
                unsigned mode, int gid, char *err, size_t errlen)
{
	const union MHD_DaemonInfo *info;
	struct metrics *m;
	int r;

	if (!(m = calloc(1, sizeof(*m))))
		return errfmt(-ENOMEM, err, errlen, "metrics_address: out of memory");
	m->loop = loop;
	m->addr = *addr;
	m->fd = -1;
	addr_name(addr, m->name, sizeof(m->name));
	r = addr->is_unix ? listen_unix(m, mode, gid, err, errlen) : listen_tcp(m, err, errlen);
	if (r < 0) {
		free(m);
		return r;
	}
	/* no MHD_USE_INTERNAL_POLLING_THREAD: external polling, from the loop */
	/* the logger first, or MHD prints what comes before it to stderr */
	m->mhd = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, m,
		MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, m,
		MHD_OPTION_LISTEN_SOCKET, (MHD_socket)m->fd,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)METRICS_CONN_LIMIT,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_CONN_TIMEOUT_S,
		MHD_OPTION_END);
	info = m->mhd ? MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
	if (!info) {
		if (m->mhd)
			MHD_stop_daemon(m->mhd);
		else
			close(m->fd);
		if (addr->is_unix)
			unlink(addr->path);
		r = errfmt(-EIO, err, errlen, "metrics_address %s: libmicrohttpd did not start", m->name);
		free(m);
		return r;
	}
	if ((r = uv_poll_init(loop, &m->poll, info->epoll_fd)) < 0) {
		MHD_stop_daemon(m->mhd);
		if (addr->is_unix)
			unlink(addr->path);
		r = errfmt(r, err, errlen, "metrics_address %s: %s", m->name, uv_strerror(r));
		free(m);
		return r;
	}
	uv_timer_init(loop, &m->timer); /* libuv's cannot fail: it returns 0 */
	m->poll.data = m->timer.data = m;
	uv_poll_start(&m->poll, UV_READABLE, on_poll);
	log_notice("metrics on http://%s/metrics", m->name);
	*out = m;
	return 0;
}

void metrics_set_source(struct metrics *m, metrics_status_fn status, void *userdata)
{
	if (!m)
		return;
	m->status = status;
	m->userdata = userdata;
}

static void on_closed(uv_handle_t *h)
{
	struct metrics *m = h->data;

	if (--m->pending_closes)
		return;
	/* the epoll fd is no longer polled: MHD may close it, and the socket */
	MHD_stop_daemon(m->mhd);
	if (m->addr.is_unix)
		unlink(m->addr.path);
	free(m->last);
	free(m);
}

void metrics_close(struct metrics *m)
{
	if (!m)
		return;
	m->status = NULL;
	m->pending_closes = 2;
	uv_close((uv_handle_t *)&m->poll, on_closed);
	uv_close((uv_handle_t *)&m->timer, on_closed);
}
#else
int metrics_new(struct metrics **out, uv_loop_t *loop, const struct metrics_addr *addr,
                unsigned mode, int gid, char *err, size_t errlen)
{
	return errfmt(-ENOTSUP, err, errlen, "metrics_address: this loaderd was built without "
	              "libmicrohttpd");
}

void metrics_set_source(struct metrics *m, metrics_status_fn status, void *userdata)
{
}

void metrics_close(struct metrics *m)
{
}
#endif
