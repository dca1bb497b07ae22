/* SPDX-License-Identifier: MIT */
/* libloader-private.h - what the files of libloader share (not installed)
 *
 * layer: client/libloader -> common include
 *
 * The client library is one concept a file (see the map in libloader.c);
 * this header holds the handles' structures and the functions one file
 * calls in another. Everything here is hidden (-fvisibility=hidden and
 * libloader.map export only ldr_*).
 *
 * Directions: libloader's files may include the public API (include/loader,
 * which they implement), common/ (the helpers and the wire formats it shares
 * with the daemon: bring.h, fdchan-wire.h, cudadrv.h, nngclose.h) and the
 * generated loader.pb-c.h; never the daemon's files, nor loaderctl's or the
 * Python package's, which sit above it. Inside, calls run one way, from the
 * entry points (ldr_*) down to the state they change: the declarations at
 * the end of this header go from the bottom up, and a file calls only the
 * sections above its own. A lower file that must have a higher one act
 * returns what it wants done (answer_revoke(), stats_live()) or signals a
 * condition variable (queue_release() wakes the flusher); it never calls up.
 */
#ifndef LOADERD_LIBLOADER_PRIVATE_H
#define LOADERD_LIBLOADER_PRIVATE_H

#include <errno.h>
#include <inttypes.h>
#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "bring.h"
#include "common.h"
#include "loader.pb-c.h"
#include "loader/loader.h"

struct devmap;

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
#define STATS_LIVE_MS 1000
#define STATS_EVERY_NS 100000000u /* a report goes out at most this often but for a Release's */        /* a long wait is reported while it lasts, this often (stats_live()) */

/* The thread's last error (set_err(), ldr_client_error()). */
extern __thread char tls_err[16384]; /* a Python worker's traceback fits */

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

struct old_ring {
	struct bring br;
	struct old_ring *next;
};

/* A chunk of a client_order attachment's order (ldr_order()), kept until
 * the trainer took its batches: a restarted daemon is given it again. */
struct order_rec {
	struct order_rec *next;
	uint64_t epoch, first;
	size_t nbatches, nindices;
	bool last;
	uint32_t *sizes;
	uint64_t *indices;
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
	struct ldr_attach_opts opts;  /* job: NULL, see job[] */
	char job[LDR_JOB_MAX + 1];    /* the job it attached as, "" the daemon's choice */
	uint64_t pos_epoch, pos_batch; /* the next batch the trainer has not taken */
	/* client_order (order.c): the chunks given, from the first the trainer
	 * has not taken whole; the position after its last batch taken (epoch,
	 * batch: not wrapped at the pipeline's epoch); and where the daemon
	 * expects the next chunk (as order.c in the daemon: open epoch or not) */
	struct order_rec *orders, **orders_tail;
	uint64_t opos_epoch, opos_batch;
	uint64_t onext_epoch, onext_batch;
	bool oopen;
	int failed_err;           /* the last failed batch ldr_next() reported (LDR_EBATCH) */
	uint64_t failed_epoch, failed_index;
	bool lost;                /* the daemon restarted and this attachment could not follow */
	bool has_owner;           /* what the first attach found, checked at a re-attach: */
	uid_t owner;              /* the pipeline's owner */
	uint64_t spec_hash;       /* and its spec (0: the daemon did not say) */
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
	uint64_t rv_ends;         /* its ends_from: Ends from there to rv_upto, 0: none */
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
	/* the batch ring (ring.c): deliveries and releases in shared memory */
	bool ringed;              /* delivered through it, not through Next */
	struct bring br;
	int ring_efd;             /* wakes the daemon's loop */
	struct old_ring *old_rings; /* the rings of daemons it followed away from (ring.c) */
	uint64_t next_seq;
	int outstanding;          /* Next requests in flight */
	int requested;            /* batches they asked for, together */
	int arrived;              /* deliveries received, not yet taken */
	bool ended;
	int err;
	char errmsg[16384];       /* the daemon's last error: may hold a traceback */
	uint64_t *rel;            /* releases to send: room for every slot (rel_reserve()) */
	size_t nrel, relcap;
	uint64_t rel_lost;        /* leases it could not queue (a daemon leasing a slot twice) */
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
	bool has_owner;           /* the daemon said whose it was */
	uid_t owner;              /* this client's uid when it created it; another when it joined */
};

/* The store keys this client last sent for a pipeline, as a hash (never the
 * keys): ldr_set_store()'s if_changed compares the process's keys with it. */
