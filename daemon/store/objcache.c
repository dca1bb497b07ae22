/* SPDX-License-Identifier: MIT */
/* objcache - the node's one cache of objects fetched from a store (objcache.h)
 *
 * Each object is two files in the folder: NAME (its bytes) and NAME.id
 * ("SIZE\nIDENTITY\nBOOT CRC32C\n", IDENTITY being "ENDPOINT URL ETAG"),
 * NAME 32 hex digits of a hash of IDENTITY. Lookups compare the whole
 * identity, never only the hash: two objects whose names collide are never
 * mixed up (the second is just not cached). A fetch writes NAME.tmp.PID.N,
 * and renames it to NAME once its length is the HEAD's and its body matched
 * the store's sums, after NAME.id is in place; so a NAME with a valid
 * NAME.id is complete, and anything else is deleted at the next start.
 * Files are the daemon's, 0600.
 *
 * Nothing is fsync'ed (a fetch would wait for the disk): a process that
 * dies leaves its renamed files whole in the page cache, and only a kernel
 * crash or a power loss can leave one of the right length with other
 * bytes; both change the boot id (bootid.h). So NAME.id carries the boot
 * id it was written in and the CRC32C of the bytes fetched: an object of
 * another boot is read whole and checked against it at its first open (off
 * the loop, as a fetch), then stamped with this boot's id, or deleted and
 * fetched again when it does not match.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/bootid.h"
#include "base/log.h"
#include "common.h"
#include "objcache.h"
#include "store.h"
#include "sums.h"

struct objcache_pin {
	struct objcache_pin *next;   /* the cache's list of entries */
	char *id;
	char name[40];
	uint64_t size;
	uint64_t used;               /* the LRU clock at its last use */
	uint32_t crc32c;             /* of its bytes, as fetched */
	unsigned pins;
	bool fetching;               /* its bytes are on their way, or being checked */
	bool other_boot;             /* written in another boot: to be checked */
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t done;         /* a fetch ended */
	char *dir;
	bool ready;                  /* the folder exists (made at the first fetch) */
	uint64_t max, used_bytes, clock, tmp_seq;
	struct objcache_pin *list;
	struct objcache_stats st;
} oc = { .lock = PTHREAD_MUTEX_INITIALIZER, .done = PTHREAD_COND_INITIALIZER };

/* 128 bits of @s as 32 hex digits: two FNV-1a runs, mixed. */
static void name_of(const char *s, char out[40])
{
	uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;

	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		a = (a ^ *p) * 0x100000001b3ull;
		b = (b ^ *p) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
	}
	snprintf(out, 40, "%016" PRIx64 "%016" PRIx64, mix64(a), mix64(b ^ a));
}

static void path_of(char *buf, size_t len, const char *name, const char *suffix)
{
	snprintf(buf, len, "%s/%s%s", oc.dir, name, suffix);
}

static void entry_free(struct objcache_pin *e)
{
	free(e->id);
	free(e);
}

static void unlink_entry(const struct objcache_pin *e)
{
	char p[4200];

	path_of(p, sizeof(p), e->name, "");
	unlink(p);
	path_of(p, sizeof(p), e->name, ".id");
	unlink(p);
}

/* Evict unpinned objects, least recently used first, until @need more
 * bytes fit. Under the lock. */
static bool make_room(uint64_t need)
{
	while (oc.used_bytes + need > oc.max) {
		struct objcache_pin **victim = NULL, *e;

		for (struct objcache_pin **pp = &oc.list; *pp; pp = &(*pp)->next)
			if (!(*pp)->pins && !(*pp)->fetching && (!victim || (*pp)->used < (*victim)->used))
				victim = pp;
		if (!victim)
			return false;
		e = *victim;
		*victim = e->next;
		unlink_entry(e);
		oc.used_bytes -= e->size;
		oc.st.evictions++;
		entry_free(e);
	}
	return true;
}

/* The id file's last line at @p ("\nBOOT CRC32C\n") into @e: false when
 * it has none. BOOT is "-" when the boot id could not be read. */
