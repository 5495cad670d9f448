/* SPDX-License-Identifier: MIT */
/* urdma test harness: see harness.h for the model. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Global state                                                       */
/* ------------------------------------------------------------------ */

static const char *g_prog = "test";
static const char *g_role = "main";
static const char *g_case = "-";
static atomic_int g_fail;
static unsigned g_case_timeout = 30;
static int g_npass, g_nfail, g_nskip;
static char **g_filter;
static int g_nfilter;
/* In the orchestrator: the running case process. In a case process (the
 * parent side): the child. Used by watchdogs and t_abort(). */
static volatile pid_t g_kill_on_exit;

const char *t_role(void) { return g_role; }
int t_failures(void) { return atomic_load(&g_fail); }

/* One write() per line so that lines of concurrent processes and threads do
 * not interleave. */
static void emit(const char *buf)
{
	size_t len = strlen(buf), off = 0;
	while (off < len) {
		ssize_t w = write(STDOUT_FILENO, buf + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		off += (size_t)w;
	}
}

static void vemit(const char *prefix, const char *fmt, va_list ap)
{
	char buf[2048];
	int n = snprintf(buf, sizeof(buf), "[%s %s] %s", g_role, g_case, prefix);
	if (n < 0)
		return;
	if ((size_t)n < sizeof(buf))
		vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
	size_t l = strlen(buf);
	if (l + 2 > sizeof(buf))
		l = sizeof(buf) - 2;
	buf[l] = '\n';
	buf[l + 1] = 0;
	emit(buf);
}

bool t_check_impl(bool ok, const char *file, int line, const char *expr,
		  const char *fmt, ...)
{
	if (ok)
		return true;
	atomic_fetch_add(&g_fail, 1);
	const char *base = strrchr(file, '/');
	base = base ? base + 1 : file;
	char prefix[512];
	snprintf(prefix, sizeof(prefix), "%s:%d: CHECK(%s) failed: ", base, line, expr);
	va_list ap;
	va_start(ap, fmt);
	vemit(prefix, fmt, ap);
	va_end(ap);
	return false;
}

void t_note(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vemit("", fmt, ap);
	va_end(ap);
}

static void kill_and_reap(pid_t pid)
{
	if (pid <= 0)
		return;
	kill(pid, SIGKILL);
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
}

_Noreturn void t_abort(void)
{
	char buf[256];
	snprintf(buf, sizeof(buf), "[%s %s] fatal failure: ending this case\n", g_role, g_case);
	emit(buf);
	kill_and_reap(g_kill_on_exit);
	_exit(1);
}

_Noreturn void t_skip(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vemit("SKIP: ", fmt, ap);
	va_end(ap);
	kill_and_reap(g_kill_on_exit);
	_exit(atomic_load(&g_fail) ? 1 : T_EXIT_SKIP);
}

/* ------------------------------------------------------------------ */
/* Watchdogs                                                          */
/* ------------------------------------------------------------------ */

/* Print every thread's stack of process pid (gdb, if there is one) on
 * stderr, for at most 5 s (ctest's 120 s stay ahead of the global 115 s
 * watchdog and two of these): a case that hangs once in a hundred runs
 * says where.  From the watchdog's signal handler: fork, exec and wait
 * only.  T_NO_STACKS=1 skips it. */
static void dump_stacks(pid_t pid)
{
	char arg[24];
	pid_t c;

	snprintf(arg, sizeof(arg), "%d", (int)pid);
	c = fork();
	if (c == 0) {
		dup2(2, 1);
		execlp("gdb", "gdb", "-batch", "-nx", "-q", "-p", arg, "-ex",
		       "thread apply all bt", (char *)NULL);
		_exit(127);
	}
	for (int i = 0; c > 0 && i < 50; i++) {
		struct timespec ts = { 0, 100000000 };

		if (waitpid(c, NULL, WNOHANG) == c)
			return;
		nanosleep(&ts, NULL);
	}
	if (c > 0) {
		kill(c, SIGKILL);
		waitpid(c, NULL, 0);
	}
}

static void watchdog(int sig)
{
	(void)sig;
	char buf[256];
	const char *no = getenv("T_NO_STACKS");
	snprintf(buf, sizeof(buf),
		 "[%s %s] WATCHDOG: timed out (something hung); killing it\n",
		 g_role, g_case);
	emit(buf);
	pid_t pid = g_kill_on_exit;
	if (!no || strcmp(no, "1")) {
		/* (Yama: a child may trace its parent only if told so) */
		prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
		snprintf(buf, sizeof(buf), "[%s %s] the stacks of pid %d:\n",
			 g_role, g_case, (int)getpid());
		emit(buf);
		dump_stacks(getpid());
		if (pid > 0) {
			snprintf(buf, sizeof(buf), "[%s %s] the peer's (pid %d):\n",
				 g_role, g_case, (int)pid);
			emit(buf);
			dump_stacks(pid);
		}
	}
	if (pid > 0)
		kill(pid, SIGKILL);
	_exit(1);
}

static void arm_watchdog(unsigned seconds)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = watchdog;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);
	alarm(seconds);
}

