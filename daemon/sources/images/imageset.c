/* SPDX-License-Identifier: MIT */
/* imageset - the samples of an image source: a class-per-folder tree or tar shards */

/*
 * Listing a folder tree or indexing tar shards happens once, when the
 * pipeline opens its source; afterwards a sample is a name, a label and (for
 * shards) an offset and a size, and the workers read its bytes with one open
 * + read, or one pread into the shard. The page cache is the cache.
 *
 * Names live in one arena (a million ImageNet paths is one allocation of
 * ~40 MB instead of a million small ones); samples refer to them by offset.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "base/creds.h"
#include "sources/source-private.h"
#include "sources/brace.h"
#include "imageset.h"
#include "tar.h"

#define IMAGE_FILE_MAX (256u << 20)   /* bytes of one encoded image */
#define SAMPLES_MAX (1ull << 32)
#define WALK_DEPTH_MAX 32
#define SHARD_FDS_MAX 64              /* more shards: open per read */
#define CLS_MAX 64
/*
 * The bounds of what a create may make the daemon index (issue 13: a pattern
 * naming one shard a million times took 60 s and 2.9 GB): shards, and the
 * index's memory (40 bytes a sample and its name), checked as it grows so
 * that a create over them fails at once with the number. 65536 shards is
 * 6.5x what the largest public webdatasets use (LAION-5B: 10^4 shards of
 * 10^4 samples each would be 10^8 samples, over the memory bound anyway);
 * 2 GiB holds an index of ~30 million samples with 30-byte names
 * (ImageNet-21k has 14 million).
 */
#define SHARDS_MAX IMAGESET_SHARDS_MAX
#define INDEX_BYTES_MAX (2ull << 30)

enum label_state { LABEL_OK, LABEL_MISSING, LABEL_BAD };

struct image_entry {
	uint64_t offset, size;        /* webdataset: the image member */
	uint64_t name;                /* offset in the arena */
	int64_t label;
	uint32_t shard;
	uint8_t label_state;
};

struct imageset {
	struct creds who;             /* files are opened with these (creds.h) */
	const struct source *src;     /* opens the files, or their cached copies (objects.c) */
	bool folder;
	char *root;
	struct image_entry *v;
	uint64_t n, cap;
	char *names;
	size_t names_len, names_cap;
	size_t nclasses;
	char **urls;                  /* a store's folder read as a stream: each image's URL */
	char **shards;                /* webdataset: expanded paths */
	int *fds;                     /* -1: open per read */
	size_t nshards;
	size_t nshards_done;          /* indexed so far (messages) */
};

/* The index would take more than INDEX_BYTES_MAX: -E2BIG with the numbers. */
static int index_too_big(const struct imageset *set, char *err, size_t errlen)
{
	return errfmt(-E2BIG, err, errlen,
		      "%s: index of more than %llu MiB after %llu samples%s%zu%s (the most; split the dataset)",
		      set->folder ? set->root : "webdataset",
		      (unsigned long long)(INDEX_BYTES_MAX >> 20), (unsigned long long)set->n,
		      set->folder ? "" : " of ", set->folder ? 0 : set->nshards_done,
		      set->folder ? "" : " shards");
}

static int arena_add(struct imageset *set, const char *s, size_t n, uint64_t *off, char *err,
		     size_t errlen)
{
	if (set->names_len + n + 1 > set->names_cap) {
		size_t cap = set->names_cap ? set->names_cap * 2 : 4096;
		char *p;

		while (cap < set->names_len + n + 1)
			cap *= 2;
		if (cap + set->cap * sizeof(*set->v) > INDEX_BYTES_MAX)
			return index_too_big(set, err, errlen);
		p = realloc(set->names, cap);
		if (!p)
			return -ENOMEM;
		set->names = p;
		set->names_cap = cap;
	}
	memcpy(set->names + set->names_len, s, n);
	set->names[set->names_len + n] = '\0';
	*off = set->names_len;
	set->names_len += n + 1;
	return 0;
}

