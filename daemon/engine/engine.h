/* SPDX-License-Identifier: MIT */
/* engine - pipelines, their streams, slots and leases (loop thread only)
 *
 * The engine layer: pipelines, streams, scheduling, delivery, attachments,
 * holds, bounds, stats, the slabs, the sampler, the worker threads and the
 * Python worker processes; its files share engine-private.h. This header is
 * all the server sees of it. The engine reads samples through the sources'
 * one interface, sources/source.h (their ops table behind it), copies to GPUs
 * through gpu/cudadev.h, whose completions come back through the callbacks
 * the engine gives it, and uses base/. It never calls up: the server hears
 * of deliveries only through struct engine_ops, given to engine_new().
 *
 * Inside, the files call one way (engine-private.h lists them in order):
 * the slab, sampler and worker threads at the bottom; then holds and
 * bounds, client orders, batch rings, the Python workers, stats, device
 * copies; streams (their rings, quotas, production); delivery; slow
 * clients; scheduling (pipeline_update()); attachments; the registry of
 * pipelines; core.c; creating and retiring pipelines; on top attach.c and
 * status.c, entry points only. A lower file makes a higher one act only
 * through struct engine_hooks (engine-private.h).
 *
 * layer: daemon/engine -> daemon/sources daemon/gpu daemon/base common include
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "base/creds.h"

#include "loader/loader.h"
#include "sources/spec.h"

struct engine;
struct pipeline;
struct attachment;
struct cuda_device_info;
struct cuda_dslab;

#define FD_TOKEN_BYTES 16
#define ATTACH_MAX_CREDITS LDR_INFLIGHT_MAX /* what libloader may ask for */

/* A parked Next request. The server owns it; the engine queues it. */
struct pending {
	struct pending *next;
	struct attachment *att;
	uint32_t max;         /* batches this request may carry, >= 1 */
	bool ring;            /* an attachment's batch ring's (attring.c), not a Next */
};

enum delivery_kind {
	DELIVER_BATCH,
	DELIVER_END,
	DELIVER_ERROR,
	DELIVER_REVOKE,       /* to a watch: hand back what the trainer has not taken */
};

struct delivered_batch {
	uint64_t seq;         /* the attachment's delivery number */
	uint64_t lease;
	uint64_t epoch;
	uint64_t index;
	uint32_t slot;
	uint32_t rows;
	int err;              /* a failed batch (on_error "raise"): positive errno, no
	                       * lease nor slot; the last of its delivery */
	const char *msg;      /* its words */
};

struct delivery {
	enum delivery_kind kind;
	uint64_t seq;         /* END and ERROR: the attachment's delivery number */
	const struct delivered_batch *batches; /* DELIVER_BATCH: nbatches of them */
	uint32_t nbatches;
	int err;              /* DELIVER_ERROR: positive errno */
	const char *msg;
	uint32_t share;       /* BATCH, REVOKE: leases the attachment may hold now */
	uint64_t upto_seq;    /* REVOKE: the attachment's delivery number */
	uint32_t count;       /* REVOKE: leases above its share */
	uint64_t ends_from;   /* REVOKE: the deliveries from here to upto_seq are Ends, 0: none */
};

/* Most batches one answer carries. */
#define DELIVER_MAX_BATCHES 64

struct engine_ops {
	/* Answer @p. Must not call back into the engine. */
	void (*deliver)(void *userdata, struct pending *p, const struct delivery *d);
};

/* Who asks (docs/security.md): a client's credentials, and whether it is an
 * admin (root, the daemon's own user, a member of the config's admin_group),
 * who may do everything. */
struct principal {
	struct creds creds;
	bool admin;
	/* a create's exist_ok may join a pipeline of this uid, another user's
	 * (CreatePipeline.owner): without it only the caller's own and the
	 * daemon's (docs/security.md, "Whose pipeline, whose daemon") */
	bool has_join_owner;
	uid_t join_owner;
};

/* The daemon itself (the config's pipelines): its own credentials, admin. */
void principal_daemon(struct principal *p);

struct attach_params {
	int mode;             /* enum ldr_mode */
	uint32_t rank;
	uint32_t world;
	bool has_start;
	uint64_t start_epoch;
	uint64_t start_batch;
	bool has_start_position; /* start_epoch is a tail from this position of its
	                          * permutation (docs/spec.md, "Partition") */
	uint64_t start_position;
	uint32_t credits;     /* 0: the daemon's choice (attach.c, window_auto()) */
	bool has_seed;        /* augment_seed (docs/spec.md, "Augment seeds") */
	uint64_t seed;
	uint64_t client_id;
	uid_t uid;
	int pid;              /* the client's, for the log */
	const struct principal *who; /* checked against the pipeline's access */
	const struct cuda_device_info *cuda; /* CUDA delivery on that device, NULL host */
	bool ring;            /* deliver through a batch ring (host only) */
	const char *job;      /* its job (docs/spec.md, "Jobs"); NULL or "": its process */
	bool client_order;    /* its client gives the order (docs/spec.md, "Client order") */
};

