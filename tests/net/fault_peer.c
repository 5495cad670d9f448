/* SPDX-License-Identifier: MIT */
/*
 * fault_peer: one side of the multi-host fault tests (tests/net/faults.sh).
 * A plain verbs program (linked against urdma's libibverbs.so.1), one RC QP,
 * connection data (QPN, PSN, GID, buffer) exchanged over a plain TCP socket
 * like ibv_rc_pingpong.  Each side uses the GID whose raw bytes are
 * ::ffff:<its own IPv4 address on the control connection>.
 *
 *   fault_peer server PORT [options]
 *   fault_peer client SERVER_IP PORT [options]
 *
 * Modes (--mode, the same on both sides; who is "active" posts the WRs):
 *   ok    client active: --count rounds of RDMA WRITE + RDMA READ of the same
 *         bytes, each READ checked against what was written; then "done".
 *   kill  server active: RDMA WRITEs and SENDs to the client, which keeps
 *         receives posted, until the client is SIGKILLed (by the script).  The
 *         server then needs: its first failed WR with IBV_WC_RETRY_EXC_ERR,
 *         every later one IBV_WC_WR_FLUSH_ERR, every outstanding WR completed,
 *         the QP in ERR, all within the QP's retry budget plus --slack-ms of
 *         the fault mark.
 *   link  client active: RDMA WRITEs and READs to the server until the
 *         script takes the link down.  The client then needs a WR completed
 *         with IBV_WC_RETRY_EXC_ERR between budget/2 and budget + slack after
 *         the fault mark, every outstanding WR completed, the QP in ERR.
 * The retry budget is 4.096 us * 2^timeout * (retry_cnt + 1).  Variants of
 * link: --reads-only (the client posts RDMA READs only), --rts-delay-ms N
 * (the client waits N ms between its modifies to RTR and to RTS).
 *
 * Signals (blocked in every thread, urdma's included; the main thread takes
 * them with sigtimedwait in its loops):
 *   SIGUSR1  the fault mark: the script sends it right before it injects the
 *            fault; times are measured from it
 *   SIGUSR2  a passive side (link-mode server) stops waiting and tears down
 * Every process checks at teardown that its open fd count (/proc/self/fd)
 * after destroying the QP is back to what it was before the connection.
 *
 * Output: "FLOWING ..." once the active side has some successful completions,
 * "RESULT ...", "FDS ...", "PASS ..." or "FAIL: ..." lines.
 * Exit status: 0 all checks passed, 1 a check failed, 2 usage or setup error.
 *
 * Over 1,000 lines on purpose: one program plays every fault mode, so that
 * both sides of a mode are read together and faults.sh starts one binary.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h" /* t_wc_status_str, t_qp_state_str */

#define MAGIC 0x75666c74u /* "uflt" */
#define FLOWING_AFTER 64  /* successful completions before "FLOWING" */
#define CONNECT_WAIT_MS 15000
#define CTRL_WAIT_MS 15000
#define FD_WAIT_MS 3000

enum mode { M_OK, M_KILL, M_LINK };
static const char *const mode_names[] = { "ok", "kill", "link" };

static struct {
	bool server;
	const char *host;
	int port;
	enum mode mode;
	int timeout, retry;
	int slack_ms;
	uint32_t size;
	int depth;
	long count;
	int run_ms;	/* active side: bound of the flow before a fault */
	int hard_ms;	/* bound of everything after the fault mark */
	const char *pidfile;
	int gid_index;	/* -1: find ::ffff:<local ip> */
	int rts_delay_ms; /* between the modifies to RTR and to RTS */
	bool reads_only;  /* link: RDMA READs only */
	bool ignore_sigpipe;
} o = {
	.mode = M_OK,
	.timeout = 14,
	.retry = 3,
	.slack_ms = 1000,
	.size = 16384,
	.depth = 16,
	.count = 200,
	.run_ms = 20000,
	.hard_ms = 10000,
	.gid_index = -1,
};

static const char *role = "?";
static int failures;
static double t_start;
static double now_ms(void);

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
	va_list ap;

	printf("[%s +%.1fms] ", role, now_ms() - t_start);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
	va_list ap;

	printf("[%s +%.1fms] FAIL: ", role, now_ms() - t_start);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	failures++;
}

#define die(...)                                                          \
	do {                                                              \
		fail(__VA_ARGS__);                                        \
		exit(2);                                                  \
	} while (0)

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double budget_ms(void)
{
	return 4.096e-3 * (double)(1ull << o.timeout) * (o.retry + 1);
}

/* ---- signals ---- */

static sigset_t usr_set;

