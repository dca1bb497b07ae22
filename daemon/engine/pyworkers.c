/* SPDX-License-Identifier: MIT */
/* pyworkers - a python pipeline's worker processes and their tasks (pyworkers.h)
 *
 * Whose code runs as whom: the host and the workers are processes of the
 * pipeline's owner, started by the owner's trainer from a fresh interpreter,
 * never by the daemon (which has neither the user's environment nor any
 * business running the user's code). A connection is accepted only from the
 * owner's uid (SO_PEERCRED), for a pipeline of kind python; the slab's
 * read-write descriptor goes once, to the first host, which maps it; then the
 * slab is sealed (F_SEAL_FUTURE_WRITE) and only the host's mapping, inherited
 * by the workers it forks, can write it. Attachments wait for that: before
 * the seal a client could map the slab writable through /proc.
 *
 * Everything here runs on the loop thread. Connections are non-blocking; the
 * daemon's answers are queued when the socket is full. A peer that sends
 * something malformed is told so (ERROR) and closed; for a worker that is
 * the same as dying: its tasks go to the others.
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
#include "engine-private.h"
#include "pyw-wire.h"
#include "pyworkers.h"

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

struct pyw_server {
	uv_loop_t *loop;
	struct engine *eng;
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

static void conn_close(struct pyw_conn *c);
static void dispatch(struct pyw_pipeline *pp);

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
static int conn_send(struct pyw_conn *c, uint16_t type, const void *a, size_t alen, const void *b,
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

/* ERROR, sent at once if the socket takes it, then close. */
static void conn_refuse(struct pyw_conn *c, int status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void conn_refuse(struct pyw_conn *c, int status, const char *fmt, ...)
{
	char msg[512];
	int32_t st = status;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (log_limit_pass(&c->srv->lim_bad, uv_now(c->srv->loop)))
		log_warn("python workers: pid %d (uid %u): %s", (int)c->pid, (unsigned)c->uid, msg);
	conn_send(c, PYW_ERROR, &st, sizeof(st), msg, strlen(msg));
	conn_close(c);
}

/* --- tasks -------------------------------------------------------------- */

static void task_unlink(struct pyw_pipeline *pp, struct ptask *t)
{
	for (struct ptask **pt = &pp->tasks; *pt; pt = &(*pt)->next)
		if (*pt == t) {
			*pt = t->next;
			return;
		}
}

/* A task of @job is over (done, failed or cancelled): the batch is ready, or
 * failed, when the last one is. May free the pipeline (job_done). */
static void job_task_over(struct job *job)
{
	if (atomic_fetch_sub(&job->remaining, 1) == 1)
		job_done(job);
}

/* A task of @job on worker @c ended: its time since the worker began it
 * (tasks in flight on one worker run one after the other) is the pipeline's
 * worker time; the Python code's stages are not told apart, so it counts as
 * transform (docs/operations.md). */
static void worker_time(struct pyw_conn *c, struct job *job)
{
	uint64_t now = mono_ns();

	atomic_fetch_add_explicit(&job->worker_ns, now - c->busy_since, memory_order_relaxed);
	atomic_fetch_add_explicit(&job->stage_ns[STAGE_TRANSFORM], now - c->busy_since,
	                          memory_order_relaxed);
	c->busy_since = now;
}

static int send_task(struct pyw_conn *w, struct ptask *t)
{
	struct job *job = t->job;
	struct pipeline *pl = job->pl;
	const struct task *tk = &job->tasks[t->t];
	uint32_t nrows = tk->end - tk->begin;
	struct pyw_task m = { .task_id = t->id, .epoch = job->epoch,
		.slot = (uint32_t)((uint64_t)(job->base - pl->slab->base) / pl->slot_bytes),
		.row0 = tk->begin, .nrows = nrows };
	uint64_t *idx;

	/* one TASK per batch and worker: the indices go in the worker's own
	 * buffer, grown once, not in a fresh allocation per task */
	if (nrows > w->idx_cap) {
		uint64_t *n = realloc(w->idx, (size_t)nrows * sizeof(*n));
		if (!n)
			return -ENOMEM;
		w->idx = n;
		w->idx_cap = nrows;
	}
	idx = w->idx;
	for (uint32_t k = 0; k < nrows; k++)
		idx[k] = job_sample(job, tk->begin + k);
	return conn_send(w, PYW_TASK, &m, sizeof(m), idx, (size_t)nrows * sizeof(*idx));
}

static void dispatch(struct pyw_pipeline *pp)
{
	for (;;) {
		struct ptask *best = NULL;
		struct pyw_conn *w = NULL;

		for (struct pyw_conn *c = pp->workers; c; c = c->pnext)
			if (!c->closing && c->inflight < TASKS_PER_WORKER && (!w || c->inflight < w->inflight))
				w = c;
		if (!w)
			return;
		for (struct ptask *t = pp->tasks; t; t = t->next)
			if (!t->on && !t->awaiting_exit && (!best || t->order < best->order))
				best = t;
		if (!best)
			return;
		best->on = w;
		best->sent = ++pp->send_ctr;
		if (w->inflight++ == 0)
			w->busy_since = mono_ns();
		if (send_task(w, best) < 0) {
			conn_close(w); /* its tasks go back to the queue */
			continue;
		}
	}
}

void pyw_submit(struct job *job)
{
	struct pyw_pipeline *pp = job->pl->py;

	for (uint32_t i = 0; i < job->ntasks; i++) {
		struct ptask *t = calloc(1, sizeof(*t));
		if (!t) {
			job_set_error(job, ENOMEM, "python workers: out of memory for a task");
			job_task_over(job);
			continue;
		}
		t->job = job;
		t->t = i;
		t->id = ++pp->task_ctr;
		t->order = ++pp->order_ctr;
		t->next = pp->tasks;
		pp->tasks = t;
	}
	dispatch(pp);
}

static struct ptask *task_by_id(struct pyw_pipeline *pp, struct pyw_conn *w, uint64_t id)
{
	for (struct ptask *t = pp->tasks; t; t = t->next)
		if (t->id == id && t->on == w)
			return t;
	return NULL;
}

/* --- messages ----------------------------------------------------------- */

static struct pyw_pipeline *find_pipeline(struct pyw_conn *c, const struct pyw_hello *h)
{
	char name[sizeof(h->pipeline) + 1];
	struct pipeline *pl;

	memcpy(name, h->pipeline, sizeof(h->pipeline));
	name[sizeof(h->pipeline)] = '\0';
	pl = engine_find(c->srv->eng, name);
	if (!pl || pl->dropped) {
		conn_refuse(c, -ENOENT, "no pipeline named '%s'", name);
		return NULL;
	}
	if (!pl->py) {
		conn_refuse(c, -EINVAL, "pipeline '%s' is not a python pipeline", name);
		return NULL;
	}
	if (c->uid != pl->owner) {
		conn_refuse(c, -EPERM, "pipeline '%s' belongs to uid %u: only its owner's processes "
			    "build its batches", name, (unsigned)pl->owner);
		return NULL;
	}
	if (pl->failed) {
		conn_refuse(c, -EIO, "pipeline '%s' failed: %s", name, pl->error);
		return NULL;
	}
	return pl->py;
}

static void welcome(struct pyw_conn *c, struct pyw_pipeline *pp, bool with_fd)
{
	struct pipeline *pl = pp->pl;
	struct pyw_welcome w = { .nfields = (uint32_t)pl->nfields, .slab_size = pl->slab->size,
		.slot_bytes = pl->slot_bytes, .nslots = pl->nslots, .batch_size = pl->spec->batch_size,
		.nsamples = source_nsamples(pl->src), .seed = pl->spec->seed,
		.on_error = pl->spec->on_error_fail ? 0 : 1, .nworkers = pp->nworkers_want };
	struct pyw_field f[SOURCE_MAX_FIELDS];
	uint8_t buf[sizeof(struct pyw_hdr) + sizeof(w) + sizeof(f)];
	struct pyw_hdr h = { .magic = PYW_MAGIC, .type = PYW_WELCOME,
		.len = (uint32_t)(sizeof(w) + pl->nfields * sizeof(f[0])) };
	size_t len = sizeof(h) + h.len;
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	ssize_t n;
	int fd, r;

	for (size_t i = 0; i < pl->nfields; i++)
		f[i] = (struct pyw_field){ pl->field_off[i], pl->fields[i].sample_bytes };
	memcpy(buf, &h, sizeof(h));
	memcpy(buf + sizeof(h), &w, sizeof(w));
	memcpy(buf + sizeof(h) + sizeof(w), f, pl->nfields * sizeof(f[0]));
	if (!with_fd) {
		if (conn_send(c, PYW_WELCOME, buf + sizeof(h), h.len, NULL, 0) < 0)
			conn_close(c);
		return;
	}
	/* the host's own description of the slab, with a hold (holds.c): a
	 * host that keeps it after the drop keeps it in the budget, counted
	 * against its uid; the pid is the kernel's, not the HELLO's */
	if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		log_warn("python workers: pipeline %s: no peer credentials: %s", pl->spec->name,
			 strerror(errno));
		conn_close(c);
		return;
	}
	if ((r = holds_hand_out_rw(pl, cred.pid, cred.uid, &fd)) < 0) {
		log_warn("python workers: pipeline %s: cannot hand the slab to its host (pid %d): %s",
			 pl->spec->name, (int)cred.pid, strerror(-r));
		conn_close(c);
		return;
	}
	/* the first message on the connection: the socket takes it whole */
	msg.msg_control = cbuf;
	msg.msg_controllen = sizeof(cbuf);
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	do
		n = sendmsg(c->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	r = errno;
	close(fd);
	errno = r;
	if (n != (ssize_t)len) {
		log_warn("python workers: pipeline %s: cannot send the slab to its host (pid %d): %s",
			 pl->spec->name, (int)c->pid, n < 0 ? strerror(errno) : "short send");
		conn_close(c);
	}
}

static void on_hello(struct pyw_conn *c, const uint8_t *p, size_t len)
{
	struct pyw_hello h;
	struct pyw_pipeline *pp;

	if (c->role) {
		conn_refuse(c, -EPROTO, "a second HELLO");
		return;
	}
	if (len != sizeof(h)) {
		conn_refuse(c, -EPROTO, "HELLO of %zu bytes, expected %zu", len, sizeof(h));
		return;
	}
	memcpy(&h, p, sizeof(h));
	if (h.version != PYW_VERSION) {
		conn_refuse(c, -EPROTO, "protocol version %u, this daemon speaks %u: the loaderd "
			    "Python package and the daemon differ", h.version, PYW_VERSION);
		return;
	}
	if (h.role != PYW_ROLE_HOST && h.role != PYW_ROLE_WORKER) {
		conn_refuse(c, -EPROTO, "unknown role %u", h.role);
		return;
	}
	if (!(pp = find_pipeline(c, &h)))
		return;
	uv_timer_stop(&c->timer);
	/* c->pid is the kernel's (SO_PEERCRED); the HELLO's is the sender's word,
	 * another in another pid namespace: noted, never used */
	if ((pid_t)h.pid != c->pid)
		log_debug("python workers: pipeline %s: pid %d says it is pid %u in its HELLO",
			  pp->pl->spec->name, (int)c->pid, h.pid);
	if (h.role == PYW_ROLE_HOST) {
		if (pp->host || pp->mapped || pp->host_gone) {
			conn_refuse(c, -EBUSY, "pipeline '%s' has had its worker host already (pid %d): "
				    "its slab is sealed, no other process can write it",
				    pp->pl->spec->name, (int)pp->host_pid);
			return;
		}
		if (h.nworkers < 1 || h.nworkers > PYW_MAX_WORKERS) {
			conn_refuse(c, -EINVAL, "nworkers %u: must be in 1..%d", h.nworkers, PYW_MAX_WORKERS);
			return;
		}
		c->role = PYW_ROLE_HOST;
		c->pp = pp;
		pp->host = c;
		pp->host_pid = c->pid;
		pp->nworkers_want = h.nworkers;
		log_info("pipeline %s: Python worker host pid %d connected, %u workers",
			 pp->pl->spec->name, (int)c->pid, h.nworkers);
		welcome(c, pp, true);
		return;
	}
	if (!pp->mapped || !pp->host) {
		conn_refuse(c, -EAGAIN, "pipeline '%s' has no worker host: workers come from the host "
			    "after its READY", pp->pl->spec->name);
		return;
	}
	if (h.worker_id >= pp->nworkers_want) {
		conn_refuse(c, -EINVAL, "worker_id %u: the host runs %u workers", h.worker_id,
			    pp->nworkers_want);
		return;
	}
	c->role = PYW_ROLE_WORKER;
	c->worker_id = h.worker_id;
	c->pp = pp;
	c->pnext = pp->workers;
	pp->workers = c;
	pp->nworkers++;
	log_debug("pipeline %s: Python worker %u pid %d connected", pp->pl->spec->name, h.worker_id,
		  (int)c->pid);
	welcome(c, pp, false);
	if (!c->closing)
		dispatch(pp);
}

static void on_mapped(struct pyw_conn *c)
{
	struct pyw_pipeline *pp = c->pp;
	int r;

	if (c->role != PYW_ROLE_HOST || pp->mapped) {
		conn_refuse(c, -EPROTO, "MAPPED from a worker, or twice");
		return;
	}
	r = slab_seal(pp->pl->slab);
	if (r < 0) {
		char msg[256];
		snprintf(msg, sizeof(msg), "cannot seal the slab: %s", strerror(-r));
		conn_refuse(c, r, "%s", msg);
		pipeline_fail(pp->pl, -r, msg);
		return;
	}
	pp->mapped = true;
	if (pp->start_timer)
		uv_timer_stop(pp->start_timer);
	conn_send(c, PYW_READY, NULL, 0, NULL, 0);
	log_info("pipeline %s: slab sealed, its Python workers start", pp->pl->spec->name);
}

static void describe_exit(char *buf, size_t n, const struct pyw_worker_exit *e)
{
	int st = e->wstatus;

	if ((st & 0x7f) == 0)
		snprintf(buf, n, "worker %u (pid %u) exited with status %d", e->worker_id, e->pid,
			 (st >> 8) & 0xff);
	else
		snprintf(buf, n, "worker %u (pid %u) was killed by signal %d (%s)", e->worker_id, e->pid,
			 st & 0x7f, strsignal(st & 0x7f));
}

/* @t failed on its PYW_MAX_DEATHS-th worker, which ended as @how says: its
 * error in torch's words ("DataLoader worker (pid(s) N) exited
 * unexpectedly"), then ours. Its job is the caller's to end. */
static void task_died(struct ptask *t, uint32_t pid, const char *how)
{
	const struct task *tk = &t->job->tasks[t->t];
	char msg[512];

	snprintf(msg, sizeof(msg), "DataLoader worker (pid(s) %u) exited unexpectedly: Python %s "
		 "building batch %" PRIu64 " of epoch %" PRIu64 " (rows %u..%u), the %u%s worker to die "
		 "on it", pid, how, t->job->index, t->job->epoch, tk->begin, tk->end - 1, t->deaths,
		 t->deaths == 1 ? "st" : t->deaths == 2 ? "nd" : t->deaths == 3 ? "rd" : "th");
	job_set_error(t->job, ECHILD, msg);
}

static void on_worker_exit(struct pyw_conn *c, const uint8_t *p, size_t len)
{
	struct pyw_worker_exit e;
	struct pyw_pipeline *pp = c->pp;

	if (c->role != PYW_ROLE_HOST || len != sizeof(e)) {
		conn_refuse(c, -EPROTO, "malformed WORKER_EXIT");
		return;
	}
	memcpy(&e, p, sizeof(e));
	if (e.worker_id >= pp->nworkers_want) {
		if (log_limit_pass(&c->srv->lim_bad, uv_now(c->srv->loop)))
			log_warn("pipeline %s: its Python worker host (pid %d, uid %u) says worker %u "
				 "exited; it runs %u: ignored", pp->pl->spec->name, (int)c->pid,
				 (unsigned)c->uid, e.worker_id, pp->nworkers_want);
		return;
	}
	pp->worker_exits++;
	describe_exit(pp->last_exit, sizeof(pp->last_exit), &e);
	pp->last_exit_wid = e.worker_id;
	pp->last_exit_pid = e.pid;
	log_warn("pipeline %s: Python %s; the host starts another", pp->pl->spec->name, pp->last_exit);
	/* the task that worker died on for the last time fails now, in its words */
	for (struct ptask **pt = &pp->tasks; *pt; pt = &(*pt)->next) {
		struct ptask *t = *pt;
		if (t->awaiting_exit && t->dead_wid == e.worker_id) {
			struct job *job = t->job;
			task_died(t, e.pid, pp->last_exit);
			*pt = t->next;
			free(t);
			job_task_over(job); /* may free the pipeline: the last thing done */
			return;
		}
	}
}

static void on_done(struct pyw_conn *c, const uint8_t *p, size_t len)
{
	struct pyw_pipeline *pp = c->pp;
	struct pyw_done d;
	struct ptask *t;
	struct job *job;
	uint32_t rows;

	if (c->role != PYW_ROLE_WORKER || len != sizeof(d)) {
		conn_refuse(c, -EPROTO, "malformed DONE");
		return;
	}
	memcpy(&d, p, sizeof(d));
	if (!(t = task_by_id(pp, c, d.task_id))) {
		conn_refuse(c, -EPROTO, "DONE for task %" PRIu64 ", which it does not build", d.task_id);
		return;
	}
	rows = t->job->tasks[t->t].end - t->job->tasks[t->t].begin;
	if (d.skipped > rows) {
		/* its task goes to another worker (conn_close) */
		conn_refuse(c, -EPROTO, "pipeline '%s': DONE for task %" PRIu64 " skipped %" PRIu64
			    " samples, more than its %u rows", pp->pl->spec->name, d.task_id, d.skipped,
			    rows);
		return;
	}
	job = t->job;
	task_unlink(pp, t);
	worker_time(c, job);
	c->inflight--;
	pp->samples_built += job->tasks[t->t].end - job->tasks[t->t].begin;
	if (d.skipped)
		source_add_skipped(pp->pl->src, d.skipped);
	free(t);
	dispatch(pp);
	job_task_over(job);
}

static void on_fail(struct pyw_conn *c, const uint8_t *p, size_t len)
{
	struct pyw_pipeline *pp = c->pp;
	struct pyw_fail f;
	struct ptask *t;
	struct job *job;
	char msg[PYW_MSG_MAX + 1];
	size_t mlen;

	if (c->role != PYW_ROLE_WORKER || len < sizeof(f) || len - sizeof(f) > PYW_MSG_MAX) {
		conn_refuse(c, -EPROTO, "malformed FAIL");
		return;
	}
	memcpy(&f, p, sizeof(f));
	if (!(t = task_by_id(pp, c, f.task_id))) {
		conn_refuse(c, -EPROTO, "FAIL for task %" PRIu64 ", which it does not build", f.task_id);
		return;
	}
	if (f.index >= source_nsamples(pp->pl->src)) {
		conn_refuse(c, -EPROTO, "pipeline '%s': FAIL for task %" PRIu64 " names sample %" PRIu64
			    ", the source has %" PRIu64, pp->pl->spec->name, f.task_id, f.index,
			    (uint64_t)source_nsamples(pp->pl->src));
		return;
	}
	mlen = len - sizeof(f);
	memcpy(msg, p + sizeof(f), mlen);
	msg[mlen] = '\0';
	for (size_t i = 0; i < mlen; i++)
		if (msg[i] == '\0')
			msg[i] = ' ';
	job = t->job;
	task_unlink(pp, t);
	worker_time(c, job);
	c->inflight--;
	free(t);
	log_warn("pipeline %s: sample %" PRIu64 " failed in Python worker %u (pid %d): %.200s",
		 pp->pl->spec->name, f.index, c->worker_id, (int)c->pid, msg);
	job_set_error(job, f.status < 0 && f.status > -4096 ? -f.status : EINVAL,
		      mlen ? msg : "a Python worker failed (no message)");
	dispatch(pp);
	job_task_over(job);
}

/* One whole message in c->in; false when the connection was closed. */
static bool on_message(struct pyw_conn *c, const struct pyw_hdr *h, const uint8_t *p)
{
	if (!c->role && h->type != PYW_HELLO) {
		conn_refuse(c, -EPROTO, "message %u before HELLO", h->type);
		return false;
	}
	switch (h->type) {
	case PYW_HELLO:
		on_hello(c, p, h->len);
		break;
	case PYW_MAPPED:
		on_mapped(c);
		break;
	case PYW_WORKER_EXIT:
		on_worker_exit(c, p, h->len);
		break;
	case PYW_DONE:
		on_done(c, p, h->len);
		break;
	case PYW_FAIL:
		on_fail(c, p, h->len);
		break;
	default:
		conn_refuse(c, -EPROTO, "unknown message type %u", h->type);
		break;
	}
	return !c->closing;
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
				conn_refuse(c, -EMSGSIZE, "message over %u bytes", PYW_MAX_PAYLOAD);
				return;
			}
			if (!(q = realloc(c->in, cap))) {
				conn_close(c);
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
			conn_close(c);
			return;
		}
		c->in_len += (size_t)n;
		while (c->in_len - off >= sizeof(struct pyw_hdr)) {
			struct pyw_hdr h;
			memcpy(&h, c->in + off, sizeof(h));
			if (h.magic != PYW_MAGIC || h.flags) {
				conn_refuse(c, -EPROTO, "malformed message (magic %08x)", h.magic);
				return;
			}
			if (h.len > PYW_MAX_PAYLOAD) {
				conn_refuse(c, -EMSGSIZE, "message of %u bytes, the most is %u", h.len,
					    PYW_MAX_PAYLOAD);
				return;
			}
			if (c->in_len - off < sizeof(h) + h.len)
				break;
			if (!on_message(c, &h, c->in + off + sizeof(h)))
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
		conn_close(c);
		return;
	}
	if ((events & UV_WRITABLE) && conn_flush(c) < 0) {
		conn_close(c);
		return;
	}
	if (events & UV_READABLE)
		conn_read(c);
}

