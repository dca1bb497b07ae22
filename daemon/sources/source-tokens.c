/* SPDX-License-Identifier: MIT */
/* source-tokens - flat files of token ids cut into (input, target) sequences */

/*
 * A corpus is one file ("path") or many ("paths": names, brace ranges and
 * file-name globs, expanded at open in the order written, globs sorted),
 * local paths or objects in a store (s3://, https://: fetched whole into
 * the node's object cache at open, as the creator, then read there; a glob
 * over s3:// lists the keys, objects.c). Objects more than the cache holds
 * are HEADed only, and each read of one is a ranged GET into the sample
 * (a window across two files two of them).
 * Its files are one sequence of tokens cut into segments that no window of
 * L+1 tokens crosses: each file (boundaries "file"), each document (an eos
 * token or a file's end ends one) or the whole corpus ("none"). Sample i is
 * the i-th aligned window of that sequence, or with sampling "random_offset"
 * a window at a start drawn from (seed, epoch, i) alone, every valid start of
 * every segment equally likely (nanoGPT's get_batch made deterministic).
 * With packing, the documents are cut into pieces of at most L+1 tokens
 * packed first-fit into rows of L+1 slots once at open, and sample i is row
 * i with its position_ids, cu_seqlens and loss_mask. The L+1 tokens are
 * read at once into a per-thread buffer (pread, across files with
 * boundaries "none") and widened to int64 unless output_dtype keeps the
 * file's dtype.
 */
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "base/creds.h"
#include "brace.h"
#include "source-private.h"
#include "spec.h"

#define SEQ_LEN_MAX (1u << 24)
#define SAMPLES_PER_EPOCH_MAX (1ull << 40)
#define TOKEN_FDS_MAX 1024            /* files a source keeps open; others per read */
#define SCAN_BYTES (1u << 20)         /* eos scan buffer */
#define OFFSET_TAG 0x746f6b656e73ull  /* "tokens": random_offset's draws */

struct tok_file {
	char *path;
	_Atomic int fd;               /* -1: not open (yet, or past TOKEN_FDS_MAX) */
	bool ranged;                  /* an object read by range: never opened */
	uint64_t ntokens;
	uint64_t first;               /* its first token's place in the corpus */
};

struct tokens_source {
	struct source base;
	struct tok_file *files;
	size_t nfiles, filecap;
	_Atomic size_t nfds;          /* files[].fd open, at most TOKEN_FDS_MAX */
	uint64_t ntokens;             /* of the corpus */
	char what[256];               /* the corpus, in errors: the path or first pattern */
	int dtype;
	int out_dtype;
	size_t elem;
	uint32_t seq_len;
	int boundaries;
	int64_t eos;
	bool random_offset;
	uint64_t seed;
	/* the segments that hold a window: first token, windows before them */
	uint64_t *seg_start;
	uint64_t *seg_cum;            /* nseg + 1 entries */
	size_t nseg, segcap;
	uint64_t ndocs;               /* segments seen, a window or not */
	/* packing: pieces of documents in rows of L+1 slots, by row */
	bool packing;
	uint64_t *pc_start;           /* a piece's first token */
	uint32_t *pc_len;
	size_t npc, pccap;
	uint64_t *row_first;          /* nrows + 1: each row's first piece */
	uint64_t nrows;
	uint64_t packed;              /* tokens in the rows */
};

/* ---- the spec ---- */

static int parse_dtype(json_t *v, int *out, char *err, size_t errlen)
{
	const char *s = json_is_string(v) ? json_string_value(v) : "";

	if (strcmp(s, "uint16") == 0)
		*out = LDR_DTYPE_UINT16;
	else if (strcmp(s, "uint32") == 0)
		*out = LDR_DTYPE_UINT32;
	else if (strcmp(s, "int32") == 0)
		*out = LDR_DTYPE_INT32;
	else
		return spec_fail(err, errlen, "source.dtype: must be one of uint16, uint32, int32");
	return 0;
}

/* A glob character before the last '/' (directories are named literally). */
static bool glob_in_dir(const char *s)
{
	const char *slash = strrchr(s, '/');

	return slash && strcspn(s, "*?[") < (size_t)(slash - s);
}

static int parse_paths(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	json_t *arr = json_object_get(src, "paths");
	unsigned long long total = 0;
	size_t n;

	if (!arr)
		return spec_required_path(src, &spec->source.path, err, errlen);
	if (json_object_get(src, "path"))
		return spec_fail(err, errlen, "source: give path or paths, not both");
	n = json_is_array(arr) ? json_array_size(arr) : 0;
	if (n == 0 || n > TOKENS_PATHS_MAX)
		return spec_fail(err, errlen,
				 "source.paths: must be an array of 1..%d strings (paths, brace ranges, globs)",
				 TOKENS_PATHS_MAX);
	spec->source.paths = calloc(n, sizeof(*spec->source.paths));
	if (!spec->source.paths)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const char *s = spec_plain_string(json_array_get(arr, i));
		char msg[256];
		long cnt;

		if (!s)
			return spec_fail(err, errlen, "source.paths[%zu]: must be a non-empty string", i);
		if (glob_in_dir(s))
			return spec_fail(err, errlen,
					 "source.paths[%zu]: glob characters only in the file name: \"%s\"",
					 i, s);
		cnt = brace_expand(s, NULL, msg, sizeof(msg));
		if (cnt < 0)
			return cnt == -ENOMEM ? -ENOMEM
					      : spec_fail(err, errlen, "source.paths[%zu]: %s", i, msg);
		total += (unsigned long long)cnt;
		spec->source.paths[i] = strdup(s);
		if (!spec->source.paths[i])
			return -ENOMEM;
		spec->source.npaths = i + 1;
	}
	if (total > TOKENS_FILES_MAX)
		return spec_fail(err, errlen, "source.paths: %llu files named, the most is %d", total,
				 TOKENS_FILES_MAX);
	return 0;
}

