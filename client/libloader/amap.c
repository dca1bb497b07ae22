/* SPDX-License-Identifier: MIT */
/* libloader: an attachment's mapping of a daemon's slab (struct amap): slot
 * addresses, the views of kept slots and their spare ranges.
 */
#include <sys/mman.h>

#include "libloader-private.h"
#include "slabmap.h"

/*
 * Map the slab (@fd of @size bytes, slots of @slot_bytes): copy-on-write when
 * @cow, else read-only shared. NULL with errno set when it cannot.
 */
struct amap *amap_open(int fd, size_t size, uint32_t nslots, uint64_t slot_bytes, bool cow)
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

void amap_free(struct amap *m, uint64_t slot_bytes)
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
void amap_put(struct ldr_attachment *a, struct amap *m)
{
	if (m && --m->refs == 0)
		amap_free(m, a->slot_bytes);
}

/* A pristine range of @slot for a new view, or NULL. Called with c->lock held. */
uint8_t *spare_pop(struct amap *m, uint32_t slot)
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
void spare_push(struct amap *m, uint32_t slot, uint8_t *addr)
{
	struct spare *sp = malloc(sizeof(*sp));

	if (!sp)
		return;
	sp->addr = addr;
	sp->next = m->spare[slot];
	m->spare[slot] = sp;
}
