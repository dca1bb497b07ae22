/* SPDX-License-Identifier: MIT */
/* engine-private - what the engine's files share: pipelines, streams, slots, leases
 *
 * The engine (engine.h) is split by concept, and its files call one way,
 * bottom up as this header's sections list them (the state they share
 * first, then each file's functions):
 *
 *   slab.c, sampler.c, workers.c  the slab, the sampler, the worker threads
 *   holds.c · bounds.c            slabs clients still map; bounds per user
 *   order.c                       the batches a client gives its stream
 *   attring.c                     an attachment's batch ring
 *   pyw-conn.c · pyworkers.c      the Python workers: socket, then tasks
 *   stats.c                       stall accounting
 *   devcopy.c                     device copies
 *   stream.c                      a stream's ring, quota and production
 *   deliver.c                     parked requests, leases, answers
 *   slow.c                        a slow broadcast client
 *   sched.c                       reclaim, revoke, build: pipeline_update()
 *   attachment.c                  an attachment's requests, its leaving
 *   registry.c                    pipelines by name, access, lifetimes
 *   core.c                        engine_new(), completions, shutdown
 *   create.c · retire.c           making one; a reload's retired ones
 *   attach.c, status.c            entry points only (making an
 *                                 attachment; status JSON)
 *
 * A file calls the files above it in this list, never one below. Where a
 * lower file must have a higher one act (a copy or a job ended: update the
 * pipeline; a ring's client released: its attachment takes the leases
 * back), it calls through struct engine_hooks, which core.c fills in. All
 * of it runs on the loop thread but the worker tasks' bodies (stream.c:
 * task_run).
 */
#pragma once

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common.h"
#include "gpu/cudadev.h"
#include "base/log.h"
#include "engine.h"
#include "pyw-wire.h"
#include "sampler.h"
#include "slab.h"
#include "sources/source.h"
#include "workers.h"

#define FIELD_ALIGN 256
#define SLOT_ALIGN 4096
#define TOKEN_TTL_MS 30000
#define TASK_MIN_BYTES (2u << 20)

/*
 * A spec without "prefetch" (or with "auto") gets PREFETCH_AUTO_BYTES of
 * slots, at least PREFETCH_AUTO_MIN and at most PREFETCH_AUTO_MAX of them:
 * small batches, whose cost is per batch, get many slots to hide the round
 * trips; large ones keep the minimum, as many as the workers need to build
 * ahead. Beyond the minimum the slots take at most 1/PREFETCH_AUTO_SHARE of
 * the memory limit's free bytes, so the next pipeline still fits
 * (create.c, prefetch_auto(); docs/spec.md, "prefetch").
 */
#define PREFETCH_AUTO_BYTES (64u << 20)
#define PREFETCH_AUTO_MIN 8u
#define PREFETCH_AUTO_MAX 64u
#define PREFETCH_AUTO_SHARE 4u

/*
 * A client that leaves its window (Attach.credits) to the daemon gets
 * WINDOW_AUTO_BYTES of batches in flight, WINDOW_AUTO_MIN..MAX of them, and
 * no more than a quarter of the slots beyond the minimum: the rest build
 * ahead, for it and the pipeline's other streams (attach.c).
 */
#define WINDOW_AUTO_BYTES (8u << 20)
#define WINDOW_AUTO_MIN 4u
#define WINDOW_AUTO_MAX 16u

/* stats.c: counters at one moment (the live ones, and once-a-second
 * snapshots; the window is from the oldest snapshot to now) */
#define STATS_WINDOW_S 5
#define STATS_SNAPS (STATS_WINDOW_S + 1)
struct att_counts {
	uint64_t ms;
	uint64_t batches, samples, bytes;  /* leased to it (batches: a->delivered) */
	uint64_t wait_ns, compute_ns, calls; /* its trainer's last report */
	uint64_t buckets[WAIT_BUCKETS];
};

struct pl_counts {
	uint64_t ms;
	uint64_t batches, samples, bytes;  /* built */
	uint64_t worker_ns;                /* worker time building them */
	uint64_t stage_ns[STAGES];
};

struct slot {
	uint32_t idx;
	uint32_t refs;
	uint32_t leases;
	struct stream *owner;
};

/* Seed groups (docs/spec.md, "Augment seeds"): the broadcast clients of one
 * augment seed share its slots; a batch has one slot per group it was built
 * for, all from one decode of its samples. Group 0 draws from the stream's
 * own seed (the spec's, or a partition client's augment_seed); it keeps its
 * entry when unused, and is outside the limit: LDR_AUGMENT_SEEDS_MAX others
 * with clients at most (attach.c), whose slots go back when their last
 * client leaves (stream_drop_unread). */