/* ------------------------------------------------------------------ */
/* Cases                                                              */
/* ------------------------------------------------------------------ */

void t_init(int argc, char **argv)
{
	g_prog = argc > 0 ? argv[0] : "test";
	const char *slash = strrchr(g_prog, '/');
	if (slash)
		g_prog = slash + 1;
	g_filter = argv + 1;
	g_nfilter = argc > 1 ? argc - 1 : 0;
	setvbuf(stdout, NULL, _IONBF, 0);
	signal(SIGPIPE, SIG_IGN);
	arm_watchdog(T_GLOBAL_TIMEOUT_S);
}

void t_set_case_timeout(unsigned seconds) { g_case_timeout = seconds; }

static bool selected(const char *name)
{
	if (g_nfilter == 0)
		return true;
	for (int i = 0; i < g_nfilter; i++)
		if (strcmp(g_filter[i], name) == 0)
			return true;
	return false;
}

/* Waits for pid up to ms; returns true with *status if it exited. */
static bool wait_bounded(pid_t pid, int *status, int ms)
{
	uint64_t end = t_now_ms() + (uint64_t)ms;
	for (;;) {
		pid_t r = waitpid(pid, status, WNOHANG);
		if (r == pid)
			return true;
		if (r < 0 && errno != EINTR)
			return false;
		if (t_now_ms() >= end)
			return false;
		t_sleep_ms(5);
	}
}

static void describe_status(int status, char *buf, size_t len)
{
	if (WIFEXITED(status))
		snprintf(buf, len, "exit status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(status),
			 strsignal(WTERMSIG(status)));
	else
		snprintf(buf, len, "status 0x%x", status);
}

struct case_desc {
	t_case_fn solo;
	t_side_fn parent, child;
	void *arg;
};

/* T_CHILD_NETNS=NAME (or a path): the child side of t_pair cases runs in
 * that network namespace, another "host" (tests/net/netns.sh makes them),
 * with URDMA_SHM_DIR=$T_CHILD_SHM_DIR if set (a host's own shared memory). */
static void child_enter_netns(void)
{
	const char *ns = getenv("T_CHILD_NETNS"), *shm = getenv("T_CHILD_SHM_DIR");
	char path[512];
	int fd;

	if (!ns || !*ns)
		return;
	snprintf(path, sizeof(path), "%s%s", strchr(ns, '/') ? "" : "/var/run/netns/", ns);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	REQUIRE(fd >= 0 && setns(fd, CLONE_NEWNET) == 0,
		"entering network namespace %s: %s", path, strerror(errno));
	close(fd);
	if (shm && *shm)
		setenv("URDMA_SHM_DIR", shm, 1);
}

/* Body of the case process (the "parent" side of a pair). */
static _Noreturn void case_process(const struct case_desc *d)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	atomic_store(&g_fail, 0);
	g_kill_on_exit = 0;
	arm_watchdog(g_case_timeout);
	int skip = 0;

	if (d->solo) {
		g_role = "solo";
		d->solo(d->arg);
	} else {
		int sv[2];
		REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair: %s",
			strerror(errno));
		fflush(NULL);
		pid_t pid = fork();
		REQUIRE(pid >= 0, "fork: %s", strerror(errno));
		if (pid == 0) {
			/* The child side. */
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			g_role = "child";
			atomic_store(&g_fail, 0);
			g_kill_on_exit = 0;
			arm_watchdog(g_case_timeout);
			close(sv[0]);
			child_enter_netns();
			struct t_peer peer = {.fd = sv[1], .is_child = true, .child_pid = 0};
			d->child(&peer, d->arg);
			close(peer.fd);
			_exit(atomic_load(&g_fail) ? 1 : 0);
		}
		g_role = "parent";
		g_kill_on_exit = pid;
		close(sv[1]);
		struct t_peer peer = {.fd = sv[0], .is_child = false, .child_pid = pid};
		d->parent(&peer, d->arg);
		/* Closing our end wakes a child that still waits for us. */
		close(peer.fd);
		if (peer.child_pid > 0) {
			int status = 0;
			if (!wait_bounded(peer.child_pid, &status, T_WAIT_MS)) {
				CHECK(false, "the child did not exit within %d ms after the "
				      "parent side finished; killing it", T_WAIT_MS);
				kill_and_reap(peer.child_pid);
			} else if (WIFEXITED(status) && WEXITSTATUS(status) == T_EXIT_SKIP) {
				skip = 1;
			} else {
				char desc[128];
				describe_status(status, desc, sizeof(desc));
				CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
				      "the child side failed (%s)", desc);
			}
			g_kill_on_exit = 0;
		}
	}
	_exit(atomic_load(&g_fail) ? 1 : skip ? T_EXIT_SKIP : 0);
}