static struct image_entry *entry_add(struct imageset *set, char *err, size_t errlen)
{
	if (set->n == set->cap) {
		uint64_t cap = set->cap ? set->cap * 2 : 1024;
		struct image_entry *v;

		if (set->n >= SAMPLES_MAX) {
			errfmt(-E2BIG, err, errlen, "more than %llu samples",
			     (unsigned long long)SAMPLES_MAX);
			return NULL;
		}
		if (cap * sizeof(*v) + set->names_cap > INDEX_BYTES_MAX) {
			index_too_big(set, err, errlen);
			return NULL;
		}
		v = realloc(set->v, cap * sizeof(*v));
		if (!v)
			return NULL;
		set->v = v;
		set->cap = cap;
	}
	memset(&set->v[set->n], 0, sizeof(set->v[0]));
	return &set->v[set->n++];
}

static bool image_ext(const char *ext)
{
	return strcasecmp(ext, "jpg") == 0 || strcasecmp(ext, "jpeg") == 0 ||
	       strcasecmp(ext, "png") == 0;
}

/* ---- folder ---- */

struct strvec {
	char **v;
	size_t n, cap;
};

static int strvec_add(struct strvec *sv, const char *s)
{
	if (sv->n == sv->cap) {
		size_t cap = sv->cap ? sv->cap * 2 : 16;
		char **v = realloc(sv->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		sv->v = v;
		sv->cap = cap;
	}
	sv->v[sv->n] = strdup(s);
	if (!sv->v[sv->n])
		return -ENOMEM;
	sv->n++;
	return 0;
}

static void strvec_clear(struct strvec *sv)
{
	for (size_t i = 0; i < sv->n; i++)
		free(sv->v[i]);
	free(sv->v);
	memset(sv, 0, sizeof(*sv));
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A folder of the walk: its path relative to the root and its image files. */
struct walk_dir {
	char *rel;
	struct strvec files;
};

struct walk {
	const struct creds *who;
	const char *root;
	struct walk_dir *dirs;
	size_t n, cap;
};

static int cmp_dir(const void *a, const void *b)
{
	return strcmp(((const struct walk_dir *)a)->rel, ((const struct walk_dir *)b)->rel);
}

static bool is_dir(const struct creds *who, const char *path, const struct dirent *de)
{
	if (de->d_type == DT_DIR)
		return true;
	if (de->d_type != DT_LNK && de->d_type != DT_UNKNOWN)
		return false;
	return ds_is_dir(who, path);
}

/* A new folder @rel (its first @len bytes) of the walk: its index, or -ENOMEM. */
static long walk_add(struct walk *w, const char *rel, size_t len)
{
	struct walk_dir *d;

	if (w->n == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 64;
		struct walk_dir *v = realloc(w->dirs, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		w->dirs = v;
		w->cap = cap;
	}
	d = &w->dirs[w->n];
	memset(d, 0, sizeof(*d));
	d->rel = strndup(rel, len);
	if (!d->rel)
		return -ENOMEM;
	return (long)w->n++;
}

/* Record folder @rel (under the root) and walk its subfolders. */
static int walk_dir(struct walk *w, const char *rel, int depth, char *err, size_t errlen)
{
	char path[PATH_MAX], sub[PATH_MAX];
	struct dirent *de;
	size_t me;
	long at;
	DIR *dir;
	int r = 0;

	if (depth > WALK_DEPTH_MAX)
		return errfmt(-ELOOP, err, errlen, "%s/%s: folders nested deeper than %d (a link loop?)",
			    w->root, rel, WALK_DEPTH_MAX);
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", w->root, rel) >= sizeof(path))
		return errfmt(-ENAMETOOLONG, err, errlen, "%s/%s: path too long", w->root, rel);
	at = walk_add(w, rel, strlen(rel));
	if (at < 0)
		return (int)at;
	me = (size_t)at;
	dir = ds_opendir(w->who, path, err, errlen);
	if (!dir)
		return -errno;
	while ((errno = 0, de = readdir(dir))) {
		const char *dot;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if ((size_t)snprintf(sub, sizeof(sub), "%s/%s", rel, de->d_name) >= sizeof(sub)) {
			r = errfmt(-ENAMETOOLONG, err, errlen, "%s/%s: path too long", path,
				 de->d_name);
			break;
		}
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", w->root, sub) >= sizeof(path)) {
			r = errfmt(-ENAMETOOLONG, err, errlen, "%s/%s: path too long", w->root, sub);
			break;
		}
		if (is_dir(w->who, path, de)) {
			r = walk_dir(w, sub, depth + 1, err, errlen);
			if (r < 0)
				break;
			continue;
		}
		dot = strrchr(de->d_name, '.');
		if (dot && image_ext(dot + 1)) {
			r = strvec_add(&w->dirs[me].files, de->d_name);
			if (r < 0)
				break;
		}
	}
	if (r == 0 && errno)
		r = errfmt(-errno, err, errlen, "%s/%s: %s", w->root, rel, strerror(errno));
	closedir(dir);
	return r;
}

/* ---- a folder in a store: its listing as the tree ---- */

/* Every key under ROOT/ (relative to it) that is an image in a class
 * folder, and every class folder (a first component with a key below). */
struct listing {
	size_t prefix_len;            /* of the key prefix, "PREFIX/" */
	struct strvec rels;           /* "class/sub/file.jpg" */
	struct strvec classes;
};

static int listing_key(void *arg, const char *key, uint64_t size, const char *etag)
{
	struct listing *l = arg;
	const char *rel = key + l->prefix_len, *slash = strchr(rel, '/'), *dot, *base;
	char cls[PATH_MAX];

	(void)size;
	(void)etag;
	if (strlen(key) < l->prefix_len || !slash || slash == rel || (size_t)(slash - rel) >= sizeof(cls))
		return 0; /* a file of the root itself is no class's, as in a folder */
	snprintf(cls, sizeof(cls), "%.*s", (int)(slash - rel), rel);
	if (!l->classes.n || strcmp(l->classes.v[l->classes.n - 1], cls)) {
		bool known = false;

		for (size_t i = 0; i < l->classes.n && !known; i++)
			known = !strcmp(l->classes.v[i], cls);
		if (!known && strvec_add(&l->classes, cls) < 0)
			return -ENOMEM;
	}
	base = strrchr(rel, '/') + 1;
	dot = strrchr(base, '.');
	if (dot && image_ext(dot + 1) && strvec_add(&l->rels, rel) < 0)
		return -ENOMEM;
	return 0;
}

/* The folders of class @cls from the listing into @w, as walk_dir() would. */
static int walk_listing(struct walk *w, const struct listing *l, const char *cls)
{
	size_t first = w->n, clen = strlen(cls);

	for (size_t i = 0; i < l->rels.n; i++) {
		const char *rel = l->rels.v[i], *slash = strrchr(rel, '/');
		size_t dlen = (size_t)(slash - rel);
		struct walk_dir *d = NULL;

		if (strncmp(rel, cls, clen) || rel[clen] != '/')
			continue;
		for (size_t k = w->n; k-- > first && !d;)
			if (strlen(w->dirs[k].rel) == dlen && !strncmp(w->dirs[k].rel, rel, dlen))
				d = &w->dirs[k];
		if (!d) {
			long at = walk_add(w, rel, dlen);

			if (at < 0)
				return (int)at;
			d = &w->dirs[at];
		}
		if (strvec_add(&d->files, slash + 1) < 0)
			return -ENOMEM;
	}
	return 0;
}

/* The class folders of a store's prefix @root, listed as the creator. */
static int list_classes(const struct imageset *set, const char *root, struct listing *l, struct strvec *classes,
			char *err, size_t errlen)
{
	char url[PATH_MAX];
	const char *key = strchr(root + 5, '/');
	int r;

	if (strncmp(root, "s3://", 5))
		return errfmt(-EINVAL, err, errlen, "%s: only an s3:// prefix can be listed", root);
	snprintf(url, sizeof(url), "%s/", root);
	l->prefix_len = key ? strlen(key + 1) + 1 : 0;
	r = source_list_url(set->src, url, listing_key, l, err, errlen);
	if (r < 0)
		return r;
	*classes = l->classes;
	memset(&l->classes, 0, sizeof(l->classes));
	return 0;
}

/* Every image of a store's folder fetched into the node's cache at once;
 * when they are more than cache_bytes, only HEADed, each fetched when read
 * or ahead of the reads (@object_of names sample idx's URL): set->urls. */
static int fetch_folder(struct imageset *set, const char *(*object_of)(void *arg, uint64_t idx), void *arg,
			char *err, size_t errlen)
{
	char **urls = calloc(set->n ? set->n : 1, sizeof(*urls));
	int r = 0;

	if (!urls)
		return -ENOMEM;
	for (uint64_t i = 0; i < set->n && r == 0; i++)
		if (asprintf(&urls[i], "%s/%s", set->root, set->names + set->v[i].name) < 0) {
			urls[i] = NULL;
			r = -ENOMEM;
		}
	if (r == 0)
		r = source_stream_objects((struct source *)set->src, urls, set->n, object_of, arg, err, errlen);
	if (r == 0 && source_streams(set->src)) {
		set->urls = urls;
		return 0;
	}
	for (uint64_t i = 0; i < set->n; i++)
		free(urls[i]);
	free(urls);
	return r;
}

/* A folder read as @who, or as @src (its creator, and a store's prefix). */
static int open_folder(struct imageset **out, const struct creds *who, const struct source *src,
		       const char *root, const char *(*object_of)(void *arg, uint64_t idx), void *arg,
		       char *err, size_t errlen)
{
	struct listing l = { 0 };
	bool remote = src && source_is_url(root);
	struct imageset *set = calloc(1, sizeof(*set));
	struct strvec classes = { 0 };
	struct walk w = { .root = root };
	struct dirent *de;
	DIR *dir = NULL;
	int r = 0;

	if (!set)
		return -ENOMEM;
	set->who = *who;
	set->src = src;
	w.who = &set->who;
	set->folder = true;
	set->root = strdup(root);
	if (!set->root) {
		r = -ENOMEM;
		goto out;
	}
	if (remote && (r = list_classes(set, root, &l, &classes, err, errlen)) < 0)
		goto out;
	dir = remote ? NULL : ds_opendir(who, root, err, errlen);
	if (!dir && !remote) {
		r = -errno;
		goto out;
	}
	errno = 0;
	while (dir && (errno = 0, de = readdir(dir))) {
		char path[PATH_MAX];

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", root, de->d_name) >= sizeof(path))
			continue;
		if (is_dir(who, path, de) && (r = strvec_add(&classes, de->d_name)) < 0)
			goto out;
	}
	if (dir && errno) {
		r = errfmt(-errno, err, errlen, "%s: %s", root, strerror(errno));
		goto out;
	}
	if (classes.n == 0) {
		r = errfmt(-EINVAL, err, errlen,
		           "%s: no class folders (an image_folder root holds one folder per class)", root);
		goto out;
	}
	qsort(classes.v, classes.n, sizeof(classes.v[0]), cmp_str);
	set->nclasses = classes.n;
	for (size_t c = 0; c < classes.n; c++) {
		size_t first = w.n;

		r = remote ? walk_listing(&w, &l, classes.v[c]) : walk_dir(&w, classes.v[c], 0, err, errlen);
		if (r < 0)
			goto out;
		if (w.n - first > 1)
			qsort(w.dirs + first, w.n - first, sizeof(w.dirs[0]), cmp_dir);
		for (size_t k = first; k < w.n; k++) {
			struct walk_dir *d = &w.dirs[k];

			/* a folder of folders only has no list (qsort's NULL) */
			if (d->files.n > 1)
				qsort(d->files.v, d->files.n, sizeof(d->files.v[0]), cmp_str);
			for (size_t f = 0; f < d->files.n; f++) {
				char rel[PATH_MAX];
				struct image_entry *e;
				int n = snprintf(rel, sizeof(rel), "%s/%s", d->rel, d->files.v[f]);

				if (n < 0 || (size_t)n >= sizeof(rel)) {
					r = errfmt(-ENAMETOOLONG, err, errlen, "%s/%s/%s: path too long",
						 root, d->rel, d->files.v[f]);
					goto out;
				}
				e = entry_add(set, err, errlen);
				if (!e) {
					r = err && err[0] ? -E2BIG : -ENOMEM;
					goto out;
				}
				e->label = (int64_t)c;
				r = arena_add(set, rel, (size_t)n, &e->name, err, errlen);
				if (r < 0)
					goto out;
			}
		}
	}
	if (set->n == 0)
		r = errfmt(-EINVAL, err, errlen,
			 "%s: no .jpg, .jpeg or .png files in its %zu class folders", root,
			 classes.n);
	else if (remote)
		r = fetch_folder(set, object_of, arg, err, errlen);
out:
	if (dir)
		closedir(dir);
	strvec_clear(&classes);
	strvec_clear(&l.rels);
	strvec_clear(&l.classes);
	for (size_t k = 0; k < w.n; k++) {
		free(w.dirs[k].rel);
		strvec_clear(&w.dirs[k].files);
	}
	free(w.dirs);
	if (r < 0) {
		imageset_free(set);
		return r;
	}
	*out = set;
	return 0;
}

int imageset_open_folder(struct imageset **out, const struct creds *who, const char *root,
			 char *err, size_t errlen)
{
	return open_folder(out, who, NULL, root, NULL, NULL, err, errlen);
}

int imageset_open_folder_of(struct imageset **out, const struct source *src, const char *root,
			    const char *(*object_of)(void *arg, uint64_t idx), void *arg, char *err, size_t errlen)
{
	return open_folder(out, &src->who, src, root, object_of, arg, err, errlen);
}

/* ---- webdataset ---- */

struct indexer {
	struct imageset *set;
	uint32_t shard;
	int fd;
	const char *path;
	char key[TAR_NAME_MAX];
	bool open;                    /* a sample is being assembled */
	bool have_image;
	uint64_t off, size;
	int64_t label;
	uint8_t label_state;
};

static int indexer_flush(struct indexer *ix, char *err, size_t errlen)
{
	struct image_entry *e;

	if (!ix->open || !ix->have_image) {
		ix->open = false;
		return 0;
	}
	ix->open = false;
	e = entry_add(ix->set, err, errlen);
	if (!e)
		return err && err[0] ? -E2BIG : -ENOMEM;
	e->offset = ix->off;
	e->size = ix->size;
	e->shard = ix->shard;
	e->label = ix->label;
	e->label_state = ix->label_state;
	return arena_add(ix->set, ix->key, strlen(ix->key), &e->name, err, errlen);
}

static void parse_cls(struct indexer *ix, const char *text, size_t len)
{
	char buf[CLS_MAX + 1], *end;
	long long v;
	size_t a = 0, b = len;

	while (a < b && (text[a] == ' ' || text[a] == '\t' || text[a] == '\n' || text[a] == '\r'))
		a++;
	while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\t' || text[b - 1] == '\n' ||
			 text[b - 1] == '\r' || text[b - 1] == '\0'))
		b--;
	ix->label_state = LABEL_BAD;
	if (a == b || b - a > CLS_MAX)
		return;
	memcpy(buf, text + a, b - a);
	buf[b - a] = '\0';
	errno = 0;
	v = strtoll(buf, &end, 10);
	if (errno || *end)
		return;
	ix->label = v;
	ix->label_state = LABEL_OK;
}

