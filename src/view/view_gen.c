/* SPDX-License-Identifier: MIT */
/*
 * The view's tree, made from urdma's device as libibverbs reports it
 * (loaded here, not linked: a program that never looks needs none of it).
 * The files and their formats are the kernel's (drivers/infiniband/core/
 * sysfs.c), as rdma-core, UCX, Open MPI and hwloc parse them.
 */
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "view/view.h"

struct gen {
	int root;
	struct ibv_device **(*get_list)(int *);
	void (*free_list)(struct ibv_device **);
	struct ibv_context *(*open_dev)(struct ibv_device *);
	int (*close_dev)(struct ibv_context *);
	int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
	int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
	int (*query_gid_ex)(struct ibv_context *, uint32_t, uint32_t,
			    struct ibv_gid_entry *, uint32_t, size_t);
};

/* mkdir -p of rel (under the root). */
static int gen_dir(struct gen *g, const char *rel)
{
	char p[512], *s;

	snprintf(p, sizeof(p), "%s", rel);
	for (s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdirat(g->root, p, 0755) && errno != EEXIST)
			return -1;
		*s = '/';
	}
	return mkdirat(g->root, p, 0755) && errno != EEXIST ? -1 : 0;
}

/* A file rel (its directory made) holding the formatted line. */
static int gen_file(struct gen *g, const char *rel, const char *fmt, ...)
{
	char buf[1024], dir[512], *slash;
	va_list ap;
	int fd, n;

	snprintf(dir, sizeof(dir), "%s", rel);
	slash = strrchr(dir, '/');
	if (slash) {
		*slash = 0;
		if (gen_dir(g, dir))
			return -1;
	}
	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(buf))
		return -1;
	fd = openat(g->root, rel, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		    0444);
	if (fd < 0)
		return -1;
	n = write(fd, buf, (size_t)n) == n ? 0 : -1;
	close(fd);
	return n;
}

static int gen_link(struct gen *g, const char *rel, const char *target)
{
	char dir[512], *slash;

	snprintf(dir, sizeof(dir), "%s", rel);
	slash = strrchr(dir, '/');
	if (slash) {
		*slash = 0;
		if (gen_dir(g, dir))
			return -1;
	}
	return symlinkat(target, g->root, rel);
}

static const char *port_state(int s)
{
	static const char *const n[] = { "NOP", "DOWN", "INIT", "ARMED",
					 "ACTIVE", "ACTIVE_DEFER" };
	return s >= 0 && s <= 5 ? n[s] : "NOP";
}

/* The kernel's rate string (drivers/infiniband/core/sysfs.c) from the
 * speed and width codes: per-lane rates in tenths of Gb/s. */
static void port_rate(const struct ibv_port_attr *pa, char *buf, size_t len)
{
	static const struct { int code, tenths; const char *name; } sp[] = {
		{ 1, 25, "" }, { 2, 50, " DDR" }, { 4, 100, " QDR" },
		{ 8, 100, " FDR10" }, { 16, 140, " FDR" }, { 32, 250, " EDR" },
		{ 64, 500, " HDR" }, { 128, 1000, " NDR" },
	};
	static const int lanes[] = { 0, 1, 4, 0, 8, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 2 };
	int w = pa->active_width < 17 ? lanes[pa->active_width] : 0, r;
	size_t i;

	for (i = 0; i < sizeof(sp) / sizeof(*sp); i++)
		if (sp[i].code == pa->active_speed)
			break;
	if (i == sizeof(sp) / sizeof(*sp) || !w) {
		snprintf(buf, len, "10 Gb/sec (4X)");
		return;
	}
	r = sp[i].tenths * w;
	snprintf(buf, len, "%d%s Gb/sec (%dX%s)", r / 10, r % 10 ? ".5" : "", w,
		 sp[i].name);
}

static void guid_str(__be64 guid, char *buf, size_t len)
{
	uint64_t g = be64toh(guid);

	snprintf(buf, len, "%04x:%04x:%04x:%04x", (unsigned)(g >> 48) & 0xffff,
		 (unsigned)(g >> 32) & 0xffff, (unsigned)(g >> 16) & 0xffff,
		 (unsigned)g & 0xffff);
}

