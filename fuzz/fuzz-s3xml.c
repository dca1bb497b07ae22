/* SPDX-License-Identifier: MIT */
/* fuzz-s3xml - the XML of S3's answers (daemon/store/s3xml.c)
 *
 * What an object store answers is untrusted: a store, or anything between
 * it and the daemon, may send any bytes. The input is parsed as a
 * ListObjectsV2 page and as an error document; every key handed on must be
 * a non-empty C string and a truncated page must carry its token.
 */
#include "fuzz.h"

#include "s3xml.h"

static int on_entry(void *arg, const char *key, uint64_t size, const char *etag)
{
	size_t *n = arg;

	(void)size;
	if (!key[0] || strlen(etag) >= 256)
		abort();
	return ++*n > 100000;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *xml = (const char *)data;
	char token[2048], text[512], err[512];
	bool truncated = false;
	size_t n = 0;
	int r;

	r = s3xml_list(xml, size, on_entry, &n, &truncated, token, sizeof token, err, sizeof err);
	if (r == 0 && truncated && !token[0])
		abort();
	s3xml_text(xml, xml + size, "Code", text, sizeof text);
	s3xml_text(xml, xml + size, "Message", text, sizeof text);
	return 0;
}
