/* SPDX-License-Identifier: MIT */
/* libloader - the client library of loaderd */
#ifndef LOADER_LOADER_H
#define LOADER_LOADER_H

/**
 * @file loader.h
 * @brief Public C API of libloader, the client of the loaderd daemon.
 *
 * All functions return 0 (or a non-negative count) on success and a negative
 * errno value, or one of the LDR_E* codes below, on failure; ldr_strerror()
 * names it. A failed call also leaves a sentence that says what was wrong in
 * the calling thread's last error, which ldr_client_error() returns: the
 * daemon's own message when the daemon refused a request, else libloader's
 * (the socket path, the connection, a device slab it could not map). No
 * ldr_* function takes an error buffer: inside the library (and the daemon)
 * an error is a negative errno returned with a message buffer filled
 * (common/common.h in the source tree), and each ldr_* function hands that
 * message on to the thread's last error. Handles are opaque. A client may be
 * used from several threads, one attachment from one thread at a time.
 *
 * A handle used in a process forked after it was created returns
 * LDR_EFORKED and touches nothing (nng is not fork-safe). nng cannot start
 * again in a forked child at all, so ldr_connect() in a child of a process
 * that used libloader returns LDR_EFORKED too: connect in the process that
 * uses the connection, and start worker processes with spawn (or fork before
 * the first ldr_connect()).
 *
 * Host batches are copy-on-write: the slab is mapped MAP_PRIVATE, so a
 * trainer may write into a batch (an in-place op); the pages it writes become
 * private to the process, invisible to the daemon and to every other client,
 * and are discarded when the batch is released. A batch can be kept past its
 * lease (ldr_batch_keep()): its fields become a private copy at the same
 * addresses and its slot goes back to the daemon. ldr_next() keeps the oldest
 * batches the trainer holds by itself when it holds its whole share of the
 * pipeline's slots, and ldr_detach() keeps every batch still held, so a host
 * batch stays valid and unchanged until ldr_release() however long it is held.
 */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(LDR_BUILDING_LIBRARY)
#define LDR_EXPORT __attribute__((visibility("default")))
#else
#define LDR_EXPORT
#endif

/** Wire protocol version spoken by this library. */
#define LDR_PROTOCOL_VERSION 2
/** Longest pipeline or field name, in bytes, without the NUL. */
#define LDR_NAME_MAX 63
/** Most dimensions of one field (batch dimension included). */
#define LDR_MAX_DIMS 8
/**
 * Most batches one attachment may have asked for or waiting here
 * (ldr_attach_opts.inflight). The daemon's limit (ATTACH_MAX_CREDITS) is
 * this constant; loaderctl and the Python package use it too.
 */
#define LDR_INFLIGHT_MAX 64

/** End of stream: a finite pipeline has delivered its last batch. */
#define LDR_EOF (-4095)
/** The handle was created in another process (used after fork). */
#define LDR_EFORKED (-4094)
/** The daemon closed the connection or went away. */
#define LDR_EDISCONNECTED (-4093)
/** The daemon speaks another protocol version. */
#define LDR_EVERSION (-4092)
/**
 * The batch at this position of the stream failed to build (a Python
 * Dataset raised: the spec's on_error "raise"). ldr_client_error() says why
 * (a worker's traceback), ldr_attachment_failed() where; the next ldr_next()
 * goes on with the batch after it, as torch's DataLoader does.
 */
#define LDR_EBATCH (-4091)

/** Element types of batch fields (values are part of the wire protocol). */
enum ldr_dtype {
	LDR_DTYPE_BOOL = 0,
	LDR_DTYPE_INT8 = 1,
	LDR_DTYPE_UINT8 = 2,
	LDR_DTYPE_INT16 = 3,
	LDR_DTYPE_UINT16 = 4,
	LDR_DTYPE_INT32 = 5,
	LDR_DTYPE_UINT32 = 6,
	LDR_DTYPE_INT64 = 7,
	LDR_DTYPE_UINT64 = 8,
	LDR_DTYPE_FLOAT16 = 9,
	LDR_DTYPE_BFLOAT16 = 10,
	LDR_DTYPE_FLOAT32 = 11,
	LDR_DTYPE_FLOAT64 = 12,
	LDR_DTYPE_COUNT
};

