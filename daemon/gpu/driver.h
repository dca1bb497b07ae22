/* SPDX-License-Identifier: MIT */
/* driver - the process's CUDA driver, as the gpu layer's files share it */
#pragma once

#include <stdatomic.h>

struct cuda_driver;

/* Opened on the first CUDA attach (cudadev.c, cuda_attach_check()), then
 * set for good; the copy engines (copy.c) use it. */
extern struct cuda_driver *_Atomic g_drv;

#define CUDA_MAX_DEVICES 64
