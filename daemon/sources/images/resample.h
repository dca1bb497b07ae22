/* SPDX-License-Identifier: MIT */
/* resample - PIL's bilinear resampling, 8 bits per channel: the kernels of
 * imageop.c's stages (resample.c)
 *
 * Private to daemon/sources/images/: imageop.c plans a stage and calls these
 * per row; they know no spec, no slot and no sample. Each kernel exists in
 * portable C and, where the CPU has it, in SSE4.1, AVX-512 (BW, VBMI) or
 * x86-64-v3 (target clones); the resample_have_*() tell imageop.c which
 * to call, and imageop_portable_only() (imageop.h) turns them all off.
 */
#ifndef LOADERD_RESAMPLE_H
#define LOADERD_RESAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PRECISION_BITS (32 - 8 - 2)
#define RESAMPLE_SLACK 16          /* bytes past a row that the kernels may touch */

/*
 * AVX-512 VBMI's groups of 16 output pixels of a horizontal pass
 * (resample_hgroups_init(), resample_hrow_vbmi()).
 */
#define HV_PAIRS_MAX 2

struct hgroup {
	int32_t base;                 /* first source pixel of the 64 bytes; -1: not eligible */
	int32_t pad[15];              /* the vectors below 64-byte aligned */
	/* [pair][third]: the permutation, high and low coefficients */
	uint8_t idx[HV_PAIRS_MAX][3][64];
	int16_t hi[HV_PAIRS_MAX][3][32];
	int16_t lo[HV_PAIRS_MAX][3][32];
};

/* imageop_portable_only(): the portable kernels only (tests) */
extern bool resample_portable_only;

/* the coefficients: the taps of each output position, PIL's, K of them */
int resample_ksize(double in0, double in1, int out_size);
int resample_coeffs(int in_size, double in0, double in1, int out_size, int first, int count,
	int ksize, int *K, int32_t *xs, int32_t *kk, uint8_t *pad, int32_t *ns);
int resample_coeffs_copy(int out_size, int first, int count, int32_t *xs, int32_t *kk,
	uint8_t *pad);

/* which kernels this CPU runs */
bool resample_have_sse41(void);
bool resample_have_vbmi(void);
bool resample_have_avx512bw(void);

/* one row of a pass */
void resample_hrow_c(const uint8_t *in, uint8_t *out, int ow, const int32_t *xs, const int32_t *kk,
	int K);
void resample_hrow_sse41(const uint8_t *in, uint8_t *out, int ow, const int32_t *xs,
	const int32_t *kk4, int K);
int resample_hgroups_init(struct hgroup *g, int ow, const int32_t *xs, const int32_t *kx, int K);
void resample_hrow_vbmi(const uint8_t *in, size_t in_bytes, uint8_t *out, int ow, const int32_t *xs,
	const int32_t *kx4, int K, const struct hgroup *g);
void resample_vrow(const uint8_t *in, size_t stride, const int32_t *k, uint8_t *row, size_t len,
	int K, int32_t *acc);
void resample_vrow_avx512(const uint8_t *in, size_t stride, const int32_t *k, uint8_t *row,
	size_t len, int K);

#endif
