/*
 * Test infrastructure, not product code: a user-space stand-in for libdrm_amdgpu.so.1 (and the
 * libdrm.so.2 functions the AMD tools look up through it), for running librocm_smi64 6.x and
 * libamd_smi on a simulated sysfs tree where /dev/dri/renderD* are plain files.
 *
 * The tools dlopen libdrm_amdgpu and look up drmGetVersion, drmFreeVersion, drmGetDevice,
 * drmFreeDevice, drmCommandWrite, amdgpu_device_initialize, amdgpu_device_deinitialize and
 * amdgpu_get_marketing_name. No file can answer the DRM ioctls behind them, so this library
 * answers them from the tree instead: the node an fd was opened on (/dev/dri/renderD128) names
 * /sys/class/drm/renderD128/device, whose files the simulator wrote as the driver does.
 * Compiled against the real libdrm headers (libdrm-dev in the sid chroot) so every struct has
 * libdrm's layout. A query it cannot answer from the tree fails with -EINVAL, as a kernel without
 * that query would; set FAKE_LIBDRM_TRACE=1 to log every call on stderr.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xf86drm.h"
#include "amdgpu.h"
#include "amdgpu_drm.h"

struct amdgpu_device {
	int fd;
	char *marketing_name;
};

static void trace(const char *fmt, ...)
{
	const char *on = getenv("FAKE_LIBDRM_TRACE");
	va_list ap;

	if (!on || !*on || *on == '0')
		return;
	va_start(ap, fmt);
	fputs("fake_libdrm: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* "/sys/class/drm/renderD128" for an fd opened on /dev/dri/renderD128; 0 on success. */
static int node_dir(int fd, char *out, size_t size)
{
	char link[64], target[256];
	ssize_t n;
	const char *base;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n < 0)
		return -1;
	target[n] = '\0';
	if (strncmp(target, "/dev/dri/", 9) != 0)
		return -1;
	base = target + 9;
	snprintf(out, size, "/sys/class/drm/%s", base);
	return access(out, F_OK) == 0 ? 0 : -1;
}

/* First line of /sys/class/drm/<node>/device/<name>, newline stripped; 0 on success. */
static int read_attr(int fd, const char *name, char *out, size_t size)
{
	char dir[512], path[1024];
	FILE *f;

	if (node_dir(fd, dir, sizeof(dir)) != 0)
		return -1;
	snprintf(path, sizeof(path), "%s/device/%s", dir, name);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (!fgets(out, (int)size, f)) {
		fclose(f);
		return -1;
	}
	fclose(f);
	out[strcspn(out, "\n")] = '\0';
	return 0;
}

static int read_u64(int fd, const char *name, __u64 *value)
{
	char text[64], *end;

	if (read_attr(fd, name, text, sizeof(text)) != 0)
		return -1;
	errno = 0;
	*value = strtoull(text, &end, 0);
	return (errno || end == text) ? -1 : 0;
}

/* Highest "N: 1700Mhz" level of a pp_dpm_* file, in kHz (what DEV_INFO reports). */
static uint64_t max_dpm_khz(int fd, const char *name)
{
	char dir[512], path[1024], line[128];
	uint64_t best = 0;
	FILE *f;

	if (node_dir(fd, dir, sizeof(dir)) != 0)
		return 0;
	snprintf(path, sizeof(path), "%s/device/%s", dir, name);
	f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		const char *colon = strchr(line, ':');
		unsigned long long mhz;

		if (colon && sscanf(colon + 1, " %lluMhz", &mhz) == 1 && mhz * 1000 > best)
			best = mhz * 1000;
	}
	fclose(f);
	return best;
}