static void run_case(const char *name, const struct case_desc *d)
{
	if (!selected(name))
		return;
	g_case = name;
	fflush(NULL);
	uint64_t t0 = t_now_ms();
	pid_t pid = fork();
	if (pid < 0) {
		printf("FAIL - %s (fork: %s)\n", name, strerror(errno));
		g_nfail++;
		return;
	}
	if (pid == 0)
		case_process(d);
	g_kill_on_exit = pid;
	int status = 0;
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR) {
			status = -1;
			break;
		}
	}
	g_kill_on_exit = 0;
	unsigned long ms = (unsigned long)(t_now_ms() - t0);
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		printf("ok   - %s (%lu ms)\n", name, ms);
		g_npass++;
	} else if (WIFEXITED(status) && WEXITSTATUS(status) == T_EXIT_SKIP) {
		printf("skip - %s\n", name);
		g_nskip++;
	} else {
		char desc[128];
		describe_status(status, desc, sizeof(desc));
		printf("FAIL - %s (%s, %lu ms)\n", name, desc, ms);
		g_nfail++;
	}
	g_case = "-";
}

void t_case(const char *name, t_case_fn fn, void *arg)
{
	struct case_desc d = {.solo = fn, .arg = arg};
	run_case(name, &d);
}

void t_pair_and_tcp(const char *name, t_side_fn parent_fn, t_side_fn child_fn, void *arg)
{
	const char *was = getenv("URDMA_TRANSPORT");
	char *keep = was ? strdup(was) : NULL;
	char tcp_name[128];

	t_pair(name, parent_fn, child_fn, arg);
	snprintf(tcp_name, sizeof(tcp_name), "tcp_%s", name);
	setenv("URDMA_TRANSPORT", "tcp", 1);
	t_pair(tcp_name, parent_fn, child_fn, arg);
	if (keep)
		setenv("URDMA_TRANSPORT", keep, 1);
	else
		unsetenv("URDMA_TRANSPORT");
	free(keep);
}

void t_pair(const char *name, t_side_fn parent_fn, t_side_fn child_fn, void *arg)
{
	struct case_desc d = {.parent = parent_fn, .child = child_fn, .arg = arg};
	run_case(name, &d);
}