#define AUG_GROUPS_MAX (LDR_AUGMENT_SEEDS_MAX + 1)

/* Jobs (docs/spec.md, "Jobs"): a shared stream keeps the keys of the jobs
 * whose clients read it (uid and job name hashed, the oldest forgotten
 * first); once no client reads it, a client of another job starts a new
 * stream in its place, from the first batch (attach.c). */
#define STREAM_JOBS_MAX 16

struct aug_group {
	uint64_t seed;
	uint32_t natts;           /* attachments reading it */
};

struct batch {
	uint64_t seq;
	uint64_t epoch;
	uint64_t index;
	uint32_t rows;
	bool ready;
	/* on_error "raise": its build failed. It keeps its place, with no slot:
	 * each client gets this error there instead of a batch (deliver.c) */
	bool failed;
	int err;                  /* positive errno */
	char *errmsg;             /* the job's words (a traceback), malloc'd; or while
	                           * refused, the store's refusal of its keys */
	bool refused;             /* its job waits for fresh store keys (stream.c, job_park()) */
	bool outage;              /* its job waits to try the store again (job_park()) */
	uint32_t parks;           /* how many times its job was parked so */
	struct slot *slot;        /* group 0's, or NULL when built without it */
	struct slot *more[AUG_GROUPS_MAX - 1]; /* group g's at more[g - 1], or NULL */
};

/* The slot of @b for seed group @g (NULL: @b was not built for it). */
static inline struct slot *batch_slot(const struct batch *b, uint32_t g)
{
	return g ? b->more[g - 1] : b->slot;
}

/* Copy states of one slot on one device. */
enum { DEV_NONE = 0, DEV_COPYING, DEV_DONE };

/* A pipeline's slots on one CUDA device: device slot i mirrors host slot i
 * (cudadev.h), so it is free exactly when the host slot is. */
struct devcopy {
	struct devcopy *next;
	struct pipeline *pl;
	int device;
	struct cuda_dslab *ds;
	uint32_t natts;           /* attachments delivered on this device */
	uint32_t inflight;        /* copies queued, each holding a slot reference */
	uint64_t copies;
	uint8_t *state;           /* per slot: DEV_NONE, DEV_COPYING, DEV_DONE */
	bool failed;
	char error[320];
};

struct copy_cookie {
	struct devcopy *dc;
	struct slot *slot;
};

struct lease {
	struct lease *next;
	uint64_t id;
	struct slot *slot;
	uint64_t dseq;            /* the attachment's delivery number */
	uint64_t seq;             /* the batch's place in its stream */
	uint64_t epoch, index;
	uint32_t rows;
};

/* order.c: the batches a client_order stream's client gave (docs/spec.md,
 * "Client order"), from the oldest one still in use to the newest. */
struct order_batch {
	uint64_t epoch, index;
	uint64_t off;             /* its first index in order.idx */
	uint32_t rows;
};

struct order {
	struct order_batch *b;    /* the batches of seq base_seq .. base_seq + n - 1 */
	uint64_t base_seq;
	size_t n, cap;
	uint64_t *idx;            /* their dataset indices, batch after batch */
	size_t nidx, idx_cap;
	uint64_t next_epoch;      /* what the next Order continues: this epoch, */
	uint64_t next_batch;      /* from this batch */
	bool open;                /* next_epoch has begun, its last chunk has not come */
	bool started;             /* an Order came */
};

struct stream {
	struct stream *next;
	struct pipeline *pl;
	int mode;
	struct sampler sampler;
	uint64_t bpe;
	uint64_t end_seq;         /* UINT64_MAX when endless */
	uint64_t next_produce;
	uint64_t cursor;          /* dynamic: next seq to hand out */
	struct batch *ring;       /* capacity pl->nslots */
	uint32_t ring_head, ring_len;
	uint64_t head_seq;
	uint32_t slots_held;
	uint32_t jobs;
	struct attachment *atts;
	uint32_t natts;
	struct pending *dyn_head, *dyn_tail;
	struct batch *returned;   /* dynamic: batches handed back unread, capacity pl->nslots */
	uint32_t nreturned;
	uint32_t order;           /* creation order in the pipeline (quota remainder) */
	bool drained;             /* end_seq is its pipeline's drain (retire.c): its end
	                           * is an error naming the reload, not End */
	uint64_t reclaimed;       /* ready batches given back to the pool, to be built again */
	struct job *parked;       /* jobs refused by the store for the keys, waiting for
	                           * fresh ones, or waiting to try it again (job_park()) */
	uint32_t outage_parked;   /* of them, those waiting for the store (status, stats.c) */
	uint64_t fail_seq;        /* the first batch whose job failed, UINT64_MAX none */
	int fail_err;
	char fail_msg[PYW_MSG_MAX + 512];
	bool started;
	bool dead;
	struct aug_group groups[AUG_GROUPS_MAX]; /* [0]: the stream's own seed */
	uint32_t ngroups;         /* entries of groups[] in use, >= 1 */
	uint64_t job_keys[STREAM_JOBS_MAX]; /* the jobs that read it */
	uint32_t njob_keys;
	bool client_order;        /* its batches are its client's Orders (order.c): bpe 0 */
	struct order corder;      /* client_order: what its client gave */
};