/* PCI address: the last component of the resolved device link, e.g. ".../0000:c1:00.0". */
static int pci_address(int fd, drmPciBusInfo *bus)
{
	char dir[512], path[1024], target[PATH_MAX];
	unsigned domain, b, d, fn;
	const char *base;

	if (node_dir(fd, dir, sizeof(dir)) != 0)
		return -1;
	snprintf(path, sizeof(path), "%s/device", dir);
	if (!realpath(path, target))
		return -1;
	base = strrchr(target, '/');
	base = base ? base + 1 : target;
	if (sscanf(base, "%x:%x:%x.%x", &domain, &b, &d, &fn) != 4)
		return -1;
	bus->domain = (uint16_t)domain;
	bus->bus = (uint8_t)b;
	bus->dev = (uint8_t)d;
	bus->func = (uint8_t)fn;
	return 0;
}

static char *dup_string(const char *text, int *len)
{
	char *copy = strdup(text);

	if (len)
		*len = (int)strlen(text);
	return copy;
}

drmVersionPtr drmGetVersion(int fd)
{
	char dir[512];
	drmVersionPtr version;

	trace("drmGetVersion(%d)", fd);
	if (node_dir(fd, dir, sizeof(dir)) != 0)
		return NULL;
	version = calloc(1, sizeof(*version));
	if (!version)
		return NULL;
	/* DRM interface 3.x is what every amdgpu kernel since 4.x reports; the tools check the name. */
	version->version_major = 3;
	version->version_minor = 57;
	version->version_patchlevel = 0;
	version->name = dup_string("amdgpu", &version->name_len);
	version->date = dup_string("20150101", &version->date_len);
	version->desc = dup_string("AMD GPU", &version->desc_len);
	return version;
}

void drmFreeVersion(drmVersionPtr version)
{
	if (!version)
		return;
	free(version->name);
	free(version->date);
	free(version->desc);
	free(version);
}

int drmGetDevice(int fd, drmDevicePtr *device)
{
	char dir[512];
	drmDevicePtr dev;
	drmPciBusInfoPtr bus;
	drmPciDeviceInfoPtr info;
	__u64 value;

	trace("drmGetDevice(%d)", fd);
	if (!device || node_dir(fd, dir, sizeof(dir)) != 0)
		return -EINVAL;
	dev = calloc(1, sizeof(*dev));
	bus = calloc(1, sizeof(*bus));
	info = calloc(1, sizeof(*info));
	if (!dev || !bus || !info || pci_address(fd, bus) != 0) {
		free(dev);
		free(bus);
		free(info);
		return -ENODEV;
	}
	dev->nodes = calloc(DRM_NODE_MAX, sizeof(char *));
	if (dev->nodes) {
		const char *name = strrchr(dir, '/') + 1;
		char path[600];

		snprintf(path, sizeof(path), "/dev/dri/%s", name);
		dev->nodes[DRM_NODE_RENDER] = strdup(path);
		dev->available_nodes = 1 << DRM_NODE_RENDER;
	}
	dev->bustype = DRM_BUS_PCI;
	if (read_u64(fd, "vendor", &value) == 0)
		info->vendor_id = (uint16_t)value;
	if (read_u64(fd, "device", &value) == 0)
		info->device_id = (uint16_t)value;
	if (read_u64(fd, "subsystem_vendor", &value) == 0)
		info->subvendor_id = (uint16_t)value;
	if (read_u64(fd, "subsystem_device", &value) == 0)
		info->subdevice_id = (uint16_t)value;
	if (read_u64(fd, "revision", &value) == 0)
		info->revision_id = (uint8_t)value;
	dev->businfo.pci = bus;
	dev->deviceinfo.pci = info;
	*device = dev;
	return 0;
}

int drmGetDevice2(int fd, uint32_t flags, drmDevicePtr *device)
{
	(void)flags;
	return drmGetDevice(fd, device);
}

void drmFreeDevice(drmDevicePtr *device)
{
	int i;

	if (!device || !*device)
		return;
	if ((*device)->nodes) {
		for (i = 0; i < DRM_NODE_MAX; i++)
			free((*device)->nodes[i]);
		free((*device)->nodes);
	}
	free((*device)->businfo.pci);
	free((*device)->deviceinfo.pci);
	free(*device);
	*device = NULL;
}

