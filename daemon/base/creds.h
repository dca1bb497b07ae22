/* SPDX-License-Identifier: MIT */
/* creds - whose permissions a dataset is read with
 *
 * A client's credentials come from its socket (the peer's uid, gid and pid)
 * and its process's supplementary groups at connect time. Every path a spec
 * names is opened through ds_open()/ds_opendir() with the credentials of the
 * client that created the pipeline: the calling thread takes them as its
 * filesystem credentials (setfsuid, setfsgid, and the thread's own group
 * list), opens, and (on any thread but a worker) takes the daemon's back.
 * docs/security.md says why this mechanism and what the daemon needs for it.
 */
#pragma once

#include <dirent.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Linux's NGROUPS_MAX: the most supplementary groups a process may have. */
#define CREDS_MAX_GROUPS 65536

struct creds {
	uid_t uid;
	gid_t gid;
	unsigned ngroups;           /* supplementary groups, gid excluded */
	/* Interned: one immutable copy of each distinct list, kept for the
	 * daemon's life, so that a struct creds copies by assignment. */
	const gid_t *groups;
};

/* The daemon's own credentials. */
void creds_self(struct creds *c);
/* A peer's: @uid and @gid from its socket, the groups of @pid read from
 * /proc/PID/status (only where that process still has @uid; none else). */
void creds_of_peer(struct creds *c, int pid, uid_t uid, gid_t gid);
bool creds_in_group(const struct creds *c, gid_t gid);
/* "alice (uid 1001)", or "uid 1001" when the uid has no name. Names come
 * from a cache (CREDS_NAME_TTL_MS): a slow directory (LDAP) is asked at most
 * once a minute per uid, not at every Status or /metrics scrape. */
const char *creds_user_name(uid_t uid, char *buf, size_t len);
/* The bare name of @uid into @buf, or NULL when it has none (cached). */
const char *creds_user_name_only(uid_t uid, char *buf, size_t len);
/* The name of @gid into @buf, or NULL when it has none (cached). */
const char *creds_group_name(gid_t gid, char *buf, size_t len);
/* The gid of the group @name: 0, -ENOENT (no such group) or -errno.
 * However many members it has (the lookup's buffer grows on ERANGE). */
int creds_group_by_name(const char *name, gid_t *gid);
#define CREDS_NAME_TTL_MS 60000

/* Worker threads keep the last credentials they took (the next sample is
 * most likely the same pipeline's): call once at the thread's start. */
void creds_thread_sticky(void);

/*
 * The dataset roots of the config (NULL-terminated absolute, resolved paths;
 * NULL: datasets anywhere). Set once, before any worker runs; a path must then
 * lie beneath one of them, resolved without leaving it (.., symlinks, /proc
 * magic links).
 */
int ds_set_roots(char *const *roots, char *err, size_t errlen);
void ds_clear_roots(void);

/**
 * ds_open() - open a dataset file as @who, read-only.
 * @st: receives its fstat (may be NULL)
 * @err: on failure, names the path and the user, e.g. "/data/x.bin: Permission
 *       denied (as bob, uid 1002)"
 *
 * Anything but a regular file is refused before it is read (a FIFO would
 * block: the open is non-blocking). Returns the fd, or -errno with @err set.
 */
struct stat;
int ds_open(const struct creds *who, const char *path, struct stat *st, char *err, size_t errlen);
/* The same for a directory listing; NULL with errno and @err set. */
DIR *ds_opendir(const struct creds *who, const char *path, char *err, size_t errlen);
/* Is @path a directory @who can reach? (false with no error else) */
bool ds_is_dir(const struct creds *who, const char *path);
