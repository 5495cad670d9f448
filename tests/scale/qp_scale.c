// SPDX-License-Identifier: MIT
/*
 * qp_scale: N connected RC QPs between two processes (a fork), each used
 * once.  It measures, per side:
 *   create   ibv_create_qp of all N (QPs/s);
 *   connect  INIT, RTR, RTS of all N, then an 8-byte RDMA Write on each
 *            to the peer's slot i, all completed (QPs/s: over TCP the
 *            streams connect here);
 *   memory   resident memory and mappings added per idle connected QP;
 *   destroy  ibv_destroy_qp of all N.
 * The target checks that slot i holds i for every QP.
 *
 *   qp_scale N                  all N must connect and carry their Write
 *   qp_scale N --limit maps|fds the process first eats its mappings
 *                               (vm.max_map_count) or its fds
 *                               (RLIMIT_NOFILE) down to a little room:
 *                               QPs past it must fail with a clear error
 *                               (create or modify returns one, or the
 *                               Write completes in error), never hang or
 *                               report success for a Write not done.
 *   qp_scale --max              create QPs up to the device's max_qp: the
 *                               next fails with ENOMEM.
 * QS_TIMEOUT sets the QPs' timeout attribute (default 14: a retry budget of
 * 0.54 s with retry_cnt 7).  QS_STALL_MS=T stops the whole writer (SIGSTOP,
 * from a child) for T ms once it has posted its Writes, as a busy host's
 * scheduler may: the Writes still waiting for their streams must not fail.
 * Prints one "qp_scale: ..." line per side; exits 0 when every check held.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdbool.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct hello {
	union ibv_gid gid;
	uint64_t addr;
	uint32_t rkey;
};

static const char *side = "?";

#define DIE(...)                                                              \
	do {                                                                  \
		fprintf(stderr, "qp_scale %s: ", side);                       \
		fprintf(stderr, __VA_ARGS__);                                 \
		fputc('\n', stderr);                                          \
		exit(1);                                                      \
	} while (0)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void xfer(int fd, void *buf, size_t len, bool out)
{
	for (size_t k = 0; k < len;) {
		ssize_t n = out ? write(fd, (char *)buf + k, len - k) :
				  read(fd, (char *)buf + k, len - k);

		if (n <= 0)
			DIE("%s the other side: %s", out ? "writing to" :
							   "reading from",
			    n ? strerror(errno) : "closed");
		k += n;
	}
}

static long rss_kib(void)
{
	long pages = 0, rss = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
			rss = 0;
		fclose(f);
	}
	return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static long maps_count(void)
{
	long n = 0;
	int ch;
	FILE *f = fopen("/proc/self/maps", "r");

	if (!f)
		return -1;
	while ((ch = fgetc(f)) != EOF)
		n += ch == '\n';
	fclose(f);
	return n;
}

static long sysctl_long(const char *path)
{
	long v = -1;
	FILE *f = fopen(path, "r");

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

/* Eat mappings until `room` are left under vm.max_map_count: single
 * pages, alternately readable and not, so they do not merge. */
static void eat_maps(long room)
{
	long max = sysctl_long("/proc/sys/vm/max_map_count");
	long n = maps_count(), want = max - room - n;
	size_t len = (size_t)(want > 0 ? want : 0) * 4096;
	char *p;

	if (max < 0 || n < 0)
		DIE("cannot read the mapping limit");
	if (!len)
		return;
	p = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		DIE("mmap: %m");
	for (long i = 1; i < want; i += 2)
		if (mprotect(p + i * 4096, 4096, PROT_NONE))
			DIE("mprotect: %m");
}

/* Eat fds until `room` are left under RLIMIT_NOFILE: the limit goes
 * `room` past the highest fd open, and the holes below it are filled (a
 * new fd takes the lowest free number: the library keeps some fds high). */