static void on_hello_timeout(uv_timer_t *t)
{
	struct pyw_conn *c = t->data;

	conn_refuse(c, -ETIMEDOUT, "no HELLO within %d ms", HELLO_TIMEOUT_MS);
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

/* A worker's connection went: its tasks go back to the queue. The one it was
 * building (the first sent) counts a death, and fails after PYW_MAX_DEATHS:
 * once the host said how the worker ended (on_worker_exit()), so that the
 * error names its signal. A job that fails is ended last, as ending one may
 * free the pipeline. */
static void worker_gone(struct pyw_pipeline *pp, struct pyw_conn *c)
{
	struct ptask *running = NULL;
	struct job *over = NULL;

	for (struct pyw_conn **pc = &pp->workers; *pc; pc = &(*pc)->pnext)
		if (*pc == c) {
			*pc = c->pnext;
			pp->nworkers--;
			break;
		}
	for (struct ptask *t = pp->tasks; t; t = t->next)
		if (t->on == c && (!running || t->sent < running->sent))
			running = t;
	for (struct ptask **pt = &pp->tasks; *pt;) {
		struct ptask *t = *pt;
		if (t->on != c) {
			pt = &t->next;
			continue;
		}
		t->on = NULL;
		t->order = 0;             /* first again */
		pp->tasks_resent++;
		if (t != running || ++t->deaths < PYW_MAX_DEATHS) {
			pt = &t->next;
			continue;
		}
		if (pp->last_exit_wid != c->worker_id || pp->last_exit_pid != (uint32_t)c->pid) {
			/* its WORKER_EXIT is still to come */
			t->awaiting_exit = true;
			t->dead_wid = c->worker_id;
			pt = &t->next;
			continue;
		}
		task_died(t, pp->last_exit_pid, pp->last_exit);
		over = t->job;
		*pt = t->next;
		free(t);
	}
	if (!pp->pl->dropped)
		dispatch(pp);
	if (over)
		job_task_over(over);
}

static void host_gone(struct pyw_pipeline *pp, struct pyw_conn *c)
{
	char msg[320];

	(void)c;
	pp->host = NULL;
	pp->host_gone = true;
	if (pp->pl->dropped)
		return;
	snprintf(msg, sizeof(msg), "its Python worker host (pid %d) exited: no other process can "
		 "write its sealed slab; drop it and create it again", (int)pp->host_pid);
	/* the workers die with the host (PR_SET_PDEATHSIG); close them here too */
	while (pp->workers)
		conn_close(pp->workers);
	pipeline_fail(pp->pl, EIO, msg);
}

static void conn_close(struct pyw_conn *c)
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
		worker_gone(pp, c);
	else if (c->role == PYW_ROLE_HOST && pp->host == c)
		host_gone(pp, c);
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

int pyw_server_new(struct pyw_server **out, uv_loop_t *loop, struct engine *eng, const char *path,
		   unsigned mode, int gid, char *err, size_t errlen)
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
		conn_close(c);
	}
	srv->pending_closes++;
	uv_poll_stop(&srv->poll);
	uv_close((uv_handle_t *)&srv->poll, on_listener_closed);
}

