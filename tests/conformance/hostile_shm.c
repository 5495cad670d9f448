/* SPDX-License-Identifier: MIT */
/*
 * Conformance: a hostile (or buggy) local peer of the same user, over
 * shared memory.
 *
 * A process of the same user can do what urdma's own library does: read a
 * QP's record in the host directory, connect to the context's socket, take
 * the identity memfd it hands out, and write anywhere in the QP's shared
 * block.  It can also plant files there.  Each case plays such a peer
 * against a real urdma QP and checks that the victim:
 *  - survives (no crash, no hang: every wait here is bounded);
 *  - reports the problem (the QP in ERR with an async event, error or flush
 *    completions), never a completion that did not happen;
 *  - writes nothing outside what it should (guard pages around the
 *    registered buffer keep their bytes);
 *  - does not spin (bounded CPU time while a peer holds its ring).
 * Values from the shared block are checked and copied at connection time,
 * so scribbling on the geometry afterwards changes nothing.
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/shared.h"

#define NRECV 4
#define BUF 4096
#define GUARD 4096
#define CANARY 0xA7
#define WAIT_MS 5000

/* ---- playing the hostile peer ---- */

static void host_dir(char *buf, size_t len)
{
	const char *e = getenv("URDMA_SHM_DIR");

	if (e && *e)
		snprintf(buf, len, "%s", e);
	else
		snprintf(buf, len, "/dev/shm/urdma-%u", (unsigned)geteuid());
}

static bool read_record(uint32_t qpn, struct urdma_qp_rec *rec)
{
	char path[512], dir[200];
	int fd;
	bool ok;

	host_dir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/qp-%x", dir, qpn);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ok = read(fd, rec, sizeof(*rec)) == sizeof(*rec);
	close(fd);
	return ok;
}

/* Connect to a context's socket as a peer would; the two fds of its hello
 * (MR table, identity memfd), or false. */
static bool take_hello(uint32_t ctx_id, int fds[2])
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	union {
		char buf[CMSG_SPACE(sizeof(int) * 2)];
		struct cmsghdr align;
	} u;
	struct urdma_hello h;
	struct iovec iov = {.iov_base = &h, .iov_len = sizeof(h)};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			   .msg_controllen = sizeof(u.buf)};
	char dir[80];
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct pollfd pf = {.fd = s, .events = POLLIN};
	struct cmsghdr *c;

	host_dir(dir, sizeof(dir));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%.80s/ctx-%x", dir, ctx_id);
	if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof(sa)) ||
	    poll(&pf, 1, WAIT_MS) != 1 || recvmsg(s, &m, MSG_CMSG_CLOEXEC) != sizeof(h)) {
		if (s >= 0)
			close(s);
		return false;
	}
	close(s);
	c = CMSG_FIRSTHDR(&m);
	if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int) * 2))
		return false;
	memcpy(fds, CMSG_DATA(c), sizeof(int) * 2);
	return true;
}

/* The shared block of our own QP qpn, mapped again as another process of
 * ours would map it. */
static struct urdma_shm_qp *attack_map(uint32_t qpn, size_t *size, int fds_out[2])
{
	struct urdma_qp_rec rec;
	int fds[2];
	void *p;

	if (!CHECK(read_record(qpn, &rec), "record of qp %#x", qpn) ||
	    !CHECK(take_hello(rec.ctx_id, fds), "hello of context %x", rec.ctx_id))
		return NULL;
	p = mmap(NULL, rec.size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], (off_t)rec.va);
	if (!CHECK(p != MAP_FAILED, "mapping qp %#x's block: %m", qpn))
		return NULL;
	*size = rec.size;
	if (fds_out) {
		fds_out[0] = fds[0];
		fds_out[1] = fds[1];
	} else {
		close(fds[0]);
		close(fds[1]);
	}
	return p;
}

static struct urdma_shm_rqe *ring_entry(struct urdma_shm_qp *q, uint32_t idx)
{
	/* The geometry as the owner wrote it, read before any scribbling. */
	return (struct urdma_shm_rqe *)((uint8_t *)q + sizeof(*q) +
					(size_t)(idx & (q->rq_size - 1)) * q->rq_stride);
}

/* ---- the victim ---- */

struct victim {
	struct t_res r;
	uint8_t *mem; /* guard | buffer | guard */
	uint8_t *buf;
	struct ibv_mr *mr;
};

static void victim_open(struct victim *v, const struct t_opts *o)
{
	t_res_open(&v->r, o);
	v->mem = t_alloc(GUARD + BUF + GUARD);
	memset(v->mem, CANARY, GUARD + BUF + GUARD);
	v->buf = v->mem + GUARD;
	v->mr = t_reg(&v->r, v->buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						 IBV_ACCESS_REMOTE_READ);
}

static void victim_close(struct victim *v)
{
	t_res_close(&v->r);
	free(v->mem);
}

static bool guards_intact(const struct victim *v)
{
	for (size_t i = 0; i < GUARD; i++)
		if (v->mem[i] != CANARY || v->mem[GUARD + BUF + i] != CANARY)
			return false;
	return true;
}

/* In INIT (receives may be posted before the connection), then post. */
static void post_recvs(struct victim *v, int n)
{
	if (t_qp_state(v->r.qp) == IBV_QPS_RESET)
		REQUIRE(t_modify_init(&v->r) == 0, "INIT");
	for (int i = 0; i < n; i++)
		REQUIRE(t_post_recv(v->r.qp, 100 + i, v->buf + i * 64, 64, v->mr->lkey) == 0,
			"post_recv %d", i);
}