static int index_entry(void *userdata, const struct tar_entry *e, char *err, size_t errlen)
{
	struct indexer *ix = userdata;
	const char *base = strrchr(e->name, '/');
	const char *dot;
	size_t klen;
	int r;

	base = base ? base + 1 : e->name;
	dot = strchr(base, '.');
	if (!dot || dot == base)
		return 0; /* no extension (or a dotfile): not part of a sample */
	klen = (size_t)(dot - e->name);
	if (!ix->open || strlen(ix->key) != klen || memcmp(ix->key, e->name, klen) != 0) {
		r = indexer_flush(ix, err, errlen);
		if (r < 0)
			return r;
		memcpy(ix->key, e->name, klen);
		ix->key[klen] = '\0';
		ix->open = true;
		ix->have_image = false;
		ix->label = 0;
		ix->label_state = LABEL_MISSING;
	}
	if (image_ext(dot + 1)) {
		if (!ix->have_image) {
			ix->have_image = true;
			ix->off = e->offset;
			ix->size = e->size;
		}
	} else if (strcasecmp(dot + 1, "cls") == 0) {
		char text[CLS_MAX + 8];
		size_t n = e->size < sizeof(text) ? (size_t)e->size : sizeof(text);
		ssize_t got;

		do
			got = pread(ix->fd, text, n, (off_t)e->offset);
		while (got < 0 && errno == EINTR);
		if (got < 0)
			return errfmt(-errno, err, errlen, "%s: read failed at offset %llu: %s",
				    ix->path, (unsigned long long)e->offset, strerror(errno));
		if ((size_t)got != n)
			return errfmt(-EINVAL, err, errlen, "%s: truncated at offset %llu", ix->path,
				    (unsigned long long)e->offset);
		if (e->size > CLS_MAX)
			ix->label_state = LABEL_BAD;
		else
			parse_cls(ix, text, n);
	}
	return 0;
}