/** Sharing mode of an attachment. */
enum ldr_mode {
	LDR_MODE_BROADCAST = 0, /**< every client receives every batch */
	LDR_MODE_PARTITION = 1, /**< each rank receives its disjoint share */
	LDR_MODE_DYNAMIC = 2,   /**< each batch goes to exactly one client */
};

/** Where an attachment's batches are delivered (values are part of the wire protocol). */
enum ldr_device_kind {
	LDR_DEVICE_HOST = 0,      /**< host memory: the slab, mapped copy-on-write */
	LDR_DEVICE_CUDA = 1,      /**< CUDA device memory (device_index = N of cuda:N) */
};

struct ldr_client;
struct ldr_attachment;
struct ldr_batch;

/** One field of a batch, valid until the batch is released. */
struct ldr_field {
	const char *name;         /**< field name, e.g. "input" */
	enum ldr_dtype dtype;     /**< element type */
	int ndim;                 /**< dimensions, batch dimension first */
	int64_t shape[LDR_MAX_DIMS]; /**< shape[0] = rows of this batch */
	/**
	 * C order. Host: in the slab (or the batch's kept copy), writable: what
	 * the process writes is its own (copy-on-write) and gone at release.
	 * CUDA (ldr_batch_field()): a device pointer into device memory that
	 * every client of the pipeline on that device reads: do not write it.
	 */
	void *data;
	size_t nbytes;            /**< bytes of this field in this batch */
};

/**
 * Options of ldr_attach(). Versioned by its leading @c size: set it to
 * sizeof(struct ldr_attach_opts) (LDR_ATTACH_OPTS_INIT does), then set what
 * you need; every other field defaults to 0, which means its default.
 *
 * libloader reads only the fields that lie wholly within @c size bytes: a
 * caller built against an older, smaller layout gets the defaults for the
 * fields added since, and fields added later go at the end (the two of V2
 * are read together, only when @c size is at least LDR_ATTACH_OPTS_SIZE_V2:
 * a V1 caller's sizeof, V1 rounded up to 8, covers has_augment_seed with
 * its padding). @c size 0 (a
 * struct zero-initialised or set by designated initialisers without it)
 * means LDR_ATTACH_OPTS_SIZE_V1, the layout below, so such callers keep
 * working when fields are added. A @c size larger than this library knows is
 * accepted when the bytes beyond its layout are all 0, else ldr_attach()
 * fails with -E2BIG; a @c size below sizeof(size_t) fails with -EINVAL.
 */
struct ldr_attach_opts {
	size_t size;              /**< sizeof(struct ldr_attach_opts) as the caller knows it, or 0 */
	enum ldr_mode mode;       /**< default broadcast */
	uint32_t rank;            /**< partition: this client's rank */
	uint32_t world_size;      /**< partition: number of ranks (0 = 1) */
	int has_start;            /**< partition: start at start_epoch/batch */
	uint64_t start_epoch;
	uint64_t start_batch;
	uint32_t inflight;        /**< window: batches asked for or waiting here, most LDR_INFLIGHT_MAX
	                           * (0: the daemon's choice from the batch bytes, 4..16; docs/protocol.md) */
	enum ldr_device_kind device_kind; /**< LDR_DEVICE_HOST = 0 (default), LDR_DEVICE_CUDA = 1 */
	int device_index;         /**< CUDA: the N of cuda:N */
	/* --- LDR_ATTACH_OPTS_SIZE_V2: augmentation seeds (docs/spec.md, "Augment seeds") --- */
	int has_augment_seed;     /**< draw random transforms from augment_seed, not the spec's seed */
	uint64_t augment_seed;    /**< 0..2^63-1 as a spec seed, 0 included; broadcast and partition only */
	/* --- LDR_ATTACH_OPTS_SIZE_V3: jobs (docs/spec.md, "Jobs") --- */
	/**
	 * The job this client belongs to, at most LDR_JOB_MAX bytes of printable
	 * ASCII; NULL or "": $TORCHELASTIC_RUN_ID when torchrun set it (not
	 * "none"), else the daemon takes this process as a job of its own. A
	 * broadcast or dynamic stream that no client reads any more is started
	 * again from its first batch for a client of another job.
	 */
	const char *job;
	/* --- LDR_ATTACH_OPTS_SIZE_V4: the client's order (docs/spec.md, "Client order") --- */
	/**
	 * 1: this attachment's batches are the ones its client lists with
	 * ldr_order(), epoch after epoch (a sampler's order, batches of any size
	 * up to the pipeline's batch_size); partition mode, rank 0 of 1, a stream
	 * of its own; has_start says where its first ldr_order() begins. The
	 * daemon builds nothing it was not given. Such an attachment does not
	 * follow a restarted daemon (its next ldr_next() fails: attach again).
	 */
	int client_order;
	/* --- LDR_ATTACH_OPTS_SIZE_V5: elastic resume (docs/spec.md, "Partition") --- */
	/**
	 * 1: epoch start_epoch (has_start set) is the tail of its permutation from
	 * start_position on: the ranks before (of any world size) read positions
	 * [0, start_position), and this rank takes start_position + rank + j *
	 * world_size (wrapping to the epoch's first positions to pad, as
	 * DistributedSampler pads) as the last batches of that epoch;
	 * start_batch below the tail's first batch starts at it. The epochs after
	 * it are the plain share. Partition mode, not client_order. A daemon that
	 * does not know it fails the attach with -EPROTONOSUPPORT.
	 */
	int has_start_position;
	uint64_t start_position;  /**< 0..the source's samples */
};