/* Returns the signal pending for the main thread (0: none); takes it. */
static int take_signal(void)
{
	struct timespec zero = { 0, 0 };
	int s = sigtimedwait(&usr_set, NULL, &zero);

	return s > 0 ? s : 0;
}

static double mark_ms = -1; /* when SIGUSR1 was taken */
static bool finish_req;	    /* SIGUSR2 */

static void check_signals(void)
{
	int s;

	while ((s = take_signal())) {
		if (s == SIGUSR1 && mark_ms < 0) {
			mark_ms = now_ms();
			note("fault mark (SIGUSR1)");
		} else if (s == SIGUSR2) {
			finish_req = true;
			note("finish request (SIGUSR2)");
		}
	}
}

/* ---- fds ---- */


/* The open fds as "N -> target" lines. */
#define MAX_FDS 256
struct fd_list {
	int n;
	char e[MAX_FDS][160];
};

static void get_fds(struct fd_list *l)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;

	l->n = 0;
	if (!d)
		return;
	while ((e = readdir(d)) && l->n < MAX_FDS) {
		char p[300], t[128];
		ssize_t k;

		if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
			continue;
		snprintf(p, sizeof(p), "/proc/self/fd/%s", e->d_name);
		k = readlink(p, t, sizeof(t) - 1);
		t[k > 0 ? k : 0] = 0;
		snprintf(l->e[l->n++], sizeof(l->e[0]), "%.16s -> %.127s", e->d_name, t);
	}
	closedir(d);
}

/* Print what is in a and not in b, as "tag fd -> target". */
static void diff_fds(const struct fd_list *a, const struct fd_list *b,
		     const char *tag)
{
	for (int i = 0; i < a->n; i++) {
		int j;

		for (j = 0; j < b->n && strcmp(a->e[i], b->e[j]); j++)
			;
		if (j == b->n)
			note("  %s fd %s", tag, a->e[i]);
	}
}

/* ---- control connection ---- */

struct wire {
	uint32_t magic, mode, qpn, psn, rkey, size;
	uint64_t addr, len;
	uint8_t gid[16];
};

static int ctrl_fd = -1;

static bool wait_fd(int fd, short ev, int ms)
{
	struct pollfd p = { .fd = fd, .events = ev };
	double end = now_ms() + ms;

	for (;;) {
		int left = (int)(end - now_ms()), r;

		if (left < 0)
			left = 0;
		r = poll(&p, 1, left);
		if (r > 0)
			return true;
		if (r == 0 || errno != EINTR)
			return false;
	}
}

static void send_all(const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t k;

		if (!wait_fd(ctrl_fd, POLLOUT, CTRL_WAIT_MS))
			die("control connection: send timed out");
		k = send(ctrl_fd, p, len, MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			die("control connection: send: %s", strerror(errno));
		p += k;
		len -= k;
	}
}

static void recv_all(void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t k;

		if (!wait_fd(ctrl_fd, POLLIN, CTRL_WAIT_MS))
			die("control connection: no data from the peer in %d ms",
			    CTRL_WAIT_MS);
		k = recv(ctrl_fd, p, len, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k == 0)
			die("control connection: closed by the peer");
		if (k < 0)
			die("control connection: recv: %s", strerror(errno));
		p += k;
		len -= k;
	}
}

static void ctrl_open(void)
{
	if (o.server) {
		struct sockaddr_in sa = { .sin_family = AF_INET,
					  .sin_port = htons(o.port),
					  .sin_addr.s_addr = htonl(INADDR_ANY) };
		int one = 1, l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (l < 0)
			die("socket: %s", strerror(errno));
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(l, (struct sockaddr *)&sa, sizeof(sa)) || listen(l, 1))
			die("listening on port %d: %s", o.port, strerror(errno));
		note("listening on port %d", o.port);
		if (!wait_fd(l, POLLIN, CONNECT_WAIT_MS))
			die("no client within %d ms", CONNECT_WAIT_MS);
		ctrl_fd = accept4(l, NULL, NULL, SOCK_CLOEXEC);
		if (ctrl_fd < 0)
			die("accept: %s", strerror(errno));
		close(l);
	} else {
		struct sockaddr_in sa = { .sin_family = AF_INET,
					  .sin_port = htons(o.port) };
		double end = now_ms() + CONNECT_WAIT_MS;

		if (inet_pton(AF_INET, o.host, &sa.sin_addr) != 1)
			die("bad server address '%s' (IPv4 expected)", o.host);
		for (;;) {
			ctrl_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
			if (ctrl_fd < 0)
				die("socket: %s", strerror(errno));
			if (!connect(ctrl_fd, (struct sockaddr *)&sa, sizeof(sa)))
				break;
			if (now_ms() > end)
				die("cannot connect to %s:%d: %s", o.host,
				    o.port, strerror(errno));
			close(ctrl_fd);
			usleep(100000);
		}
	}
	{
		int one = 1;

		setsockopt(ctrl_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	}
}

