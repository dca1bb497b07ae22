/* SPDX-License-Identifier: MIT */
/* size - parse a size in bytes: "1073741824", "512M", "4G", "1.5G" */
#pragma once

#include <stdint.h>

/* Parse "1073741824", "512M", "4G", "1.5G"; -EINVAL if it is none of these,
 * -ERANGE above SIZE_PARSE_MAX (replies, logs and status carry sizes as
 * JSON's signed 64-bit integers). */
#define SIZE_PARSE_MAX INT64_MAX
int size_parse(const char *text, uint64_t *out);
