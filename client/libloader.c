/* SPDX-License-Identifier: MIT */
/* libloader - the client library of loaderd
 *
 * One nng REQ socket per client. Control requests (create, attach...) are
 * synchronous, each on a context of its own. Batches flow through Next
 * requests kept in flight per attachment (see top_up(): a window of deliveries,
 * each request asking for several batches), each on its own context; the
 * deliveries are stored by delivery number, so ldr_next() hands them out in
 * order and normally finds the next one already there. Finished batches are
 * released by piggy-backing their leases on the next Next request, or, when
 * the trainer does not ask for more, by a Release two milliseconds later. The
 * client's flusher thread sends both, so next() does not write to the socket
 * while batches are waiting here.
 *
 * Slabs are mapped once per attach, read-only, from an fd fetched over the fd
 * channel with the attach reply's one-time token. An attachment stays mapped
 * while any of its batches is unreleased, even after ldr_detach(). A CUDA
 * attachment also maps the daemon's device slab once (devmap.c); its batches'
 * fields are device pointers into it, and a batch released with
 * ldr_release_after() goes back once the event recorded on the trainer's
 * stream completed (the attachment's waiter thread sees to that).
 *
 * nng is not fork-safe: every entry point compares getpid() with the pid that
 * made the handle, and a child gets LDR_EFORKED without nng being touched.
 */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <protobuf-c/protobuf-c.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "devmap.h"
#include "fdchan-wire.h"
#include "nngclose.h"
#include "slabmap.h"
#include "loader.pb-c.h"
#include "loader/loader.h"

#define MAX_FIELDS 16
#define MAX_INFLIGHT LDR_INFLIGHT_MAX
#define CALL_TIMEOUT_MS 60000
#define RELOAD_TIMEOUT_MS 600000  /* ldr_reload(): a reload may index big datasets */
#define HELLO_TIMEOUT_MS 3000
#define CLOSE_WAIT_MS 2000
#define HELLO_ATTEMPTS 4          /* Hellos that time out */
#define HELLO_CUTS 12             /* connections the daemon cuts (listener replaced), 20 ms more apart each */
#define FLUSH_DELAY_MS 2
#define RECONNECT_DEFAULT_MS 60000 /* $LOADERD_RECONNECT_TIMEOUT, ldr_client_set_reconnect() */
#define RECONNECT_MIN_MS 50       /* the dialer's backoff, doubling... */
#define RECONNECT_MAX_MS 1000     /* ...up to this */
#define REATTACH_IDLE_MS 5000     /* cancelled requests come back within this */
static __thread char tls_err[16384]; /* a Python worker's traceback fits */
/* The process that first used nng through this library. */
static _Atomic pid_t nng_pid;

static void req_cb(void *arg);
static void deadline_after(struct timespec *ts, int ms);
static void *flusher_main(void *arg);
static void want_top_up(struct ldr_attachment *a);
static void reconnect_run(struct ldr_client *c);
static void top_up(struct ldr_attachment *a);
struct req;
static int req_send(struct ldr_attachment *a, struct req *r, uint32_t ask);

/*
 * set_err() - the thread's last error, which ldr_client_error() returns.
 *
 * The public API's end of the error idiom of common/common.h. Helpers
 * below the API (devmap.c, cudadrv.c) take `char *err, size_t errlen` and
 * fill it with errfmt(), as the daemon's code does; the ldr_* function that
 * called one hands that sentence on with set_err(r, "%s", err). Like
 * errfmt(), it returns @err, so a failure is reported and returned in one
 * statement: a failure an ldr_* function returns goes through it.
 */
static int set_err(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int set_err(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(tls_err, sizeof(tls_err), fmt, ap);
	va_end(ap);
	return err;
}

enum req_state { REQ_IDLE, REQ_SENDING, REQ_RECEIVING };

struct req {
	struct ldr_attachment *att;
	nng_ctx ctx;
	nng_aio *aio;
	enum req_state state;
	bool is_release;
	bool is_watch;            /* the attachment's parked watch (see answer_revoke) */
	bool open;
	uint32_t asked;           /* Next: how many batches it asked for */
};

struct arrived {
	bool present;
	int kind;                 /* LOADERD__REPLY__BODY_* */
	uint64_t lease, epoch, index;
	uint32_t slot, rows;
	int err;
	char *msg;                /* an error's text (a Python traceback fits), malloc'd */
};

struct afield {
	char name[LDR_NAME_MAX + 1];
	enum ldr_dtype dtype;
	int ndim;                 /* sample dims */
	int64_t shape[LDR_MAX_DIMS - 1];
	uint64_t offset;
	uint64_t sample_bytes;
};

/* A batch released with ldr_release_after(), waiting for its event. */
struct evwait {
	struct evwait *next;
	uint64_t lease;
	void *event;
};

/* A slot's range left by a released kept batch: pristine, ready as a view. */
struct spare {
	struct spare *next;
	uint8_t *addr;
};

/*
 * One mapping of a daemon's slab (copy-on-write, slabmap.c). Slot i lies at
 * slotaddr[i]: at base + i * slot bytes until a batch of slot i is kept (its
 * pages then stay the kept batch's), then in a view of that slot mapped
 * elsewhere. An attachment re-attached to a restarted daemon maps the new
 * daemon's slab and retires the old mapping, which stays until the last batch
 * taken from it is released: the memory of a memfd lives while it is mapped,
 * so those batches stay readable although their daemon is gone.
 */
struct amap {
	int refs;                 /* under c->lock: the attachment while current + each batch taken from it */
	uint8_t *base;
	size_t size;
	int fd;                   /* the slab's read-only fd, for slot views */
	uint32_t nslots;
	uint8_t **slotaddr;
	struct spare **spare;     /* per slot */
	void **views;             /* views mapped apart from the slab, unmapped at the end */
	size_t nviews, viewcap;
};

struct ldr_attachment {
	struct ldr_attachment *next;
	struct ldr_client *c;     /* holds a reference on it */
	atomic_int refs;          /* the handle + every unreleased batch */
	uint64_t id;
	uint64_t slot_bytes;
	uint32_t nslots;
	struct amap *map;         /* the current daemon's slab, under c->lock */
	bool cow;                 /* slots are whole pages: mapped copy-on-write */
	/* what a re-attach after a daemon restart needs (reconnect_run()) */
	char pipeline[LDR_NAME_MAX + 1];
	struct ldr_attach_opts opts;
	uint64_t pos_epoch, pos_batch; /* the next batch the trainer has not taken */
	bool lost;                /* the daemon restarted and this attachment could not follow */
	struct ldr_batch *held_head, *held_tail; /* taken, not kept, not released: oldest first */
	uint32_t nheld;
	uint32_t share;           /* leases we may hold, from the daemon; 0 unknown (nslots) */
	uint64_t share_seq;       /* the delivery that told us share */
	uint64_t kept_batches, kept_bytes;
	/* the watch: one Next parked at the daemon for its Revoke */
	struct req watch;
	bool watching;            /* the watch is out (or about to be re-sent) */
	bool rv_pending;          /* a Revoke waits for the deliveries below rv_upto */
	uint64_t rv_upto;
	uint32_t rv_count;
	bool has_ret;             /* the next watch carries returned leases */
	uint64_t ret_from;
	size_t nret;
	uint64_t ret[MAX_INFLIGHT];
	int nfields;
	struct afield fields[MAX_FIELDS];
	uint32_t batch_size;
	uint64_t bpe, epochs, samples;
	int inflight;
	struct req reqs[MAX_INFLIGHT];
	struct req relreq;
	struct arrived ring[MAX_INFLIGHT];
	uint64_t next_seq;
	int outstanding;          /* Next requests in flight */
	int requested;            /* batches they asked for, together */
	int arrived;              /* deliveries received, not yet taken */
	bool ended;
	int err;
	char errmsg[16384];       /* the daemon's last error: may hold a traceback */
	uint64_t *rel;
	size_t nrel, relcap;
	bool detached;
	uint64_t rel_refused;     /* Release requests the daemon refused */
	char rel_msg[256];        /* its message for the last one */
	/* CUDA delivery */
	enum ldr_device_kind device_kind;
	int device_index;
	struct devmap *dev;
	uint64_t dstride;
	struct evwait *ev_head, *ev_tail; /* under c->lock */
	pthread_cond_t ev_cond;
	pthread_t waiter;
	bool waiter_running, waiter_stop;
	/* stall accounting (TrainerStats, docs/protocol.md), under c->lock */
	uint64_t st_wait_ns, st_compute_ns, st_calls;
	uint64_t st_buckets[WAIT_BUCKETS];
	uint64_t st_mark;         /* mono ns of the last ldr_next() return, 0 none */
	uint64_t st_open;         /* this wait so far, over polls that timed out */
	bool st_waiting;          /* the last return was a timeout: the wait goes on */
	uint64_t st_counted;      /* mono ns up to which this call's wait is in st_wait_ns */
	uint64_t st_sent_ns;      /* when the last report went out */
	uint64_t st_sent_calls;   /* st_calls then */
	uint64_t st_sent_wait;    /* st_wait_ns then */
};

struct ldr_batch {
	struct ldr_attachment *att;
	uint64_t lease, epoch, index;
	uint32_t slot, rows;
	uint8_t *data;            /* the host slot at delivery (map->slotaddr[slot]) */
	struct amap *map;         /* the mapping it lies in (holds a reference) */
	struct ldr_batch *prev, *next; /* a->held_head list, under c->lock */
	bool in_held;
	bool busy;                /* being kept, c->lock dropped: wait on c->cond */
	bool keep_failed;         /* ldr_detach could not keep it */
	int kept;                 /* 0, or how slabmap_keep() kept it */
};

/* A pipeline this client created: created again after a daemon restart. */
struct spec_rec {
	struct spec_rec *next;
	char name[LDR_NAME_MAX + 1];
	char *json;
};

/* A synchronous call in flight (call_timeout()), on its caller's stack. */
struct sync_call {
	struct sync_call *next, **pprev;
	nng_aio *aio;
};

struct ldr_client {
	pid_t pid;
	atomic_int refs;          /* the handle + every attachment not yet freed */
	nng_socket sock;
	nng_dialer dialer;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool disconnected;
	uint64_t id;
	char path[108];
	char name[256];           /* the Hello's client name */
	struct ldr_attachment *atts;
	/* reconnecting to a restarted daemon (reconnect_run()) */
	int reconnect_ms;         /* how long to try; 0: never */
	bool ready;               /* handed out by ldr_connect() */
	bool closing;             /* ldr_close() has begun */
	bool reconnecting;        /* the flusher is reconnecting: calls and next() wait */
	bool reconnect_wanted;    /* the flusher should start */
	bool daemon_stopping;     /* it said ESHUTDOWN: no more Next until the next one */
	uint64_t cuts;            /* connections lost so far: a call sees its own cut */
	uint64_t reconnects;      /* reconnections that succeeded */
	struct timespec went_at;  /* when the connection went */
	char gone_msg[1024];      /* why the client is disconnected for good ("" today's message) */
	struct spec_rec *specs;   /* pipelines this client created, to re-create */
	struct sync_call *sync_calls; /* every synchronous call in flight, cancelled on disconnect */
	pthread_t flusher;
	pthread_cond_t flush_cond;
	bool flusher_running;
	bool flush_wanted;
	bool topup_wanted;        /* some attachment's window has room */
	bool flusher_idle;        /* the flusher sleeps with nothing to do */
	bool flusher_stop;
};

#define CHECK_PID(c)                                                          \
	do {                                                                  \
		if ((c)->pid != getpid())                                     \
			return set_err(LDR_EFORKED, "%s", error_name(LDR_EFORKED)); \
	} while (0)

/* --- small exported helpers --------------------------------------------- */

const char *ldr_strerror(int err)
{
	return error_name(err);
}

const char *ldr_dtype_name(enum ldr_dtype dtype)
{
	return dtype_name((int)dtype);
}

size_t ldr_dtype_size(enum ldr_dtype dtype)
{
	return dtype_size((int)dtype);
}

const char *ldr_mode_name(enum ldr_mode mode)
{
	return mode_name((int)mode);
}

int ldr_mode_from_name(const char *name)
{
	return mode_from_name(name);
}

int ldr_socket_path(char *buf, size_t size, const char *explicit_path)
{
	return sockpath_resolve(buf, size, explicit_path);
}

const char *ldr_version(void)
{
	return LOADERD_VERSION;
}

const char *ldr_nng_version(void)
{
	return nng_version();
}

const char *ldr_protobuf_c_version(void)
{
	return protobuf_c_version();
}

void ldr_free(void *ptr)
{
	free(ptr);
}

const char *ldr_client_error(const struct ldr_client *client)
{
	(void)client;
	return tls_err;
}

uint64_t ldr_client_id(const struct ldr_client *client)
{
	struct ldr_client *c = (struct ldr_client *)client; /* its lock: a reconnection changes it */
	uint64_t id;

	pthread_mutex_lock(&c->lock);
	id = c->id;
	pthread_mutex_unlock(&c->lock);
	return id;
}

static int nng_to_errno(int rv)
{
	switch (rv) {
	case 0: return 0;
	case NNG_ETIMEDOUT: return -ETIMEDOUT;
	case NNG_ENOMEM: return -ENOMEM;
	case NNG_ECONNREFUSED: return -ECONNREFUSED;
	case NNG_ENOENT: return -ENOENT;
	case NNG_EADDRINVAL: return -EINVAL;
	case NNG_EPERM: return -EACCES;
	case NNG_ECLOSED: case NNG_ECANCELED: case NNG_ECONNRESET: case NNG_ECONNSHUT:
		return LDR_EDISCONNECTED;
	case NNG_EMSGSIZE: return -EMSGSIZE;
	default: return -EIO;
	}
}

/* --- synchronous calls -------------------------------------------------- */

static void on_pipe_rem(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct ldr_client *c = arg;

	(void)p;
	(void)ev;
	pthread_mutex_lock(&c->lock);
	c->disconnected = true;
	c->cuts++;
	/* a client in use reconnects (the flusher does it, reconnect_run());
	 * a connection of the reconnection that goes too just fails its call */
	if (c->ready && c->reconnect_ms > 0 && !c->closing && c->flusher_running && !c->reconnecting) {
		c->reconnecting = true;
		c->reconnect_wanted = true;
		clock_gettime(CLOCK_MONOTONIC, &c->went_at);
		pthread_cond_signal(&c->flush_cond);
	}
	for (struct sync_call *sc = c->sync_calls; sc; sc = sc->next)
		nng_aio_cancel(sc->aio);
	for (struct ldr_attachment *a = c->atts; a; a = a->next) {
		for (int i = 0; i < a->inflight; i++)
			if (a->reqs[i].open && a->reqs[i].state != REQ_IDLE)
				nng_aio_cancel(a->reqs[i].aio);
		if (a->relreq.open && a->relreq.state != REQ_IDLE)
			nng_aio_cancel(a->relreq.aio);
		if (a->watch.open && a->watch.state != REQ_IDLE)
			nng_aio_cancel(a->watch.aio);
	}
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

static int pack_msg(const Loaderd__Request *req, nng_msg **out)
{
	size_t len = loaderd__request__get_packed_size(req);
	nng_msg *msg;

	if (nng_msg_alloc(&msg, len) != 0)
		return -ENOMEM;
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
static int disconnected_err(const struct ldr_client *c)
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
static int wait_connected(struct ldr_client *c, const struct timespec *deadline)
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
static int call_gen(struct ldr_client *c, const Loaderd__Request *req, Loaderd__Reply **out,
                    Loaderd__Reply__BodyCase expect, int timeout_ms, bool internal)
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
	if (!internal && (r = wait_connected(c, &deadline)) < 0) {
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
	if (r < 0) {
		r = set_err(r, "out of memory");
		goto out;
	}
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

static int client_open_socket(struct ldr_client *c)
{
	int rv;

	if ((rv = nng_req0_open(&c->sock)) != 0)
		return rv;
	/* never resend: a Next may wait for a batch far longer than any timer */
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, 1 << 20);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 1000);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 60000);
	nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, on_pipe_rem, c);
	return 0;
}