/* An async event for the QP within ms: its type, or -1. */
static int wait_qp_event(struct victim *v, int ms)
{
	struct pollfd pf = {.fd = v->r.ctx->async_fd, .events = POLLIN};
	struct ibv_async_event ev;
	int type;

	if (poll(&pf, 1, ms) != 1 || ibv_get_async_event(v->r.ctx, &ev))
		return -1;
	type = ev.element.qp == v->r.qp ? (int)ev.event_type : -2;
	ibv_ack_async_event(&ev);
	return type;
}

/* Receive completions of the victim until `want` came or WAIT_MS passed;
 * counts successes and others. */
static void count_recvs(struct victim *v, int want, int *ok, int *bad, int *flushed)
{
	struct ibv_wc wc[16];
	int got = 0;

	*ok = *bad = *flushed = 0;
	while (got < want) {
		int n = t_poll(v->r.recv_cq, wc, want - got < 16 ? want - got : 16, WAIT_MS);

		if (n <= 0)
			break;
		for (int i = 0; i < n; i++) {
			if (wc[i].status == IBV_WC_SUCCESS)
				(*ok)++;
			else if (wc[i].status == IBV_WC_WR_FLUSH_ERR)
				(*flushed)++;
			else
				(*bad)++;
			CHECK(wc[i].wr_id >= 100 && wc[i].wr_id < 100 + NRECV,
			      "a receive completion with wr_id %#llx, never posted",
			      (unsigned long long)wc[i].wr_id);
		}
		got += n;
	}
	/* And then nothing more: a made-up completion would show here. */
	CHECK(t_poll(v->r.recv_cq, wc, 16, 200) == 0, "more receive completions than posted");
}

/* The sender: connect, send `n` 16-byte messages when told, report. */
static void sender(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	struct t_res r;
	char *buf = t_alloc(BUF);
	struct ibv_mr *mr;
	int n;

	o.timeout = 10; /* 4 ms x 8 tries: a victim that is not there fails fast */
	o.retry_cnt = 7;
	o.rnr_retry = 3;
	t_res_open(&r, &o);
	mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	t_connect_pair(p, &r, mr, NULL);
	while ((n = (int)t_recv_u64(p, 30000)) > 0) {
		int ok = 0;
		for (int i = 0; i < n; i++) {
			struct ibv_wc wc;

			memset(buf, 'a' + i, 16);
			if (t_post_send(r.qp, i, IBV_WR_SEND, buf, 16, mr->lkey,
					IBV_SEND_SIGNALED, 0, 0))
				break;
			if (t_poll(r.send_cq, &wc, 1, WAIT_MS) != 1)
				break;
			if (wc.status != IBV_WC_SUCCESS)
				break;
			ok++;
		}
		t_send_u64(p, (uint64_t)ok);
	}
	t_res_close(&r);
	free(buf);
}

static int send_some(struct t_peer *p, int n)
{
	t_send_u64(p, (uint64_t)n);
	return (int)t_recv_u64(p, 60000);
}

static void sender_stop(struct t_peer *p)
{
	t_send_u64(p, 0);
}

/* ---- cases ---- */

/* A victim with nrecv receives posted, connected to the sender, which sent
 * it `first` messages; its QP's block mapped by the attacker (before the
 * connection if early).  False if the block could not be mapped (checked). */
struct scene {
	struct victim v;
	struct urdma_shm_qp *q;
	size_t size;
};

static bool scene_open(struct t_peer *p, struct scene *s, int nrecv, int first, bool early)
{
	victim_open(&s->v, NULL);
	post_recvs(&s->v, nrecv);
	if (early)
		s->q = attack_map(s->v.r.qp->qp_num, &s->size, NULL);
	t_connect_pair(p, &s->v.r, s->v.mr, NULL);
	if (first)
		REQUIRE(send_some(p, first) == first, "the first messages");
	if (!early)
		s->q = attack_map(s->v.r.qp->qp_num, &s->size, NULL);
	return s->q != NULL;
}

static void scene_close(struct t_peer *p, struct scene *s)
{
	if (s->q)
		munmap(s->q, s->size);
	CHECK(guards_intact(&s->v), "guard bytes changed");
	sender_stop(p);
	victim_close(&s->v);
}

/* rq_done, the deliverers' own mark, moved after `first` messages arrived:
 * - far ahead: the owner takes completions by each entry's tag and never
 *   reads it, so no completion is made up; the sender finds the ring
 *   corrupt;
 * - back onto a receive the owner already took (and has not posted
 *   again): a sender that trusted it would copy through that slot's old
 *   SGEs into memory no longer lent to the queue, and its Send would
 *   complete with no completion at the receiver; the slot's tag says it is
 *   not posted.
 * Either way the next Send fails (REM_OP_ERR) and the victim's QP goes to
 * ERR as a responder's does for a request it cannot take (QP_ACCESS_ERR),
 * its receives flushed.  Over TCP the victim's own receive path finds it:
 * QP_FATAL. */
