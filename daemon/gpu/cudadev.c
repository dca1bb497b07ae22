/* SPDX-License-Identifier: MIT */
/* cudadev - device delivery: the attach check, device slabs, one copy engine per device
 *
 * The design is in cudadev.h. Here: the attach check, on the loop thread
 * (cuInit happens once, on the first CUDA attach of the daemon's life), and
 * the device slab's sizing; the copy engines, one thread per device that
 * owns its stream and runs every copy, host registration and slab free, are
 * copy.c, sharing the driver through driver.h.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "cudadev.h"
#include "driver.h"
#include "loader/loader.h"
#include "base/log.h"

/* The process's driver (common/cudadrv.c), opened on the first CUDA attach;
 * g_drv once it is open, for the engines (driver.h). */
struct cuda_driver *_Atomic g_drv;
/* devices whose primary context the daemon retains for its life (cuda_attach_prepare) */
static atomic_bool g_warm[CUDA_MAX_DEVICES];

int cuda_attach_check(int index, struct cuda_device_info *info, char *err, size_t errsize)
{
	struct cuda_driver *drv;
	bool opened;
	int r;

	r = cuda_driver_process(&drv, err, errsize, &opened);
	if (opened && r < 0)
		log_notice("CUDA unavailable, host delivery only: %s", err);
	else if (opened)
		log_info("CUDA driver loaded from %s", cuda_driver_path(drv));
	if (r < 0) {
		memset(info, 0, sizeof(*info));
		return r;
	}
	g_drv = drv;
	return cuda_driver_device(drv, index, info, err, errsize);
}

struct json_t *cuda_status_json(void)
{
	struct cuda_driver *drv;
	const char *why;
	int r = cuda_driver_process_peek(&drv, &why);

	if (r == -EAGAIN)
		return NULL;
	if (r < 0)
		return json_pack("{s:s}", "error", why);
	return json_pack("{s:s}", "driver", cuda_driver_path(drv));
}

int cuda_attach_device(uint32_t kind, int32_t index, struct cuda_device_info *info,
                       char *err, size_t errsize)
{
	int r;

	if (kind == LDR_DEVICE_HOST)
		return 0;
	if (kind != LDR_DEVICE_CUDA)
		return errfmt(-EINVAL, err, errsize, "unknown device kind %u (0 host, 1 cuda)", kind);
	r = cuda_attach_check(index, info, err, errsize);
	if (r < 0)
		return r;
#ifdef HAVE_CUDA
	r = cuda_driver_require(g_drv, false, err, errsize);
	if (r < 0)
		return r;
#endif
	return 1;
}

bool cuda_attach_ready(uint32_t kind, int32_t index)
{
	struct cuda_driver *drv;
	const char *why;
	int r;

	if (kind != LDR_DEVICE_CUDA)
		return true;
	r = cuda_driver_process_peek(&drv, &why);
	if (r == -EAGAIN)
		return false;
	return r < 0 || index < 0 || index >= CUDA_MAX_DEVICES || atomic_load(&g_warm[index]);
}

int cuda_attach_prepare(uint32_t kind, int32_t index, struct cuda_device_info *info,
                        char *err, size_t errsize)
{
	int r = cuda_attach_device(kind, index, info, err, errsize);

#ifdef HAVE_CUDA
	if (r == 1 && index < CUDA_MAX_DEVICES && !atomic_load(&g_warm[index])) {
		CUdevice dev;
		CUcontext ctx;

		/* two attaches racing here retain twice: harmless, it is never released */
		if (g_drv->DeviceGet(&dev, index) == CUDA_SUCCESS &&
		    g_drv->DevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS)
			atomic_store(&g_warm[index], true);
	}
#endif
	return r;
}

/* --- device slab sizing -------------------------------------------------- */

static bool pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

int cuda_round_up(uint64_t x, uint64_t align, uint64_t *out)
{
	uint64_t r;

	if (!align)
		return -EINVAL;
	r = x % align;
	if (!r) {
		*out = x;
		return 0;
	}
	if (x > UINT64_MAX - (align - r))
		return -EOVERFLOW;
	*out = x + (align - r);
	return 0;
}

int cuda_slab_layout(uint64_t slot_bytes, uint32_t nslots, uint64_t gran_min, uint64_t gran_rec,
                     struct cuda_slab_layout *out)
{
	uint64_t stride, total;

	if (!slot_bytes || !nslots || !pow2(gran_min))
		return -EINVAL;
	if (!gran_rec)
		gran_rec = gran_min;
	if (gran_rec % gran_min)
		return -EINVAL;
	if (cuda_round_up(slot_bytes, slot_bytes >= gran_min ? gran_min : CUDA_SLOT_ALIGN, &stride) < 0)
		return -EOVERFLOW;
	if (stride > UINT64_MAX / nslots)
		return -EOVERFLOW;
	if (cuda_round_up(stride * nslots, gran_rec, &total) < 0)
		return -EOVERFLOW;
	out->slot_stride = stride;
	out->slab_bytes = total;
	out->waste_bytes = total - slot_bytes * nslots;
	return 0;
}