/* ---- verbs ---- */

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static uint8_t *buf;
static size_t buf_len;
static union ibv_gid my_gid;
static int my_gid_index;
static int max_rd;

static void open_device(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device_attr da;

	if (!list || !list[0])
		die("no RDMA device");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		die("ibv_open_device(%s) failed", ibv_get_device_name(list[0]));
	note("device %s", ibv_get_device_name(list[0]));
	ibv_free_device_list(list);
	if (ibv_query_device(ctx, &da))
		die("ibv_query_device failed");
	max_rd = 4;
	if (max_rd > da.max_qp_rd_atom)
		max_rd = da.max_qp_rd_atom;
	if (max_rd > da.max_qp_init_rd_atom)
		max_rd = da.max_qp_init_rd_atom;
	if (max_rd < 1)
		max_rd = 1;
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd failed");
	cq = ibv_create_cq(ctx, 4 * o.depth + 16, NULL, NULL, 0);
	if (!cq)
		die("ibv_create_cq failed");
	/* Two halves: the first is the peers' target (and our source), the
	 * second where our READs land. */
	buf_len = 2 * (size_t)o.depth * o.size;
	buf = aligned_alloc(4096, (buf_len + 4095) & ~(size_t)4095);
	if (!buf)
		die("out of memory");
	memset(buf, 0, buf_len);
	mr = ibv_reg_mr(pd, buf, buf_len,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				IBV_ACCESS_REMOTE_READ);
	if (!mr)
		die("ibv_reg_mr failed: %s", strerror(errno));
}

static void find_gid(void)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	struct ibv_port_attr pa;
	char ip[INET_ADDRSTRLEN];

	if (getsockname(ctrl_fd, (struct sockaddr *)&sa, &len) ||
	    sa.sin_family != AF_INET)
		die("getsockname on the control connection failed");
	inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
	if (ibv_query_port(ctx, 1, &pa))
		die("ibv_query_port failed");
	if (o.gid_index >= 0) {
		my_gid_index = o.gid_index;
		if (ibv_query_gid(ctx, 1, my_gid_index, &my_gid))
			die("ibv_query_gid(%d) failed", my_gid_index);
	} else {
		my_gid_index = -1;
		for (int i = 0; i < pa.gid_tbl_len; i++) {
			union ibv_gid g;
			static const uint8_t pfx[12] = { [10] = 0xff, [11] = 0xff };

			if (ibv_query_gid(ctx, 1, i, &g))
				continue;
			if (!memcmp(g.raw, pfx, 12) &&
			    !memcmp(g.raw + 12, &sa.sin_addr, 4)) {
				my_gid_index = i;
				my_gid = g;
				break;
			}
		}
		if (my_gid_index < 0)
			die("no GID ::ffff:%s among the %d of port 1", ip,
			    pa.gid_tbl_len);
	}
	note("local address %s: GID index %d", ip, my_gid_index);
}

static void create_qp(void)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = o.depth + 4,
			 .max_recv_wr = 2 * o.depth + 4,
			 .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};

	qp = ibv_create_qp(pd, &ia);
	if (!qp)
		die("ibv_create_qp failed: %s", strerror(errno));
}

static void connect_qp(const struct wire *r, uint32_t psn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_LOCAL_WRITE,
	};
	int ret;

	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					    IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (ret)
		die("modify_qp to INIT: %s", strerror(ret));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = r->qpn;
	a.rq_psn = r->psn;
	a.max_dest_rd_atomic = max_rd;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
	a.ah_attr.grh.sgid_index = my_gid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					    IBV_QP_MAX_DEST_RD_ATOMIC |
					    IBV_QP_MIN_RNR_TIMER);
	if (ret)
		die("modify_qp to RTR: %s", strerror(ret));
	if (o.rts_delay_ms)
		usleep(o.rts_delay_ms * 1000);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = o.timeout;
	a.retry_cnt = o.retry;
	a.rnr_retry = 7;
	a.sq_psn = psn;
	a.max_rd_atomic = max_rd;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
					    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (ret)
		die("modify_qp to RTS: %s", strerror(ret));
}

static int qp_state(void)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
		return -1;
	return a.qp_state;
}