struct attachment {
	struct attachment *next;  /* in stream->atts */
	struct attachment *all_next; /* in engine->atts */
	struct engine *eng;
	struct pipeline *pl;      /* NULL once the pipeline was dropped */
	struct stream *stream;
	struct devcopy *dev;      /* CUDA delivery, NULL for host memory */
	struct attring *ring;     /* its batch ring (attring.c), NULL: deliveries answer Next */
	uint64_t id;
	uint64_t client_id;
	uid_t uid;
	bool admin;               /* its principal's: its bounds are the daemon's */
	int pid;                  /* the client's, for the log */
	int mode;
	uint32_t rank, world;
	uint32_t credits;         /* its window of Next requests (attach.c) */
	bool credits_auto;        /* the client left it to the daemon */
	bool has_seed;            /* its augment_seed, for status */
	uint64_t seed;
	uint32_t group;           /* its seed group in its stream */
	char job[LDR_JOB_MAX + 32]; /* its job's name, or "process PID@START" (attach.c) */
	uint64_t start_seq;
	uint64_t cursor;
	uint64_t told_seq;        /* the refused batch it was last told of (deliver.c), */
	uint32_t told_parks;      /* and that batch's parks then */
	uint64_t deliver_no;
	uint64_t delivered;
	struct pending *pend_head, *pend_tail;
	uint32_t npending;
	struct pending *watch;    /* the parked watch: how a Revoke reaches the client */
	bool revoking;            /* a Revoke is out: deliver nothing until it is answered */
	uint64_t revoke_upto;     /* deliver_no when it was sent */
	uint64_t end_dno;         /* the first End delivered after its last batch, UINT64_MAX: none */
	uint64_t rv_dno;          /* deliver_no and share of the last Revoke */
	uint32_t rv_share;
	uint32_t told_share;      /* the share the client last heard of */
	uint64_t revokes;         /* Revokes sent */
	uint64_t returned;        /* deliveries handed back unread */
	uint64_t bad_releases;    /* releases of leases it does not hold (logged 1, 2, 4...) */
	struct lease *leases;
	size_t nleases;
	uint8_t token[FD_TOKEN_BYTES];
	bool token_valid;
	uint64_t token_expiry;
	bool dead;                /* pipeline gone or detached: answer with an error */
	int dead_err;             /* that error's errno (0: ENOENT) */
	char dead_msg[160];
	/* slow.c: while it holds its broadcast stream back */
	uint64_t slow_since;      /* ms of its last progress */
	uint64_t slow_delivered;  /* delivered and nleases then */
	size_t slow_nleases;
	uint32_t slow_npending;
	bool skip_hold;           /* set aside: nothing delivered, cursor follows the others */
	bool left;                /* detached for slowness (slow.c): out of its stream, its
	                           * leases kept until it asks again or goes (att_leave) */
	uint64_t skipped;         /* batches skipped for it ("slow_clients": "skip") */
	/* stats.c */
	struct att_counts st;
	struct att_counts st_snap[STATS_SNAPS];
	uint8_t st_nsnap, st_head;
	bool st_reported;         /* its trainer sent a TrainerStats */
	uint64_t st_born_ms;      /* when it attached: no report adds up to more time */
	uint64_t st_bad_reports;  /* malformed ones, ignored */
};

