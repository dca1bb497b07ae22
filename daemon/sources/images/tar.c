/* SPDX-License-Identifier: MIT */
/* tar - index the regular members of a tar file (ustar, GNU, pax) */

/*
 * A minimal tar reader for WebDataset shards. libarchive would do, but we
 * only ever need "where is each member's data", which is a walk over 512-byte
 * headers; doing it here keeps the daemon's dependencies small and lets the
 * shard be read with pread at work time, never through a stream.
 *
 * A header block holds (offsets in bytes): name[100]@0, size[12]@124,
 * chksum[8]@148, typeflag@156, magic[6]@257, version[2]@263, prefix[155]@345.
 * POSIX ustar (magic "ustar\0") joins prefix "/" name; GNU (magic "ustar  ")
 * has no prefix and puts a name longer than 100 bytes in a preceding 'L'
 * member; pax puts it (and a size beyond 8 GiB) in a preceding 'x' member of
 * "LEN key=value\n" records. Numbers are octal, or base-256 when the first
 * byte has its high bit set (GNU, for large sizes). The data follows its
 * header, padded to a multiple of 512 bytes.
 *
 * Everything is untrusted: every length is checked against the file size and
 * capped (names at TAR_NAME_MAX, pax headers at 1 MiB).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "tar.h"

#define BLOCK 512
#define PAX_MAX (1u << 20)
#define READ_CHUNK (64u << 10)

struct reader {
	int fd;
	const char *path;
	uint64_t size;
	unsigned char *buf;           /* READ_CHUNK bytes of the file at buf_off */
	uint64_t buf_off;
	size_t buf_len;
};

/* Copy @len bytes at @off (within the file) to @dst, through the buffer. */
static int rd_read(struct reader *rd, uint64_t off, void *dst, size_t len, char *err, size_t errlen)
{
	unsigned char *out = dst;

	while (len) {
		if (off >= rd->buf_off && off < rd->buf_off + rd->buf_len) {
			size_t n = (size_t)(rd->buf_off + rd->buf_len - off);

			if (n > len)
				n = len;
			memcpy(out, rd->buf + (off - rd->buf_off), n);
			out += n;
			off += n;
			len -= n;
			continue;
		}
		rd->buf_off = off - off % BLOCK;
		rd->buf_len = 0;
		while (rd->buf_len < READ_CHUNK && rd->buf_off + rd->buf_len < rd->size) {
			ssize_t n = pread(rd->fd, rd->buf + rd->buf_len, READ_CHUNK - rd->buf_len,
					  (off_t)(rd->buf_off + rd->buf_len));
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0)
				return errfmt(-errno, err, errlen, "%s: read failed at offset %llu: %s",
					    rd->path, (unsigned long long)(rd->buf_off + rd->buf_len),
					    strerror(errno));
			if (n == 0)
				break;
			rd->buf_len += (size_t)n;
		}
		if (off >= rd->buf_off + rd->buf_len)
			return errfmt(-EINVAL, err, errlen, "%s: truncated at offset %llu", rd->path,
				    (unsigned long long)off);
	}
	return 0;
}

/* An octal or base-256 number field; false when malformed. */
static bool parse_number(const unsigned char *f, size_t len, uint64_t *out)
{
	uint64_t v = 0;
	size_t i = 0;
	bool any = false;

	if (f[0] & 0x80) {
		if (f[0] != 0x80) /* negative, or more than 63 bits */
			return false;
		for (i = 1; i < len; i++) {
			if (v >> 55)
				return false;
			v = v << 8 | f[i];
		}
		*out = v;
		return true;
	}
	while (i < len && f[i] == ' ')
		i++;
	for (; i < len && f[i] >= '0' && f[i] <= '7'; i++) {
		if (v >> 60)
			return false;
		v = v << 3 | (uint64_t)(f[i] - '0');
		any = true;
	}
	for (; i < len; i++)
		if (f[i] != ' ' && f[i] != '\0')
			return false;
	*out = v;
	return any;
}

