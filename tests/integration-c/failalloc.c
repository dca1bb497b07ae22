/* SPDX-License-Identifier: MIT */
/* failalloc - an LD_PRELOAD test double: allocations that fail on demand
 *
 * For the paths that only a failed allocation takes (test-alloc.c). Off until
 * the test calls failalloc_set() (found with dlsym): then realloc() fails with
 * ENOMEM when libloader calls it, and only then. Not for sanitizer builds:
 * their runtime must come first.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static atomic_bool fail_libloader_realloc;

void failalloc_set(bool on);

__attribute__((visibility("default"))) void failalloc_set(bool on)
{
	atomic_store(&fail_libloader_realloc, on);
}

static bool from_libloader(const void *caller)
{
	Dl_info di;

	return dladdr(caller, &di) && di.dli_fname && strstr(di.dli_fname, "libloader.so");
}

__attribute__((visibility("default"))) void *realloc(void *p, size_t n)
{
	static void *(*real)(void *, size_t);

	if (!real)
		real = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
	if (atomic_load(&fail_libloader_realloc) && from_libloader(__builtin_return_address(0))) {
		errno = ENOMEM;
		return NULL;
	}
	return real(p, n);
}
