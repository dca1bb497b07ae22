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
 *
 * Here: the tasks, the messages of a connection, a worker or host that goes,
 * the pipelines' side; pyw-conn.c: the socket (listening, accepting, bytes
 * in and out, closing), around pyw-private.h.
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

#include "pyw-private.h"
#include "pyworkers.h"

static void dispatch(struct pyw_pipeline *pp);

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
 * failed, when the last one is. May free the pipeline (stream.c's job_done()). */
static void job_task_over(struct job *job)
{
	if (atomic_fetch_sub(&job->remaining, 1) == 1)
		job->eng->hooks->job_over(job);
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
	return pyw_conn_send(w, PYW_TASK, &m, sizeof(m), idx, (size_t)nrows * sizeof(*idx));
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
			pyw_conn_close(w); /* its tasks go back to the queue */
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
	pl = c->srv->eng->hooks->find(c->srv->eng, name);
	if (!pl || pl->dropped) {
		pyw_conn_refuse(c, -ENOENT, "no pipeline named '%s'", name);
		return NULL;
	}
	if (!pl->py) {
		pyw_conn_refuse(c, -EINVAL, "pipeline '%s' is not a python pipeline", name);
		return NULL;
	}
	if (c->uid != pl->owner) {
		pyw_conn_refuse(c, -EPERM, "pipeline '%s' belongs to uid %u: only its owner's processes "
			    "build its batches", name, (unsigned)pl->owner);
		return NULL;
	}
	if (pl->failed) {
		pyw_conn_refuse(c, -EIO, "pipeline '%s' failed: %s", name, pl->error);
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
		if (pyw_conn_send(c, PYW_WELCOME, buf + sizeof(h), h.len, NULL, 0) < 0)
			pyw_conn_close(c);
		return;
	}
	/* the host's own description of the slab, with a hold (holds.c): a
	 * host that keeps it after the drop keeps it in the budget, counted
	 * against its uid; the pid is the kernel's, not the HELLO's */
	if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		log_warn("python workers: pipeline %s: no peer credentials: %s", pl->spec->name,
			 strerror(errno));
		pyw_conn_close(c);
		return;
	}
	if ((r = holds_hand_out_rw(pl, cred.pid, cred.uid, &fd)) < 0) {
		log_warn("python workers: pipeline %s: cannot hand the slab to its host (pid %d): %s",
			 pl->spec->name, (int)cred.pid, strerror(-r));
		pyw_conn_close(c);
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
		pyw_conn_close(c);
	}
}

