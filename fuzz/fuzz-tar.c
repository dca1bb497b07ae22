/* SPDX-License-Identifier: MIT */
/* fuzz-tar - tar_scan() over any bytes in a memfd
 *
 * A WebDataset shard is a dataset file: untrusted. Every member tar_scan()
 * reports must lie inside the file (the workers pread it at that offset and
 * that size) and carry a bounded, NUL-terminated name.
 */
#include "fuzz.h"

#include "common.h"
#include "tar.h"

struct scan {
	uint64_t size;
	uint64_t end;                 /* of the previous member's data */
	size_t n;
};

static int on_entry(void *userdata, const struct tar_entry *e, char *err, size_t errlen)
{
	struct scan *s = userdata;

	if (!e->name || strnlen(e->name, TAR_NAME_MAX + 1) > TAR_NAME_MAX) {
		fprintf(stderr, "member %zu: name too long\n", s->n);
		abort();
	}
	if (e->offset % 512 != 0 || e->offset < s->end || e->offset > s->size ||
	    e->size > s->size - e->offset) {
		fprintf(stderr, "member %zu '%s': data [%llu, +%llu) outside the file of %llu bytes "
			"or before the previous member's end %llu\n", s->n, e->name,
			(unsigned long long)e->offset, (unsigned long long)e->size,
			(unsigned long long)s->size, (unsigned long long)s->end);
		abort();
	}
	s->end = e->offset + e->size;
	s->n++;
	/* stop some scans early, as a caller's error does */
	if (s->n == 1000)
		return errfmt(-E2BIG, err, errlen, "fuzz: enough members");
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct scan s = { .size = size };
	char err[512] = "";
	int fd = fuzz_memfd(data, size), r;

	if (fd < 0)
		return 0;
	r = tar_scan(fd, "fuzz.tar", size, on_entry, &s, err, sizeof(err));
	if (r < 0 && r != -ENOMEM && !err[0]) { /* common.h's error rule */
		fprintf(stderr, "tar_scan: %d without a message\n", r);
		abort();
	}
	close(fd);
	return 0;
}
