/* SPDX-License-Identifier: MIT */
/* size - parse a size in bytes: "1073741824", "512M", "4G", "1.5G"
 *
 * The config file, the command line, a live `loaderctl set` and an image
 * spec's cache_bytes all take sizes so: one parser below all of them.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "size.h"

int size_parse(const char *text, uint64_t *out)
{
	char *end;
	double v;
	double mul = 1;

	errno = 0;
	v = strtod(text, &end);
	if (end == text || errno || v < 0 || !isfinite(v))
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': mul = 1024.0; end++; break;
	case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
	case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
	case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
	default: break;
	}
	if (*end == 'i' || *end == 'B')
		end += *end == 'i' ? 1 : 0;
	if (*end == 'B')
		end++;
	if (*end)
		return -EINVAL;
	v *= mul;
	if (v >= 9223372036854775808.0) /* 2^63: above SIZE_PARSE_MAX */
		return -ERANGE;
	*out = (uint64_t)v;
	return 0;
}