/** Size of the first versioned layout (every field up to device_index); what size 0 means. */
#define LDR_ATTACH_OPTS_SIZE_V1 (offsetof(struct ldr_attach_opts, device_index) + sizeof(int))
/** The layout with has_augment_seed and augment_seed. */
#define LDR_ATTACH_OPTS_SIZE_V2 (offsetof(struct ldr_attach_opts, augment_seed) + sizeof(uint64_t))
/** The layout with job. */
#define LDR_ATTACH_OPTS_SIZE_V3 (offsetof(struct ldr_attach_opts, job) + sizeof(const char *))
/** The layout with client_order. */
#define LDR_ATTACH_OPTS_SIZE_V4 (offsetof(struct ldr_attach_opts, client_order) + sizeof(int))
/** The layout with has_start_position and start_position. */
#define LDR_ATTACH_OPTS_SIZE_V5 (offsetof(struct ldr_attach_opts, start_position) + sizeof(uint64_t))
/** Longest job name (ldr_attach_opts.job), in bytes. */
#define LDR_JOB_MAX 128
/**
 * Most distinct augment seeds one pipeline's broadcast clients may use at
 * once, the spec's own seed (clients without augment_seed) counted.
 */
#define LDR_AUGMENT_SEEDS_MAX 8
/** Initialiser of struct ldr_attach_opts: the size set, every option its default. */
#define LDR_ATTACH_OPTS_INIT { .size = sizeof(struct ldr_attach_opts) }

/** Name of an error code (negative errno or LDR_E*). Never NULL. */
LDR_EXPORT const char *ldr_strerror(int err);

/** Name of a dtype ("uint16", "float32"...), or NULL when out of range. */
LDR_EXPORT const char *ldr_dtype_name(enum ldr_dtype dtype);
/** Size in bytes of one element of @p dtype, 0 when out of range. */
LDR_EXPORT size_t ldr_dtype_size(enum ldr_dtype dtype);
/** Name of a mode ("broadcast"...), or NULL. */
LDR_EXPORT const char *ldr_mode_name(enum ldr_mode mode);
/** Parse a mode name; returns the mode or -EINVAL. */
LDR_EXPORT int ldr_mode_from_name(const char *name);

/**
 * Resolve the daemon's socket path (README.md, "Running the daemon", last paragraph): @p explicit_path, else
 * $LOADERD_SOCKET, else $RUNTIME_DIRECTORY/loaderd.sock, else
 * $XDG_RUNTIME_DIR/loaderd.sock, else /run/loaderd/loaderd.sock.
 * Returns the length written, or -ENAMETOOLONG.
 */
LDR_EXPORT int ldr_socket_path(char *buf, size_t size, const char *explicit_path);

/** Version of libloader ("0.1.0"); ldr_nng_version() and ldr_protobuf_c_version() name the libraries it runs on. */
LDR_EXPORT const char *ldr_version(void);
/** Version of the nng library loaded at run time. */
LDR_EXPORT const char *ldr_nng_version(void);
/** Version of the protobuf-c library loaded at run time. */
LDR_EXPORT const char *ldr_protobuf_c_version(void);

