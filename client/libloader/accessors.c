/* SPDX-License-Identifier: MIT */
/* libloader: what an attachment and a batch tell: layout, fields, counters.
 */
#include "libloader-private.h"
#include "devmap.h"

uint64_t ldr_attachment_release_refused(const struct ldr_attachment *a, char *msg, size_t size)
{
	struct ldr_client *c = a->c;
	uint64_t n;

	bool locked = reader_lock(c);
	n = a->rel_refused;
	if (msg && size)
		snprintf(msg, size, "%s", a->rel_msg);
	if (a->br.sh) {
		/* those of the batch ring, which the daemon counts there */
		uint64_t k = atomic_load_explicit(&a->br.sh->r_refused, memory_order_acquire);
		if (k && msg && size)
			snprintf(msg, size, "%.*s", (int)sizeof(a->br.sh->r_msg) - 1, a->br.sh->r_msg);
		n += k;
	}
	reader_unlock(c, locked);
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

int ldr_attachment_owner(const struct ldr_attachment *a, uint32_t *uid)
{
	if (!a->has_owner)
		return -ENODATA;
	if (uid)
		*uid = (uint32_t)a->owner;
	return 0;
}

const void *ldr_attachment_slab(const struct ldr_attachment *a, size_t *size)
{
	struct ldr_client *c = a->c;
	const void *base;

	bool locked = reader_lock(c);
	if (size)
		*size = a->map->size;
	base = a->map->base;
	reader_unlock(c, locked);
	return base;
}

int ldr_attachment_kept(const struct ldr_attachment *a, uint64_t *batches, uint64_t *bytes)
{
	struct ldr_client *c = a->c;

	bool locked = reader_lock(c);
	if (batches)
		*batches = a->kept_batches;
	if (bytes)
		*bytes = a->kept_bytes;
	reader_unlock(c, locked);
	return 0;
}

uint32_t ldr_attachment_share(const struct ldr_attachment *a)
{
	struct ldr_client *c = a->c;
	uint32_t s;

	bool locked = reader_lock(c);
	s = share_now(a);
	reader_unlock(c, locked);
	return s;
}

uint32_t ldr_attachment_held(const struct ldr_attachment *a)
{
	struct ldr_client *c = a->c;
	uint32_t n;

	bool locked = reader_lock(c);
	n = a->nheld;
	reader_unlock(c, locked);
	return n;
}

enum ldr_device_kind ldr_attachment_device(const struct ldr_attachment *a, int *index)
{
	if (index)
		*index = a->device_kind == LDR_DEVICE_CUDA ? a->device_index : -1;
	return a->device_kind;
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

	bool locked = reader_lock(c);
	info->held = a->nheld;
	info->share = share_now(a);
	info->kept_batches = a->kept_batches;
	info->kept_bytes = a->kept_bytes;
	reader_unlock(c, locked);
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
	if (a->c->pid == self_pid())
		info_counters(a, info);
	return r;
}