struct pipeline {
	struct pipeline *next;
	struct engine *eng;
	struct spec *spec;
	struct source *src;
	struct sampler_windows *windows; /* spec's shuffle_window, else NULL (sampler.h) */
	struct slab *slab;
	struct pyw_pipeline *py;   /* python sources: their workers (pyworkers.c), else NULL */
	uid_t owner;
	struct creds owner_creds; /* the creator's: its files are read with them */
	int access;               /* enum spec_access, DEFAULT resolved */
	gid_t group;              /* for SPEC_ACCESS_GROUP */
	uint32_t nslots;          /* the slab's slots: the spec's prefetch, or prefetch_auto() */
	uint32_t prefetch;        /* of them, the streams may fill (1..nslots; set prefetch) */
	uint64_t slot_bytes;
	uint64_t row_bytes;
	size_t nfields;
	uint64_t field_off[SOURCE_MAX_FIELDS];
	struct field_desc fields[SOURCE_MAX_FIELDS];
	struct slot *slots;
	uint32_t *free_slots;
	uint32_t nfree;
	struct stream *streams;
	struct stream *shared[3]; /* broadcast and dynamic streams, by mode */
	struct devcopy *devs;     /* device slabs of CUDA clients */
	bool host_pinned;         /* the slab was registered with pin_device's engine */
	int pin_device;
	uint32_t nstreams;
	uint32_t stream_ctr;
	uint32_t jobs;
	uint64_t lease_ctr;
	uint64_t produced;
	uint64_t reclaimed;       /* ready batches taken back for another stream (sched.c) */
	uint64_t natts;
	bool failed;
	bool dropped;
	char error[PYW_MSG_MAX + 512];
	uint64_t blocked_since;   /* broadcast held back by a slow client, ms */
	uint64_t backpressure_ms;
	/* slow.c: the broadcast client that holds the stream back, or NULL */
	struct attachment *held_by;
	uint64_t held_lag;
	bool held_logged;
	uint64_t slow_timeout_ms; /* spec slow_client_timeout, else the daemon's */
	uint64_t slow_detached;   /* clients detached for it */
	/* lifetime (registry.c): in use while attached or while a connection
	 * that created it (or found it with exist_ok) is open; then it lingers */
	bool persist;             /* kept until dropped: config, "persist": true */
	bool has_ttl;
	uint64_t ttl_ms;          /* "ttl": its own linger, else the daemon's */
	uint64_t created_by;      /* client id, 0 = the config */
	uint64_t created_ms;
	bool unused;              /* no attachment, no holder */
	uint64_t unused_since;    /* ms, while unused */
	uint64_t *holders;        /* client ids whose connections hold it */
	uint32_t nholders, holders_cap;
	char owner_name[64];      /* the owner's user name, "" if unknown */
	/* retire.c: the config's own, and how it leaves on a reload */
	bool from_config;         /* created (or joined) by the config */
	int retired;              /* enum retire_kind: no longer found by name */
	/* 0, or 1 + the highest of the other pipelines of its name alive when it
	 * was made (a reload's replaced one, a draining one): what tells them
	 * apart in /metrics while both are there */
	uint32_t generation;
	char retire_msg[320];     /* draining: what its clients are told at the end */
	struct hold *holds;       /* holds.c: processes given its slab fd */
	/* stats.c */
	struct pl_counts st;
	struct pl_counts st_snap[STATS_SNAPS];
	uint8_t st_nsnap, st_head;
	uint64_t job_errors;      /* batches whose build failed */
	uint64_t batch_errors;    /* of them, delivered as errors (on_error "raise") */
	uint64_t keys_gen;        /* store keys handed since the create (engine_set_store()) */
	char last_batch_error[320]; /* the last one's first words, "" none */
	struct work_queue queue;  /* its tasks, in turn with other pipelines' (workers.h) */
};

struct job {
	struct job *done_next;
	struct engine *eng;
	struct pipeline *pl;
	struct stream *stream;
	uint64_t seq;
	uint64_t epoch, index;
	uint32_t rows;
	uint8_t *base;            /* seed group 0's slot, or the first built */
	uint32_t nmore;           /* more seed groups: their slots and seeds */
	uint8_t *more_base[AUG_GROUPS_MAX - 1];
	uint64_t seeds[AUG_GROUPS_MAX]; /* [0]: base's */
	atomic_uint remaining;
	atomic_int err;
	atomic_uint_fast64_t worker_ns;          /* stats.c: its tasks' time */
	atomic_uint_fast64_t stage_ns[STAGES];
	char *errmsg;             /* the first failure's words (job_set_error()), or NULL:
	                           * a traceback may be 16 KiB, and a job is made per batch */
	atomic_int why;           /* a read failed as the store refused the keys, or did
	                           * not answer: SOURCE_READ_KEYS / _STORE (source.h) */
	uint64_t retry_ms;        /* parked for the store: tried again then (uv_now()); 0 not so parked */
	uint64_t outage_ms;       /* parked for the store first then (uv_now()), 0 never */
	uint32_t outage_tries;    /* its builds the store failed since */
	uint64_t keys_gen;        /* the pipeline's keys_gen when submitted */
	struct job *park_next;    /* in stream->parked */
	const uint64_t *idx;      /* a client_order stream's batch: its rows' dataset
	                           * indices (a copy, after tasks[]), else NULL */
	unsigned ntasks;
	struct task {
		struct work work;
		struct job *job;
		uint32_t begin, end;
	} tasks[];
};