static int call_timeout(struct ldr_client *c, const Loaderd__Request *req, Loaderd__Reply **out,
                        Loaderd__Reply__BodyCase expect, int timeout_ms)
{
	return call_gen(c, req, out, expect, timeout_ms, false);
}

static int call(struct ldr_client *c, const Loaderd__Request *req, Loaderd__Reply **out,
                Loaderd__Reply__BodyCase expect)
{
	return call_timeout(c, req, out, expect, CALL_TIMEOUT_MS);
}

static struct ldr_client *client_alloc(pid_t self, const char *path, const char *name)
{
	struct ldr_client *c = calloc(1, sizeof(*c));
	pthread_condattr_t ca;

	if (!c)
		return NULL;
	c->pid = self;
	atomic_init(&c->refs, 1);
	pthread_mutex_init(&c->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cond, &ca);
	pthread_cond_init(&c->flush_cond, &ca);
	pthread_condattr_destroy(&ca);
	snprintf(c->path, sizeof(c->path), "%s", path);
	snprintf(c->name, sizeof(c->name), "%s", name);
	return c;
}

static void client_free(struct ldr_client *c)
{
	while (c->specs) {
		struct spec_rec *sr = c->specs;
		c->specs = sr->next;
		free(sr->json);
		free(sr);
	}
	pthread_cond_destroy(&c->flush_cond);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/*
 * Close the socket of a client that was never handed out, as ldr_close()
 * does: nng 1.5.2 can block in nng_close() forever. Returns true, and frees
 * @c, when the close finished; else @c is left to the close still going on
 * in the background (its pipe callback points at it) and to the exit.
 */
static bool client_drop(struct ldr_client *c)
{
	if (!nng_close_within(c->sock, CLOSE_WAIT_MS))
		return false;
	client_free(c);
	return true;
}

/*
 * The reconnect time from $LOADERD_RECONNECT_TIMEOUT (seconds, 0 never), else
 * RECONNECT_DEFAULT_MS; -EINVAL when it is not a number of seconds.
 */
static int reconnect_ms_from_env(int *ms)
{
	const char *v = getenv("LOADERD_RECONNECT_TIMEOUT");
	char *end;
	double sec;

	*ms = RECONNECT_DEFAULT_MS;
	if (!v || !*v)
		return 0;
	errno = 0;
	sec = strtod(v, &end);
	if (errno || end == v || *end || !(sec >= 0) || sec > 86400.0 * 24)
		return set_err(-EINVAL, "LOADERD_RECONNECT_TIMEOUT='%s' is not a number of seconds from 0 "
		               "(never reconnect) to 2073600", v);
	*ms = (int)(sec * 1000 + 0.5);
	if (sec > 0 && *ms == 0)
		*ms = 1;
	return 0;
}

/* Shake hands on the client's socket; sets c->id. */
static int hello_call(struct ldr_client *c, int timeout_ms, bool internal)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Hello hello = LOADERD__HELLO__INIT;
	Loaderd__Reply *rep;
	int r;

	hello.protocol = LDR_PROTOCOL_VERSION;
	hello.client_name = c->name;
	req.body_case = LOADERD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	r = call_gen(c, &req, &rep, LOADERD__REPLY__BODY_HELLO, timeout_ms, internal);
	if (r < 0)
		return r == -EPROTONOSUPPORT ? LDR_EVERSION : r;
	pthread_mutex_lock(&c->lock);
	c->id = rep->hello->client_id;
	pthread_mutex_unlock(&c->lock);
	loaderd__reply__free_unpacked(rep, NULL);
	return 0;
}

int ldr_connect(struct ldr_client **out, const char *socket_path, const char *client_name)
{
	struct ldr_client *c;
	char url[128], name[64], path[sizeof(c->path)];
	int rv, r, reconnect_ms;

	/* nng keeps process-wide state and panics when a forked child uses it
	 * (even through a new socket): refuse before touching it. */
	pid_t self = getpid(), first = 0;
	if (!atomic_compare_exchange_strong(&nng_pid, &first, self) && first != self)
		return set_err(LDR_EFORKED, "libloader was used in process %d before this process forked "
		               "from it, and nng cannot start again in a forked child: connect before "
		               "forking only in the process that uses the connection, or start workers "
		               "with spawn", (int)first);
	if (ldr_socket_path(path, sizeof(path), socket_path) < 0)
		return set_err(-ENAMETOOLONG, "socket path too long");
	if ((r = reconnect_ms_from_env(&reconnect_ms)) < 0)
		return r;
	if (!client_name) {
		snprintf(name, sizeof(name), "pid %d", (int)self);
		client_name = name;
	}
	c = client_alloc(self, path, client_name);
	if (!c)
		return set_err(-ENOMEM, "out of memory");
	if ((rv = client_open_socket(c)) != 0) {
		client_free(c);
		return set_err(nng_to_errno(rv), "nng: %s", nng_strerror(rv));
	}
	snprintf(url, sizeof(url), "ipc://%s", c->path);
	/* A Hello that goes unanswered for a few seconds, or whose connection
	 * the daemon cut, is retried on a fresh connection: the daemon replaces
	 * a listener that nng 1.5.2 wedged (daemon/nngfix.c), and cuts the
	 * connections queued on the old one, which are lost.
	 * Every close here is bounded (client_drop()), as in ldr_close(). */
	for (int timeouts = 0, cuts = 0;;) {
		bool last = timeouts == HELLO_ATTEMPTS - 1 || cuts == HELLO_CUTS - 1;
		if ((rv = nng_dial(c->sock, url, &c->dialer, 0)) != 0) {
			/* a handshake the daemon cut (ECONNSHUT: the listener it
			 * replaces held this connection) is retried as a cut Hello is */
			if (nng_to_errno(rv) != LDR_EDISCONNECTED || last) {
				r = set_err(nng_to_errno(rv) == LDR_EDISCONNECTED ? -ECONNREFUSED : nng_to_errno(rv),
				            "cannot connect to loaderd at %s: %s", c->path, nng_strerror(rv));
				client_drop(c);
				return r;
			}
		} else {
			r = hello_call(c, HELLO_TIMEOUT_MS, false);
			if ((r != -ETIMEDOUT && r != LDR_EDISCONNECTED) || last)
				break;
		}
		if (rv == 0 && r == -ETIMEDOUT) {
			timeouts++;
		} else {
			/* cut: the daemon is replacing a wedged listener; a storm of
			 * replacements (garbage connections) may cut several in a row */
			cuts++;
			usleep(20000u * (unsigned)cuts);
		}
		/* go on with a fresh client: one whose close did not finish is
		 * left to it (its pipe callback may still run) */
		client_drop(c);
		if (!(c = client_alloc(self, path, client_name)))
			return set_err(-ENOMEM, "out of memory");
		if ((rv = client_open_socket(c)) != 0) {
			client_free(c);
			return set_err(nng_to_errno(rv), "nng: %s", nng_strerror(rv));
		}
	}
	if (r < 0) {
		client_drop(c);
		return r;
	}
	if (pthread_create(&c->flusher, NULL, flusher_main, c) == 0)
		c->flusher_running = true;
	ldr_client_set_reconnect(c, reconnect_ms);
	pthread_mutex_lock(&c->lock);
	c->ready = true;
	pthread_mutex_unlock(&c->lock);
	*out = c;
	return 0;
}

int ldr_client_set_reconnect(struct ldr_client *c, int timeout_ms)
{
	CHECK_PID(c);
	if (timeout_ms < 0)
		return set_err(-EINVAL, "reconnect timeout %d ms: must be 0 (never) or more", timeout_ms);
	pthread_mutex_lock(&c->lock);
	c->reconnect_ms = timeout_ms;
	pthread_mutex_unlock(&c->lock);
	/* the dialer redials by itself: soon when we reconnect, rarely else */
	nng_dialer_set_ms(c->dialer, NNG_OPT_RECONNMINT, timeout_ms ? RECONNECT_MIN_MS : 1000);
	nng_dialer_set_ms(c->dialer, NNG_OPT_RECONNMAXT, timeout_ms ? RECONNECT_MAX_MS : 60000);
	return 0;
}

int ldr_client_reconnect_timeout(const struct ldr_client *client)
{
	struct ldr_client *c = (struct ldr_client *)client;
	int ms;

	pthread_mutex_lock(&c->lock);
	ms = c->reconnect_ms;
	pthread_mutex_unlock(&c->lock);
	return ms;
}

uint64_t ldr_client_reconnects(const struct ldr_client *client)
{
	struct ldr_client *c = (struct ldr_client *)client;
	uint64_t n;

	pthread_mutex_lock(&c->lock);
	n = c->reconnects;
	pthread_mutex_unlock(&c->lock);
	return n;
}

/*
 * Remember the spec of pipeline @name, created (or found) by this client, so
 * that reconnect_run() creates it again in a restarted daemon; the newest
 * spec of a name wins. Without memory it is just not remembered.
 */
static void spec_remember(struct ldr_client *c, const char *name, const char *json)
{
	struct spec_rec *sr;
	char *copy = strdup(json);

	if (!copy)
		return;
	pthread_mutex_lock(&c->lock);
	for (sr = c->specs; sr; sr = sr->next)
		if (strcmp(sr->name, name) == 0)
			break;
	if (!sr && (sr = calloc(1, sizeof(*sr)))) {
		snprintf(sr->name, sizeof(sr->name), "%s", name);
		sr->next = c->specs;
		c->specs = sr;
	}
	if (sr) {
		free(sr->json);
		sr->json = copy;
	} else {
		free(copy);
	}
	pthread_mutex_unlock(&c->lock);
}

/* A dropped pipeline is not created again. */
static void spec_forget(struct ldr_client *c, const char *name)
{
	pthread_mutex_lock(&c->lock);
	for (struct spec_rec **pp = &c->specs; *pp; pp = &(*pp)->next)
		if (strcmp((*pp)->name, name) == 0) {
			struct spec_rec *sr = *pp;
			*pp = sr->next;
			free(sr->json);
			free(sr);
			break;
		}
	pthread_mutex_unlock(&c->lock);
}

int ldr_create_pipeline(struct ldr_client *c, const char *spec_json, int exist_ok, char *name_out,
                        size_t name_size)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__CreatePipeline cp = LOADERD__CREATE_PIPELINE__INIT;
	Loaderd__Reply *rep;
	int r;

	CHECK_PID(c);
	if (!spec_json)
		return set_err(-EINVAL, "no spec");
	cp.spec_json = (char *)spec_json;
	cp.exist_ok = exist_ok != 0;
	req.body_case = LOADERD__REQUEST__BODY_CREATE;
	req.create = &cp;
	r = call(c, &req, &rep, LOADERD__REPLY__BODY_CREATE);
	if (r < 0)
		return r;
	if (name_out && name_size)
		snprintf(name_out, name_size, "%s", rep->create->name);
	spec_remember(c, rep->create->name, spec_json);
	r = rep->create->created ? 1 : 0;
	loaderd__reply__free_unpacked(rep, NULL);
	return r;
}