static bool checksum_ok(const unsigned char *h)
{
	uint64_t want;
	long uns = 0, sig = 0;

	if (!parse_number(h + 148, 8, &want))
		return false;
	for (int i = 0; i < BLOCK; i++) {
		unsigned char c = (i >= 148 && i < 156) ? ' ' : h[i];

		uns += c;
		sig += (signed char)c;
	}
	return (uint64_t)uns == want || (uint64_t)sig == want;
}

/* Copy a field of at most @len bytes, NUL-terminated or not. */
static size_t field_copy(char *dst, const unsigned char *f, size_t len)
{
	size_t n = strnlen((const char *)f, len);

	memcpy(dst, f, n);
	dst[n] = '\0';
	return n;
}

/* "LEN key=value\n" records: take path and size. */
static int pax_parse(struct reader *rd, uint64_t at, const char *text, size_t len, char *path,
		     bool *have_path, uint64_t *size, bool *have_size, char *err, size_t errlen)
{
	size_t pos = 0;

	while (pos < len) {
		size_t rec = 0, i = pos, klen;
		const char *key, *val, *eq;

		while (i < len && text[i] >= '0' && text[i] <= '9' && rec < len)
			rec = rec * 10 + (size_t)(text[i++] - '0');
		if (i == pos || i >= len || text[i] != ' ' || rec < 5 || rec > len - pos ||
		    text[pos + rec - 1] != '\n') {
			if (rec == 0 && text[pos] == '\0') /* NUL padding at the end */
				break;
			return errfmt(-EINVAL, err, errlen, "%s: bad pax header record at offset %llu",
				    rd->path, (unsigned long long)at);
		}
		key = text + i + 1;
		eq = memchr(key, '=', (size_t)(text + pos + rec - 1 - key));
		if (!eq)
			return errfmt(-EINVAL, err, errlen, "%s: bad pax header record at offset %llu",
				    rd->path, (unsigned long long)at);
		klen = (size_t)(eq - key);
		val = eq + 1;
		size_t vlen = (size_t)(text + pos + rec - 1 - val);
		if (klen == 4 && memcmp(key, "path", 4) == 0) {
			if (vlen == 0 || vlen >= TAR_NAME_MAX || memchr(val, '\0', vlen))
				return errfmt(-EINVAL, err, errlen,
					    "%s: bad pax path at offset %llu", rd->path,
					    (unsigned long long)at);
			memcpy(path, val, vlen);
			path[vlen] = '\0';
			*have_path = true;
		} else if (klen == 4 && memcmp(key, "size", 4) == 0) {
			uint64_t v = 0;

			if (vlen == 0 || vlen > 19)
				return errfmt(-EINVAL, err, errlen, "%s: bad pax size at offset %llu",
					    rd->path, (unsigned long long)at);
			for (size_t k = 0; k < vlen; k++) {
				if (val[k] < '0' || val[k] > '9')
					return errfmt(-EINVAL, err, errlen,
						    "%s: bad pax size at offset %llu", rd->path,
						    (unsigned long long)at);
				v = v * 10 + (uint64_t)(val[k] - '0');
			}
			*size = v;
			*have_size = true;
		}
		pos += rec;
	}
	return 0;
}