int t_finish(void)
{
	printf("%s: %d passed, %d failed, %d skipped\n", g_prog, g_npass, g_nfail, g_nskip);
	if (g_nfail)
		return 1;
	if (g_npass == 0 && g_nskip > 0)
		return T_EXIT_SKIP;
	if (g_npass == 0 && g_nfilter > 0) {
		printf("no case matched the names given\n");
		return 1;
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* Peer communication                                                 */
/* ------------------------------------------------------------------ */

void t_send_msg(struct t_peer *p, const void *buf, size_t len)
{
	const char *c = buf;
	size_t off = 0;
	while (off < len) {
		ssize_t w = send(p->fd, c + off, len - off, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		REQUIRE(w > 0, "sending to the peer failed: %s (the peer probably died)",
			w < 0 ? strerror(errno) : "short write");
		off += (size_t)w;
	}
}

void t_recv_msg(struct t_peer *p, void *buf, size_t len, int timeout_ms)
{
	char *c = buf;
	size_t off = 0;
	uint64_t end = t_now_ms() + (uint64_t)timeout_ms;
	while (off < len) {
		uint64_t now = t_now_ms();
		REQUIRE(now < end, "no message from the peer within %d ms", timeout_ms);
		struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
		int r = poll(&pfd, 1, (int)(end - now));
		if (r < 0 && errno == EINTR)
			continue;
		REQUIRE(r >= 0, "poll on the peer socket: %s", strerror(errno));
		if (r == 0)
			continue;
		ssize_t n = read(p->fd, c + off, len - off);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		REQUIRE(n > 0, "the peer closed the connection (%s): it failed or exited early",
			n < 0 ? strerror(errno) : "EOF");
		off += (size_t)n;
	}
}

void t_send_u64(struct t_peer *p, uint64_t v) { t_send_msg(p, &v, sizeof(v)); }

uint64_t t_recv_u64(struct t_peer *p, int timeout_ms)
{
	uint64_t v = 0;
	t_recv_msg(p, &v, sizeof(v), timeout_ms);
	return v;
}

void t_barrier_timeout(struct t_peer *p, int timeout_ms)
{
	uint32_t mine = 0xBA550000u + ++p->barrier, theirs = 0;
	t_send_msg(p, &mine, sizeof(mine));
	t_recv_msg(p, &theirs, sizeof(theirs), timeout_ms);
	REQUIRE(theirs == mine, "barrier mismatch: mine #%u, peer's 0x%08x (test protocol out of step)",
		p->barrier, theirs);
}

void t_barrier(struct t_peer *p) { t_barrier_timeout(p, T_WAIT_MS); }

void t_peer_kill(struct t_peer *p)
{
	REQUIRE(!p->is_child && p->child_pid > 0, "t_peer_kill is for the parent side");
	kill(p->child_pid, SIGKILL);
	int status = 0;
	while (waitpid(p->child_pid, &status, 0) < 0 && errno == EINTR)
		;
	p->child_pid = 0;
	g_kill_on_exit = 0;
}

/* ------------------------------------------------------------------ */
/* Resources                                                          */
/* ------------------------------------------------------------------ */

struct t_opts t_opts_default(void)
{
	struct t_opts o = {
		.cq_size = 256,
		.use_channel = false,
		.separate_cqs = false,
		.create_qp = true,
		.max_send_wr = 64,
		.max_recv_wr = 64,
		.max_send_sge = 1,
		.max_recv_sge = 1,
		.max_inline_data = 0,
		.sq_sig_all = false,
		.use_gid = true,
		.sgid_index = 1,
		.path_mtu = IBV_MTU_1024,
		.retry_cnt = 7,
		.rnr_retry = 7,
		.min_rnr_timer = 12,
		.timeout = 14,
		.max_rd_atomic = 1,
		.qp_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
	};
	return o;
}

struct ibv_context *t_open_first_device(void)
{
	int n = -1;
	errno = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	REQUIRE(list != NULL, "ibv_get_device_list failed: %s", strerror(errno));
	if (n <= 0 || list[0] == NULL) {
		ibv_free_device_list(list);
		REQUIRE(false, "no RDMA device: ibv_get_device_list returned %d devices", n);
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	int err = errno;
	ibv_free_device_list(list);
	REQUIRE(ctx != NULL, "ibv_open_device failed: %s", strerror(err));
	return ctx;
}

void t_res_open(struct t_res *r, const struct t_opts *o)
{
	memset(r, 0, sizeof(*r));
	r->opts = o ? *o : t_opts_default();
	o = &r->opts;
	r->ctx = t_open_first_device();
	int ret = ibv_query_device(r->ctx, &r->dev_attr);
	REQUIRE(ret == 0, "ibv_query_device: %d", ret);
	ret = ibv_query_port(r->ctx, 1, &r->port_attr);
	REQUIRE(ret == 0, "ibv_query_port(1): %d", ret);
	r->pd = ibv_alloc_pd(r->ctx);
	REQUIRE(r->pd, "ibv_alloc_pd: %s", strerror(errno));
	if (o->use_channel) {
		r->channel = ibv_create_comp_channel(r->ctx);
		REQUIRE(r->channel, "ibv_create_comp_channel: %s", strerror(errno));
	}
	r->send_cq = ibv_create_cq(r->ctx, o->cq_size, r, r->channel, 0);
	REQUIRE(r->send_cq, "ibv_create_cq(%d): %s", o->cq_size, strerror(errno));
	if (o->separate_cqs) {
		r->recv_cq = ibv_create_cq(r->ctx, o->cq_size, r, r->channel, 0);
		REQUIRE(r->recv_cq, "ibv_create_cq(%d): %s", o->cq_size, strerror(errno));
	} else {
		r->recv_cq = r->send_cq;
	}
	srand48((long)getpid() ^ (long)t_now_ms());
	r->psn = (uint32_t)lrand48() & 0xffffff;
	if (!o->create_qp)
		return;
	struct ibv_qp_init_attr ia = {
		.send_cq = r->send_cq,
		.recv_cq = r->recv_cq,
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = o->sq_sig_all,
		.cap = {
			.max_send_wr = o->max_send_wr,
			.max_recv_wr = o->max_recv_wr,
			.max_send_sge = o->max_send_sge,
			.max_recv_sge = o->max_recv_sge,
			.max_inline_data = o->max_inline_data,
		},
	};
	r->qp = ibv_create_qp(r->pd, &ia);
	REQUIRE(r->qp, "ibv_create_qp(send_wr %u recv_wr %u send_sge %u recv_sge %u inline %u): %s",
		o->max_send_wr, o->max_recv_wr, o->max_send_sge, o->max_recv_sge,
		o->max_inline_data, strerror(errno));
	r->cap = ia.cap;
}

void t_res_close(struct t_res *r)
{
	int ret;
	if (r->qp) {
		ret = ibv_destroy_qp(r->qp);
		CHECK(ret == 0, "ibv_destroy_qp: %d", ret);
		r->qp = NULL;
	}
	for (int i = 0; i < T_MAX_MRS; i++) {
		if (r->mrs[i]) {
			ret = ibv_dereg_mr(r->mrs[i]);
			CHECK(ret == 0, "ibv_dereg_mr: %d", ret);
			r->mrs[i] = NULL;
		}
	}
	if (r->recv_cq && r->recv_cq != r->send_cq) {
		ret = ibv_destroy_cq(r->recv_cq);
		CHECK(ret == 0, "ibv_destroy_cq(recv): %d", ret);
	}
	r->recv_cq = NULL;
	if (r->send_cq) {
		ret = ibv_destroy_cq(r->send_cq);
		CHECK(ret == 0, "ibv_destroy_cq: %d", ret);
		r->send_cq = NULL;
	}
	if (r->channel) {
		ret = ibv_destroy_comp_channel(r->channel);
		CHECK(ret == 0, "ibv_destroy_comp_channel: %d", ret);
		r->channel = NULL;
	}
	if (r->pd) {
		ret = ibv_dealloc_pd(r->pd);
		CHECK(ret == 0, "ibv_dealloc_pd: %d", ret);
		r->pd = NULL;
	}
	if (r->ctx) {
		ret = ibv_close_device(r->ctx);
		CHECK(ret == 0, "ibv_close_device: %d", ret);
		r->ctx = NULL;
	}
}

struct ibv_mr *t_reg(struct t_res *r, void *buf, size_t len, unsigned int access)
{
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(r->pd, buf, len, (int)access);
	REQUIRE(mr, "ibv_reg_mr(len %zu, access 0x%x): %s", len, access, strerror(errno));
	for (int i = 0; i < T_MAX_MRS; i++) {
		if (!r->mrs[i]) {
			r->mrs[i] = mr;
			return mr;
		}
	}
	REQUIRE(false, "too many MRs for the harness (T_MAX_MRS)");
	return NULL;
}

void t_dereg(struct t_res *r, struct ibv_mr *mr)
{
	for (int i = 0; i < T_MAX_MRS; i++)
		if (r->mrs[i] == mr)
			r->mrs[i] = NULL;
	int ret = ibv_dereg_mr(mr);
	CHECK(ret == 0, "ibv_dereg_mr: %d", ret);
}

void *t_alloc(size_t len)
{
	size_t sz = (len + 4095) & ~(size_t)4095;
	if (sz == 0)
		sz = 4096;
	void *p = aligned_alloc(4096, sz);
	REQUIRE(p, "out of memory (%zu bytes)", len);
	memset(p, 0, sz);
	return p;
}

void t_reg_fresh(struct ibv_pd *pd, size_t len, int fill)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *mr;

	REQUIRE(p != MAP_FAILED, "mmap: %s", strerror(errno));
	memset(p, fill, len);
	mr = ibv_reg_mr(pd, p, len, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr, "ibv_reg_mr: %s", strerror(errno));
	ibv_dereg_mr(mr);
	munmap(p, len);
}

void t_conn_local(struct t_res *r, const struct ibv_mr *mr, struct t_conn *out)
{
	memset(out, 0, sizeof(*out));
	out->qpn = r->qp ? r->qp->qp_num : 0;
	out->psn = r->psn;
	out->lid = r->port_attr.lid;
	if (r->opts.use_gid) {
		int ret = ibv_query_gid(r->ctx, 1, r->opts.sgid_index, &out->gid);
		REQUIRE(ret == 0, "ibv_query_gid(port 1, index %u): %d", r->opts.sgid_index, ret);
	}
	if (mr) {
		out->addr = (uintptr_t)mr->addr;
		out->len = mr->length;
		out->rkey = mr->rkey;
	}
}

void t_exchange(struct t_peer *p, const struct t_conn *local, struct t_conn *remote)
{
	t_send_msg(p, local, sizeof(*local));
	t_recv_msg(p, remote, sizeof(*remote), T_WAIT_MS);
}

int t_modify_init(struct t_res *r)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = r->opts.qp_access,
	};
	return ibv_modify_qp(r->qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int t_modify_rtr(struct t_res *r, const struct t_conn *remote)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = r->opts.path_mtu,
		.dest_qp_num = remote->qpn,
		.rq_psn = remote->psn,
		.max_dest_rd_atomic = r->opts.max_rd_atomic,
		.min_rnr_timer = r->opts.min_rnr_timer,
		.ah_attr = {
			.dlid = remote->lid,
			.sl = 0,
			.src_path_bits = 0,
			.port_num = 1,
		},
	};
	if (r->opts.use_gid) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = remote->gid;
		a.ah_attr.grh.sgid_index = r->opts.sgid_index;
		a.ah_attr.grh.hop_limit = 64;
	}
	return ibv_modify_qp(r->qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER);
}