/* Async events, without waiting (informational). */
static void drain_async(void)
{
	struct ibv_async_event ev;
	int fl = fcntl(ctx->async_fd, F_GETFL);

	if (fl < 0 || !(fl & O_NONBLOCK))
		fcntl(ctx->async_fd, F_SETFL, (fl < 0 ? 0 : fl) | O_NONBLOCK);
	while (wait_fd(ctx->async_fd, POLLIN, 0) && !ibv_get_async_event(ctx, &ev)) {
		note("async event: %s", ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
	}
}

/* ---- the active side ---- */

static struct wire peer;
static int outstanding;
static uint64_t n_posted, n_ok;

static int post_op(enum ibv_wr_opcode op, int slot, uint64_t wr_id)
{
	bool rd = op == IBV_WR_RDMA_READ;
	struct ibv_sge sge = {
		.addr = (uintptr_t)buf + (rd ? (size_t)o.depth * o.size : 0) +
			(size_t)slot * o.size,
		.length = o.size,
		.lkey = mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	if (op != IBV_WR_SEND) {
		wr.wr.rdma.remote_addr = peer.addr + (uint64_t)slot * o.size;
		wr.wr.rdma.rkey = peer.rkey;
	}
	return ibv_post_send(qp, &wr, &bad);
}

static int post_recv(uint64_t wr_id)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)buf + (size_t)o.depth * o.size +
			(size_t)(wr_id % o.depth) * o.size,
		.length = o.size,
		.lkey = mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 },
			   *bad;

	return ibv_post_recv(qp, &wr, &bad);
}

/* The WR_ID carries the opcode in its top byte. */
#define WR_OP(id) ((enum ibv_wr_opcode)((id) >> 56))
#define WR_ID(op, n) ((uint64_t)(op) << 56 | (uint64_t)(n))
#define WR_NUM(id) ((id) & (((uint64_t)1 << 56) - 1))

static const char *op_str(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
		return "WRITE";
	case IBV_WR_SEND:
		return "SEND";
	case IBV_WR_RDMA_READ:
		return "READ";
	default:
		return "?";
	}
}

/*
 * kill / link: keep depth WRs outstanding (two opcodes alternating) until
 * a WR fails; then stop posting and wait for every outstanding WR.
 */
