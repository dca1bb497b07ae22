/* SPDX-License-Identifier: MIT */
/* creds - whose permissions a dataset is read with (see creds.h)
 *
 * Linux keeps filesystem credentials per thread: setfsuid(2), setfsgid(2) and
 * the raw setgroups(2) system call change only the calling thread (glibc's
 * setgroups() would change every thread of the process, so it is not used).
 * The kernel then checks every path walk and open against them, including the
 * search permission of every directory above the file, and drops the
 * daemon's CAP_DAC_* while the fsuid is not 0. That needs CAP_SETUID and
 * CAP_SETGID (root, or the systemd unit's AmbientCapabilities=); without them
 * the switch fails and the open is refused (fail closed), except for the
 * daemon's own user, which needs no switch.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "creds.h"

static struct creds self;
static pthread_once_t self_once = PTHREAD_ONCE_INIT;

static __thread bool t_sticky;
static __thread bool t_switched;   /* the thread holds someone else's credentials */
static __thread struct creds t_cur;

/* --- supplementary group lists ----------------------------------------- */

struct gset {
	struct gset *next;
	unsigned n;
	gid_t g[];
};

static struct gset *gsets;
static pthread_mutex_t gsets_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * The interned copy of @g[0..@n): one per distinct list (a user's processes
 * share one), kept for the daemon's life. Only root can give a process an
 * arbitrary list, so there are few. NULL for none, and when out of memory:
 * then the caller has no groups, which only ever takes rights away.
 */
static const gid_t *groups_intern(const gid_t *g, unsigned n)
{
	struct gset *s;

	if (!n)
		return NULL;
	pthread_mutex_lock(&gsets_lock);
	for (s = gsets; s; s = s->next)
		if (s->n == n && memcmp(s->g, g, n * sizeof(gid_t)) == 0)
			break;
	if (!s && (s = malloc(sizeof(*s) + n * sizeof(gid_t)))) {
		s->n = n;
		memcpy(s->g, g, n * sizeof(gid_t));
		s->next = gsets;
		gsets = s;
	}
	pthread_mutex_unlock(&gsets_lock);
	return s ? s->g : NULL;
}

/* @c's groups: @g[0..@n) without its gid, interned. */
static void groups_set(struct creds *c, const gid_t *g, size_t n)
{
	gid_t *own = malloc((n ? n : 1) * sizeof(gid_t));
	unsigned k = 0;

	c->ngroups = 0;
	c->groups = NULL;
	if (!own)
		return;
	for (size_t i = 0; i < n && k < CREDS_MAX_GROUPS; i++)
		if (g[i] != c->gid)
			own[k++] = g[i];
	if ((c->groups = groups_intern(own, k)))
		c->ngroups = k;
	free(own);
}

static void self_init(void)
{
	int n = getgroups(0, NULL);
	gid_t *g = n > 0 ? malloc((size_t)n * sizeof(gid_t)) : NULL;

	self.uid = geteuid();
	self.gid = getegid();
	if (g && (n = getgroups(n, g)) > 0)
		groups_set(&self, g, (size_t)n);
	free(g);
}

void creds_self(struct creds *c)
{
	pthread_once(&self_once, self_init);
	*c = self;
}

/* The gids of a "Groups:" line of /proc/PID/status into @c (all of them:
 * up to 65536, a line of any length). */
static void groups_parse(struct creds *c, const char *p)
{
	gid_t *g = NULL;
	size_t n = 0, cap = 0;
	char *end;

	for (;;) {
		unsigned long v = strtoul(p, &end, 10);
		if (end == p || n == CREDS_MAX_GROUPS)
			break;
		if (n == cap) {
			gid_t *ng = realloc(g, (cap = cap ? cap * 2 : 64) * sizeof(gid_t));
			if (!ng) {
				n = 0; /* none rather than some: fewer rights, never more */
				break;
			}
			g = ng;
		}
		g[n++] = (gid_t)v;
		p = end;
	}
	groups_set(c, g, n);
	free(g);
}