int t_modify_rts(struct t_res *r)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTS,
		.timeout = r->opts.timeout,
		.retry_cnt = r->opts.retry_cnt,
		.rnr_retry = r->opts.rnr_retry,
		.sq_psn = r->psn,
		.max_rd_atomic = r->opts.max_rd_atomic,
	};
	return ibv_modify_qp(r->qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

void t_connect(struct t_res *r, const struct t_conn *remote)
{
	int ret = t_modify_init(r);
	REQUIRE(ret == 0, "modify_qp RESET->INIT: %d (%s)", ret, strerror(ret));
	ret = t_modify_rtr(r, remote);
	REQUIRE(ret == 0, "modify_qp INIT->RTR: %d (%s)", ret, strerror(ret));
	ret = t_modify_rts(r);
	REQUIRE(ret == 0, "modify_qp RTR->RTS: %d (%s)", ret, strerror(ret));
}

void t_connect_pair(struct t_peer *p, struct t_res *r, const struct ibv_mr *mr,
		    struct t_conn *remote)
{
	struct t_conn local, rem;
	t_conn_local(r, mr, &local);
	t_exchange(p, &local, &rem);
	t_connect(r, &rem);
	t_barrier(p);
	if (remote)
		*remote = rem;
}

void t_passive_target(struct t_peer *p, size_t len, unsigned int access,
		      int timeout_ms)
{
	struct t_res r;
	t_res_open(&r, NULL);
	char *buf = t_alloc(len);
	struct ibv_mr *mr = t_reg(&r, buf, len, access);
	t_connect_pair(p, &r, mr, NULL);
	t_barrier_timeout(p, timeout_ms);
	t_res_close(&r);
	free(buf);
}

int t_qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	memset(&a, 0, sizeof(a));
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) != 0)
		return -1;
	return (int)a.qp_state;
}