static void on_hello(struct pyw_conn *c, const uint8_t *p, size_t len)
{
	struct pyw_hello h;
	struct pyw_pipeline *pp;

	if (c->role) {
		pyw_conn_refuse(c, -EPROTO, "a second HELLO");
		return;
	}
	if (len != sizeof(h)) {
		pyw_conn_refuse(c, -EPROTO, "HELLO of %zu bytes, expected %zu", len, sizeof(h));
		return;
	}
	memcpy(&h, p, sizeof(h));
	if (h.version != PYW_VERSION) {
		pyw_conn_refuse(c, -EPROTO, "protocol version %u, this daemon speaks %u: the loaderd "
			    "Python package and the daemon differ", h.version, PYW_VERSION);
		return;
	}
	if (h.role != PYW_ROLE_HOST && h.role != PYW_ROLE_WORKER) {
		pyw_conn_refuse(c, -EPROTO, "unknown role %u", h.role);
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
			pyw_conn_refuse(c, -EBUSY, "pipeline '%s' has had its worker host already (pid %d): "
				    "its slab is sealed, no other process can write it",
				    pp->pl->spec->name, (int)pp->host_pid);
			return;
		}
		if (h.nworkers < 1 || h.nworkers > PYW_MAX_WORKERS) {
			pyw_conn_refuse(c, -EINVAL, "nworkers %u: must be in 1..%d", h.nworkers, PYW_MAX_WORKERS);
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
		pyw_conn_refuse(c, -EAGAIN, "pipeline '%s' has no worker host: workers come from the host "
			    "after its READY", pp->pl->spec->name);
		return;
	}
	if (h.worker_id >= pp->nworkers_want) {
		pyw_conn_refuse(c, -EINVAL, "worker_id %u: the host runs %u workers", h.worker_id,
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
		pyw_conn_refuse(c, -EPROTO, "MAPPED from a worker, or twice");
		return;
	}
	r = slab_seal(pp->pl->slab);
	if (r < 0) {
		char msg[256];
		snprintf(msg, sizeof(msg), "cannot seal the slab: %s", strerror(-r));
		pyw_conn_refuse(c, r, "%s", msg);
		pp->pl->eng->hooks->fail_pipeline(pp->pl, -r, msg);
		return;
	}
	pp->mapped = true;
	if (pp->start_timer)
		uv_timer_stop(pp->start_timer);
	pyw_conn_send(c, PYW_READY, NULL, 0, NULL, 0);
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
		pyw_conn_refuse(c, -EPROTO, "malformed WORKER_EXIT");
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
		pyw_conn_refuse(c, -EPROTO, "malformed DONE");
		return;
	}
	memcpy(&d, p, sizeof(d));
	if (!(t = task_by_id(pp, c, d.task_id))) {
		pyw_conn_refuse(c, -EPROTO, "DONE for task %" PRIu64 ", which it does not build", d.task_id);
		return;
	}
	rows = t->job->tasks[t->t].end - t->job->tasks[t->t].begin;
	if (d.skipped > rows) {
		/* its task goes to another worker (conn_close) */
		pyw_conn_refuse(c, -EPROTO, "pipeline '%s': DONE for task %" PRIu64 " skipped %" PRIu64
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
		pyw_conn_refuse(c, -EPROTO, "malformed FAIL");
		return;
	}
	memcpy(&f, p, sizeof(f));
	if (!(t = task_by_id(pp, c, f.task_id))) {
		pyw_conn_refuse(c, -EPROTO, "FAIL for task %" PRIu64 ", which it does not build", f.task_id);
		return;
	}
	if (f.index >= source_nsamples(pp->pl->src)) {
		pyw_conn_refuse(c, -EPROTO, "pipeline '%s': FAIL for task %" PRIu64 " names sample %" PRIu64
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
static bool pyw_on_message(struct pyw_conn *c, const struct pyw_hdr *h, const uint8_t *p)
{
	if (!c->role && h->type != PYW_HELLO) {
		pyw_conn_refuse(c, -EPROTO, "message %u before HELLO", h->type);
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
		pyw_conn_refuse(c, -EPROTO, "unknown message type %u", h->type);
		break;
	}
	return !c->closing;
}

/* A worker's connection went: its tasks go back to the queue. The one it was
 * building (the first sent) counts a death, and fails after PYW_MAX_DEATHS:
 * once the host said how the worker ended (on_worker_exit()), so that the
 * error names its signal. A job that fails is ended last, as ending one may
 * free the pipeline. */
static void pyw_worker_gone(struct pyw_pipeline *pp, struct pyw_conn *c)
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

static void pyw_host_gone(struct pyw_pipeline *pp, struct pyw_conn *c)
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
		pyw_conn_close(pp->workers);
	pp->pl->eng->hooks->fail_pipeline(pp->pl, EIO, msg);
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
	pp->pl->eng->hooks->fail_pipeline(pp->pl, ETIMEDOUT, msg);
	if (pp->host)
		pyw_conn_close(pp->host);
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
		pyw_conn_close(w);
	}
	if (pp->host) {
		struct pyw_conn *h = pp->host;
		pp->host = NULL;
		h->pp = NULL;
		pyw_conn_close(h);
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

static const struct pyw_conn_ops conn_ops = {
	.message = pyw_on_message,
	.worker_gone = pyw_worker_gone,
	.host_gone = pyw_host_gone,
};

int pyw_server_new(struct pyw_server **out, uv_loop_t *loop, struct engine *eng, const char *path,
		   unsigned mode, int gid, char *err, size_t errlen)
{
	return pyw_listen(out, loop, eng, path, mode, gid, &conn_ops, err, errlen);
}