static int parse_corpus(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	json_t *v = json_object_get(src, "boundaries");
	const char *s;
	int64_t eos = -1, spe = 0, top;
	char what[64];
	int r;

	spec->source.tokens.boundaries = TOKENS_BOUNDARIES_FILE;
	if (v) {
		s = json_is_string(v) ? json_string_value(v) : "";
		if (strcmp(s, "file") == 0)
			spec->source.tokens.boundaries = TOKENS_BOUNDARIES_FILE;
		else if (strcmp(s, "document") == 0)
			spec->source.tokens.boundaries = TOKENS_BOUNDARIES_DOCUMENT;
		else if (strcmp(s, "none") == 0)
			spec->source.tokens.boundaries = TOKENS_BOUNDARIES_NONE;
		else
			return spec_fail(err, errlen,
					 "source.boundaries: must be one of file, document, none");
	}
	top = spec->source.dtype == LDR_DTYPE_UINT16 ? 65535
	      : spec->source.dtype == LDR_DTYPE_UINT32 ? 4294967295ll : 2147483647ll;
	snprintf(what, sizeof(what), "an integer in 0..%lld (a %s token id)", (long long)top,
		 dtype_name(spec->source.dtype));
	r = spec_get_int(src, "eos", "source.eos", 0, top, what, &eos, err, errlen);
	if (r < 0)
		return r;
	spec->source.tokens.eos = eos;
	if (spec->source.tokens.packing) {
		if (eos < 0)
			return spec_fail(err, errlen,
					 "source.packing: needs source.eos (where documents end)");
		if (v && spec->source.tokens.boundaries != TOKENS_BOUNDARIES_DOCUMENT)
			return spec_fail(err, errlen,
					 "source.boundaries: packing packs documents: must be \"document\"");
		spec->source.tokens.boundaries = TOKENS_BOUNDARIES_DOCUMENT;
	}
	if (spec->source.tokens.boundaries == TOKENS_BOUNDARIES_DOCUMENT && eos < 0)
		return spec_fail(err, errlen, "source.boundaries: \"document\" needs source.eos");

	v = json_object_get(src, "sampling");
	if (v) {
		s = json_is_string(v) ? json_string_value(v) : "";
		if (strcmp(s, "random_offset") == 0 && spec->source.tokens.packing)
			return spec_fail(err, errlen,
					 "source.sampling: packing reads whole rows: must be \"aligned\"");
		if (strcmp(s, "random_offset") == 0)
			spec->source.tokens.random_offset = true;
		else if (strcmp(s, "aligned") != 0)
			return spec_fail(err, errlen,
					 "source.sampling: must be one of aligned, random_offset");
	}
	if (!spec->source.tokens.random_offset) {
		if (json_object_get(src, "samples_per_epoch"))
			return spec_fail(err, errlen,
					 "source.samples_per_epoch: only with sampling \"random_offset\"");
		return 0;
	}
	if (!json_object_get(src, "samples_per_epoch"))
		return spec_fail(err, errlen,
				 "source.samples_per_epoch: is required with sampling \"random_offset\"");
	r = spec_get_int(src, "samples_per_epoch", "source.samples_per_epoch", 1,
			 (int64_t)SAMPLES_PER_EPOCH_MAX, "an integer in 1..1099511627776", &spe, err,
			 errlen);
	if (r < 0)
		return r;
	spec->source.tokens.samples_per_epoch = (uint64_t)spe;
	return 0;
}

/* seq_len, or with packing its rows' packing.seq_len (the same L). */
static int parse_seq_len(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "seq_len", NULL };
	json_t *pk = json_object_get(src, "packing");
	const char *key;
	int64_t seq_len = 0;
	int r;

	if (!pk) {
		if (!json_object_get(src, "seq_len"))
			return spec_fail(err, errlen, "source.seq_len: is required");
		r = spec_get_int(src, "seq_len", "source.seq_len", 1, SEQ_LEN_MAX,
				 "an integer in 1..16777216", &seq_len, err, errlen);
		spec->source.seq_len = (uint32_t)seq_len;
		return r;
	}
	if (!json_is_object(pk))
		return spec_fail(err, errlen, "source.packing: must be an object ({\"seq_len\": N})");
	if ((key = spec_unknown_key(pk, keys)))
		return spec_fail(err, errlen, "unknown key \"source.packing.%s\"", key);
	if (json_object_get(src, "seq_len"))
		return spec_fail(err, errlen,
				 "source.seq_len: not with source.packing (its rows are packing.seq_len long)");
	if (!json_object_get(pk, "seq_len"))
		return spec_fail(err, errlen, "source.packing.seq_len: is required");
	r = spec_get_int(pk, "seq_len", "source.packing.seq_len", 1, SEQ_LEN_MAX,
			 "an integer in 1..16777216", &seq_len, err, errlen);
	spec->source.seq_len = (uint32_t)seq_len;
	spec->source.tokens.packing = true;
	return r;
}