/**
 * ldr_connect() - connect to a daemon and shake hands.
 * @param out receives the client
 * @param socket_path NULL resolves it with ldr_socket_path()
 * @param client_name shown by `loaderctl clients`, may be NULL
 *
 * The daemon's uid (SO_PEERCRED) must be root's, the caller's own or
 * loaderd's service user's ($LOADERD_DAEMON_USER, a name or uid, else the
 * user "loaderd"), else -EPERM naming the uid and the path, before anything
 * is sent to it; -EINVAL for a $LOADERD_DAEMON_USER that names nobody.
 * A reconnection (ldr_client_set_reconnect()) refuses a daemon of another
 * uid than this one's (docs/security.md, "Whose pipeline, whose daemon").
 */
LDR_EXPORT int ldr_connect(struct ldr_client **out, const char *socket_path,
                           const char *client_name);
/** Detach everything, close the connection, free the client. NULL is fine. */
LDR_EXPORT void ldr_close(struct ldr_client *client);
/** The message of this thread's last failed call (the daemon's, or libloader's
 * own), or "" if none failed yet. A successful call leaves it as it was. */
LDR_EXPORT const char *ldr_client_error(const struct ldr_client *client);
/** Id the daemon gave this connection (as `loaderctl clients` shows it); a new one after each reconnection. */
LDR_EXPORT uint64_t ldr_client_id(const struct ldr_client *client);

/**
 * ldr_client_set_reconnect() - how long the client reconnects when the daemon
 * goes away (docs/reliability.md, "Restart without killing training").
 * @param timeout_ms 0: never (the daemon going away is LDR_EDISCONNECTED at
 *        once); ldr_connect() sets $LOADERD_RECONNECT_TIMEOUT (seconds), else
 *        60000
 *
 * While the daemon is away the client redials (every 50 ms, doubling up to
 * 1 s), calls and ldr_next() wait (within their timeouts); once a daemon
 * answers again on the socket, libloader creates again the pipelines this
 * client created, attaches every attachment again at the next batch its
 * trainer has not taken, and says so in one line on stderr. Batches the
 * trainer holds stay valid until released. After @p timeout_ms without a
 * daemon every call fails with LDR_EDISCONNECTED, naming the time.
 * Return: 0, or -EINVAL for a negative @p timeout_ms.
 */
LDR_EXPORT int ldr_client_set_reconnect(struct ldr_client *client, int timeout_ms);
/** The reconnect timeout in milliseconds (0: never). */
LDR_EXPORT int ldr_client_reconnect_timeout(const struct ldr_client *client);
/** Reconnections to a restarted daemon that succeeded since ldr_connect(). */
LDR_EXPORT uint64_t ldr_client_reconnects(const struct ldr_client *client);
/**
 * The uid of the daemon this client talks to, read from the kernel at
 * connect (SO_PEERCRED) and checked: root, the client's own or loaderd's
 * service user ($LOADERD_DAEMON_USER, else "loaderd"); a reconnection must
 * find the same (docs/security.md, "Whose pipeline, whose daemon").
 */
LDR_EXPORT uint32_t ldr_client_daemon_uid(const struct ldr_client *client);
/** Synchronous calls of @p client (ldr_status_json(), ldr_create_pipeline(), ...),
 * from every thread, sent or being sent and not answered yet: each one the
 * daemon going away cancels. */
LDR_EXPORT unsigned ldr_client_calls_in_flight(const struct ldr_client *client);

/**
 * ldr_create_pipeline() - create a pipeline from a JSON spec (docs/spec.md).
 * @param exist_ok succeed when an identical pipeline of that name exists
 *        and is the caller's own or the daemon's (its config's); another
 *        user's is -EEXIST naming its owner (ldr_create_pipeline_of() joins
 *        it, attaching by name reads it; docs/security.md)
 * @param name_out receives the pipeline's name (may be NULL)
 * Return: 1 created, 0 existed (exist_ok), or a negative error.
 */
LDR_EXPORT int ldr_create_pipeline(struct ldr_client *client, const char *spec_json,
                                   int exist_ok, char *name_out, size_t name_size);
/**
 * ldr_create_pipeline_of() - ldr_create_pipeline() with exist_ok that may
 * also join the identical pipeline of that name of @p owner_uid, another
 * user (its access permitting): you name whose data you mean to read.
 * Return: 1 created (yours), 0 joined, or a negative error (-EEXIST when
 * the name is a third user's).
 */