int t_modify_state(struct ibv_qp *qp, enum ibv_qp_state state)
{
	struct ibv_qp_attr a = {.qp_state = state};
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

/* ------------------------------------------------------------------ */
/* Posting and polling                                                */
/* ------------------------------------------------------------------ */

int t_post_send(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op,
		void *addr, uint32_t len, uint32_t lkey, unsigned int flags,
		uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = {.addr = (uintptr_t)addr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = len ? 1 : 0,
		.opcode = op,
		.send_flags = flags,
	};
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	struct ibv_send_wr *bad = NULL;
	return ibv_post_send(qp, &wr, &bad);
}

int t_post_atomic(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op,
		  uint64_t *res, uint32_t lkey, uint64_t raddr, uint32_t rkey,
		  uint64_t compare_add, uint64_t swap)
{
	struct ibv_sge sge = {.addr = (uintptr_t)res, .length = 8, .lkey = lkey};
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
	};
	struct ibv_send_wr *bad = NULL;

	wr.wr.atomic.remote_addr = raddr;
	wr.wr.atomic.rkey = rkey;
	wr.wr.atomic.compare_add = compare_add;
	wr.wr.atomic.swap = swap;
	return ibv_post_send(qp, &wr, &bad);
}

int t_post_recv(struct ibv_qp *qp, uint64_t wr_id, void *addr, uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = {.addr = (uintptr_t)addr, .length = len, .lkey = lkey};
	struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = len ? 1 : 0};
	struct ibv_recv_wr *bad = NULL;
	return ibv_post_recv(qp, &wr, &bad);
}

