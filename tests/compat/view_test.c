/* SPDX-License-Identifier: MIT */
/*
 * The device view (liburdma_view.so, preloaded by `urdma run`): run as
 * `urdma run view_test`.  /dev/infiniband/<dev_name> is a character device
 * anyone may open; /sys/class/infiniband/<dev> holds what libibverbs says
 * (node GUID, port state and link layer, every GID with its type and
 * netdev) in the kernel's formats; the uverbs class names the device;
 * realpath and readlink answer as on a real system; other paths are the
 * real ones; a child of fork() has its own view and the parent's stays;
 * URDMA_VIEW=0 (in a child that execs) turns it off.
 */
#include "harness.h"

#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

/* The first line of path, without its newline ("" if unreadable). */
static const char *line(const char *path)
{
	static char buf[256];
	FILE *f = fopen(path, "r");

	buf[0] = 0;
	if (!f)
		return buf;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	buf[strcspn(buf, "\n")] = 0;
	return buf;
}

/* Whether the host directory holds a view tree of process pid. */
static bool has_tree(const char *host, pid_t pid)
{
	char pre[32];
	DIR *hd = opendir(host);
	struct dirent *he;
	bool found = false;

	REQUIRE(hd, "opendir %s", host);
	snprintf(pre, sizeof(pre), "view-%d-", (int)pid);
	while ((he = readdir(hd)))
		found |= !strncmp(he->d_name, pre, strlen(pre));
	closedir(hd);
	return found;
}