/* Index shard @s (set->shards[s]) into @set. */
static int index_shard(struct imageset *set, struct indexer *ix, size_t s, bool keep_fd,
		       char *err, size_t errlen)
{
	const char *path = set->shards[s];
	struct stat st;
	size_t hold;
	int fd = source_open_read(set->src, path, &st, &hold, err, errlen), r;

	if (fd < 0)
		return fd;
	/* a streamed object is given back once indexed: it may be evicted */
	keep_fd = keep_fd && !hold;
	ix->shard = (uint32_t)s;
	ix->fd = fd;
	ix->path = path;
	ix->open = false;
	r = tar_scan(fd, path, (uint64_t)st.st_size, index_entry, ix, err, errlen);
	if (r == 0)
		r = indexer_flush(ix, err, errlen);
	if (keep_fd && r == 0)
		set->fds[s] = fd;
	else
		source_close_read(set->src, fd, hold);
	return r;
}

long imageset_count_shards(char *const *urls, size_t nurls, char *err, size_t errlen)
{
	unsigned long long total = 0;

	for (size_t u = 0; u < nurls; u++) {
		long n = brace_expand(urls[u], NULL, err, errlen);

		if (n < 0)
			return n;
		total += (unsigned long long)n;
	}
	if (total > SHARDS_MAX)
		return errfmt(-E2BIG, err, errlen, "webdataset: %llu shards named, the most is %d",
			      total, SHARDS_MAX);
	return (long)total;
}