static int parse_tokens(struct spec *spec, json_t *src, char *err, size_t errlen)
{
	static const char *const keys[] = { "kind", "path", "paths", "dtype", "seq_len",
		"output_dtype", "boundaries", "eos", "sampling", "samples_per_epoch", "packing",
		NULL };
	const char *key = spec_unknown_key(src, keys);
	const char *s;
	json_t *v;
	int r;

	if (key)
		return spec_fail(err, errlen, "unknown key \"source.%s\"", key);

	r = parse_paths(spec, src, err, errlen);
	if (r < 0)
		return r;

	spec->source.dtype = LDR_DTYPE_UINT16;
	v = json_object_get(src, "dtype");
	if (v && (r = parse_dtype(v, &spec->source.dtype, err, errlen)) < 0)
		return r;

	r = parse_seq_len(spec, src, err, errlen);
	if (r < 0)
		return r;

	spec->source.output_dtype = LDR_DTYPE_INT64;
	v = json_object_get(src, "output_dtype");
	if (v) {
		s = json_is_string(v) ? json_string_value(v) : "";
		if (strcmp(s, "int64") == 0)
			spec->source.output_dtype = LDR_DTYPE_INT64;
		else if (strcmp(s, dtype_name(spec->source.dtype)) == 0)
			spec->source.output_dtype = spec->source.dtype;
		else
			return spec_fail(err, errlen,
					 "source.output_dtype: must be int64 or the source dtype (%s)",
					 dtype_name(spec->source.dtype));
	}
	return parse_corpus(spec, src, err, errlen);
}