static void view(void *arg)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *ctx;
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	char p[PATH_MAX], want[128], *rp;
	const char *dev;
	struct stat st;
	struct dirent *e;
	DIR *d;
	bool seen = false;
	uint64_t g;

	(void)arg;
	REQUIRE(l && l[0], "a device");
	dev = ibv_get_device_name(l[0]);
	ctx = ibv_open_device(l[0]);
	REQUIRE(ctx && !ibv_query_device(ctx, &da) && !ibv_query_port(ctx, 1, &pa),
		"open and query");

	/* the device node UCX looks for */
	snprintf(p, sizeof(p), "/dev/infiniband/%s", l[0]->dev_name);
	CHECK(!stat(p, &st) && S_ISCHR(st.st_mode), "%s: not a character device (%s)", p,
	      strerror(errno));
	CHECK(!access(p, R_OK | W_OK), "%s: not read-write", p);
	CHECK(!stat("/dev/infiniband/rdma_cm", &st) && S_ISCHR(st.st_mode), "rdma_cm");
	{
		char t[64];
		ssize_t n = readlink(p, t, sizeof(t) - 1);

		CHECK(n == 9 && !memcmp(t, "/dev/null", 9), "readlink %s: %zd", p, n);
	}

	/* the class directory Open MPI checks, listing our device */
	d = opendir("/sys/class/infiniband");
	REQUIRE(d, "opendir /sys/class/infiniband: %s", strerror(errno));
	while ((e = readdir(d)))
		seen |= !strcmp(e->d_name, dev);
	closedir(d);
	CHECK(seen, "%s is not in /sys/class/infiniband", dev);

	/* node and port files, in the kernel's formats */
	g = be64toh(da.node_guid);
	snprintf(want, sizeof(want), "%04x:%04x:%04x:%04x", (unsigned)(g >> 48) & 0xffff,
		 (unsigned)(g >> 32) & 0xffff, (unsigned)(g >> 16) & 0xffff,
		 (unsigned)g & 0xffff);
	snprintf(p, sizeof(p), "/sys/class/infiniband/%s/node_guid", dev);
	CHECK(!strcmp(line(p), want), "node_guid %s, not %s", line(p), want);
	snprintf(p, sizeof(p), "/sys/class/infiniband/%s/node_type", dev);
	CHECK(!strcmp(line(p), "1: CA"), "node_type '%s'", line(p));
	snprintf(p, sizeof(p), "/sys/class/infiniband/%s/ports/1/state", dev);
	CHECK(!strcmp(line(p), "4: ACTIVE"), "state '%s'", line(p));
	snprintf(p, sizeof(p), "/sys/class/infiniband/%s/ports/1/link_layer", dev);
	CHECK(!strcmp(line(p), "Ethernet"), "link_layer '%s'", line(p));
	snprintf(p, sizeof(p), "/sys/class/infiniband/%s/device/numa_node", dev);
	CHECK(!strcmp(line(p), "-1"), "numa_node '%s'", line(p));
	CHECK(pa.gid_tbl_len > 0, "no GIDs");
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		struct ibv_gid_entry ge;
		const uint8_t *r = ge.gid.raw;
		char name[IF_NAMESIZE];

		REQUIRE(!ibv_query_gid_ex(ctx, 1, (uint32_t)i, &ge, 0), "gid %d", i);
		snprintf(want, sizeof(want),
			 "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
			 r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10],
			 r[11], r[12], r[13], r[14], r[15]);
		snprintf(p, sizeof(p), "/sys/class/infiniband/%s/ports/1/gids/%d", dev, i);
		CHECK(!strcmp(line(p), want), "gids/%d '%s', not %s", i, line(p), want);
		snprintf(p, sizeof(p), "/sys/class/infiniband/%s/ports/1/gid_attrs/types/%d",
			 dev, i);
		CHECK(!strcmp(line(p), ge.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" :
					"IB/RoCE v1"), "types/%d '%s'", i, line(p));
		if (ge.ndev_ifindex && if_indextoname(ge.ndev_ifindex, name)) {
			snprintf(p, sizeof(p),
				 "/sys/class/infiniband/%s/ports/1/gid_attrs/ndevs/%d", dev, i);
			CHECK(!strcmp(line(p), name), "ndevs/%d '%s', not %s", i, line(p), name);
			snprintf(p, sizeof(p), "/sys/class/infiniband/%s/device/net/%s", dev, name);
			CHECK(!stat(p, &st) && S_ISDIR(st.st_mode), "no %s", p);
		}
	}

	/* the uverbs class */
	snprintf(p, sizeof(p), "/sys/class/infiniband_verbs/%s/ibdev", l[0]->dev_name);
	CHECK(!strcmp(line(p), dev), "ibdev '%s'", line(p));
	CHECK(!strcmp(line("/sys/class/infiniband_verbs/abi_version"), "6"), "abi_version");

	/* realpath gives the path asked, not where the view keeps it */
	snprintf(p, sizeof(p), "/sys/class/infiniband/%s", dev);
	rp = realpath(p, NULL);
	CHECK(rp && !strcmp(rp, p), "realpath %s: %s", p, rp ? rp : strerror(errno));
	free(rp);
	/* other paths are the real ones */
	CHECK(!stat("/sys/class/net/lo", &st), "/sys/class/net/lo");
	errno = 0;
	CHECK(stat("/sys/class/infinibandX", &st) && errno == ENOENT, "infinibandX");
	{
		int fd = open("/sys/class/infiniband/nosuch", O_RDONLY);

		CHECK(fd < 0 && errno == ENOENT, "open of a file the view has not");
	}

	const char *env = getenv("URDMA_SHM_DIR");
	char host[PATH_MAX / 2];

	snprintf(host, sizeof(host), "%s", env && *env ? env : "");
	if (!host[0])
		snprintf(host, sizeof(host), "/dev/shm/urdma-%u", (unsigned)geteuid());
	/* a child of fork() makes its own view (2: it saw one, but not its
	 * own tree); its exit removes that, and the parent's stays */
	{
		pid_t pid = fork();
		int status;

		REQUIRE(pid >= 0, "fork");
		if (!pid) {
			snprintf(p, sizeof(p), "/sys/class/infiniband/%s/node_guid", dev);
			if (strlen(line(p)) != 19)
				exit(1);
			exit(has_tree(host, getpid()) ? 0 : 2);
		}
		REQUIRE(waitpid(pid, &status, 0) == pid, "waitpid");
		CHECK(WIFEXITED(status) && !WEXITSTATUS(status),
		      "the child saw no view of its own (exit status %d)", WEXITSTATUS(status));
		snprintf(p, sizeof(p), "/sys/class/infiniband/%s/node_guid", dev);
		CHECK(strlen(line(p)) == 19, "the parent's view went with the child");
		CHECK(has_tree(host, getpid()), "the parent's tree went with the child");
	}
	/* a process's tree goes when it exits, and a dead one's is swept */
	{
		char dead[PATH_MAX];
		pid_t pid = fork(), pid2;
		int status;

		REQUIRE(pid >= 0, "fork");
		if (!pid) {
			snprintf(p, sizeof(p), "/sys/class/infiniband/%s/node_guid", dev);
			exit(strlen(line(p)) == 19 ? 0 : 1);
		}
		REQUIRE(waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
			!WEXITSTATUS(status), "child");
		CHECK(!has_tree(host, pid), "the tree of process %d stays after it", (int)pid);
		/* plant a tree nobody holds: the next view sweeps it */
		snprintf(dead, sizeof(dead), "%s/view-%d-deadbeef", host, (int)pid);
		REQUIRE(!mkdir(dead, 0700), "mkdir %s", dead);
		pid2 = fork();
		REQUIRE(pid2 >= 0, "fork");
		if (!pid2) {
			snprintf(p, sizeof(p), "/sys/class/infiniband/%s/node_guid", dev);
			exit(strlen(line(p)) == 19 ? 0 : 1);
		}
		REQUIRE(waitpid(pid2, &status, 0) == pid2, "waitpid");
		errno = 0;
		CHECK(stat(dead, &st) && errno == ENOENT, "a dead process's tree was not swept");
		if (!stat(dead, &st))
			rmdir(dead);
	}
	/* URDMA_VIEW=0: none (a shell, with the same preload, looks) */
	{
		char cmd[PATH_MAX + 64];

		snprintf(cmd, sizeof(cmd),
			 "URDMA_VIEW=0 sh -c 'test ! -e /dev/infiniband/%s'", l[0]->dev_name);
		CHECK(system(cmd) == 0, "URDMA_VIEW=0 still shows the view");
		snprintf(cmd, sizeof(cmd), "sh -c 'test -c /dev/infiniband/%s'",
			 l[0]->dev_name);
		CHECK(system(cmd) == 0, "a child program sees no view");
	}
	ibv_close_device(ctx);
	ibv_free_device_list(l);
}

int main(int argc, char **argv)
{
	int ret;

	t_init(argc, argv);
	if (!getenv("LD_PRELOAD") || !strstr(getenv("LD_PRELOAD"), "liburdma_view.so"))
		fprintf(stderr, "view_test: run me as `urdma run view_test`\n");
	t_case("view", view, NULL);
	ret = t_finish();
	/* The case's process and sh leave by _exit, before the view's
	 * cleanup: a view made here sweeps their trees (nobody holds them),
	 * and goes itself as this process exits. */
	access("/dev/infiniband", F_OK);
	return ret;
}