int imageset_open_webdataset(struct imageset **out, const struct source *src, char *const *urls,
			     size_t nurls, char *err, size_t errlen)
{
	struct imageset *set = calloc(1, sizeof(*set));
	struct indexer *ix = NULL;
	struct brace *br = NULL;
	char *name = NULL;
	long total;
	int r = 0;

	if (!set)
		return -ENOMEM;
	set->who = src->who;
	set->src = src;
	/* the count first, from the patterns alone: a create over the bound
	 * fails before a name is made or a file opened */
	total = imageset_count_shards(urls, nurls, err, errlen);
	if (total < 0) {
		r = (int)total;
		goto out;
	}
	set->shards = calloc((size_t)total + 1, sizeof(*set->shards));
	set->fds = malloc(((size_t)total + 1) * sizeof(*set->fds));
	ix = calloc(1, sizeof(*ix));
	br = malloc(sizeof(*br));
	if (!set->shards || !set->fds || !ix || !br) {
		r = -ENOMEM;
		goto out;
	}
	for (long s = 0; s < total; s++)
		set->fds[s] = -1;
	ix->set = set;
	/* each shard indexed as its name is made: a missing one fails there */
	for (size_t u = 0; u < nurls; u++) {
		r = brace_parse(urls[u], br, err, errlen);
		if (r < 0)
			goto out;
		free(name);
		name = malloc(br->maxlen);
		if (!name) {
			r = -ENOMEM;
			goto out;
		}
		for (unsigned long long i = 0; i < br->total; i++) {
			size_t s = set->nshards;

			brace_nth(br, i, name);
			set->shards[s] = strdup(name);
			if (!set->shards[s]) {
				r = -ENOMEM;
				goto out;
			}
			set->nshards++;
			r = index_shard(set, ix, s, total <= SHARD_FDS_MAX, err, errlen);
			if (r < 0)
				goto out;
			set->nshards_done = set->nshards;
		}
	}
	if (set->n == 0)
		r = errfmt(-EINVAL, err, errlen,
			 "%s%s: no samples (members named KEY.jpg, KEY.jpeg or KEY.png)",
			 set->nshards ? set->shards[0] : "webdataset",
			 set->nshards > 1 ? " ..." : "");
out:
	free(ix);
	free(br);
	free(name);
	if (r < 0) {
		if (r == -ENOMEM && err && errlen && !err[0])
			errfmt(r, err, errlen, "webdataset: out of memory");
		imageset_free(set);
		return r;
	}
	*out = set;
	return 0;
}