static bool parse_stamp(struct objcache_pin *e, const char *p)
{
	const char *now = boot_id();
	char boot[40], *end;
	size_t blen;
	unsigned long crc;

	if (*p++ != '\n')
		return false;
	blen = strcspn(p, " \n");
	if (p[blen] != ' ' || blen >= sizeof(boot) || (blen != 36 && strncmp(p, "-", blen)))
		return false;
	memcpy(boot, p, blen);
	boot[blen] = '\0';
	p += blen + 1;
	if (strspn(p, "0123456789abcdef") != 8 || p[8] != '\n' || p[9])
		return false;
	crc = strtoul(p, &end, 16);
	e->crc32c = (uint32_t)crc;
	e->other_boot = !now || strcmp(boot, now);
	return true;
}

/* One NAME.id at start: its entry, or the pair deleted. */
static void index_one(const char *name)
{
	char p[4200], text[8192];
	struct stat st;
	struct objcache_pin *e;
	unsigned long long size;
	ssize_t n;
	char *nl;
	int fd;

	path_of(p, sizeof(p), name, ".id");
	fd = open(p, O_RDONLY | O_CLOEXEC);
	n = fd < 0 ? -1 : read(fd, text, sizeof(text) - 1);
	if (fd >= 0)
		close(fd);
	if (n > 0)
		text[n] = '\0';
	path_of(p, sizeof(p), name, "");
	if (n <= 0 || sscanf(text, "%llu", &size) != 1 || !(nl = strchr(text, '\n')) || stat(p, &st) < 0 ||
	    (uint64_t)st.st_size != size || !(e = calloc(1, sizeof(*e)))) {
		unlink(p);
		path_of(p, sizeof(p), name, ".id");
		unlink(p);
		return;
	}
	e->id = strndup(nl + 1, strcspn(nl + 1, "\n"));
	snprintf(e->name, sizeof(e->name), "%s", name);
	e->size = size;
	if (!e->id || !parse_stamp(e, nl + 1 + strlen(e->id))) {
		/* no sum to check it by (an id of an older daemon): fetched again */
		free(e->id);
		free(e);
		path_of(p, sizeof(p), name, "");
		unlink(p);
		path_of(p, sizeof(p), name, ".id");
		unlink(p);
		return;
	}
	e->used = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
	e->next = oc.list;
	oc.list = e;
	oc.used_bytes += size;
}

int objcache_init(const char *dir, uint64_t max_bytes, char *err, size_t errlen)
{
	DIR *d;
	struct dirent *de;
	uint64_t newest = 0;

	if (access(dir, F_OK) < 0 && errno == ENOENT) {
		/* made at the first fetch: a daemon that reads no store makes none */
		pthread_mutex_lock(&oc.lock);
		free(oc.dir);
		oc.dir = strdup(dir);
		oc.max = max_bytes;
		pthread_mutex_unlock(&oc.lock);
		return oc.dir ? 0 : errfmt(-ENOMEM, err, errlen, "object cache: out of memory");
	}
	d = opendir(dir);
	if (!d)
		return errfmt(-errno, err, errlen, "%s: cannot open the object cache: %s", dir, strerror(errno));
	pthread_mutex_lock(&oc.lock);
	free(oc.dir);
	oc.dir = strdup(dir);
	oc.max = max_bytes;
	oc.ready = true;
	while ((de = readdir(d))) {
		size_t len = strlen(de->d_name);

		if (de->d_name[0] == '.')
			continue;
		if (strstr(de->d_name, ".tmp.")) {
			unlinkat(dirfd(d), de->d_name, 0); /* a fetch that a crash cut */
		} else if (len == 35 && !strcmp(de->d_name + 32, ".id")) {
			char name[40];

			snprintf(name, sizeof(name), "%.32s", de->d_name);
			index_one(name);
		}
	}
	rewinddir(d);
	/* a file without its id: deleted */
	while ((de = readdir(d))) {
		bool known = false;

		if (de->d_name[0] == '.' || strlen(de->d_name) != 32)
			continue;
		for (struct objcache_pin *e = oc.list; e && !known; e = e->next)
			known = !strcmp(e->name, de->d_name);
		if (!known)
			unlinkat(dirfd(d), de->d_name, 0);
	}
	closedir(d);
	for (struct objcache_pin *e = oc.list; e; e = e->next)
		if (e->used > newest)
			newest = e->used;
	oc.clock = newest + 1;
	make_room(0);
	pthread_mutex_unlock(&oc.lock);
	return oc.dir ? 0 : errfmt(-ENOMEM, err, errlen, "object cache: out of memory");
}