static int copy_out(const struct drm_amdgpu_info *request, const void *value, size_t size)
{
	size_t n = request->return_size < size ? request->return_size : size;

	if (!request->return_pointer)
		return -EINVAL;
	memcpy((void *)(uintptr_t)request->return_pointer, value, n);
	return 0;
}

static int info_u64(int fd, const struct drm_amdgpu_info *request, const char *attr)
{
	__u64 value;

	if (read_u64(fd, attr, &value) != 0)
		return -EINVAL;
	return copy_out(request, &value, sizeof(value));
}

static int info_vram_gtt(int fd, const struct drm_amdgpu_info *request)
{
	struct drm_amdgpu_info_vram_gtt out;

	memset(&out, 0, sizeof(out));
	if (read_u64(fd, "mem_info_vram_total", &out.vram_size) != 0 ||
	    read_u64(fd, "mem_info_vis_vram_total", &out.vram_cpu_accessible_size) != 0 ||
	    read_u64(fd, "mem_info_gtt_total", &out.gtt_size) != 0)
		return -EINVAL;
	return copy_out(request, &out, sizeof(out));
}

static int heap(int fd, struct drm_amdgpu_heap_info *out, const char *total, const char *used)
{
	if (read_u64(fd, total, &out->total_heap_size) != 0 || read_u64(fd, used, &out->heap_usage) != 0)
		return -1;
	out->usable_heap_size = out->total_heap_size;
	out->max_allocation = out->total_heap_size;
	return 0;
}

static int info_memory(int fd, const struct drm_amdgpu_info *request)
{
	struct drm_amdgpu_memory_info out;

	memset(&out, 0, sizeof(out));
	if (heap(fd, &out.vram, "mem_info_vram_total", "mem_info_vram_used") != 0 ||
	    heap(fd, &out.cpu_accessible_vram, "mem_info_vis_vram_total", "mem_info_vis_vram_used") != 0 ||
	    heap(fd, &out.gtt, "mem_info_gtt_total", "mem_info_gtt_used") != 0)
		return -EINVAL;
	return copy_out(request, &out, sizeof(out));
}

static int info_dev(int fd, const struct drm_amdgpu_info *request)
{
	struct drm_amdgpu_info_device out;
	__u64 value;

	memset(&out, 0, sizeof(out));
	if (read_u64(fd, "device", &value) != 0)
		return -EINVAL;
	out.device_id = (uint32_t)value;
	if (read_u64(fd, "revision", &value) == 0)
		out.pci_rev = (uint32_t)value;
	out.family = AMDGPU_FAMILY_AI; /* every Instinct from MI100 to MI300 is a gfx9 part */
	out.max_engine_clock = max_dpm_khz(fd, "pp_dpm_sclk");
	out.max_memory_clock = max_dpm_khz(fd, "pp_dpm_mclk");
	out.vram_type = AMDGPU_VRAM_TYPE_HBM;
	return copy_out(request, &out, sizeof(out));
}

static int info_vbios(int fd, const struct drm_amdgpu_info *request)
{
	struct drm_amdgpu_info_vbios out;
	char text[64];

	if (request->vbios_info.type != AMDGPU_INFO_VBIOS_INFO)
		return -EINVAL;
	memset(&out, 0, sizeof(out));
	/* sysfs vbios_version is the part number the kernel also puts in vbios_pn */
	if (read_attr(fd, "vbios_version", text, sizeof(text)) != 0)
		return -EINVAL;
	snprintf((char *)out.vbios_pn, sizeof(out.vbios_pn), "%s", text);
	return copy_out(request, &out, sizeof(out));
}