struct keys_sent {
	struct keys_sent *next;
	char name[LDR_NAME_MAX + 1];
	uint64_t fp;
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
	struct keys_sent *keys_sent; /* the store keys it last sent, per pipeline (control.c) */
	/* whose daemon (daemon_check(), docs/security.md "Whose pipeline, whose
	 * daemon"), under c->lock */
	bool has_service_uid;     /* loaderd's service user exists */
	uid_t service_uid;        /* $LOADERD_DAEMON_USER, else the user "loaderd" */
	bool has_daemon_uid;      /* a daemon was accepted: */
	uid_t daemon_uid;         /* its uid, which a reconnection must find again */
	char refused[1024];       /* why the last connection's daemon was refused, "" none */
	struct sync_call *sync_calls; /* every synchronous call in flight, cancelled on disconnect */
	pthread_t flusher;
	pthread_cond_t flush_cond;
	bool flusher_running;
	bool flush_wanted;
	bool topup_wanted;        /* some attachment's window has room */
	bool flusher_idle;        /* the flusher sleeps with nothing to do */
	bool flusher_stop;
};

/*
 * c->lock for an accessor that only reads. A forked child does not take it:
 * no other thread runs there, and one of the parent's may have held it at
 * the fork, so it would never come free; the child reads its copy as the
 * fork left it.
 */
static inline bool reader_lock(struct ldr_client *c)
{
	if (c->pid != self_pid())
		return false;
	pthread_mutex_lock(&c->lock);
	return true;
}

static inline void reader_unlock(struct ldr_client *c, bool locked)
{
	if (locked)
		pthread_mutex_unlock(&c->lock);
}

#define CHECK_PID(c)                                                          \
	do {                                                                  \
		if ((c)->pid != self_pid())                                     \
			return set_err(LDR_EFORKED, "%s", error_name(LDR_EFORKED)); \
	} while (0)

/*
 * The files' functions, from the bottom up: a file calls only the functions
 * of its own section and of the sections above it (slabmap.h and devmap.h,
 * the mappings, lie below them all), never one below. The files with no
 * section here (connect.c, control.c, order.c, cudawait.c, accessors.c)
 * are entry points only: nothing of the library calls them.
 */

/* libloader.c */
/*
 * The trainer's object-store credentials for a create whose spec has a
 * string that starts with s3://, https:// or http:// (a path in a store) (awscreds.c, docs/storage.md): *@ac filled and
 * @sc pointing into it, and 1; 0 when the spec names none; < 0 when the
 * files are wrong (tls_err set). store_creds_clear() wipes @ac after the call.
 */
struct awscreds;
int store_creds(const char *spec_json, struct awscreds *ac, Loaderd__StoreCredentials *sc);
void store_creds_clear(struct awscreds *ac);
/* Remember that the keys of @ac went to pipeline @name (a create, a SetStore). */
void keys_sent_note(struct ldr_client *c, const char *name, const struct awscreds *ac);