static json_t *tokens_json(const struct spec *spec)
{
	static const char *const bnames[] = { "file", "document", "none" };
	json_t *o = json_pack("{s:s}", "kind", "tokens");
	int r = 0;

	if (!o)
		return NULL;
	if (spec->source.npaths)
		r |= json_object_set_new(o, "paths",
					 spec_strings_json(spec->source.paths, spec->source.npaths));
	else
		r |= json_object_set_new(o, "path", json_string(spec->source.path));
	r |= json_object_set_new(o, "dtype", json_string(dtype_name(spec->source.dtype)));
	if (spec->source.tokens.packing)
		r |= json_object_set_new(o, "packing",
					 json_pack("{s:I}", "seq_len", (json_int_t)spec->source.seq_len));
	else
		r |= json_object_set_new(o, "seq_len", json_integer(spec->source.seq_len));
	r |= json_object_set_new(o, "output_dtype",
				 json_string(dtype_name(spec->source.output_dtype)));
	r |= json_object_set_new(o, "boundaries",
				 json_string(bnames[spec->source.tokens.boundaries]));
	if (spec->source.tokens.eos >= 0)
		r |= json_object_set_new(o, "eos", json_integer(spec->source.tokens.eos));
	r |= json_object_set_new(o, "sampling", json_string(spec->source.tokens.random_offset
								   ? "random_offset" : "aligned"));
	if (spec->source.tokens.random_offset)
		r |= json_object_set_new(o, "samples_per_epoch",
					 json_integer((json_int_t)spec->source.tokens.samples_per_epoch));
	if (r) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* ---- the segments ---- */

/* Windows in a segment of @len tokens: aligned, or valid random starts. */
static uint64_t seg_windows(const struct tokens_source *src, uint64_t len)
{
	if (len < (uint64_t)src->seq_len + 1)
		return 0;
	return src->random_offset ? len - src->seq_len : (len - 1) / src->seq_len;
}

/* The segment [start, end) of the corpus ends: kept if it holds a window. */
static int pack_add_doc(struct tokens_source *src, uint64_t start, uint64_t end);

static int seg_end(struct tokens_source *src, uint64_t start, uint64_t end)
{
	uint64_t w = seg_windows(src, end - start);

	src->ndocs++;
	if (src->packing)
		return pack_add_doc(src, start, end);
	if (!w)
		return 0;
	if (src->nseg + 1 >= src->segcap) {
		size_t cap = src->segcap ? src->segcap * 2 : 64;
		uint64_t *a = realloc(src->seg_start, cap * sizeof(*a));

		if (!a)
			return -ENOMEM;
		src->seg_start = a;
		a = realloc(src->seg_cum, (cap + 1) * sizeof(*a));
		if (!a)
			return -ENOMEM;
		src->seg_cum = a;
		src->segcap = cap;
		if (src->nseg == 0)
			src->seg_cum[0] = 0;
	}
	src->seg_start[src->nseg] = start;
	src->seg_cum[src->nseg + 1] = src->seg_cum[src->nseg] + w;
	src->nseg++;
	return 0;
}

#define FIND_EOS(T)                                                              \
	static size_t find_eos_##T(const void *buf, size_t from, size_t n, int64_t eos) \
	{                                                                        \
		const T *p = buf;                                                \
		const T e = (T)eos;                                              \
		for (size_t j = from; j < n; j++)                                \
			if (p[j] == e)                                           \
				return j;                                        \
		return n;                                                        \
	}
FIND_EOS(uint16_t)
FIND_EOS(uint32_t)
FIND_EOS(int32_t)

static size_t find_eos(const struct tokens_source *src, const void *buf, size_t from, size_t n)
{
	switch (src->dtype) {
	case LDR_DTYPE_UINT16:
		return find_eos_uint16_t(buf, from, n, src->eos);
	case LDR_DTYPE_UINT32:
		return find_eos_uint32_t(buf, from, n, src->eos);
	default:
		return find_eos_int32_t(buf, from, n, src->eos);
	}
}

/* boundaries "document": read @f once, a segment ending at each eos. */
static int scan_documents(struct tokens_source *src, const struct tok_file *f, int fd, char *err,
			  size_t errlen)
{
	size_t per = SCAN_BYTES / src->elem;
	void *buf = malloc(per * src->elem);
	uint64_t start = f->first;
	int r = 0;

	if (!buf)
		return -ENOMEM;
	for (uint64_t at = 0; at < f->ntokens && r == 0; at += per) {
		size_t n = f->ntokens - at < per ? (size_t)(f->ntokens - at) : per;

		r = f->ranged ? source_read_range(&src->base, f->path, at * src->elem, n * src->elem, buf, err,
						  errlen)
			      : source_read_full(fd, f->path, buf, n * src->elem, at * src->elem, err, errlen);
		for (size_t j = 0; r == 0 && (j = find_eos(src, buf, j, n)) < n; j++) {
			r = seg_end(src, start, f->first + at + j + 1);
			start = f->first + at + j + 1;
		}
	}
	free(buf);
	if (r == 0 && start < f->first + f->ntokens)
		r = seg_end(src, start, f->first + f->ntokens);
	return r;
}

/* ---- packing ---- */

/* A document's pieces of at most L+1 tokens, disjoint, in order. */
static int pack_add_doc(struct tokens_source *src, uint64_t start, uint64_t end)
{
	uint32_t cap = src->seq_len + 1;

	for (uint64_t s = start; s < end; s += cap) {
		if (src->npc == src->pccap) {
			size_t n = src->pccap ? src->pccap * 2 : 256;
			uint64_t *a = realloc(src->pc_start, n * sizeof(*a));
			uint32_t *b;

			if (!a)
				return -ENOMEM;
			src->pc_start = a;
			b = realloc(src->pc_len, n * sizeof(*b));
			if (!b)
				return -ENOMEM;
			src->pc_len = b;
			src->pccap = n;
		}
		src->pc_start[src->npc] = s;
		src->pc_len[src->npc] = end - s < cap ? (uint32_t)(end - s) : cap;
		src->packed += src->pc_len[src->npc];
		src->npc++;
	}
	return 0;
}

/*
 * First-fit: each piece, in corpus order, into the first row with room for
 * it (a max-tree over the rows' free slots finds it in log time; a piece
 * always fits a fresh row, so npc leaves are enough), then the pieces
 * sorted by row, keeping their order within one.
 */
static int pack_rows(struct tokens_source *src)
{
	uint32_t cap = src->seq_len + 1, *tree;
	size_t *row;
	uint64_t *start = NULL, *fill = NULL;
	uint32_t *len = NULL;
	size_t P = 1;
	int r = -ENOMEM;

	while (P < src->npc)
		P <<= 1;
	tree = malloc(2 * P * sizeof(*tree));
	row = malloc((src->npc + 1) * sizeof(*row));
	if (!tree || !row)
		goto out;
	for (size_t k = 1; k < 2 * P; k++)
		tree[k] = cap;
	for (size_t i = 0; i < src->npc; i++) {
		size_t k = 1;

		while (k < P)
			k = tree[2 * k] >= src->pc_len[i] ? 2 * k : 2 * k + 1;
		row[i] = k - P;
		if (row[i] + 1 > src->nrows)
			src->nrows = row[i] + 1;
		tree[k] -= src->pc_len[i];
		for (k >>= 1; k; k >>= 1)
			tree[k] = tree[2 * k] > tree[2 * k + 1] ? tree[2 * k] : tree[2 * k + 1];
	}
	src->row_first = calloc(src->nrows + 1, sizeof(*src->row_first));
	fill = malloc((src->nrows + 1) * sizeof(*fill));
	start = malloc((src->npc + 1) * sizeof(*start));
	len = malloc((src->npc + 1) * sizeof(*len));
	if (!src->row_first || !fill || !start || !len)
		goto out;
	for (size_t i = 0; i < src->npc; i++)
		src->row_first[row[i] + 1]++;
	for (uint64_t k = 0; k < src->nrows; k++)
		src->row_first[k + 1] += src->row_first[k];
	memcpy(fill, src->row_first, (src->nrows + 1) * sizeof(*fill));
	for (size_t i = 0; i < src->npc; i++) {
		uint64_t at = fill[row[i]]++;

		start[at] = src->pc_start[i];
		len[at] = src->pc_len[i];
	}
	free(src->pc_start);
	free(src->pc_len);
	src->pc_start = start;
	src->pc_len = len;
	start = NULL;
	len = NULL;
	r = 0;
out:
	free(tree);
	free(row);
	free(fill);
	free(start);
	free(len);
	return r;
}

/* Status "corpus" (what the patterns expanded to), and "packing". */
static json_t *tokens_status_json(const struct source *base)
{
	const struct tokens_source *src = (const struct tokens_source *)base;
	uint64_t capacity = src->nrows * ((uint64_t)src->seq_len + 1);
	json_t *o = json_pack("{s:{s:I, s:I, s:o}}", "corpus",
			      "files", (json_int_t)src->nfiles,
			      "tokens", (json_int_t)src->ntokens,
			      "documents", src->boundaries == TOKENS_BOUNDARIES_DOCUMENT
						   ? json_integer((json_int_t)src->ndocs)
						   : json_null());
	json_t *pk;

	if (!o || !src->packing)
		return o;
	pk = json_pack("{s:I, s:I, s:I, s:I, s:I, s:f}", "rows", (json_int_t)src->nrows,
		       "documents", (json_int_t)src->ndocs, "pieces", (json_int_t)src->npc,
		       "tokens", (json_int_t)src->packed, "capacity", (json_int_t)capacity,
		       "efficiency", capacity ? (double)src->packed / (double)capacity : 0.0);
	if (json_object_set_new(o, "packing", pk) < 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* ---- the files ---- */

static int add_file(struct tokens_source *src, const char *path, char *err, size_t errlen)
{
	struct tok_file *f;
	struct stat st;
	int fd, r;

	if (src->nfiles >= TOKENS_FILES_MAX)
		return errfmt(-E2BIG, err, errlen, "%s: more than %d files, the most a corpus has", src->what,
			      TOKENS_FILES_MAX);
	if (src->nfiles == src->filecap) {
		size_t cap = src->filecap ? src->filecap * 2 : 16;

		f = realloc(src->files, cap * sizeof(*f));
		if (!f)
			return -ENOMEM;
		src->files = f;
		src->filecap = cap;
	}
	f = &src->files[src->nfiles];
	*f = (struct tok_file){ .fd = -1, .first = src->ntokens, .path = strdup(path) };
	if (!f->path)
		return -ENOMEM;
	src->nfiles++;
	f->ranged = source_ranged(&src->base, path);
	if (f->ranged) {
		uint64_t size;

		fd = -1;
		if ((r = source_object_size(&src->base, path, &size, err, errlen)) < 0)
			return r;
		st.st_size = (off_t)size;
	} else if ((fd = source_open_path(&src->base, path, &st, err, errlen)) < 0) {
		return fd;
	}
	if ((uint64_t)st.st_size % src->elem) {
		if (fd >= 0)
			close(fd);
		return errfmt(-EINVAL, err, errlen,
			      "%s: size %llu is not a multiple of %zu bytes (%s tokens)", path,
			      (unsigned long long)st.st_size, src->elem, dtype_name(src->dtype));
	}
	f->ntokens = (uint64_t)st.st_size / src->elem;
	src->ntokens += f->ntokens;
	r = 0;
	if (src->boundaries == TOKENS_BOUNDARIES_DOCUMENT)
		r = scan_documents(src, f, fd, err, errlen);
	else if (src->boundaries == TOKENS_BOUNDARIES_FILE)
		r = seg_end(src, f->first, f->first + f->ntokens);
	if (r == 0 && fd >= 0 && src->nfiles <= TOKEN_FDS_MAX) {
		f->fd = fd;
		src->nfds++;
	} else if (fd >= 0) {
		close(fd);
	}
	return r;
}

static int strcmp_p(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names of the corpus's files, in order, before any is opened. */
struct names {
	char **v;
	size_t n, cap;
	const char *what;    /* the corpus, in errors */
};

/* Take @name (malloc'd) into @nm; freed on failure. */
static int names_take(struct names *nm, char *name, char *err, size_t errlen)
{
	if (!name)
		return -ENOMEM;
	if (nm->n >= TOKENS_FILES_MAX) {
		free(name);
		return errfmt(-E2BIG, err, errlen, "%s: more than %d files, the most a corpus has", nm->what,
			      TOKENS_FILES_MAX);
	}
	if (nm->n == nm->cap) {
		size_t cap = nm->cap ? nm->cap * 2 : 64;
		char **v = realloc(nm->v, cap * sizeof(*v));

		if (!v) {
			free(name);
			return -ENOMEM;
		}
		nm->v = v;
		nm->cap = cap;
	}
	nm->v[nm->n++] = name;
	return 0;
}

/* A glob over a store's keys: those under its directory, one level. */
struct key_glob {
	struct names *nm;
	const char *pattern;    /* the URL */
	size_t dir_len;         /* of the URL's directory, with its '/' */
	size_t key_dir_len;     /* of the key's directory, with its '/' */
	const char *base;       /* the file-name pattern */
	size_t first;           /* nm->n before the listing */
	char *err;
	size_t errlen;
};

static int key_glob_fn(void *arg, const char *key, uint64_t size, const char *etag)
{
	struct key_glob *g = arg;
	const char *name = key + g->key_dir_len;
	char *url;

	(void)size;
	(void)etag;
	if (strlen(key) <= g->key_dir_len || strchr(name, '/') || fnmatch(g->base, name, FNM_PERIOD) != 0)
		return 0;
	if (asprintf(&url, "%.*s%s", (int)g->dir_len, g->pattern, name) < 0)
		url = NULL;
	return names_take(g->nm, url, g->err, g->errlen);
}

/* A glob in the file name of an s3:// URL: the keys listed (ListObjectsV2
 * from the literal part of the name on), as the creator, sorted. */
static int url_glob(struct tokens_source *src, struct names *nm, const char *pattern, char *err, size_t errlen)
{
	const char *slash = strrchr(pattern, '/'), *bucket_end;
	struct key_glob g = { .nm = nm, .pattern = pattern, .base = slash + 1, .first = nm->n, .err = err,
			      .errlen = errlen };
	char *prefix;
	int r;

	if (strncmp(pattern, "s3://", 5))
		return errfmt(-EINVAL, err, errlen, "%s: a glob needs a local path or an s3:// URL (an "
			      "http(s):// server cannot be listed)", pattern);
	if (!(bucket_end = strchr(pattern + 5, '/')))
		return errfmt(-EINVAL, err, errlen, "%s: a glob in a bucket's name (s3://bucket/key: only "
			      "the key's file name may have one)", pattern);
	g.dir_len = (size_t)(slash - pattern) + 1;
	g.key_dir_len = g.dir_len - (size_t)(bucket_end + 1 - pattern);
	/* the listing starts at the name's literal part: "s3://b/tok/shard-" */
	prefix = strndup(pattern, g.dir_len + strcspn(g.base, "*?[\\"));
	if (!prefix)
		return -ENOMEM;
	r = source_list_url(&src->base, prefix, key_glob_fn, &g, err, errlen);
	free(prefix);
	if (r < 0)
		return r;
	if (nm->n == g.first)
		return errfmt(-ENOENT, err, errlen, "%s: no object matches", pattern);
	qsort(nm->v + g.first, nm->n - g.first, sizeof(*nm->v), strcmp_p);
	return 0;
}

/* A name with glob characters in its file name: the matches, sorted. */
static int add_glob(struct tokens_source *src, struct names *nm, const char *pattern, char *err,
		    size_t errlen)
{
	const char *slash = strrchr(pattern, '/');
	int prefix = slash ? (int)(slash - pattern) + 1 : 0;   /* the directory, with its '/' */
	char *dir;
	const char *base = slash ? slash + 1 : pattern;
	size_t first = nm->n;
	struct dirent *de;
	DIR *d = NULL;
	int r = 0;

	if (source_is_url(pattern))
		return url_glob(src, nm, pattern, err, errlen);
	dir = !slash ? strdup(".") : slash == pattern ? strdup("/") : strndup(pattern, (size_t)(slash - pattern));
	if (!dir)
		return -ENOMEM;
	d = ds_opendir(&src->base.who, dir, err, errlen);
	if (!d) {
		r = errno ? -errno : -EIO;
		goto out;
	}
	while (r == 0 && (de = readdir(d))) {
		char *name;

		if (fnmatch(base, de->d_name, FNM_PERIOD) != 0)
			continue;
		if (asprintf(&name, "%.*s%s", prefix, pattern, de->d_name) < 0)
			name = NULL;
		r = names_take(nm, name, err, errlen);
	}
	if (r == 0 && nm->n == first)
		r = errfmt(-ENOENT, err, errlen, "%s: no file matches", pattern);
	if (r == 0)
		qsort(nm->v + first, nm->n - first, sizeof(*nm->v), strcmp_p);
out:
	if (d)
		closedir(d);
	free(dir);
	return r;
}

/* Every file "paths" names, in order: brace ranges, then globs. */
static int expand_paths(struct tokens_source *src, struct names *nm, char *const *paths, size_t npaths,
			char *err, size_t errlen)
{
	for (size_t p = 0; p < npaths; p++) {
		struct brace *br = malloc(sizeof(*br));
		char *name = NULL;
		int r = br ? brace_parse(paths[p], br, err, errlen) : -ENOMEM;

		if (r == 0 && !(name = malloc(br->maxlen)))
			r = -ENOMEM;
		for (unsigned long long i = 0; r == 0 && i < br->total; i++) {
			brace_nth(br, i, name);
			r = strpbrk(name, "*?[") ? add_glob(src, nm, name, err, errlen)
						 : names_take(nm, strdup(name), err, errlen);
		}
		free(name);
		free(br);
		if (r < 0)
			return r;
	}
	return 0;
}

/* The corpus's files: named, the objects among them fetched into the
 * node's cache (several at once, as the creator), or when more than it
 * holds HEADed only (read by range), then each opened. */
static int add_paths(struct tokens_source *src, const struct spec *spec, char *err, size_t errlen)
{
	struct names nm = { .what = src->what };
	char *one = spec->source.path;
	int r = spec->source.npaths ? expand_paths(src, &nm, spec->source.paths, spec->source.npaths, err, errlen)
				    : 0;

	if (r == 0)
		r = source_range_urls(&src->base, spec->source.npaths ? nm.v : &one,
				      spec->source.npaths ? nm.n : 1, err, errlen);
	for (size_t i = 0; r == 0 && i < (spec->source.npaths ? nm.n : 1); i++)
		r = add_file(src, spec->source.npaths ? nm.v[i] : one, err, errlen);
	for (size_t i = 0; i < nm.n; i++)
		free(nm.v[i]);
	free(nm.v);
	return r;
}

static int check_windows(struct tokens_source *src, char *err, size_t errlen)
{
	if (src->packing)
		return src->nrows ? 0 : errfmt(-EINVAL, err, errlen, "%s: no tokens to pack",
					       src->what);
	if (src->nseg)
		return 0;
	if (src->boundaries == TOKENS_BOUNDARIES_NONE ||
	    (src->boundaries == TOKENS_BOUNDARIES_FILE && src->nfiles == 1))
		return errfmt(-EINVAL, err, errlen, "%s: too small for seq_len %u: %llu tokens",
			      src->what, src->seq_len, (unsigned long long)src->ntokens);
	return errfmt(-EINVAL, err, errlen,
		      "%s: too small for seq_len %u: no %s holds %u tokens (%llu %ss)", src->what,
		      src->seq_len,
		      src->boundaries == TOKENS_BOUNDARIES_DOCUMENT ? "document" : "file",
		      src->seq_len + 1,
		      (unsigned long long)(src->boundaries == TOKENS_BOUNDARIES_DOCUMENT
						   ? src->ndocs : src->nfiles),
		      src->boundaries == TOKENS_BOUNDARIES_DOCUMENT ? "document" : "file");
}

/* ---- the dataset ---- */

/* input, target; with packing position_ids, cu_seqlens, loss_mask too. */
static void set_fields(struct tokens_source *src)
{
	static const char *const names[] = { "input", "target", "position_ids", "cu_seqlens",
		"loss_mask" };
	static const int dtypes[] = { -1, -1, LDR_DTYPE_INT64, LDR_DTYPE_INT32,
		LDR_DTYPE_FLOAT32 };

	src->base.nfields = src->packing ? 5 : 2;
	for (size_t i = 0; i < src->base.nfields; i++) {
		struct field_desc *f = &src->base.fields[i];

		snprintf(f->name, sizeof(f->name), "%s", names[i]);
		f->dtype = dtypes[i] < 0 ? src->out_dtype : dtypes[i];
		f->ndim = 1;
		f->shape[0] = src->seq_len + (i == 3);
		f->sample_bytes = (size_t)f->shape[0] * dtype_size(f->dtype);
	}
}

static int tokens_open(struct source *base, const struct spec *spec, char *err, size_t errlen)
{
	struct tokens_source *src = (struct tokens_source *)base;
	int r;

	src->dtype = spec->source.dtype;
	src->out_dtype = spec->source.output_dtype;
	src->elem = dtype_size(src->dtype);
	src->seq_len = spec->source.seq_len;
	src->boundaries = spec->source.tokens.boundaries;
	src->eos = spec->source.tokens.eos;
	src->random_offset = spec->source.tokens.random_offset;
	src->packing = spec->source.tokens.packing;
	/* the spec's seed, never a client's augment seed: the offsets are the
	 * dataset, as the permutation is (docs/spec.md) */
	src->seed = spec->seed;
	if (!src->elem || !dtype_size(src->out_dtype) || src->seq_len == 0)
		return errfmt(-EINVAL, err, errlen, "invalid token source");
	if (spec->source.npaths)
		snprintf(src->what, sizeof(src->what), "%s%s", spec->source.paths[0],
			 spec->source.npaths > 1 ? " ..." : "");
	else
		snprintf(src->what, sizeof(src->what), "%s", spec->source.path);

	r = add_paths(src, spec, err, errlen);
	if (r == 0 && src->boundaries == TOKENS_BOUNDARIES_NONE)
		r = seg_end(src, 0, src->ntokens);
	if (r == 0 && src->packing)
		r = pack_rows(src);
	if (r == 0)
		r = check_windows(src, err, errlen);
	if (r < 0) {
		if (r == -ENOMEM && err && errlen && !err[0])
			errfmt(r, err, errlen, "%s: out of memory", src->what);
		return r;
	}
	src->base.nsamples = src->packing ? src->nrows
			     : src->random_offset ? spec->source.tokens.samples_per_epoch
						  : src->seg_cum[src->nseg];
	src->base.index_bytes = src->nfiles * sizeof(*src->files) +
				src->segcap * 2 * sizeof(uint64_t) +
				src->npc * (sizeof(uint64_t) + sizeof(uint32_t)) +
				(src->packing ? (src->nrows + 1) * sizeof(uint64_t) : 0);
	for (size_t i = 0; i < src->nfiles; i++)
		src->base.index_bytes += strlen(src->files[i].path) + 1;
	set_fields(src);
	return 0;
}


#define WIDEN(T)                                                             \
	static void widen_##T(int64_t *restrict in, int64_t *restrict tg,    \
			      const T *restrict buf, size_t n)               \
	{                                                                    \
		for (size_t j = 0; j < n; j++)                               \
			in[j] = (int64_t)buf[j];                             \
		for (size_t j = 0; j < n; j++)                               \
			tg[j] = (int64_t)buf[j + 1];                         \
	}
WIDEN(uint16_t)
WIDEN(uint32_t)
WIDEN(int32_t)

/*
 * random_offset's start r in [0, w) for sample @i of @epoch: splitmix64
 * draws from a key of (seed, epoch, i), the first x >= 2^64 mod w taken as
 * x mod w (no modulo bias). docs/spec.md says the same.
 */
static uint64_t offset_draw(uint64_t seed, uint64_t epoch, uint64_t i, uint64_t w)
{
	uint64_t key = splitmix64(splitmix64(splitmix64(seed ^ OFFSET_TAG) ^ epoch) ^ i);
	uint64_t lim = (0 - w) % w;        /* 2^64 mod w */

	for (uint64_t n = 0;; n++) {
		uint64_t x = splitmix64(key + n);

		if (x >= lim)
			return x % w;
	}
}

/* The corpus position of sample @idx's first token. */
static uint64_t window_start(const struct tokens_source *src, const struct sample_ctx *ctx,
			     uint64_t idx)
{
	uint64_t r = idx;
	size_t lo = 0, hi = src->nseg;

	if (src->random_offset)
		r = offset_draw(src->seed, ctx ? ctx->epoch : 0, idx, src->seg_cum[src->nseg]);
	while (hi - lo > 1) {                 /* the last segment with cum <= r */
		size_t mid = lo + (hi - lo) / 2;

		if (src->seg_cum[mid] <= r)
			lo = mid;
		else
			hi = mid;
	}
	r -= src->seg_cum[lo];
	return src->seg_start[lo] + (src->random_offset ? r : r * src->seq_len);
}

/*
 * The fd to read @file with: its kept one, else opened (as the creator) and
 * kept while the source holds fewer than TOKEN_FDS_MAX, so a corpus of a
 * few thousand shards opens each once rather than once per sample. *@own:
 * the caller closes it after the read (past the budget, or a race lost).
 */
static int file_fd(struct tokens_source *src, struct tok_file *file, bool *own, char *err,
		   size_t errlen)
{
	int fd = atomic_load_explicit(&file->fd, memory_order_acquire), none = -1;

	*own = false;
	if (fd >= 0)
		return fd;
	fd = source_open_path(&src->base, file->path, NULL, err, errlen);
	if (fd < 0)
		return fd;
	if (atomic_fetch_add_explicit(&src->nfds, 1, memory_order_relaxed) >= TOKEN_FDS_MAX) {
		atomic_fetch_sub_explicit(&src->nfds, 1, memory_order_relaxed);
		*own = true;
		return fd;
	}
	if (!atomic_compare_exchange_strong_explicit(&file->fd, &none, fd, memory_order_acq_rel,
						     memory_order_acquire)) {
		/* another worker kept its own first */
		atomic_fetch_sub_explicit(&src->nfds, 1, memory_order_relaxed);
		*own = true;
	}
	return fd;
}

/* @n tokens of the corpus from @at into @buf, file after file. */
static int read_tokens(struct tokens_source *src, uint64_t at, size_t n, unsigned char *buf,
		       char *err, size_t errlen)
{
	size_t lo = 0, hi = src->nfiles;

	while (hi - lo > 1) {                 /* the last file with first <= at */
		size_t mid = lo + (hi - lo) / 2;

		if (src->files[mid].first <= at)
			lo = mid;
		else
			hi = mid;
	}
	for (size_t f = lo; n > 0; f++) {
		struct tok_file *file = &src->files[f];
		uint64_t off;
		size_t k;
		bool own;
		int fd, r;

		if (f >= src->nfiles)
			return errfmt(-EIO, err, errlen, "%s: read past the corpus", src->what);
		off = at - file->first;
		if (off >= file->ntokens)
			continue;
		k = file->ntokens - off < n ? (size_t)(file->ntokens - off) : n;
		if (file->ranged) {
			/* one ranged GET per file the window touches */
			r = source_read_range(&src->base, file->path, off * src->elem, k * src->elem, buf, err,
					      errlen);
			if (r < 0)
				return r;
			buf += k * src->elem;
			at += k;
			n -= k;
			continue;
		}
		fd = file_fd(src, file, &own, err, errlen);
		if (fd < 0)
			return fd;
		r = source_read_full(fd, file->path, buf, k * src->elem, off * src->elem, err,
				     errlen);
		if (own)
			close(fd);
		if (r < 0)
			return r;
		buf += k * src->elem;
		at += k;
		n -= k;
	}
	return 0;
}

/* Padding slots [@from, @to) of a packed row: the eos token. */
static void fill_eos(const struct tokens_source *src, unsigned char *buf, size_t from, size_t to)
{
	for (size_t j = from; j < to; j++) {
		if (src->dtype == LDR_DTYPE_UINT16)
			((uint16_t *)buf)[j] = (uint16_t)src->eos;
		else if (src->dtype == LDR_DTYPE_UINT32)
			((uint32_t *)buf)[j] = (uint32_t)src->eos;
		else
			((int32_t *)buf)[j] = (int32_t)src->eos;
	}
}

/*
 * Packed row @row into @buf (L+1 slots) and its position_ids, cu_seqlens
 * and loss_mask (docs/spec.md, "Packing"): each piece is a sequence of
 * its own, a loss only where the next slot holds the same piece's token.
 */
static int pack_read(struct tokens_source *src, uint64_t row, unsigned char *buf,
		     void *const *dsts, char *err, size_t errlen)
{
	size_t L = src->seq_len, used = 0, ncu = 0;
	int64_t *pos = dsts[2];
	int32_t *cu = dsts[3];
	float *mask = dsts[4];

	cu[ncu++] = 0;
	for (uint64_t p = src->row_first[row]; p < src->row_first[row + 1]; p++) {
		size_t s = used, e = used + src->pc_len[p];
		int r = read_tokens(src, src->pc_start[p], src->pc_len[p], buf + s * src->elem,
				    err, errlen);

		if (r < 0)
			return r;
		for (size_t j = s; j < e && j < L; j++) {
			pos[j] = (int64_t)(j - s);
			mask[j] = j + 1 < e ? 1.0f : 0.0f;
		}
		if (s < L)
			cu[ncu++] = (int32_t)(e < L ? e : L);
		used = e;
	}
	for (size_t j = used; j < L; j++) {
		pos[j] = 0;
		mask[j] = 0.0f;
	}
	while (ncu < L + 1)
		cu[ncu++] = -1;
	fill_eos(src, buf, used, L + 1);
	return 0;
}

static int tokens_read(struct source *base, const struct sample_ctx *ctx, uint64_t idx,
		       void *const *dsts, char *err, size_t errlen)
{
	struct tokens_source *src = (struct tokens_source *)base;
	size_t n = src->seq_len;
	size_t len = (n + 1) * src->elem;
	void *buf = source_scratch(len); /* L+1 tokens */
	int r;

	if (!buf)
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory for %zu bytes", src->what,
			      len);
	if (src->packing)
		r = pack_read(src, idx, buf, dsts, err, errlen);
	else
		r = read_tokens(src, window_start(src, ctx, idx), n + 1, buf, err, errlen);
	if (r < 0)
		return r;
	if (src->out_dtype == src->dtype) {
		memcpy(dsts[0], buf, n * src->elem);
		memcpy(dsts[1], (char *)buf + src->elem, n * src->elem);
		return 0;
	}
	switch (src->dtype) {
	case LDR_DTYPE_UINT16:
		widen_uint16_t(dsts[0], dsts[1], buf, n);
		break;
	case LDR_DTYPE_UINT32:
		widen_uint32_t(dsts[0], dsts[1], buf, n);
		break;
	case LDR_DTYPE_INT32:
		widen_int32_t(dsts[0], dsts[1], buf, n);
		break;
	default:
		return errfmt(-EINVAL, err, errlen, "%s: unsupported token dtype", src->what);
	}
	return 0;
}

static void tokens_close(struct source *base)
{
	struct tokens_source *src = (struct tokens_source *)base;

	for (size_t i = 0; i < src->nfiles; i++) {
		if (src->files[i].fd >= 0)
			close(src->files[i].fd);
		free(src->files[i].path);
	}
	free(src->files);
	free(src->seg_start);
	free(src->seg_cum);
	free(src->pc_start);
	free(src->pc_len);
	free(src->row_first);
}

const struct source_ops source_tokens_ops = {
	.parse = parse_tokens,
	.source_json = tokens_json,
	.size = sizeof(struct tokens_source),
	.open = tokens_open,
	.read = tokens_read,
	.status_json = tokens_status_json,
	.close = tokens_close,
};