static void run_flow(void)
{
	enum ibv_wr_opcode ops[2] = { o.reads_only ? IBV_WR_RDMA_READ :
						     IBV_WR_RDMA_WRITE,
				      o.mode == M_KILL ? IBV_WR_SEND :
							 IBV_WR_RDMA_READ };
	double t0 = now_ms(), last_ok = -1, first_err = -1, all_done = -1;
	double budget = budget_ms(), bound = budget + o.slack_ms;
	enum ibv_wc_status first_status = IBV_WC_SUCCESS;
	uint64_t first_wr = 0;
	long n_err[IBV_WC_GENERAL_ERR + 2] = { 0 };
	long n_ok_after_mark = 0, n_ok_after_err = 0, n_retry_exc = 0,
	     n_other_after_first = 0;
	bool flowing = false, post_failed = false;
	int post_errno = 0;
	int s;

	note("flow: %s + %s, %u bytes, %d outstanding; QP timeout %d, retry_cnt %d: "
	     "budget %.1f ms, bound %.1f ms (slack %d ms)",
	     op_str(ops[0]), op_str(ops[1]), o.size, o.depth, o.timeout, o.retry,
	     budget, bound, o.slack_ms);
	for (;;) {
		struct ibv_wc wc[32];
		double now;
		int n;

		check_signals();
		while (first_err < 0 && !post_failed && outstanding < o.depth) {
			enum ibv_wr_opcode op = ops[n_posted & 1];
			int ret = post_op(op, n_posted % o.depth,
					  WR_ID(op, n_posted));

			if (ret) {
				/* Posting to a QP in ERR may fail: stop. */
				post_failed = true;
				post_errno = ret;
				note("ibv_post_send failed (%s) after %" PRIu64
				     " WRs%s",
				     strerror(ret), n_posted,
				     mark_ms < 0 ? ", before any fault" : "");
				break;
			}
			n_posted++;
			outstanding++;
		}
		n = ibv_poll_cq(cq, 32, wc);
		now = now_ms();
		if (n < 0) {
			fail("ibv_poll_cq returned %d", n);
			break;
		}
		for (int i = 0; i < n; i++) {
			outstanding--;
			if (wc[i].status == IBV_WC_SUCCESS) {
				n_ok++;
				last_ok = now;
				if (mark_ms >= 0)
					n_ok_after_mark++;
				if (first_err >= 0)
					n_ok_after_err++;
				if (!flowing && n_ok >= FLOWING_AFTER) {
					flowing = true;
					note("FLOWING after %" PRIu64
					     " completions (%.0f ms)",
					     n_ok, now - t0);
				}
				continue;
			}
			s = wc[i].status <= IBV_WC_GENERAL_ERR ?
				    wc[i].status : IBV_WC_GENERAL_ERR + 1;
			n_err[s]++;
			if (wc[i].status == IBV_WC_RETRY_EXC_ERR)
				n_retry_exc++;
			if (first_err < 0) {
				first_err = now;
				first_status = wc[i].status;
				first_wr = wc[i].wr_id;
				note("first failed WR: %s #%" PRIu64 " %s "
				     "(vendor_err %#x), %d still outstanding",
				     op_str(WR_OP(first_wr)),
				     WR_NUM(first_wr),
				     t_wc_status_str(wc[i].status),
				     wc[i].vendor_err, outstanding);
			} else if (wc[i].status != IBV_WC_WR_FLUSH_ERR) {
				if (wc[i].status != IBV_WC_RETRY_EXC_ERR)
					n_other_after_first++;
				note("later failed WR: %s #%" PRIu64 " %s",
				     op_str(WR_OP(wc[i].wr_id)),
				     WR_NUM(wc[i].wr_id),
				     t_wc_status_str(wc[i].status));
			}
		}
		if ((first_err >= 0 || post_failed) && outstanding == 0) {
			all_done = now;
			break;
		}
		if (mark_ms < 0 && first_err < 0 && now - t0 > o.run_ms) {
			fail("no fault within %d ms of flow (%" PRIu64
			     " completions): the script's fault never came",
			     o.run_ms, n_ok);
			return;
		}
		if (mark_ms >= 0 && now - mark_ms > o.hard_ms) {
			fail("HANG: %d WRs still outstanding %d ms after the "
			     "fault mark (first error %s)",
			     outstanding, o.hard_ms,
			     first_err < 0 ? "none" : t_wc_status_str(first_status));
			break;
		}
		if (mark_ms < 0 && first_err >= 0 && now - first_err > o.hard_ms) {
			fail("HANG: %d WRs still outstanding %d ms after the "
			     "first error",
			     outstanding, o.hard_ms);
			break;
		}
		if (n == 0)
			usleep(50);
	}

	/* The QP must be in ERR by now (or very soon). */
	{
		double end = now_ms() + 1000;
		int st;

		while ((st = qp_state()) != IBV_QPS_ERR && now_ms() < end)
			usleep(1000);
		note("QP state: %s", t_qp_state_str(st));
		if (st != IBV_QPS_ERR)
			fail("QP is in %s, not ERR, after the fault", t_qp_state_str(st));
	}
	drain_async();

	{
		double ref = mark_ms >= 0 ? mark_ms : last_ok;
		const char *ref_name = mark_ms >= 0 ? "mark" : "last success";

		printf("[%s] RESULT mode=%s first_error=%s first_wr=%s "
		       "error_after_mark_ms=%.1f error_after_last_ok_ms=%.1f "
		       "all_done_after_mark_ms=%.1f budget_ms=%.1f bound_ms=%.1f "
		       "completed_ok=%" PRIu64 " ok_after_mark=%ld ok_after_error=%ld "
		       "retry_exc=%ld flush=%ld other_later_errors=%ld outstanding_left=%d\n",
		       role, mode_names[o.mode],
		       first_err < 0 ? "none" : t_wc_status_str(first_status),
		       first_err < 0 ? "-" : op_str(WR_OP(first_wr)),
		       first_err >= 0 && mark_ms >= 0 ? first_err - mark_ms : -1.0,
		       first_err >= 0 && last_ok >= 0 ? first_err - last_ok : -1.0,
		       all_done >= 0 && mark_ms >= 0 ? all_done - mark_ms : -1.0,
		       budget, bound, n_ok, n_ok_after_mark, n_ok_after_err,
		       n_retry_exc, n_err[IBV_WC_WR_FLUSH_ERR], n_other_after_first,
		       outstanding);
		for (int i = 0; i <= IBV_WC_GENERAL_ERR; i++)
			if (n_err[i])
				note("  %ld x %s", n_err[i],
				     t_wc_status_str((enum ibv_wc_status)i));
		fflush(stdout);
		if (post_failed && first_err < 0)
			fail("ibv_post_send failed (%s) and no WR completed "
			     "with an error",
			     strerror(post_errno));
		if (first_err < 0) {
			fail("no WR completed with an error");
			return;
		}
		if (mark_ms < 0)
			fail("no fault mark (SIGUSR1) before the first error; "
			     "times are from the last success");
		if (n_ok < FLOWING_AFTER)
			fail("the first error came after only %" PRIu64
			     " successes (connection setup?)",
			     n_ok);
		if (first_status != IBV_WC_RETRY_EXC_ERR)
			fail("first failed WR has status %s, expected RETRY_EXC_ERR",
			     t_wc_status_str(first_status));
		if (o.mode == M_KILL &&
		    (n_retry_exc != (first_status == IBV_WC_RETRY_EXC_ERR) ||
		     n_other_after_first))
			fail("after the first failed WR: %ld more with "
			     "RETRY_EXC_ERR and %ld with other errors "
			     "(%ld WR_FLUSH_ERR), expected only WR_FLUSH_ERR",
			     n_retry_exc - (first_status == IBV_WC_RETRY_EXC_ERR),
			     n_other_after_first, n_err[IBV_WC_WR_FLUSH_ERR]);
		if (outstanding)
			fail("%d outstanding WRs never completed", outstanding);
		if (first_err - ref > bound)
			fail("first error %.1f ms after the %s: more than the "
			     "budget %.1f ms + slack %d ms",
			     first_err - ref, ref_name, budget, o.slack_ms);
		if (all_done >= 0 && all_done - ref > bound)
			fail("last outstanding WR completed %.1f ms after the "
			     "%s: more than the budget %.1f ms + slack %d ms",
			     all_done - ref, ref_name, budget, o.slack_ms);
		if (o.mode == M_LINK && first_err - ref < budget / 2)
			fail("RETRY_EXC_ERR only %.1f ms after the link went "
			     "down: far less than the budget %.1f ms",
			     first_err - ref, budget);
	}
}

