/* SPDX-License-Identifier: MIT */
/* test-source - token files and .npy arrays, good and bad */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "source.h"
#include "spec.h"

static char dir[] = "/tmp/ldr-test-XXXXXX";
static char err[512];

static const char *path_of(const char *name)
{
	static char buf[4][256];
	static int i;

	i = (i + 1) % 4;
	snprintf(buf[i], sizeof(buf[i]), "%s/%s", dir, name);
	return buf[i];
}

static void write_file(const char *name, const void *data, size_t len)
{
	int fd = open(path_of(name), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	assert(fd >= 0);
	assert(write(fd, data, len) == (ssize_t)len);
	close(fd);
}

/* Write a v1.0 .npy file: @dict is the header dict, @data the payload. */
static void write_npy_ver(const char *name, int major, const char *dict, const void *data,
			  size_t len)
{
	size_t pre = major == 1 ? 10 : 12;
	size_t dl = strlen(dict);
	size_t total = (pre + dl + 1 + 63) / 64 * 64;
	size_t hlen = total - pre;
	unsigned char *buf = calloc(1, total + len);

	memcpy(buf, "\x93NUMPY", 6);
	buf[6] = (unsigned char)major;
	buf[7] = 0;
	buf[8] = hlen & 0xff;
	buf[9] = (hlen >> 8) & 0xff;
	if (major != 1) {
		buf[10] = 0;
		buf[11] = 0;
	}
	memcpy(buf + pre, dict, dl);
	memset(buf + pre + dl, ' ', hlen - dl - 1);
	buf[total - 1] = '\n';
	if (len)
		memcpy(buf + total, data, len);
	write_file(name, buf, total + len);
	free(buf);
}

static void write_npy(const char *name, const char *dict, const void *data, size_t len)
{
	write_npy_ver(name, 1, dict, data, len);
}

static struct spec *tokens_spec(const char *file, const char *dtype, uint32_t seq_len,
				const char *out_dtype)
{
	char text[1024];
	struct spec *spec = NULL;

	snprintf(text, sizeof(text),
		 "{\"name\": \"t\", \"source\": {\"kind\": \"tokens\", \"path\": \"%s\", "
		 "\"dtype\": \"%s\", \"seq_len\": %u, \"output_dtype\": \"%s\"}}",
		 path_of(file), dtype, seq_len, out_dtype);
	assert(spec_parse(&spec, text, err, sizeof(err)) == 0);
	return spec;
}

static struct spec *npy_spec(const char *a, const char *b)
{
	char text[1024];
	struct spec *spec = NULL;

	if (b)
		snprintf(text, sizeof(text),
			 "{\"name\": \"n\", \"source\": {\"kind\": \"npy\", \"paths\": [\"%s\", \"%s\"]}}",
			 path_of(a), path_of(b));
	else
		snprintf(text, sizeof(text),
			 "{\"name\": \"n\", \"source\": {\"kind\": \"npy\", \"paths\": [\"%s\"]}}",
			 path_of(a));
	assert(spec_parse(&spec, text, err, sizeof(err)) == 0);
	return spec;
}

/* Opening must fail with @want_r and a message containing @want. */
static void open_fails(struct spec *spec, int want_r, const char *want)
{
	struct source *src = NULL;
	int r = source_open(&src, spec, err, sizeof(err));

	if (r != want_r || !strstr(err, want))
		fprintf(stderr, "got %d \"%s\", want %d \"%s\"\n", r, err, want_r, want);
	assert(r == want_r);
	assert(src == NULL);
	assert(strstr(err, want));
	spec_free(spec);
}

static void test_tokens(void)
{
	uint16_t toks[101];
	for (int i = 0; i < 101; i++)
		toks[i] = (uint16_t)(i * 600); /* up to 60000: above INT16_MAX */
	write_file("t16.bin", toks, sizeof(toks));

	struct spec *spec = tokens_spec("t16.bin", "uint16", 10, "int64");
	struct source *src = NULL;
	assert(source_open(&src, spec, err, sizeof(err)) == 0);
	assert(source_nsamples(src) == 10); /* (101 - 1) / 10 */
	assert(source_nfields(src) == 2);
	const struct field_desc *in = source_field(src, 0), *tg = source_field(src, 1);
	assert(strcmp(in->name, "input") == 0 && strcmp(tg->name, "target") == 0);
	assert(in->dtype == LDR_DTYPE_INT64 && in->ndim == 1 && in->shape[0] == 10);
	assert(in->sample_bytes == 80 && tg->sample_bytes == 80);
	assert(source_field(src, 2) == NULL);

	int64_t a[10], b[10];
	void *dsts[2] = { a, b };
	for (uint64_t i = 0; i < 10; i += 3) {
		assert(source_read(src, NULL, i, dsts, err, sizeof(err)) == 0);
		for (int j = 0; j < 10; j++) {
			assert(a[j] == (int64_t)toks[i * 10 + j]);
			assert(b[j] == (int64_t)toks[i * 10 + j + 1]);
		}
	}
	assert(source_read(src, NULL, 9, dsts, err, sizeof(err)) == 0);
	assert(b[9] == 60000);
	assert(source_read(src, NULL, 10, dsts, err, sizeof(err)) == -EINVAL);

	/* truncated under us: -EIO and a message, not SIGBUS */
	int fd = open(path_of("t16.bin"), O_WRONLY | O_CLOEXEC);
	assert(fd >= 0);
	assert(ftruncate(fd, 50) == 0);
	close(fd);
	assert(source_read(src, NULL, 0, dsts, err, sizeof(err)) == 0); /* still whole */
	assert(source_read(src, NULL, 2, dsts, err, sizeof(err)) == -EIO);
	assert(strstr(err, "t16.bin: truncated: wanted 22 bytes at offset 40, got 10"));
	assert(source_read(src, NULL, 5, dsts, err, sizeof(err)) == -EIO);
	assert(strstr(err, "t16.bin: truncated: wanted 22 bytes at offset 100, got 0"));
	source_free(src);
	spec_free(spec);

	/* nsamples = (ntokens - 1) div seq_len */
	write_file("t16b.bin", toks, 100 * 2);
	spec = tokens_spec("t16b.bin", "uint16", 33, "int64");
	assert(source_open(&src, spec, err, sizeof(err)) == 0);
	assert(source_nsamples(src) == 3); /* 99 / 33 */
	source_free(src);
	spec_free(spec);
	spec = tokens_spec("t16b.bin", "uint16", 34, "int64");
	assert(source_open(&src, spec, err, sizeof(err)) == 0);
	assert(source_nsamples(src) == 2);
	source_free(src);
	spec_free(spec);

	/* int32 sign extension */
	int32_t t32[9] = { -1, -2, 3, INT32_MIN, INT32_MAX, -100000, 7, 8, 9 };
	write_file("t32.bin", t32, sizeof(t32));
	spec = tokens_spec("t32.bin", "int32", 4, "int64");
	assert(source_open(&src, spec, err, sizeof(err)) == 0);
	assert(source_nsamples(src) == 2);
	int64_t c[4], d[4];
	void *d2[2] = { c, d };
	assert(source_read(src, NULL, 0, d2, err, sizeof(err)) == 0);
	assert(c[0] == -1 && c[1] == -2 && c[2] == 3 && c[3] == INT32_MIN);
	assert(d[0] == -2 && d[3] == INT32_MAX);
	assert(source_read(src, NULL, 1, d2, err, sizeof(err)) == 0);
	assert(c[0] == INT32_MAX && c[1] == -100000 && d[3] == 9);
	source_free(src);
	spec_free(spec);

	/* uint32 stays unsigned when widened */
	uint32_t tu[3] = { 0xffffffffu, 1, 2 };
	write_file("tu32.bin", tu, sizeof(tu));
	spec = tokens_spec("tu32.bin", "uint32", 2, "int64");
	assert(source_open(&src, spec, err, sizeof(err)) == 0);
	assert(source_read(src, NULL, 0, d2, err, sizeof(err)) == 0);
	assert(c[0] == 0xffffffffll && c[1] == 1 && d[1] == 2);
	source_free(src);
	spec_free(spec);

	/* output dtype = source dtype: raw copy */
	spec = tokens_spec("t16b.bin", "uint16", 4, "uint16");
	assert(source_open(&src, spec, err, sizeof(err)) == 0);
	assert(source_field(src, 0)->dtype == LDR_DTYPE_UINT16);
	assert(source_field(src, 0)->sample_bytes == 8);
	uint16_t e[4], f[4];
	void *d3[2] = { e, f };
	assert(source_read(src, NULL, 2, d3, err, sizeof(err)) == 0);
	assert(memcmp(e, toks + 8, 8) == 0 && memcmp(f, toks + 9, 8) == 0);
	source_free(src);
	spec_free(spec);

	/* errors */
	write_file("odd.bin", toks, 7);
	open_fails(tokens_spec("odd.bin", "uint16", 1, "int64"), -EINVAL,
		   "odd.bin: size 7 is not a multiple of 2 bytes");
	open_fails(tokens_spec("t16b.bin", "uint16", 1024, "int64"), -EINVAL,
		   "t16b.bin: too small for seq_len 1024: 100 tokens");
	write_file("empty.bin", toks, 0);
	open_fails(tokens_spec("empty.bin", "uint16", 1, "int64"), -EINVAL,
		   "too small for seq_len 1: 0 tokens");
	open_fails(tokens_spec("missing.bin", "uint16", 1, "int64"), -ENOENT,
		   "missing.bin: No such file or directory");
	open_fails(tokens_spec("", "uint16", 1, "int64"), -EINVAL, "not a regular file");
}

static void test_npy(void)
{
	float x[3][2] = { { 0.5f, 1.5f }, { 2.5f, 3.5f }, { -1.0f, 1e30f } };
	int64_t y[3] = { 7, -8, INT64_MAX };
	unsigned char m[3] = { 1, 0, 1 };

	write_npy("x.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", x,
		  sizeof(x));
	write_npy_ver("y.npy", 2, "{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": (3,)}",
		      y, sizeof(y));
	write_npy("m.npy", "{'descr':'|b1','fortran_order':False,'shape':(3L,)}", m, sizeof(m));

	char text[1024];
	struct spec *spec = NULL;
	snprintf(text, sizeof(text),
		 "{\"name\": \"n\", \"source\": {\"kind\": \"npy\", \"paths\": [\"%s\", \"%s\", \"%s\"]}}",
		 path_of("x.npy"), path_of("y.npy"), path_of("m.npy"));
	assert(spec_parse(&spec, text, err, sizeof(err)) == 0);
	struct source *src = NULL;
	assert(source_open(&src, spec, err, sizeof(err)) == 0);
	assert(source_nsamples(src) == 3);
	assert(source_nfields(src) == 3);
	const struct field_desc *fx = source_field(src, 0), *fy = source_field(src, 1),
				*fm = source_field(src, 2);
	assert(strcmp(fx->name, "x") == 0 && fx->dtype == LDR_DTYPE_FLOAT32 && fx->ndim == 1 &&
	       fx->shape[0] == 2 && fx->sample_bytes == 8);
	assert(strcmp(fy->name, "y") == 0 && fy->dtype == LDR_DTYPE_INT64 && fy->ndim == 0 &&
	       fy->sample_bytes == 8);
	assert(strcmp(fm->name, "m") == 0 && fm->dtype == LDR_DTYPE_BOOL && fm->sample_bytes == 1);
	for (uint64_t i = 0; i < 3; i++) {
		float rx[2];
		int64_t ry;
		unsigned char rm;
		void *dsts[3] = { rx, &ry, &rm };
		assert(source_read(src, NULL, i, dsts, err, sizeof(err)) == 0);
		assert(memcmp(rx, x[i], sizeof(rx)) == 0);
		assert(ry == y[i] && rm == m[i]);
	}
	source_free(src);
	spec_free(spec);

	/* 3-d samples */
	uint8_t img[2][2][3][4];
	for (size_t i = 0; i < sizeof(img); i++)
		((uint8_t *)img)[i] = (uint8_t)i;
	write_npy("img.npy", "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 3, 4), }",
		  img, sizeof(img));
	spec = npy_spec("img.npy", NULL);
	assert(source_open(&src, spec, err, sizeof(err)) == 0);
	assert(source_field(src, 0)->ndim == 3 && source_field(src, 0)->shape[2] == 4);
	uint8_t row[24];
	void *dr[1] = { row };
	assert(source_read(src, NULL, 1, dr, err, sizeof(err)) == 0);
	assert(memcmp(row, img[1], 24) == 0);
	source_free(src);
	spec_free(spec);

	/* errors */
	char buf[64] = { 0 };
	write_npy("f.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", buf, 16);
	open_fails(npy_spec("f.npy", NULL), -EINVAL, "f.npy: Fortran order is not supported");
	write_npy("be.npy", "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }", buf, 8);
	open_fails(npy_spec("be.npy", NULL), -EINVAL, "be.npy: big-endian dtype '>i4' is not supported");
	write_npy("o.npy", "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", buf, 16);
	open_fails(npy_spec("o.npy", NULL), -EINVAL, "o.npy: dtype '|O' is not supported");
	write_npy("u.npy", "{'descr': '<U5', 'fortran_order': False, 'shape': (2,), }", buf, 40);
	open_fails(npy_spec("u.npy", NULL), -EINVAL, "dtype '<U5' is not supported");
	write_npy("st.npy", "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (2,), }",
		  buf, 8);
	open_fails(npy_spec("st.npy", NULL), -EINVAL, "structured dtypes are not supported");
	write_npy("z.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (), }", buf, 4);
	open_fails(npy_spec("z.npy", NULL), -EINVAL, "z.npy: 0-d arrays are not supported");
	write_npy("short.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (5,), }", buf, 16);
	open_fails(npy_spec("short.npy", NULL), -EINVAL, "short.npy: truncated");
	write_npy("x4.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 2), }", buf, 32);
	open_fails(npy_spec("x.npy", "x4.npy"), -EINVAL, "x4.npy: has 4 rows but");
	assert(strstr(err, "x.npy has 3"));
	write_file("magic.npy", "\x93NUMPX\x01\x00\x10\x00{}              ", 26);
	open_fails(npy_spec("magic.npy", NULL), -EINVAL, "magic.npy: not a .npy file (bad magic)");
	write_file("tiny.npy", "\x93NU", 3);
	open_fails(npy_spec("tiny.npy", NULL), -EINVAL, "tiny.npy: not a .npy file");
	write_npy("k.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), 'x': 1}", buf, 8);
	open_fails(npy_spec("k.npy", NULL), -EINVAL, "k.npy: bad header");
	write_npy("miss.npy", "{'descr': '<i4', 'shape': (2,)}", buf, 8);
	open_fails(npy_spec("miss.npy", NULL), -EINVAL, "missing fortran_order");
	write_npy("dup.npy", "{'descr': '<i4', 'descr': '<i4', 'fortran_order': False, 'shape': (2,)}",
		  buf, 8);
	open_fails(npy_spec("dup.npy", NULL), -EINVAL, "bad header");
	write_npy("big.npy",
		  "{'descr': '<i4', 'fortran_order': False, 'shape': (99999999999999999999,)}", buf, 8);
	open_fails(npy_spec("big.npy", NULL), -EINVAL, "bad shape");
	write_npy("huge.npy",
		  "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387903, 4611686018427387903)}",
		  buf, 8);
	open_fails(npy_spec("huge.npy", NULL), -EINVAL, "shape too large");
	write_npy("dims.npy",
		  "{'descr': '<i4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1)}", buf, 8);
	open_fails(npy_spec("dims.npy", NULL), -EINVAL, "more than 8 dimensions");
	write_npy("v9.npy", "{}", buf, 8);
	{
		/* version 9.0 */
		int fd = open(path_of("v9.npy"), O_WRONLY | O_CLOEXEC);
		assert(fd >= 0 && pwrite(fd, "\x09", 1, 6) == 1);
		close(fd);
	}
	open_fails(npy_spec("v9.npy", NULL), -EINVAL, "unsupported .npy version 9.0");

	/* fuzz: random header bytes give an error, never a crash */
	srand(12345);
	const char *good = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }";
	for (int it = 0; it < 2000; it++) {
		char dict[128];
		size_t dl = strlen(good);

		memcpy(dict, good, dl + 1);
		int nflip = 1 + rand() % 4;
		for (int k = 0; k < nflip; k++)
			dict[rand() % dl] = (char)(1 + rand() % 255);
		if (it % 10 == 0) {
			for (size_t k = 0; k < dl; k++)
				dict[k] = (char)(1 + rand() % 255);
		}
		write_npy("fz.npy", dict, x, sizeof(x));
		if (it % 7 == 0) {
			/* random header length too */
			unsigned char hl[2] = { (unsigned char)rand(), (unsigned char)rand() };
			int fd = open(path_of("fz.npy"), O_WRONLY | O_CLOEXEC);
			assert(fd >= 0 && pwrite(fd, hl, 2, 8) == 2);
			close(fd);
		}
		spec = npy_spec("fz.npy", NULL);
		src = NULL;
		int r = source_open(&src, spec, err, sizeof(err));
		if (r == 0) {
			/* a flip that kept it valid must still read in bounds */
			const struct field_desc *fd0 = source_field(src, 0);
			void *row0 = malloc(fd0->sample_bytes);
			void *dd[1] = { row0 };
			r = source_read(src, NULL, 0, dd, err, sizeof(err));
			assert(r == 0);
			free(row0);
			source_free(src);
		} else {
			assert(r == -EINVAL);
			assert(strstr(err, "fz.npy"));
		}
		spec_free(spec);
	}
}

int main(void)
{
	assert(mkdtemp(dir));
	test_tokens();
	test_npy();
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert(system(cmd) == 0);
	printf("test-source: ok\n");
	return 0;
}