static void eat_fds(long room)
{
	struct rlimit rl;
	int top = -1, fd;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;

	if (!d)
		DIE("/proc/self/fd: %m");
	while ((de = readdir(d)))
		if (atoi(de->d_name) > top)
			top = atoi(de->d_name);
	closedir(d);
	getrlimit(RLIMIT_NOFILE, &rl);
	while ((fd = open("/dev/null", O_RDONLY)) >= 0 && fd < top)
		;
	if (fd > top)
		close(fd);
	rl.rlim_cur = (rlim_t)top + 1 + room;
	if (setrlimit(RLIMIT_NOFILE, &rl))
		DIE("setrlimit: %m");
}

static void raise_nofile(void)
{
	struct rlimit rl;

	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}


/* Stop this process, every thread of it, for ms milliseconds. */
static void stall_me(int ms)
{
	pid_t me = getpid(), pid = fork();
	int st;

	if (pid < 0)
		DIE("fork: %m");
	if (!pid) {
		kill(me, SIGSTOP);
		usleep(ms * 1000);
		kill(me, SIGCONT);
		_exit(0);
	}
	if (waitpid(pid, &st, 0) != pid)
		DIE("waitpid: %m");
}

static int run(int sock, bool writer, int n, const char *limit)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;
	struct ibv_device_attr da;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_qp **qps = calloc(n, sizeof(*qps));
	uint32_t *mine = calloc(n, sizeof(*mine)),
		 *theirs = calloc(n, sizeof(*theirs)); /* QPNs, 0: none */
	struct hello me = { 0 }, peer;
	uint64_t *slots;
	size_t slen = (size_t)n * 8;
	long rss0, maps0, rss1, maps1;
	double t0, t_create, t_connect, t_destroy;
	int made = 0, up = 0, wrote = 0, failed = 0, errs = 0, bad_err = 0;
	int first_err = 0;

	side = writer ? "writer" : "target";
	if (!list || !list[0] || !(ctx = ibv_open_device(list[0])))
		DIE("no device");
	if (ibv_query_device(ctx, &da))
		DIE("ibv_query_device failed");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, da.max_cqe < n ? da.max_cqe : n, NULL, NULL,
			   0);
	slots = aligned_alloc(4096, (slen + 4095) & ~4095ul);
	if (!pd || !cq || !slots || !qps || !mine || !theirs)
		DIE("setting up: %m");
	memset(slots, 0xff, slen);
	mr = ibv_reg_mr(pd, slots, slen,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr)
		DIE("ibv_reg_mr: %m");
	if (ibv_query_gid(ctx, 1, 1, &me.gid))
		DIE("ibv_query_gid: %m");
	me.addr = (uintptr_t)slots;
	me.rkey = mr->rkey;
	if (!strcmp(limit, "maps"))
		eat_maps(2000);
	else if (!strcmp(limit, "fds"))
		eat_fds(200);

	rss0 = rss_kib();
	maps0 = maps_count();
	t0 = now_s();
	for (; made < n; made++) {
		struct ibv_qp_init_attr ia = {
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 2, .max_recv_wr = 1,
				 .max_send_sge = 1, .max_recv_sge = 1 },
		};

		qps[made] = ibv_create_qp(pd, &ia);
		if (!qps[made]) {
			first_err = errno;
			break;
		}
		mine[made] = qps[made]->qp_num;
	}
	t_create = now_s() - t0;
	xfer(sock, &me, sizeof(me), true);
	xfer(sock, mine, n * sizeof(*mine), true);
	xfer(sock, &peer, sizeof(peer), false);
	xfer(sock, theirs, n * sizeof(*theirs), false);

	t0 = now_s();
	for (int i = 0; i < made; i++) {
		struct ibv_qp_attr a = {
			.qp_state = IBV_QPS_INIT, .port_num = 1,
			.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
		};
		int r;

		if (!theirs[i])
			continue;
		r = ibv_modify_qp(qps[i], &a,
				  IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
		if (!r) {
			a = (struct ibv_qp_attr){
				.qp_state = IBV_QPS_RTR,
				.path_mtu = IBV_MTU_1024,
				.dest_qp_num = theirs[i],
				.max_dest_rd_atomic = 1,
				.min_rnr_timer = 12,
				.ah_attr = { .is_global = 1, .port_num = 1,
					     .grh = { .dgid = peer.gid,
						      .sgid_index = 1,
						      .hop_limit = 1 } },
			};
			r = ibv_modify_qp(qps[i], &a,
					  IBV_QP_STATE | IBV_QP_AV |
						  IBV_QP_PATH_MTU |
						  IBV_QP_DEST_QPN |
						  IBV_QP_RQ_PSN |
						  IBV_QP_MAX_DEST_RD_ATOMIC |
						  IBV_QP_MIN_RNR_TIMER);
		}
		if (!r) {
			a = (struct ibv_qp_attr){
				.qp_state = IBV_QPS_RTS,
				.timeout = getenv("QS_TIMEOUT") ?
						   atoi(getenv("QS_TIMEOUT")) :
						   14,
				.retry_cnt = 7, .rnr_retry = 7,
				.max_rd_atomic = 1,
			};
			r = ibv_modify_qp(qps[i], &a,
					  IBV_QP_STATE | IBV_QP_TIMEOUT |
						  IBV_QP_RETRY_CNT |
						  IBV_QP_RNR_RETRY |
						  IBV_QP_SQ_PSN |
						  IBV_QP_MAX_QP_RD_ATOMIC);
		}
		if (r) {
			if (!first_err)
				first_err = r;
			errs++;
			if (r != ENOMEM && r != EMFILE && r != ENFILE &&
			    r != EAGAIN && r != ENOSPC)
				bad_err++;
			continue;
		}
		up++;
	}
	/* Every QP that is up writes its index into the peer's slot i. */
	if (writer) {
		int outstanding = 0, ok = 0;
		double end;

		for (int i = 0; i < made; i++) {
			struct ibv_qp_attr qa;
			struct ibv_qp_init_attr qia;
			struct ibv_sge sge;
			struct ibv_send_wr wr = {
				.wr_id = i, .sg_list = &sge, .num_sge = 1,
				.opcode = IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED |
					      IBV_SEND_INLINE,
				.wr.rdma = { .remote_addr = peer.addr + i * 8ull,
					     .rkey = peer.rkey },
			}, *bad;
			uint64_t v = i;

			if (ibv_query_qp(qps[i], &qa, IBV_QP_STATE, &qia) ||
			    qa.qp_state != IBV_QPS_RTS)
				continue;
			sge = (struct ibv_sge){ .addr = (uintptr_t)&v,
						.length = 8 };
			if (ibv_post_send(qps[i], &wr, &bad)) {
				failed++;
				continue;
			}
			outstanding++;
			/* Keep the CQ from overflowing. */
			while (outstanding >= cq->cqe) {
				struct ibv_wc wc[64];
				int k = ibv_poll_cq(cq, 64, wc);

				for (int j = 0; j < k; j++)
					wc[j].status ? failed++ : ok++;
				outstanding -= k > 0 ? k : 0;
			}
		}
		if (getenv("QS_STALL_MS"))
			stall_me(atoi(getenv("QS_STALL_MS")));
		end = now_s() + 120;
		while (outstanding && now_s() < end) {
			struct ibv_wc wc[64];
			int k = ibv_poll_cq(cq, 64, wc);

			for (int j = 0; j < k; j++) {
				if (wc[j].status) {
					if (!failed)
						fprintf(stderr,
							"qp_scale writer: qp %d: %s\n",
							(int)wc[j].wr_id,
							ibv_wc_status_str(
								wc[j].status));
					failed++;
				} else {
					ok++;
				}
			}
			outstanding -= k > 0 ? k : 0;
			if (!k)
				usleep(100);
		}
		if (outstanding)
			DIE("%d Writes never completed", outstanding);
		wrote = ok;
	}
	t_connect = now_s() - t0;
	rss1 = rss_kib();
	maps1 = maps_count();
	{
		int v = wrote;

		xfer(sock, &v, sizeof(v), true); /* writer: done; target: ready */
		xfer(sock, &v, sizeof(v), false);
		if (!writer)
			wrote = v;
	}
	if (!writer) {
		/* Each slot holds its index or was never written; count. */
		int got = 0, wrong = 0;

		for (int i = 0; i < n; i++) {
			if (slots[i] == (uint64_t)i)
				got++;
			else if (slots[i] != UINT64_MAX)
				wrong++;
		}
		if (wrong)
			DIE("%d slots hold a wrong value", wrong);
		if (got != wrote)
			DIE("%d Writes reported done, %d slots written", wrote,
			    got);
	}
	t0 = now_s();
	for (int i = 0; i < made; i++)
		if (ibv_destroy_qp(qps[i]))
			DIE("ibv_destroy_qp: %m");
	t_destroy = now_s() - t0;
	printf("qp_scale %s: qps %d of %d created (%.0f/s), %d connected "
	       "(%.0f/s incl. first Write), %d written, %d failed; "
	       "%.1f KiB and %.2f mappings per QP; destroy %.0f/s%s%s\n",
	       side, made, n, made / (t_create > 0 ? t_create : 1e-9), up,
	       up / (t_connect > 0 ? t_connect : 1e-9), wrote, failed,
	       up ? (double)(rss1 - rss0) / up : 0,
	       up ? (double)(maps1 - maps0) / up : 0,
	       made / (t_destroy > 0 ? t_destroy : 1e-9),
	       first_err ? "; first error: " : "",
	       first_err ? strerror(first_err) : "");
	fflush(stdout);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	if (bad_err)
		DIE("%d modify_qp errors were not resource errors", bad_err);
	if (!*limit && (made != n || up != n || (writer && wrote != n)))
		DIE("not every QP connected and wrote");
	if (*limit && writer && wrote + failed + (made - up) +
					(n - made) < n)
		DIE("QPs unaccounted for");
	return 0;
}

