/* SPDX-License-Identifier: MIT */
/* slabmap - a client's copy-on-write mapping of a daemon slab (libloader)
 *
 * The slab's fd is read-only; it is mapped MAP_PRIVATE, PROT_READ|PROT_WRITE.
 * A page the process never writes is the daemon's page (the page cache of the
 * memfd: later writes of the daemon show through); a page it writes becomes a
 * private anonymous copy, invisible to the daemon and to other clients. These
 * helpers give written pages back (slabmap_discard), turn a range into private
 * memory for good (slabmap_keep) and undo that (slabmap_unkeep). They take no
 * lock and know nothing of leases: libloader.c calls them in the right order.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* How slabmap_keep() made a range private (for slabmap_unkeep). */
enum slabmap_kept {
	SLABMAP_POPULATED = 1, /* MADV_POPULATE_WRITE: the file mapping, every page written */
	SLABMAP_COPIED = 2,    /* an anonymous copy moved over the range (mremap) */
};

/** A byte range relative to the start of the range slabmap_keep() is given. */
struct slabmap_range {
	size_t off, len;
};

/** The page size (every length and offset below is a multiple of it). */
size_t slabmap_page(void);

/**
 * slabmap_map() - map @len bytes of @fd at file offset @off, copy-on-write
 * (MAP_PRIVATE, PROT_READ|PROT_WRITE, MAP_NORESERVE).
 * Return: the address, or NULL with errno set.
 */
void *slabmap_map(int fd, size_t len, uint64_t off);

/**
 * slabmap_discard() - give back the pages of [@addr, @addr + @len) that this
 * process wrote, so that the range reads the file again (@fd at @off).
 *
 * Reads /proc/self/pagemap (opened once per process, read with pread): a
 * written page is present or swapped, and not a file page (bit 61 clear);
 * those runs get MADV_DONTNEED. Without pagemap, the whole range gets
 * MADV_DONTNEED; when madvise fails (a locked mapping), the range is mapped
 * again from @fd with MAP_FIXED. @discarded, when not NULL, receives the bytes
 * given back (the whole range when it could not tell).
 * Return: 0, or a negative errno when the range could not be reset at all.
 */
int slabmap_discard(void *addr, size_t len, int fd, uint64_t off, size_t *discarded);

/**
 * slabmap_keep() - make the pages of @keep (sorted or not, may overlap;
 * rounded out to pages within the range) of [@addr, @addr + @len) private
 * copies at the same addresses, so that later writes to the file do not show.
 *
 * Faults the pages in for writing (MADV_POPULATE_WRITE): the copy happens in
 * the kernel page by page, so a thread writing into the range meanwhile keeps
 * its writes. On a kernel without it (or a range not writable) the kept pages
 * are copied into a fresh anonymous mapping that mremap(MREMAP_FIXED) moves
 * over the range in one step. Pages outside @keep are left as they are
 * (copied mode: zero). @copied receives the bytes made private.
 * Return: SLABMAP_POPULATED or SLABMAP_COPIED, or a negative errno with the
 * range as it was (populated: some pages may be private already, harmless).
 */
int slabmap_keep(void *addr, size_t len, const struct slabmap_range *keep, int nkeep, size_t *copied);

/**
 * slabmap_unkeep() - undo slabmap_keep() (@how, its return value): the range
 * is a pristine copy-on-write mapping of @fd at @off again.
 * Return: 0, or a negative errno (the range is then left mapped as it was).
 */
int slabmap_unkeep(void *addr, size_t len, int how, int fd, uint64_t off);