int tar_scan(int fd, const char *path, uint64_t size, tar_entry_fn fn, void *userdata, char *err,
	     size_t errlen)
{
	struct reader rd = { .fd = fd, .path = path, .size = size };
	unsigned char h[BLOCK];
	char *name = NULL, *longname = NULL, *paxname = NULL, *pax = NULL;
	bool have_long = false, have_pax_path = false, have_pax_size = false;
	uint64_t pax_size = 0, off = 0;
	int r = 0;

	rd.buf = malloc(READ_CHUNK);
	name = malloc(TAR_NAME_MAX + 256);
	longname = malloc(TAR_NAME_MAX);
	paxname = malloc(TAR_NAME_MAX);
	if (!rd.buf || !name || !longname || !paxname) {
		r = -ENOMEM;
		goto out;
	}
	for (;;) {
		uint64_t msize, data, next;
		bool zero = true;
		char type;

		if (off + BLOCK > size)
			break; /* end of file without end-of-archive blocks */
		r = rd_read(&rd, off, h, BLOCK, err, errlen);
		if (r < 0)
			goto out;
		for (int i = 0; i < BLOCK && zero; i++)
			zero = h[i] == 0;
		if (zero)
			break;
		if (!checksum_ok(h)) {
			r = errfmt(-EINVAL, err, errlen, "%s: bad header checksum at offset %llu%s",
				 path, (unsigned long long)off,
				 off == 0 ? " (not a tar file?)" : "");
			goto out;
		}
		if (!parse_number(h + 124, 12, &msize)) {
			r = errfmt(-EINVAL, err, errlen, "%s: bad member size at offset %llu", path,
				 (unsigned long long)off);
			goto out;
		}
		type = (char)h[156];
		if (have_pax_size && type != 'x' && type != 'g' && type != 'L' && type != 'K')
			msize = pax_size;
		data = off + BLOCK;
		if (msize > size - data) {
			r = errfmt(-EINVAL, err, errlen,
				 "%s: truncated: the member at offset %llu needs %llu bytes, the file has %llu",
				 path, (unsigned long long)off, (unsigned long long)msize,
				 (unsigned long long)(size - data));
			goto out;
		}
		next = data + (msize + BLOCK - 1) / BLOCK * BLOCK;

		if (type == 'L' || type == 'x') {
			char *text;

			if (msize > (type == 'L' ? TAR_NAME_MAX - 1 : PAX_MAX)) {
				r = errfmt(-EINVAL, err, errlen,
					 "%s: %s header at offset %llu is too long (%llu bytes)", path,
					 type == 'L' ? "long name" : "pax", (unsigned long long)off,
					 (unsigned long long)msize);
				goto out;
			}
			if (type == 'L') {
				text = longname;
			} else {
				/* on failure pax keeps the old buffer, freed at out */
				char *grown = realloc(pax, msize + 1);
				if (!grown) {
					r = errfmt(-ENOMEM, err, errlen, "%s: out of memory for a pax header of "
					           "%llu bytes", path, (unsigned long long)msize);
					goto out;
				}
				text = pax = grown;
			}
			r = rd_read(&rd, data, text, msize, err, errlen);
			if (r < 0)
				goto out;
			text[msize] = '\0';
			if (type == 'L') {
				have_long = strlen(longname) > 0;
			} else {
				r = pax_parse(&rd, off, text, msize, paxname, &have_pax_path,
					      &pax_size, &have_pax_size, err, errlen);
				if (r < 0)
					goto out;
			}
			off = next;
			continue;
		}
		if (type == 'K' || type == 'g') { /* long link name, pax global header */
			off = next;
			continue;
		}

		if (type == '0' || type == '\0' || type == '7') {
			struct tar_entry e;

			if (have_pax_path) {
				snprintf(name, TAR_NAME_MAX, "%s", paxname);
			} else if (have_long) {
				snprintf(name, TAR_NAME_MAX, "%s", longname);
			} else if (memcmp(h + 257, "ustar\0", 6) == 0 && h[345]) {
				size_t n = field_copy(name, h + 345, 155);

				name[n++] = '/';
				field_copy(name + n, h, 100);
			} else {
				field_copy(name, h, 100);
			}
			e.name = name;
			e.offset = data;
			e.size = msize;
			/* V7 directories are regular members whose name ends in '/' */
			if (name[0] && name[strlen(name) - 1] != '/') {
				r = fn(userdata, &e, err, errlen);
				if (r < 0)
					goto out;
			}
		}
		/* every other type (links, dirs, devices, 'g', 'K'...) is skipped */
		have_long = have_pax_path = have_pax_size = false;
		off = next;
	}
out:
	free(rd.buf);
	free(name);
	free(longname);
	free(paxname);
	free(pax);
	return r;
}
