/* SPDX-License-Identifier: MIT */
/* s3xml - the XML of S3's answers: an error's Code and Message, a
 * ListObjectsV2 page. Only what those need: elements found by name, text
 * with the five entities and numeric character references decoded. The
 * input is untrusted (fuzz/fuzz-s3xml.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One <Contents> of a page (store.h's store_list_fn, the same type). */
typedef int (*s3xml_entry_fn)(void *arg, const char *key, uint64_t size, const char *etag);

/**
 * s3xml_text() - the decoded text of the first <@tag>...</@tag> in
 * [@p, @end) into @out (NUL-terminated)
 *
 * Return: 1 found, 0 not there, -EINVAL text too long for @cap or a bad
 * character reference.
 */
int s3xml_text(const char *p, const char *end, const char *tag, char *out, size_t cap);

/**
 * s3xml_list() - one ListObjectsV2 page: @fn for each <Contents>
 * @token: NextContinuationToken (cap @tokcap) when *@truncated
 *
 * Return: 0; what @fn returned when not 0; -EINVAL (a page that is not a
 * ListBucketResult, a Contents without Key or Size, a truncated page
 * without a token) with a message.
 */
int s3xml_list(const char *xml, size_t len, s3xml_entry_fn fn, void *arg, bool *truncated, char *token,
	       size_t tokcap, char *err, size_t errlen);
