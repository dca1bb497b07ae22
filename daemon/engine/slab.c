/* SPDX-License-Identifier: MIT */
/* slab - one sealed memfd of batch slots
 *
 * Slots live in memfds, not in /dev/shm files, so container /dev/shm limits do
 * not apply and nothing is left behind when the daemon dies. The read-only fd
 * is made by reopening the memfd through /proc/self/fd with O_RDONLY: a
 * mapping of it can be PROT_READ|MAP_SHARED only, so one client cannot write
 * into a batch another client reads.
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "slab.h"

int slab_seal(struct slab *slab)
{
	/* From here on only the mappings made so far write: no descriptor of
	 * the file, the reopened ones included, can be mapped writable and
	 * shared or written. Private writable mappings (a client's
	 * copy-on-write view) still work. */
	if (fcntl(slab->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) < 0)
		/* Linux < 5.1: no slab we could not keep clients from writing */
		return errno == EINVAL ? -ENOTSUP : -errno;
	if (fcntl(slab->fd, F_ADD_SEALS, F_SEAL_SEAL) < 0)
		return -errno;
	slab->sealed = true;
	return 0;
}

static int slab_make(struct slab **out, const char *name, size_t size, bool seal)
{
	char mname[80], path[64];
	struct slab *slab;
	int r;

	slab = calloc(1, sizeof(*slab));
	if (!slab)
		return -ENOMEM;
	slab->fd = slab->ro_fd = -1;
	slab->base = MAP_FAILED;
	slab->size = size;

	snprintf(mname, sizeof(mname), "loaderd:%s", name);
	slab->fd = memfd_create(mname, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (slab->fd < 0)
		goto fail_errno;
	if (ftruncate(slab->fd, (off_t)size) < 0)
		goto fail_errno;
	if (fcntl(slab->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		goto fail_errno;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", slab->fd);
	slab->ro_fd = open(path, O_RDONLY | O_CLOEXEC);
	if (slab->ro_fd < 0)
		goto fail_errno;
	slab->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, slab->fd, 0);
	if (slab->base == MAP_FAILED)
		goto fail_errno;
	if (seal && (r = slab_seal(slab)) < 0) {
		slab_free(slab);
		return r;
	}
	*out = slab;
	return 0;

fail_errno:
	r = -errno;
	slab_free(slab);
	return r;
}

int slab_new(struct slab **out, const char *name, size_t size)
{
	return slab_make(out, name, size, true);
}

int slab_new_unsealed(struct slab **out, const char *name, size_t size)
{
	return slab_make(out, name, size, false);
}

struct slab *slab_free(struct slab *slab)
{
	if (!slab)
		return NULL;
	if (slab->base != MAP_FAILED)
		munmap(slab->base, slab->size);
	if (slab->ro_fd >= 0)
		close(slab->ro_fd);
	if (slab->fd >= 0)
		close(slab->fd);
	free(slab);
	return NULL;
}