int ldr_drop_pipeline(struct ldr_client *c, const char *name, int force)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__DropPipeline dp = LOADERD__DROP_PIPELINE__INIT;
	Loaderd__Reply *rep;
	int r;

	CHECK_PID(c);
	dp.name = (char *)name;
	dp.force = force != 0;
	req.body_case = LOADERD__REQUEST__BODY_DROP;
	req.drop = &dp;
	r = call(c, &req, &rep, LOADERD__REPLY__BODY_OK);
	if (r == 0) {
		loaderd__reply__free_unpacked(rep, NULL);
		if (name)
			spec_forget(c, name);
	}
	return r;
}

static int json_call_timeout(struct ldr_client *c, Loaderd__Request *req, char **json_out,
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

static int json_call(struct ldr_client *c, Loaderd__Request *req, char **json_out)
{
	return json_call_timeout(c, req, json_out, CALL_TIMEOUT_MS);
}

int ldr_status_json(struct ldr_client *c, char **json_out)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Status st = LOADERD__STATUS__INIT;

	CHECK_PID(c);
	req.body_case = LOADERD__REQUEST__BODY_STATUS;
	req.status = &st;
	return json_call(c, &req, json_out);
}

int ldr_pipelines_json(struct ldr_client *c, char **json_out)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__ListPipelines lp = LOADERD__LIST_PIPELINES__INIT;

	CHECK_PID(c);
	req.body_case = LOADERD__REQUEST__BODY_LIST;
	req.list = &lp;
	return json_call(c, &req, json_out);
}

int ldr_set(struct ldr_client *c, const char *key, const char *pipeline, const char *value,
            char **json_out)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Set st = LOADERD__SET__INIT;

	CHECK_PID(c);
	if (!key || !value || !json_out)
		return set_err(-EINVAL, "set: no key or value");
	st.key = (char *)key;
	st.value = (char *)value;
	st.pipeline = (char *)(pipeline ? pipeline : "");
	req.body_case = LOADERD__REQUEST__BODY_SET;
	req.set = &st;
	return json_call(c, &req, json_out);
}

int ldr_reload(struct ldr_client *c, char **json_out)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Reload rl = LOADERD__RELOAD__INIT;

	CHECK_PID(c);
	if (!json_out)
		return set_err(-EINVAL, "reload: no json_out");
	req.body_case = LOADERD__REQUEST__BODY_RELOAD;
	req.reload = &rl;
	/* the reply comes once the new pipelines' files are open and indexed */
	return json_call_timeout(c, &req, json_out, RELOAD_TIMEOUT_MS);
}

/* --- attachments -------------------------------------------------------- */

static int fetch_slab_fd(const char *path, const uint8_t *token, size_t token_len, uint64_t *size,
                         int *dev_fd, uint64_t *dev_size)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct fdchan_request rq = { .magic = FDCHAN_MAGIC, .version = FDCHAN_VERSION };
	struct fdchan_reply rp;
	struct iovec iov = { .iov_base = &rp, .iov_len = sizeof(rp) };
	union {
		char buf[CMSG_SPACE(2 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
	                      .msg_controllen = sizeof(u.buf) };
	struct timeval tv = { .tv_sec = 10 };
	struct cmsghdr *cm;
	int fd, slab = -1, fds[2] = { -1, -1 };
	ssize_t n;

	*dev_fd = -1;
	*dev_size = 0;
	if (token_len != sizeof(rq.token) || strlen(path) >= sizeof(sa.sun_path))
		return set_err(-EPROTO, "bad attach reply (token or fd channel path)");
	memcpy(rq.token, token, sizeof(rq.token));
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return set_err(-errno, "socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return set_err(-e, "cannot connect to the fd channel %s: %s", path, strerror(e));
	}
	if (send(fd, &rq, sizeof(rq), MSG_NOSIGNAL) != (ssize_t)sizeof(rq)) {
		int e = errno;
		close(fd);
		return set_err(-e, "fd channel: send: %s", strerror(e));
	}
	memset(&u, 0, sizeof(u));
	n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
	close(fd);
	if (n != (ssize_t)sizeof(rp) || rp.magic != FDCHAN_MAGIC)
		return set_err(-EPROTO, "fd channel: no valid reply");
	for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
		    (cm->cmsg_len == CMSG_LEN(sizeof(int)) || cm->cmsg_len == CMSG_LEN(2 * sizeof(int))))
			memcpy(fds, CMSG_DATA(cm), cm->cmsg_len - CMSG_LEN(0));
	slab = fds[0];
	if (rp.status < 0 || (fds[1] >= 0) != (rp.nfds == 2)) {
		if (slab >= 0)
			close(slab);
		if (fds[1] >= 0)
			close(fds[1]);
		if (rp.status >= 0)
			return set_err(-EPROTO, "fd channel: %u fds announced, another number received", rp.nfds);
		return set_err(rp.status, "fd channel: token refused: %s", strerror(-rp.status));
	}
	if (slab < 0)
		return set_err(-EPROTO, "fd channel: reply carried no fd");
	*size = rp.size;
	*dev_fd = fds[1];
	*dev_size = rp.device_size;
	return slab;
}

/*
 * Map the slab (@fd of @size bytes, slots of @slot_bytes): copy-on-write when
 * @cow, else read-only shared. NULL with errno set when it cannot.
 */
static struct amap *amap_open(int fd, size_t size, uint32_t nslots, uint64_t slot_bytes, bool cow)
{
	struct amap *m = calloc(1, sizeof(*m));
	int e;

	if (!m)
		return NULL;
	m->refs = 1;
	m->fd = -1;
	m->nslots = nslots;
	if (cow) {
		m->base = slabmap_map(fd, size, 0);
	} else {
		m->base = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
		if (m->base == MAP_FAILED)
			m->base = NULL;
	}
	if (!m->base)
		goto fail;
	m->size = size;
	m->slotaddr = calloc(nslots, sizeof(*m->slotaddr));
	m->spare = calloc(nslots, sizeof(*m->spare));
	if (!m->slotaddr || !m->spare) {
		errno = ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < nslots; i++)
		m->slotaddr[i] = m->base + (uint64_t)i * slot_bytes;
	m->fd = fd;
	return m;
fail:
	e = errno;
	if (m->base)
		munmap(m->base, size);
	free(m->slotaddr);
	free(m->spare);
	free(m);
	errno = e;
	return NULL;
}

static void amap_free(struct amap *m, uint64_t slot_bytes)
{
	munmap(m->base, m->size);
	for (size_t i = 0; i < m->nviews; i++)
		munmap(m->views[i], slot_bytes);
	free(m->views);
	for (uint32_t i = 0; i < m->nslots; i++)
		while (m->spare[i]) {
			struct spare *sp = m->spare[i];
			m->spare[i] = sp->next;
			free(sp);
		}
	free(m->spare);
	free(m->slotaddr);
	close(m->fd);
	free(m);
}

/* Drop a reference on @m; the last unmaps it. Called with c->lock held
 * (or by the last user of the attachment). */
static void amap_put(struct ldr_attachment *a, struct amap *m)
{
	if (m && --m->refs == 0)
		amap_free(m, a->slot_bytes);
}

static void client_unref(struct ldr_client *c)
{
	if (atomic_fetch_sub(&c->refs, 1) != 1)
		return;
	client_free(c);
}

static void att_unref(struct ldr_attachment *a)
{
	struct ldr_client *c = a->c;

	if (atomic_fetch_sub(&a->refs, 1) != 1)
		return;
	if (a->waiter_running && c->pid == getpid()) {
		/* it waits for the events still queued, then ends */
		pthread_mutex_lock(&c->lock);
		a->waiter_stop = true;
		pthread_cond_signal(&a->ev_cond);
		pthread_mutex_unlock(&c->lock);
		pthread_join(a->waiter, NULL);
	}
	devmap_close(a->dev);
	pthread_cond_destroy(&a->ev_cond);
	amap_put(a, a->map);
	for (int i = 0; i < MAX_INFLIGHT; i++)
		free(a->ring[i].msg);
	free(a->rel);
	free(a);
	if (c->pid == getpid())
		client_unref(c);
}

static void *flusher_main(void *arg);

static int req_open(struct ldr_client *c, struct req *r, struct ldr_attachment *a, bool is_release)
{
	int rv;

	r->att = a;
	r->is_release = is_release;
	if ((rv = nng_ctx_open(&r->ctx, c->sock)) != 0)
		return nng_to_errno(rv);
	if ((rv = nng_aio_alloc(&r->aio, req_cb, r)) != 0) {
		nng_ctx_close(r->ctx);
		return -ENOMEM;
	}
	r->open = true;
	return 0;
}

static void req_close(struct req *r)
{
	if (!r->open)
		return;
	nng_aio_stop(r->aio);
	if (r->state == REQ_SENDING) {
		nng_msg *m = nng_aio_get_msg(r->aio);
		if (m && nng_aio_result(r->aio) != 0)
			nng_msg_free(m);
	}
	nng_aio_free(r->aio);
	nng_ctx_close(r->ctx);
	r->open = false;
}

/* Called with c->lock held. @ask: batches a Next may bring back. */
/*
 * The TrainerStats a Next or Release carries: the totals, when a wait ended
 * since the last report. A Next carries them at most every STATS_EVERY_NS
 * (the daemon's rates are over seconds); a Release whenever they changed, so
 * that the trainer's last batch is counted once its lease went back (releases
 * go out at most every FLUSH_DELAY_MS). Called with c->lock held; NULL when
 * there is nothing to say.
 */
#define STATS_EVERY_NS 100000000u
static Loaderd__TrainerStats *stats_report(struct ldr_attachment *a, Loaderd__TrainerStats *st,
                                           bool release)
{
	uint64_t now = mono_ns();

	if ((a->st_calls == a->st_sent_calls && a->st_wait_ns == a->st_sent_wait) ||
	    (!release && now - a->st_sent_ns < STATS_EVERY_NS))
		return NULL;
	a->st_sent_ns = now;
	a->st_sent_calls = a->st_calls;
	a->st_sent_wait = a->st_wait_ns;
	st->wait_ns = a->st_wait_ns;
	st->compute_ns = a->st_compute_ns;
	st->calls = a->st_calls;
	st->n_wait_buckets = WAIT_BUCKETS;
	st->wait_buckets = a->st_buckets;
	return st;
}

/* ldr_next() begins at @t0: the time since the last return was the
 * trainer's (compute), or still waiting when that return was a timeout. */
static void stats_enter(struct ldr_attachment *a, uint64_t t0)
{
	a->st_counted = t0;
	if (!a->st_mark)
		return;
	if (a->st_waiting) {
		a->st_open += t0 - a->st_mark;
		a->st_wait_ns += t0 - a->st_mark;
	} else {
		a->st_compute_ns += t0 - a->st_mark;
	}
}

/*
 * A long wait is reported while it lasts: the waits a report carries are
 * those that ended, and a trainer starved for seconds would show no figure
 * at all (no request goes out while it waits). Once a second of a wait
 * (ldr_next()'s own slices, or the Python package's polls that time out), a
 * Release carries the time waited so far, with the leases queued if any.
 * Only a waiting trainer pays for it. Called with c->lock held.
 */
#define STATS_LIVE_MS 1000
static void stats_live(struct ldr_attachment *a, uint64_t now)
{
	a->st_wait_ns += now - a->st_counted;
	a->st_counted = now;
	if (now - a->st_sent_ns >= (uint64_t)STATS_LIVE_MS * 1000000u && !a->detached &&
	    !a->c->disconnected && a->relreq.open && a->relreq.state == REQ_IDLE)
		req_send(a, &a->relreq, 0);
}

/* ldr_next() that began at @t0 returns @r. A wait ends with anything but a
 * timeout: ldr_next with a timeout in a loop (the Python DataLoader polls in
 * slices) is one wait. */
static void stats_leave(struct ldr_attachment *a, uint64_t t0, int r)
{
	uint64_t t1 = mono_ns();

	a->st_wait_ns += t1 - a->st_counted;
	a->st_counted = t1;
	a->st_open += t1 - t0;
	a->st_mark = r == 0 || r == -ETIMEDOUT ? t1 : 0;
	a->st_waiting = r == -ETIMEDOUT;
	if (a->st_waiting) {
		stats_live(a, t1);
		return;
	}
	a->st_buckets[wait_bucket(a->st_open)]++;
	a->st_calls++;
	a->st_open = 0;
}