/*
 * How a lower file of the engine makes a higher one act (the order of the
 * files: the top of this header). The files call down only; where a lower
 * one must have a higher one do something (a slot came free: share the
 * slots and build; a Python workers' job is over; a batch ring's client
 * released), it calls through these, which engine_new() (core.c) fills in
 * with the higher files' functions.
 */
struct engine_hooks {
	/* sched.c pipeline_update(): share the slots, build, deliver
	 * (order.c, devcopy.c, stream.c, slow.c) */
	void (*update)(struct pipeline *pl);
	/* registry.c pipeline_maybe_free(): a dropped pipeline's job or copy
	 * ended (devcopy.c, stream.c) */
	void (*maybe_free)(struct pipeline *pl);
	/* registry.c pipeline_fail() (pyworkers.c, deliver.c) */
	void (*fail_pipeline)(struct pipeline *pl, int err, const char *msg);
	/* registry.c engine_find(): a Python host's HELLO names its pipeline */
	struct pipeline *(*find)(struct engine *eng, const char *name);
	/* stream.c job_done(): a job of the Python workers is over (pyworkers.c) */
	void (*job_over)(struct job *job);
	/* attachment.c attachment_next() and attachment_fail(): a batch ring's
	 * requests (attring.c) */
	int (*ring_next)(struct attachment *a, struct pending *p, const struct next_req *rq,
	                 char *err, size_t errlen);
	void (*ring_fail)(struct attachment *a, int err, const char *msg);
	/* attachment.c att_leave(): a slow client set aside (slow.c) */
	void (*leave)(struct attachment *a, int err, const char *msg);
	/* registry.c pipeline_lifetime(): an attachment came or went (attachment.c) */
	void (*lifetime)(struct pipeline *pl);
};

struct engine {
	uv_loop_t *loop;
	uv_async_t async;
	pthread_mutex_t done_lock;
	struct job *done_head;
	struct workers *workers;
	struct engine_ops ops;
	const struct engine_hooks *hooks; /* core.c's */
	void *userdata;
	uint64_t memory_limit;
	uint64_t memory_used;
	struct pipeline *pipelines;
	struct attachment *atts;
	uint64_t att_ctr;
	struct cuda_devices *cuda; /* copy engines, from the first CUDA attach */
	uint64_t linger_ms;       /* how long an unused scoped pipeline stays (registry.c) */
	uv_timer_t *linger_timer; /* armed for the next pipeline to expire, or NULL */
	uint64_t slow_timeout_ms; /* the daemon's slow_client_timeout */
	uv_timer_t *slow_timer;   /* slow.c: runs while a pipeline is held back */
	struct create_req *creating; /* creates whose files are being opened (create.c) */
	unsigned ncreating;
	struct pyw_server *pyw;   /* the Python workers' socket, NULL without a server */
	/* holds.c: slabs of dropped pipelines that clients still map */
	struct held_slab *held;
	uint64_t memory_held;     /* their bytes, part of memory_used */
	uint64_t max_held;        /* max_held_after_drop per uid, 0 = memory_limit / 4 */
	uint64_t hold_ctr;
	uv_timer_t *hold_timer;
	/* bounds.c: what one uid that is no admin may take */
	uint64_t user_memory;     /* memory_limit_per_user, 0 = memory_limit / 2 */
	unsigned max_pipelines_user; /* max_pipelines_per_user, 0 = the default */
	uv_timer_t *stats_timer;  /* stats.c: the snapshots' tick */
	uv_timer_t *outage_timer; /* stream.c: tries parked jobs the store failed again */
	bool shutdown;
};

/* A reference to @slot goes (the ring's or a lease's): with the last, it is
 * free again (stream.c says who holds one). Here, below every file that
 * drops one. */
static inline void slot_unref(struct pipeline *pl, struct slot *slot)
{
	struct stream *s = slot->owner;

	if (--slot->refs)
		return;
	slot->owner = NULL;
	pl->free_slots[pl->nfree++] = slot->idx;
	if (s)
		s->slots_held--;
}

/* Record @job's first failure (the first caller wins; any thread: a worker
 * thread's task, or the Python workers' side, pyworkers.c). */
/* @a's delivery number without the Ends it was delivered after its last
 * batch: a trainer that takes an End is delivered another, and those alone
 * are no reason for another Revoke (sched.c pipeline_revoke()). */
