/* SPDX-License-Identifier: MIT */
/* test-fakecuda - the emulated CUDA driver, looked up the way daemon/gpu/cudadev.c does
 *
 * Usage: test-fakecuda LIB               every check (it runs itself again for
 *                                        the other processes)
 *        test-fakecuda LIB ROLE ARGS...  one of those other processes
 *
 * LIB is the built libfakecuda.so. Every entry point is resolved with
 * cuGetProcAddress_v2(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status)
 * and checked against the exported symbol dlsym finds, so the names the
 * daemon asks for and the names the library exports are tested together.
 */
#undef NDEBUG
#include <assert.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#define MiB (1024ull * 1024)
#define GRAN (2 * MiB)

typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static const char *lib_path;
static void *lib;
static gpa_v2_fn gpa;

static struct {
	__typeof__(cuInit) *Init;
	__typeof__(cuDriverGetVersion) *DriverGetVersion;
	__typeof__(cuGetErrorName) *GetErrorName;
	__typeof__(cuDeviceGetCount) *DeviceGetCount;
	__typeof__(cuDeviceGet) *DeviceGet;
	__typeof__(cuDeviceGetName) *DeviceGetName;
	__typeof__(cuDeviceTotalMem) *DeviceTotalMem;
	__typeof__(cuDeviceGetAttribute) *DeviceGetAttribute;
	__typeof__(cuDevicePrimaryCtxRetain) *PrimaryCtxRetain;
	__typeof__(cuDevicePrimaryCtxRelease) *PrimaryCtxRelease;
	__typeof__(cuCtxSetCurrent) *CtxSetCurrent;
	__typeof__(cuCtxGetCurrent) *CtxGetCurrent;
	__typeof__(cuCtxPushCurrent) *CtxPushCurrent;
	__typeof__(cuCtxPopCurrent) *CtxPopCurrent;
	__typeof__(cuCtxSynchronize) *CtxSynchronize;
	__typeof__(cuStreamCreate) *StreamCreate;
	__typeof__(cuStreamDestroy) *StreamDestroy;
	__typeof__(cuStreamSynchronize) *StreamSynchronize;
	__typeof__(cuStreamQuery) *StreamQuery;
	__typeof__(cuEventCreate) *EventCreate;
	__typeof__(cuEventRecord) *EventRecord;
	__typeof__(cuEventQuery) *EventQuery;
	__typeof__(cuEventSynchronize) *EventSynchronize;
	__typeof__(cuEventDestroy) *EventDestroy;
	__typeof__(cuMemHostRegister) *MemHostRegister;
	__typeof__(cuMemHostUnregister) *MemHostUnregister;
	__typeof__(cuMemAlloc) *MemAlloc;
	__typeof__(cuMemFree) *MemFree;
	__typeof__(cuMemGetAddressRange) *MemGetAddressRange;
	__typeof__(cuPointerGetAttribute) *PointerGetAttribute;
	__typeof__(cuMemcpyHtoD) *MemcpyHtoD;
	__typeof__(cuMemcpyHtoDAsync) *MemcpyHtoDAsync;
	__typeof__(cuMemcpyDtoH) *MemcpyDtoH;
	__typeof__(cuMemcpyDtoHAsync) *MemcpyDtoHAsync;
	__typeof__(cuMemsetD8) *MemsetD8;
	__typeof__(cuIpcGetMemHandle) *IpcGetMemHandle;
	__typeof__(cuIpcOpenMemHandle) *IpcOpenMemHandle;
	__typeof__(cuIpcCloseMemHandle) *IpcCloseMemHandle;
	__typeof__(cuMemGetAllocationGranularity) *MemGetAllocationGranularity;
	__typeof__(cuMemCreate) *MemCreate;
	__typeof__(cuMemRelease) *MemRelease;
	__typeof__(cuMemExportToShareableHandle) *MemExportToShareableHandle;
	__typeof__(cuMemImportFromShareableHandle) *MemImportFromShareableHandle;
	__typeof__(cuMemAddressReserve) *MemAddressReserve;
	__typeof__(cuMemAddressFree) *MemAddressFree;
	__typeof__(cuMemMap) *MemMap;
	__typeof__(cuMemSetAccess) *MemSetAccess;
	__typeof__(cuMemUnmap) *MemUnmap;
} cu;

