/* SPDX-License-Identifier: MIT */
/* sums - the checksums S3 gives of an object, of a body as it streams in
 * (sums.c): private to daemon/store
 *
 * MD5: a store's ETag of an object uploaded in one PUT is the MD5 of its
 * bytes (hex). x-amz-checksum-crc32, -crc32c and -sha256: the big-endian
 * digest in base64, which a store sends (asked with x-amz-checksum-mode:
 * ENABLED) for objects uploaded with one, so an object whose ETag is no MD5
 * (multipart, SSE-KMS) is checked too. store.c checks a whole body against
 * them before the object cache keeps it. Not for anything that needs a
 * secure hash.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

enum sum_kind { SUM_NONE, SUM_CRC32, SUM_CRC32C, SUM_SHA256, SUM_MD5 };

struct sum {
	enum sum_kind kind;
	uint32_t crc;
	uint32_t h[8];          /* SHA-256's state, or MD5's (4) */
	uint64_t len;           /* bytes fed so far */
	unsigned char buf[64];  /* a block not yet full */
};

/* The name of @kind as in its header ("crc32", "crc32c", "sha256", "md5"). */
const char *sum_name(enum sum_kind kind);
/* The same for a message: "CRC32", "CRC32C", "SHA-256", "MD5". */
const char *sum_label(enum sum_kind kind);
void sum_init(struct sum *s, enum sum_kind kind);
void sum_update(struct sum *s, const void *data, size_t len);
/* The digest in base64, as the header carries it, into @out (at least 45
 * bytes). Once: the sum is done. */
void sum_base64(struct sum *s, char *out);
/* A CRC's value so far (SUM_CRC32, SUM_CRC32C); the sum goes on. */
uint32_t sum_crc(const struct sum *s);
/* The digest in lowercase hex (an ETag's), into @out (at least 65 bytes). */
void sum_hex(struct sum *s, char *out);