LDR_EXPORT int ldr_create_pipeline_of(struct ldr_client *client, const char *spec_json,
                                      uint32_t owner_uid, char *name_out, size_t name_size);
/**
 * struct ldr_store_opts - what ldr_set_store() hands a pipeline
 *
 * Versioned as struct ldr_attach_opts: @c size is sizeof as the caller knows
 * it, or 0 (this layout); fields added later go at the end.
 */
struct ldr_store_opts {
	size_t size;                   /**< sizeof(struct ldr_store_opts), or 0 */
	/** Hand them only when they differ from the keys this client last sent
	 * for the pipeline (its create or an earlier ldr_set_store()): 0 is
	 * returned, nothing sent, when they are the same. */
	int if_changed;
	/** The keys to hand; NULL: this process's, read as a create reads them
	 * (environment, then the profile's files; docs/storage.md). The region
	 * and endpoint are always this process's and must be the pipeline's. */
	const char *access_key_id;
	const char *secret_access_key;
	const char *session_token;     /**< NULL or "": none */
	int64_t expires;               /**< with explicit keys: their expiry, Unix seconds UTC; 0 unknown */
};

/**
 * ldr_set_store() - fresh object-store credentials for a running pipeline
 * @param opts NULL: this process's credentials, always sent
 *
 * Only a client of the pipeline's owner uid, or root, may (-EPERM naming
 * the owner; docs/security.md). The daemon's requests for the pipeline that
 * start after the reply use them; those in flight finish with the old keys,
 * which it then wipes. -EINVAL when the pipeline reads no store, or the
 * endpoint or region differ from its own.
 * Return: 1 handed, 0 not sent (@c if_changed and the same keys), or a
 * negative error.
 */
LDR_EXPORT int ldr_set_store(struct ldr_client *client, const char *pipeline, const struct ldr_store_opts *opts);
/** Drop a pipeline; @p force drops it even while clients are attached. */
LDR_EXPORT int ldr_drop_pipeline(struct ldr_client *client, const char *name, int force);
/** The daemon's status as one JSON object; free *json_out with ldr_free(). */
LDR_EXPORT int ldr_status_json(struct ldr_client *client, char **json_out);
/** The pipelines as a JSON object {"pipelines": [...]}; free with ldr_free(). */
LDR_EXPORT int ldr_pipelines_json(struct ldr_client *client, char **json_out);
/**
 * ldr_set() - change one of the daemon's settings now (admins only).
 * @param key "workers", "log_level", "memory_limit" or "prefetch"
 * @param pipeline for "prefetch": the pipeline; else NULL
 * @param value the new value as text: "8", "debug", "4G"
 * @param json_out on success {"key", "old", "new"[, "pipeline"][, "note"]};
 *        free with ldr_free()
 * @return 0, or -EPERM for a client that is not an admin (root, the
 * daemon's user, the config's admin_group), -EINVAL for an unknown key or a
 * bad value, -ERANGE for a prefetch above the pipeline's slots; the
 * daemon's message is ldr_client_error(). docs/config.md.
 */
LDR_EXPORT int ldr_set(struct ldr_client *client, const char *key, const char *pipeline,
                       const char *value, char **json_out);
/**
 * ldr_reload() - have the daemon re-read its config file, as SIGHUP does
 * (admins only).
 * @param json_out on success what changed: {"file", "changed", "restart_needed",
 *        "pipelines"} (docs/config.md, "Reload"); free with ldr_free()
 * @return 0, or -EINVAL for an invalid file (nothing changed; the message,
 * "FILE: key: why", is ldr_client_error()), -EPERM, -ENOENT without a file,
 * -EBUSY when 16 reloads wait already, -ESHUTDOWN when the daemon stops.
 * The reply comes once the reload is done (its new pipelines' files opened
 * and indexed): this waits up to 10 minutes, not the 60 s of other calls.
 */
LDR_EXPORT int ldr_reload(struct ldr_client *client, char **json_out);
/** Free memory returned by this library. */
LDR_EXPORT void ldr_free(void *ptr);

/**
 * ldr_attach() - attach to a pipeline and map its slab (copy-on-write).
 * @param opts NULL means broadcast with the defaults
 */