/* --- pipelines ---------------------------------------------------------- */

static void on_start_timer_closed(uv_handle_t *h)
{
	free(h);
}

static void on_start_timeout(uv_timer_t *t)
{
	struct pyw_pipeline *pp = t->data;
	char msg[320];

	if (pp->mapped || pp->pl->failed || pp->pl->dropped)
		return;
	snprintf(msg, sizeof(msg), "no Python worker host %s within %d s of the create: the trainer "
		 "that creates a python pipeline starts its workers (loaderd.DataLoader does)",
		 pp->host ? "mapped its slab" : "connected", PYW_START_MS / 1000);
	pipeline_fail(pp->pl, ETIMEDOUT, msg);
	if (pp->host)
		conn_close(pp->host);
}

int pyw_pipeline_new(struct pipeline *pl, char *err, size_t errlen)
{
	struct pyw_pipeline *pp = calloc(1, sizeof(*pp));

	if (!pp || !(pp->start_timer = calloc(1, sizeof(*pp->start_timer)))) {
		free(pp);
		return errfmt(-ENOMEM, err, errlen, "out of memory");
	}
	if (!pl->eng->pyw) {
		free(pp->start_timer);
		free(pp);
		return errfmt(-ENOTSUP, err, errlen, "this daemon has no Python workers socket: python "
			      "pipelines need the daemon's server (not an embedded engine)");
	}
	pp->pl = pl;
	uv_timer_init(pl->eng->loop, pp->start_timer);
	pp->start_timer->data = pp;
	uv_timer_start(pp->start_timer, on_start_timeout, PYW_START_MS, 0);
	pl->py = pp;
	return 0;
}

