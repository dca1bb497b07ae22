/* SPDX-License-Identifier: MIT */
/* sums - the checksums S3 gives of an object, of a body as it streams in
 * (sums.c): private to daemon/store
 *
 * MD5: a store's ETag of an object uploaded in one PUT is the MD5 of its
 * bytes (hex). x-amz-checksum-crc32, -crc32c, -crc64nvme and -sha256: the big-endian
 * digest in base64, which a store sends (asked with x-amz-checksum-mode:
 * ENABLED) for objects uploaded with one, so an object whose ETag is no MD5
 * (multipart, SSE-KMS) is checked too. store.c checks a whole body against
 * them before the object cache keeps it. Not for anything that needs a
 * secure hash.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum sum_kind { SUM_NONE, SUM_CRC32, SUM_CRC32C, SUM_SHA256, SUM_MD5, SUM_CRC64NVME };

struct sum {
	enum sum_kind kind;
	uint64_t crc;           /* a CRC's register (CRC32's, CRC32C's: the low half) */
	uint32_t h[8];          /* SHA-256's state, or MD5's (4) */
	uint64_t len;           /* bytes fed so far */
	unsigned char buf[64];  /* a block not yet full */
};

/* The name of @kind as in its header ("crc32", "crc32c", "crc64nvme", "sha256", "md5"). */
const char *sum_name(enum sum_kind kind);
/* The same for a message: "CRC32", "CRC32C", "CRC64NVME", "SHA-256", "MD5". */
const char *sum_label(enum sum_kind kind);
/* Whether @a costs less CPU a byte than @b (SUM_NONE costs the most: any
 * sum is cheaper than none given). CRC32C, CRC64NVME, CRC32, MD5, SHA-256: store.c
 * computes only the cheapest sum an answer gives. */
bool sum_cheaper(enum sum_kind a, enum sum_kind b);
void sum_init(struct sum *s, enum sum_kind kind);
/* For the tests and bench/sums-speed: the CRC32, CRC32C or CRC64NVME
 * register (not inverted: all ones at the start, the CRC is its
 * complement; 32 bits wide but CRC64NVME's) after @len bytes at @p from
 * @reg. sum_crc() is what sum_update() uses (the fastest this CPU has:
 * sum_crc_impl() names it, "sse4.2", "pclmul", "zlib" or "table"),
 * sum_crc_portable() the tables every CPU runs. */
uint64_t sum_crc(enum sum_kind kind, uint64_t reg, const void *p, size_t len);
uint64_t sum_crc_portable(enum sum_kind kind, uint64_t reg, const void *p, size_t len);
const char *sum_crc_impl(enum sum_kind kind);
void sum_update(struct sum *s, const void *data, size_t len);
/* The digest in base64, as the header carries it, into @out (at least 45
 * bytes). Once: the sum is done. */
void sum_base64(struct sum *s, char *out);
/* A 32-bit CRC's value so far (SUM_CRC32, SUM_CRC32C); the sum goes on. */
uint32_t sum_crc32_value(const struct sum *s);
/* The digest in lowercase hex (an ETag's), into @out (at least 65 bytes). */
void sum_hex(struct sum *s, char *out);