struct imageset *imageset_free(struct imageset *set)
{
	if (!set)
		return NULL;
	for (size_t s = 0; s < set->nshards; s++) {
		if (set->fds && set->fds[s] >= 0)
			close(set->fds[s]);
		free(set->shards[s]);
	}
	for (uint64_t i = 0; set->urls && i < set->n; i++)
		free(set->urls[i]);
	free(set->urls);
	free(set->shards);
	free(set->fds);
	free(set->root);
	free(set->v);
	free(set->names);
	free(set);
	return NULL;
}

uint64_t imageset_bytes(const struct imageset *set)
{
	uint64_t b = sizeof(*set) + set->cap * sizeof(*set->v) + set->names_cap;

	for (size_t s = 0; s < set->nshards; s++)
		b += sizeof(*set->shards) + sizeof(*set->fds) + strlen(set->shards[s]) + 1;
	return b;
}

uint64_t *imageset_shard_first(const struct imageset *set, uint32_t *nshards)
{
	uint64_t *first;
	uint64_t i = 0;

	if (set->folder || !set->nshards)
		return NULL;
	first = malloc((set->nshards + 1) * sizeof(*first));
	if (!first)
		return NULL;
	/* samples are in shard order: shard k's run from its first to k + 1's */
	for (size_t k = 0; k <= set->nshards; k++) {
		while (i < set->n && set->v[i].shard < k)
			i++;
		first[k] = i;
	}
	*nshards = (uint32_t)set->nshards;
	return first;
}

