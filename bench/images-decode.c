/* SPDX-License-Identifier: MIT */
/* images-decode - per-core rates: a plain TurboJPEG loop vs loaderd's sample path
 *
 *   images-decode ROOT SPEC.json [SECONDS]
 *
 * ROOT is an image folder (ROOT/CLASS/FILE.jpg). On one thread, for about
 * SECONDS (default 3) each:
 *   plain:  open + read + tjDecompress2 (full size, RGB) of every file in turn:
 *           the rate a plain C loop decodes the dataset at;
 *   source: source_read() of the spec's pipeline (decode + transforms + write
 *           into a batch row), epoch by epoch, into the rows of a batch buffer
 *           in turn (64 rows, 4 KiB-aligned, as in a slot).
 * The two alternate in blocks of 50 files (the same files), so that other load
 * on a shared machine slows both alike and the ratio stays comparable.
 * Prints one JSON object: {"plain_per_s":..., "source_per_s":..., "ratio":...}
 * by wall-clock time, and the same by this thread's CPU time ("..._per_cpu_s",
 * "cpu_ratio").
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "creds.h"
#include "imageset.h"
#include "source.h"
#include "spec.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* This thread's CPU time: the rates by it are less disturbed by other load. */
static double cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	buf[n] = '\0';
	*len = (size_t)n;
	return buf;
}

#define BLOCK 50

struct plain {
	struct imageset *set;
	size_t cap;
	unsigned char *file, *pix;
	tjhandle tj;
};

static int plain_one(struct plain *p, uint64_t i)
{
	char what[4096];
	int fd, w, h, ss, cs;
	struct stat st;
	size_t len;

	imageset_describe(p->set, i, what, sizeof(what));
	fd = open(what, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0 || (size_t)st.st_size > p->cap ||
	    read(fd, p->file, (size_t)st.st_size) != st.st_size) {
		fprintf(stderr, "images-decode: %s: read failed\n", what);
		return -1;
	}
	close(fd);
	len = (size_t)st.st_size;
	if (tjDecompressHeader3(p->tj, p->file, len, &w, &h, &ss, &cs) < 0 || w > 4096 ||
	    h > 4096 || tjDecompress2(p->tj, p->file, len, p->pix, w, 0, h, TJPF_RGB, 0) < 0) {
		fprintf(stderr, "images-decode: %s: %s\n", what, tjGetErrorStr2(p->tj));
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	char err[512];
	struct creds self;
	struct plain p = { .cap = 1 << 20 };
	struct spec *spec;
	struct source *src;
	double secs = argc > 3 ? atof(argv[3]) : 3.0, t0, t_plain = 0, t_src = 0, c_plain = 0,
	       c_src = 0;
	unsigned long long done = 0;
	const struct field_desc *f0, *f1;
	struct sample_ctx ctx = { .seed = 0 };
	size_t len, rows = 64, bytes;
	uint8_t *batch, *labels;
	char *text;
	uint64_t n;

	if (argc < 3) {
		fprintf(stderr, "usage: images-decode ROOT SPEC.json [SECONDS]\n");
		return 2;
	}
	creds_self(&self);
	p.file = malloc(p.cap);
	p.pix = malloc(4096 * 4096 * 3);
	p.tj = tjInitDecompress();
	if (imageset_open_folder(&p.set, &self, argv[1], err, sizeof(err)) < 0) {
		fprintf(stderr, "images-decode: %s\n", err);
		return 1;
	}
	n = imageset_count(p.set);
	text = slurp(argv[2], &len);
	if (!text || spec_parse(&spec, text, err, sizeof(err)) < 0 ||
	    source_open(&src, spec, err, sizeof(err)) < 0) {
		fprintf(stderr, "images-decode: %s\n", text ? err : argv[2]);
		return 1;
	}
	/* the sample path writes into a batch of 64 rows, aligned as a slot's field */
	f0 = source_field(src, 0);
	f1 = source_field(src, 1);
	bytes = (rows * f0->sample_bytes + 4095) & ~(size_t)4095;
	batch = aligned_alloc(4096, bytes);
	labels = malloc(rows * f1->sample_bytes);
	if (!p.file || !p.pix || !p.tj || !batch || !labels) {
		fprintf(stderr, "images-decode: out of memory\n");
		return 1;
	}
	ctx.seed = spec->seed;

	t0 = now_s();
	while (now_s() - t0 < 2 * secs) {
		for (uint64_t b = 0; b < n; b += BLOCK) {
			uint64_t e = b + BLOCK < n ? b + BLOCK : n;
			double w0 = now_s(), c0 = cpu_s(), w1, c1;

			for (uint64_t i = b; i < e; i++)
				if (plain_one(&p, i) < 0)
					return 1;
			w1 = now_s();
			c1 = cpu_s();
			t_plain += w1 - w0;
			c_plain += c1 - c0;
			for (uint64_t i = b; i < e; i++) {
				void *dsts[2] = { batch + (i % rows) * f0->sample_bytes,
						  labels + (i % rows) * f1->sample_bytes };

				if (source_read(src, &ctx, i, dsts, err, sizeof(err)) < 0) {
					fprintf(stderr, "images-decode: %s\n", err);
					return 1;
				}
			}
			t_src += now_s() - w1;
			c_src += cpu_s() - c1;
			done += e - b;
		}
		ctx.epoch++;
	}
	printf("{\"bench\":\"images-decode\",\"files\":%llu,\"plain_per_s\":%.1f,\"source_per_s\":%.1f,"
	       "\"ratio\":%.3f,\"plain_per_cpu_s\":%.1f,\"source_per_cpu_s\":%.1f,\"cpu_ratio\":%.3f}\n",
	       (unsigned long long)n, done / t_plain, done / t_src, t_plain / t_src,
	       done / c_plain, done / c_src, c_plain / c_src);
	source_free(src);
	spec_free(spec);
	imageset_free(p.set);
	free(text);
	free(batch);
	free(labels);
	free(p.file);
	free(p.pix);
	tjDestroy(p.tj);
	return 0;
}
