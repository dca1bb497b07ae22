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
#include <unistd.h>

#include "common.h"
#include "creds.h"

static struct creds self;
static pthread_once_t self_once = PTHREAD_ONCE_INIT;

static __thread bool t_sticky;
static __thread bool t_switched;   /* the thread holds someone else's credentials */
static __thread struct creds t_cur;

static void self_init(void)
{
	gid_t g[CREDS_MAX_GROUPS + 1];
	int n = getgroups(CREDS_MAX_GROUPS + 1, g);

	self.uid = geteuid();
	self.gid = getegid();
	for (int i = 0; i < n && self.ngroups < CREDS_MAX_GROUPS; i++)
		if (g[i] != self.gid)
			self.groups[self.ngroups++] = g[i];
}

void creds_self(struct creds *c)
{
	pthread_once(&self_once, self_init);
	*c = self;
}

void creds_of_peer(struct creds *c, int pid, uid_t uid, gid_t gid)
{
	char path[64], line[4096];
	bool same_uid = false;
	FILE *f;

	memset(c, 0, sizeof(*c));
	c->uid = uid;
	c->gid = gid;
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	if (pid <= 0 || !(f = fopen(path, "re")))
		return;
	while (fgets(line, sizeof(line), f)) {
		unsigned long r, e;
		if (sscanf(line, "Uid:\t%lu\t%lu", &r, &e) == 2) {
			/* the pid may have been reused by another user's process */
			same_uid = e == uid;
		} else if (strncmp(line, "Groups:", 7) == 0 && same_uid) {
			char *p = line + 7, *end;
			for (;;) {
				unsigned long g = strtoul(p, &end, 10);
				if (end == p || c->ngroups == CREDS_MAX_GROUPS)
					break;
				if ((gid_t)g != gid)
					c->groups[c->ngroups++] = (gid_t)g;
				p = end;
			}
		}
	}
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

const char *creds_user_name(uid_t uid, char *buf, size_t len)
{
	struct passwd pw, *res = NULL;
	char tmp[1024];

	if (getpwuid_r(uid, &pw, tmp, sizeof(tmp), &res) == 0 && res)
		snprintf(buf, len, "%s (uid %u)", pw.pw_name, (unsigned)uid);
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
	return a->uid == b->uid && a->gid == b->gid && a->ngroups == b->ngroups &&
	       memcmp(a->groups, b->groups, a->ngroups * sizeof(gid_t)) == 0;
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