const char *imageset_shard_of(const struct imageset *set, uint64_t idx)
{
	if (idx >= set->n)
		return NULL;
	return set->folder ? set->urls ? set->urls[idx] : NULL : set->shards[set->v[idx].shard];
}

uint64_t imageset_count(const struct imageset *set)
{
	return set->n;
}

size_t imageset_nclasses(const struct imageset *set)
{
	return set->nclasses;
}

void imageset_describe(const struct imageset *set, uint64_t idx, char *buf, size_t len)
{
	const struct image_entry *e = &set->v[idx];

	if (set->folder)
		snprintf(buf, len, "%s/%s", set->root, set->names + e->name);
	else
		snprintf(buf, len, "%s: %s", set->shards[e->shard], set->names + e->name);
}

static int grow(uint8_t **buf, size_t *cap, size_t len)
{
	uint8_t *p;

	if (*cap >= len && *buf)
		return 0;
	p = realloc(*buf, len ? len : 1);
	if (!p)
		return -ENOMEM;
	*buf = p;
	*cap = len ? len : 1;
	return 0;
}

static int read_at(int fd, uint8_t *dst, size_t len, uint64_t off, const char *what, char *err,
		   size_t errlen)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, dst + got, len - got, (off_t)(off + got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errfmt(-errno, err, errlen, "%s: read failed: %s", what, strerror(errno));
		if (n == 0)
			return errfmt(-EIO, err, errlen, "%s: truncated: wanted %zu bytes, got %zu",
				    what, len, got);
		got += (size_t)n;
	}
	return 0;
}