uint64_t objcache_max_bytes(void)
{
	uint64_t m;

	pthread_mutex_lock(&oc.lock);
	m = oc.dir ? oc.max : 0;
	pthread_mutex_unlock(&oc.lock);
	return m;
}

static int open_ro(const char *name, int *fd, const char *url, char *err, size_t errlen)
{
	char p[4200];

	path_of(p, sizeof(p), name, "");
	*fd = open(p, O_RDONLY | O_CLOEXEC);
	if (*fd < 0)
		return errfmt(-errno, err, errlen, "%s: cannot open its cached copy %s: %s", url, p,
			    strerror(errno));
	return 0;
}

/* Write the id file of @e, stamped with this boot's id, through a
 * temporary name. */
static int write_id(const struct objcache_pin *e, uint64_t seq)
{
	const char *boot = boot_id();
	char p[4200], tmp[4200], *text;
	int fd, r = 0, n;

	if (asprintf(&text, "%" PRIu64 "\n%s\n%.36s %08" PRIx32 "\n", e->size, e->id, boot ? boot : "-",
		     e->crc32c) < 0)
		return -ENOMEM;
	errno = 0;
	snprintf(tmp, sizeof(tmp), "%s/%s.id.tmp.%d.%" PRIu64, oc.dir, e->name, (int)getpid(), seq);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	n = (int)strlen(text);
	if (fd < 0 || write(fd, text, (size_t)n) != n)
		r = errno ? -errno : -EIO;
	if (fd >= 0)
		close(fd);
	free(text);
	path_of(p, sizeof(p), e->name, ".id");
	if (r == 0 && rename(tmp, p) < 0)
		r = -errno;
	if (r < 0)
		unlink(tmp);
	return r;
}

/* Fetch @url into @e's file; 0 or the error. Not under the lock. */
static int fetch(struct store *st, const char *url, const struct store_object *obj, struct objcache_pin *e,
		 uint64_t seq, char *err, size_t errlen)
{
	char tmp[4200], p[4200];
	uint64_t got = 0;
	int fd, r;

	snprintf(tmp, sizeof(tmp), "%s/%s.tmp.%d.%" PRIu64, oc.dir, e->name, (int)getpid(), seq);
	fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return errfmt(-errno, err, errlen, "%s: cannot write into the object cache %s: %s", url, tmp,
			    strerror(errno));
	r = store_get_fd(st, url, obj->etag, fd, &got, &e->crc32c, err, errlen);
	if (r == 0 && got != obj->size)
		r = errfmt(-EIO, err, errlen, "%s: the body has %" PRIu64 " bytes, its HEAD said %" PRIu64, url,
			   got, obj->size);
	if (r == 0 && ftruncate(fd, (off_t)got) < 0)
		r = errfmt(-errno, err, errlen, "%s: %s: %s", url, tmp, strerror(errno));
	close(fd);
	if (r == 0 && (r = write_id(e, seq)) < 0)
		errfmt(r, err, errlen, "%s: cannot write its id into the object cache: %s", url, strerror(-r));
	path_of(p, sizeof(p), e->name, "");
	if (r == 0 && rename(tmp, p) < 0)
		r = errfmt(-errno, err, errlen, "%s: cannot rename %s: %s", url, tmp, strerror(errno));
	if (r < 0)
		unlink(tmp);
	pthread_mutex_lock(&oc.lock);
	oc.st.bytes_fetched += got;
	pthread_mutex_unlock(&oc.lock);
	return r;
}