LDR_EXPORT int ldr_attach(struct ldr_client *client, const char *pipeline,
                          const struct ldr_attach_opts *opts,
                          struct ldr_attachment **out);
/**
 * ldr_detach() - detach: the daemon drops every lease of this attachment.
 *
 * Host batches not yet released are kept first (ldr_batch_keep() with every
 * field): they stay valid and unchanged until ldr_release(), although the
 * daemon reuses their slots. ldr_attachment_kept() counts them. CUDA batches
 * cannot be kept: their device memory may be refilled from now on (copy
 * those you keep before detaching). The attachment's memory goes when its
 * last batch is released. NULL is fine.
 */
LDR_EXPORT int ldr_detach(struct ldr_attachment *att);

/**
 * ldr_order() - give the next batches of a client_order attachment.
 *
 * Batches @p first_batch, @p first_batch + 1, ... of epoch @p epoch, of
 * @p sizes[i] samples each (1 up to the pipeline's batch_size), whose dataset
 * indices @p indices lists batch after batch. An epoch's batches come in
 * order, in one call or several; @p last says the epoch ends after these
 * (the next call begins an epoch, at its batch 0). The daemon builds a batch
 * once its order has come; ldr_next() delivers them in this order, with
 * these epoch and index numbers. Long orders go in several requests, each
 * under the message limit. libloader keeps a copy until the batches are
 * taken: a daemon restarted meanwhile is given again what was not taken
 * (an order the daemon going away cut short too: that call returns 0), and
 * a call made while the client reconnects waits for it.
 *
 * @return 0, or a negative errno with ldr_client_error() naming what the
 * daemon refused (an index out of range, a batch above batch_size, an epoch
 * that does not continue the order, -EDQUOT past the memory limit): the
 * request it refused was not taken, but those sent before it in the same
 * call were (the epoch is open there: continue it, or attach again).
 */
LDR_EXPORT int ldr_order(struct ldr_attachment *att, uint64_t epoch, uint64_t first_batch,
                         const uint32_t *sizes, size_t nbatches, const uint64_t *indices, int last);

/**
 * ldr_attachment_release_refused() - releases of this attachment's leases
 * that the daemon refused since the attach, and its message for the last.
 *
 * libloader sends only leases it holds, so a refusal is a bug of libloader
 * (or of the daemon) unless the pipeline was dropped with force meanwhile;
 * the batch is released on this side all the same, and the stream goes on.
 * @param msg receives the daemon's message for the last refusal ("" when
 *        none), NUL-terminated and truncated to @p size; may be NULL
 * Return: the number of refused Release requests.
 */
LDR_EXPORT uint64_t ldr_attachment_release_refused(const struct ldr_attachment *att, char *msg,
                                                   size_t size);

/** Fields per batch of this attachment. */
LDR_EXPORT int ldr_attachment_nfields(const struct ldr_attachment *att);
/** Batches per epoch in this attachment's share (partition: per rank). */
LDR_EXPORT uint64_t ldr_attachment_batches_per_epoch(const struct ldr_attachment *att);
/** Samples per epoch in this attachment's share. */
LDR_EXPORT uint64_t ldr_attachment_samples_per_epoch(const struct ldr_attachment *att);
/** Epochs of the pipeline, 0 = endless. */
LDR_EXPORT uint64_t ldr_attachment_epochs(const struct ldr_attachment *att);
/** Rows of a full batch. */
LDR_EXPORT uint32_t ldr_attachment_batch_size(const struct ldr_attachment *att);
/**
 * ldr_attachment_owner() - the uid that owns the attached pipeline, as the
 * daemon said at the attach (a re-attach after a restart checks it is the
 * same). A client decides by it whether the pipeline's batches were written
 * by its own user's code (docs/security.md).
 * @param uid receives the owner's uid
 * Return: 0, or -ENODATA when the daemon did not say (an older daemon).
 */
LDR_EXPORT int ldr_attachment_owner(const struct ldr_attachment *att, uint32_t *uid);
/**
 * Base address and size of the mapped slab (copy-on-write). Slot i lies at
 * base + i * slot bytes until a batch in slot i is kept: its copy then stays
 * there and the slot's later batches are mapped elsewhere, so take a batch's
 * addresses from ldr_batch_field(), never from the slab. After a
 * reconnection (ldr_client_set_reconnect()) it is the new daemon's slab; the
 * batches still held from the old one stay where they were until released.
 */
