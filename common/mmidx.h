/* SPDX-License-Identifier: MIT */
/* mmidx - the .idx of a Megatron-LM indexed dataset (.bin/.idx pair), parsed and checked
 *
 * Shared by the daemon's megatron source and loaderctl inspect. The format,
 * as megatron-core 0.16's indexed_dataset.py writes it (all little-endian):
 *
 *   offset 0   9 bytes  magic "MMIDIDX\0\0"
 *   offset 9   u64      version, 1
 *   offset 17  u8       dtype code: 1 uint8, 2 int8, 3 int16, 4 int32,
 *                       5 int64, 6 float64, 7 float32, 8 uint16
 *   offset 18  u64      sequence count N
 *   offset 26  u64      document index count D (documents + 1)
 *   offset 34  i32[N]   sequence lengths (elements)
 *              i64[N]   sequence pointers (byte offsets into the .bin)
 *              i64[D]   document indices (sequence numbers: document d is
 *                       sequences [di[d], di[d+1]))
 *              i8[N]    sequence modes, only in multimodal datasets
 *
 * mmidx_parse() checks everything against the .bin's size; its errors name
 * the file and the byte offset of what is wrong.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MMIDX_HEADER_BYTES 34

struct mmidx {
	int code;                 /* megatron's dtype code, 1..8 */
	int dtype;                /* the same as an enum ldr_dtype */
	size_t elem;              /* bytes of one element */
	uint64_t nseq;            /* sequences */
	uint64_t ndocidx;         /* document indices: documents + 1 */
	bool multimodal;          /* sequence modes follow the document indices */
	uint64_t ntokens;         /* the sum of the lengths */
	uint64_t bin_size;
	int32_t *lengths;         /* [nseq] */
	int64_t *pointers;        /* [nseq] */
	int64_t *docidx;          /* [ndocidx] */
};

/* Reads exactly @len bytes at @off of the .idx (pread, memory...); 0 or a
 * negative errno with @err set. */
typedef int (*mmidx_read_fn)(void *ctx, void *buf, size_t len, uint64_t off, char *err,
			     size_t errlen);

/* The dtype code's name ("uint16"...), NULL when out of range. */
const char *mmidx_code_name(int code);

/**
 * mmidx_parse() - read and check an .idx.
 * @idx_path, @bin_path: the names errors use
 * @idx_size, @bin_size: the files' sizes
 *
 * Return: 0 with @out filled (free it with mmidx_free()), or a negative
 * errno with @err e.g. "x.idx: offset 34: sequence 7 pointer 1234 is past
 * the end of x.bin (1000 bytes)".
 */
int mmidx_parse(struct mmidx *out, mmidx_read_fn read, void *ctx, const char *idx_path,
		uint64_t idx_size, const char *bin_path, uint64_t bin_size, char *err,
		size_t errlen);
/* The two halves of mmidx_parse(): the header alone (every count, no array
 * read), then the arrays read and checked; on an error the body frees what
 * it read and leaves the header's fields. */
int mmidx_parse_header(struct mmidx *out, mmidx_read_fn read, void *ctx, const char *idx_path,
		       uint64_t idx_size, uint64_t bin_size, char *err, size_t errlen);
int mmidx_parse_body(struct mmidx *m, mmidx_read_fn read, void *ctx, const char *idx_path,
		     const char *bin_path, char *err, size_t errlen);
/* The same from an .idx in memory. */
int mmidx_parse_buf(struct mmidx *out, const void *buf, size_t len, const char *idx_path,
		    const char *bin_path, uint64_t bin_size, char *err, size_t errlen);
void mmidx_free(struct mmidx *m);