struct moved {
	int first;
	int32_t delta;
	enum ibv_event_type want;
};
static const struct moved done_forward = { 1, 100000, IBV_EVENT_QP_ACCESS_ERR },
			  done_backward = { 2, -2, IBV_EVENT_QP_ACCESS_ERR },
			  done_backward_tcp = { 2, -2, IBV_EVENT_QP_FATAL };

static void done_moved(struct t_peer *p, void *arg)
{
	const struct moved *m = arg;
	struct scene s;
	int ok, bad, fl;

	if (scene_open(p, &s, NRECV, m->first, false)) {
		count_recvs(&s.v, m->first, &ok, &bad, &fl);
		CHECK(ok == m->first, "the first messages arrived (%d of %d)", ok, m->first);
		atomic_fetch_add(&s.q->rq_done, (uint32_t)m->delta);
		CHECK(send_some(p, 1) == 0, "a Send into a ring whose mark moved by %d",
		      (int)m->delta);
		count_recvs(&s.v, NRECV - m->first, &ok, &bad, &fl);
		CHECK(ok == 0 && bad == 0 && fl == NRECV - m->first,
		      "after the scribble: %d ok, %d errors, %d flushed (want 0, 0, %d)", ok,
		      bad, fl, NRECV - m->first);
		CHECK(wait_qp_event(&s.v, WAIT_MS) == (int)m->want, "%s",
		      ibv_event_type_str(m->want));
		CHECK(t_qp_state(s.v.r.qp) == IBV_QPS_ERR, "the QP is in ERR");
	}
	scene_close(p, &s);
}

/* rq_done past rq_prod: once that made ibv_post_recv fail with ENOMEM for
 * ever.  The owner does not read it: receives are posted and taken as
 * before once the deliverer's mark is put back. */
static void done_past_prod(struct t_peer *p, void *arg)
{
	struct scene s;
	int ok, bad, fl;

	if (scene_open(p, &s, 2, 0, false)) {
		uint32_t was = atomic_load(&s.q->rq_done);

		atomic_store(&s.q->rq_done, atomic_load(&s.q->rq_prod) + 5);
		CHECK(t_post_recv(s.v.r.qp, 102, s.v.buf, 64, s.v.mr->lkey) == 0,
		      "post_recv after the scribble");
		count_recvs(&s.v, 0, &ok, &bad, &fl);
		atomic_store(&s.q->rq_done, was);
		CHECK(send_some(p, 3) == 3, "Sends once the mark is back");
		count_recvs(&s.v, 3, &ok, &bad, &fl);
		CHECK(ok == 3 && bad == 0 && fl == 0, "%d ok, %d errors, %d flushed", ok, bad,
		      fl);
	}
	scene_close(p, &s);
}

/* The ring's geometry rewritten after the connection: the sender copied
 * and checked it when it connected, and the owner never reads it back, so
 * traffic goes on into the right buffers. */
static void geometry_after_connect(struct t_peer *p, void *arg)
{
	struct scene s;
	int ok, bad, fl;

	if (scene_open(p, &s, NRECV, 1, false)) {
		s.q->rq_offset = 0x7fffff00;
		s.q->rq_size = 1u << 30;
		s.q->rq_stride = 8;
		s.q->rq_max_sge = 100000;
		CHECK(send_some(p, NRECV - 1) == NRECV - 1, "messages after the scribble");
		count_recvs(&s.v, NRECV, &ok, &bad, &fl);
		CHECK(ok == NRECV, "%d of %d arrived", ok, NRECV);
		for (int i = 0; i < NRECV; i++)
			CHECK(s.v.buf[i * 64] == 'a' + (i ? i - 1 : 0), "receive %d holds %#x",
			      i, s.v.buf[i * 64]);
	}
	scene_close(p, &s);
}

/* The geometry made impossible before the sender connects: the sender's
 * check refuses the block, its sends fail (RETRY_EXC), the victim is
 * untouched. */
static void geometry_before_connect(struct t_peer *p, void *arg)
{
	struct scene s;

	victim_open(&s.v, NULL);
	post_recvs(&s.v, NRECV);
	s.q = attack_map(s.v.r.qp->qp_num, &s.size, NULL);
	if (s.q) {
		s.q->rq_max_sge = 100000; /* would overflow an on-stack array */
		s.q->rq_stride = 16;
	}
	t_connect_pair(p, &s.v.r, s.v.mr, NULL);
	CHECK(send_some(p, 1) == 0, "a send into a block that can't be");
	scene_close(p, &s);
}

/* Entry 0 completed by someone else with byte_len and inline_len, as a
 * completion that can't be: not reported; the QP goes to ERR (QP_FATAL). */
static void bogus_entry(struct t_peer *p, uint32_t byte_len, uint32_t inline_len)
{
	struct scene s;
	int ok, bad, fl;

	if (scene_open(p, &s, 2, 0, false)) {
		struct urdma_shm_rqe *e = ring_entry(s.q, 0);

		e->status = IBV_WC_SUCCESS;
		e->opcode = IBV_WC_RECV;
		e->byte_len = byte_len;
		e->inline_len = inline_len;
		e->srq_qpn = 0xdead; /* an SRQ field: meaningless here */
		atomic_store(&e->tag, 1); /* published, as entry 0 */
		count_recvs(&s.v, 2, &ok, &bad, &fl);
		CHECK(ok == 0 && fl == 2, "%d ok, %d errors, %d flushed", ok, bad, fl);
		CHECK(wait_qp_event(&s.v, WAIT_MS) == IBV_EVENT_QP_FATAL, "QP_FATAL");
	}
	scene_close(p, &s);
}