/* What a client needs to read the batches of an attachment. */
struct attach_info {
	uint64_t id;
	uint8_t token[FD_TOKEN_BYTES];
	uint64_t slab_bytes;
	uint64_t slot_bytes;
	uint32_t nslots;
	uint32_t batch_size;
	uint64_t batches_per_epoch;
	uint64_t epochs;
	uint64_t samples;
	uint64_t start_epoch;
	uint64_t start_batch;
	bool has_start_position; /* its start_epoch is a tail from start_position */
	uint64_t start_position;
	size_t nfields;
	const struct field_desc *fields;
	const uint64_t *field_offsets;
	const struct cuda_dslab *dslab; /* CUDA delivery: the device slab, else NULL */
	uint32_t share;       /* leases it may hold now */
	uint32_t credits;     /* its window: asked for, or the daemon's choice */
	uint64_t ring_bytes;  /* its batch ring's, 0 none */
	uid_t owner;          /* the pipeline's */
	uint64_t spec_hash;   /* spec_hash() of its spec */
};

/* One Next or Release request (docs/protocol.md, "Sharing slots"). */
struct next_req {
	const uint64_t *releases;
	size_t nreleases;
	bool watch;           /* park as the attachment's watch */
	bool has_return;      /* the watch answers a Revoke */
	uint64_t return_from;
	const uint64_t *returned;
	size_t nreturned;
	const struct trainer_stats *stats; /* the trainer's report, or NULL */
};

/* A trainer's TrainerStats (docs/protocol.md, stall accounting): totals since
 * its attach. */
struct trainer_stats {
	uint64_t wait_ns, compute_ns, calls;
	const uint64_t *buckets;  /* WAIT_BUCKETS of them */
	size_t nbuckets;
};

int engine_new(struct engine **out, uv_loop_t *loop, unsigned nworkers,
               uint64_t memory_limit, const struct engine_ops *ops, void *userdata);
/* Answer every parked request with ESHUTDOWN; refuse new work. */
void engine_shutdown(struct engine *eng);
/* engine_shutdown() was called: the daemon stops. */
bool engine_stopping(const struct engine *eng);
/* Stop the workers and free everything. Call engine_shutdown() first. */
struct engine *engine_free(struct engine *eng);
/* A stop left worker threads stuck in a read (engine_free()): the process
 * must exit without freeing what they use (main.c does). */
bool engine_workers_abandoned(void);
unsigned engine_workers(const struct engine *eng);
uint64_t engine_memory_limit(const struct engine *eng);
uint64_t engine_memory_used(const struct engine *eng);
/* What a create may still take: the limit less what is used (0 when a
 * lowered limit is below it). */
uint64_t engine_memory_free(const struct engine *eng);

/*
 * Live tuning (loaderctl set, reload; docs/config.md). Each returns 0 or a
 * negative errno with @err naming the value and the rule it breaks.
 *
 * engine_set_workers(): the worker pool grows or shrinks now; a thread that
 * leaves finishes its task first, nothing queued is lost.
 * engine_set_memory_limit(): for the creates from now on; slabs already made
 * stay, so a limit below memory_used frees nothing, it refuses creates until
 * pipelines are dropped (engine_memory_free() is 0 meanwhile).
 * engine_set_prefetch(): the slots of @name's slab its streams may fill,
 * 1..its slots (the slab is one sealed memfd: it cannot grow), at least one
 * per stream reading it; *@old gets the previous value.
 */
int engine_set_workers(struct engine *eng, unsigned n, char *err, size_t errlen);
void engine_set_memory_limit(struct engine *eng, uint64_t bytes);
int engine_set_prefetch(struct engine *eng, const char *name, uint32_t n, uint32_t *old,
                        char *err, size_t errlen);

/**
 * engine_create() - create a pipeline.
 * @spec: taken over by the engine, also on failure
 * @who: the creator, its owner: the spec's files are read with its
 *       credentials; a name another user's pipeline has, that @who may not
 *       use, is an error naming the owner (-EACCES)
 * @client: the creating client's id, whose connection holds the pipeline
 *          (engine_client_gone()); 0 for the config: persistent
 * Return: 1 created, 0 an identical pipeline existed (@exist_ok; @client then
 * holds it too), or a negative errno with @err naming the reason.
 */
int engine_create(struct engine *eng, struct spec *spec, const struct principal *who,
                  uint64_t client, bool exist_ok, char *err, size_t errlen);
