/* SPDX-License-Identifier: MIT */
/* test-proc.h - what the unit tests read of this process in /proc */
#pragma once

#include <assert.h>
#include <dirent.h>

/* Entries of a /proc directory of this process (task: its threads; fd: its
 * open fds, the listing's own included). */
static inline unsigned proc_entries(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	unsigned n = 0;

	assert(d);
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}