/* A Send longer than the receive (which holds 64). */
static void bogus_completion(struct t_peer *p, void *arg)
{
	bogus_entry(p, 1 << 20, 0);
}

/* A payload in the entry (inline_len) of a length that does not match the
 * completion's, and more than an entry holds: nothing is copied. */
static void bogus_inline(struct t_peer *p, void *arg)
{
	bogus_entry(p, 8, 64);
}

/* Receive WRs rewritten under the sender: a huge SGE count, bad keys.  The
 * sender uses at most the SGEs the QP has and checks every key: the
 * receive fails (LOC_PROT_ERR), nothing lands outside the buffer. */
static void entry_scribble(struct t_peer *p, void *arg)
{
	struct scene s;
	int ok, bad, fl;

	if (scene_open(p, &s, 2, 0, false)) {
		struct urdma_shm_rqe *e = ring_entry(s.q, 0);

		e->num_sge = 0xffffffff;
		e->sge[0].addr = (uintptr_t)s.v.mem; /* the guard */
		e->sge[0].length = 4096;
		CHECK(send_some(p, 1) == 0, "a send into a rewritten receive");
		count_recvs(&s.v, 2, &ok, &bad, &fl);
		CHECK(ok == 0 && bad == 1 && fl == 1, "%d ok, %d errors, %d flushed", ok, bad,
		      fl);
	}
	scene_close(p, &s);
}

static double cpu_seconds(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
	       (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Someone holds the ring's busy flag for ever (a stopped or hostile
 * process): leaving RTR does not wait for it, the receives are flushed
 * within a few seconds, destroying the QP returns, and nothing spins. */
static void busy_forever(struct t_peer *p, void *arg)
{
	struct scene s;
	int ok, bad, fl;
	double t0, c0;

	if (scene_open(p, &s, 2, 0, false)) {
		struct timespec one = {1, 0};

		atomic_store(&s.q->busy, 1);
		t0 = now_s();
		CHECK(t_modify_state(s.v.r.qp, IBV_QPS_ERR) == 0, "modify to ERR");
		CHECK(now_s() - t0 < 0.5, "modify to ERR took %.2f s", now_s() - t0);
		/* The library's own CPU time while it waits (this thread
		 * sleeps instead of polling). */
		c0 = cpu_seconds();
		nanosleep(&one, NULL);
		CHECK(cpu_seconds() - c0 < 0.2, "%.2f s of CPU in 1 s of waiting",
		      cpu_seconds() - c0);
		count_recvs(&s.v, 2, &ok, &bad, &fl);
		CHECK(fl == 2, "%d flushed", fl);
		CHECK(now_s() - t0 < 4.5, "the flush took %.2f s", now_s() - t0);
		t0 = now_s();
		CHECK(ibv_destroy_qp(s.v.r.qp) == 0, "destroy");
		s.v.r.qp = NULL;
		CHECK(now_s() - t0 < 2.5, "destroy took %.2f s", now_s() - t0);
	}
	scene_close(p, &s);
}

/* What the memfds handed to a peer allow: not shrinking (the victim's own
 * mappings would fault), not writing the MR table, not sealing. */
static void seals(void *arg)
{
	struct victim v;
	struct urdma_shm_qp *q;
	size_t size;
	int fds[2];

	victim_open(&v, NULL);
	q = attack_map(v.r.qp->qp_num, &size, fds);
	if (q) {
		CHECK(ftruncate(fds[1], 4096) && errno == EPERM, "the memfd shrinks");
		CHECK(ftruncate(fds[0], 0) && errno == EPERM, "the MR table shrinks");
		CHECK(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0) ==
			      MAP_FAILED,
		      "the MR table maps writable");
		CHECK(fcntl(fds[1], F_ADD_SEALS, F_SEAL_FUTURE_WRITE) && errno == EPERM,
		      "the memfd takes a seal");
		close(fds[0]);
		close(fds[1]);
		munmap(q, size);
		/* Still in order. */
		post_recvs(&v, 1);
	}
	victim_close(&v);
}

/* A fake context: a socket of ours in the host directory whose hello hands
 * over what it should not.  Each one is refused, every fd it sent is
 * closed, and the file it tried to pass for memory is untouched. */
struct fake_ctx {
	int lfd;
	int kind;
	char file[256];
	pthread_t th;
	volatile bool stop;
	int conns[256];
	int nconns;
};

static void fake_hello(struct fake_ctx *f, int fd)
{
	int fds[5], nfds = 2;
	struct urdma_hello h = {.magic = URDMA_SHM_MAGIC, .version = URDMA_SHM_VERSION,
				.ctx_id = 0x51, .nfds = 2};
	union {
		char buf[CMSG_SPACE(sizeof(int) * 5)];
		struct cmsghdr align;
	} u = {0};
	struct iovec iov = {.iov_base = &h, .iov_len = sizeof(h)};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf};
	struct cmsghdr *c = (struct cmsghdr *)u.buf;

	fds[0] = memfd_create("fake-mrs", MFD_ALLOW_SEALING);
	if (ftruncate(fds[0], sizeof(struct urdma_shm_ctx)))
		fds[0] = -1;
	switch (f->kind) {
	case 0: /* a file for memory */
		fds[1] = open(f->file, O_RDWR);
		break;
	case 1: /* an unsealed memfd */
		fds[1] = memfd_create("fake", 0);
		if (ftruncate(fds[1], 1ull << 47))
			fds[1] = -1;
		break;
	case 2: /* five fds */
		for (int i = 1; i < 5; i++)
			fds[i] = open("/dev/null", O_RDONLY);
		nfds = 5;
		h.nfds = 5;
		break;
	default: /* another context's id */
		fds[1] = memfd_create("fake", MFD_ALLOW_SEALING);
		if (ftruncate(fds[1], 1ull << 47) ||
		    fcntl(fds[1], F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW))
			fds[1] = -1;
		h.ctx_id = 0x52;
		break;
	}
	m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
	memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	if (sendmsg(fd, &m, 0) < 0)
		perror("fake hello");
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
}

