/* SPDX-License-Identifier: MIT */
/* pyw-wire - the bytes of the Python workers' socket, <socket>.workers
 *
 * A "python" pipeline (docs/python.md, "Your own Dataset") is built by
 * processes of the user who created it: one host (a zygote that never runs
 * user code) and the workers it forks. Both ends are on one machine: host
 * byte order, no padding (every struct below is laid out without holes).
 *
 * Every message is a struct pyw_hdr followed by hdr.len payload bytes (at
 * most PYW_MAX_PAYLOAD). Each process makes one connection:
 *
 *   host:   -> HELLO (role HOST, nworkers)
 *           <- WELCOME, with the slab's read-write memfd in SCM_RIGHTS
 *           -> MAPPED          (it mapped the slab MAP_SHARED read-write)
 *           <- READY           (the daemon sealed the slab: F_SEAL_FUTURE_WRITE,
 *                               no other process can map it writable from now
 *                               on; the host forks its workers, which inherit
 *                               the mapping)
 *           -> WORKER_EXIT ... (whenever a worker dies; informational)
 *   worker: -> HELLO (role WORKER, worker_id)
 *           <- WELCOME (no fd: it has the host's mapping)
 *           <- TASK ... -> DONE or FAIL, one answer per TASK, in any order
 *
 * Any error: <- ERROR (status, a sentence), then the daemon closes. The daemon
 * closes every connection of a pipeline when it is dropped or fails; the
 * processes exit on EOF. The peer's uid (SO_PEERCRED) must be the pipeline
 * owner's; a worker must come while its host is connected. Identities are the
 * kernel's (SO_PEERCRED's uid and pid), and counts are checked: a DONE skips
 * at most its task's rows, a FAIL names a sample of the source, a WORKER_EXIT
 * one of the host's workers.
 */
#pragma once

#include <stdint.h>

#define PYW_MAGIC 0x5750444cu   /* "LDPW" */
#define PYW_VERSION 1
#define PYW_MAX_PAYLOAD (1u << 20)
#define PYW_MSG_MAX 16384       /* bytes of a FAIL or ERROR message */

enum pyw_type {
	PYW_HELLO = 1,       /* struct pyw_hello */
	PYW_WELCOME = 2,     /* struct pyw_welcome + nfields x struct pyw_field */
	PYW_ERROR = 3,       /* int32 status (negative errno) + UTF-8 text */
	PYW_MAPPED = 4,      /* empty */
	PYW_READY = 5,       /* empty */
	PYW_WORKER_EXIT = 6, /* struct pyw_worker_exit */
	PYW_TASK = 10,       /* struct pyw_task + nrows x uint64 sample index */
	PYW_DONE = 11,       /* struct pyw_done */
	PYW_FAIL = 12,       /* struct pyw_fail + UTF-8 text */
};

enum pyw_role {
	PYW_ROLE_HOST = 1,
	PYW_ROLE_WORKER = 2,
};

struct pyw_hdr {
	uint32_t magic;
	uint16_t type;       /* enum pyw_type */
	uint16_t flags;      /* 0 */
	uint32_t len;        /* payload bytes that follow */
};

struct pyw_hello {
	uint32_t version;    /* PYW_VERSION */
	uint32_t role;       /* enum pyw_role */
	uint32_t nworkers;   /* host: workers it will run (1..256) */
	uint32_t worker_id;  /* worker: 0..nworkers-1 */
	uint32_t pid;        /* the sender's; the daemon uses the kernel's (SO_PEERCRED) */
	uint32_t reserved;
	char pipeline[64];   /* NUL-terminated name */
};

struct pyw_welcome {
	int32_t status;      /* 0 */
	uint32_t nfields;
	uint64_t slab_size;  /* bytes to map */
	uint64_t slot_bytes; /* slot i starts at i * slot_bytes */
	uint32_t nslots;
	uint32_t batch_size;
	uint64_t nsamples;
	uint64_t seed;       /* the spec's; with the epoch and the index it seeds each sample */
	uint32_t on_error;   /* 0 fail, 1 skip */
	uint32_t nworkers;   /* the host's count */
};

/* Row r of field f of slot s is at s * slot_bytes + offset + r * sample_bytes. */
struct pyw_field {
	uint64_t offset;
	uint64_t sample_bytes;
};

struct pyw_worker_exit {
	uint32_t worker_id;
	uint32_t pid;
	int32_t wstatus;     /* as waitpid() gives it */
	uint32_t reserved;
};

/*
 * Build rows row0 .. row0+nrows-1 of slot @slot: row row0+k is dataset[idx[k]]
 * of epoch @epoch. With collate (the spec names a collate_fn) a TASK is always
 * the whole batch, row0 0.
 */
struct pyw_task {
	uint64_t task_id;
	uint64_t epoch;
	uint32_t slot;
	uint32_t row0;
	uint32_t nrows;
	uint32_t reserved;
};

struct pyw_done {
	uint64_t task_id;
	uint64_t skipped;    /* on_error skip: samples replaced in this task, 0..nrows */
};

struct pyw_fail {
	uint64_t task_id;
	uint64_t index;      /* the sample that failed, < nsamples */
	int32_t status;      /* negative errno, -EINVAL for an exception */
	uint32_t reserved;
};