int t_poll(struct ibv_cq *cq, struct ibv_wc *wc, int n, int timeout_ms)
{
	int got = 0;
	unsigned idle = 0;
	uint64_t end = t_now_ms() + (uint64_t)timeout_ms;
	while (got < n) {
		int r = ibv_poll_cq(cq, n - got, wc + got);
		if (!CHECK(r >= 0, "ibv_poll_cq returned %d", r))
			return got;
		if (r > 0) {
			got += r;
			idle = 0;
			continue;
		}
		if (++idle % 256 == 0) {
			if (t_now_ms() >= end)
				break;
			struct timespec ts = {0, 20000};
			nanosleep(&ts, NULL);
		} else {
			sched_yield();
		}
	}
	return got;
}

bool t_poll_one(struct ibv_cq *cq, struct ibv_wc *wc, int timeout_ms, const char *what)
{
	return CHECK(t_poll(cq, wc, 1, timeout_ms) == 1, "no completion for %s within %d ms",
		     what, timeout_ms);
}

bool t_expect_wc(struct ibv_cq *cq, struct ibv_wc *wc, uint64_t wr_id,
		 enum ibv_wc_status status, int opcode, const char *what)
{
	struct ibv_wc local;
	if (!wc)
		wc = &local;
	memset(wc, 0, sizeof(*wc));
	if (!t_poll_one(cq, wc, T_WAIT_MS, what))
		return false;
	bool ok = CHECK(wc->status == status, "%s: status %s (%d), expected %s", what,
			t_wc_status_str(wc->status), wc->status, t_wc_status_str(status));
	ok &= CHECK(wc->wr_id == wr_id, "%s: wr_id %llu, expected %llu", what,
		    (unsigned long long)wc->wr_id, (unsigned long long)wr_id);
	if (opcode >= 0)
		ok &= CHECK((int)wc->opcode == opcode, "%s: opcode %s (%d), expected %s", what,
			    t_wc_opcode_str(wc->opcode), wc->opcode,
			    t_wc_opcode_str((enum ibv_wc_opcode)opcode));
	return ok;
}

int t_cq_drain(struct ibv_cq *cq, struct ibv_wc *wc, int max, int ms)
{
	struct ibv_wc scratch[16];
	int got = 0;
	uint64_t end = t_now_ms() + (uint64_t)ms;
	do {
		struct ibv_wc *dst = (wc && got < max) ? wc + got : scratch;
		int room = (wc && got < max) ? max - got : 16;
		int r = ibv_poll_cq(cq, room, dst);
		if (!CHECK(r >= 0, "ibv_poll_cq returned %d", r))
			break;
		got += r;
		if (r == 0)
			t_sleep_ms(1);
	} while (t_now_ms() < end);
	return got;
}

bool t_fd_readable(int fd, int ms)
{
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	uint64_t end = t_now_ms() + (uint64_t)ms;
	for (;;) {
		uint64_t now = t_now_ms();
		int left = now >= end ? 0 : (int)(end - now);
		int r = poll(&pfd, 1, left);
		if (r < 0 && errno == EINTR)
			continue;
		CHECK(r >= 0, "poll(fd %d): %s", fd, strerror(errno));
		return r > 0 && (pfd.revents & POLLIN);
	}
}

bool t_wait_cq_event(struct ibv_comp_channel *ch, struct ibv_cq *expect_cq, int timeout_ms)
{
	if (!CHECK(t_fd_readable(ch->fd, timeout_ms),
		   "no completion event on the channel within %d ms", timeout_ms))
		return false;
	struct ibv_cq *cq = NULL;
	void *cq_ctx = NULL;
	int ret = ibv_get_cq_event(ch, &cq, &cq_ctx);
	if (!CHECK(ret == 0, "ibv_get_cq_event: %d (%s)", ret, strerror(errno)))
		return false;
	CHECK(cq != NULL, "ibv_get_cq_event returned no CQ");
	if (cq)
		ibv_ack_cq_events(cq, 1);
	if (expect_cq)
		CHECK(cq == expect_cq, "event for CQ %p, expected %p", (void *)cq, (void *)expect_cq);
	return true;
}

/* ------------------------------------------------------------------ */
/* Misc                                                               */
/* ------------------------------------------------------------------ */

uint64_t t_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int t_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own fd */
}

uint64_t t_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