/* Every connection gets the bad hello and stays open until the end. */
static void *fake_ctx_main(void *arg)
{
	struct fake_ctx *f = arg;

	while (!f->stop) {
		struct pollfd pf = {.fd = f->lfd, .events = POLLIN};
		int fd;

		if (poll(&pf, 1, 50) != 1)
			continue;
		fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		fake_hello(f, fd);
		if (f->nconns < 256)
			f->conns[f->nconns++] = fd;
		else
			close(fd);
	}
	for (int i = 0; i < f->nconns; i++)
		close(f->conns[i]);
	return NULL;
}

static int count_fds(void)
{
	int n = 0;

	for (int fd = 0; fd < 4096; fd++)
		n += fcntl(fd, F_GETFD) >= 0;
	return n;
}

static void bad_hello(void *arg)
{
	char dir[200], path[512];
	struct fake_ctx f = {.kind = (int)(intptr_t)arg};
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct urdma_qp_rec rec = {.magic = URDMA_SHM_MAGIC, .version = URDMA_SHM_VERSION,
				   .qpn = 0xfe0051, .ctx_id = 0x51, .va = 1ull << 40,
				   .size = 8192};
	struct t_opts o = t_opts_default();
	struct t_conn peer = {.qpn = rec.qpn, .lid = 0};
	struct t_res r;
	struct ibv_wc wc;
	char *buf = t_alloc(BUF);
	struct ibv_mr *mr;
	struct stat st0, st1;
	int fd, fds0;

	host_dir(dir, sizeof(dir));
	snprintf(f.file, sizeof(f.file), "%.200s/../urdma-test-victim-%d", dir, (int)getpid());
	fd = open(f.file, O_RDWR | O_CREAT | O_TRUNC, 0644);
	REQUIRE(fd >= 0 && write(fd, "third party\n", 12) == 12, "the third-party file");
	close(fd);
	stat(f.file, &st0);

	o.use_gid = false; /* a LID: a peer on this host */
	o.timeout = 10;
	o.retry_cnt = 2;
	/* The process's own: the host directory and the identity memfd. */
	ibv_close_device(t_open_first_device());
	fds0 = count_fds();
	t_res_open(&r, &o);
	snprintf(path, sizeof(path), "%s/qp-%x", dir, rec.qpn);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	REQUIRE(fd >= 0 && write(fd, &rec, sizeof(rec)) == sizeof(rec), "the fake record");
	close(fd);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%.90s/ctx-51", dir);
	unlink(sa.sun_path);
	f.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	REQUIRE(f.lfd >= 0 && !bind(f.lfd, (struct sockaddr *)&sa, sizeof(sa)) &&
			!listen(f.lfd, 4),
		"the fake context's socket");
	pthread_create(&f.th, NULL, fake_ctx_main, &f);

	mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	memset(buf, 'x', 64);
	peer.lid = r.port_attr.lid;
	t_connect(&r, &peer);
	REQUIRE(t_post_send(r.qp, 1, IBV_WR_SEND, buf, 64, mr->lkey, IBV_SEND_SIGNALED, 0, 0) ==
			0,
		"post_send");
	if (CHECK(t_poll(r.send_cq, &wc, 1, WAIT_MS) == 1, "no completion"))
		CHECK(wc.status == IBV_WC_RETRY_EXC_ERR, "send status %s",
		      ibv_wc_status_str(wc.status));
	stat(f.file, &st1);
	CHECK(st1.st_size == st0.st_size && st1.st_mtime == st0.st_mtime,
	      "the third-party file changed");
	t_res_close(&r);
	f.stop = true;
	pthread_join(f.th, NULL);
	close(f.lfd);
	/* Every fd the hellos brought is closed, with the device. */
	CHECK(count_fds() == fds0, "fds: %d before the device, %d after", fds0, count_fds());
	unlink(sa.sun_path);
	unlink(path);
	unlink(f.file);
	free(buf);
}

/* Files planted in the host directory: a FIFO and a symlink where a QP
 * record and a context socket belong.  Opening a device (which sweeps the
 * directory) does not block on the FIFO, and a QP connecting to those
 * numbers finds nothing instead of following or waiting. */
