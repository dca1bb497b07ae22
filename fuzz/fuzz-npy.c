/* SPDX-License-Identifier: MIT */
/* fuzz-npy - the .npy header parser, through source_open() of an npy spec
 *
 * A .npy file is a dataset file: untrusted. The input is the whole file; it
 * is written to a private directory and opened as the one array of an npy
 * source, as a pipeline create does. An array that opens must fit its file
 * (every row is read at data_offset + i * row_bytes): the first and the last
 * sample are read back, which must succeed.
 */
#include "fuzz.h"

#include "source.h"
#include "spec.h"

static struct spec *spec;
static char path[128];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char text[256], err[512];

	fuzz_file("x.npy", NULL, 0, path, sizeof(path));
	snprintf(text, sizeof(text), "{\"name\": \"fuzz\", \"source\": {\"kind\": \"npy\", "
		 "\"paths\": [\"%s\"]}}", path);
	if (spec_parse(&spec, text, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz-npy: %s\n", err);
		abort();
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct source *src = NULL;
	const struct field_desc *f;
	char err[512];
	void *buf, *dsts[1];
	uint64_t n;

	fuzz_file("x.npy", data, size, path, sizeof(path));
	int r = source_open(&src, spec, err, sizeof(err));

	if (r < 0) {
		if (!err[0] && r != -ENOMEM) { /* common.h's error rule */
			fprintf(stderr, "source_open failed without a message\n");
			abort();
		}
		return 0;
	}
	f = source_field(src, 0);
	n = source_nsamples(src);
	if (source_nfields(src) != 1 || n == 0 || f->sample_bytes == 0 ||
	    f->sample_bytes > size || n > size / f->sample_bytes) {
		fprintf(stderr, "opened: %zu fields, %llu samples of %zu bytes from %zu bytes\n",
			source_nfields(src), (unsigned long long)n, f->sample_bytes, size);
		abort();
	}
	buf = malloc(f->sample_bytes);
	if (buf) {
		dsts[0] = buf;
		if (source_read(src, NULL, 0, dsts, err, sizeof(err)) < 0 ||
		    source_read(src, NULL, n - 1, dsts, err, sizeof(err)) < 0) {
			fprintf(stderr, "an opened array cannot be read: %s\n", err);
			abort();
		}
		free(buf);
	}
	source_free(src);
	return 0;
}