static void detach_conns(struct pyw_pipeline *pp)
{
	if (pp->start_timer) {
		uv_timer_stop(pp->start_timer);
		uv_close((uv_handle_t *)pp->start_timer, on_start_timer_closed);
		pp->start_timer = NULL;
	}
	while (pp->workers) {
		struct pyw_conn *w = pp->workers;
		pp->workers = w->pnext;
		w->pp = NULL;
		conn_close(w);
	}
	if (pp->host) {
		struct pyw_conn *h = pp->host;
		pp->host = NULL;
		h->pp = NULL;
		conn_close(h);
	}
	pp->nworkers = 0;
}

void pyw_pipeline_dropped(struct pipeline *pl)
{
	struct pyw_pipeline *pp = pl->py;
	struct ptask *tasks;

	if (!pp)
		return;
	detach_conns(pp);
	tasks = pp->tasks;
	pp->tasks = NULL;
	/* the last job ended may free the pipeline, and pp with it */
	while (tasks) {
		struct ptask *t = tasks;
		struct job *job = t->job;
		tasks = t->next;
		free(t);
		job_set_error(job, ECANCELED, "the pipeline was dropped");
		job_task_over(job);
	}
}

void pyw_pipeline_free(struct pipeline *pl)
{
	struct pyw_pipeline *pp = pl->py;

	if (!pp)
		return;
	detach_conns(pp);
	/* engine_free(): jobs still out end here, each freed once */
	while (pp->tasks) {
		struct ptask *t = pp->tasks;
		struct job *job = t->job;
		pp->tasks = t->next;
		free(t);
		if (atomic_fetch_sub(&job->remaining, 1) == 1)
			job_free(job);
	}
	free(pp);
	pl->py = NULL;
}