void creds_of_peer(struct creds *c, int pid, uid_t uid, gid_t gid)
{
	char path[64], *line = NULL;
	size_t cap = 0;
	bool same_uid = false;
	FILE *f;

	memset(c, 0, sizeof(*c));
	c->uid = uid;
	c->gid = gid;
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	if (pid <= 0 || !(f = fopen(path, "re")))
		return;
	/* getline: the Groups line of a process in many groups passes 4 KiB */
	while (getline(&line, &cap, f) > 0) {
		unsigned long r, e;
		if (sscanf(line, "Uid:\t%lu\t%lu", &r, &e) == 2)
			/* the pid may have been reused by another user's process */
			same_uid = e == uid;
		else if (strncmp(line, "Groups:", 7) == 0 && same_uid)
			groups_parse(c, line + 7);
	}
	free(line);
	fclose(f);
}

bool creds_in_group(const struct creds *c, gid_t gid)
{
	if (c->gid == gid)
		return true;
	for (unsigned i = 0; i < c->ngroups; i++)
		if (c->groups[i] == gid)
			return true;
	return false;
}

/* --- names of users and groups ----------------------------------------- */

#define LOOKUP_BUF_MAX (64u << 20) /* a group of a million members fits */

enum lookup { BY_UID, BY_GID, BY_GROUP_NAME };

/*
 * One passwd or group lookup: 1 found (its name into @out, a group's gid into
 * @gid), 0 none, or -errno. The buffer grows on ERANGE: a group of thousands
 * of members (LDAP) needs more than any fixed size.
 */
static int lookup(enum lookup by, uint32_t id, const char *name, char *out, size_t len, gid_t *gid)
{
	for (size_t size = 4096;; size *= 2) {
		struct passwd pw, *pr = NULL;
		struct group gr, *grr = NULL;
		char *buf = malloc(size);
		int e;

		if (!buf)
			return -ENOMEM;
		if (by == BY_UID)
			e = getpwuid_r((uid_t)id, &pw, buf, size, &pr);
		else if (by == BY_GID)
			e = getgrgid_r((gid_t)id, &gr, buf, size, &grr);
		else
			e = getgrnam_r(name, &gr, buf, size, &grr);
		if (e == ERANGE && size < LOOKUP_BUF_MAX) {
			free(buf);
			continue;
		}
		if (e == 0 && (pr || grr)) {
			if (out)
				snprintf(out, len, "%s", pr ? pr->pw_name : grr->gr_name);
			if (gid && grr)
				*gid = grr->gr_gid;
		}
		free(buf);
		if (e == ENOENT || e == ESRCH)   /* "not found", from some NSS modules */
			return 0;
		return e ? -e : (pr || grr) ? 1 : 0;
	}
}

#define NAME_CACHE 128

static struct name_ent {
	bool used, group, found;
	uint32_t id;
	uint64_t at_ms;
	char name[256];
} names[NAME_CACHE];
static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The name of a uid or gid, from the cache while it is fresh, else looked up
 * (outside the lock) and kept, found or not; NULL when it has none. */
static const char *cached_name(bool group, uint32_t id, char *buf, size_t len)
{
	struct name_ent *e, *oldest = &names[0];
	uint64_t now = now_ms();
	char name[sizeof(names[0].name)];
	int r;

	pthread_mutex_lock(&names_lock);
	for (e = names; e < names + NAME_CACHE; e++) {
		if (e->used && e->group == group && e->id == id && now - e->at_ms < CREDS_NAME_TTL_MS) {
			bool found = e->found;
			if (found)
				snprintf(buf, len, "%s", e->name);
			pthread_mutex_unlock(&names_lock);
			return found ? buf : NULL;
		}
	}
	pthread_mutex_unlock(&names_lock);
	r = lookup(group ? BY_GID : BY_UID, id, NULL, name, sizeof(name), NULL);
	pthread_mutex_lock(&names_lock);
	for (e = names; e < names + NAME_CACHE; e++) {
		if (!e->used || (e->group == group && e->id == id)) {
			oldest = e;
			break;
		}
		if (e->at_ms < oldest->at_ms)
			oldest = e;
	}
	/* an error (not "none") is not kept: the next one asks again */
	if (r >= 0)
		*oldest = (struct name_ent){ .used = true, .group = group, .found = r == 1, .id = id,
		                             .at_ms = now };
	if (r == 1)
		snprintf(oldest->name, sizeof(oldest->name), "%s", name);
	pthread_mutex_unlock(&names_lock);
	if (r != 1)
		return NULL;
	snprintf(buf, len, "%s", name);
	return buf;
}