static int gen_port(struct gen *g, struct ibv_context *ctx, const char *dev,
		    uint8_t port)
{
	struct ibv_port_attr pa;
	char p[256], v[64];

	/* (the exported ibv_query_port fills the compat prefix of it) */
	memset(&pa, 0, sizeof(pa));
	if (g->query_port(ctx, port, &pa))
		return -1;
#define PF(name, ...) do { \
		snprintf(p, sizeof(p), "sys/class/infiniband/%s/ports/%u/%s", dev, port, name); \
		if (gen_file(g, p, __VA_ARGS__)) \
			return -1; \
	} while (0)
	PF("state", "%d: %s\n", pa.state, port_state(pa.state));
	PF("phys_state", "%s\n", pa.state == IBV_PORT_ACTIVE ? "5: LinkUp" : "3: Disabled");
	PF("link_layer", "%s\n", pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" :
				  "InfiniBand");
	port_rate(&pa, v, sizeof(v));
	PF("rate", "%s\n", v);
	PF("lid", "0x%x\n", pa.lid);
	PF("sm_lid", "0x%x\n", pa.sm_lid);
	PF("sm_sl", "%u\n", pa.sm_sl);
	PF("lid_mask_count", "%u\n", pa.lmc);
	PF("cap_mask", "0x%08x\n", pa.port_cap_flags);
	PF("pkeys/0", "0xffff\n");
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		struct ibv_gid_entry e;
		const uint8_t *r = e.gid.raw;
		char name[IF_NAMESIZE] = "";

		if (g->query_gid_ex(ctx, port, (uint32_t)i, &e, 0, sizeof(e)))
			continue;
		snprintf(v, sizeof(v), "gids/%d", i);
		PF(v, "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x\n",
		   r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11],
		   r[12], r[13], r[14], r[15]);
		snprintf(v, sizeof(v), "gid_attrs/types/%d", i);
		PF(v, "%s\n", e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : "IB/RoCE v1");
		if (e.ndev_ifindex && if_indextoname(e.ndev_ifindex, name)) {
			snprintf(v, sizeof(v), "gid_attrs/ndevs/%d", i);
			PF(v, "%s\n", name);
			snprintf(p, sizeof(p), "sys/class/infiniband/%s/device/net/%s/ifindex",
				 dev, name);
			if (faccessat(g->root, p, F_OK, AT_SYMLINK_NOFOLLOW) &&
			    gen_file(g, p, "%u\n", e.ndev_ifindex))
				return -1;
		}
	}
#undef PF
	return 0;
}

static int gen_device(struct gen *g, struct ibv_device *d, int idx)
{
	struct ibv_device_attr a;
	struct ibv_context *ctx = g->open_dev(d);
	char p[256], guid[32];
	const char *dev = d->name;
	long ncpu = sysconf(_SC_NPROCESSORS_CONF);
	char cpus[64 * 9 + 1];
	int ret = -1;

	if (!ctx)
		return -1;
	if (g->query_device(ctx, &a))
		goto out;
#define DF(name, ...) do { \
		snprintf(p, sizeof(p), "sys/class/infiniband/%s/%s", dev, name); \
		if (gen_file(g, p, __VA_ARGS__)) \
			goto out; \
	} while (0)
	DF("node_type", "%d: %s\n", d->node_type == IBV_NODE_RNIC ? 4 : 1,
	   d->node_type == IBV_NODE_RNIC ? "RNIC" : "CA");
	guid_str(a.node_guid, guid, sizeof(guid));
	DF("node_guid", "%s\n", guid);
	guid_str(a.sys_image_guid, guid, sizeof(guid));
	DF("sys_image_guid", "%s\n", guid);
	DF("fw_ver", "%s\n", a.fw_ver);
	DF("hw_rev", "0x%x\n", a.hw_ver);
	DF("hca_type", "urdma\n");
	DF("board_id", "urdma\n");
	DF("node_desc", "urdma %s\n", dev);
	DF("device/numa_node", "-1\n");
	DF("device/vendor", "0x%04x\n", a.vendor_id & 0xffff);
	DF("device/device", "0x%04x\n", a.vendor_part_id & 0xffff);
	/* every CPU is as near as any: 32-bit words, the highest first */
	{
		long nw = ((ncpu > 0 ? ncpu : 1) + 31) / 32;
		size_t off = 0;

		if (nw > 64)
			nw = 64;
		for (long w = nw - 1; w >= 0; w--) {
			long in = (ncpu > 0 ? ncpu : 1) - 32 * w;
			unsigned v = in >= 32 ? 0xffffffffu : (1u << in) - 1;

			off += (size_t)snprintf(cpus + off, sizeof(cpus) - off, "%s%08x",
						w == nw - 1 ? "" : ",", v);
		}
	}
	DF("device/local_cpus", "%s\n", cpus);
	for (uint8_t port = 1; port <= a.phys_port_cnt; port++)
		if (gen_port(g, ctx, dev, port))
			goto out;
