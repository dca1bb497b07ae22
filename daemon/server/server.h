/* SPDX-License-Identifier: MIT */
/* server - the nng REP endpoint, client sessions and request dispatch
 *
 * The server layer: the socket, the sessions, the requests (handlers.c,
 * admin.c), the fd channel, /metrics and the nng workarounds. It speaks the
 * wire (proto/) and turns each request into calls of the engine, which it
 * sees through engine.h alone; it parses a spec (sources/spec.h) and checks a
 * CUDA device (gpu/cudadev.h) before it asks the engine, and uses base/.
 * Nothing below calls it: the engine answers a parked request through the
 * engine_ops callbacks the server gave it, and the process (main.c,
 * reload.c) reaches it through this header and gives it the reload as a
 * callback (server_set_reload()).
 *
 * layer: daemon/server -> daemon/engine daemon/sources daemon/gpu daemon/base common include
 */
#pragma once

#include <stdbool.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct engine;
struct server;

struct server_config {
	const char *socket_path;
	unsigned workers;
	uint64_t memory_limit;
	unsigned socket_mode;     /* both sockets' mode (0: 0660) */
	int socket_gid;           /* chown both sockets to this group, -1: leave it */
	int admin_gid;            /* its members are admins (besides root and us), -1: none */
	unsigned max_conn_per_uid; /* connections one uid may hold (0: the default) */
	uint64_t max_held_after_drop; /* slab bytes of dropped pipelines one uid may hold
	                               * mapped and still attach (0: memory_limit / 4) */
	uint64_t memory_limit_per_user; /* one non-admin uid's (0: memory_limit / 2) */
	unsigned max_pipelines_per_user; /* one non-admin uid's (0: the default) */
};

/**
 * server_new() - listen on the socket and the fd channel, ready to serve.
 * @err: why not, e.g. "another loaderd is listening on /run/loaderd/loaderd.sock"
 *
 * A stale socket file (nobody accepts on it) is replaced; a live one is an
 * error (-EADDRINUSE). On failure @err always says what failed, and the
 * handles already put on @loop are being closed: run @loop (it returns at
 * once) before uv_loop_close(); the server is freed in their callbacks.
 */
int server_new(struct server **out, uv_loop_t *loop, const struct server_config *cfg,
               char *err, size_t errlen);
struct engine *server_engine(struct server *srv);
/* Reload: the admin group (-1: none) and the per-uid connection quota (0: the
 * default) for the connections and requests from now on. */
void server_set_access(struct server *srv, int admin_gid, unsigned max_conn_per_uid);
/*
 * The daemon's reload (reload.c), run for an admin's Reload request: @who
 * names the asker for the log. @done runs once on the loop, maybe before
 * this returns: r 0 with @report (a JSON object, @done's) saying what
 * changed, or a negative errno with @err saying why nothing did. A reload
 * opens its new pipelines' files off the loop: meanwhile everyone is served.
 */
typedef void (*server_reload_done)(void *ctx, int r, json_t *report, const char *err);
typedef void (*server_reload_fn)(void *userdata, const char *who, server_reload_done done,
                                 void *ctx);
void server_set_reload(struct server *srv, server_reload_fn fn, void *userdata);
/* Tell clients, stop listening, free everything, remove the sockets; @done
 * runs on the loop once all of it is finished. */
void server_stop(struct server *srv, void (*done)(void *), void *userdata);
/* True once nng was left holding memory we cannot free (a wedged listener was
 * replaced): the process then ends with _exit() and no leak report. */
bool server_nng_leaked(void);
/* The Status reply (docs/protocol.md) as an admin sees it, every client in
 * it; for /metrics (metrics.c). On the loop; the caller owns the reference. */
struct json_t *server_status_json(struct server *srv);