LDR_EXPORT const void *ldr_attachment_slab(const struct ldr_attachment *att, size_t *size);
/**
 * ldr_attachment_share() - the leases this attachment may hold now, whether
 * its trainer took the batches or they wait in libloader's window (docs/
 * protocol.md, "Sharing slots"). The daemon tells it with every delivery;
 * before it does (or a daemon that does not), it is the pipeline's slots.
 */
LDR_EXPORT uint32_t ldr_attachment_share(const struct ldr_attachment *att);
/**
 * ldr_attachment_held() - batches the trainer holds: returned by ldr_next(),
 * not yet released and not kept. When it reaches the share, ldr_next() keeps
 * the oldest (host) or fails with -ENOBUFS (CUDA).
 */
LDR_EXPORT uint32_t ldr_attachment_held(const struct ldr_attachment *att);
/**
 * ldr_attachment_kept() - batches of this attachment kept so far
 * (ldr_batch_keep(), by ldr_next() when the trainer held its share, by
 * ldr_detach()) and the bytes copied for them, since the attach.
 * @param batches, bytes receive the counts; either may be NULL
 * Return: 0.
 */
LDR_EXPORT int ldr_attachment_kept(const struct ldr_attachment *att, uint64_t *batches, uint64_t *bytes);

/**
 * ldr_next() - the next batch of this attachment.
 * @param timeout_ms -1 waits forever
 *
 * When no batch is here and the trainer holds its whole share
 * (ldr_attachment_held() >= ldr_attachment_share()), none can come until
 * one goes back: ldr_next() then keeps the oldest batches held
 * (ldr_batch_keep(), every field: a copy each) until the trainer holds one
 * less than its share, and their slots go back to the daemon at once. Do not
 * write into a held batch from another thread meanwhile (the kept copy may
 * miss what was written during the copy).
 *
 * Return: 0 with *out set, LDR_EOF at the end of a finite pipeline,
 * LDR_EBATCH for a batch that failed to build (*out not set; the next call
 * goes on), -ETIMEDOUT, -ENOBUFS when a CUDA attachment's trainer holds its whole
 * share (device batches cannot be kept: release some), or another negative
 * error.
 */
LDR_EXPORT int ldr_next(struct ldr_attachment *att, int timeout_ms, struct ldr_batch **out);
/**
 * ldr_attachment_failed() - the last failed batch ldr_next() reported
 * (LDR_EBATCH): its epoch and index (either pointer may be NULL).
 * Return: the daemon's error for it, a negative errno (-ECHILD: a Python
 * worker died building it), or 0 when none failed yet.
 */
LDR_EXPORT int ldr_attachment_failed(const struct ldr_attachment *att, uint64_t *epoch,
                                     uint64_t *index);
/**
 * ldr_release() - release a batch: its slot may be reused. The pages the
 * process wrote in it are discarded first; a kept batch's copy is freed.
 * Safe to call from any thread, and after ldr_detach() and ldr_close().
 */
LDR_EXPORT void ldr_release(struct ldr_batch *batch);
/**
 * ldr_batch_keep() - keep a host batch past its lease.
 * @param field_mask the fields to keep: bit i is field i, ~0 every field
 *
 * Copies the pages of the fields in @p field_mask into private memory at the
 * batch's own addresses (ldr_batch_field() pointers stay valid and keep the
 * bytes, including what the process wrote) and gives the slot back to the
 * daemon. The batch stays valid until ldr_release(), which frees the copy.
 * Fields not in the mask are undefined afterwards (they may show later
 * batches). Costs one copy of the kept fields (ldr_attachment_kept() counts
 * it). Keeping a kept batch again does nothing. Do not write into the batch
 * from another thread during the call.
 *
 * Return: 0, -ENOTSUP for a batch of a CUDA attachment (device memory cannot
 * be kept: copy it), -ENOMEM, or another negative errno; the batch is then
 * held as before.
 */
