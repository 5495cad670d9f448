// SPDX-License-Identifier: MIT
/*
 * urdma: command-line companion of the urdma drop-in libibverbs.so.1.
 *
 *   urdma run [--] PROGRAM ARGS...   run an unmodified verbs program on urdma
 *   urdma devices [DEVICE]           list devices, ports and GID tables
 *   urdma help | --help              usage
 *   urdma --version                  version
 *
 * Exit codes: 0 ok, 1 runtime failure, 2 usage error,
 *             126 program found but not executable, 127 program not found.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#ifndef URDMA_VERSION
#define URDMA_VERSION "0.0.0"
#endif
/* Relative to the directory holding the urdma binary. */
#ifndef URDMA_INSTALL_LIBDIR_REL
#define URDMA_INSTALL_LIBDIR_REL "../lib/urdma"
#endif

#define EXIT_USAGE 2
#define EXIT_NOEXEC 126
#define EXIT_NOTFOUND 127

#define URDMA_LIBNAME "libibverbs.so.1"

static const char *prog = "urdma";

static void usage(FILE *f)
{
	fprintf(f,
"Usage:\n"
"  urdma run [--] PROGRAM [ARGS...]\n"
"      Run PROGRAM (any unmodified verbs program: ibv_rc_pingpong, ib_send_bw,\n"
"      qperf, ...) on urdma. The directory that holds urdma's libibverbs.so.1\n"
"      is prepended to LD_LIBRARY_PATH, liburdma_view.so (a private view of\n"
"      /sys/class/infiniband and /dev/infiniband, for UCX, Open MPI and\n"
"      other tools that look there) to LD_PRELOAD, and PROGRAM is executed\n"
"      in place (searched in PATH like a shell does). The exit status is\n"
"      PROGRAM's.\n"
"  urdma devices [DEVICE]\n"
"      List urdma devices, their ports (state, MTU, link layer, LID) and each\n"
"      port's GID table (index, GID, type, network interface).\n"
"  urdma help | --help | -h\n"
"      Show this help.\n"
"  urdma --version\n"
"      Show the version.\n"
"\n"
"Environment:\n"
"  URDMA_LOG_LEVEL   library log level: error|warn|info|debug|trace\n"
"                    (default: warn)\n"
"  URDMA_LOG_FILE    write library log messages to this file (default: stderr)\n"
"  URDMA_VIEW=0      'urdma run' preloads no view of the device files\n"
"  URDMA_LINK_LAYER  ethernet (default) or ib: the port's link layer (ib for\n"
"                    Open MPI's openib BTL; LIDs reach this host only)\n"
"  URDMA_LIBDIR      directory holding urdma's libibverbs.so.1, used by\n"
"                    'urdma run' instead of the one found next to this tool\n"
"                    (BINDIR/../lib in a build tree, BINDIR/%s when\n"
"                    installed)\n"
"\n"
"Examples:\n"
"  urdma devices\n"
"  urdma run ibv_devinfo -v\n"
"  urdma run ibv_rc_pingpong -g 1                  # server\n"
"  urdma run ibv_rc_pingpong -g 1 127.0.0.1        # client\n"
"  URDMA_LOG_LEVEL=debug urdma run ib_write_bw -d urdma0\n"
"\n"
"Exit status: 0 ok, 1 failure, 2 usage error, 127 PROGRAM not found\n"
"(126 PROGRAM found but not executable); otherwise PROGRAM's own status.\n",
		URDMA_INSTALL_LIBDIR_REL);
}

static int usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "%s: ", prog);
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\nTry '%s --help' for more information.\n", prog);
	return EXIT_USAGE;
}