/* Resolve @name as daemon/gpu/cudadev.c does; it must be the exported @exported. */
static void load(void *field, const char *name, const char *exported)
{
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	void *fn = NULL;

	assert(gpa(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_SUCCESS);
	assert(st == CU_GET_PROC_ADDRESS_SUCCESS && fn);
	if (fn != dlsym(lib, exported)) {
		fprintf(stderr, "%s resolves to something other than the exported %s\n", name, exported);
		abort();
	}
	memcpy(field, &fn, sizeof(fn));
}

#define LOAD(field, name) load(&cu.field, name, name)
#define LOAD_V2(field, name) load(&cu.field, name, name "_v2")

static void open_lib(void)
{
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
	void *fn = (void *)1;

	lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "dlopen %s: %s\n", lib_path, dlerror());
		exit(1);
	}
	fn = dlsym(lib, "cuGetProcAddress_v2");
	assert(fn);
	memcpy(&gpa, &fn, sizeof(fn));

	LOAD(Init, "cuInit");
	LOAD(DriverGetVersion, "cuDriverGetVersion");
	LOAD(GetErrorName, "cuGetErrorName");
	LOAD(DeviceGetCount, "cuDeviceGetCount");
	LOAD(DeviceGet, "cuDeviceGet");
	LOAD(DeviceGetName, "cuDeviceGetName");
	LOAD_V2(DeviceTotalMem, "cuDeviceTotalMem");
	LOAD(DeviceGetAttribute, "cuDeviceGetAttribute");
	LOAD(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	LOAD_V2(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease");
	LOAD(CtxSetCurrent, "cuCtxSetCurrent");
	LOAD(CtxGetCurrent, "cuCtxGetCurrent");
	LOAD_V2(CtxPushCurrent, "cuCtxPushCurrent");
	LOAD_V2(CtxPopCurrent, "cuCtxPopCurrent");
	LOAD(CtxSynchronize, "cuCtxSynchronize");
	LOAD(StreamCreate, "cuStreamCreate");
	LOAD_V2(StreamDestroy, "cuStreamDestroy");
	LOAD(StreamSynchronize, "cuStreamSynchronize");
	LOAD(StreamQuery, "cuStreamQuery");
	LOAD(EventCreate, "cuEventCreate");
	LOAD(EventRecord, "cuEventRecord");
	LOAD(EventQuery, "cuEventQuery");
	LOAD(EventSynchronize, "cuEventSynchronize");
	LOAD_V2(EventDestroy, "cuEventDestroy");
	LOAD_V2(MemHostRegister, "cuMemHostRegister");
	LOAD(MemHostUnregister, "cuMemHostUnregister");
	LOAD_V2(MemAlloc, "cuMemAlloc");
	LOAD_V2(MemFree, "cuMemFree");
	LOAD_V2(MemGetAddressRange, "cuMemGetAddressRange");
	LOAD(PointerGetAttribute, "cuPointerGetAttribute");
	LOAD_V2(MemcpyHtoD, "cuMemcpyHtoD");
	LOAD_V2(MemcpyHtoDAsync, "cuMemcpyHtoDAsync");
	LOAD_V2(MemcpyDtoH, "cuMemcpyDtoH");
	LOAD_V2(MemcpyDtoHAsync, "cuMemcpyDtoHAsync");
	LOAD_V2(MemsetD8, "cuMemsetD8");
	LOAD(IpcGetMemHandle, "cuIpcGetMemHandle");
	LOAD_V2(IpcOpenMemHandle, "cuIpcOpenMemHandle");
	LOAD(IpcCloseMemHandle, "cuIpcCloseMemHandle");
	LOAD(MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
	LOAD(MemCreate, "cuMemCreate");
	LOAD(MemRelease, "cuMemRelease");
	LOAD(MemExportToShareableHandle, "cuMemExportToShareableHandle");
	LOAD(MemImportFromShareableHandle, "cuMemImportFromShareableHandle");
	LOAD(MemAddressReserve, "cuMemAddressReserve");
	LOAD(MemAddressFree, "cuMemAddressFree");
	LOAD(MemMap, "cuMemMap");
	LOAD(MemSetAccess, "cuMemSetAccess");
	LOAD(MemUnmap, "cuMemUnmap");
	load(&fn, "cuGetProcAddress", "cuGetProcAddress_v2");

	/* an unknown name; a version newer than the driver; the v1 generation */
	fn = (void *)1;
	assert(gpa("cuNoSuchFunction", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_ERROR_NOT_FOUND);
	assert(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && !fn);
	assert(gpa("cuMemAlloc", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_ERROR_INVALID_VALUE);
	assert(gpa("cuGetProcAddress", &fn, 11030, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_SUCCESS);
	assert(fn == dlsym(lib, "cuGetProcAddress"));
	assert(gpa("cuMemCreate", &fn, 10000, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_ERROR_NOT_FOUND);
	assert(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 7 + 3);
}

static void fill(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = pattern(i);
}

static void check_pattern(const uint8_t *p, size_t n, size_t from)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != pattern(from + i)) {
			fprintf(stderr, "byte %zu: %u, expected %u\n", from + i, p[i], pattern(from + i));
			abort();
		}
}

static CUcontext init_and_ctx(int dev)
{
	CUcontext ctx;

	assert(cu.Init(0) == CUDA_SUCCESS);
	assert(cu.PrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	assert(cu.CtxSetCurrent(ctx) == CUDA_SUCCESS);
	return ctx;
}

static void hex_encode(const void *p, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", ((const uint8_t *)p)[i]);
}

static void hex_decode(const char *s, void *p, size_t n)
{
	assert(strlen(s) == 2 * n);
	for (size_t i = 0; i < n; i++) {
		unsigned v;

		assert(sscanf(s + 2 * i, "%2x", &v) == 1);
		((uint8_t *)p)[i] = (uint8_t)v;
	}
}

/* --- the other processes ------------------------------------------------- */

/* Run this test again as @role with @a1, @a2; @env "NAME=VALUE" pairs on top;
 * @keep_fd survives the exec; @out, when given, gets its stdout. Returns the
 * exit status. */
static int spawn(const char *role, const char *a1, const char *a2, const char *const *env, int keep_fd,
                 char *out, size_t outsize)
{
	int pfd[2] = { -1, -1 }, status;
	pid_t pid;

	if (out)
		assert(pipe(pfd) == 0);
	pid = fork();
	assert(pid >= 0);
	if (pid == 0) {
		for (; env && *env; env++)
			putenv((char *)*env);
		if (keep_fd >= 0)
			fcntl(keep_fd, F_SETFD, 0);
		if (out) {
			dup2(pfd[1], 1);
			close(pfd[0]);
		}
		execl("/proc/self/exe", "test-fakecuda", lib_path, role, a1, a2, (char *)NULL);
		_exit(127);
	}
	if (out) {
		size_t got = 0;
		ssize_t n;

		close(pfd[1]);
		while (got < outsize - 1 && (n = read(pfd[0], out + got, outsize - 1 - got)) > 0)
			got += (size_t)n;
		out[got] = '\0';
		close(pfd[0]);
	}
	assert(waitpid(pid, &status, 0) == pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Open the parent's legacy IPC handle, see its bytes from @offset on, write a marker at the base. */
static int role_ipc_open(const char *hex, const char *offset_s)
{
	static const uint8_t marker[16] = { 0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5,
	                                    0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5 };
	size_t offset = strtoull(offset_s, NULL, 10), size;
	CUdeviceptr d, d2, base;
	CUipcMemHandle h;
	uint8_t buf[4096];

	hex_decode(hex, &h, sizeof(h));
	init_and_ctx(0);
	assert(cu.IpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
	/* the base of the allocation, not the pointer that was exported */
	assert(cu.MemGetAddressRange(&base, &size, d + 10) == CUDA_SUCCESS && base == d && size == 3 * MiB);
	assert(cu.MemcpyDtoH(buf, d + offset, sizeof(buf)) == CUDA_SUCCESS);
	check_pattern(buf, sizeof(buf), offset);
	check_pattern((const uint8_t *)(uintptr_t)d + offset, sizeof(buf), offset);
	assert(cu.MemcpyHtoD(d, marker, sizeof(marker)) == CUDA_SUCCESS);
	/* opened twice in one context: the same pointer, closed twice */
	assert(cu.IpcOpenMemHandle(&d2, h, 0) == CUDA_SUCCESS && d2 == d);
	assert(cu.IpcCloseMemHandle(d) == CUDA_SUCCESS);
	assert(cu.MemcpyDtoH(buf, d, 16) == CUDA_SUCCESS);
	assert(cu.IpcCloseMemHandle(d) == CUDA_SUCCESS);
	assert(cu.IpcCloseMemHandle(d) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemcpyDtoH(buf, d, 16) == CUDA_ERROR_INVALID_VALUE);
	/* cuMemFree is not how an IPC mapping ends */
	assert(cu.IpcOpenMemHandle(&d, h, 0) == CUDA_SUCCESS);
	assert(cu.MemFree(d) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.IpcCloseMemHandle(d) == CUDA_SUCCESS);
	return 0;
}

/* A handle whose allocation is gone. */
static int role_ipc_stale(const char *hex)
{
	CUipcMemHandle h;
	CUdeviceptr d;

	hex_decode(hex, &h, sizeof(h));
	init_and_ctx(0);
	assert(cu.IpcOpenMemHandle(&d, h, 0) == CUDA_ERROR_INVALID_HANDLE);
	return 0;
}

/* Export an allocation and exit at once: the handle outlives its exporter. */
static int role_ipc_export(void)
{
	char hex[2 * sizeof(CUipcMemHandle) + 1];
	CUipcMemHandle h;
	CUdeviceptr d;

	init_and_ctx(0);
	assert(cu.MemAlloc(&d, 3 * MiB) == CUDA_SUCCESS);
	assert(cu.IpcGetMemHandle(&h, d) == CUDA_SUCCESS);
	hex_encode(&h, sizeof(h), hex);
	printf("%s", hex);
	return 0;
}

/* Import the parent's VMM allocation from the fd it inherited, map it, see the
 * bytes, write a marker. */
static int role_vmm_import(const char *fd_s, const char *size_s)
{
	int fd = atoi(fd_s);
	size_t size = strtoull(size_s, NULL, 10);
	CUmemAccessDesc acc = { .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
	                        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUmemGenericAllocationHandle h;
	uint8_t *buf = malloc(size);
	CUdeviceptr va;

	assert(buf);
	init_and_ctx(0);
	assert(cu.MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
	       CUDA_SUCCESS);
	/* the importer keeps its fd */
	assert(fcntl(fd, F_GETFD) >= 0);
	close(fd);
	assert(cu.MemAddressReserve(&va, size, 0, 0, 0) == CUDA_SUCCESS && va % GRAN == 0);
	assert(cu.MemMap(va, size, 0, h, 0) == CUDA_SUCCESS);
	assert(cu.MemRelease(h) == CUDA_SUCCESS); /* the mapping keeps it */
	assert(cu.MemSetAccess(va, size, &acc, 1) == CUDA_SUCCESS);
	assert(cu.MemcpyDtoH(buf, va, size) == CUDA_SUCCESS);
	check_pattern(buf, size, 0);
	check_pattern((const uint8_t *)(uintptr_t)va, size, 0);
	assert(cu.MemsetD8(va, 0x5a, 64) == CUDA_SUCCESS);
	assert(cu.MemUnmap(va, size) == CUDA_SUCCESS);
	assert(cu.MemAddressFree(va, size) == CUDA_SUCCESS);
	free(buf);
	return 0;
}

static int role_no_device(void)
{
	int n;

	assert(cu.Init(0) == CUDA_ERROR_NO_DEVICE);
	assert(cu.DeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED);
	return 0;
}

static CUmemAllocationProp prop_for(int dev, CUmemAllocationHandleType types)
{
	CUmemAllocationProp prop;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	prop.requestedHandleTypes = types;
	return prop;
}

static int role_no_posix_fd(void)
{
	CUmemAllocationProp prop = prop_for(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CUmemGenericAllocationHandle h;
	int v, fd;

	init_and_ctx(0);
	assert(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0) == CUDA_SUCCESS);
	assert(v == 1);
	assert(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0) ==
	       CUDA_SUCCESS);
	assert(v == 0);
	assert(cu.MemCreate(&h, GRAN, &prop, 0) == CUDA_ERROR_NOT_SUPPORTED);
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
	assert(cu.MemCreate(&h, GRAN, &prop, 0) == CUDA_SUCCESS);
	assert(cu.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
	       CUDA_ERROR_NOT_SUPPORTED);
	assert(cu.MemRelease(h) == CUDA_SUCCESS);
	return 0;
}

static int role_no_vmm(void)
{
	CUmemAllocationProp prop = prop_for(0, CU_MEM_HANDLE_TYPE_NONE);
	CUmemGenericAllocationHandle h;
	CUdeviceptr d;
	size_t g;
	int v;

	init_and_ctx(0);
	assert(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0) == CUDA_SUCCESS);
	assert(v == 0);
	assert(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0) ==
	       CUDA_SUCCESS);
	assert(v == 0);
	assert(cu.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_ERROR_NOT_SUPPORTED);
	assert(cu.MemCreate(&h, GRAN, &prop, 0) == CUDA_ERROR_NOT_SUPPORTED);
	/* legacy memory still works */
	assert(cu.MemAlloc(&d, 4096) == CUDA_SUCCESS);
	assert(cu.MemFree(d) == CUDA_SUCCESS);
	return 0;
}

static int role(const char *name, int argc, char **argv)
{
	if (!strcmp(name, "ipc-open") && argc == 2)
		return role_ipc_open(argv[0], argv[1]);
	if (!strcmp(name, "ipc-stale") && argc == 1)
		return role_ipc_stale(argv[0]);
	if (!strcmp(name, "ipc-export") && argc == 0)
		return role_ipc_export();
	if (!strcmp(name, "vmm-import") && argc == 2)
		return role_vmm_import(argv[0], argv[1]);
	if (!strcmp(name, "no-device") && argc == 0)
		return role_no_device();
	if (!strcmp(name, "no-posix-fd") && argc == 0)
		return role_no_posix_fd();
	if (!strcmp(name, "no-vmm") && argc == 0)
		return role_no_vmm();
	fprintf(stderr, "test-fakecuda: unknown role %s with %d arguments\n", name, argc);
	return 2;
}

/* --- the checks ---------------------------------------------------------- */

static void test_before_init(void)
{
	const char *s;
	CUcontext ctx;
	int v;

	assert(cu.DriverGetVersion(&v) == CUDA_SUCCESS && v == 12040);
	assert(cu.GetErrorName(CUDA_ERROR_INVALID_CONTEXT, &s) == CUDA_SUCCESS);
	assert(!strcmp(s, "CUDA_ERROR_INVALID_CONTEXT"));
	assert(cu.GetErrorName((CUresult)12345, &s) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.DeviceGetCount(&v) == CUDA_ERROR_NOT_INITIALIZED);
	assert(cu.PrimaryCtxRetain(&ctx, 0) == CUDA_ERROR_NOT_INITIALIZED);
	assert(cu.Init(1) == CUDA_ERROR_INVALID_VALUE);
}

static void test_devices(void)
{
	CUmemAllocationProp prop = prop_for(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	char name[128];
	size_t bytes, g;
	CUdevice dev;
	int v;

	assert(cu.Init(0) == CUDA_SUCCESS);
	assert(cu.Init(0) == CUDA_SUCCESS);
	assert(cu.DeviceGetCount(&v) == CUDA_SUCCESS && v == 2);
	assert(cu.DeviceGet(&dev, 1) == CUDA_SUCCESS && dev == 1);
	assert(cu.DeviceGet(&dev, 2) == CUDA_ERROR_INVALID_DEVICE);
	assert(cu.DeviceGet(&dev, -1) == CUDA_ERROR_INVALID_DEVICE);
	assert(cu.DeviceGetName(name, sizeof(name), 1) == CUDA_SUCCESS);
	assert(!strcmp(name, "loaderd fake CUDA device 1 (host memory)"));
	assert(cu.DeviceGetName(name, sizeof(name), 7) == CUDA_ERROR_INVALID_DEVICE);
	assert(cu.DeviceTotalMem(&bytes, 0) == CUDA_SUCCESS && bytes == 16ull << 30);
	assert(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0) == CUDA_SUCCESS && v == 9);
	assert(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0) == CUDA_SUCCESS && v == 0);
	assert(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0) == CUDA_SUCCESS &&
	       v == 1);
	assert(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1) ==
	       CUDA_SUCCESS && v == 1);
	assert(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 2) == CUDA_ERROR_INVALID_DEVICE);
	assert(cu.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
	       g == GRAN);
	assert(cu.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS &&
	       g == GRAN);
	prop.location.id = 2;
	assert(cu.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
	       CUDA_ERROR_INVALID_DEVICE);
}

static void *thread_alloc(void *arg)
{
	CUdeviceptr d;
	CUcontext c = (CUcontext)1;

	(void)arg;
	/* a new thread has no current context */
	assert(cu.CtxGetCurrent(&c) == CUDA_SUCCESS && c == NULL);
	assert(cu.MemAlloc(&d, 4096) == CUDA_ERROR_INVALID_CONTEXT);
	return NULL;
}

static void test_copies(void)
{
	const size_t n = MiB + 100;
	uint8_t *buf = malloc(n), *back = malloc(n);
	CUcontext ctx, ctx2, c;
	CUdeviceptr d, d1, base;
	CUstream s;
	CUevent e;
	pthread_t t;
	size_t size;
	void *hole;
	int v;

	assert(buf && back);
	fill(buf, n);

	/* no current context */
	assert(cu.MemAlloc(&d, n) == CUDA_ERROR_INVALID_CONTEXT);
	assert(cu.StreamCreate(&s, 0) == CUDA_ERROR_INVALID_CONTEXT);
	assert(cu.EventCreate(&e, 0) == CUDA_ERROR_INVALID_CONTEXT);
	assert(cu.MemHostRegister(buf, n, 0) == CUDA_ERROR_INVALID_CONTEXT);
	assert(cu.CtxSynchronize() == CUDA_ERROR_INVALID_CONTEXT);
	assert(cu.CtxPopCurrent(&c) == CUDA_ERROR_INVALID_CONTEXT);
	assert(cu.PrimaryCtxRetain(&ctx, 2) == CUDA_ERROR_INVALID_DEVICE);
	assert(cu.PrimaryCtxRelease(0) == CUDA_ERROR_INVALID_CONTEXT);

	assert(cu.PrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
	assert(cu.PrimaryCtxRetain(&ctx2, 0) == CUDA_SUCCESS && ctx2 == ctx);
	assert(cu.CtxSetCurrent(ctx) == CUDA_SUCCESS);
	assert(cu.CtxGetCurrent(&c) == CUDA_SUCCESS && c == ctx);
	assert(cu.CtxSynchronize() == CUDA_SUCCESS);

	/* round trip, and the device pointer is host memory a test may read */
	assert(cu.MemAlloc(&d, 0) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemAlloc(&d, n) == CUDA_SUCCESS && d);
	assert(cu.MemcpyHtoD(d, buf, n) == CUDA_SUCCESS);
	assert(!memcmp((const void *)(uintptr_t)d, buf, n));
	memset(back, 0, n);
	assert(cu.MemcpyDtoH(back, d, n) == CUDA_SUCCESS);
	assert(!memcmp(back, buf, n));
	assert(cu.MemsetD8(d + 10, 0xee, 5) == CUDA_SUCCESS);
	assert(((uint8_t *)(uintptr_t)d)[9] == pattern(9) && ((uint8_t *)(uintptr_t)d)[10] == 0xee &&
	       ((uint8_t *)(uintptr_t)d)[14] == 0xee && ((uint8_t *)(uintptr_t)d)[15] == pattern(15));
	assert(cu.MemGetAddressRange(&base, &size, d + 77) == CUDA_SUCCESS && base == d && size == n);
	assert(cu.PointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d + 1) == CUDA_SUCCESS && v == 0);

	/* streams and events: all done at once */
	assert(cu.StreamCreate(&s, 2) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	assert(cu.EventCreate(&e, CU_EVENT_INTERPROCESS) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.EventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
	assert(cu.EventQuery(e) == CUDA_SUCCESS); /* never recorded */
	assert(cu.MemcpyHtoDAsync(d, buf + 1, n - 1, s) == CUDA_SUCCESS);
	assert(cu.EventRecord(e, s) == CUDA_SUCCESS);
	assert(cu.EventQuery(e) == CUDA_SUCCESS);
	assert(cu.EventSynchronize(e) == CUDA_SUCCESS);
	assert(cu.StreamQuery(s) == CUDA_SUCCESS);
	assert(cu.MemcpyDtoHAsync(back, d, n - 1, s) == CUDA_SUCCESS);
	assert(cu.StreamSynchronize(s) == CUDA_SUCCESS);
	assert(!memcmp(back, buf + 1, n - 1));
	assert(cu.MemcpyHtoDAsync(d, buf, n, NULL) == CUDA_SUCCESS);
	assert(cu.EventRecord(e, NULL) == CUDA_SUCCESS);
	assert(cu.StreamSynchronize(NULL) == CUDA_SUCCESS);
	assert(cu.MemcpyHtoDAsync(d, buf, n, (CUstream)buf) == CUDA_ERROR_INVALID_HANDLE);
	assert(cu.EventDestroy(e) == CUDA_SUCCESS);
	assert(cu.EventQuery(e) == CUDA_ERROR_INVALID_HANDLE);
	assert(cu.StreamDestroy(s) == CUDA_SUCCESS);
	assert(cu.StreamQuery(s) == CUDA_ERROR_INVALID_HANDLE);

	/* bad device pointers */
	assert(cu.MemcpyHtoD(d + n - 10, buf, 20) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemcpyHtoD((CUdeviceptr)(uintptr_t)back, buf, 20) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemcpyDtoH(back, 0, 20) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemcpyDtoH(back, d + n, 1) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemsetD8(d + n - 1, 0, 2) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemFree(d + 1) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)back) == CUDA_ERROR_NOT_FOUND);
	assert(cu.MemcpyDtoH(back, d + n - 1, 1) == CUDA_SUCCESS);

	/* host registration */
	assert(cu.MemHostRegister(buf, n, 0x100) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemHostRegister(buf, n, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS);
	assert(cu.MemHostRegister(buf + 5, 10, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	assert(cu.MemHostUnregister(buf + 1) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
	assert(cu.MemHostUnregister(buf) == CUDA_SUCCESS);
	assert(cu.MemHostUnregister(buf) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
	hole = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert(hole != MAP_FAILED);
	munmap(hole, 4096);
	assert(cu.MemHostRegister(hole, 4096, 0) == CUDA_ERROR_INVALID_VALUE);

	/* the current context is per thread, and a stack */
	assert(pthread_create(&t, NULL, thread_alloc, NULL) == 0);
	assert(pthread_join(t, NULL) == 0);
	assert(cu.CtxPopCurrent(&c) == CUDA_SUCCESS && c == ctx);
	assert(cu.MemcpyDtoH(back, d, 1) == CUDA_ERROR_INVALID_CONTEXT);
	assert(cu.PrimaryCtxRetain(&ctx2, 1) == CUDA_SUCCESS && ctx2 != ctx);
	assert(cu.CtxPushCurrent(ctx) == CUDA_SUCCESS);
	assert(cu.CtxPushCurrent(ctx2) == CUDA_SUCCESS);
	assert(cu.MemAlloc(&d1, 100) == CUDA_SUCCESS);
	assert(cu.PointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d1) == CUDA_SUCCESS && v == 1);
	assert(cu.CtxPopCurrent(&c) == CUDA_SUCCESS && c == ctx2);
	assert(cu.CtxGetCurrent(&c) == CUDA_SUCCESS && c == ctx);
	/* the last release of a primary context frees what it held */
	assert(cu.PrimaryCtxRelease(1) == CUDA_SUCCESS);
	assert(cu.MemcpyDtoH(back, d1, 1) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.PrimaryCtxRelease(1) == CUDA_ERROR_INVALID_CONTEXT);

	assert(cu.MemFree(d) == CUDA_SUCCESS);
	assert(cu.MemFree(d) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.PrimaryCtxRelease(0) == CUDA_SUCCESS); /* one retain left: still current and alive */
	free(buf);
	free(back);
}

static void test_ipc(void)
{
	const size_t n = 3 * MiB;
	char hex[2 * sizeof(CUipcMemHandle) + 1], out[512];
	uint8_t *buf = malloc(n);
	CUipcMemHandle h;
	CUdeviceptr d, d2, o;

	assert(buf);
	fill(buf, n);
	assert(cu.MemAlloc(&d, n) == CUDA_SUCCESS);
	assert(cu.MemcpyHtoD(d, buf, n) == CUDA_SUCCESS);
	assert(cu.IpcGetMemHandle(&h, (CUdeviceptr)(uintptr_t)buf) == CUDA_ERROR_INVALID_VALUE);
	/* a pointer inside the allocation: the handle names the allocation */
	assert(cu.IpcGetMemHandle(&h, d + 4096) == CUDA_SUCCESS);
	assert(cu.IpcOpenMemHandle(&o, h, 0) == CUDA_ERROR_INVALID_CONTEXT); /* own process */
	hex_encode(&h, sizeof(h), hex);
	assert(spawn("ipc-open", hex, "4096", NULL, -1, NULL, 0) == 0);
	memset(buf, 0, 16);
	assert(cu.MemcpyDtoH(buf, d, 16) == CUDA_SUCCESS);
	for (int i = 0; i < 16; i++)
		assert(buf[i] == 0xa5);

	/* a freed allocation's handle */
	assert(cu.MemAlloc(&d2, n) == CUDA_SUCCESS);
	assert(cu.IpcGetMemHandle(&h, d2) == CUDA_SUCCESS);
	assert(cu.MemFree(d2) == CUDA_SUCCESS);
	hex_encode(&h, sizeof(h), hex);
	assert(spawn("ipc-stale", hex, NULL, NULL, -1, NULL, 0) == 0);

	/* an exporter that has exited */
	assert(spawn("ipc-export", NULL, NULL, NULL, -1, out, sizeof(out)) == 0);
	hex_decode(out, &h, sizeof(h));
	assert(cu.IpcOpenMemHandle(&o, h, 0) == CUDA_ERROR_INVALID_HANDLE);
	memset(&h, 0, sizeof(h));
	assert(cu.IpcOpenMemHandle(&o, h, 0) == CUDA_ERROR_INVALID_VALUE);

	assert(cu.MemFree(d) == CUDA_SUCCESS);
	free(buf);
}

static void test_vmm(void)
{
	const size_t n = 2 * GRAN;
	CUmemAllocationProp prop = prop_for(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CUmemAccessDesc acc = { .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
	                        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUmemGenericAllocationHandle h, ha, hb, hx;
	uint8_t *buf = malloc(n), *back = malloc(n);
	char fd_s[16], size_s[32];
	CUdeviceptr va, vb;
	int fd;

	assert(buf && back);
	fill(buf, n);

	assert(cu.MemCreate(&h, GRAN + 4096, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
	prop.location.id = 5;
	assert(cu.MemCreate(&h, GRAN, &prop, 0) == CUDA_ERROR_INVALID_DEVICE);
	prop.location.id = 0;
	assert(cu.MemCreate(&h, n, &prop, 0) == CUDA_SUCCESS);
	assert(cu.MemAddressReserve(&va, n, 0, 0, 0) == CUDA_SUCCESS && va % GRAN == 0);
	assert(cu.MemMap(va + 4096, GRAN, 0, h, 0) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemMap(va, n, 0, h, 0) == CUDA_SUCCESS);
	assert(cu.MemMap(va, GRAN, 0, h, 0) == CUDA_ERROR_INVALID_VALUE); /* already mapped */
	/* mapped, not yet accessible */
	assert(cu.MemcpyHtoD(va, buf, 16) == CUDA_ERROR_INVALID_VALUE);
	acc.location.id = 9;
	assert(cu.MemSetAccess(va, n, &acc, 1) == CUDA_ERROR_INVALID_DEVICE);
	acc.location.id = 0;
	assert(cu.MemSetAccess(va, n, &acc, 1) == CUDA_SUCCESS);
	assert(cu.MemcpyHtoD(va, buf, n) == CUDA_SUCCESS);
	assert(cu.MemcpyHtoD(va + n - 1, buf, 2) == CUDA_ERROR_INVALID_VALUE);

	/* another process maps it from an exported fd */
	assert(cu.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_FABRIC, 0) == CUDA_ERROR_NOT_SUPPORTED);
	assert(cu.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
	assert(fd >= 0);
	snprintf(fd_s, sizeof(fd_s), "%d", fd);
	snprintf(size_s, sizeof(size_s), "%zu", n);
	assert(spawn("vmm-import", fd_s, size_s, NULL, fd, NULL, 0) == 0);
	close(fd);
	assert(cu.MemcpyDtoH(back, va, n) == CUDA_SUCCESS);
	for (int i = 0; i < 64; i++)
		assert(back[i] == 0x5a);
	check_pattern(back + 64, n - 64, 64);

	/* an fd that is not an exported allocation */
	fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	assert(fd >= 0);
	assert(cu.MemImportFromShareableHandle(&hx, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
	       CUDA_ERROR_INVALID_VALUE);
	close(fd);

	/* released while mapped: the memory stays until unmapped */
	assert(cu.MemAddressFree(va, n) == CUDA_ERROR_INVALID_VALUE); /* still mapped */
	assert(cu.MemRelease(h) == CUDA_SUCCESS);
	assert(cu.MemRelease(h) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemcpyDtoH(back, va, 16) == CUDA_SUCCESS);
	assert(cu.MemUnmap(va, GRAN) == CUDA_ERROR_INVALID_VALUE); /* half a mapping */
	assert(cu.MemUnmap(va, n) == CUDA_SUCCESS);
	assert(cu.MemcpyDtoH(back, va, 16) == CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemAddressFree(va, n) == CUDA_SUCCESS);
	assert(cu.MemAddressFree(va, n) == CUDA_ERROR_INVALID_VALUE);

	/* two allocations side by side in one reservation: one copy spans both */
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
	assert(cu.MemCreate(&ha, GRAN, &prop, 0) == CUDA_SUCCESS);
	assert(cu.MemCreate(&hb, GRAN, &prop, 0) == CUDA_SUCCESS);
	assert(cu.MemExportToShareableHandle(&fd, ha, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
	       CUDA_ERROR_INVALID_VALUE);
	assert(cu.MemAddressReserve(&vb, n, 4 * GRAN, 0, 0) == CUDA_SUCCESS && vb % (4 * GRAN) == 0);
	assert(cu.MemMap(vb, GRAN, 0, ha, 0) == CUDA_SUCCESS);
	assert(cu.MemMap(vb + GRAN, GRAN, 0, hb, 0) == CUDA_SUCCESS);
	assert(cu.MemSetAccess(vb, n, &acc, 1) == CUDA_SUCCESS);
	assert(cu.MemcpyHtoD(vb, buf, n) == CUDA_SUCCESS);
	memset(back, 0, n);
	assert(cu.MemcpyDtoH(back, vb, n) == CUDA_SUCCESS);
	assert(!memcmp(back, buf, n));
	assert(cu.MemUnmap(vb, n) == CUDA_SUCCESS);
	assert(cu.MemRelease(ha) == CUDA_SUCCESS);
	assert(cu.MemRelease(hb) == CUDA_SUCCESS);
	assert(cu.MemAddressFree(vb, n) == CUDA_SUCCESS);
	free(buf);
	free(back);
}

static void test_env(void)
{
	static const char *const no_device[] = { "FAKECUDA_DEVICES=0", NULL };
	static const char *const no_posix_fd[] = { "FAKECUDA_POSIX_FD=0", NULL };
	static const char *const no_vmm[] = { "FAKECUDA_VMM=0", NULL };

	assert(spawn("no-device", NULL, NULL, no_device, -1, NULL, 0) == 0);
	assert(spawn("no-posix-fd", NULL, NULL, no_posix_fd, -1, NULL, 0) == 0);
	assert(spawn("no-vmm", NULL, NULL, no_vmm, -1, NULL, 0) == 0);
}

/* A child forked after cuInit has no driver, as with libcuda. */
static void test_fork(void)
{
	int status;
	pid_t pid = fork();

	assert(pid >= 0);
	if (pid == 0) {
		int v;

		_exit(cu.DeviceGetCount(&v) == CUDA_ERROR_NOT_INITIALIZED && cu.Init(0) == CUDA_ERROR_NOT_INITIALIZED ?
		      0 : 1);
	}
	assert(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static int count_lines(const char *path, const char *name)
{
	char line[256];
	int n = 0;
	FILE *f = fopen(path, "r");

	assert(f);
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		n += !strcmp(line, name);
		assert(!strstr(line, "_v2"));
	}
	fclose(f);
	return n;
}

int main(int argc, char **argv)
{
	char log[] = "/tmp/test-fakecuda-log-XXXXXX";
	int fd;

	if (argc < 2) {
		fprintf(stderr, "usage: test-fakecuda LIB [ROLE ARGS...]\n");
		return 2;
	}
	lib_path = argv[1];
	if (argc >= 3) {
		open_lib();
		return role(argv[2], argc - 3, argv + 3);
	}

	/* before the library loads: FAKECUDA_LOG is read then; the rest at cuInit */
	fd = mkstemp(log);
	assert(fd >= 0);
	close(fd);
	setenv("FAKECUDA_LOG", log, 1);
	setenv("FAKECUDA_DEVICES", "2", 1);
	unsetenv("FAKECUDA_POSIX_FD");
	unsetenv("FAKECUDA_VMM");
	open_lib();

	test_before_init();
	test_devices();
	test_copies();
	test_ipc();
	test_vmm();
	test_env();
	test_fork();

	/* every call is logged, refused or not, from every process that loaded
	 * the library with FAKECUDA_LOG set: cuMemHostRegister 5 times here; the
	 * IPC opens 3 times here, 3 in ipc-open, once in ipc-stale */
	assert(count_lines(log, "cuMemHostRegister") == 5);
	assert(count_lines(log, "cuIpcOpenMemHandle") == 3 + 3 + 1);
	unlink(log);
	printf("fakecuda: ok\n");
	return 0;
}
