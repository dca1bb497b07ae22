/* SPDX-License-Identifier: MIT */
/* server-private - what the server's files share: contexts, clients, the server */
#pragma once

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
#include "base/creds.h"
#include "gpu/cudadev.h"
#include "fdchan.h"
#include "nngclose.h"
#include "loader.pb-c.h"
#include "base/log.h"
#include "base/sockpath.h"
#include "engine/engine.h"
#include "server.h"
#include "sources/source.h"
#include "wedged.h"

#define RECV_TARGET 16
#define MAX_CLIENTS 512
#define MAX_ATTACH_PER_CLIENT 16
#define STOP_CUDA_WAITS 50        /* x 100 ms */
#define MAX_RELEASES 4096
#define MAX_MSG_BYTES LDR_MSG_MAX
#define STOP_FLUSH_MS 100
#define CLOSE_WAIT_MS 2000
#define PROBE_EVERY_MS 500
#define PROBE_WAIT_MS 2000
#define GHOST_LOG_MS 10000
#define PROBE_ADD_WAIT_MS 500      /* a probe's connection reaches the socket within this */
#define PROBE_GONE_MS 30000        /* a probe's connection is closed by then (the sweep) */
#define REFUSED_OPEN_MAX 64       /* refused connections kept open for their answer */
#define REFUSED_CLOSE_MS 1000     /* a refused connection still open is closed after this */
#define REFUSAL_BURST_MS 5000     /* refusals closer than this are one burst, one log line */
#define REFUSAL_UIDS 8

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
	struct creds creds;       /* uid, gid and groups of the peer at connect time */
	char name[64];
	bool hello;
	bool refused;             /* over a quota: its Hello gets the refusal, then it is closed */
	bool refused_all;         /* ... the global MAX_CLIENTS, not its uid's */
	uint32_t listener;        /* the nng listener it came through (heal_listener) */
	uint64_t since_ms;
	struct attachment *atts[MAX_ATTACH_PER_CLIENT];
	unsigned natts;
	unsigned gone_seen;       /* sweeps that found its process gone */
	struct log_limit malformed; /* its malformed requests (client_log_summary) */
	struct log_rate events;   /* its attaches and creates (client_event_pass) */
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
	struct pyw_server *pyw;   /* <socket>.workers, NULL when the path is too long */
	struct engine *engine;
	char path[108];
	unsigned sock_mode;       /* of both sockets (settings socket_mode) */
	int sock_gid;             /* -1: the daemon's group */
	int admin_gid;            /* settings admin_group, -1: none */
	unsigned max_conn_per_uid; /* settings max_connections_per_uid */
	server_reload_fn reload;  /* the daemon's reload (server_set_reload()), or NULL */
	void *reload_data;
	char fdpath[112];
	pthread_mutex_t lock;
	struct event *ev_head, *ev_tail;
	struct sctx *all;
	struct sctx *idle;
	atomic_uint nrecv;          /* contexts waiting for a request */
	atomic_bool closing;        /* nng callbacks must not start new work */
	unsigned nctx;
	struct client *clients;
	unsigned nclients;        /* every session, refused ones too */
	unsigned nrefused;        /* sessions refused, waiting for their close */
	uint64_t refused_total;   /* connections refused since the start */
	struct refusal_burst {    /* one log line per burst of refusals (session.c) */
		uid_t uid;            /* (uid_t)-1: the global MAX_CLIENTS */
		unsigned count;
		uint64_t first_ms, last_ms;
	} bursts[REFUSAL_UIDS];
	unsigned nbursts;
	uint64_t client_ctr;
	uint64_t started_ms;
	bool stopping;
	bool warned_pidns;        /* a client without a pid here was logged (session.c) */
	/* the listener watchdog, see probe_main() */
	pthread_t prober;
	bool prober_running;
	pthread_mutex_t probe_lock;
	pthread_cond_t probe_cond;
	bool probe_stop;
	unsigned heals;
	struct wedged wedged;     /* replaced listeners' fds, still nng's */
	struct old_listener {     /* replaced listeners, closed once no client uses them */
		nng_listener l;
		int fd;               /* its listening socket, -1: not found */
		unsigned gen;         /* it was bound to <path>.<gen> */
		uint64_t idle_ms;     /* since when no client used it (0: one does) */
		uint64_t closed_ms;   /* nng_listener_close()d then (0: not yet) */
	} old[WEDGED_MAX];
	unsigned nold;
	atomic_uint self_pipes;   /* connections from our own pid nng added (the probes) */
	atomic_uint rem_lost;     /* disconnects whose event could not be allocated (rpc.c) */
	unsigned rem_scans_idle;  /* sweeps since one of those was found */
	uv_timer_t drain_timer;
	uv_timer_t sweep_timer;
	uint64_t ghosts;          /* clients released by the sweep (nng never said closed) */
	uint64_t ghosts_unlogged; /* of them, not in the log yet */
	uint64_t probes_swept;    /* the watchdog's probe records the sweep freed */
	uint64_t last_rem_ms;     /* when nng last reported a connection closed */
	struct orphan { int fd; uint64_t ino; } *orphans; /* close_orphans(): seen once */
	unsigned norphans;
	uint64_t orphans_closed;  /* connection fds nng's wedged reaper would never close */
	uint64_t ghosts_logged_ms;
	void (*stop_done)(void *);
	void *stop_userdata;
	unsigned pending_closes;
};