int set_err(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int set_err(int err, const char *fmt, ...);
int nng_to_errno(int rv);
void deadline_after(struct timespec *ts, int ms);

/* rpc.c */
int pack_msg(const Loaderd__Request *req, nng_msg **out);
int disconnected_err(const struct ldr_client *c);
int wait_connected(struct ldr_client *c, const struct timespec *deadline);
int call_gen(struct ldr_client *c, const Loaderd__Request *req, Loaderd__Reply **out,
                    Loaderd__Reply__BodyCase expect, int timeout_ms, bool internal);
int call(struct ldr_client *c, const Loaderd__Request *req, Loaderd__Reply **out,
                Loaderd__Reply__BodyCase expect);
/* call() on the connection that @cut counted: LDR_EDISCONNECTED, nothing
 * sent, once it went (a reconnection does not carry the call over). */
int call_on(struct ldr_client *c, const Loaderd__Request *req, Loaderd__Reply **out,
            Loaderd__Reply__BodyCase expect, uint64_t cut);

/* order.c: a client_order attachment's kept order. Called with c->lock held
 * but orders_give_again(). */
void orders_init(struct ldr_attachment *a);
void orders_taken(struct ldr_attachment *a, uint64_t epoch, uint64_t index);
void orders_first(const struct ldr_attachment *a, uint64_t *epoch, uint64_t *batch);
int orders_give_again(struct ldr_attachment *a);
void orders_free(struct ldr_attachment *a);
int json_call_timeout(struct ldr_client *c, Loaderd__Request *req, char **json_out,
                             int timeout_ms);
int json_call(struct ldr_client *c, Loaderd__Request *req, char **json_out);

/* whose.c */
/* "alice (uid 1001)", or "uid 1001" when the uid has no name */
const char *uid_name(uid_t uid, char *buf, size_t len);
/* c->service_uid from $LOADERD_DAEMON_USER (-EINVAL when it names nobody) */
int daemon_user_init(struct ldr_client *c);
/* check the daemon of every connection of c->sock as it comes */
int daemon_watch(struct ldr_client *c);
/* -EPERM naming why when the last connection's daemon was refused, else @r */
int daemon_refused(struct ldr_client *c, int r);

/* fdchan.c */
/* over @path, whose peer must be @daemon_uid */
int fetch_slab_fd(const char *path, uid_t daemon_uid, const uint8_t *token, size_t token_len,
                  uint64_t *size, int *dev_fd, uint64_t *dev_size, int *ring_fd, int *ring_efd);

/* amap.c */
struct amap *amap_open(int fd, size_t size, uint32_t nslots, uint64_t slot_bytes, bool cow);
void amap_free(struct amap *m, uint64_t slot_bytes);
void amap_put(struct ldr_attachment *a, struct amap *m);
uint8_t *spare_pop(struct amap *m, uint32_t slot);
void spare_push(struct amap *m, uint32_t slot, uint8_t *addr);

/* arrived.c */
void store_reply(struct ldr_attachment *a, const Loaderd__Reply *rep, int rv);

/* ring.c */
int ring_open(struct ldr_attachment *a, int fd, int efd, uint64_t bytes);
/* A new daemon's ring for @a (re-attached after a restart): @br mapped by
 * bring_map(), @efd its eventfd; the old ring stays mapped until ring_close()
 * (a ldr_next() may still sleep on it: it is woken). Called with c->lock. */
void ring_restart(struct ldr_attachment *a, const struct bring *br, int efd);
/* The old daemon's ring goes out of use (no new one). Called with c->lock. */
void ring_retire(struct ldr_attachment *a);
void ring_pull(struct ldr_attachment *a, bool all);
int ring_wait(struct ldr_attachment *a, int ms);
bool ring_release(struct ldr_attachment *a, uint64_t lease);
void ring_poke(struct ldr_attachment *a);
bool ring_stats_now(const struct ldr_attachment *a);
bool ring_stats_due(const struct ldr_attachment *a);
bool ring_has_stats(const struct ldr_attachment *a);
void ring_close(struct ldr_attachment *a);

/* stats.c */
Loaderd__TrainerStats *stats_report(struct ldr_attachment *a, Loaderd__TrainerStats *st,
                                           bool release);
void stats_enter(struct ldr_attachment *a, uint64_t t0);
/* true: a Release is due for the figures, the caller sends it */
bool stats_live(struct ldr_attachment *a, uint64_t now);
bool stats_leave(struct ldr_attachment *a, uint64_t t0, int r);

/* request.c */
int req_send(struct ldr_attachment *a, struct req *r, uint32_t ask);

/* release.c */
void queue_release(struct ldr_attachment *a, uint64_t lease);
/* Room for a release of every slot (what queue_release() may need), or -ENOMEM. */
int rel_reserve(struct ldr_attachment *a, uint32_t nslots);
void flush_now(struct ldr_attachment *a);

/* keep.c */
uint32_t share_now(const struct ldr_attachment *a);
void held_add(struct ldr_attachment *a, struct ldr_batch *b);
void held_del(struct ldr_attachment *a, struct ldr_batch *b);
int keep_locked(struct ldr_attachment *a, struct ldr_batch *b, uint64_t mask, bool release);
int make_room(struct ldr_attachment *a);

/* client.c */
struct ldr_client *client_alloc(pid_t self, const char *path, const char *name);
void client_free(struct ldr_client *c);
int hello_call(struct ldr_client *c, int timeout_ms, bool internal);
void client_unref(struct ldr_client *c);

/* revoke.c */
/* true: it answered, the caller tops the window up */
bool answer_revoke(struct ldr_attachment *a);
bool watch_reply(struct ldr_attachment *a, const Loaderd__Reply *rep, int rv);

/* window.c */
bool needs_top_up(const struct ldr_attachment *a);
void top_up(struct ldr_attachment *a);
void req_cb(void *arg);
void want_top_up(struct ldr_attachment *a);

/* attach.c */
int att_read_reply(struct ldr_attachment *a, const Loaderd__AttachReply *ar);
int att_tail_taken(bool asked, uint64_t position, const Loaderd__AttachReply *ar);
void att_unref(struct ldr_attachment *a);

/* attach.c: ask the daemon for a batch ring ($LOADERD_RING) */
bool ring_wanted(void);

/* next.c */
void batch_done(struct ldr_batch *b, bool give_lease);
void batch_free(struct ldr_batch *b);

/* reconnect.c */
void reconnect_run(struct ldr_client *c);

/* flusher.c */
void *flusher_main(void *arg);

#endif