/* Under the lock: the entry of @id, or NULL; *@clash when another object
 * has its name. */
static struct objcache_pin *find(const char *id, const char *name, bool *clash)
{
	*clash = false;
	for (struct objcache_pin *e = oc.list; e; e = e->next) {
		if (!strcmp(e->id, id))
			return e;
		if (!strcmp(e->name, name))
			*clash = true;
	}
	return NULL;
}

static void drop_entry(struct objcache_pin *gone)
{
	for (struct objcache_pin **pp = &oc.list; *pp; pp = &(*pp)->next)
		if (*pp == gone) {
			*pp = gone->next;
			break;
		}
	oc.used_bytes -= gone->size;
	entry_free(gone);
}

/* Under the lock, which it lets go of while it reads: whether @e, written
 * in another boot, still has the bytes it was fetched with (its CRC32C).
 * Stamped with this boot's id when it has; counted either way. Fetching
 * while it reads: no eviction takes it, and other opens wait. */
static bool recheck(struct objcache_pin *e, const char *url)
{
	char buf[65536];
	struct sum crc;
	uint64_t at = 0, seq = ++oc.tmp_seq;
	char p[4200];
	bool same;
	int fd;

	e->fetching = true;
	pthread_mutex_unlock(&oc.lock);
	sum_init(&crc, SUM_CRC32C);
	path_of(p, sizeof(p), e->name, "");
	fd = open(p, O_RDONLY | O_CLOEXEC);
	while (fd >= 0 && at < e->size) {
		ssize_t n = pread(fd, buf, sizeof(buf), (off_t)at);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		sum_update(&crc, buf, (size_t)n);
		at += (uint64_t)n;
	}
	if (fd >= 0)
		close(fd);
	same = at == e->size && sum_crc32_value(&crc) == e->crc32c;
	if (same)
		(void)write_id(e, seq); /* when it cannot: checked again at the next start */
	else
		log_msg(LOG_WARNING, "object cache: %s: its cached copy %s, of another boot, does not "
			"hold the bytes fetched (a crash of the machine tore it): fetched again", url, p);
	pthread_mutex_lock(&oc.lock);
	e->fetching = false;
	e->other_boot = false;
	pthread_cond_broadcast(&oc.done);
	oc.st.rechecked++;
	oc.st.recheck_failures += !same;
	return same;
}

int objcache_open(struct store *st, const char *url, const struct store_object *obj, int *fd,
		  struct objcache_pin **pin, char *err, size_t errlen)
{
	struct objcache_pin *e;
	char name[40], *id;
	bool clash;
	uint64_t seq;
	int r;

