/* SPDX-License-Identifier: MIT */
/* images-decode - per-core rates: a plain TurboJPEG loop vs loaderd's sample path
 *
 *   images-decode ROOT SPEC.json [SECONDS]
 *
 * ROOT is an image folder (ROOT/CLASS/FILE.jpg). For SECONDS (default 3) each:
 *   plain:  open + read + tjDecompress2 (full size, RGB) of every file in turn,
 *           on one thread: the rate a plain C loop decodes the dataset at;
 *   source: source_read() of the spec's pipeline (decode + transforms + write
 *           into a batch row), on one thread, epoch by epoch, into the rows
 *           of a batch buffer in turn (64 rows, 4 KiB-aligned, as in a slot).
 * Prints one JSON object: {"plain_per_s":..., "source_per_s":..., "ratio":...}
 * by wall-clock time, and the same by this thread's CPU time ("..._per_cpu_s",
 * "cpu_ratio": less disturbed by other processes on a shared machine).
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

int main(int argc, char **argv)
{
	char err[512], what[4096];
	struct imageset *set;
	struct spec *spec;
	struct source *src;
	double secs = argc > 3 ? atof(argv[3]) : 3.0, t0, c0, plain, rate, plain_cpu, rate_cpu;
	unsigned long long done = 0;
	size_t cap = 1 << 20, len;
	unsigned char *file = malloc(cap), *pix = malloc(4096 * 4096 * 3);
	tjhandle tj = tjInitDecompress();
	char *text;
	uint64_t n;

	if (argc < 3) {
		fprintf(stderr, "usage: images-decode ROOT SPEC.json [SECONDS]\n");
		return 2;
	}
	if (imageset_open_folder(&set, argv[1], err, sizeof(err)) < 0) {
		fprintf(stderr, "images-decode: %s\n", err);
		return 1;
	}
	n = imageset_count(set);

	/* plain: read + decode, one thread */
	t0 = now_s();
	c0 = cpu_s();
	while (now_s() - t0 < secs) {
		for (uint64_t i = 0; i < n; i++) {
			int fd, w, h, ss, cs;
			struct stat st;

			imageset_describe(set, i, what, sizeof(what));
			fd = open(what, O_RDONLY | O_CLOEXEC);
			if (fd < 0 || fstat(fd, &st) < 0 || (size_t)st.st_size > cap ||
			    read(fd, file, (size_t)st.st_size) != st.st_size) {
				fprintf(stderr, "images-decode: %s: read failed\n", what);
				return 1;
			}
			close(fd);
			len = (size_t)st.st_size;
			if (tjDecompressHeader3(tj, file, len, &w, &h, &ss, &cs) < 0 || w > 4096 ||
			    h > 4096 || tjDecompress2(tj, file, len, pix, w, 0, h, TJPF_RGB, 0) < 0) {
				fprintf(stderr, "images-decode: %s: %s\n", what, tjGetErrorStr2(tj));
				return 1;
			}
			done++;
		}
	}
	plain = (double)done / (now_s() - t0);
	plain_cpu = (double)done / (cpu_s() - c0);

	/* source: loaderd's per-sample path */
	text = slurp(argv[2], &len);
	if (!text || spec_parse(&spec, text, err, sizeof(err)) < 0 ||
	    source_open(&src, spec, err, sizeof(err)) < 0) {
		fprintf(stderr, "images-decode: %s\n", text ? err : argv[2]);
		return 1;
	}
	{
		/* a batch of 64 rows, aligned as a slot's field, written row after row */
		const struct field_desc *f0 = source_field(src, 0), *f1 = source_field(src, 1);
		size_t rows = 64, bytes = (rows * f0->sample_bytes + 4095) & ~(size_t)4095;
		uint8_t *batch = aligned_alloc(4096, bytes), *labels = malloc(rows * f1->sample_bytes);
		struct sample_ctx ctx = { spec->seed, 0 };

		if (!batch || !labels) {
			fprintf(stderr, "images-decode: out of memory\n");
			return 1;
		}
		done = 0;
		t0 = now_s();
		c0 = cpu_s();
		while (now_s() - t0 < secs) {
			for (uint64_t i = 0; i < n; i++) {
				void *dsts[2] = { batch + (i % rows) * f0->sample_bytes,
						  labels + (i % rows) * f1->sample_bytes };

				if (source_read(src, &ctx, i, dsts, err, sizeof(err)) < 0) {
					fprintf(stderr, "images-decode: %s\n", err);
					return 1;
				}
				done++;
			}
			ctx.epoch++;
		}
		rate = (double)done / (now_s() - t0);
		rate_cpu = (double)done / (cpu_s() - c0);
		free(batch);
		free(labels);
	}
	printf("{\"bench\":\"images-decode\",\"files\":%llu,\"plain_per_s\":%.1f,\"source_per_s\":%.1f,"
	       "\"ratio\":%.3f,\"plain_per_cpu_s\":%.1f,\"source_per_cpu_s\":%.1f,\"cpu_ratio\":%.3f}\n",
	       (unsigned long long)n, plain, rate, rate / plain, plain_cpu, rate_cpu,
	       rate_cpu / plain_cpu);
	source_free(src);
	spec_free(spec);
	imageset_free(set);
	free(text);
	free(file);
	free(pix);
	tjDestroy(tj);
	return 0;
}
