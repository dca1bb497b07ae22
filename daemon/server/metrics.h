/* SPDX-License-Identifier: MIT */
/* metrics - the Prometheus /metrics endpoint (settings key metrics_address) */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

/* Where /metrics listens: an absolute unix socket path, or a host and a port. */
struct metrics_addr {
	bool is_unix;
	char path[108];           /* is_unix: the socket's path */
	char host[256];           /* else: a name or an address, no brackets */
	char port[6];             /* "1".."65535" */
};

/**
 * metrics_parse_address() - "127.0.0.1:9464", "[::1]:9464", "localhost:9464"
 * or "/run/loaderd/metrics.sock" into @out.
 * @err: what is wrong with @text, e.g. "port 70000 is not in 1..65535"
 *
 * The syntax only: it runs at every reload, on the loop, where a slow resolver
 * would stall the daemon (and the key needs a restart anyway). A host name is
 * resolved by metrics_new() at start, and by metrics_resolve_address().
 * Return: 0, or -EINVAL with @err set.
 */
int metrics_parse_address(const char *text, struct metrics_addr *out, char *err, size_t errlen);

/**
 * metrics_resolve_address() - whether @a's host resolves (getaddrinfo; it may
 * block): `loaderd --check-config`'s check, off the loop.
 * @err: e.g. "\"nohost.invalid:9464\": host nohost.invalid: Name or service
 *       not known; want HOST:PORT ..."
 * Return: 0 (a unix socket always), or -EINVAL with @err set.
 */
int metrics_resolve_address(const struct metrics_addr *a, char *err, size_t errlen);

/* The Status reply as an admin sees it (server_status_json()); the caller
 * owns the reference. Called on the loop, once per scrape. */
typedef json_t *(*metrics_status_fn)(void *userdata);

struct metrics;

/* libmicrohttpd's version, NULL when built without it (no /metrics). */
const char *metrics_version(void);

/**
 * metrics_new() - listen on @addr and serve GET /metrics from the loop.
 * @mode, @gid: a unix socket's mode and group (-1: leave it), as the control
 *              socket's
 * @err: why not, e.g. "metrics_address 127.0.0.1:9464: cannot listen: Address
 *       already in use"
 *
 * The HTTP server (libmicrohttpd) runs without threads of its own: the loop
 * polls its epoll fd and runs it, so a scrape reads the engine on the thread
 * that owns it. Until metrics_set_source() a scrape is answered 503.
 */
int metrics_new(struct metrics **out, uv_loop_t *loop, const struct metrics_addr *addr,
                unsigned mode, int gid, char *err, size_t errlen);
void metrics_set_source(struct metrics *m, metrics_status_fn status, void *userdata);
/* Stop listening, remove a unix socket, free @m once its handles are closed
 * (run the loop); NULL is fine. */
void metrics_close(struct metrics *m);

/**
 * metrics_text() - the Prometheus text exposition (format 0.0.4) of @status,
 * the Status JSON; docs/metrics.md lists every family.
 * Return: a malloc()ed string (its length in @len), or NULL without memory.
 */
char *metrics_text(json_t *status, size_t *len);