int drmCommandWrite(int fd, unsigned long index, void *data, unsigned long size)
{
	const struct drm_amdgpu_info *request = data;
	int rc;

	if (index != DRM_AMDGPU_INFO || !data || size < sizeof(*request)) {
		trace("drmCommandWrite(%d, %lu) -> -EINVAL (not AMDGPU_INFO)", fd, index);
		return -EINVAL;
	}
	switch (request->query) {
	case AMDGPU_INFO_VRAM_USAGE:
		rc = info_u64(fd, request, "mem_info_vram_used");
		break;
	case AMDGPU_INFO_VIS_VRAM_USAGE:
		rc = info_u64(fd, request, "mem_info_vis_vram_used");
		break;
	case AMDGPU_INFO_GTT_USAGE:
		rc = info_u64(fd, request, "mem_info_gtt_used");
		break;
	case AMDGPU_INFO_VRAM_GTT:
		rc = info_vram_gtt(fd, request);
		break;
	case AMDGPU_INFO_MEMORY:
		rc = info_memory(fd, request);
		break;
	case AMDGPU_INFO_DEV_INFO:
		rc = info_dev(fd, request);
		break;
	case AMDGPU_INFO_VBIOS:
		rc = info_vbios(fd, request);
		break;
	default:
		rc = -EINVAL;
	}
	trace("drmCommandWrite(%d, AMDGPU_INFO query 0x%x size %u) -> %d", fd, request->query,
	      request->return_size, rc);
	return rc;
}

/* Marketing name as libdrm finds it: amdgpu.ids, "device_id, revision_id, name" lines. */
static char *marketing_name(int fd)
{
	static const char *const tables[] = {"/usr/share/libdrm/amdgpu.ids", "/opt/amdgpu/share/libdrm/amdgpu.ids"};
	__u64 device, revision;
	char line[256];
	size_t i;

	if (read_u64(fd, "device", &device) != 0 || read_u64(fd, "revision", &revision) != 0)
		return NULL;
	for (i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
		FILE *f = fopen(tables[i], "r");

		if (!f)
			continue;
		while (fgets(line, sizeof(line), f)) {
			unsigned id, rev;
			int consumed = 0;

			if (line[0] == '#' || sscanf(line, "%x, %x, %n", &id, &rev, &consumed) < 2 || !consumed)
				continue;
			if (id == device && rev == revision) {
				fclose(f);
				line[strcspn(line, "\n")] = '\0';
				return strdup(line + consumed);
			}
		}
		fclose(f);
	}
	return NULL;
}

int amdgpu_device_initialize(int fd, uint32_t *major, uint32_t *minor, amdgpu_device_handle *handle)
{
	char dir[512];
	struct amdgpu_device *dev;

	trace("amdgpu_device_initialize(%d)", fd);
	if (!handle || node_dir(fd, dir, sizeof(dir)) != 0)
		return -EINVAL;
	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return -ENOMEM;
	dev->fd = fd;
	dev->marketing_name = marketing_name(fd);
	if (major)
		*major = 3;
	if (minor)
		*minor = 57;
	*handle = dev;
	return 0;
}

int amdgpu_device_initialize2(int fd, bool deduplicate, uint32_t *major, uint32_t *minor,
			      amdgpu_device_handle *handle)
{
	(void)deduplicate;
	return amdgpu_device_initialize(fd, major, minor, handle);
}

int amdgpu_device_deinitialize(amdgpu_device_handle dev)
{
	if (!dev)
		return -EINVAL;
	free(dev->marketing_name);
	free(dev);
	return 0;
}

int amdgpu_device_get_fd(amdgpu_device_handle dev)
{
	return dev ? dev->fd : -EINVAL;
}

const char *amdgpu_get_marketing_name(amdgpu_device_handle dev)
{
	trace("amdgpu_get_marketing_name -> %s", dev && dev->marketing_name ? dev->marketing_name : "(null)");
	return dev ? dev->marketing_name : NULL;
}