/* ok: rounds of WRITE then READ of the same bytes, checked. */
static void run_ok(void)
{
	uint8_t *src = buf, *dst = buf + (size_t)o.depth * o.size;
	double t0 = now_ms();

	for (long r = 0; r < o.count; r++) {
		int slot = r % o.depth;
		struct ibv_wc wc;
		int ret;

		for (uint32_t i = 0; i < o.size; i++)
			src[(size_t)slot * o.size + i] = (uint8_t)(r * 131 + i * 7 + 1);
		memset(dst + (size_t)slot * o.size, 0, o.size);
		ret = post_op(IBV_WR_RDMA_WRITE, slot, WR_ID(IBV_WR_RDMA_WRITE, r));
		if (!ret)
			ret = post_op(IBV_WR_RDMA_READ, slot,
				      WR_ID(IBV_WR_RDMA_READ, r));
		if (ret) {
			fail("round %ld: ibv_post_send: %s", r, strerror(ret));
			return;
		}
		for (int k = 0; k < 2; k++) {
			double end = now_ms() + 5000;
			int n;

			while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now_ms() < end)
				usleep(20);
			if (n != 1) {
				fail("round %ld: no completion within 5 s", r);
				return;
			}
			if (wc.status != IBV_WC_SUCCESS) {
				fail("round %ld: %s completed with %s", r,
				     op_str(WR_OP(wc.wr_id)),
				     t_wc_status_str(wc.status));
				return;
			}
			n_ok++;
		}
		if (memcmp(src + (size_t)slot * o.size, dst + (size_t)slot * o.size,
			   o.size)) {
			fail("round %ld: READ returned other bytes than WRITE wrote", r);
			return;
		}
	}
	printf("[%s] RESULT mode=ok rounds=%ld bytes=%u time_ms=%.1f\n", role,
	       o.count, o.size, now_ms() - t0);
	fflush(stdout);
}

/* ---- the passive sides ---- */

/* kill client: keep receives posted until killed. */
static void run_receiver(void)
{
	double t0 = now_ms();
	uint64_t next = 0, got = 0;

	for (int i = 0; i < 2 * o.depth; i++)
		if (post_recv(next++))
			die("ibv_post_recv failed");
	for (;;) {
		struct ibv_wc wc[32];
		int n = ibv_poll_cq(cq, 32, wc);

		check_signals();
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fail("receive completed with %s (after %" PRIu64
				     " receives)",
				     t_wc_status_str(wc[i].status), got);
				return;
			}
			got++;
			if (post_recv(next++)) {
				fail("ibv_post_recv failed");
				return;
			}
		}
		if (finish_req)
			return;
		if (now_ms() - t0 > o.run_ms + o.hard_ms) {
			fail("still alive after %d ms (%" PRIu64 " receives): "
			     "the script was to kill this process",
			     o.run_ms + o.hard_ms, got);
			return;
		}
		if (n == 0)
			usleep(50);
	}
}