/*
 * engine_create_async() - engine_create() with the files opened, listed and
 * indexed on libuv's pool, so the loop serves everyone meanwhile. @cb runs on
 * the loop with engine_create()'s result and message, maybe before this
 * returns. Creates of one name wait for the one in flight (DDP ranks: one
 * indexes, the others join).
 */
typedef void (*engine_create_cb)(void *userdata, int r, const char *err);
void engine_create_async(struct engine *eng, struct spec *spec, const struct principal *who,
                         uint64_t client, bool exist_ok, engine_create_cb cb, void *userdata);
/*
 * engine_open_async() - only the file work of a create, on libuv's pool as
 * @who: @cb on the loop gets the opened source (NULL with r < 0 and why),
 * for engine_create_opened(). @spec stays the caller's; it must live and stay
 * unchanged until @cb. A reload opens its new pipelines' files so, and
 * applies the whole file in one loop turn once all are open.
 * engine_create_opened() - engine_create() over @src (taken), opened so.
 */
struct source;
typedef void (*engine_open_cb)(void *userdata, struct source *src, int r, const char *err);
void engine_open_async(struct engine *eng, struct spec *spec, const struct principal *who,
                       engine_open_cb cb, void *userdata);
int engine_create_opened(struct engine *eng, struct spec *spec, const struct principal *who,
                         uint64_t client, bool exist_ok, struct source *src, char *err,
                         size_t errlen);
/* Creates (and opens) in flight (the server's stop waits for them, a while). */
unsigned engine_creating(const struct engine *eng);
/* A client's connection closed: the pipelines it held may start to linger. */
void engine_client_gone(struct engine *eng, uint64_t client);
/* How long an unused pipeline without "ttl" stays (config key linger). */
void engine_set_linger(struct engine *eng, uint64_t ms);
/* How long a broadcast stream waits for a stopped client without
 * "slow_client_timeout" (config key of that name; docs/spec.md). */
void engine_set_slow_timeout(struct engine *eng, uint64_t ms);
#define ENGINE_SLOW_TIMEOUT_DEFAULT_MS 60000
/*
 * The config's pipelines on a reload (retire.c; docs/config.md, "Reload").
 * engine_config_apply(): @spec (taken) as a pipeline of the config: created
 * when its name is free, nothing when the config's pipeline of that name has
 * it already (a client's identical one becomes the config's), and when the
 * config's has another spec, replaced: the old one serves its attached
 * clients until they detach, new attachments get the new one (@err then gets
 * how they differ). @op: its files opened ahead by engine_open_async() (the
 * source taken), or NULL: opened here, on the loop. @why names the reload in
 * the log. Return: one of
 * CONFIG_*, or a negative errno with @err naming the reason (a replace that
 * failed keeps the old pipeline as it was).
 * engine_config_drain(): every pipeline of the config not named in @keep
 * (an array of names) drains: no new attachments, its clients finish the
 * epoch they are in and are then told it was removed; dropped once none is
 * left. Return: [{"name", "clients"}] of those, new.
 * engine_config_needs_open(): whether applying @spec builds a pipeline, so
 * that a reload opens its files first (engine_open_async()).
 */
enum { CONFIG_UNCHANGED, CONFIG_CREATED, CONFIG_REPLACED };
struct config_open {
	struct source *src;       /* NULL: the open failed (r, err), or none was made */
	int r;
	char err[1024];
};
bool engine_config_needs_open(struct engine *eng, const struct spec *spec);
/* The config's pipeline @name back to its spec's prefetch after a live set
 * (docs/config.md, "Live tuning"): true, with both values, when it was
 * another. */
bool engine_config_prefetch_reset(struct engine *eng, const char *name, uint32_t *old,
                                  uint32_t *now);
int engine_config_apply(struct engine *eng, struct spec *spec, struct config_open *op,
                        const char *why, char *err, size_t errlen);
json_t *engine_config_drain(struct engine *eng, json_t *keep, const char *why);
/* Its owner and the admins may drop a pipeline (-EPERM naming the owner). */
int engine_drop(struct engine *eng, const char *name, const struct principal *who, bool force,
                char *err, size_t errlen);

/*
 * engine_set_store() - fresh object-store credentials for pipeline @name
 * @keys: source_keys_new()'s; taken in every case
 *
 * Only a client of the pipeline's owner uid, or root (-EPERM naming the
 * owner); the requests that start after it use @keys (source.h,
 * spec_swap_store_keys()). -ENOENT, -EINVAL (no store, another endpoint or
 * region).
 */
int engine_set_store(struct engine *eng, const char *name, const struct principal *who,
                     struct source_keys *keys, char *err, size_t errlen);
bool engine_has(struct engine *eng, const char *name);
/* {"name", "state", "slots_total", ...} of every pipeline @who may use; of the
 * others only {"name", "owner", "access"}. */