/* An image's fd given back: a streamed folder's to the cache (its pin). */
static void folder_close(const struct imageset *set, int fd, size_t hold)
{
	if (set->urls)
		source_close_read(set->src, fd, hold);
	else
		close(fd);
}

void imageset_note(const struct imageset *set, uint64_t idx)
{
	const struct image_entry *e = &set->v[idx];

	if (!set->folder && e->label_state != LABEL_MISSING && e->label_state != LABEL_BAD &&
	    e->size <= IMAGE_FILE_MAX && source_ranged(set->src, set->shards[e->shard]))
		source_ahead_note(set->src, set->shards[e->shard], e->offset, (size_t)e->size);
}

int imageset_read(const struct imageset *set, uint64_t idx, uint8_t **buf, size_t *cap,
		  size_t *len, int64_t *label, char *err, size_t errlen)
{
	const struct image_entry *e = &set->v[idx];
	char what[PATH_MAX + 64];
	size_t hold = 0;
	int fd, r;

	imageset_describe(set, idx, what, sizeof(what));
	if (set->folder) {
		struct stat st;

		/* one open, one fstat: per sample, so nothing more (a store's:
		 * a new fd of its cached copy; read as a stream: pinned while
		 * read, fetched now when neither there nor on its way) */
		if (set->urls)
			fd = source_open_read(set->src, set->urls[idx], &st, &hold, err, errlen);
		else
			fd = set->src ? source_open_path(set->src, what, &st, err, errlen)
				      : ds_open(&set->who, what, &st, err, errlen);
		if (fd < 0)
			return fd;
		if ((uint64_t)st.st_size > IMAGE_FILE_MAX) {
			folder_close(set, fd, hold);
			return errfmt(-EFBIG, err, errlen, "%s: larger than %u MiB", what,
				    IMAGE_FILE_MAX >> 20);
		}
		r = grow(buf, cap, (size_t)st.st_size);
		if (r == 0)
			r = read_at(fd, *buf, (size_t)st.st_size, 0, what, err, errlen);
		folder_close(set, fd, hold);
		if (r < 0)
			return r == -ENOMEM ? errfmt(r, err, errlen, "%s: out of memory", what) : r;
		*len = (size_t)st.st_size;
		*label = e->label;
		return 0;
	}

	if (e->label_state == LABEL_MISSING)
		return errfmt(-EINVAL, err, errlen, "%s: no .cls member (the label)", what);
	if (e->label_state == LABEL_BAD)
		return errfmt(-EINVAL, err, errlen, "%s: .cls member is not a decimal integer", what);
	if (e->size > IMAGE_FILE_MAX)
		return errfmt(-EFBIG, err, errlen, "%s: image larger than %u MiB", what,
			    IMAGE_FILE_MAX >> 20);
	r = grow(buf, cap, (size_t)e->size);
	if (r < 0)
		return errfmt(r, err, errlen, "%s: out of memory", what);
	if (source_ranged(set->src, set->shards[e->shard])) {
		/* a shuffled stream's sample: its image member alone, one ranged
		 * GET straight into the buffer the decoder reads (the label was
		 * read at create) */
		r = source_read_range(set->src, set->shards[e->shard], e->offset, (size_t)e->size, *buf, err,
				      errlen);
		if (r < 0)
			return r;
		*len = (size_t)e->size;
		*label = e->label;
		return 0;
	}
	fd = set->fds[e->shard];
	if (fd < 0) {
		fd = source_open_read(set->src, set->shards[e->shard], NULL, &hold, err, errlen);
		if (fd < 0)
			return fd;
	}
	r = read_at(fd, *buf, (size_t)e->size, e->offset, what, err, errlen);
	if (fd != set->fds[e->shard])
		source_close_read(set->src, fd, hold);
	if (r < 0)
		return r;
	*len = (size_t)e->size;
	*label = e->label;
	return 0;
}

