/* SPDX-License-Identifier: MIT */
/* devcopy - a pipeline's slots on one CUDA device
 *
 * Device slot i mirrors host slot i (cudadev.h), so it is free exactly when
 * the host slot is. A batch is copied once per device and delivered to that
 * device's clients only once its copy completed.
 */
#include "engine-private.h"

/* --- device copies ------------------------------------------------------ */

void devcopy_free_all(struct pipeline *pl)
{
	while (pl->devs) {
		struct devcopy *dc = pl->devs;
		pl->devs = dc->next;
		cuda_dslab_free(pl->eng->cuda, dc->ds);
		free(dc->state);
		free(dc);
	}
}

static void slab_free_cb(void *slab)
{
	slab_free(slab);
}

void devcopy_slab_free(struct pipeline *pl)
{
	/* a pinned slab is unmapped only after its engine unregistered it */
	if (pl->host_pinned)
		cuda_host_unregister(pl->eng->cuda, pl->pin_device, pl->slab->base, slab_free_cb, pl->slab);
	else
		slab_free(pl->slab);
}

void devcopy_maybe_free(struct devcopy *dc)
{
	struct pipeline *pl = dc->pl;
	struct devcopy **pp;

	/* A legacy IPC allocation must outlive every importer's cuIpcOpenMemHandle
	 * (freeing it first is undefined), and a client may keep batches past its
	 * detach: it stays until the pipeline goes. A VMM allocation lives on in
	 * the clients' mappings; ours can go now. */
	if (dc->natts || dc->inflight || dc->ds->kind == CUDA_MEM_IPC)
		return;
	for (pp = &pl->devs; *pp; pp = &(*pp)->next)
		if (*pp == dc) {
			*pp = dc->next;
			break;
		}
	cuda_dslab_free(pl->eng->cuda, dc->ds);
	free(dc->state);
	free(dc);
}

static void devcopy_fail(struct devcopy *dc, const char *msg)
{
	if (dc->failed)
		return;
	dc->failed = true;
	snprintf(dc->error, sizeof(dc->error), "cuda:%d: %s", dc->device, msg);
	log_err("pipeline %s: %s", dc->pl->spec->name, dc->error);
}

static void copy_done(void *cookie, int err, const char *msg)
{
	struct copy_cookie *c = cookie;
	struct devcopy *dc = c->dc;
	struct slot *slot = c->slot;
	struct pipeline *pl = dc->pl;

	free(c);
	dc->inflight--;
	pl->jobs--;
	if (err) {
		dc->state[slot->idx] = DEV_NONE;
		devcopy_fail(dc, msg);
	} else {
		dc->state[slot->idx] = DEV_DONE;
		dc->copies++;
	}
	slot_unref(pl, slot);
	devcopy_maybe_free(dc);
	if (pl->dropped) {
		pl->eng->hooks->maybe_free(pl);
		return;
	}
	pl->eng->hooks->update(pl);
}

/* Queue the copy of ready batch @b's @slot to @dc's device, unless it is
 * there or on its way. */
static void devcopy_kick(struct devcopy *dc, struct batch *b, struct slot *slot)
{
	struct pipeline *pl = dc->pl;
	struct cuda_span spans[SOURCE_MAX_FIELDS];
	struct copy_cookie *c;
	char msg[160];
	int r;

	if (!slot || dc->failed || dc->state[slot->idx] != DEV_NONE)
		return;
	for (size_t f = 0; f < pl->nfields; f++)
		spans[f] = (struct cuda_span){ pl->field_off[f], (uint64_t)b->rows * pl->fields[f].sample_bytes };
	c = malloc(sizeof(*c));
	if (!c) {
		devcopy_fail(dc, "out of memory queueing a copy");
		return;
	}
	c->dc = dc;
	c->slot = slot;
	r = cuda_copy(pl->eng->cuda, dc->ds, slot->idx, pl->slab->base + (uint64_t)slot->idx * pl->slot_bytes,
	              spans, pl->nfields, copy_done, c);
	if (r < 0) {
		free(c);
		snprintf(msg, sizeof(msg), "cannot queue a copy: %s", strerror(-r));
		devcopy_fail(dc, msg);
		return;
	}
	dc->state[slot->idx] = DEV_COPYING;
	slot->refs++;
	dc->inflight++;
	pl->jobs++;
}

/* Copy ready batch @b ahead of time to the devices of @s's attachments. A
 * dynamic stream whose clients sit on several devices copies on demand only:
 * each batch goes to one client, and its device is known when it is asked. */
void stream_prefetch_devices(struct stream *s, struct batch *b)
{
	struct devcopy *first = NULL;

	if (!s->pl->devs)
		return;
	if (s->mode == LDR_MODE_DYNAMIC)
		for (struct attachment *a = s->atts; a; a = a->next) {
			if (!a->dev)
				continue;
			if (first && a->dev != first)
				return;
			first = a->dev;
		}
	for (struct attachment *a = s->atts; a; a = a->next)
		if (a->dev)
			devcopy_kick(a->dev, b, batch_slot(b, a->group));
}

/* Can @b be delivered to @a now? For a CUDA client, once it is on the device. */
bool batch_ready(struct attachment *a, struct batch *b)
{
	struct devcopy *dc = a->dev;
	struct slot *slot = batch_slot(b, a->group);

	if (b->ready && b->failed)
		return true; /* its error is delivered: nothing to copy */
	if (!b->ready || !slot)
		return false;
	if (!dc || dc->state[slot->idx] == DEV_DONE)
		return true;
	devcopy_kick(dc, b, slot);
	return false;
}
/* The device slab of @pl on @info's device, allocated on its first client. */
int devcopy_get(struct pipeline *pl, const struct cuda_device_info *info, struct devcopy **out,
                       char *err, size_t errlen)
{
	struct engine *eng = pl->eng;
	struct devcopy *dc;
	int r;

	for (dc = pl->devs; dc; dc = dc->next)
		if (dc->device == info->index && !dc->failed) {
			dc->natts++;
			*out = dc;
			return 0;
		}
	if (!eng->cuda) {
		r = cuda_devices_new(&eng->cuda, eng->loop);
		if (r < 0)
			return errfmt(r, err, errlen,
			              "cuda:%d: cannot start the copy engines: %s", info->index, strerror(-r));
	}
	dc = calloc(1, sizeof(*dc));
	if (!dc || !(dc->state = calloc(pl->nslots, 1))) {
		free(dc);
		return errfmt(-ENOMEM, err, errlen, "cuda:%d: out of memory", info->index);
	}
	r = cuda_dslab_new(eng->cuda, info, pl->slot_bytes, pl->nslots, &dc->ds, err, errlen);
	if (r < 0) {
		free(dc->state);
		free(dc);
		return r;
	}
	if (!pl->host_pinned) {
		cuda_host_register(eng->cuda, info->index, pl->slab->base, pl->slab->size);
		pl->host_pinned = true;
		pl->pin_device = info->index;
	}
	dc->pl = pl;
	dc->device = info->index;
	dc->natts = 1;
	dc->next = pl->devs;
	pl->devs = dc;
	*out = dc;
	return 0;
}