static int is_dir(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int has_lib(const char *dir)
{
	char path[PATH_MAX];
	struct stat st;

	if (snprintf(path, sizeof(path), "%s/%s", dir, URDMA_LIBNAME) >=
	    (int)sizeof(path))
		return 0;
	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/*
 * Finds the directory holding urdma's libibverbs.so.1 and stores its
 * canonical path in out.  Returns 0 on success, -1 (after printing why) if
 * none is found.
 */
static int find_libdir(char *out, size_t outlen)
{
	const char *env = getenv("URDMA_LIBDIR");
	char exe[PATH_MAX], cand[PATH_MAX], *slash;
	/* Installed layout first so that an install into a prefix whose lib/
	 * also holds some other libibverbs.so.1 never picks that one. */
	static const char *const rel[] = { URDMA_INSTALL_LIBDIR_REL,
					   "../lib/urdma", "../lib" };
	char tried[4 * PATH_MAX] = "";
	ssize_t n;
	size_t i;

	if (env && *env) {
		if (!is_dir(env)) {
			fprintf(stderr, "%s: URDMA_LIBDIR=%s: not a directory\n",
				prog, env);
			return -1;
		}
		if (!has_lib(env)) {
			fprintf(stderr,
				"%s: URDMA_LIBDIR=%s does not contain %s\n",
				prog, env, URDMA_LIBNAME);
			return -1;
		}
		if (!realpath(env, out))
			snprintf(out, outlen, "%s", env);
		return 0;
	}

	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n < 0) {
		fprintf(stderr,
			"%s: cannot read /proc/self/exe (%s); set URDMA_LIBDIR "
			"to the directory holding urdma's %s\n",
			prog, strerror(errno), URDMA_LIBNAME);
		return -1;
	}
	exe[n] = '\0';
	slash = strrchr(exe, '/');
	if (!slash) {
		fprintf(stderr, "%s: unexpected executable path '%s'\n", prog,
			exe);
		return -1;
	}
	*slash = '\0';

	for (i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
		if (snprintf(cand, sizeof(cand), "%s/%s", exe, rel[i]) >=
		    (int)sizeof(cand))
			continue;
		if (has_lib(cand)) {
			if (!realpath(cand, out))
				snprintf(out, outlen, "%s", cand);
			return 0;
		}
		{
			size_t len = strlen(tried), j;

			for (j = 0; j < i && strcmp(rel[j], rel[i]); j++)
				;
			if (j < i)
				continue; /* same candidate already listed */

			snprintf(tried + len, sizeof(tried) - len, "  %s\n",
				 cand);
		}
	}
	fprintf(stderr,
		"%s: cannot find urdma's %s; looked in:\n%s"
		"Build the 'ibverbs' target (build/lib) or install urdma, or set "
		"URDMA_LIBDIR to the directory that holds it.\n",
		prog, URDMA_LIBNAME, tried);
	return -1;
}

/* Put dir first in the colon-separated list of environment variable name.
 * 0, or -1 (said). */
static int env_prepend(const char *name, const char *dir)
{
	const char *old = getenv(name);
	size_t len = strlen(dir) + (old ? strlen(old) + 1 : 0) + 1;
	char *val = malloc(len);
	int ret;

	if (!val) {
		perror(prog);
		return -1;
	}
	if (old && *old)
		snprintf(val, len, "%s:%s", dir, old);
	else
		snprintf(val, len, "%s", dir);
	ret = setenv(name, val, 1);
	if (ret)
		perror(prog);
	free(val);
	return ret ? -1 : 0;
}

/* Preload liburdma_view.so from libdir (the device files middleware looks
 * for: src/view/view.c), unless URDMA_VIEW=0 or it is there already. */
static int set_view(const char *libdir)
{
	const char *env = getenv("URDMA_VIEW"), *old = getenv("LD_PRELOAD");
	char lib[PATH_MAX];

	if (env && !strcmp(env, "0"))
		return 0;
	if (snprintf(lib, sizeof(lib), "%s/liburdma_view.so", libdir) >=
	    (int)sizeof(lib) || access(lib, R_OK))
		return 0;	/* (an older install without it) */
	if (old && strstr(old, lib))
		return 0;
	/* A program built with ASan wants its runtime first: let it start
	 * with ours before it (nothing of ours is instrumented). */
	env = getenv("ASAN_OPTIONS");
	if (!env || !strstr(env, "verify_asan_link_order")) {
		char opt[1024];

		snprintf(opt, sizeof(opt), "%s%sverify_asan_link_order=0",
			 env ? env : "", env && *env ? ":" : "");
		setenv("ASAN_OPTIONS", opt, 1);
	}
	return env_prepend("LD_PRELOAD", lib);
}

static int cmd_run(int argc, char **argv)
{
	char libdir[PATH_MAX];
	int i = 1;

	if (i < argc && strcmp(argv[i], "--") == 0)
		i++;
	else if (i < argc && (strcmp(argv[i], "-h") == 0 ||
			      strcmp(argv[i], "--help") == 0)) {
		usage(stdout);
		return 0;
	} else if (i < argc && argv[i][0] == '-' && argv[i][1] != '\0')
		return usage_error("run: unknown option '%s' (use '--' before "
				   "a program whose name starts with '-')",
				   argv[i]);
	if (i >= argc)
		return usage_error("%s", "run: missing PROGRAM");

	if (find_libdir(libdir, sizeof(libdir)))
		return EXIT_FAILURE;

	if (env_prepend("LD_LIBRARY_PATH", libdir))
		return EXIT_FAILURE;
	if (set_view(libdir))
		return EXIT_FAILURE;

	fflush(NULL);
	execvp(argv[i], &argv[i]);
	/* Only reached on failure. */
	{
		int err = errno;

		fprintf(stderr, "%s: %s: %s\n", prog, argv[i], strerror(err));
		if (err == ENOENT || err == ENOTDIR)
			return EXIT_NOTFOUND;
		return EXIT_NOEXEC;
	}
}

static const char *port_state_str(enum ibv_port_state s)
{
	return ibv_port_state_str(s);
}

static const char *link_layer_str(uint8_t ll)
{
	switch (ll) {
	case IBV_LINK_LAYER_UNSPECIFIED:
		return "Unspecified";
	case IBV_LINK_LAYER_INFINIBAND:
		return "InfiniBand";
	case IBV_LINK_LAYER_ETHERNET:
		return "Ethernet";
	default:
		return "Unknown";
	}
}

static int mtu_bytes(enum ibv_mtu m)
{
	switch (m) {
	case IBV_MTU_256:
		return 256;
	case IBV_MTU_512:
		return 512;
	case IBV_MTU_1024:
		return 1024;
	case IBV_MTU_2048:
		return 2048;
	case IBV_MTU_4096:
		return 4096;
	default:
		return 0;
	}
}

static const char *gid_type_str(uint32_t t)
{
	switch (t) {
	case IBV_GID_TYPE_IB:
		return "IB";
	case IBV_GID_TYPE_ROCE_V1:
		return "RoCE v1";
	case IBV_GID_TYPE_ROCE_V2:
		return "RoCE v2";
	default:
		return "unknown";
	}
}

static void print_guid(const char *label, __be64 guid)
{
	uint64_t g = be64toh(guid);

	printf("%s%04x:%04x:%04x:%04x\n", label, (unsigned)(g >> 48) & 0xffff,
	       (unsigned)(g >> 32) & 0xffff, (unsigned)(g >> 16) & 0xffff,
	       (unsigned)g & 0xffff);
}

static int list_port(struct ibv_context *ctx, uint8_t port)
{
	struct ibv_port_attr pa;
	int rc, i, shown = 0;

	memset(&pa, 0, sizeof(pa));
	rc = ibv_query_port(ctx, port, &pa);
	if (rc) {
		fprintf(stderr, "%s: %s: ibv_query_port(%u): %s\n", prog,
			ibv_get_device_name(ctx->device), port,
			strerror(rc > 0 ? rc : errno));
		return -1;
	}
	printf("  port %u:\n", port);
	printf("    state:       %s (%d)\n", port_state_str(pa.state),
	       pa.state);
	printf("    max_mtu:     %d (%d)\n", mtu_bytes(pa.max_mtu), pa.max_mtu);
	printf("    active_mtu:  %d (%d)\n", mtu_bytes(pa.active_mtu),
	       pa.active_mtu);
	printf("    link_layer:  %s\n", link_layer_str(pa.link_layer));
	printf("    lid:         %u (0x%04x)\n", pa.lid, pa.lid);
	printf("    gid_tbl_len: %d\n", pa.gid_tbl_len);
	printf("    GID table:\n");
	for (i = 0; i < pa.gid_tbl_len; i++) {
		struct ibv_gid_entry ent;
		char buf[INET6_ADDRSTRLEN], ifname[IF_NAMESIZE] = "";

		memset(&ent, 0, sizeof(ent));
		rc = ibv_query_gid_ex(ctx, port, i, &ent, 0);
		if (rc) {
			/* Empty entries report ENODATA; anything else is
			 * worth showing. */
			if (rc != ENODATA && rc != -ENODATA)
				printf("      [%3d] (query failed: %s)\n", i,
				       strerror(rc > 0 ? rc : -rc));
			continue;
		}
		if (!inet_ntop(AF_INET6, ent.gid.raw, buf, sizeof(buf)))
			snprintf(buf, sizeof(buf), "?");
		if (ent.ndev_ifindex && !if_indextoname(ent.ndev_ifindex,
							ifname))
			snprintf(ifname, sizeof(ifname), "if#%u",
				 ent.ndev_ifindex);
		printf("      [%3d] %-40s %-8s %s\n", i, buf,
		       gid_type_str(ent.gid_type), ifname);
		shown++;
	}
	if (!shown)
		printf("      (empty)\n");
	return 0;
}

static int cmd_devices(int argc, char **argv)
{
	struct ibv_device **list;
	const char *want = NULL;
	int num = 0, i, errors = 0, found = 0;

	if (argc > 1 && (strcmp(argv[1], "-h") == 0 ||
			 strcmp(argv[1], "--help") == 0)) {
		usage(stdout);
		return 0;
	}
	if (argc > 2)
		return usage_error("devices: too many arguments ('%s')",
				   argv[2]);
	if (argc == 2)
		want = argv[1];

	list = ibv_get_device_list(&num);
	if (!list) {
		fprintf(stderr, "%s: ibv_get_device_list: %s\n", prog,
			strerror(errno));
		return EXIT_FAILURE;
	}
	if (num == 0) {
		fprintf(stderr, "%s: no devices found\n", prog);
		ibv_free_device_list(list);
		return EXIT_FAILURE;
	}

	for (i = 0; i < num; i++) {
		struct ibv_device *dev = list[i];
		struct ibv_device_attr da;
		struct ibv_context *ctx;
		const char *name = ibv_get_device_name(dev);
		uint8_t p;
		int rc;

		if (want && strcmp(want, name ? name : ""))
			continue;
		found++;
		printf("%s\n", name ? name : "(unnamed)");
		printf("  node_type:   %s\n", ibv_node_type_str(dev->node_type));
		print_guid("  node_guid:   ", ibv_get_device_guid(dev));
		ctx = ibv_open_device(dev);
		if (!ctx) {
			fprintf(stderr, "%s: %s: ibv_open_device: %s\n", prog,
				name, strerror(errno));
			errors++;
			continue;
		}
		memset(&da, 0, sizeof(da));
		rc = ibv_query_device(ctx, &da);
		if (rc) {
			fprintf(stderr, "%s: %s: ibv_query_device: %s\n", prog,
				name, strerror(rc > 0 ? rc : errno));
			errors++;
			ibv_close_device(ctx);
			continue;
		}
		printf("  fw_ver:      %s\n", da.fw_ver[0] ? da.fw_ver : "-");
		printf("  phys_ports:  %u\n", da.phys_port_cnt);
		for (p = 1; p <= da.phys_port_cnt; p++)
			if (list_port(ctx, p))
				errors++;
		ibv_close_device(ctx);
	}
	ibv_free_device_list(list);
	if (want && !found) {
		fprintf(stderr, "%s: no device named '%s'\n", prog, want);
		return EXIT_FAILURE;
	}
	return errors ? EXIT_FAILURE : 0;
}

int main(int argc, char **argv)
{
	const char *cmd;

	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	cmd = argv[1];
	if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") ||
	    !strcmp(cmd, "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") ||
	    !strcmp(cmd, "version")) {
		printf("urdma %s\n", URDMA_VERSION);
		return 0;
	}
	if (!strcmp(cmd, "run"))
		return cmd_run(argc - 1, argv + 1);
	if (!strcmp(cmd, "devices"))
		return cmd_devices(argc - 1, argv + 1);
	return usage_error("unknown command '%s'", cmd);
}