const char *creds_user_name_only(uid_t uid, char *buf, size_t len)
{
	return cached_name(false, uid, buf, len);
}

const char *creds_group_name(gid_t gid, char *buf, size_t len)
{
	return cached_name(true, gid, buf, len);
}

int creds_group_by_name(const char *name, gid_t *gid)
{
	int r = lookup(BY_GROUP_NAME, 0, name, NULL, 0, gid);

	return r < 0 ? r : r ? 0 : -ENOENT;
}

const char *creds_user_name(uid_t uid, char *buf, size_t len)
{
	char name[256];

	if (creds_user_name_only(uid, name, sizeof(name)))
		snprintf(buf, len, "%s (uid %u)", name, (unsigned)uid);
	else
		snprintf(buf, len, "uid %u", (unsigned)uid);
	return buf;
}

void creds_thread_sticky(void)
{
	t_sticky = true;
}

/* The daemon's own user needs no switch (its group list aside: the same uid
 * could read whatever the daemon can, through the daemon's memory anyway). */
static bool is_self(const struct creds *c)
{
	return c->uid == self.uid && c->gid == self.gid;
}

static bool same(const struct creds *a, const struct creds *b)
{
	/* interned lists: the same groups are the same pointer */
	return a->uid == b->uid && a->gid == b->gid && a->ngroups == b->ngroups &&
	       a->groups == b->groups;
}

static void restore(void)
{
	if (!t_switched)
		return;
	/* fsuid first: it gives the CAP_DAC_* back before the rest */
	syscall(SYS_setfsuid, self.uid);
	syscall(SYS_setfsgid, self.gid);
	syscall(SYS_setgroups, (size_t)self.ngroups, self.groups);
	t_switched = false;
}

static int take(const struct creds *c)
{
	pthread_once(&self_once, self_init);
	if (is_self(c)) {
		restore();
		return 0;
	}
	if (t_switched && same(&t_cur, c))
		return 0;
	restore();
	t_switched = true;   /* whatever part of it succeeds is undone by restore() */
	if (syscall(SYS_setgroups, (size_t)c->ngroups, c->groups) < 0)
		goto fail;
	syscall(SYS_setfsgid, c->gid);
	if ((gid_t)syscall(SYS_setfsgid, (gid_t)-1) != c->gid)
		goto fail;
	syscall(SYS_setfsuid, c->uid);
	if ((uid_t)syscall(SYS_setfsuid, (uid_t)-1) != c->uid)
		goto fail;
	t_cur = *c;
	return 0;
fail:
	restore();
	return -EPERM;
}

/* --- dataset roots ------------------------------------------------------ */

struct root {
	char *path;
	size_t len;
	int fd;
};

static struct root *roots;
static size_t nroots;

void ds_clear_roots(void)
{
	for (size_t i = 0; i < nroots; i++) {
		free(roots[i].path);
		close(roots[i].fd);
	}
	free(roots);
	roots = NULL;
	nroots = 0;
}