/* ok / link server: wait for "done", the peer's end, or SIGUSR2. */
static void run_target(void)
{
	double t0 = now_ms();
	int limit = o.mode == M_OK ? CTRL_WAIT_MS + 5 * 2 * o.count :
				     o.run_ms + 2 * o.hard_ms;

	for (;;) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(cq, 1, &wc);

		if (n > 0)
			note("unexpected completion: %s",
			     t_wc_status_str(wc.status));
		check_signals();
		if (finish_req)
			return;
		if (wait_fd(ctrl_fd, POLLIN, 20)) {
			char c;
			ssize_t k = recv(ctrl_fd, &c, 1, 0);

			if (k == 1 && c == 'D') {
				note("peer done");
				return;
			}
			if (k == 0 || (k < 0 && errno != EINTR)) {
				note("control connection ended (%s)",
				     k == 0 ? "EOF" : strerror(errno));
				if (o.mode == M_OK)
					fail("peer left without 'done'");
				return;
			}
		}
		if (now_ms() - t0 > limit) {
			if (o.mode == M_OK)
				fail("no 'done' from the peer in %d ms", limit);
			else
				note("no word from the peer in %d ms; ending", limit);
			return;
		}
	}
}

/* ---- main ---- */

static void usage(void)
{
	fprintf(stderr,
		"usage: fault_peer server PORT [options]\n"
		"       fault_peer client SERVER_IP PORT [options]\n"
		"options:\n"
		"  --mode ok|kill|link   (the same on both sides; default ok)\n"
		"  --timeout N           QP timeout (4.096 us * 2^N per try; default 14)\n"
		"  --retry N             QP retry_cnt (default 3)\n"
		"  --slack-ms N          allowed beyond the retry budget (default 1000)\n"
		"  --size N              bytes per WR (default 16384)\n"
		"  --depth N             outstanding WRs (default 16)\n"
		"  --count N             ok mode: rounds (default 200)\n"
		"  --run-ms N            bound of the flow before a fault (default 20000)\n"
		"  --hard-ms N           bound of everything after the fault (default 10000)\n"
		"  --gid-index N         instead of the GID ::ffff:<local IPv4>\n"
		"  --rts-delay-ms N      wait N ms between the modifies to RTR and RTS\n"
		"  --reads-only          link mode: the client posts RDMA READs only\n"
		"  --pidfile FILE        write this process's pid there\n"
		"  --ignore-sigpipe      set SIGPIPE to SIG_IGN (default: left as is)\n");
	exit(2);
}

static long num(const char *s, long lo, long hi)
{
	char *e;
	long v = strtol(s, &e, 0);

	if (!*s || *e || v < lo || v > hi) {
		fprintf(stderr, "fault_peer: bad number '%s'\n", s);
		usage();
	}
	return v;
}

static void parse(int argc, char **argv)
{
	int i = 1;

	if (argc < 3)
		usage();
	if (!strcmp(argv[1], "server")) {
		o.server = true;
		o.port = num(argv[2], 1, 65535);
		i = 3;
	} else if (!strcmp(argv[1], "client") && argc >= 4) {
		o.host = argv[2];
		o.port = num(argv[3], 1, 65535);
		i = 4;
	} else {
		usage();
	}
	for (; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--ignore-sigpipe")) {
			o.ignore_sigpipe = true;
			continue;
		}
		if (!strcmp(a, "--reads-only")) {
			o.reads_only = true;
			continue;
		}
		if (!v)
			usage();
		i++;
		if (!strcmp(a, "--mode")) {
			if (!strcmp(v, "ok"))
				o.mode = M_OK;
			else if (!strcmp(v, "kill"))
				o.mode = M_KILL;
			else if (!strcmp(v, "link"))
				o.mode = M_LINK;
			else
				usage();
		} else if (!strcmp(a, "--timeout")) {
			o.timeout = num(v, 1, 31);
		} else if (!strcmp(a, "--retry")) {
			o.retry = num(v, 0, 7);
		} else if (!strcmp(a, "--slack-ms")) {
			o.slack_ms = num(v, 0, 600000);
		} else if (!strcmp(a, "--size")) {
			o.size = num(v, 1, 1 << 24);
		} else if (!strcmp(a, "--depth")) {
			o.depth = num(v, 1, 256);
		} else if (!strcmp(a, "--count")) {
			o.count = num(v, 1, 100000000);
		} else if (!strcmp(a, "--run-ms")) {
			o.run_ms = num(v, 1, 3600000);
		} else if (!strcmp(a, "--hard-ms")) {
			o.hard_ms = num(v, 1, 3600000);
		} else if (!strcmp(a, "--gid-index")) {
			o.gid_index = num(v, 0, 65535);
		} else if (!strcmp(a, "--rts-delay-ms")) {
			o.rts_delay_ms = num(v, 0, 60000);
		} else if (!strcmp(a, "--pidfile")) {
			o.pidfile = v;
		} else {
			usage();
		}
	}
}