static void planted_files(void *arg)
{
	char dir[200], fifo[512], link[512], ctx[512];
	struct t_opts o = t_opts_default();
	struct t_conn peer = {0};
	struct ibv_context *c;
	struct ibv_wc wc;
	struct t_res r;
	char *buf = t_alloc(BUF);
	struct ibv_mr *mr;
	double t0;

	host_dir(dir, sizeof(dir));
	mkdir(dir, 0700); /* before this process opens a device: its sweep */
	snprintf(fifo, sizeof(fifo), "%s/qp-fe0052", dir);
	snprintf(link, sizeof(link), "%s/qp-fe0053", dir);
	snprintf(ctx, sizeof(ctx), "%s/ctx-53", dir);
	unlink(fifo);
	unlink(link);
	unlink(ctx);
	REQUIRE(mkfifo(fifo, 0600) == 0 && symlink("/etc/passwd", link) == 0 &&
			mkfifo(ctx, 0600) == 0,
		"planting: %m");

	t0 = now_s();
	c = t_open_first_device();
	CHECK(now_s() - t0 < 2, "opening the device took %.1f s", now_s() - t0);
	ibv_close_device(c);
	o.use_gid = false;
	o.timeout = 10;
	o.retry_cnt = 2;
	t_res_open(&r, &o);
	mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	for (uint32_t qpn = 0xfe0052; qpn <= 0xfe0053; qpn++) {
		if (t_modify_state(r.qp, IBV_QPS_RESET))
			break;
		peer.qpn = qpn;
		peer.lid = r.port_attr.lid;
		t0 = now_s();
		t_connect(&r, &peer);
		CHECK(now_s() - t0 < 2, "connecting to qp %#x took %.1f s", qpn, now_s() - t0);
		t_post_send(r.qp, 1, IBV_WR_SEND, buf, 16, mr->lkey, IBV_SEND_SIGNALED, 0, 0);
		if (CHECK(t_poll(r.send_cq, &wc, 1, WAIT_MS) == 1, "no completion"))
			CHECK(wc.status == IBV_WC_RETRY_EXC_ERR, "qp %#x: %s", qpn,
			      ibv_wc_status_str(wc.status));
	}
	t_res_close(&r);
	unlink(fifo);
	unlink(link);
	unlink(ctx);
	free(buf);
}

/*
 * The lock word of atomics on a direct MR (shared.h: atomic_lock) is in the
 * owner's memfd, where any peer can write.  Held by a process that died, it
 * is taken over and the atomic succeeds; held by a live one for good, the
 * atomic fails (REM_OP_ERR) within a few seconds instead of hanging.
 */
static void lock_owner(struct t_peer *p, void *arg)
{
	struct t_res r;
	uint64_t *word = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *mr;

	(void)arg;
	REQUIRE(word != MAP_FAILED, "mmap");
	t_res_open(&r, NULL);
	mr = t_reg(&r, word, 4096,
		   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	t_connect_pair(p, &r, mr, NULL);
	t_barrier_timeout(p, 20000);
	CHECK(*word == 5, "the counter is %llu, not 5 (one fetch-and-add)",
	      (unsigned long long)*word);
	t_res_close(&r);
	munmap(word, 4096);
}

static void lock_taker(struct t_peer *p, void *arg)
{
	struct t_conn remote;
	struct urdma_qp_rec rec;
	const struct urdma_shm_ctx *tbl;
	_Atomic uint64_t *lock;
	struct ibv_wc wc;
	struct t_res r;
	uint64_t *res = t_alloc(4096), lva, t0;
	struct ibv_mr *mr;
	int fds[2];
	pid_t dead;

	(void)arg;
	t_res_open(&r, NULL);
	mr = t_reg(&r, res, 4096, IBV_ACCESS_LOCAL_WRITE);
	t_connect_pair(p, &r, NULL, &remote);
	REQUIRE(read_record(remote.qpn, &rec), "record of qp %#x", remote.qpn);
	REQUIRE(take_hello(rec.ctx_id, fds), "hello of context %x", rec.ctx_id);
	tbl = mmap(NULL, sizeof(*tbl), PROT_READ, MAP_SHARED, fds[0], 0);
	REQUIRE(tbl != MAP_FAILED, "MR table");
	lva = atomic_load(&tbl->atomic_lock);
	REQUIRE(lva && !(lva & 7), "a direct MR's table names its lock (%#llx)",
		(unsigned long long)lva);
	lock = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1],
		    (off_t)(lva & ~4095ull));
	REQUIRE(lock != MAP_FAILED, "mapping the lock");
	lock += (lva & 4095) / 8;

	/* Held by a process that is gone. */
	dead = fork();
	if (dead == 0)
		_exit(0);
	REQUIRE(dead > 0 && waitpid(dead, NULL, 0) == dead, "a dead pid");
	atomic_store(lock, (uint64_t)dead);
	REQUIRE(t_post_atomic(r.qp, 0, IBV_WR_ATOMIC_FETCH_AND_ADD, res,
			      mr->lkey, remote.addr, remote.rkey, 5, 0) == 0,
		"post");
	CHECK(t_expect_wc(r.send_cq, &wc, 0, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD,
			  "fetch-and-add past a dead holder"),
	      "taken over");
	CHECK(atomic_load(lock) == 0, "the lock is free again: %llu",
	      (unsigned long long)atomic_load(lock));

	/* Held for good by a live process (the owner itself). */
	atomic_store(lock, (uint64_t)p->child_pid);
	t0 = t_now_ms();
	REQUIRE(t_post_atomic(r.qp, 1, IBV_WR_ATOMIC_FETCH_AND_ADD, res,
			      mr->lkey, remote.addr, remote.rkey, 100, 0) == 0,
		"post");
	CHECK(t_expect_wc(r.send_cq, &wc, 1, IBV_WC_REM_OP_ERR, -1,
			  "fetch-and-add behind a live holder"),
	      "fails");
	CHECK(t_now_ms() - t0 < 5000, "it took %llu ms",
	      (unsigned long long)(t_now_ms() - t0));
	CHECK(atomic_load(lock) == (uint64_t)p->child_pid, "the holder keeps it");
	atomic_store(lock, 0);
	t_barrier_timeout(p, 20000);
	t_res_close(&r);
	close(fds[0]);
	close(fds[1]);
	free(res);
}