json_t *engine_pipelines_json(struct engine *eng, const struct principal *who);
/* May @who use (attach to, join, see) the pipeline @name? false if none. */
bool engine_may_use(struct engine *eng, const char *name, const struct principal *who);
/* The owner of pipeline @name: 0 and *@owner set, or -ENOENT. */
int engine_owner(struct engine *eng, const char *name, uid_t *owner);

int engine_attach(struct engine *eng, const char *name, const struct attach_params *p,
                  struct attachment **out, char *err, size_t errlen);
/* Release every lease, answer parked requests with ECANCELED, free. */
void attachment_detach(struct attachment *att);
void attachment_get_info(struct attachment *att, struct attach_info *info);
uint64_t attachment_id(const struct attachment *att);
uint64_t attachment_client(const struct attachment *att);
size_t attachment_leases(const struct attachment *att);
json_t *attachment_json(const struct attachment *att);
/* The next batches of a client_order attachment (order.c; docs/protocol.md,
 * "Client order"): batches @first, @first + 1, ... of @epoch, @sizes[i]
 * samples each, their dataset indices one batch after the other; @last ends
 * the epoch. */
struct order_msg {
	uint64_t epoch;
	uint64_t first;
	const uint32_t *sizes;
	size_t nbatches;
	const uint64_t *indices;
	size_t nindices;
	bool last;
};
/* Return: 0, or a negative errno with @err naming what was wrong (nothing
 * of it taken: the attachment goes on as before). */
int attachment_order(struct attachment *att, const struct order_msg *m, char *err, size_t errlen);
/**
 * attachment_next() - release leases, take back a Revoke's returns, queue @p.
 * @p: the request to answer (NULL: release only), at once or later
 * Return: 0; -ENOENT for unknown lease ids (the request still counts), -EAGAIN
 * for too many parked requests (or a second watch), -EPROTO for returns that
 * do not match the deliveries the Revoke asked for; @err says which.
 */
int attachment_next(struct attachment *att, struct pending *p, const struct next_req *rq,
                    char *err, size_t errlen);

/**
 * engine_take_token() - redeem a one-time fd-channel token.
 * @uid: the peer's uid, which must be the attaching client's
 * @pid: the peer's pid: it holds the slab from now on (holds.c)
 * Return: 0 with a read-only fd of the slab (the caller's: close it once
 * sent) and its size, and for a CUDA attachment whose device slab is VMM its
 * exported fd and size (else -1 and 0; still the engine's), and for an
 * attachment with a batch ring its memfd and eventfd (else -1; still the
 * engine's).
 */
int engine_take_token(struct engine *eng, const uint8_t *token, uid_t uid, pid_t pid,
                      int *fd, uint64_t *size, int *dev_fd, uint64_t *dev_size, int *ring_fd,
                      int *ring_efd);
/* Bytes of dropped pipelines' slabs that clients still map: part of
 * memory_used until they let them go (holds.c). */
uint64_t engine_memory_held(const struct engine *eng);
/* [{"uid", "bytes", "pids", "pipelines"}, ...]: who holds them. */
json_t *engine_holds_json(struct engine *eng);
/* Read the trainers' figures that batch rings carry (stats.c): before what
 * shows them. */
void engine_stats_pull(struct engine *eng);
/* max_held_after_drop: above it a uid may not attach; 0 = memory_limit / 4. */
void engine_set_max_held(struct engine *eng, uint64_t bytes);
/* memory_limit_per_user (0: memory_limit / 2) and max_pipelines_per_user (0:
 * the default), for the creates from now on (bounds.c). */
void engine_set_user_bounds(struct engine *eng, uint64_t bytes, unsigned npipelines);
/* Pipelines one uid may own without "max_pipelines_per_user". */
#define ENGINE_PIPELINES_PER_USER_DEFAULT 64
/* Status: the bounds, the descriptors, and per user its pipelines and bytes
 * (every user's for an admin, else @who's own), set into @status. */
void engine_bounds_status(struct engine *eng, json_t *status, const struct principal *who);
uint64_t holds_max_held(const struct engine *eng);
/* The Python workers' socket, <socket>.workers (pyworkers.c): the server
 * listens on @path (mode and group as the fd channel's) for the engine. */
struct pyw_server;
int pyw_server_new(struct pyw_server **out, uv_loop_t *loop, struct engine *eng, const char *path,
		   unsigned mode, int gid, char *err, size_t errlen);
/* Close the listener and every connection (the pipelines stay as they are:
 * the engine frees them). */
void pyw_server_close(struct pyw_server *srv);
/* The copy engines' state for status (an empty object before any CUDA attach). */
json_t *engine_cuda_json(struct engine *eng);