static inline uint64_t att_batches_dno(const struct attachment *a)
{
	return a->end_dno != UINT64_MAX ? a->end_dno : a->deliver_no;
}

static inline void job_set_error(struct job *job, int err, const char *msg)
{
	int zero = 0;

	/* the winner writes errmsg; job_done() reads it after the last task's
	 * atomic_fetch_sub(&remaining), which orders the two */
	if (atomic_compare_exchange_strong(&job->err, &zero, err))
		job->errmsg = strdup(msg);
}

static inline void job_free(struct job *job)
{
	if (job) {
		free(job->errmsg);
		free(job);
	}
}

/* Bytes of its order (order.c) @s holds now: bounds.c counts them. */
static inline uint64_t order_bytes(const struct stream *s)
{
	return s->corder.cap * sizeof(*s->corder.b) + s->corder.idx_cap * sizeof(*s->corder.idx);
}

/* The dataset index of row @row of @job's batch. */
static inline uint64_t job_sample(const struct job *job, uint32_t row)
{
	if (job->idx)
		return job->idx[row];
	return sampler_sample(&job->stream->sampler, job->epoch, job->index, row);
}

/*
 * The files' functions, one section per file, bottom up: a file calls the
 * sections above its own (and itself), never one below; a section below
 * that must make a higher one act goes through struct engine_hooks. The
 * leaves come first, in their own headers: slab.c (slab.h), sampler.c
 * (sampler.h), workers.c (workers.h).
 */

/* --- holds.c (docs/security.md, "Memory that clients hold") --------------- */
/* A fresh fd of @pl's slab for @pid of @uid, its hold recorded; the caller's. */
int holds_hand_out(struct pipeline *pl, pid_t pid, uid_t uid, int *fd);
/* The same, read-write: for a python pipeline's worker host, before the seal. */
int holds_hand_out_rw(struct pipeline *pl, pid_t pid, uid_t uid, int *fd);
/* @pl is freed: keep its slab's bytes in the budget while it is held (true). */
bool holds_retain(struct pipeline *pl);
/* Forget @pl's holds (it is freed, its slab not kept). */
void holds_forget(struct pipeline *pl);
/* Test the kept slabs' holds; give the released ones back to the budget. */
void holds_check(struct engine *eng);
/* "; N bytes are held by slabs of dropped pipelines still mapped by uid U
 * (pid P)" for a refused create, or "" when nothing is held. */
void holds_explain(struct engine *eng, char *buf, size_t len);
/* -ENOSPC when @uid holds more than max_held_after_drop. */
int holds_may_attach(struct engine *eng, uid_t uid, char *err, size_t errlen);
uint64_t holds_max_held(const struct engine *eng);
/* The bytes of kept slabs that @uid holds (each in full). */
uint64_t holds_bytes_of(struct engine *eng, uid_t uid);
/* The uids that hold kept slabs, at most @cap; returns the count. */
size_t holds_uids(struct engine *eng, uid_t *out, size_t cap);
void holds_close(struct engine *eng);

/* --- bounds.c (docs/security.md, "Bounds per user") ----------------------- */
/* For @who unless an admin. -EDQUOT at max_pipelines_per_user, -EMFILE
 * within the descriptors kept for admins. */
int bounds_may_create(struct engine *eng, const struct principal *who, const char *name,
                      char *err, size_t errlen);
/* -EDQUOT when @need more bytes pass memory_limit_per_user. */
int bounds_may_allocate(struct engine *eng, const struct principal *who, const char *name,
                        uint64_t need, char *err, size_t errlen);
/* -EMFILE within the descriptors kept for admins. */
int bounds_may_attach(struct engine *eng, const struct principal *who, const char *name,
                      char *err, size_t errlen);
/* -EDQUOT when @need more bytes of client orders (order.c) pass @uid's
 * memory_limit_per_user with what it has (an admin: memory_limit). */
int bounds_may_order(struct engine *eng, uid_t uid, bool admin, uint64_t need, char *err,
                     size_t errlen);
/* "; ldr-alice (uid 1001) holds 6291456 bytes in pipelines a, b; ..." for a
 * create refused for memory: who has it, most first. */
void bounds_explain_users(struct engine *eng, char *buf, size_t len);

/* --- order.c (docs/spec.md, "Client order"; order_bytes() above) ---------- */
/* Batches of @s whose order has come: it builds up to this seq. */
uint64_t order_end(const struct stream *s);
/* The batch at @seq (below order_end()), or NULL when trimmed. */
const struct order_batch *order_at(const struct stream *s, uint64_t seq);
const uint64_t *order_indices(const struct stream *s, const struct order_batch *b);
void order_free(struct stream *s);