/* ---- an SRQ's ring, written by a hostile or dying peer ---- */

/* One process: QP a on an SRQ with WRs 1 and 2 posted (64 bytes each), QP b
 * (its own receive queue) connected to it, sending. */
struct srq_scene {
	struct t_res r;
	struct ibv_srq *srq;
	struct ibv_qp *a, *b;
	uint8_t *buf;
	struct ibv_mr *mr;
};

static void srq_scene_open(struct srq_scene *s)
{
	struct t_opts o = t_opts_default();
	struct t_conn ca, cb;

	o.create_qp = false;
	o.separate_cqs = true;
	t_res_open(&s->r, &o);
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
	s->srq = ibv_create_srq(s->r.pd, &sa);
	REQUIRE(s->srq, "ibv_create_srq: %s", strerror(errno));
	s->buf = t_alloc(BUF);
	s->mr = t_reg(&s->r, s->buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	for (uint64_t id = 1; id <= 2; id++) {
		struct ibv_sge sge = {(uintptr_t)s->buf + id * 64, 64, s->mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1}, *bad;
		REQUIRE(ibv_post_srq_recv(s->srq, &wr, &bad) == 0, "ibv_post_srq_recv");
	}
	struct ibv_qp_init_attr qa = {.send_cq = s->r.send_cq, .recv_cq = s->r.recv_cq,
				      .srq = s->srq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_send_sge = 1}};
	s->a = ibv_create_qp(s->r.pd, &qa);
	qa.srq = NULL;
	qa.cap.max_recv_wr = 1;
	qa.cap.max_recv_sge = 1;
	s->b = ibv_create_qp(s->r.pd, &qa);
	REQUIRE(s->a && s->b, "ibv_create_qp: %s", strerror(errno));
	s->r.qp = s->a;
	t_conn_local(&s->r, NULL, &ca);
	s->r.qp = s->b;
	t_conn_local(&s->r, NULL, &cb);
	t_connect(&s->r, &ca);
	s->r.qp = s->a;
	t_connect(&s->r, &cb);
	s->r.qp = NULL;
}

static void srq_scene_close(struct srq_scene *s)
{
	CHECK(ibv_destroy_qp(s->a) == 0 && ibv_destroy_qp(s->b) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_srq(s->srq) == 0, "ibv_destroy_srq");
	t_res_close(&s->r);
	free(s->buf);
}

/* In a child process, map the SRQ of our QP qpn as a peer would and do
 * act to it; the child exits (dies) right after. */
static void srq_attack(uint32_t qpn, void (*act)(struct urdma_shm_srq *))
{
	pid_t pid = fork();

	REQUIRE(pid >= 0, "fork");
	if (!pid) {
		size_t size;
		int fds[2];
		struct urdma_shm_qp *q = attack_map(qpn, &size, fds);
		void *m = q ? mmap(NULL, q->srq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
				   fds[1], (off_t)q->srq_va) : MAP_FAILED;

		if (m == MAP_FAILED)
			_exit(2);
		act(m);
		_exit(0);
	}
	int st;
	REQUIRE(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		"the attacking child failed (status %#x)", st);
}

static struct urdma_shm_rqe *srq_ring_entry(struct urdma_shm_srq *q, uint32_t idx)
{
	return (struct urdma_shm_rqe *)((uint8_t *)q + sizeof(*q) +
					(size_t)(idx & (q->rq_size - 1)) * q->rq_stride);
}

/* b sends one 16-byte message; true if it completed. */
static bool srq_send(struct srq_scene *s, char c)
{
	struct ibv_wc wc;

	memset(s->buf, c, 16);
	return t_post_send(s->b, (uint64_t)c, IBV_WR_SEND, s->buf, 16, s->mr->lkey,
			   IBV_SEND_SIGNALED, 0, 0) == 0 &&
	       t_poll(s->r.send_cq, &wc, 1, WAIT_MS) == 1 && wc.status == IBV_WC_SUCCESS;
}

/* A receive of a within ms: its wr_id, or 0 (none, or not a clean one). */
static uint64_t srq_recv(struct srq_scene *s, int ms)
{
	struct ibv_wc wc;

	if (t_poll(s->r.recv_cq, &wc, 1, ms) != 1)
		return 0;
	CHECK(wc.status == IBV_WC_SUCCESS && wc.qp_num == s->a->qp_num && wc.byte_len == 16,
	      "receive %llu: %s, qp %#x, %u bytes", (unsigned long long)wc.wr_id,
	      ibv_wc_status_str(wc.status), wc.qp_num, wc.byte_len);
	return wc.wr_id;
}