long t_other_threads_switches(void)
{
	char path[300], line[128];
	long sum = 0, me = (long)syscall(SYS_gettid);
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;

	REQUIRE(d, "/proc/self/task: %s", strerror(errno));
	while ((e = readdir(d))) {
		FILE *f;

		if (e->d_name[0] == '.' || atol(e->d_name) == me)
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
		if (!(f = fopen(path, "r")))
			continue; /* gone meanwhile */
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, "voluntary_ctxt_switches:", 24))
				sum += atol(line + 24);
		fclose(f);
	}
	closedir(d);
	return sum;
}

void t_sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

unsigned char t_pattern_byte(size_t i, unsigned seed)
{
	/* Depends on the offset, its page and the seed: catches misplaced
	 * chunks, not only wrong bytes. */
	return (unsigned char)(seed * 131u + i * 7u + (i >> 9) * 13u + 1u);
}

void t_pattern_fill(void *buf, size_t len, unsigned seed)
{
	unsigned char *b = buf;
	for (size_t i = 0; i < len; i++)
		b[i] = t_pattern_byte(i, seed);
}

long t_pattern_check(const void *buf, size_t len, unsigned seed)
{
	const unsigned char *b = buf;
	for (size_t i = 0; i < len; i++)
		if (b[i] != t_pattern_byte(i, seed))
			return (long)i;
	return -1;
}

const char *t_wc_status_str(enum ibv_wc_status s)
{
	static const char *names[] = {
		[IBV_WC_SUCCESS] = "SUCCESS",
		[IBV_WC_LOC_LEN_ERR] = "LOC_LEN_ERR",
		[IBV_WC_LOC_QP_OP_ERR] = "LOC_QP_OP_ERR",
		[IBV_WC_LOC_EEC_OP_ERR] = "LOC_EEC_OP_ERR",
		[IBV_WC_LOC_PROT_ERR] = "LOC_PROT_ERR",
		[IBV_WC_WR_FLUSH_ERR] = "WR_FLUSH_ERR",
		[IBV_WC_MW_BIND_ERR] = "MW_BIND_ERR",
		[IBV_WC_BAD_RESP_ERR] = "BAD_RESP_ERR",
		[IBV_WC_LOC_ACCESS_ERR] = "LOC_ACCESS_ERR",
		[IBV_WC_REM_INV_REQ_ERR] = "REM_INV_REQ_ERR",
		[IBV_WC_REM_ACCESS_ERR] = "REM_ACCESS_ERR",
		[IBV_WC_REM_OP_ERR] = "REM_OP_ERR",
		[IBV_WC_RETRY_EXC_ERR] = "RETRY_EXC_ERR",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR_RETRY_EXC_ERR",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "LOC_RDD_VIOL_ERR",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "REM_INV_RD_REQ_ERR",
		[IBV_WC_REM_ABORT_ERR] = "REM_ABORT_ERR",
		[IBV_WC_INV_EECN_ERR] = "INV_EECN_ERR",
		[IBV_WC_INV_EEC_STATE_ERR] = "INV_EEC_STATE_ERR",
		[IBV_WC_FATAL_ERR] = "FATAL_ERR",
		[IBV_WC_RESP_TIMEOUT_ERR] = "RESP_TIMEOUT_ERR",
		[IBV_WC_GENERAL_ERR] = "GENERAL_ERR",
	};
	if ((unsigned)s < sizeof(names) / sizeof(names[0]) && names[s])
		return names[s];
	return "UNKNOWN_STATUS";
}

const char *t_wc_opcode_str(enum ibv_wc_opcode op)
{
	switch (op) {
	case IBV_WC_SEND: return "SEND";
	case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
	case IBV_WC_RDMA_READ: return "RDMA_READ";
	case IBV_WC_COMP_SWAP: return "COMP_SWAP";
	case IBV_WC_FETCH_ADD: return "FETCH_ADD";
	case IBV_WC_BIND_MW: return "BIND_MW";
	case IBV_WC_LOCAL_INV: return "LOCAL_INV";
	case IBV_WC_RECV: return "RECV";
	case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
	default: return "OTHER_OPCODE";
	}
}

const char *t_qp_state_str(int s)
{
	switch (s) {
	case IBV_QPS_RESET: return "RESET";
	case IBV_QPS_INIT: return "INIT";
	case IBV_QPS_RTR: return "RTR";
	case IBV_QPS_RTS: return "RTS";
	case IBV_QPS_SQD: return "SQD";
	case IBV_QPS_SQE: return "SQE";
	case IBV_QPS_ERR: return "ERR";
	case -1: return "(query failed)";
	default: return "UNKNOWN_STATE";
	}
}