/* --- attring.c: an attachment's batch ring -------------------------------- */
/* attring_open() makes it (the attachment delivers through it from
 * attring_start() on), attring_close() frees it; attring_deliver() is
 * deliver() for the ring's request. The client's releases and garbage go to
 * attachment.c through engine_hooks.ring_next and .ring_fail. */
struct attring;
int attring_open(struct attachment *a, char *err, size_t errlen);
void attring_start(struct attachment *a);
void attring_deliver(struct pending *p, const struct delivery *d);
uint64_t attring_bytes(const struct attachment *a);
void attring_fds(const struct attachment *a, int *fd, int *efd);
void attring_close(struct attachment *a);
/* The trainer's figures in the ring, when new: true, and them in *@st (its
 * buckets in @buckets) for stats_report(). */
bool attring_stats(struct attachment *a, struct trainer_stats *st, uint64_t buckets[WAIT_BUCKETS]);
/* @a's requests the daemon has nothing for: its parked Next requests, and its
 * ring's request while its client has taken every delivery (it waits). */
uint32_t att_waiting(const struct attachment *a);

/* --- pyw-conn.c, pyworkers.c: the Python workers (pyworkers.h; between the
 * two, pyw-private.h) ------------------------------------------------------ */

/* --- stats.c (docs/operations.md, "Stall accounting") --------------------- */
void stats_att_init(struct attachment *a);
void stats_pipeline_init(struct pipeline *pl);
void stats_report(struct attachment *a, const struct trainer_stats *st);
/* @job's batch was built: count it and its time. */
void stats_job_done(struct job *job);
/* A task of @job that began at @begin_ns ends: @stage_ns is what its source
 * timed per stage; the rest of its time goes to @rest_stage. Worker threads.
 * Returns the task's ns. */
uint64_t stats_task_time(struct job *job, uint64_t begin_ns, const uint64_t *stage_ns, int rest_stage);
uint64_t stats_att_lag(const struct attachment *a);
json_t *stats_att_json(const struct attachment *a);
json_t *stats_pipeline_json(const struct pipeline *pl, const char *state);
void stats_close(struct engine *eng);

/* --- devcopy.c: the engine's side of device delivery ---------------------- */
/* The only engine file that calls the gpu layer, but for the devices' start
 * and stop (core.c) and their status (status.c). A copy's end frees its slot
 * reference (slot_unref() above) and has the pipeline updated or freed
 * through engine_hooks. */
void devcopy_maybe_free(struct devcopy *dc);
/* pipeline_free(): @pl's device slabs go; its host slab goes, once the copy
 * engine that pinned it has unregistered it. */
void devcopy_free_all(struct pipeline *pl);
void devcopy_slab_free(struct pipeline *pl);
void stream_prefetch_devices(struct stream *s, struct batch *b);
bool batch_ready(struct attachment *a, struct batch *b);
int devcopy_get(struct pipeline *pl, const struct cuda_device_info *info, struct devcopy **out,
                char *err, size_t errlen);

/* --- stream.c: a stream's ring, its quota, its production ----------------- */
struct batch *ring_at(struct stream *s, uint64_t seq);
void stream_maybe_free(struct stream *s);
/* Free @s, out of its pipeline's list, and what its ring still holds. */
void stream_free(struct stream *s);
void ring_pop_head(struct stream *s);
/* Drop the ring's references to @b's slots. */
void batch_unref(struct pipeline *pl, struct batch *b);
/* Does any slot of @b have a lease? */
bool batch_leased(const struct batch *b);
/* The ready batches of broadcast stream @s give back their slots of the
 * seed groups nobody reads, and those left with none leave the ring
 * (docs/spec.md, "Augment seeds"): a group without clients holds nothing. */
void stream_drop_unread(struct stream *s);
/* Slots a new batch of @s takes: one per seed group read (at least 1). */
uint32_t stream_batch_slots(const struct stream *s);
/* The numbers of sched.c's rule: the streams that are read, the slots @s
 * may hold, the leases @a may hold. */
uint32_t pipeline_active_streams(const struct pipeline *pl);
uint32_t stream_quota(const struct stream *s);
uint32_t att_share(const struct attachment *a);
/* Slots the next batch @s builds takes (UINT32_MAX: none to build): a
 * ready batch of a broadcast stream that lacks the slot of a seed group
 * whose client has still to receive it (*@refill), else a new one (0: all
 * its clients are past it). */