static void claim_and_die(struct urdma_shm_srq *q)
{
	uint32_t c = atomic_load(&q->claim);

	if (atomic_compare_exchange_strong(&q->claim, &c, c + 1))
		srq_ring_entry(q, c)->srq_pid = (uint32_t)getpid();
}

/* A peer claims WR 1 and dies before it publishes: after the bounded wait
 * (2 s) the WR is posted again; nothing is lost, nothing made up. */
static void srq_claimer_died(void *arg)
{
	struct srq_scene s;

	srq_scene_open(&s);
	srq_attack(s.a->qp_num, claim_and_die);
	CHECK(srq_send(&s, 'x'), "a send after the claimer died");
	uint64_t t0 = t_now_ms(), id = srq_recv(&s, WAIT_MS);
	CHECK(id == 2, "the message took WR %llu, expected 2 (after %llu ms)",
	      (unsigned long long)id, (unsigned long long)(t_now_ms() - t0));
	CHECK(srq_send(&s, 'y'), "a second send");
	id = srq_recv(&s, WAIT_MS);
	CHECK(id == 1, "the WR the dead peer held was not posted again (got %llu)",
	      (unsigned long long)id);
	CHECK(srq_recv(&s, 200) == 0, "a completion made up");
	srq_scene_close(&s);
}

static void claim_far(struct urdma_shm_srq *q)
{
	atomic_store(&q->claim, atomic_load(&q->prod) + 100);
}

/* The claim index past what was posted: IBV_EVENT_SRQ_ERR, no completion. */
static void srq_claim_past_posted(void *arg)
{
	struct srq_scene s;
	struct ibv_async_event ev;
	struct pollfd pf;

	srq_scene_open(&s);
	srq_attack(s.a->qp_num, claim_far);
	CHECK(srq_recv(&s, 300) == 0, "a completion made up from a scribbled claim index");
	pf = (struct pollfd){.fd = s.r.ctx->async_fd, .events = POLLIN};
	REQUIRE(poll(&pf, 1, WAIT_MS) == 1 && ibv_get_async_event(s.r.ctx, &ev) == 0,
		"no async event");
	CHECK(ev.event_type == IBV_EVENT_SRQ_ERR && ev.element.srq == s.srq,
	      "event %s, expected SRQ_ERR", ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);
	srq_scene_close(&s);
}

static void publish_for_nobody(struct urdma_shm_srq *q)
{
	uint32_t c = atomic_load(&q->claim);
	struct urdma_shm_rqe *e = srq_ring_entry(q, c);

	if (!atomic_compare_exchange_strong(&q->claim, &c, c + 1))
		return;
	e->status = IBV_WC_SUCCESS;
	e->opcode = IBV_WC_RECV;
	e->byte_len = 16;
	e->srq_qpn = 0xdead;
	atomic_store(&e->tag, c + 1);
}

/* An entry published for a QP that is not on the SRQ: no completion; its
 * WR goes back to the SRQ and the next messages take both. */
static void tag_for_no_qp(void *arg)
{
	struct srq_scene s;

	srq_scene_open(&s);
	srq_attack(s.a->qp_num, publish_for_nobody);
	CHECK(srq_recv(&s, 200) == 0, "a completion for a QP that is not ours");
	CHECK(srq_send(&s, 'x') && srq_send(&s, 'y'), "two sends");
	uint64_t a = srq_recv(&s, WAIT_MS), b = srq_recv(&s, WAIT_MS);
	CHECK(a == 2 && b == 1, "the messages took WRs %llu and %llu, expected 2 then 1",
	      (unsigned long long)a, (unsigned long long)b);
	srq_scene_close(&s);
}

int main(int argc, char **argv)
{
	setenv("URDMA_TRANSPORT", "shm", 1);
	t_init(argc, argv);
	t_set_case_timeout(40);
	t_pair("done_forward", done_moved, sender, (void *)&done_forward);
	t_pair("done_backward", done_moved, sender, (void *)&done_backward);
	/* The same over TCP: the victim's receive path reads rq_done. */
	setenv("URDMA_TRANSPORT", "tcp", 1);
	t_pair("done_backward_tcp", done_moved, sender, (void *)&done_backward_tcp);
	setenv("URDMA_TRANSPORT", "shm", 1);
	t_pair("done_past_prod", done_past_prod, sender, NULL);
	t_pair("geometry_after_connect", geometry_after_connect, sender, NULL);
	t_pair("geometry_before_connect", geometry_before_connect, sender, NULL);
	t_pair("bogus_completion", bogus_completion, sender, NULL);
	t_pair("bogus_inline", bogus_inline, sender, NULL);
	t_pair("entry_scribble", entry_scribble, sender, NULL);
	t_pair("busy_forever", busy_forever, sender, NULL);
	t_pair("direct_atomic_lock", lock_taker, lock_owner, NULL);
	t_case("seals", seals, NULL);
	t_case("hello_file_for_memory", bad_hello, (void *)0);
	t_case("hello_unsealed_memfd", bad_hello, (void *)1);
	t_case("hello_five_fds", bad_hello, (void *)2);
	t_case("hello_wrong_context", bad_hello, (void *)3);
	t_case("planted_files", planted_files, NULL);
	t_case("srq_claimer_died", srq_claimer_died, NULL);
	t_case("srq_claim_past_posted", srq_claim_past_posted, NULL);
	t_case("tag_for_no_qp", tag_for_no_qp, NULL);
	return t_finish();
}