#undef DF
	/* the uverbs class and device node (dev_name is ours: uverbs-<dev>) */
	snprintf(p, sizeof(p), "sys/class/infiniband_verbs/%s/ibdev", d->dev_name);
	if (gen_file(g, p, "%s\n", dev))
		goto out;
	snprintf(p, sizeof(p), "sys/class/infiniband_verbs/%s/abi_version", d->dev_name);
	if (gen_file(g, p, "1\n"))
		goto out;
	snprintf(p, sizeof(p), "sys/class/infiniband_verbs/%s/dev", d->dev_name);
	if (gen_file(g, p, "231:%d\n", 192 + idx))
		goto out;
	snprintf(p, sizeof(p), "dev/infiniband/%s", d->dev_name);
	if (gen_link(g, p, "/dev/null"))
		goto out;
	ret = 0;
out:
	g->close_dev(ctx);
	return ret;
}

int view_generate(int rootfd, const char *verbs)
{
	void *lib = dlopen(verbs, RTLD_NOW | RTLD_LOCAL);
	struct gen g = { .root = rootfd };
	struct ibv_device **list;
	int n = 0, ret = -1;

	if (!lib)
		return -1;
	g.get_list = (struct ibv_device **(*)(int *))dlsym(lib, "ibv_get_device_list");
	g.free_list = (void (*)(struct ibv_device **))dlsym(lib, "ibv_free_device_list");
	g.open_dev = (struct ibv_context *(*)(struct ibv_device *))dlsym(lib, "ibv_open_device");
	g.close_dev = (int (*)(struct ibv_context *))dlsym(lib, "ibv_close_device");
	g.query_device = (int (*)(struct ibv_context *, struct ibv_device_attr *))
		dlsym(lib, "ibv_query_device");
	g.query_port = (int (*)(struct ibv_context *, uint8_t, struct ibv_port_attr *))
		dlsym(lib, "ibv_query_port");
	g.query_gid_ex = (int (*)(struct ibv_context *, uint32_t, uint32_t,
				  struct ibv_gid_entry *, uint32_t, size_t))
		dlsym(lib, "_ibv_query_gid_ex");
	if (!g.get_list || !g.free_list || !g.open_dev || !g.close_dev ||
	    !g.query_device || !g.query_port || !g.query_gid_ex)
		goto out;
	list = g.get_list(&n);
	if (!list)
		goto out;
	ret = n > 0 ? 0 : -1;
	for (int i = 0; i < n && !ret; i++)
		ret = gen_device(&g, list[i], i);
	g.free_list(list);
	if (!ret)
		ret = gen_file(&g, "sys/class/infiniband_verbs/abi_version", "6\n") ||
		      gen_link(&g, "dev/infiniband/rdma_cm", "/dev/null") ? -1 : 0;
out:
	/* (libibverbs stays loaded: the program may use it) */
	return ret;
}
