/* SPDX-License-Identifier: MIT */
/* fuzz - what the libFuzzer targets share: input as a C string or a file */
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Every target is a plain libFuzzer entry point; -Wmissing-prototypes wants these. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The input as a NUL-terminated string (a parser of text sees no length),
 * or NULL when out of memory. */
static inline char *fuzz_cstr(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);

	if (s) {
		memcpy(s, data, size);
		s[size] = '\0';
	}
	return s;
}

/* A memfd holding the input, or -1. */
static inline int fuzz_memfd(const uint8_t *data, size_t size)
{
	int fd = memfd_create("fuzz-input", MFD_CLOEXEC);
	size_t done = 0;

	if (fd < 0)
		return -1;
	while (done < size) {
		ssize_t n = write(fd, data + done, size - done);
		if (n <= 0) {
			close(fd);
			return -1;
		}
		done += (size_t)n;
	}
	return fd;
}

/*
 * A private directory for the process (under /dev/shm when there is one, so
 * rewriting a file per input costs no disk), made once; removed by nobody:
 * the targets leave one small file in it.
 */
static inline const char *fuzz_dir(void)
{
	static char dir[64];

	if (!dir[0]) {
		snprintf(dir, sizeof(dir), "%s/loaderd-fuzz-XXXXXX",
			 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
		if (!mkdtemp(dir)) {
			perror("fuzz: mkdtemp");
			abort();
		}
	}
	return dir;
}

/* Replace the file @name of fuzz_dir() by the input; its path in @path. */
static inline void fuzz_file(const char *name, const uint8_t *data, size_t size, char *path,
			     size_t pathlen)
{
	FILE *f;

	snprintf(path, pathlen, "%s/%s", fuzz_dir(), name);
	f = fopen(path, "wb");
	if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
		perror(path);
		abort();
	}
}