	if (asprintf(&id, "%s %s %s", store_endpoint(st), url, obj->etag) < 0)
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory", url);
	name_of(id, name);
	pthread_mutex_lock(&oc.lock);
	if (!oc.dir) {
		pthread_mutex_unlock(&oc.lock);
		free(id);
		return errfmt(-ENOTSUP, err, errlen, "%s: the daemon has no object cache (cache_dir)", url);
	}
	if (!oc.ready) {
		char parent[4200];

		snprintf(parent, sizeof(parent), "%s", oc.dir);
		*strrchr(parent, '/') = '\0';
		if ((mkdir(parent, 0700) < 0 && errno != EEXIST) || (mkdir(oc.dir, 0700) < 0 && errno != EEXIST)) {
			r = errfmt(-errno, err, errlen, "%s: cannot make the object cache %s: %s", url, oc.dir,
				   strerror(errno));
			pthread_mutex_unlock(&oc.lock);
			free(id);
			return r;
		}
		oc.ready = true;
	}
	for (;;) {
		e = find(id, name, &clash);
		if (!e || !e->fetching)
			break;
		pthread_cond_wait(&oc.done, &oc.lock);
	}
	if (e && e->other_boot && !recheck(e, url)) {
		/* torn by a crash of the machine: fetched again */
		unlink_entry(e);
		drop_entry(e);
		e = NULL;
	}
	if (e) {
		e->pins++;
		e->used = ++oc.clock;
		oc.st.hits++;
		pthread_mutex_unlock(&oc.lock);
		free(id);
		r = open_ro(e->name, fd, url, err, errlen);
		if (r < 0) {
			objcache_unpin(e);
			return r;
		}
		*pin = e;
		return 0;
	}
	r = 0;
	if (clash)
		r = errfmt(-EEXIST, err, errlen, "%s: its name in the object cache is another object's", url);
	else if (obj->size > oc.max)
		r = errfmt(-EFBIG, err, errlen, "%s: %" PRIu64 " bytes, more than the object cache's "
			   "cache_bytes %" PRIu64, url, obj->size, oc.max);
	else if (!make_room(obj->size))
		r = errfmt(-ENOSPC, err, errlen, "%s: no room for its %" PRIu64 " bytes in the object cache: "
			   "%" PRIu64 " of cache_bytes %" PRIu64 " are held by open pipelines", url, obj->size,
			   oc.used_bytes, oc.max);
	if (r < 0 || !(e = calloc(1, sizeof(*e)))) {
		pthread_mutex_unlock(&oc.lock);
		free(id);
		return r < 0 ? r : errfmt(-ENOMEM, err, errlen, "%s: out of memory", url);
	}
	e->id = id;
	memcpy(e->name, name, sizeof(name));
	e->size = obj->size;
	e->used = ++oc.clock;
	e->pins = 1;
	e->fetching = true;
	e->next = oc.list;
	oc.list = e;
	oc.used_bytes += e->size;
	oc.st.misses++;
	seq = ++oc.tmp_seq;
	pthread_mutex_unlock(&oc.lock);

	r = fetch(st, url, obj, e, seq, err, errlen);
	if (r == 0)
		r = open_ro(e->name, fd, url, err, errlen);
	pthread_mutex_lock(&oc.lock);
	e->fetching = false;
	if (r < 0) {
		unlink_entry(e);
		drop_entry(e);
	}
	pthread_cond_broadcast(&oc.done);
	pthread_mutex_unlock(&oc.lock);
	if (r == 0)
		*pin = e;
	return r;
}

void objcache_unpin(struct objcache_pin *pin)
{
	if (!pin)
		return;
	pthread_mutex_lock(&oc.lock);
	/* the last pin may make the room an open waits for */
	if (--pin->pins == 0)
		pthread_cond_broadcast(&oc.done);
	pthread_mutex_unlock(&oc.lock);
}

bool objcache_wait_room(uint64_t size, uint64_t deadline_ns)
{
	struct timespec ts = { .tv_sec = (time_t)(deadline_ns / 1000000000ull),
			       .tv_nsec = (long)(deadline_ns % 1000000000ull) };
	bool room = false;

	pthread_mutex_lock(&oc.lock);
	for (;;) {
		uint64_t held = 0;

		for (struct objcache_pin *e = oc.list; e; e = e->next)
			held += e->pins || e->fetching ? e->size : 0;
		room = held + size <= oc.max;
		if (room || pthread_cond_timedwait(&oc.done, &oc.lock, &ts) == ETIMEDOUT)
			break;
	}
	pthread_mutex_unlock(&oc.lock);
	return room;
}

void objcache_get_stats(struct objcache_stats *out)
{
	pthread_mutex_lock(&oc.lock);
	*out = oc.st;
	out->max_bytes = oc.dir ? oc.max : 0;
	out->bytes_used = oc.used_bytes;
	out->checksum_mismatches = store_checksum_mismatches();
	out->objects = out->pinned = out->fetching = out->fetching_bytes = 0;
	for (struct objcache_pin *e = oc.list; e; e = e->next) {
		out->objects++;
		out->pinned += e->pins > 0;
		out->fetching += e->fetching;
		out->fetching_bytes += e->fetching ? e->size : 0;
	}
	pthread_mutex_unlock(&oc.lock);
}
