/* SPDX-License-Identifier: MIT */
/* pyworkers - the Python workers that build a "python" pipeline's batches
 *
 * The processes are the pipeline owner's (docs/python.md, "Your own
 * Dataset"): a host that the creating trainer spawned, and the workers it
 * forks. They connect to <socket>.workers (pyw-wire.h). The daemon keeps what
 * it owns for every kind: the sampler, the slots, the leases; it sends each
 * batch's rows to the workers as tasks and takes the batch as ready when
 * every task is done. A worker that dies has its tasks sent again to the
 * others (PYW_MAX_DEATHS times); a host that goes fails the pipeline, as no
 * other process can map its sealed slab writable.
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>
#include <uv.h>

struct engine;
struct pipeline;
struct job;

#define PYW_MAX_WORKERS 256
#define PYW_MAX_DEATHS 3          /* deaths of workers over one task before it fails */
#define PYW_START_MS 60000        /* from create to the host's MAPPED */

/* The workers' listener, pyw_server_new(), is the server's to open: engine.h. */

/* A python pipeline was created: its state, and the timer for its host. */
int pyw_pipeline_new(struct pipeline *pl, char *err, size_t errlen);
/* It was dropped: close its processes' connections and end its jobs
 * (ECANCELED). May free @pl (its last job done). */
void pyw_pipeline_dropped(struct pipeline *pl);
/* pipeline_free(): what is left, jobs not ended included. */
void pyw_pipeline_free(struct pipeline *pl);
/* Its slab is sealed and its host is there: attachments may map it. */
bool pyw_ready(const struct pipeline *pl);
/* Why an attach must wait: "its Python workers are starting" etc. */
const char *pyw_state(const struct pipeline *pl);
/* The workers its host runs (1 before it said). */
unsigned pyw_nworkers(const struct pipeline *pl);
/* Queue @job's tasks to the workers (stream.c, in place of workers_submit). */
void pyw_submit(struct job *job);
/* The "python" object of the pipeline's status. */
json_t *pyw_status(const struct pipeline *pl);
