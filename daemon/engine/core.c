/* SPDX-License-Identifier: MIT */
/* core - the engine's core, the pipelines' owner: workers, completions, shutdown
 *
 * Everything here runs on the loop thread, except the bodies of the worker
 * tasks, which only read immutable pipeline state (source, sampler, field
 * layout) and write into the one slot their job owns. Their completions come
 * back through a queue and one uv_async (which coalesces: drain it whole).
 */
#include "engine-private.h"

#define STOP_WORKERS_MS 5000      /* how long a stop waits for busy worker threads */

static void on_async(uv_async_t *handle)
{
	struct engine *eng = handle->data;
	struct job *list, *rev = NULL;

	pthread_mutex_lock(&eng->done_lock);
	list = eng->done_head;
	eng->done_head = NULL;
	pthread_mutex_unlock(&eng->done_lock);
	/* restore submission order of completion, oldest first */
	while (list) {
		struct job *n = list->done_next;
		list->done_next = rev;
		rev = list;
		list = n;
	}
	while (rev) {
		struct job *n = rev->done_next;
		job_done(rev);
		rev = n;
	}
}
/* --- the engine --------------------------------------------------------- */

/* How the lower files reach the higher ones (engine-private.h). */
static const struct engine_hooks hooks = {
	.update = pipeline_update,
	.maybe_free = pipeline_maybe_free,
	.fail_pipeline = pipeline_fail,
	.find = engine_find,
	.job_over = job_done,
	.ring_next = attachment_next,
	.ring_fail = attachment_fail,
	.leave = att_leave,
	.lifetime = pipeline_lifetime,
};

int engine_new(struct engine **out, uv_loop_t *loop, unsigned nworkers, uint64_t memory_limit,
               const struct engine_ops *ops, void *userdata)
{
	struct engine *eng = calloc(1, sizeof(*eng));
	int r;

	if (!eng)
		return -ENOMEM;
	eng->loop = loop;
	eng->ops = *ops;
	eng->hooks = &hooks;
	eng->userdata = userdata;
	eng->memory_limit = memory_limit;
	eng->slow_timeout_ms = ENGINE_SLOW_TIMEOUT_DEFAULT_MS;
	pthread_mutex_init(&eng->done_lock, NULL);
	r = workers_new(&eng->workers, nworkers);
	if (r < 0) {
		free(eng);
		return r;
	}
	r = uv_async_init(loop, &eng->async, on_async);
	if (r < 0) {
		workers_free(eng->workers);
		free(eng);
		return r;
	}
	eng->async.data = eng;
	*out = eng;
	return 0;
}

void engine_shutdown(struct engine *eng)
{
	eng->shutdown = true;
	for (struct attachment *a = eng->atts; a; a = a->all_next)
		att_fail_pending(a, ESHUTDOWN, "daemon is shutting down");
}

bool engine_stopping(const struct engine *eng)
{
	return eng->shutdown;
}

static void on_async_closed(uv_handle_t *h)
{
	free(h->data);
}

static atomic_bool workers_abandoned;

bool engine_workers_abandoned(void)
{
	return atomic_load(&workers_abandoned);
}

struct engine *engine_free(struct engine *eng)
{
	if (!eng)
		return NULL;
	eng->shutdown = true;
	/* the workers and copy engines finish what is queued; completions are
	 * freed here. A worker stuck in a read that never returns (a hung
	 * network or FUSE mount) does not hold the stop: after STOP_WORKERS_MS
	 * the daemon exits without it, freeing nothing it may still use. */
	unsigned stuck;
	if (workers_stop_within(eng->workers, STOP_WORKERS_MS, &stuck) < 0) {
		log_warn("stopping: %u worker thread%s still reading after %d ms (a dataset file that "
		         "does not answer: a hung network or FUSE mount?); exiting without %s", stuck,
		         stuck == 1 ? " is" : "s are", STOP_WORKERS_MS, stuck == 1 ? "it" : "them");
		atomic_store(&workers_abandoned, true);
		uv_unref((uv_handle_t *)&eng->async);
		return NULL;
	}
	eng->workers = NULL;
	cuda_devices_stop(eng->cuda);
	while (eng->done_head) {
		struct job *j = eng->done_head;
		eng->done_head = j->done_next;
		job_free(j);
	}
	while (eng->atts) {
		struct attachment *a = eng->atts;
		eng->atts = a->all_next;
		attring_close(a);
		while (a->leases) {
			struct lease *l = a->leases;
			a->leases = l->next;
			free(l);
		}
		free(a);
	}
	while (eng->pipelines) {
		struct pipeline *pl = eng->pipelines;
		eng->pipelines = pl->next;
		pipeline_free(pl);
	}
	eng->cuda = cuda_devices_free(eng->cuda);
	registry_close(eng);
	pthread_mutex_destroy(&eng->done_lock);
	uv_close((uv_handle_t *)&eng->async, on_async_closed);
	return NULL;
}

unsigned engine_workers(const struct engine *eng)
{
	return workers_count(eng->workers);
}

uint64_t engine_memory_limit(const struct engine *eng)
{
	return eng->memory_limit;
}

uint64_t engine_memory_used(const struct engine *eng)
{
	return eng->memory_used;
}

uint64_t engine_memory_free(const struct engine *eng)
{
	return eng->memory_limit > eng->memory_used ? eng->memory_limit - eng->memory_used : 0;
}

int engine_set_workers(struct engine *eng, unsigned n, char *err, size_t errlen)
{
	int r = workers_resize(eng->workers, n);

	if (r == -EINVAL)
		return errfmt(r, err, errlen, "workers: %u is out of range (1..%d)", n, WORKERS_MAX);
	if (r < 0)
		return errfmt(r, err, errlen, "workers: %u of %u threads run, no more could start: %s",
		              workers_count(eng->workers), n, strerror(-r));
	return 0;
}

void engine_set_memory_limit(struct engine *eng, uint64_t bytes)
{
	eng->memory_limit = bytes;
}
