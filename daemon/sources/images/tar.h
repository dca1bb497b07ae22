/* SPDX-License-Identifier: MIT */
/* tar - index the regular members of a tar file (ustar, GNU, pax) */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define TAR_NAME_MAX 4096

struct tar_entry {
	const char *name;             /* full member path, NUL-terminated */
	uint64_t offset;              /* of the member's data in the file */
	uint64_t size;                /* bytes of data */
};

/*
 * Called for every regular file member, in archive order. Return 0 to go
 * on, or a negative errno (with @err set) to stop the scan with it.
 */
typedef int (*tar_entry_fn)(void *userdata, const struct tar_entry *e, char *err, size_t errlen);

/**
 * tar_scan() - walk the headers of an uncompressed tar file.
 * @fd: the file, read with pread only
 * @path: its name, for messages
 * @size: its size in bytes
 *
 * Reads the 512-byte headers only, skipping every member's data, so indexing
 * costs one small read per member. Understands POSIX ustar (name + prefix),
 * GNU long names ('L'), pax extended headers ('x': path and size), base-256
 * sizes, and V7 headers; directories, links, devices and global pax headers
 * are skipped. The archive ends at the first zero block or at the end of the
 * file on a block boundary.
 * Return: 0, or -EINVAL for a malformed or truncated archive ("a.tar: bad
 * header checksum at offset 1024"), a read error, or @fn's error.
 */
int tar_scan(int fd, const char *path, uint64_t size, tar_entry_fn fn, void *userdata, char *err,
	     size_t errlen);