unsigned pyw_nworkers(const struct pipeline *pl)
{
	return pl->py && pl->py->nworkers_want ? pl->py->nworkers_want : 1;
}

bool pyw_ready(const struct pipeline *pl)
{
	return !pl->py || (pl->py->mapped && pl->py->host);
}

const char *pyw_state(const struct pipeline *pl)
{
	const struct pyw_pipeline *pp = pl->py;

	if (!pp)
		return "";
	if (pp->host_gone)
		return "host exited";
	if (!pp->host)
		return "waiting for its worker host";
	if (!pp->mapped)
		return "its worker host is mapping the slab";
	return "running";
}

json_t *pyw_status(const struct pipeline *pl)
{
	const struct pyw_pipeline *pp = pl->py;

	if (!pp)
		return json_null();
	return json_pack("{s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:s?}", "state", pyw_state(pl),
			 "host_pid", pp->host_pid ? json_integer(pp->host_pid) : json_null(),
			 "workers", (json_int_t)pp->nworkers,
			 "workers_wanted", (json_int_t)pp->nworkers_want,
			 "samples_built", (json_int_t)pp->samples_built,
			 "tasks_resent", (json_int_t)pp->tasks_resent,
			 "worker_exits", (json_int_t)pp->worker_exits,
			 "last_exit", pp->last_exit[0] ? pp->last_exit : NULL);
}
