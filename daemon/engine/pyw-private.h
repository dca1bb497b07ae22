/* SPDX-License-Identifier: MIT */
/* pyw-private - what pyworkers.c and pyw-conn.c share: tasks, pipelines, connections
 *
 * pyworkers.c is the tasks and the pipelines' side (queueing a job's tasks,
 * the messages of a connection once it said HELLO, a worker or host that
 * goes); pyw-conn.c is the socket's side (listening, accepting, a
 * connection's bytes in and out, closing). pyworkers.c calls pyw-conn.c;
 * pyw-conn.c answers back only through the struct pyw_conn_ops it was given.
 */
#pragma once

#include "engine-private.h"
#include "pyw-wire.h"

#define HELLO_TIMEOUT_MS 5000
#define MAX_CONNS 4096
#define MAX_CONNS_PER_UID (PYW_MAX_WORKERS + 16)
#define TASKS_PER_WORKER 2        /* in flight at once: one built while the next waits */
#define REFUSAL_LOG_MS 1000

struct pyw_conn;

struct ptask {
	struct ptask *next;    /* in pp->tasks */
	struct job *job;
	uint32_t t;               /* job->tasks[t] */
	uint64_t id;
	uint64_t order;           /* dispatch order: a task sent again goes first */
	struct pyw_conn *on;      /* the worker building it, NULL while queued */
	uint64_t sent;            /* when it was sent to it (pp->send_ctr): a worker
	                           * builds its tasks in that order */
	unsigned deaths;          /* workers that died building it */
	bool awaiting_exit;       /* failed with its last worker, whose end (the host's
	                           * WORKER_EXIT for worker dead_wid) names the signal */
	uint32_t dead_wid;
};

/* pl->py */
struct pyw_pipeline {
	struct pipeline *pl;
	struct pyw_conn *host;
	struct pyw_conn *workers;     /* pnext list */
	unsigned nworkers;            /* connected */
	unsigned nworkers_want;       /* the host's HELLO */
	pid_t host_pid;
	bool mapped;                  /* sealed: attachments may come */
	bool host_gone;
	struct ptask *tasks;       /* queued and in flight */
	uint64_t task_ctr, order_ctr, send_ctr;
	uint64_t samples_built, tasks_resent, worker_exits;
	char last_exit[160];          /* the host's last WORKER_EXIT, as words */
	uint32_t last_exit_wid;       /* and its worker id */
	uint32_t last_exit_pid;
	uv_timer_t *start_timer;
};

struct pyw_conn {
	struct pyw_conn *next;        /* in srv->conns */
	struct pyw_conn *pnext;       /* in pp->workers */
	struct pyw_server *srv;
	struct pyw_pipeline *pp;      /* after HELLO */
	uv_poll_t poll;
	uv_timer_t timer;
	int fd;
	uid_t uid;
	pid_t pid;
	int role;
	uint32_t worker_id;
	unsigned inflight;
	uint64_t busy_since;      /* mono ns: it began its first task in flight, or the last one ended */
	uint64_t *idx;            /* a TASK's sample indices (send_task) */
	uint32_t idx_cap;
	int closing;              /* handles still to close, 0 while open */
	bool want_write;
	uint8_t *in;
	size_t in_len, in_cap;
	uint8_t *out;
	size_t out_off, out_len, out_cap;
};

/* What a connection tells the pipelines' side: pyworkers.c hands these to
 * pyw_listen(), and pyw-conn.c reaches pyworkers.c through them alone (the
 * socket's side lies below the tasks' side). */
struct pyw_conn_ops {
	/* One whole message @h, payload @p, from @c: false when @c was closed. */
	bool (*message)(struct pyw_conn *c, const struct pyw_hdr *h, const uint8_t *p);
	/* @c, a worker or the host of @pp, closed */
	void (*worker_gone)(struct pyw_pipeline *pp, struct pyw_conn *c);
	void (*host_gone)(struct pyw_pipeline *pp, struct pyw_conn *c);
};

struct pyw_server {
	uv_loop_t *loop;
	struct engine *eng;
	const struct pyw_conn_ops *ops;
	uv_poll_t poll;
	int fd;
	char path[108];
	struct pyw_conn *conns;
	unsigned nconns;
	int pending_closes;
	bool closing;
	uint64_t refused, refused_logged_ms;
	struct log_limit lim_bad;
};

/* pyw-conn.c */
/* Listen on @path (pyw_server_new(), engine.h), telling each connection's
 * messages and end through @ops. */
int pyw_listen(struct pyw_server **out, uv_loop_t *loop, struct engine *eng, const char *path,
	       unsigned mode, int gid, const struct pyw_conn_ops *ops, char *err, size_t errlen);
/* Queue a message of @type (@a and @b its payload) and send what the socket
 * takes: 0, or a negative errno (the connection is then to close). */
int pyw_conn_send(struct pyw_conn *c, uint16_t type, const void *a, size_t alen, const void *b,
		  size_t blen);
/* ERROR, sent at once if the socket takes it, then close. */
void pyw_conn_refuse(struct pyw_conn *c, int status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Close @c; a worker's or host's going is told to its pipeline (pyworkers.c). */
void pyw_conn_close(struct pyw_conn *c);