static int req_send(struct ldr_attachment *a, struct req *r, uint32_t ask)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Next next = LOADERD__NEXT__INIT;
	Loaderd__Release rel = LOADERD__RELEASE__INIT;
	Loaderd__TrainerStats st = LOADERD__TRAINER_STATS__INIT;
	nng_msg *msg;
	int e;

	if (r->is_watch) {
		/* no releases: they would wait with it until a Revoke */
		next.attach_id = a->id;
		next.watch = true;
		if (a->has_ret) {
			next.has_return = true;
			next.return_from = a->ret_from;
			next.n_returned = a->nret;
			next.returned = a->ret;
		}
		req.body_case = LOADERD__REQUEST__BODY_NEXT;
		req.next = &next;
	} else if (r->is_release) {
		rel.attach_id = a->id;
		rel.n_leases = a->nrel;
		rel.leases = a->rel;
		rel.stats = stats_report(a, &st, true);
		req.body_case = LOADERD__REQUEST__BODY_RELEASE;
		req.release = &rel;
	} else {
		next.attach_id = a->id;
		next.n_releases = a->nrel;
		next.releases = a->rel;
		next.max_batches = ask;
		next.stats = stats_report(a, &st, false);
		req.body_case = LOADERD__REQUEST__BODY_NEXT;
		req.next = &next;
	}
	if ((e = pack_msg(&req, &msg)) < 0)
		return e;
	if (r->is_watch) {
		a->has_ret = false;
		a->nret = 0;
	} else {
		a->nrel = 0;
	}
	nng_aio_set_msg(r->aio, msg);
	r->state = REQ_SENDING;
	if (!r->is_release && !r->is_watch) {
		r->asked = ask;
		a->outstanding++;
		a->requested += (int)ask;
	}
	nng_ctx_send(r->ctx, r->aio);
	return 0;
}

/*
 * Keep the window full. The window (ldr_attach_opts.inflight) bounds the
 * deliveries asked for plus those received and not yet taken. A Next asks for
 * up to half the window, so when the daemon is ahead each answer brings several
 * batches and costs one round trip for all of them; two requests stay out, so
 * one is always parked at the daemon while the other's answer travels.
 * Called with c->lock held.
 */
/* Would top_up() send anything? Called with c->lock held. */
static bool needs_top_up(const struct ldr_attachment *a)
{
	int half = a->inflight / 2 > 0 ? a->inflight / 2 : 1;
	int budget = a->inflight - a->arrived - a->requested;

	return budget > 0 && (a->outstanding == 0 || budget >= half);
}

static void top_up(struct ldr_attachment *a)
{
	int half = a->inflight / 2 > 0 ? a->inflight / 2 : 1;

	while (!a->ended && !a->err && !a->detached && !a->c->disconnected && !a->c->daemon_stopping) {
		int budget = a->inflight - a->arrived - a->requested;
		int ask = budget;
		struct req *r = NULL;

		if (budget <= 0 || (a->outstanding > 0 && budget < half))
			return;
		if (a->outstanding == 0 && budget > half)
			ask = half;
		for (int i = 0; i < a->inflight; i++)
			if (a->reqs[i].state == REQ_IDLE) {
				r = &a->reqs[i];
				break;
			}
		if (!r || req_send(a, r, (uint32_t)ask) < 0)
			return;
	}
}

/*
 * A request that failed because the connection went (nng fails it before or
 * after on_pipe_rem() runs) is not an error of its attachment when the client
 * reconnects: reattach() asks again. Called with c->lock held.
 */
static bool will_reconnect(const struct ldr_client *c)
{
	return c->reconnecting || (c->ready && c->reconnect_ms > 0 && !c->closing && c->flusher_running);
}

static bool lost_with_connection(const struct ldr_client *c, int rv)
{
	if (rv != NNG_ECLOSED && rv != NNG_ECANCELED && rv != NNG_ECONNSHUT && rv != NNG_ECONNRESET)
		return false;
	return will_reconnect(c);
}

/* Put one delivery in its place by seq; false if it is out of the window. */
static bool store_one(struct ldr_attachment *a, uint64_t seq, int kind, const Loaderd__Batch *b,
                      const Loaderd__Error *e)
{
	struct arrived *ar;

	if (seq < a->next_seq || seq - a->next_seq >= MAX_INFLIGHT || a->ring[seq % MAX_INFLIGHT].present) {
		if (!a->err) {
			a->err = -EPROTO;
			snprintf(a->errmsg, sizeof(a->errmsg), "reply out of sequence");
		}
		return false;
	}
	ar = &a->ring[seq % MAX_INFLIGHT];
	memset(ar, 0, sizeof(*ar));
	ar->present = true;
	ar->kind = kind;
	if (b) {
		ar->lease = b->lease;
		ar->epoch = b->epoch;
		ar->index = b->index;
		ar->slot = b->slot;
		ar->rows = b->rows;
	} else if (e) {
		ar->err = e->code > 0 ? -e->code : -EIO;
		ar->msg = strdup(e->message ? e->message : "");
	}
	a->arrived++;
	return true;
}

static void store_reply(struct ldr_attachment *a, const Loaderd__Reply *rep, int rv)
{
	if (lost_with_connection(a->c, rv))
		return; /* reattach() asks again */
	if (rv != 0 || !rep) {
		if (!a->err) {
			a->err = a->c->disconnected || rv == NNG_ECLOSED || rv == NNG_ECANCELED
			                 ? LDR_EDISCONNECTED : nng_to_errno(rv ? rv : NNG_EPROTO);
			if (a->err == LDR_EDISCONNECTED)
				snprintf(a->errmsg, sizeof(a->errmsg), "disconnected from the daemon at %s",
				         a->c->path);
			else
				snprintf(a->errmsg, sizeof(a->errmsg), "%s",
				         rep ? "" : "malformed reply from the daemon");
		}
		return;
	}
	switch (rep->body_case) {
	case LOADERD__REPLY__BODY_BATCHES:
		if (rep->batches->n_batches == 0 && !a->err) {
			a->err = -EPROTO;
			snprintf(a->errmsg, sizeof(a->errmsg), "empty batch list from the daemon");
		}
		/* answers may be handled out of order: the newest delivery's
		 * share is the current one */
		if (rep->batches->n_batches && rep->batches->share &&
		    rep->batches->batches[0]->seq >= a->share_seq) {
			a->share = rep->batches->share;
			a->share_seq = rep->batches->batches[0]->seq;
		}
		for (size_t i = 0; i < rep->batches->n_batches; i++)
			if (!store_one(a, rep->batches->batches[i]->seq, LOADERD__REPLY__BODY_BATCHES,
			               rep->batches->batches[i], NULL))
				return;
		return;
	case LOADERD__REPLY__BODY_END:
		store_one(a, rep->end->seq, LOADERD__REPLY__BODY_END, NULL, NULL);
		return;
	case LOADERD__REPLY__BODY_ERROR: {
		uint64_t seq = rep->error->seq;
		if (rep->error->code == ECANCELED && a->detached)
			return;
		if (rep->error->code == ESHUTDOWN && will_reconnect(a->c)) {
			/* a daemon that stops (a restart, an upgrade): nothing is
			 * asked of it any more, and the attachment follows the
			 * next one (reattach()) */
			a->c->daemon_stopping = true;
			return;
		}
		if (seq < a->next_seq || seq - a->next_seq >= MAX_INFLIGHT) {
			/* an error not tied to a delivery: it stops the attachment */
			if (!a->err) {
				a->err = rep->error->code > 0 ? -rep->error->code : -EIO;
				snprintf(a->errmsg, sizeof(a->errmsg), "%s", rep->error->message);
			}
			return;
		}
		store_one(a, seq, LOADERD__REPLY__BODY_ERROR, NULL, rep->error);
		return;
	}
	default:
		if (!a->err) {
			a->err = -EPROTO;
			snprintf(a->errmsg, sizeof(a->errmsg), "unexpected reply to Next");
		}
		return;
	}
}

/* Discard what may have been written in the slot of a delivery the trainer
 * never saw (cheap: a pagemap scan). Called with c->lock held. */
static void discard_unseen(struct ldr_attachment *a, const struct arrived *ar)
{
	if (a->cow && ar->slot < a->nslots)
		slabmap_discard(a->map->slotaddr[ar->slot], a->slot_bytes, a->map->fd,
		                (uint64_t)ar->slot * a->slot_bytes, NULL);
}

/*
 * Answer a Revoke (docs/protocol.md, "Sharing slots"), once every delivery
 * below its upto_seq has arrived (answers to the Next requests may be handled
 * in any order): hand back, unread, the longest run of deliveries just below
 * upto_seq, at most count, that the trainer has not taken and that are
 * batches. They leave the ring; the daemon rewinds and delivers them again
 * from return_from, which the ring then accepts like any new delivery, and the
 * window has room for them again. Called with c->lock held.
 */
static void answer_revoke(struct ldr_attachment *a)
{
	uint64_t upto = a->rv_upto, from;
	uint32_t j = 0;

	if (!a->rv_pending || !a->watching || a->watch.state != REQ_IDLE || a->detached ||
	    a->c->disconnected)
		return;
	if (upto > a->next_seq) {
		if (upto - a->next_seq > MAX_INFLIGHT)
			return;
		for (uint64_t s = a->next_seq; s < upto; s++)
			if (!a->ring[s % MAX_INFLIGHT].present)
				return; /* on its way */
	}
	while (j < a->rv_count && j < MAX_INFLIGHT && upto - j > a->next_seq) {
		const struct arrived *ar = &a->ring[(upto - j - 1) % MAX_INFLIGHT];
		if (!ar->present || ar->kind != LOADERD__REPLY__BODY_BATCHES)
			break;
		j++;
	}
	from = upto - j;
	for (uint64_t s = from; s < upto; s++) {
		struct arrived *ar = &a->ring[s % MAX_INFLIGHT];
		a->ret[s - from] = ar->lease;
		ar->present = false;
		a->arrived--;
		discard_unseen(a, ar);
	}
	a->rv_pending = false;
	a->has_ret = true;
	a->ret_from = from;
	a->nret = j;
	a->share_seq = from; /* the re-deliveries tell the share from now on */
	if (req_send(a, &a->watch, 0) < 0) {
		a->watching = false;
		if (!a->err) {
			a->err = -ENOMEM;
			snprintf(a->errmsg, sizeof(a->errmsg), "cannot answer the daemon's revoke: out of memory");
		}
	}
	top_up(a);
}

/* The watch came back. Called with c->lock held. */
static void watch_reply(struct ldr_attachment *a, const Loaderd__Reply *rep, int rv)
{
	if (rv != 0 || !rep) {
		a->watching = false; /* cancelled, or the connection went */
		return;
	}
	switch (rep->body_case) {
	case LOADERD__REPLY__BODY_REVOKE:
		if (rep->revoke->share)
			a->share = rep->revoke->share;
		a->share_seq = rep->revoke->upto_seq;
		a->rv_pending = true;
		a->rv_upto = rep->revoke->upto_seq;
		a->rv_count = rep->revoke->count;
		answer_revoke(a);
		return;
	case LOADERD__REPLY__BODY_ERROR: {
		int code = rep->error->code;
		a->watching = false; /* detached, shutting down...: not sent again */
		if (code != ECANCELED && code != ESHUTDOWN && !a->detached && !a->err) {
			a->err = code > 0 && code < 4096 ? -code : -EIO;
			/* a failed pipeline or a detach reaches the watch first:
			 * its message as the daemon wrote it; only a refusal of
			 * the watch itself says so */
			snprintf(a->errmsg, sizeof(a->errmsg), "%s%s",
			         code == EINVAL || code == EPROTO ? "the daemon refused this client's watch: " : "",
			         rep->error->message && *rep->error->message ? rep->error->message
			                                                     : error_name(a->err));
		}
		return;
	}
	case LOADERD__REPLY__BODY_BATCHES:
	case LOADERD__REPLY__BODY_END:
		/* a daemon that took the watch for a plain Next: keep what it
		 * delivered, and send no more watches */
		a->watching = false;
		store_reply(a, rep, 0);
		return;
	default:
		a->watching = false;
		return;
	}
}