/* rpc.c */
void push_event(struct server *srv, struct event *ev);
void on_pipe_event(nng_pipe p, nng_pipe_ev type, void *arg);
/* The memory of a pipe event (calloc). Weak: a test build replaces it with
 * one that fails (tests/integration-c/failevents.c), the only way to reach
 * that path. */
struct event *pipe_event_new(nng_pipe_ev type);
/* Free the clients whose disconnect was lost (on_pipe_event()); each sweep. */
void pipes_sweep_lost(struct server *srv);
void sctx_drop_msg(struct sctx *c);
void post_receivers(struct server *srv);
void sctx_idle(struct server *srv, struct sctx *c);
void send_reply(struct server *srv, struct sctx *c, const Loaderd__Reply *rep);
void reply_error(struct server *srv, struct sctx *c, int code, const char *msg);
void reply_ok(struct server *srv, struct sctx *c);
void reply_json(struct server *srv, struct sctx *c, json_t *obj);
void on_deliver(void *userdata, struct pending *p, const struct delivery *d);
/*
 * A request answered from a callback that may run before its handler returns
 * (a create, a reload: files opened off the loop). The handler, once it
 * started the work: reply_park() true: the answer came, free the context;
 * else @c waits, parked. The callback, after its reply: reply_unpark() true:
 * free the context now (the handler returned).
 */
bool reply_park(struct sctx *c, bool *parked, bool answered);
bool reply_unpark(bool parked, bool *answered);

/* session.c */
struct client *client_find(struct server *srv, uint32_t pipe);
struct client *client_get(struct server *srv, nng_pipe p);
void client_remove_att(struct client *cl, unsigned i);
void client_free(struct server *srv, struct client *cl);
/* The summary of @cl's malformed requests not logged one by one, if one is
 * due (log_limit_due()); @final: it goes away. */
void client_log_summary(struct server *srv, struct client *cl, bool final);
/* Whether to write one more event of @cl (its attaches, creates): at most
 * LOG_RATE_EVENTS per LOG_RATE_WINDOW_MS, then a summary (log.h). */
bool client_event_pass(struct server *srv, struct client *cl);
struct attachment *client_att(struct client *cl, uint64_t id, unsigned *index);
json_t *clients_json(struct server *srv, const struct client *self);
void sessions_tick(struct server *srv);
void client_refusal(const struct server *srv, const struct client *cl, char *buf, size_t len);
/* @cl as a principal (root, our user, admin_group: admin) */
void who_is(const struct server *srv, const struct client *cl, struct principal *p);

/* handlers.c */
void handle_request(struct server *srv, struct sctx *c, nng_msg *msg);
int fd_lookup(void *userdata, const uint8_t *token, uid_t uid, pid_t pid, int *fd, bool *fd_close,
              uint64_t *size, int *dev_fd, uint64_t *dev_size, int *ring_fd, int *ring_efd);

/* admin.c */
void handle_set(struct server *srv, struct sctx *c, struct client *cl, const Loaderd__Set *m);
void handle_reload(struct server *srv, struct sctx *c, struct client *cl);

/* nngfix.c: each workaround for the nng versions that need it (nngfix.c's top comment) */
#define NNG_VERSION_BELOW(maj, min, pat)                                                    \
	(NNG_MAJOR_VERSION < (maj) ||                                                         \
	 (NNG_MAJOR_VERSION == (maj) && (NNG_MINOR_VERSION < (min) ||                          \
	                                 (NNG_MINOR_VERSION == (min) && NNG_PATCH_VERSION < (pat)))))
/* nng issue #1518, an ipc listener that stops accepting: fixed in nng 1.6.0 */
#define NNGFIX_LISTENER_WEDGE NNG_VERSION_BELOW(1, 6, 0)
int socket_probe(const char *path);
int listener_start(struct server *srv, nng_listener *out, char *err, size_t errlen);
void *probe_main(void *arg);
#if NNGFIX_LISTENER_WEDGE
void heal_listener(struct server *srv);
#else
/* never asked for: the probe pushes no EV_HEAL where nng has the fix */
static inline void heal_listener(struct server *srv)
{
	(void)srv;
}
#endif
void on_sweep_timer(uv_timer_t *t);