LDR_EXPORT int ldr_batch_keep(struct ldr_batch *batch, uint64_t field_mask);
/** Whether the batch was kept (ldr_batch_keep(), ldr_next(), ldr_detach()): 1 or 0. */
LDR_EXPORT int ldr_batch_is_kept(const struct ldr_batch *batch);
/**
 * ldr_release_after() - release a CUDA batch once the work queued on a stream is done.
 * @param cuda_stream the CUstream / cudaStream_t that used the batch (NULL: the
 *        legacy default stream), in the device's primary context
 *
 * Records an event on @p cuda_stream now and returns at once; the lease goes
 * back to the daemon when the event completed, so the slot is not refilled
 * while kernels queued before this call still read it. For a host attachment
 * it is ldr_release(). Safe to call from any thread.
 */
LDR_EXPORT void ldr_release_after(struct ldr_batch *batch, void *cuda_stream);

/** Epoch of the batch (0-based). */
LDR_EXPORT uint64_t ldr_batch_epoch(const struct ldr_batch *batch);
/** Index of the batch within its epoch (0-based; partition: within the rank's share). */
LDR_EXPORT uint64_t ldr_batch_index(const struct ldr_batch *batch);
/** Rows in this batch (fewer than the batch size for a short last batch). */
LDR_EXPORT uint32_t ldr_batch_rows(const struct ldr_batch *batch);
/** Fields of the batch, as ldr_attachment_nfields(). */
LDR_EXPORT int ldr_batch_nfields(const struct ldr_batch *batch);
/**
 * ldr_batch_field() - describe field @p i of the batch; returns 0 or -EINVAL.
 *
 * For a CUDA attachment (ldr_attachment_device()), out->data is a device
 * pointer (a CUdeviceptr) in the device's primary context, valid until the
 * batch is released: the copy to the device completed before the batch was
 * delivered, so it can be used on any stream at once.
 */
LDR_EXPORT int ldr_batch_field(const struct ldr_batch *batch, int i, struct ldr_field *out);
/** As ldr_batch_field(), with out->data in the host slab (or kept copy), whatever the device. */
LDR_EXPORT int ldr_batch_field_host(const struct ldr_batch *batch, int i, struct ldr_field *out);
/**
 * What ldr_batch_describe() tells of a batch and its attachment in one call:
 * the batch's own values (as ldr_batch_epoch(), ldr_batch_index(),
 * ldr_batch_rows()) and the attachment's keeping counters at that moment (as
 * ldr_attachment_held(), ldr_attachment_share(), ldr_attachment_kept()).
 */
struct ldr_batch_info {
	uint64_t epoch;           /**< epoch of the batch */
	uint64_t index;           /**< index of the batch within its epoch */
	uint32_t rows;            /**< rows of this batch */
	uint32_t held;            /**< batches the trainer holds, this one included */
	uint32_t share;           /**< leases the attachment may hold now */
	int nfields;              /**< fields of the batch */
	uint64_t kept_batches;    /**< batches kept so far (ldr_attachment_kept()) */
	uint64_t kept_bytes;      /**< their bytes */
};
/**
 * ldr_batch_describe() - the batch and its first @p nfields fields in one call.
 * @param info   filled as struct ldr_batch_info says
 * @param fields an array of @p nfields entries, filled as ldr_batch_field()
 *               fills one (CUDA: device pointers); NULL with @p nfields 0
 * @param nfields how many fields to describe: 0 to ldr_batch_nfields()
 *
 * For bindings whose every foreign call costs (Python's ctypes): one call per
 * batch instead of one per field and value. Returns 0, or -EINVAL (nothing
 * filled) when @p nfields is out of range.
 */
LDR_EXPORT int ldr_batch_describe(const struct ldr_batch *batch, struct ldr_batch_info *info,
                                  struct ldr_field *fields, int nfields);
/**
 * ldr_next_described() - ldr_next(), then, for a batch, ldr_batch_describe().
 *
 * Returns what ldr_next() returns; *@p out and @p fields are set only when it
 * returns 0. The attachment's counters in @p info (held, share, kept_*) are
 * filled whatever it returns, the batch's values only with a batch.
 */
LDR_EXPORT int ldr_next_described(struct ldr_attachment *att, int timeout_ms, struct ldr_batch **out,
                                  struct ldr_batch_info *info, struct ldr_field *fields, int nfields);
/** Where the attachment's batches are: LDR_DEVICE_HOST, or LDR_DEVICE_CUDA with *@p index = N of cuda:N. */
LDR_EXPORT enum ldr_device_kind ldr_attachment_device(const struct ldr_attachment *att, int *index);

#ifdef __cplusplus
}
#endif

#endif