int ds_set_roots(char *const *paths, char *err, size_t errlen)
{
	size_t n = 0;

	ds_clear_roots();
	while (paths && paths[n])
		n++;
	if (!n)
		return 0;
	if (!(roots = calloc(n, sizeof(*roots))))
		return errfmt(-ENOMEM, err, errlen, "dataset_roots: out of memory");
	for (size_t i = 0; i < n; i++) {
		int fd = open(paths[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
		int r;

		if (fd < 0) {
			int e = errno;
			r = errfmt(-e, err, errlen, "dataset_roots: %s: %s", paths[i], strerror(e));
			ds_clear_roots();
			return r;
		}
		roots[nroots].path = strdup(paths[i]);
		if (!roots[nroots].path) {
			close(fd);
			ds_clear_roots();
			return errfmt(-ENOMEM, err, errlen, "dataset_roots: out of memory");
		}
		roots[nroots].len = strlen(paths[i]);
		while (roots[nroots].len > 1 && paths[i][roots[nroots].len - 1] == '/')
			roots[nroots].len--;
		roots[nroots++].fd = fd;
	}
	return 0;
}

/* "/data, /scratch" */
static void roots_list(char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < nroots && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", roots[i].path);
}

static int open_beneath(const char *path, int flags, const struct root **in)
{
	struct open_how how = { .flags = (uint64_t)flags, .resolve = RESOLVE_NO_MAGICLINKS };
	int dirfd = AT_FDCWD;
	const char *rel = path;
	long fd;

	*in = NULL;
	if (nroots) {
		for (size_t i = 0; i < nroots && !*in; i++) {
			const struct root *r = &roots[i];
			if (r->len == 1 && path[0] == '/')
				*in = r, rel = path + 1;
			else if (strncmp(path, r->path, r->len) == 0 && (path[r->len] == '/' || !path[r->len]))
				*in = r, rel = path + r->len;
		}
		if (!*in)
			return -EACCES;
		while (*rel == '/')
			rel++;
		if (!*rel)
			rel = ".";
		dirfd = (*in)->fd;
		how.resolve |= RESOLVE_BENEATH;
	}
	fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
	if (fd < 0 && errno == ENOSYS && !nroots)
		fd = open(path, flags);
	return fd < 0 ? -errno : (int)fd;
}

static int open_as(const struct creds *who, const char *path, int flags, struct stat *stp,
                   char *err, size_t errlen)
{
	const struct root *in = NULL;
	char name[128], list[1024];
	struct stat stbuf, *st = stp ? stp : &stbuf;
	int fd, r;

	if ((r = take(who)) < 0)
		return errfmt(r, err, errlen, "%s: the daemon (uid %u) cannot read files as %s: it needs "
		              "CAP_SETUID and CAP_SETGID (docs/security.md)", path, (unsigned)geteuid(),
		              creds_user_name(who->uid, name, sizeof(name)));
	/* O_NONBLOCK: a FIFO must not block the open; O_NOCTTY: nor a tty adopt
	 * us. It stays on: it means nothing to reads of a regular file. */
	fd = open_beneath(path, flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, &in);
	r = fd;
	if (fd >= 0 && fstat(fd, st) < 0)
		r = -errno;
	if (!t_sticky)
		restore();
	if (r < 0) {
		if (fd >= 0)
			close(fd);
		if (nroots && !in) {
			roots_list(list, sizeof(list));
			return errfmt(r, err, errlen, "%s: outside this daemon's dataset_roots (%s)",
			              path, list);
		}
		if (r == -EXDEV)
			return errfmt(r, err, errlen, "%s: leaves the dataset root %s (through .., a "
			              "symlink or a /proc link)", path, in ? in->path : "");
		if (r == -ELOOP)
			return errfmt(r, err, errlen, "%s: a symlink loop or a /proc magic link (refused)",
			              path);
		if (r == -EACCES || r == -EPERM)
			return errfmt(r, err, errlen, "%s: %s (as %s)", path, strerror(-r),
			              creds_user_name(who->uid, name, sizeof(name)));
		return errfmt(r, err, errlen, "%s: %s", path, strerror(-r));
	}
	/* O_DIRECTORY: the kernel saw to it; else a regular file only */
	if (!(flags & O_DIRECTORY) && !S_ISREG(st->st_mode)) {
		close(fd);
		return errfmt(-EINVAL, err, errlen, "%s: not a regular file (a %s)", path,
		              S_ISDIR(st->st_mode) ? "directory" : S_ISFIFO(st->st_mode) ? "FIFO" :
		              S_ISSOCK(st->st_mode) ? "socket" :
		              S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode) ? "device" : "special file");
	}
	return fd;
}

int ds_open(const struct creds *who, const char *path, struct stat *st, char *err, size_t errlen)
{
	return open_as(who, path, O_RDONLY, st, err, errlen);
}

DIR *ds_opendir(const struct creds *who, const char *path, char *err, size_t errlen)
{
	int fd = open_as(who, path, O_RDONLY | O_DIRECTORY, NULL, err, errlen);
	DIR *d;

	if (fd < 0) {
		errno = -fd;
		return NULL;
	}
	if (!(d = fdopendir(fd))) {
		int e = errno;
		close(fd);
		errfmt(-e, err, errlen, "%s: %s", path, strerror(e));
		errno = e;
	}
	return d;
}

bool ds_is_dir(const struct creds *who, const char *path)
{
	char err[256];
	int fd = open_as(who, path, O_RDONLY | O_DIRECTORY, NULL, err, sizeof(err));

	if (fd < 0)
		return false;
	close(fd);
	return true;
}