int main(int argc, char **argv)
{
	struct wire me, w;
	bool active;
	int fds_start, fds_before, fds_after, fds_end;
	static struct fd_list l_start, l_before, l_now;
	double t;

	setvbuf(stdout, NULL, _IOLBF, 0);
	t_start = now_ms();
	parse(argc, argv);
	role = o.server ? "server" : "client";
	active = o.mode == M_KILL ? o.server : !o.server;

	/* SIGUSR1/2 stay blocked in every thread (urdma's progress thread
	 * included, created with this mask); the main loop takes them. */
	sigemptyset(&usr_set);
	sigaddset(&usr_set, SIGUSR1);
	sigaddset(&usr_set, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, &usr_set, NULL);
	if (o.ignore_sigpipe)
		signal(SIGPIPE, SIG_IGN);
	if (o.pidfile) {
		FILE *f = fopen(o.pidfile, "w");

		if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f))
			die("cannot write %s", o.pidfile);
	}

	fds_start = t_count_fds();
	get_fds(&l_start);
	open_device();
	fds_before = t_count_fds();
	get_fds(&l_before);

	ctrl_open();
	find_gid();
	create_qp();
	srand48(getpid() ^ (long)now_ms());
	memset(&me, 0, sizeof(me));
	me.magic = htonl(MAGIC);
	me.mode = htonl(o.mode);
	me.qpn = htonl(qp->qp_num);
	me.psn = htonl(lrand48() & 0xffffff);
	me.rkey = htonl(mr->rkey);
	me.size = htonl(o.size);
	me.addr = htobe64((uintptr_t)buf);
	me.len = htobe64(buf_len);
	memcpy(me.gid, my_gid.raw, 16);
	send_all(&me, sizeof(me));
	recv_all(&w, sizeof(w));
	if (ntohl(w.magic) != MAGIC)
		die("the peer is not a fault_peer");
	peer.mode = ntohl(w.mode);
	peer.qpn = ntohl(w.qpn);
	peer.psn = ntohl(w.psn);
	peer.rkey = ntohl(w.rkey);
	peer.size = ntohl(w.size);
	peer.addr = be64toh(w.addr);
	peer.len = be64toh(w.len);
	memcpy(peer.gid, w.gid, 16);
	if (peer.mode != o.mode || peer.size != o.size || peer.len != buf_len)
		die("the peer runs mode %s with %u bytes x %" PRIu64
		    ", this side %s with %u x %zu (same --mode, --size, --depth needed)",
		    peer.mode < 3 ? mode_names[peer.mode] : "?", peer.size,
		    peer.len, mode_names[o.mode], o.size, buf_len);
	connect_qp(&peer, ntohl(me.psn));
	note("mode %s (%s): qp %#x -> peer qp %#x, QP timeout %d, retry_cnt %d",
	     mode_names[o.mode], active ? "active" : "passive", qp->qp_num,
	     peer.qpn, o.timeout, o.retry);
	/* Both QPs at RTS before anything is posted. */
	send_all("R", 1);
	{
		char c;

		recv_all(&c, 1);
	}

	if (o.mode == M_OK && active)
		run_ok();
	else if (active)
		run_flow();
	else if (o.mode == M_KILL)
		run_receiver();
	else
		run_target();
	if (o.mode == M_OK && active && !failures)
		send_all("D", 1);

	/* Teardown; the fd count must come back to fds_before. */
	close(ctrl_fd);
	ctrl_fd = -1;
	if (ibv_destroy_qp(qp))
		fail("ibv_destroy_qp failed");
	t = now_ms();
	while ((fds_after = t_count_fds()) != fds_before && now_ms() - t < FD_WAIT_MS)
		usleep(10000);
	printf("[%s] FDS before_connection=%d after_destroy_qp=%d (%.0f ms after destroy)\n",
	       role, fds_before, fds_after, now_ms() - t);
	if (fds_after != fds_before) {
		fail("%d fds open after destroying the QP, %d before the "
		     "connection",
		     fds_after, fds_before);
		get_fds(&l_now);
		diff_fds(&l_now, &l_before, "extra");
		diff_fds(&l_before, &l_now, "missing");
	}
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	fds_end = t_count_fds();
	note("fds: %d at start, %d after ibv_close_device%s", fds_start, fds_end,
	     fds_end != fds_start ? " (informational):" : "");
	if (fds_end != fds_start) {
		get_fds(&l_now);
		diff_fds(&l_now, &l_start, "extra");
		diff_fds(&l_start, &l_now, "missing");
	}
	free(buf);
	if (failures) {
		note("%d check(s) failed", failures);
		return 1;
	}
	note("PASS");
	return 0;
}