/* Create QPs until max_qp: one more fails with ENOMEM, and one destroyed
 * makes room for one. */
static int max_qps(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;
	struct ibv_device_attr da;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp **qps;
	struct ibv_qp_init_attr ia;
	int n = 0, err;

	side = "max";
	if (!list || !list[0] || !(ctx = ibv_open_device(list[0])) ||
	    ibv_query_device(ctx, &da))
		DIE("no device");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	qps = calloc(da.max_qp + 1, sizeof(*qps));
	if (!pd || !cq || !qps)
		DIE("setting up: %m");
	ia = (struct ibv_qp_init_attr){
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	for (; n <= da.max_qp; n++) {
		errno = 0;
		if (!(qps[n] = ibv_create_qp(pd, &ia)))
			break;
	}
	err = errno;
	printf("qp_scale max: %d QPs created of max_qp %d; the next: %s\n", n,
	       da.max_qp, err ? strerror(err) : "created");
	if (n != da.max_qp || err != ENOMEM)
		DIE("expected max_qp QPs, then ENOMEM");
	if (ibv_destroy_qp(qps[n - 1]) || !(qps[n - 1] = ibv_create_qp(pd, &ia)))
		DIE("no room for a QP after one was destroyed");
	for (int i = 0; i < n; i++)
		if (ibv_destroy_qp(qps[i]))
			DIE("ibv_destroy_qp: %m");
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}

int main(int argc, char **argv)
{
	int sv[2], n, st = 0;
	const char *limit = "";
	pid_t pid;

	if (argc == 2 && !strcmp(argv[1], "--max"))
		return max_qps();
	if (argc < 2 || (n = atoi(argv[1])) <= 0)
		DIE("usage: qp_scale N [--limit maps|fds] | --max");
	if (argc > 3 && !strcmp(argv[2], "--limit"))
		limit = argv[3];
	raise_nofile();
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		DIE("socketpair: %m");
	pid = fork();
	if (pid < 0)
		DIE("fork: %m");
	if (!pid) {
		close(sv[0]);
		exit(run(sv[1], true, n, limit));
	}
	close(sv[1]);
	run(sv[0], false, n, limit);
	if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
		DIE("the writer failed");
	return 0;
}