static void req_cb(void *arg)
{
	struct req *r = arg;
	struct ldr_attachment *a = r->att;
	struct ldr_client *c = a->c;
	int rv = nng_aio_result(r->aio);

	pthread_mutex_lock(&c->lock);
	if (r->state == REQ_SENDING && rv == 0) {
		r->state = REQ_RECEIVING;
		nng_ctx_recv(r->ctx, r->aio);
		pthread_mutex_unlock(&c->lock);
		return;
	}
	if (r->state == REQ_SENDING) {
		nng_msg *m = nng_aio_get_msg(r->aio);
		if (m)
			nng_msg_free(m);
	}
	Loaderd__Reply *rep = NULL;
	if (rv == 0) {
		nng_msg *m = nng_aio_get_msg(r->aio);
		rep = loaderd__reply__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
		nng_msg_free(m);
	}
	r->state = REQ_IDLE;
	if (r->is_watch) {
		watch_reply(a, rep, rv);
	} else if (r->is_release) {
		if (rep && rep->body_case == LOADERD__REPLY__BODY_ERROR && !a->detached) {
			/* a refused release is a bug of ours (or the pipeline was
			 * dropped with force), not the trainer's: keep going, but
			 * let it be seen (ldr_attachment_release_refused()) */
			a->rel_refused++;
			snprintf(a->rel_msg, sizeof(a->rel_msg), "%s",
			         rep->error->message && *rep->error->message ? rep->error->message
			                 : error_name(rep->error->code > 0 ? -rep->error->code : -EIO));
		}
		if (a->nrel && !a->detached && !c->disconnected && rv == 0)
			req_send(a, r, 0);
	} else {
		a->outstanding--;
		a->requested -= (int)r->asked;
		store_reply(a, rep, rv);
		if (a->rv_pending)
			answer_revoke(a);
		top_up(a);
	}
	if (rep)
		loaderd__reply__free_unpacked(rep, NULL);
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

/*
 * The client's own thread. It sends the Next requests that ldr_next() makes
 * room for, so that a trainer's next() only takes a batch that is already here
 * and never waits on a socket write. And it returns leases: they normally ride
 * on the next Next, but a trainer that stops asking (end of an epoch, a batch
 * kept past the loop) must still give its slots back soon, so what is left is
 * sent FLUSH_DELAY_MS after the first pending release. It wakes at most once
 * per delay for releases, however fast batches go.
 */
static void *flusher_main(void *arg)
{
	struct ldr_client *c = arg;
	struct timespec deadline;
	bool timing = false;

	pthread_mutex_lock(&c->lock);
	while (!c->flusher_stop) {
		if (c->reconnect_wanted) {
			c->reconnect_wanted = false;
			pthread_mutex_unlock(&c->lock);
			reconnect_run(c);
			pthread_mutex_lock(&c->lock);
			continue;
		}
		if (c->topup_wanted) {
			c->topup_wanted = false;
			for (struct ldr_attachment *a = c->atts; a; a = a->next)
				top_up(a);
			continue;
		}
		if (!c->flush_wanted) {
			c->flusher_idle = true;
			pthread_cond_wait(&c->flush_cond, &c->lock);
			c->flusher_idle = false;
			continue;
		}
		if (!timing) {
			deadline_after(&deadline, FLUSH_DELAY_MS);
			timing = true;
		}
		if (pthread_cond_timedwait(&c->flush_cond, &c->lock, &deadline) != ETIMEDOUT)
			continue; /* a top-up, or stop */
		timing = false;
		c->flush_wanted = false;
		for (struct ldr_attachment *a = c->atts; a; a = a->next)
			if (a->nrel && !a->detached && !c->disconnected && a->relreq.state == REQ_IDLE)
				req_send(a, &a->relreq, 0);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/* Have the flusher top the windows up. Called with c->lock held. */
static void want_top_up(struct ldr_attachment *a)
{
	struct ldr_client *c = a->c;

	/* Nothing left here: the trainer will wait for the answer, so ask now.
	 * Otherwise the flusher asks, off the trainer's path. */
	if (!c->flusher_running || a->arrived == 0) {
		top_up(a);
		return;
	}
	if (!c->topup_wanted) {
		c->topup_wanted = true;
		pthread_cond_signal(&c->flush_cond);
	}
}

/*
 * The caller's options as this library knows them: the fields that lie
 * wholly within @in->size bytes (0: LDR_ATTACH_OPTS_SIZE_V1), the others 0
 * (their defaults). Fields this library does not know must be 0.
 */
static int read_attach_opts(const struct ldr_attach_opts *in, struct ldr_attach_opts *o)
{
	size_t n;

	memset(o, 0, sizeof(*o));
	if (!in)
		return 0;
	n = in->size ? in->size : LDR_ATTACH_OPTS_SIZE_V1;
	if (n < sizeof(in->size))
		return set_err(-EINVAL, "ldr_attach_opts.size %zu is below the smallest layout", n);
	if (n > sizeof(*o)) {
		const unsigned char *extra = (const unsigned char *)in + sizeof(*o);
		for (size_t i = 0; i < n - sizeof(*o); i++)
			if (extra[i])
				return set_err(-E2BIG, "ldr_attach_opts of %zu bytes sets options beyond the %zu "
				               "bytes this libloader (%s) knows", n, sizeof(*o), LOADERD_VERSION);
	}
#define OPT(f)                                                                          \
	do {                                                                            \
		if (n >= offsetof(struct ldr_attach_opts, f) + sizeof(o->f))             \
			o->f = in->f;                                                   \
	} while (0)
	OPT(mode);
	OPT(rank);
	OPT(world_size);
	OPT(has_start);
	OPT(start_epoch);
	OPT(start_batch);
	OPT(inflight);
	OPT(device_kind);
	OPT(device_index);
#undef OPT
	o->size = sizeof(*o);
	return 0;
}

/*
 * The layout an attach reply gives (slots, epochs, fields) into @a: a new
 * attachment's, or the re-attached one's to compare (reattach()).
 */
static int att_read_reply(struct ldr_attachment *a, const Loaderd__AttachReply *ar)
{
	a->id = ar->attach_id;
	a->slot_bytes = ar->slot_bytes;
	a->nslots = ar->nslots;
	a->batch_size = ar->batch_size;
	a->bpe = ar->batches_per_epoch;
	a->epochs = ar->epochs;
	a->samples = ar->samples;
	a->share = ar->share;
	a->pos_epoch = ar->start_epoch;
	a->pos_batch = ar->start_batch;
	if (ar->n_fields > MAX_FIELDS || ar->n_fields == 0)
		return set_err(-EPROTO, "attach reply has %zu fields", ar->n_fields);
	a->nfields = (int)ar->n_fields;
	for (size_t f = 0; f < ar->n_fields; f++) {
		const Loaderd__Field *fd_ = ar->fields[f];
		struct afield *af = &a->fields[f];
		if (fd_->n_sample_shape > LDR_MAX_DIMS - 1 || fd_->dtype >= LDR_DTYPE_COUNT ||
		    fd_->offset + (uint64_t)a->batch_size * fd_->sample_bytes > a->slot_bytes)
			return set_err(-EPROTO, "attach reply: field %zu is malformed", f);
		memset(af, 0, sizeof(*af));
		snprintf(af->name, sizeof(af->name), "%s", fd_->name);
		af->dtype = (enum ldr_dtype)fd_->dtype;
		af->ndim = (int)fd_->n_sample_shape;
		for (size_t d = 0; d < fd_->n_sample_shape; d++)
			af->shape[d] = fd_->sample_shape[d];
		af->offset = fd_->offset;
		af->sample_bytes = fd_->sample_bytes;
	}
	return 0;
}

int ldr_attach(struct ldr_client *c, const char *pipeline, const struct ldr_attach_opts *user_opts,
               struct ldr_attachment **out)
{
	struct ldr_attach_opts opts_buf;
	const struct ldr_attach_opts *opts = &opts_buf;
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Attach at = LOADERD__ATTACH__INIT;
	Loaderd__Reply *rep;
	Loaderd__AttachReply *ar;
	struct ldr_attachment *a;
	uint64_t size = 0, dev_size = 0;
	int r, fd, dev_fd = -1;
	char err[512];

	CHECK_PID(c);
	if ((r = read_attach_opts(user_opts, &opts_buf)) < 0)
		return r;
	if (!pipeline || strlen(pipeline) > LDR_NAME_MAX)
		return set_err(-EINVAL, "invalid pipeline name");
	if (opts->inflight > MAX_INFLIGHT)
		return set_err(-EINVAL, "inflight %u above the limit of %d", opts->inflight, MAX_INFLIGHT);
	at.pipeline = (char *)pipeline;
	at.mode = (Loaderd__Mode)opts->mode;
	at.rank = opts->rank;
	at.world_size = opts->world_size;
	at.has_start = opts->has_start != 0;
	at.start_epoch = opts->start_epoch;
	at.start_batch = opts->start_batch;
	at.credits = opts->inflight ? opts->inflight : 4;
	at.device_kind = (uint32_t)opts->device_kind;
	at.device_index = opts->device_kind != LDR_DEVICE_HOST ? opts->device_index : 0;
	req.body_case = LOADERD__REQUEST__BODY_ATTACH;
	req.attach = &at;
	r = call(c, &req, &rep, LOADERD__REPLY__BODY_ATTACH);
	if (r < 0)
		return r;
	ar = rep->attach;

	a = calloc(1, sizeof(*a));
	if (!a) {
		r = set_err(-ENOMEM, "out of memory");
		goto fail_rep;
	}
	a->c = c;
	atomic_fetch_add(&c->refs, 1);
	atomic_init(&a->refs, 1);
	pthread_cond_init(&a->ev_cond, NULL);
	a->inflight = (int)at.credits;
	snprintf(a->pipeline, sizeof(a->pipeline), "%s", pipeline);
	a->opts = *opts;
	if ((r = att_read_reply(a, ar)) < 0)
		goto fail;
	fd = fetch_slab_fd(ar->fd_path, ar->fd_token.data, ar->fd_token.len, &size, &dev_fd, &dev_size);
	if (fd < 0) {
		r = fd;
		goto fail;
	}
	if (size != ar->slab_bytes || size < (uint64_t)a->nslots * a->slot_bytes) {
		close(fd);
		if (dev_fd >= 0)
			close(dev_fd);
		r = set_err(-EPROTO, "slab size mismatch");
		goto fail;
	}
	if (ar->device_kind == LDR_DEVICE_CUDA) {
		a->device_kind = LDR_DEVICE_CUDA;
		a->device_index = ar->device_index;
		a->dstride = ar->device_slot_stride;
		if (a->dstride < a->slot_bytes || ar->device_slot_stride * a->nslots > ar->device_slab_bytes ||
		    (dev_fd >= 0 && dev_size != ar->device_slab_bytes)) {
			r = set_err(-EPROTO, "attach reply: device slab of %" PRIu64 " bytes cannot hold %u slots "
			            "%" PRIu64 " bytes apart", ar->device_slab_bytes, a->nslots, a->dstride);
			if (dev_fd >= 0)
				close(dev_fd);
		} else {
			r = devmap_open(&a->dev, ar->device_index, ar->device_memory, dev_fd, ar->device_slab_bytes,
			                ar->device_ipc_handle.data, ar->device_ipc_handle.len, err, sizeof(err));
			if (r < 0)
				set_err(r, "%s", err);
		}
		if (r < 0) {
			close(fd);
			goto fail;
		}
	} else if (dev_fd >= 0) {
		close(dev_fd);
	}
	/* Copy-on-write: the trainer may write into its batches (a written page
	 * becomes its own, and is discarded before the lease goes back). It
	 * needs slots of whole pages, as the daemon lays them out (4096 bytes). */
	a->cow = a->slot_bytes > 0 && a->slot_bytes % slabmap_page() == 0;
	if (!(a->map = amap_open(fd, size, a->nslots, a->slot_bytes, a->cow))) {
		r = set_err(-errno, "cannot map the slab: %s", strerror(errno));
		close(fd);
		goto fail;
	}
	for (int i = 0; i < a->inflight; i++)
		if ((r = req_open(c, &a->reqs[i], a, false)) < 0) {
			r = set_err(r, "cannot open request contexts");
			goto fail;
		}
	if ((r = req_open(c, &a->relreq, a, true)) < 0) {
		r = set_err(r < 0 ? r : -ENOMEM, "cannot open request contexts");
		goto fail;
	}
	/* A daemon that reports a share parks watches; an older one would take
	 * a watch for a Next asking for one batch. */
	if (ar->share) {
		if ((r = req_open(c, &a->watch, a, false)) < 0) {
			r = set_err(r, "cannot open request contexts");
			goto fail;
		}
		a->watch.is_watch = true;
	}
	loaderd__reply__free_unpacked(rep, NULL);

	pthread_mutex_lock(&c->lock);
	a->next = c->atts;
	c->atts = a;
	top_up(a);
	if (a->watch.open && !c->disconnected && req_send(a, &a->watch, 0) == 0)
		a->watching = true;
	pthread_mutex_unlock(&c->lock);
	*out = a;
	return 0;

fail:
	for (int i = 0; i < MAX_INFLIGHT; i++)
		req_close(&a->reqs[i]);
	req_close(&a->relreq);
	req_close(&a->watch);
	{
		/* tell the daemon, so it does not keep a slot for us */
		Loaderd__Request dreq = LOADERD__REQUEST__INIT;
		Loaderd__Detach det = LOADERD__DETACH__INIT;
		Loaderd__Reply *drep;
		char keep[sizeof(tls_err)];
		det.attach_id = a->id;
		dreq.body_case = LOADERD__REQUEST__BODY_DETACH;
		dreq.detach = &det;
		memcpy(keep, tls_err, sizeof(keep));
		if (call(c, &dreq, &drep, LOADERD__REPLY__BODY_OK) == 0)
			loaderd__reply__free_unpacked(drep, NULL);
		memcpy(tls_err, keep, sizeof(keep));
	}
	att_unref(a);
fail_rep:
	loaderd__reply__free_unpacked(rep, NULL);
	return r;
}

uint64_t ldr_attachment_release_refused(const struct ldr_attachment *a, char *msg, size_t size)
{
	struct ldr_client *c = a->c;
	uint64_t n;

	pthread_mutex_lock(&c->lock);
	n = a->rel_refused;
	if (msg && size)
		snprintf(msg, size, "%s", a->rel_msg);
	pthread_mutex_unlock(&c->lock);
	return n;
}

int ldr_attachment_nfields(const struct ldr_attachment *a)
{
	return a->nfields;
}

uint64_t ldr_attachment_batches_per_epoch(const struct ldr_attachment *a)
{
	return a->bpe;
}

uint64_t ldr_attachment_samples_per_epoch(const struct ldr_attachment *a)
{
	return a->samples;
}

uint64_t ldr_attachment_epochs(const struct ldr_attachment *a)
{
	return a->epochs;
}

uint32_t ldr_attachment_batch_size(const struct ldr_attachment *a)
{
	return a->batch_size;
}

const void *ldr_attachment_slab(const struct ldr_attachment *a, size_t *size)
{
	struct ldr_client *c = a->c;
	const void *base;

	pthread_mutex_lock(&c->lock);
	if (size)
		*size = a->map->size;
	base = a->map->base;
	pthread_mutex_unlock(&c->lock);
	return base;
}

static void deadline_after(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* --- batches held, kept, released ---------------------------------------- */

/* The effective share: what the daemon said, nslots while it says nothing. */
static uint32_t share_now(const struct ldr_attachment *a)
{
	return a->share && a->share < a->nslots ? a->share : a->nslots;
}

/* Called with c->lock held. */
static void held_add(struct ldr_attachment *a, struct ldr_batch *b)
{
	b->next = NULL;
	b->prev = a->held_tail;
	if (a->held_tail)
		a->held_tail->next = b;
	else
		a->held_head = b;
	a->held_tail = b;
	b->in_held = true;
	a->nheld++;
}

/* Called with c->lock held. */
static void held_del(struct ldr_attachment *a, struct ldr_batch *b)
{
	if (!b->in_held)
		return;
	if (b->prev)
		b->prev->next = b->next;
	else
		a->held_head = b->next;
	if (b->next)
		b->next->prev = b->prev;
	else
		a->held_tail = b->prev;
	b->prev = b->next = NULL;
	b->in_held = false;
	a->nheld--;
}

/* Hand @lease back with the next request. Called with c->lock held. */
static void queue_release(struct ldr_attachment *a, uint64_t lease)
{
	struct ldr_client *c = a->c;

	if (a->detached || a->lost)
		return;
	if (a->nrel == a->relcap) {
		size_t cap = a->relcap ? a->relcap * 2 : 16;
		uint64_t *n = realloc(a->rel, cap * sizeof(*n));
		if (n) {
			a->rel = n;
			a->relcap = cap;
		}
	}
	if (a->nrel < a->relcap)
		a->rel[a->nrel++] = lease;
	if (!c->flush_wanted && c->flusher_running) {
		c->flush_wanted = true;
		if (c->flusher_idle)
			pthread_cond_signal(&c->flush_cond);
	}
}

/* Send the queued releases now rather than in FLUSH_DELAY_MS (the relreq
 * callback sends what came meanwhile). Called with c->lock held. */
static void flush_now(struct ldr_attachment *a)
{
	if (a->nrel && !a->detached && !a->c->disconnected && a->relreq.open &&
	    a->relreq.state == REQ_IDLE)
		req_send(a, &a->relreq, 0);
}

/* A pristine range of @slot for a new view, or NULL. Called with c->lock held. */
static uint8_t *spare_pop(struct amap *m, uint32_t slot)
{
	struct spare *sp = m->spare[slot];
	uint8_t *p;

	if (!sp)
		return NULL;
	m->spare[slot] = sp->next;
	p = sp->addr;
	free(sp);
	return p;
}

/* Called with c->lock held. Without memory the range just stays mapped. */
static void spare_push(struct amap *m, uint32_t slot, uint8_t *addr)
{
	struct spare *sp = malloc(sizeof(*sp));

	if (!sp)
		return;
	sp->addr = addr;
	sp->next = m->spare[slot];
	m->spare[slot] = sp;
}

/*
 * Keep @b: the pages of the fields in @mask become private at the batch's
 * addresses (slabmap_keep), slot b->slot is served from another view from now
 * on, and the lease goes back (@release; ldr_detach drops them all at once).
 * A batch of a retired mapping (its daemon is gone) has no lease and its slot
 * no future. Called with c->lock held, which it drops during the copy;
 * b->busy makes ldr_release() of @b from another thread wait meanwhile.
 */
static int keep_locked(struct ldr_attachment *a, struct ldr_batch *b, uint64_t mask, bool release)
{
	struct ldr_client *c = a->c;
	struct amap *m = b->map;
	struct slabmap_range rs[MAX_FIELDS];
	uint64_t off = (uint64_t)b->slot * a->slot_bytes;
	uint8_t *view = NULL;
	bool need_view, fresh = false;
	size_t copied = 0;
	int n = 0, how;

	while (b->busy)
		pthread_cond_wait(&c->cond, &c->lock);
	if (b->kept)
		return 0;
	if (a->dev)
		return set_err(-ENOTSUP, "a batch in CUDA device memory cannot be kept: copy (clone) it "
		               "and release it instead");
	if (!a->cow)
		return set_err(-ENOTSUP, "batches of this pipeline cannot be kept: its slots of %" PRIu64
		               " bytes are not whole pages of %zu bytes", a->slot_bytes, slabmap_page());
	/* a fresh view needs room in m->views before the lock goes */
	if (m->nviews == m->viewcap) {
		size_t cap = m->viewcap ? m->viewcap * 2 : 8;
		void **v = realloc(m->views, cap * sizeof(*v));
		if (!v)
			return set_err(-ENOMEM, "out of memory");
		m->views = v;
		m->viewcap = cap;
	}
	for (int f = 0; f < a->nfields && f < 64; f++)
		if (mask & (1ULL << f)) {
			rs[n].off = a->fields[f].offset;
			rs[n].len = a->fields[f].sample_bytes * b->rows;
			n++;
		}
	/* after detach (or a restart) no batch comes any more in this mapping:
	 * the slot needs no other view */
	need_view = !a->detached && m == a->map && m->slotaddr[b->slot] == b->data;
	if (need_view)
		view = spare_pop(m, b->slot);
	b->busy = true;
	pthread_mutex_unlock(&c->lock);
	how = 0;
	if (need_view && !view) {
		view = slabmap_map(m->fd, a->slot_bytes, off);
		fresh = view != NULL;
		if (!view)
			how = -errno;
	}
	if (how == 0)
		how = slabmap_keep(b->data, a->slot_bytes, rs, n, &copied);
	pthread_mutex_lock(&c->lock);
	if (fresh)
		m->views[m->nviews++] = view;
	b->busy = false;
	pthread_cond_broadcast(&c->cond);
	if (how < 0) {
		if (view)
			spare_push(m, b->slot, view);
		return set_err(how, "cannot keep the batch (epoch %" PRIu64 ", index %" PRIu64 "): %s",
		               b->epoch, b->index, strerror(-how));
	}
	/* the daemon may have restarted while the lock was dropped */
	if (need_view && m == a->map)
		m->slotaddr[b->slot] = view;
	else if (need_view)
		spare_push(m, b->slot, view);
	b->kept = how;
	held_del(a, b);
	a->kept_batches++;
	a->kept_bytes += copied;
	if (release && m == a->map)
		queue_release(a, b->lease);
	return 0;
}

int ldr_batch_keep(struct ldr_batch *b, uint64_t field_mask)
{
	struct ldr_attachment *a = b->att;
	struct ldr_client *c = a->c;
	int r;

	CHECK_PID(c);
	pthread_mutex_lock(&c->lock);
	r = keep_locked(a, b, field_mask, true);
	pthread_mutex_unlock(&c->lock);
	return r;
}

int ldr_batch_is_kept(const struct ldr_batch *b)
{
	struct ldr_client *c = b->att->c;
	int r;

	pthread_mutex_lock(&c->lock);
	r = b->kept != 0;
	pthread_mutex_unlock(&c->lock);
	return r;
}

int ldr_attachment_kept(const struct ldr_attachment *a, uint64_t *batches, uint64_t *bytes)
{
	struct ldr_client *c = a->c;

	pthread_mutex_lock(&c->lock);
	if (batches)
		*batches = a->kept_batches;
	if (bytes)
		*bytes = a->kept_bytes;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

uint32_t ldr_attachment_share(const struct ldr_attachment *a)
{
	struct ldr_client *c = a->c;
	uint32_t s;

	pthread_mutex_lock(&c->lock);
	s = share_now(a);
	pthread_mutex_unlock(&c->lock);
	return s;
}

uint32_t ldr_attachment_held(const struct ldr_attachment *a)
{
	struct ldr_client *c = a->c;
	uint32_t n;

	pthread_mutex_lock(&c->lock);
	n = a->nheld;
	pthread_mutex_unlock(&c->lock);
	return n;
}

/*
 * The trainer holds its whole share and nothing is on its way: no batch can
 * come until it gives one back. Keep the oldest it holds (a copy each) until
 * it holds share - 1, and send their releases at once. Called with c->lock
 * held (dropped while copying).
 */
static int make_room(struct ldr_attachment *a)
{
	uint32_t share = share_now(a);
	int r = 0;

	if (a->dev || !a->cow)
		return set_err(-ENOBUFS, "this process holds %u batches of the pipeline, its share of "
		               "the %u slots, and %s: release batches before asking for more, or give "
		               "the pipeline a larger prefetch", a->nheld, a->nslots,
		               a->dev ? "batches in CUDA device memory cannot be kept (copied)"
		                      : "this pipeline's slots are not whole pages, so they cannot be kept");
	while (a->held_head && a->nheld >= share) {
		r = keep_locked(a, a->held_head, ~(uint64_t)0, true);
		if (r < 0)
			break;
	}
	flush_now(a);
	return r;
}

int ldr_next(struct ldr_attachment *a, int timeout_ms, struct ldr_batch **out)
{
	struct ldr_client *c = a->c;
	struct timespec deadline = { 0 };
	struct ldr_batch *b;
	uint64_t t0 = mono_ns();
	int r = 0;

	CHECK_PID(c);
	if (a->detached)
		return set_err(-EBADF, "attachment is detached");
	b = calloc(1, sizeof(*b));
	if (!b)
		return set_err(-ENOMEM, "out of memory");
	if (timeout_ms >= 0)
		deadline_after(&deadline, timeout_ms);
	pthread_mutex_lock(&c->lock);
	stats_enter(a, t0);
	for (;;) {
		struct arrived *ar = &a->ring[a->next_seq % MAX_INFLIGHT];
		/* the daemon went away: what arrived from it is discarded when
		 * the attachment follows it (reattach()), so nothing is taken
		 * meanwhile; wait (within the timeout) */
		if (c->reconnecting && !a->lost) {
			r = wait_connected(c, timeout_ms < 0 ? NULL : &deadline);
			if (r == -ETIMEDOUT) {
				r = set_err(r, "no batch within %d ms: the daemon at %s went away, and libloader "
				            "is reconnecting", timeout_ms, c->path);
				break;
			}
			continue;
		}
		if (ar->present) {
			ar->present = false;
			a->next_seq++;
			a->arrived--;
			if (ar->kind == LOADERD__REPLY__BODY_BATCHES) {
				b->att = a;
				b->lease = ar->lease;
				b->epoch = ar->epoch;
				b->index = ar->index;
				b->slot = ar->slot;
				b->rows = ar->rows;
				if (b->slot >= a->nslots || b->rows > a->batch_size) {
					a->err = -EPROTO;
					snprintf(a->errmsg, sizeof(a->errmsg), "batch descriptor out of range");
					continue;
				}
				b->data = a->map->slotaddr[b->slot];
				b->map = a->map;
				b->map->refs++;
				held_add(a, b);
				a->pos_epoch = b->epoch;
				a->pos_batch = b->index + 1;
				if (a->pos_batch >= a->bpe) {
					a->pos_epoch++;
					a->pos_batch = 0;
				}
				if (needs_top_up(a))
					want_top_up(a);
				atomic_fetch_add(&a->refs, 1);
				*out = b;
				b = NULL;
				r = 0;
				break;
			}
			if (ar->kind == LOADERD__REPLY__BODY_END) {
				a->ended = true;
				continue;
			}
			/* an error answering this request: report it once, then go on */
			r = set_err(ar->err, "%s", ar->msg ? ar->msg : error_name(ar->err));
			free(ar->msg);
			ar->msg = NULL;
			if (needs_top_up(a))
				want_top_up(a);
			break;
		}
		if (a->ended) {
			r = LDR_EOF;
			break;
		}
		if (a->err) {
			r = set_err(a->err, "%s", a->errmsg[0] ? a->errmsg : error_name(a->err));
			break;
		}
		if (c->disconnected) {
			r = disconnected_err(c);
			break;
		}
		if (a->arrived == 0 && a->nheld >= share_now(a)) {
			if ((r = make_room(a)) < 0)
				break;
			continue; /* the lock was dropped: look again */
		}
		top_up(a); /* in case a send failed earlier */
		/* in slices of STATS_LIVE_MS, so that a long wait is reported */
		struct timespec slice;
		deadline_after(&slice, STATS_LIVE_MS);
		bool last = timeout_ms >= 0 && (deadline.tv_sec < slice.tv_sec ||
		            (deadline.tv_sec == slice.tv_sec && deadline.tv_nsec <= slice.tv_nsec));
		if (pthread_cond_timedwait(&c->cond, &c->lock, last ? &deadline : &slice) == ETIMEDOUT) {
			if (last) {
				r = set_err(-ETIMEDOUT, "no batch within %d ms", timeout_ms);
				break;
			}
			stats_live(a, mono_ns());
		}
	}
	stats_leave(a, t0, r);
	pthread_mutex_unlock(&c->lock);
	free(b);
	return r;
}

/*
 * The trainer is done with @b (c->lock not held). Its slot's written pages
 * are discarded before the lease goes back, so the next batch in that slot
 * reads the daemon's bytes; a kept batch's range instead becomes a pristine
 * view of its slot again, for a later keep.
 */
static void batch_done(struct ldr_batch *b, bool give_lease)
{
	struct ldr_attachment *a = b->att;
	struct ldr_client *c = a->c;
	struct amap *m = b->map;
	uint64_t off = (uint64_t)b->slot * a->slot_bytes;
	bool idle;
	int kept;

	pthread_mutex_lock(&c->lock);
	while (b->busy)
		pthread_cond_wait(&c->cond, &c->lock);
	held_del(a, b);
	kept = b->kept;
	/* detached, or from a daemon that is gone (its mapping goes with
	 * its last batch): no lease to give, no slot to reuse */
	idle = a->detached || m != a->map;
	pthread_mutex_unlock(&c->lock);
	if (kept) {
		/* the copy's memory goes now, however long the mapping stays */
		if (slabmap_unkeep(b->data, a->slot_bytes, kept, m->fd, off) == 0) {
			pthread_mutex_lock(&c->lock);
			spare_push(m, b->slot, b->data);
			pthread_mutex_unlock(&c->lock);
		}
		return;
	}
	if (idle)
		return;
	if (a->cow)
		slabmap_discard(b->data, a->slot_bytes, m->fd, off, NULL);
	if (give_lease) {
		pthread_mutex_lock(&c->lock);
		if (m == a->map)
			queue_release(a, b->lease);
		pthread_mutex_unlock(&c->lock);
	}
}

/* Free @b, done with: its mapping and attachment lose a reference. */
static void batch_free(struct ldr_batch *b)
{
	struct ldr_attachment *a = b->att;
	struct ldr_client *c = a->c;

	if (c->pid == getpid()) {
		pthread_mutex_lock(&c->lock);
		amap_put(a, b->map);
		pthread_mutex_unlock(&c->lock);
	}
	free(b);
	att_unref(a);
}

void ldr_release(struct ldr_batch *b)
{
	struct ldr_attachment *a;

	if (!b)
		return;
	a = b->att;
	if (a->c->pid == getpid())
		batch_done(b, true);
	batch_free(b);
}

/* The waiter of a CUDA attachment: leases go back once their events completed. */
static void *waiter_main(void *arg)
{
	struct ldr_attachment *a = arg;
	struct ldr_client *c = a->c;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		struct evwait *w;

		while (!a->ev_head && !a->waiter_stop)
			pthread_cond_wait(&a->ev_cond, &c->lock);
		if (!(w = a->ev_head))
			break;
		a->ev_head = w->next;
		if (!a->ev_head)
			a->ev_tail = NULL;
		pthread_mutex_unlock(&c->lock);
		devmap_wait(a->dev, w->event);
		pthread_mutex_lock(&c->lock);
		queue_release(a, w->lease);
		free(w);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

void ldr_release_after(struct ldr_batch *b, void *cuda_stream)
{
	struct ldr_attachment *a;
	struct ldr_client *c;
	struct evwait *w;
	bool queued = false;
	char err[256];
	void *ev;

	if (!b)
		return;
	a = b->att;
	c = a->c;
	if (!a->dev || c->pid != getpid()) {
		ldr_release(b);
		return;
	}
	ev = devmap_record(a->dev, cuda_stream, err, sizeof(err));
	if (!ev) {
		/* a context that cannot record an event has stopped running work */
		ldr_release(b);
		return;
	}
	/* the host copy is not the device's: its pages can go now */
	batch_done(b, false);
	w = calloc(1, sizeof(*w));
	pthread_mutex_lock(&c->lock);
	if (w && !a->detached && !a->waiter_running && pthread_create(&a->waiter, NULL, waiter_main, a) == 0)
		a->waiter_running = true;
	if (w && !a->detached && a->waiter_running) {
		w->lease = b->lease;
		w->event = ev;
		if (a->ev_tail)
			a->ev_tail->next = w;
		else
			a->ev_head = w;
		a->ev_tail = w;
		pthread_cond_signal(&a->ev_cond);
		queued = true;
	}
	pthread_mutex_unlock(&c->lock);
	if (!queued) {
		/* detached (this may be the last reference: the slab is unmapped
		 * right after), or no thread to wait with: wait here */
		free(w);
		devmap_wait(a->dev, ev);
		ldr_release(b);
		return;
	}
	batch_free(b);
}

uint64_t ldr_batch_epoch(const struct ldr_batch *b)
{
	return b->epoch;
}

uint64_t ldr_batch_index(const struct ldr_batch *b)
{
	return b->index;
}

uint32_t ldr_batch_rows(const struct ldr_batch *b)
{
	return b->rows;
}

int ldr_batch_nfields(const struct ldr_batch *b)
{
	return b->att->nfields;
}

int ldr_batch_field(const struct ldr_batch *b, int i, struct ldr_field *out)
{
	const struct ldr_attachment *a = b->att;
	const struct afield *f;

	if (i < 0 || i >= a->nfields)
		return set_err(-EINVAL, "field %d: the batch has %d fields", i, a->nfields);
	f = &a->fields[i];
	out->name = f->name;
	out->dtype = f->dtype;
	out->ndim = f->ndim + 1;
	out->shape[0] = b->rows;
	for (int d = 0; d < f->ndim; d++)
		out->shape[d + 1] = f->shape[d];
	if (a->dev)
		out->data = (void *)(uintptr_t)(devmap_base(a->dev) + (uint64_t)b->slot * a->dstride + f->offset);
	else
		out->data = b->data + f->offset;
	out->nbytes = (size_t)(f->sample_bytes * b->rows);
	return 0;
}

int ldr_batch_field_host(const struct ldr_batch *b, int i, struct ldr_field *out)
{
	int r = ldr_batch_field(b, i, out);

	if (r == 0)
		out->data = b->data + b->att->fields[i].offset;
	return r;
}

/* The attachment's keeping counters into @info, under c->lock. */
static void info_counters(const struct ldr_attachment *a, struct ldr_batch_info *info)
{
	struct ldr_client *c = a->c;

	pthread_mutex_lock(&c->lock);
	info->held = a->nheld;
	info->share = share_now(a);
	info->kept_batches = a->kept_batches;
	info->kept_bytes = a->kept_bytes;
	pthread_mutex_unlock(&c->lock);
	info->nfields = a->nfields;
}

int ldr_batch_describe(const struct ldr_batch *b, struct ldr_batch_info *info,
                       struct ldr_field *fields, int nfields)
{
	const struct ldr_attachment *a = b->att;

	if (nfields < 0 || nfields > a->nfields || (nfields && !fields))
		return set_err(-EINVAL, "describe %d fields: the batch has %d", nfields, a->nfields);
	info_counters(a, info);
	info->epoch = b->epoch;
	info->index = b->index;
	info->rows = b->rows;
	for (int i = 0; i < nfields; i++)
		ldr_batch_field(b, i, &fields[i]);
	return 0;
}

int ldr_next_described(struct ldr_attachment *a, int timeout_ms, struct ldr_batch **out,
                       struct ldr_batch_info *info, struct ldr_field *fields, int nfields)
{
	int r;

	if (nfields < 0 || nfields > a->nfields || (nfields && !fields))
		return set_err(-EINVAL, "describe %d fields: the attachment has %d", nfields, a->nfields);
	r = ldr_next(a, timeout_ms, out);
	if (r == 0)
		return ldr_batch_describe(*out, info, fields, nfields);
	if (a->c->pid == getpid())
		info_counters(a, info);
	return r;
}

enum ldr_device_kind ldr_attachment_device(const struct ldr_attachment *a, int *index)
{
	if (index)
		*index = a->device_kind == LDR_DEVICE_CUDA ? a->device_index : -1;
	return a->device_kind;
}

int ldr_detach(struct ldr_attachment *a)
{
	struct ldr_client *c;
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Detach det = LOADERD__DETACH__INIT;
	Loaderd__Reply *rep;
	struct ldr_attachment **pp;
	struct timespec deadline;
	int r = 0;

	if (!a)
		return 0;
	c = a->c;
	CHECK_PID(c);
	pthread_mutex_lock(&c->lock);
	bool was_detached = a->detached;
	a->detached = true; /* nothing more goes out for it */
	/* The batches still held stay valid and unchanged: the daemon reuses
	 * their slots once we are gone. Their leases go with the attachment. */
	if (!a->dev && a->cow && !was_detached) {
		char keep[sizeof(tls_err)];
		memcpy(keep, tls_err, sizeof(keep));
		for (;;) {
			struct ldr_batch *b = a->held_head;
			while (b && b->keep_failed)
				b = b->next;
			if (!b)
				break;
			if (keep_locked(a, b, ~(uint64_t)0, false) < 0)
				b->keep_failed = true;
		}
		memcpy(tls_err, keep, sizeof(keep));
	}
	bool disc = c->disconnected; /* or reconnecting: it went with the old daemon */
	bool lost = a->lost;
	pthread_mutex_unlock(&c->lock);
	if (!disc && !lost) {
		det.attach_id = a->id;
		req.body_case = LOADERD__REQUEST__BODY_DETACH;
		req.detach = &det;
		r = call(c, &req, &rep, LOADERD__REPLY__BODY_OK);
		if (r == 0)
			loaderd__reply__free_unpacked(rep, NULL);
	}
	/* the daemon answers every parked Next of a detached attachment */
	deadline_after(&deadline, 5000);
	pthread_mutex_lock(&c->lock);
	while (a->outstanding > 0 && !c->disconnected && r == 0)
		if (pthread_cond_timedwait(&c->cond, &c->lock, &deadline) == ETIMEDOUT)
			break;
	for (pp = &c->atts; *pp; pp = &(*pp)->next)
		if (*pp == a) {
			*pp = a->next;
			break;
		}
	pthread_mutex_unlock(&c->lock);
	for (int i = 0; i < a->inflight; i++)
		req_close(&a->reqs[i]);
	req_close(&a->relreq);
	req_close(&a->watch);
	att_unref(a);
	return r == LDR_EDISCONNECTED ? 0 : r;
}

void ldr_close(struct ldr_client *c)
{
	if (!c)
		return;
	if (c->pid != getpid())
		return; /* nng state of the parent: leave it alone */
	/* a reconnection going on gives up at its next step */
	pthread_mutex_lock(&c->lock);
	c->closing = true;
	for (struct sync_call *sc = c->sync_calls; sc; sc = sc->next)
		nng_aio_cancel(sc->aio);
	pthread_cond_broadcast(&c->flush_cond);
	pthread_mutex_unlock(&c->lock);
	while (c->atts)
		ldr_detach(c->atts);
	if (c->flusher_running) {
		pthread_mutex_lock(&c->lock);
		c->flusher_stop = true;
		pthread_cond_signal(&c->flush_cond);
		pthread_mutex_unlock(&c->lock);
		pthread_join(c->flusher, NULL);
		c->flusher_running = false;
	}
	if (!nng_close_within(c->sock, CLOSE_WAIT_MS))
		return; /* nng is stuck on a dead peer: leave it, and c, to the exit */
	/* batches still alive hold their attachments, and these the client:
	 * the last of them frees it */
	client_unref(c);
}

/* --- reconnecting to a restarted daemon ---------------------------------- */

static double ms_since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) * 1000.0 + (double)(now.tv_nsec - t0->tv_nsec) / 1e6;
}

/* Tell the daemon we do not use attachment @id after all. */
static void detach_id(struct ldr_client *c, uint64_t id)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Detach det = LOADERD__DETACH__INIT;
	Loaderd__Reply *rep;
	char keep[sizeof(tls_err)];

	det.attach_id = id;
	req.body_case = LOADERD__REQUEST__BODY_DETACH;
	req.detach = &det;
	memcpy(keep, tls_err, sizeof(keep));
	if (call_gen(c, &req, &rep, LOADERD__REPLY__BODY_OK, CALL_TIMEOUT_MS, true) == 0)
		loaderd__reply__free_unpacked(rep, NULL);
	memcpy(tls_err, keep, sizeof(keep));
}

/* Drop what arrived from the old daemon and was not taken. Called with c->lock held. */
static void ring_clear(struct ldr_attachment *a)
{
	for (int i = 0; i < MAX_INFLIGHT; i++) {
		free(a->ring[i].msg);
		memset(&a->ring[i], 0, sizeof(a->ring[i]));
	}
	a->arrived = 0;
}

/* @a cannot follow the daemon: its next() says why from now on. Called with c->lock held. */
static void att_lose(struct ldr_attachment *a, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void att_lose(struct ldr_attachment *a, int err, const char *fmt, ...)
{
	va_list ap;

	a->lost = true;
	a->err = err;
	ring_clear(a); /* the trainer gets the error at its next batch */
	va_start(ap, fmt);
	vsnprintf(a->errmsg, sizeof(a->errmsg), fmt, ap);
	va_end(ap);
}

/* Would the re-attached pipeline deliver the same batches into the same layout? */
static bool same_layout(const struct ldr_attachment *a, const struct ldr_attachment *n)
{
	if (a->nfields != n->nfields || a->slot_bytes != n->slot_bytes || a->batch_size != n->batch_size ||
	    a->bpe != n->bpe || a->epochs != n->epochs || a->samples != n->samples)
		return false;
	return memcmp(a->fields, n->fields, sizeof(a->fields[0]) * (size_t)a->nfields) == 0;
}

/* Wait (bounded) until on_pipe_rem()'s cancellations came back. Called with c->lock held. */
static void wait_requests_idle(struct ldr_attachment *a)
{
	struct timespec deadline;

	deadline_after(&deadline, REATTACH_IDLE_MS);
	for (;;) {
		bool busy = a->relreq.state != REQ_IDLE || a->watch.state != REQ_IDLE;
		for (int i = 0; i < a->inflight; i++)
			busy = busy || a->reqs[i].state != REQ_IDLE;
		if (!busy || pthread_cond_timedwait(&a->c->cond, &a->c->lock, &deadline) == ETIMEDOUT)
			return;
	}
}

/*
 * Start @a again on the new daemon with @n's attachment (its mapping @m): what
 * arrived from the old daemon and was not taken is dropped (it comes again),
 * what the trainer holds stays in the old mapping without its leases, which
 * went with the old daemon. Called with c->lock held.
 */
static void att_restart(struct ldr_attachment *a, const struct ldr_attachment *n, struct amap *m)
{
	while (a->held_head)
		held_del(a, a->held_head);
	ring_clear(a);
	a->next_seq = 0;
	a->outstanding = a->requested = 0;
	a->nrel = 0;
	a->rv_pending = a->has_ret = a->watching = false;
	a->nret = 0;
	a->ended = false;
	a->err = 0;
	a->errmsg[0] = '\0';
	a->id = n->id;
	a->share = n->share;
	a->share_seq = 0;
	a->nslots = n->nslots;
	amap_put(a, a->map);
	a->map = m;
	/* TrainerStats are totals since the attach: the new daemon's start at 0
	 * (a wait in progress goes on, and is its) */
	a->st_wait_ns = a->st_compute_ns = a->st_calls = 0;
	memset(a->st_buckets, 0, sizeof(a->st_buckets));
	a->st_sent_ns = a->st_sent_calls = 0;
}

/*
 * Attach @a again, at the next batch its trainer has not taken: partition
 * with its start; broadcast as the private stream of identical content
 * (partition rank 0 of 1) from there; dynamic where the new daemon's dynamic
 * stream is. @where receives "epoch E batch B". Return: 0 (done, or @a lost
 * for a reason of its own), LDR_EDISCONNECTED when the new connection went
 * too (reconnect_run() starts over).
 */
static int reattach(struct ldr_client *c, struct ldr_attachment *a, char *where, size_t wsize)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Attach at = LOADERD__ATTACH__INIT;
	Loaderd__Reply *rep;
	struct ldr_attachment *n;
	struct amap *m = NULL;
	uint64_t size = 0, dev_size = 0;
	int r, fd, dev_fd = -1;

	*where = '\0';
	pthread_mutex_lock(&c->lock);
	if (a->detached || a->lost) {
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	if (a->dev) {
		att_lose(a, LDR_EDISCONNECTED, "the daemon at %s restarted, and an attachment in CUDA "
		         "device memory does not follow it (the device slab was the old daemon's): "
		         "attach pipeline '%s' again", c->path, a->pipeline);
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	wait_requests_idle(a);
	at.pipeline = a->pipeline;
	at.mode = (Loaderd__Mode)a->opts.mode;
	at.rank = a->opts.rank;
	at.world_size = a->opts.world_size;
	at.credits = (uint32_t)a->inflight;
	if (a->opts.mode != LDR_MODE_DYNAMIC) {
		at.mode = LOADERD__MODE__PARTITION;
		if (a->opts.mode == LDR_MODE_BROADCAST) {
			at.rank = 0;
			at.world_size = 1;
		}
		at.has_start = true;
		at.start_epoch = a->pos_epoch;
		at.start_batch = a->pos_batch;
		snprintf(where, wsize, "epoch %" PRIu64 " batch %" PRIu64, a->pos_epoch, a->pos_batch);
	} else {
		snprintf(where, wsize, "the dynamic stream's next batch");
	}
	pthread_mutex_unlock(&c->lock);

	req.body_case = LOADERD__REQUEST__BODY_ATTACH;
	req.attach = &at;
	r = call_gen(c, &req, &rep, LOADERD__REPLY__BODY_ATTACH, CALL_TIMEOUT_MS, true);
	if (r == LDR_EDISCONNECTED || r == -ETIMEDOUT)
		return LDR_EDISCONNECTED;
	if (r < 0) {
		pthread_mutex_lock(&c->lock);
		att_lose(a, r, "the daemon at %s restarted, and attaching to pipeline '%s' again at %s "
		         "failed: %s%s", c->path, a->pipeline, where, tls_err,
		         r == -EAGAIN ? " (a pipeline of your own Python Dataset does not follow a restart: "
		                        "its workers' host ended with the old daemon; create the loader "
		                        "again)" : "");
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	n = calloc(1, sizeof(*n));
	if (!n) {
		r = set_err(-ENOMEM, "out of memory");
	} else if ((r = att_read_reply(n, rep->attach)) == 0 && !same_layout(a, n)) {
		r = set_err(-ESTALE, "the pipeline's layout or length changed (%" PRIu64 " batches of %u per "
		            "epoch, %" PRIu64 " epochs, %d fields; now %" PRIu64 " of %u, %" PRIu64 ", %d)",
		            a->bpe, a->batch_size, a->epochs, a->nfields, n->bpe, n->batch_size, n->epochs,
		            n->nfields);
	} else if (r == 0) {
		const Loaderd__AttachReply *ar = rep->attach;
		fd = fetch_slab_fd(ar->fd_path, ar->fd_token.data, ar->fd_token.len, &size, &dev_fd, &dev_size);
		if (dev_fd >= 0)
			close(dev_fd);
		if (fd < 0) {
			r = fd;
		} else if (size != ar->slab_bytes || size < (uint64_t)n->nslots * n->slot_bytes) {
			close(fd);
			r = set_err(-EPROTO, "slab size mismatch");
		} else if (!(m = amap_open(fd, size, n->nslots, n->slot_bytes, a->cow))) {
			r = set_err(-errno, "cannot map the slab: %s", strerror(errno));
			close(fd);
		}
	}
	loaderd__reply__free_unpacked(rep, NULL);
	pthread_mutex_lock(&c->lock);
	if (r == 0 && a->detached) {
		pthread_mutex_unlock(&c->lock);
		detach_id(c, n->id); /* detached meanwhile */
		amap_free(m, n->slot_bytes);
		free(n);
		return 0;
	}
	if (r < 0)
		att_lose(a, r, "the daemon at %s restarted, and pipeline '%s' could not be attached again "
		         "at %s: %s", c->path, a->pipeline, where, tls_err);
	else
		att_restart(a, n, m);
	pthread_mutex_unlock(&c->lock);
	if (r < 0 && n && n->id)
		detach_id(c, n->id);
	free(n);
	return 0;
}

/* Create again each pipeline this client created; a failure shows at attach. */
static int recreate_pipelines(struct ldr_client *c)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__CreatePipeline cp = LOADERD__CREATE_PIPELINE__INIT;
	Loaderd__Reply *rep;
	char name[LDR_NAME_MAX + 1];
	char *json;
	int r;

	for (size_t i = 0;; i++) {
		struct spec_rec *sr;
		size_t j = 0;
		pthread_mutex_lock(&c->lock);
		for (sr = c->specs; sr && j < i; sr = sr->next)
			j++;
		json = sr ? strdup(sr->json) : NULL;
		if (sr)
			snprintf(name, sizeof(name), "%s", sr->name);
		pthread_mutex_unlock(&c->lock);
		if (!sr)
			return 0;
		if (!json)
			continue;
		cp.spec_json = json;
		cp.exist_ok = true;
		req.body_case = LOADERD__REQUEST__BODY_CREATE;
		req.create = &cp;
		r = call_gen(c, &req, &rep, LOADERD__REPLY__BODY_CREATE, CALL_TIMEOUT_MS, true);
		free(json);
		if (r == LDR_EDISCONNECTED || r == -ETIMEDOUT)
			return LDR_EDISCONNECTED;
		if (r < 0)
			fprintf(stderr, "loaderd: cannot create pipeline '%s' again in the restarted daemon at "
			        "%s: %s\n", name, c->path, tls_err);
		else
			loaderd__reply__free_unpacked(rep, NULL);
	}
}

/*
 * After the Hello on the new connection: pipelines, then attachments. Return 0,
 * or LDR_EDISCONNECTED when that connection went too.
 */
static int restore(struct ldr_client *c, char *report, size_t rsize)
{
	struct ldr_attachment **v = NULL;
	size_t nv = 0, len = 0;
	char where[96];
	int r;

	if ((r = recreate_pipelines(c)) < 0)
		return r;
	pthread_mutex_lock(&c->lock);
	for (struct ldr_attachment *a = c->atts; a; a = a->next)
		nv++;
	v = calloc(nv ? nv : 1, sizeof(*v));
	nv = 0;
	for (struct ldr_attachment *a = c->atts; a && v; a = a->next) {
		atomic_fetch_add(&a->refs, 1); /* a detach meanwhile does not free it */
		v[nv++] = a;
	}
	pthread_mutex_unlock(&c->lock);
	if (!v)
		return LDR_EDISCONNECTED; /* out of memory: try again */
	report[0] = '\0';
	for (size_t i = 0; i < nv && r == 0; i++) {
		pthread_mutex_lock(&c->lock);
		bool closing = c->closing;
		pthread_mutex_unlock(&c->lock);
		if (closing) {
			r = LDR_EDISCONNECTED; /* reconnect_run() ends */
			break;
		}
		r = reattach(c, v[i], where, sizeof(where));
		pthread_mutex_lock(&c->lock);
		if (r == 0 && len < rsize && !v[i]->detached)
			len += (size_t)snprintf(report + len, rsize - len, "; attachment %" PRIu64 " (pipeline '%s') %s%s",
			                        v[i]->id, v[i]->pipeline, v[i]->lost ? "lost: " : "re-attached at ",
			                        v[i]->lost ? v[i]->errmsg : where);
		pthread_mutex_unlock(&c->lock);
	}
	for (size_t i = 0; i < nv; i++)
		att_unref(v[i]);
	free(v);
	return r;
}

/* Wait @ms between attempts, or until ldr_close() begins. */
static void reconnect_pause(struct ldr_client *c, int ms)
{
	struct timespec deadline;

	deadline_after(&deadline, ms);
	pthread_mutex_lock(&c->lock);
	while (!c->closing && pthread_cond_timedwait(&c->flush_cond, &c->lock, &deadline) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&c->lock);
}

/*
 * The flusher's work when the connection went (on_pipe_rem()): the dialer
 * redials by itself (every RECONNECT_MIN_MS, doubling up to RECONNECT_MAX_MS);
 * each Hello waits for its connection. Once one is answered, restore() follows
 * the new daemon; until c->reconnect_ms passed, when calls and next() fail.
 */
static void reconnect_run(struct ldr_client *c)
{
	char report[2048], last[512] = "no answer";
	int pause_ms = RECONNECT_MIN_MS, r;
	struct timespec t0;
	double limit;

	pthread_mutex_lock(&c->lock);
	t0 = c->went_at;
	limit = c->reconnect_ms;
	pthread_mutex_unlock(&c->lock);
	fprintf(stderr, "loaderd: the daemon at %s went away; reconnecting for up to %.3g s\n", c->path,
	        limit / 1000.0);
	for (;;) {
		double left = limit - ms_since(&t0);
		pthread_mutex_lock(&c->lock);
		bool closing = c->closing;
		pthread_mutex_unlock(&c->lock);
		if (closing || left <= 0)
			break;
		r = hello_call(c, left < RECONNECT_MAX_MS ? (int)left + 1 : RECONNECT_MAX_MS, true);
		if (r == 0 && (r = restore(c, report, sizeof(report))) == 0) {
			pthread_mutex_lock(&c->lock);
			c->reconnects++;
			c->disconnected = false;
			c->daemon_stopping = false;
			c->reconnecting = false;
			for (struct ldr_attachment *a = c->atts; a; a = a->next) {
				top_up(a);
				if (a->watch.open && !a->lost && !a->detached && a->share &&
				    req_send(a, &a->watch, 0) == 0)
					a->watching = true;
			}
			pthread_cond_broadcast(&c->cond);
			pthread_mutex_unlock(&c->lock);
			fprintf(stderr, "loaderd: reconnected to the daemon at %s after %.1f s (client id %" PRIu64
			        ")%s\n", c->path, ms_since(&t0) / 1000.0, c->id, report);
			return;
		}
		if (r != -ETIMEDOUT)
			snprintf(last, sizeof(last), "%.400s", tls_err);
		if (r != -ETIMEDOUT && r != LDR_EDISCONNECTED) {
			/* the daemon answered, and refused: no use trying again */
			break;
		}
		if (r == LDR_EDISCONNECTED) {
			reconnect_pause(c, pause_ms);
			pause_ms = pause_ms * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS : pause_ms * 2;
		}
	}
	pthread_mutex_lock(&c->lock);
	bool closing = c->closing;
	snprintf(c->gone_msg, sizeof(c->gone_msg), "the client is closed");
	if (!closing)
		snprintf(c->gone_msg, sizeof(c->gone_msg), "disconnected from the daemon at %s: it went away "
		         "and libloader could not reconnect within %.3g s (reconnect timeout, "
		         "LOADERD_RECONNECT_TIMEOUT): %s", c->path, limit / 1000.0, last);
	c->reconnecting = false;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	if (!closing)
		fprintf(stderr, "loaderd: %s\n", c->gone_msg);
	/* no more redials of a daemon we gave up on */
	nng_dialer_close(c->dialer);
}