uint32_t stream_next_build(const struct stream *s, struct batch **refill);
/* Build what stream_next_build() says (without checking the quota). */
int stream_start_batch(struct stream *s);
/* @job is over (core.c's completions, the Python workers through
 * engine_hooks.job_over): its batch is ready or failed. */
void job_done(struct job *job);
/* The parked jobs of @s (refused by the store for the keys) built again:
 * fresh keys came, or the stream or its pipeline goes. */
void stream_unpark(struct stream *s);
/* The timer that builds again the jobs parked as the store did not answer
 * (job_park()) closed, when the engine goes. */
void stream_outage_close(struct engine *eng);
struct stream *stream_new(struct pipeline *pl, int mode, uint32_t rank, uint32_t world);
/* Shared stream @s, which no client reads, leaves its pipeline for a new
 * job's (docs/spec.md, "Jobs"): its batches go, it is freed when done. */
void stream_retire(struct stream *s);

/* --- deliver.c: parked requests, leases, answers -------------------------- */
void deliver(struct engine *eng, struct pending *p, const struct delivery *d);
void att_fail_pending(struct attachment *a, int err, const char *msg);
void pipeline_dispatch(struct pipeline *pl);

/* --- slow.c: a broadcast client that holds its stream back (docs/spec.md) - */
void pipeline_check_slow(struct pipeline *pl);
json_t *pipeline_slow_json(const struct pipeline *pl);
void slow_close(struct engine *eng);

/* --- sched.c: reclaim, revoke, build; the update after any change --------- */
/* Give back the ready batches of @s that nobody has received and nobody
 * holds, newest first, to be built again (the same bytes) when it has room:
 * a new seed group gets its slots in them (attach.c). */
void stream_rebuild_unreceived(struct stream *s);
/* Deliver, share and build, deliver, watch the slow: after anything that
 * changed @pl's slots, streams or requests. */
void pipeline_update(struct pipeline *pl);

/* --- attachment.c: an attachment's requests, its leaving ------------------ */
/* @a fails for good with @msg (its client's garbage): leases released,
 * requests answered with the error, the same error from now on. */
void attachment_fail(struct attachment *a, int err, const char *msg);
void att_disconnect(struct attachment *a, int err, const char *msg);
/* Take @a out of its stream (pending requests answered with @err), keeping
 * its pipeline and its leases: the slots it holds are not rebuilt under a
 * trainer that may still read them. att_disconnect() ends the rest. */
void att_leave(struct attachment *a, int err, const char *msg);

/* --- registry.c: pipelines by name, access, lifetimes ---------------------- */
/* The pipeline of that name that new attachments and creates find: not
 * dropped, not retired. */
struct pipeline *engine_find(struct engine *eng, const char *name);
/* The retired pipeline named @name (retire.c), for an attach's error; NULL
 * if none. */
struct pipeline *engine_find_retired(struct engine *eng, const char *name);
/* (Re)arm the linger timer for the earliest expiry, or stop it. */
void linger_arm(struct engine *eng);
void pipeline_free(struct pipeline *pl);
void pipeline_maybe_free(struct pipeline *pl);
void pipeline_fail(struct pipeline *pl, int err, const char *msg);
/* After an attachment or a holder came or went: start or cancel its linger. */
void pipeline_lifetime(struct pipeline *pl);
/* @client's connection holds @pl (a create or an exist_ok join, create.c):
 * 0 or -ENOMEM. */
int pipeline_holder_add(struct pipeline *pl, uint64_t client);
/* Drop @pl now: its attachments are told, its workers' jobs end; @why for
 * the log (NULL: "dropped"). May free it. */
void pipeline_drop_now(struct pipeline *pl, const char *why);
uint64_t pipeline_linger_ms(const struct pipeline *pl);
/* From engine_free(): close the linger timer. */
void registry_close(struct engine *eng);
/* May @who attach to, join or see @pl (its access, docs/security.md)? */
bool pipeline_may_use(const struct pipeline *pl, const struct principal *who);
/* errfmt "pipeline 'x' belongs to alice (uid 1001), access owner" and then
 * @tail ("" for none) into @err; returns @r. */
int pipeline_owned_error(const struct pipeline *pl, int r, const char *tail, char *err, size_t errlen);

/* --- core.c (engine.h: engine_new(), the completions, the memory) --------- */
/* --- create.c (engine.h: engine_create(), engine_create_async()) ---------- */

/* --- retire.c: pipelines a reload removed (draining) or replaced ---------- */
enum retire_kind { RETIRE_NONE, RETIRE_DRAIN, RETIRE_REPLACED };
const char *retire_state(const struct pipeline *pl);

/* On top, entry points of engine.h only: attach.c (making an attachment),
 * status.c (status JSON). */
