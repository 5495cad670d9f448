/* SPDX-License-Identifier: MIT */
/*
 * Conformance: completion events through a completion channel:
 * ibv_req_notify_cq, ibv_get_cq_event, ibv_ack_cq_events, solicited-only
 * arming, and the channel fd with poll() and O_NONBLOCK.
 *
 * Semantics (IB spec, ibv_req_notify_cq(3)):
 *  - arming is one-shot: after an event the CQ must be re-armed;
 *  - armed with solicited_only = 0: the next completion raises an event;
 *  - armed with solicited_only = 1: only the next *solicited* completion
 *    (a SEND with IBV_SEND_SOLICITED) or an error completion raises one.
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

struct side {
	struct t_res r;
	char *buf;
	struct ibv_mr *mr;
};

static void side_open_opts(struct side *s, const struct t_opts *o)
{
	t_res_open(&s->r, o);
	s->buf = t_alloc(65536);
	s->mr = t_reg(&s->r, s->buf, 65536, IBV_ACCESS_LOCAL_WRITE);
}

static void side_open(struct side *s, bool channel)
{
	struct t_opts o = t_opts_default();
	o.use_channel = channel;
	o.separate_cqs = true;
	side_open_opts(s, &o);
}

static void side_close(struct side *s)
{
	t_res_close(&s->r);
	free(s->buf);
}

/* n receives of 64 bytes each, wr_ids first, first + 1... */
static void post_recvs(struct side *s, int n, uint64_t first)
{
	for (int i = 0; i < n; i++)
		REQUIRE(t_post_recv(s->r.qp, first + (uint64_t)i, s->buf + 64 * i, 64,
				    s->mr->lkey) == 0, "ibv_post_recv");
}

static void send_one(struct side *s, uint64_t wr_id, unsigned flags)
{
	int ret = t_post_send(s->r.qp, wr_id, IBV_WR_SEND, s->buf, 32, s->mr->lkey,
			      IBV_SEND_SIGNALED | flags, 0, 0);
	REQUIRE(ret == 0, "ibv_post_send: %d", ret);
}

/* ---- An event for a send completion ---- */

static void send_event_parent(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, true);
	t_connect_pair(p, &s.r, s.mr, NULL);
	REQUIRE(ibv_req_notify_cq(s.r.send_cq, 0) == 0, "ibv_req_notify_cq(send CQ)");
	/* Also arm the recv CQ: it gets no completion, so no event. */
	REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq(recv CQ)");
	t_barrier(p); /* the peer's receive is posted */
	send_one(&s, 1, 0);
	CHECK(t_fd_readable(s.r.channel->fd, T_WAIT_MS), "no event for the send completion within %d ms",
	      T_WAIT_MS);
	struct ibv_cq *cq = NULL;
	void *ctx = NULL;
	int ret = ibv_get_cq_event(s.r.channel, &cq, &ctx);
	CHECK(ret == 0, "ibv_get_cq_event: %d (errno %d)", ret, errno);
	if (ret == 0) {
		CHECK(cq == s.r.send_cq, "the event names CQ %p, expected the send CQ %p", (void *)cq,
		      (void *)s.r.send_cq);
		CHECK(ctx == &s.r, "the event carries cq_context %p, expected %p", ctx, (void *)&s.r);
		ibv_ack_cq_events(cq, 1);
	}
	t_expect_wc(s.r.send_cq, NULL, 1, IBV_WC_SUCCESS, IBV_WC_SEND, "send after its event");
	/* Nothing else is pending on the channel. */
	CHECK(!t_fd_readable(s.r.channel->fd, 100), "a second event arrived (recv CQ had nothing)");
	t_barrier(p);
	side_close(&s); /* destroy_cq waits for unacked events: all were acked */
}

static void plain_receiver(struct t_peer *p, void *arg)
{
	int n = arg ? (int)(uintptr_t)arg : 1;
	struct side s;
	side_open(&s, false);
	t_connect_pair(p, &s.r, s.mr, NULL);
	post_recvs(&s, n, 0);
	t_barrier(p);
	struct ibv_wc wc[16];
	int got = t_poll(s.r.recv_cq, wc, n, T_WAIT_MS);
	CHECK(got == n, "received %d of %d", got, n);
	t_barrier(p);
	side_close(&s);
}

/* ---- The receiver sleeps in ibv_get_cq_event while the sender sends ---- */

/* Sends what the receiver asks for, each after arg ms (NULL: 200), so
 * that the receiver is asleep by then. */
static void sender(struct t_peer *p, void *arg)
{
	unsigned pause_ms = arg ? (unsigned)(uintptr_t)arg : 200;
	struct side s;
	side_open(&s, false);
	t_connect_pair(p, &s.r, s.mr, NULL);
	for (int round = 0;; round++) {
		/* The receiver says what to send next: 0 = stop, else the
		 * send flags + 1. */
		uint64_t cmd = t_recv_u64(p, 30000);
		if (cmd == 0)
			break;
		t_sleep_ms(pause_ms);
		send_one(&s, (uint64_t)round, (unsigned)(cmd - 1));
		t_expect_wc(s.r.send_cq, NULL, (uint64_t)round, IBV_WC_SUCCESS, IBV_WC_SEND, "send");
	}
	t_barrier(p);
	side_close(&s);
}

static void ask(struct t_peer *p, unsigned flags) { t_send_u64(p, (uint64_t)flags + 1); }

static void sleeping_receiver(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, true);
	t_connect_pair(p, &s.r, s.mr, NULL);
	for (int i = 0; i < 3; i++)
		REQUIRE(t_post_recv(s.r.qp, 10u + (uint64_t)i, s.buf + 64 * i, 64, s.mr->lkey) == 0,
			"ibv_post_recv");

	/* 1: armed, asleep in ibv_get_cq_event (blocking; the watchdog
	 * bounds it). */
	REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq");
	ask(p, 0);
	uint64_t t0 = t_now_ms();
	struct ibv_cq *cq = NULL;
	void *ctx = NULL;
	int ret = ibv_get_cq_event(s.r.channel, &cq, &ctx);
	uint64_t slept = t_now_ms() - t0;
	REQUIRE(ret == 0, "ibv_get_cq_event: %d (errno %d)", ret, errno);
	CHECK(cq == s.r.recv_cq, "event for CQ %p, expected the recv CQ %p", (void *)cq,
	      (void *)s.r.recv_cq);
	CHECK(ctx == &s.r, "cq_context %p, expected %p", ctx, (void *)&s.r);
	CHECK(slept >= 100, "ibv_get_cq_event returned after %llu ms, before the send (sent after "
	      "200 ms)", (unsigned long long)slept);
	ibv_ack_cq_events(cq, 1);
	t_expect_wc(s.r.recv_cq, NULL, 10, IBV_WC_SUCCESS, IBV_WC_RECV, "receive after its event");

	/* 2: not re-armed: a completion arrives, no event. */
	ask(p, 0);
	t_expect_wc(s.r.recv_cq, NULL, 11, IBV_WC_SUCCESS, IBV_WC_RECV, "receive, CQ not armed");
	CHECK(!t_fd_readable(s.r.channel->fd, 200), "an event arrived for a CQ that was not re-armed");

	/* 3: re-armed: an event again. */
	REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq");
	ask(p, 0);
	t_wait_cq_event(s.r.channel, s.r.recv_cq, T_WAIT_MS);
	t_expect_wc(s.r.recv_cq, NULL, 12, IBV_WC_SUCCESS, IBV_WC_RECV, "receive after re-arming");

	t_send_u64(p, 0);
	t_barrier(p);
	side_close(&s);
}

/* ---- Solicited-only arming ---- */

static void solicited_receiver(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, true);
	t_connect_pair(p, &s.r, s.mr, NULL);
	for (int i = 0; i < 3; i++)
		REQUIRE(t_post_recv(s.r.qp, 20u + (uint64_t)i, s.buf + 64 * i, 64, s.mr->lkey) == 0,
			"ibv_post_recv");
	REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 1) == 0, "ibv_req_notify_cq(solicited_only = 1)");

	/* An unsolicited SEND: it completes, but raises no event. */
	ask(p, 0);
	struct ibv_wc wc;
	if (t_expect_wc(s.r.recv_cq, &wc, 20, IBV_WC_SUCCESS, IBV_WC_RECV, "unsolicited receive"))
		CHECK(!(wc.wc_flags & IBV_WC_WITH_IMM), "wc_flags 0x%x", wc.wc_flags);
	CHECK(!t_fd_readable(s.r.channel->fd, 300),
	      "an unsolicited SEND raised an event on a CQ armed for solicited completions only");

	/* A solicited SEND wakes it up. */
	ask(p, IBV_SEND_SOLICITED);
	if (t_wait_cq_event(s.r.channel, s.r.recv_cq, T_WAIT_MS))
		t_expect_wc(s.r.recv_cq, &wc, 21, IBV_WC_SUCCESS, IBV_WC_RECV, "solicited receive");
	else
		t_poll(s.r.recv_cq, &wc, 1, 100);

	/* Armed for everything, a solicited SEND raises an event too. */
	REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq(0)");
	ask(p, IBV_SEND_SOLICITED);
	if (t_wait_cq_event(s.r.channel, s.r.recv_cq, T_WAIT_MS))
		t_expect_wc(s.r.recv_cq, &wc, 22, IBV_WC_SUCCESS, IBV_WC_RECV, "third receive");
	t_send_u64(p, 0);
	t_barrier(p);
	side_close(&s);
}

/* ---- O_NONBLOCK channel fd ---- */

static void nonblocking_receiver(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, true);
	t_connect_pair(p, &s.r, s.mr, NULL);
	int fl = fcntl(s.r.channel->fd, F_GETFL);
	REQUIRE(fl >= 0 && fcntl(s.r.channel->fd, F_SETFL, fl | O_NONBLOCK) == 0,
		"fcntl(O_NONBLOCK) on the channel fd: %s", strerror(errno));
	REQUIRE(t_post_recv(s.r.qp, 30, s.buf, 64, s.mr->lkey) == 0, "ibv_post_recv");
	REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq");

	/* Nothing yet: the non-blocking get fails at once with EAGAIN (it
	 * is a read() on the fd in rdma-core). */
	struct ibv_cq *cq = NULL;
	void *ctx = NULL;
	uint64_t t0 = t_now_ms();
	errno = 0;
	int ret = ibv_get_cq_event(s.r.channel, &cq, &ctx);
	int err = errno;
	CHECK(ret == -1, "non-blocking ibv_get_cq_event with no event returned %d, expected -1", ret);
	CHECK(err == EAGAIN || err == EWOULDBLOCK, "errno %d (%s), expected EAGAIN", err,
	      strerror(err));
	CHECK(t_now_ms() - t0 < 1000, "non-blocking ibv_get_cq_event blocked");
	if (ret == 0)
		ibv_ack_cq_events(cq, 1);

	ask(p, 0);
	/* poll() reports the event... */
	struct pollfd pfd = {.fd = s.r.channel->fd, .events = POLLIN};
	int r = poll(&pfd, 1, T_WAIT_MS);
	CHECK(r == 1 && (pfd.revents & POLLIN), "poll(channel fd) returned %d revents 0x%x", r,
	      pfd.revents);
	/* ...and the non-blocking get then succeeds. */
	ret = ibv_get_cq_event(s.r.channel, &cq, &ctx);
	CHECK(ret == 0, "ibv_get_cq_event after POLLIN: %d (errno %d)", ret, errno);
	if (ret == 0) {
		CHECK(cq == s.r.recv_cq, "event for the wrong CQ");
		ibv_ack_cq_events(cq, 1);
	}
	t_expect_wc(s.r.recv_cq, NULL, 30, IBV_WC_SUCCESS, IBV_WC_RECV, "receive");
	/* Consumed: not readable any more. */
	r = poll(&pfd, 1, 0);
	CHECK(r == 0, "the channel fd is still readable after the event was consumed (%d)", r);
	t_send_u64(p, 0);
	t_barrier(p);
	side_close(&s);
}

/* ---- An error (flush) completion raises an event, even solicited-only ---- */

/* A receive posted on s's QP (in RESET), the recv CQ armed, the QP to
 * ERR: the flushed receive's event comes, then its completion. */
static void flushed_recv_event(struct side *s, uint64_t wr_id, int solicited_only)
{
	REQUIRE(t_modify_init(&s->r) == 0, "RESET->INIT");
	REQUIRE(t_post_recv(s->r.qp, wr_id, s->buf, 64, s->mr->lkey) == 0, "ibv_post_recv");
	REQUIRE(ibv_req_notify_cq(s->r.recv_cq, solicited_only) == 0,
		"ibv_req_notify_cq(solicited_only = %d)", solicited_only);
	REQUIRE(t_modify_state(s->r.qp, IBV_QPS_ERR) == 0, "-> ERR");
	t_wait_cq_event(s->r.channel, s->r.recv_cq, T_WAIT_MS);
	t_expect_wc(s->r.recv_cq, NULL, wr_id, IBV_WC_WR_FLUSH_ERR, -1, "flushed receive");
}

static void error_completion_event(void *arg)
{
	struct side s;
	side_open(&s, true);
	/* IB spec: a CQ armed for solicited completions is also triggered by
	 * a completion in error. */
	flushed_recv_event(&s, 50, 1);
	side_close(&s);
}

/* ---- A thread blocked in ibv_get_cq_event can be cancelled ----
 * rping cancels its CQ thread there and joins it: ibv_get_cq_event is a
 * cancellation point, as the read() in rdma-core's is. */

static void *blocked_getter(void *arg)
{
	struct ibv_comp_channel *ch = arg;
	struct ibv_cq *cq;
	void *ctx;

	ibv_get_cq_event(ch, &cq, &ctx);
	return NULL;
}

static void cancel_in_get_cq_event(void *arg)
{
	struct side s;
	pthread_t th;
	void *ret = NULL;

	side_open(&s, true);
	REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq");
	REQUIRE(pthread_create(&th, NULL, blocked_getter, s.r.channel) == 0, "pthread_create");
	t_sleep_ms(100); /* asleep in it */
	REQUIRE(pthread_cancel(th) == 0, "pthread_cancel");
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	int err = pthread_timedjoin_np(th, &ret, &until);
	REQUIRE(err == 0, "the cancelled thread did not end within 5 s (%s)", strerror(err));
	CHECK(ret == PTHREAD_CANCELED, "the thread returned instead of being cancelled");
	/* The channel still works: an error completion's event. */
	flushed_recv_event(&s, 7, 0);
	side_close(&s);
}

/* ---- Two CQs on one channel ---- */

static void two_cqs_one_channel(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	REQUIRE(ch, "ibv_create_comp_channel");
	int a, b;
	struct ibv_cq *ca = ibv_create_cq(ctx, 8, &a, ch, 0);
	struct ibv_cq *cb = ibv_create_cq(ctx, 8, &b, ch, 0);
	REQUIRE(ca && cb, "ibv_create_cq");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	struct ibv_qp_init_attr ia = {.send_cq = ca, .recv_cq = cb, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	REQUIRE(qp, "ibv_create_qp");
	struct ibv_qp_attr at = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	REQUIRE(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					      IBV_QP_ACCESS_FLAGS) == 0, "RESET->INIT");
	REQUIRE(ibv_req_notify_cq(ca, 0) == 0 && ibv_req_notify_cq(cb, 0) == 0, "arm");
	struct ibv_sge sge = {.addr = (uintptr_t)&a, .length = 0, .lkey = 0};
	struct ibv_recv_wr rw = {.wr_id = 1, .sg_list = &sge, .num_sge = 0}, *bad;
	REQUIRE(ibv_post_recv(qp, &rw, &bad) == 0, "ibv_post_recv");
	REQUIRE(t_modify_state(qp, IBV_QPS_ERR) == 0, "-> ERR");
	/* Only cb got a completion: exactly one event, naming cb. */
	struct ibv_cq *cq = NULL;
	void *cctx = NULL;
	if (CHECK(t_fd_readable(ch->fd, T_WAIT_MS), "no event") &&
	    CHECK(ibv_get_cq_event(ch, &cq, &cctx) == 0, "ibv_get_cq_event")) {
		CHECK(cq == cb && cctx == &b, "the event names the wrong CQ");
		ibv_ack_cq_events(cq, 1);
	}
	CHECK(!t_fd_readable(ch->fd, 100), "a second event arrived (the send CQ got nothing)");
	struct ibv_wc wc;
	CHECK(t_poll(cb, &wc, 1, T_WAIT_MS) == 1, "flushed receive missing");
	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_cq(ca) == 0 && ibv_destroy_cq(cb) == 0, "ibv_destroy_cq");
	CHECK(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel");
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

/* ---- ibv_get_cq_event while another thread registers memory ----
 * A registration of private memory stops the process's threads for a
 * moment with a signal (core/stop.c).  A waiter listed as runnable that is
 * asleep in ibv_get_cq_event by the time the signal comes takes it there,
 * and must wait again, as rdma-core's read() of the channel with
 * SA_RESTART does, not fail with EINTR (rping's completion thread exits on
 * that).  Rounds of a completion (a receive posted to a QP in ERR
 * completes flushed) that wakes the waiter, and a registration of fresh
 * memory. */
#define STOP_ROUNDS 1000

struct cq_waiter {
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	_Atomic int armed; /* rounds the waiter is ready for */
	atomic_bool quit;  /* the main thread gave up on it */
	_Atomic int got;   /* completions taken (read by the main thread) */
	int err;
};

static void *cq_waiter_main(void *arg)
{
	struct cq_waiter *w = arg;
	struct ibv_wc wc[8];

	while (atomic_load(&w->got) < STOP_ROUNDS && !atomic_load(&w->quit)) {
		struct ibv_cq *cq;
		void *ctx;
		int n;

		if (ibv_req_notify_cq(w->cq, 0)) {
			w->err = errno ? errno : EIO;
			break;
		}
		atomic_store(&w->armed, atomic_load(&w->got) + 1);
		n = ibv_poll_cq(w->cq, 8, wc);
		if (n > 0) {
			atomic_fetch_add(&w->got, n);
			continue;
		}
		if (ibv_get_cq_event(w->ch, &cq, &ctx)) {
			w->err = errno;
			break;
		}
		ibv_ack_cq_events(cq, 1);
	}
	atomic_store(&w->armed, STOP_ROUNDS + 1);
	return NULL;
}

static void cq_event_wait_survives_registration(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct cq_waiter w = { .ch = ibv_create_comp_channel(ctx) };
	size_t len = 2 * (size_t)sysconf(_SC_PAGESIZE);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	pthread_t t;

	REQUIRE(w.ch && pd, "a channel and a PD");
	w.cq = ibv_create_cq(ctx, STOP_ROUNDS + 8, NULL, w.ch, 0);
	REQUIRE(w.cq, "ibv_create_cq");
	struct ibv_qp_init_attr ia = { .send_cq = w.cq, .recv_cq = w.cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	REQUIRE(qp, "ibv_create_qp");
	REQUIRE(t_modify_state(qp, IBV_QPS_ERR) == 0, "-> ERR");
	REQUIRE(pthread_create(&t, NULL, cq_waiter_main, &w) == 0, "thread");
	for (int i = 0; i < STOP_ROUNDS; i++) {
		struct ibv_recv_wr rw = { .wr_id = (uint64_t)i }, *bad;
		uint64_t t0 = t_now_ms();

		while (atomic_load(&w.armed) <= i && t_now_ms() - t0 < T_WAIT_MS)
			sched_yield();
		if (atomic_load(&w.armed) > STOP_ROUNDS || atomic_load(&w.armed) <= i)
			break; /* the waiter failed, or is stuck */
		REQUIRE(ibv_post_recv(qp, &rw, &bad) == 0, "ibv_post_recv");
		t_reg_fresh(pd, len, i);
	}
	/* The last completion is the waiter's to take yet. */
	uint64_t t0 = t_now_ms();

	while (atomic_load(&w.armed) <= STOP_ROUNDS && atomic_load(&w.got) < STOP_ROUNDS &&
	       t_now_ms() - t0 < T_WAIT_MS)
		sched_yield();
	if (atomic_load(&w.armed) <= STOP_ROUNDS && atomic_load(&w.got) < STOP_ROUNDS) {
		/* stuck: a receive more wakes it, if it still waits */
		struct ibv_recv_wr rw = { .wr_id = 0 }, *bad;

		atomic_store(&w.quit, true);
		ibv_post_recv(qp, &rw, &bad);
	}
	pthread_join(t, NULL);
	CHECK(!w.err, "ibv_get_cq_event failed after %d completions: %s", atomic_load(&w.got),
	      strerror(w.err));
	CHECK(atomic_load(&w.got) >= STOP_ROUNDS, "%d of %d completions", atomic_load(&w.got),
	      STOP_ROUNDS);
	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_cq(w.cq) == 0, "ibv_destroy_cq");
	CHECK(ibv_destroy_comp_channel(w.ch) == 0, "ibv_destroy_comp_channel");
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

/*
 * ---- Ping-pong driven only by events, as ibv_rc_pingpong -e ----
 * Each round: wait on the channel, get and ack the event, re-arm, poll
 * once.  A completion that lands between the re-arm and the poll must
 * still raise an event; if the deliverer reads the arm state before its
 * completion is visible (store/load reordering), both sides sleep forever.
 * The race window is a few instructions wide, so run many rounds.
 */
#define STORM_ROUNDS 20000

static void event_storm(struct t_peer *p, bool starter)
{
	struct t_opts o = t_opts_default();
	o.use_channel = true;
	o.max_recv_wr = 16;
	struct side s;
	t_res_open(&s.r, &o);
	s.buf = t_alloc(4096);
	s.mr = t_reg(&s.r, s.buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	t_connect_pair(p, &s.r, s.mr, NULL);
	for (int i = 0; i < 16; i++)
		REQUIRE(t_post_recv(s.r.qp, 0, s.buf + 2048, 64, s.mr->lkey) == 0, "ibv_post_recv");
	REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq");
	t_barrier(p);
	int sent = 0, recvd = 0, events = 0;
	if (starter) {
		send_one(&s, 1, 0);
		sent++;
	}
	while (sent < STORM_ROUNDS || recvd < STORM_ROUNDS) {
		REQUIRE(t_fd_readable(s.r.channel->fd, T_WAIT_MS),
			"no event within %d ms after %d sends, %d receives, %d events: a lost wake-up",
			T_WAIT_MS, sent, recvd, events);
		struct ibv_cq *cq;
		void *ctx;
		REQUIRE(ibv_get_cq_event(s.r.channel, &cq, &ctx) == 0, "ibv_get_cq_event");
		ibv_ack_cq_events(cq, 1);
		events++;
		REQUIRE(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
		struct ibv_wc wc[4];
		int n = ibv_poll_cq(cq, 4, wc);
		REQUIRE(n >= 0, "ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++) {
			REQUIRE(wc[i].status == IBV_WC_SUCCESS, "completion %s",
				ibv_wc_status_str(wc[i].status));
			if (wc[i].opcode != IBV_WC_RECV)
				continue;
			recvd++;
			REQUIRE(t_post_recv(s.r.qp, 0, s.buf + 2048, 64, s.mr->lkey) == 0,
				"ibv_post_recv");
			if (sent < STORM_ROUNDS) {
				send_one(&s, 1, 0);
				sent++;
			}
		}
	}
	t_note("%d rounds, %d events", STORM_ROUNDS, events);
	t_barrier(p);
	side_close(&s);
}

/* ---- A CQ armed before its QP exists (rping does this) ---- */

static void armed_before_qp_receiver(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	struct side s;

	o.use_channel = true;
	o.create_qp = false;
	t_res_open(&s.r, &o);
	REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq");
	struct ibv_qp_init_attr ia = {
		.send_cq = s.r.send_cq,
		.recv_cq = s.r.recv_cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	s.r.qp = ibv_create_qp(s.r.pd, &ia);
	REQUIRE(s.r.qp, "ibv_create_qp: %s", strerror(errno));
	s.r.cap = ia.cap;
	s.buf = t_alloc(65536);
	s.mr = t_reg(&s.r, s.buf, 65536, IBV_ACCESS_LOCAL_WRITE);
	t_connect_pair(p, &s.r, s.mr, NULL);
	REQUIRE(t_post_recv(s.r.qp, 7, s.buf, 64, s.mr->lkey) == 0, "ibv_post_recv");
	ask(p, 0);
	CHECK(t_fd_readable(s.r.channel->fd, T_WAIT_MS),
	      "no event within %d ms for a receive on a QP created after its CQ was armed",
	      T_WAIT_MS);
	struct ibv_cq *cq = NULL;
	void *ctx = NULL;
	if (ibv_get_cq_event(s.r.channel, &cq, &ctx) == 0)
		ibv_ack_cq_events(cq, 1);
	t_expect_wc(s.r.recv_cq, NULL, 7, IBV_WC_SUCCESS, IBV_WC_RECV, "the receive");
	t_send_u64(p, 0);
	t_barrier(p);
	side_close(&s);
}

/*
 * ---- A poll that leaves completions on an armed CQ fires it ----
 * qperf's rc_bi_bw: one CQ for sends and receives; each round takes an
 * event, re-arms and polls once, at most its batch.  What the poll left
 * raises no new completion, so a CQ that fires only for new ones leaves
 * both sides asleep.  Here the batch is 3 and the CQ holds 8 receives and
 * 4 sends.  The arm alone does not fire (perftest -e, at the end).
 */
#define HELD_RECVS 8
#define HELD_SENDS 4

static void held_sender(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, false);
	t_connect_pair(p, &s.r, s.mr, NULL);
	post_recvs(&s, HELD_SENDS, 0);
	t_barrier(p); /* 1: both sides' receives are posted */
	for (int i = 0; i < HELD_RECVS; i++)
		send_one(&s, (uint64_t)i, 0);
	struct ibv_wc wc[HELD_RECVS];
	int got = t_poll(s.r.send_cq, wc, HELD_RECVS, T_WAIT_MS);
	CHECK(got == HELD_RECVS, "%d of %d sends completed", got, HELD_RECVS);
	got = t_poll(s.r.recv_cq, wc, HELD_SENDS, T_WAIT_MS);
	CHECK(got == HELD_SENDS, "%d of the peer's %d sends received", got, HELD_SENDS);
	t_barrier(p); /* 2: everything is there */
	t_barrier(p); /* 3: the peer posted one more receive */
	send_one(&s, 9, 0);
	t_expect_wc(s.r.send_cq, NULL, 9, IBV_WC_SUCCESS, IBV_WC_SEND, "the last send");
	t_barrier(p);
	side_close(&s);
}

static void held_poller(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	struct side s;
	o.use_channel = true; /* one CQ for both, as qperf */
	side_open_opts(&s, &o);
	t_connect_pair(p, &s.r, s.mr, NULL);
	post_recvs(&s, HELD_RECVS, 100);
	REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq");
	t_barrier(p); /* 1 */
	for (int i = 0; i < HELD_SENDS; i++)
		send_one(&s, 200u + (uint64_t)i, 0);
	t_barrier(p); /* 2: the peer took our sends and completed its own */
	t_sleep_ms(50);

	bool seen[HELD_RECVS + HELD_SENDS] = {false};
	int total = 0, rounds = 0;
	while (total < HELD_RECVS + HELD_SENDS && rounds++ < 64) {
		struct ibv_cq *cq;
		void *ctx;
		struct ibv_wc wc[3];

		if (!CHECK(t_fd_readable(s.r.channel->fd, T_WAIT_MS),
			   "no event in %d ms, with %d of %d completions taken: the CQ was "
			   "re-armed while it held the rest", T_WAIT_MS, total,
			   HELD_RECVS + HELD_SENDS))
			break;
		REQUIRE(ibv_get_cq_event(s.r.channel, &cq, &ctx) == 0, "ibv_get_cq_event");
		ibv_ack_cq_events(cq, 1);
		REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq");
		int n = ibv_poll_cq(s.r.recv_cq, 3, wc);
		REQUIRE(n >= 0, "ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++) {
			uint64_t id = wc[i].wr_id;
			int k = id >= 200 ? HELD_RECVS + (int)(id - 200) : (int)(id - 100);

			CHECK(wc[i].status == IBV_WC_SUCCESS, "wr_id %llu: status %d",
			      (unsigned long long)id, wc[i].status);
			if (CHECK(k >= 0 && k < HELD_RECVS + HELD_SENDS && !seen[k],
				  "wr_id %llu unknown or twice", (unsigned long long)id))
				seen[k] = true;
		}
		total += n;
	}
	CHECK(total == HELD_RECVS + HELD_SENDS, "%d completions taken", total);
	/* Emptied: what the last full poll fired is taken; an arm now
	 * fires nothing. */
	while (t_fd_readable(s.r.channel->fd, 50)) {
		struct ibv_cq *cq;
		void *ctx;

		REQUIRE(ibv_get_cq_event(s.r.channel, &cq, &ctx) == 0, "ibv_get_cq_event");
		ibv_ack_cq_events(cq, 1);
	}
	REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq");
	CHECK(!t_fd_readable(s.r.channel->fd, 100), "an empty CQ fired when armed");
	/* perftest's -e: an event, a re-arm behind the one completion, a
	 * poll of one.  Nothing is left, so no event: a second one would
	 * wake it to an empty poll. */
	REQUIRE(t_post_recv(s.r.qp, 300, s.buf, 64, s.mr->lkey) == 0, "ibv_post_recv");
	t_barrier(p); /* 3 */
	if (t_wait_cq_event(s.r.channel, s.r.recv_cq, T_WAIT_MS)) {
		struct ibv_wc wc;

		REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq");
		CHECK(ibv_poll_cq(s.r.recv_cq, 1, &wc) == 1 && wc.wr_id == 300,
		      "the completion of the event was not there");
		CHECK(!t_fd_readable(s.r.channel->fd, 100),
		      "an event for a completion the poll after the arm took");
	}
	t_barrier(p);
	side_close(&s);
}

/*
 * ---- A peer's message wakes a thread asleep in ibv_get_cq_event itself ----
 * Over shared memory the sender fires the receiver's CQ; a receiver that
 * sleeps in ibv_get_cq_event is woken by it directly, not through its
 * progress thread (two wake-ups, core/wake.c).  The receiver's other
 * threads' sleeps are counted: one per message before.  The sender waits
 * 3 ms before each message: a sleeper of under 5 us is left to the
 * progress thread (WAKE_DIRECT_NS).
 */
#define WAKE_ROUNDS 40

static void woken_receiver(struct t_peer *p, void *arg)
{
	struct side s;
	side_open(&s, true);
	t_connect_pair(p, &s.r, s.mr, NULL);
	long before = t_other_threads_switches();
	for (int i = 0; i < WAKE_ROUNDS; i++) {
		REQUIRE(t_post_recv(s.r.qp, (uint64_t)i, s.buf, 64, s.mr->lkey) == 0,
			"ibv_post_recv");
		REQUIRE(ibv_req_notify_cq(s.r.recv_cq, 0) == 0, "ibv_req_notify_cq");
		ask(p, 0);
		struct ibv_cq *cq = NULL;
		void *ctx = NULL;
		REQUIRE(ibv_get_cq_event(s.r.channel, &cq, &ctx) == 0, "ibv_get_cq_event: %s",
			strerror(errno));
		ibv_ack_cq_events(cq, 1);
		if (!t_expect_wc(s.r.recv_cq, NULL, (uint64_t)i, IBV_WC_SUCCESS, IBV_WC_RECV,
				 "receive after its event"))
			break;
	}
	long slept = t_other_threads_switches() - before;
	t_note("the receiver's other threads slept %ld times in %d messages", slept, WAKE_ROUNDS);
	CHECK(slept < WAKE_ROUNDS / 2, "the receiver's other threads slept %ld times in %d "
	      "messages: its progress thread, not the sender, woke it", slept, WAKE_ROUNDS);
	t_send_u64(p, 0);
	t_barrier(p);
	side_close(&s);
}

static void storm_starter(struct t_peer *p, void *arg) { event_storm(p, true); }
static void storm_responder(struct t_peer *p, void *arg) { event_storm(p, false); }

/* ---- Sends, each waited for on the send CQ's channel ---- */

/* As rdma_get_send_comp waits: poll, arm, poll, sleep in
 * ibv_get_cq_event.  The two empty polls close together say the
 * application waits in the library, and over TCP the stream is left to
 * its polls (parked); arming its send CQ must give it back, or the
 * peer's answer waits for the progress thread's look at parked streams,
 * about 2 ms (a separate send CQ was not looked at: 1.9 ms a Send). */
#define SEND_COMP_N 200

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void send_comp_sender(struct t_peer *p, void *arg)
{
	uint64_t took[SEND_COMP_N];
	struct side s;
	int i;

	side_open(&s, true);
	t_connect_pair(p, &s.r, s.mr, NULL);
	t_barrier(p); /* the receives are posted */
	for (i = 0; i < SEND_COMP_N; i++) {
		uint64_t t0 = t_now_us();
		struct ibv_wc wc;
		int n;

		send_one(&s, (uint64_t)i, 0);
		while (!(n = ibv_poll_cq(s.r.send_cq, 1, &wc))) {
			REQUIRE(ibv_req_notify_cq(s.r.send_cq, 0) == 0,
				"ibv_req_notify_cq(send CQ)");
			if ((n = ibv_poll_cq(s.r.send_cq, 1, &wc)))
				break;
			if (!t_wait_cq_event(s.r.channel, s.r.send_cq, T_WAIT_MS))
				break;
		}
		if (!CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)i,
			   "Send %d: %d completions, %s, wr_id %llu", i, n,
			   n == 1 ? t_wc_status_str(wc.status) : "-",
			   n == 1 ? (unsigned long long)wc.wr_id : 0ull))
			break;
		took[i] = t_now_us() - t0;
	}
	if (i == SEND_COMP_N) {
		/* (the median: a busy machine's slow Sends are not the 2 ms
		 * every Send waited) */
		qsort(took, SEND_COMP_N, sizeof(took[0]), cmp_u64);
		t_note("%d Sends, each waited for on the send CQ's channel: median %llu us",
		       SEND_COMP_N, (unsigned long long)took[SEND_COMP_N / 2]);
		CHECK(took[SEND_COMP_N / 2] < 1000,
		      "a Send waited for on its CQ's channel took %llu us (median; a "
		      "stream left parked while the application slept?)",
		      (unsigned long long)took[SEND_COMP_N / 2]);
	}
	t_barrier(p);
	side_close(&s);
}

static void send_comp_receiver(struct t_peer *p, void *arg)
{
	uint64_t until;
	struct side s;
	int got = 0;

	side_open(&s, false);
	t_connect_pair(p, &s.r, s.mr, NULL);
	post_recvs(&s, 64, 0);
	t_barrier(p);
	until = t_now_ms() + 8000; /* (the sender's barrier waits 10 s) */
	while (got < SEND_COMP_N && t_now_ms() < until) {
		struct ibv_wc wc[8];
		int n = ibv_poll_cq(s.r.recv_cq, 8, wc);

		for (int i = 0; i < n; i++) {
			CHECK(wc[i].status == IBV_WC_SUCCESS, "receive: %s",
			      t_wc_status_str(wc[i].status));
			REQUIRE(t_post_recv(s.r.qp, wc[i].wr_id, s.buf + 64 * wc[i].wr_id, 64,
					    s.mr->lkey) == 0, "ibv_post_recv");
		}
		got += n > 0 ? n : 0;
	}
	CHECK(got == SEND_COMP_N, "received %d of %d", got, SEND_COMP_N);
	t_barrier(p);
	side_close(&s);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_pair("send_completion_event", send_event_parent, plain_receiver, NULL);
	t_pair("send_completions_waited_for_on_the_channel", send_comp_sender,
	       send_comp_receiver, NULL);
	t_pair("receiver_sleeps_in_get_cq_event", sender, sleeping_receiver, NULL);
	t_pair("solicited_only", sender, solicited_receiver, NULL);
	t_pair("nonblocking_channel_fd", sender, nonblocking_receiver, NULL);
	t_pair("cq_armed_before_qp_created", sender, armed_before_qp_receiver, NULL);
	t_case("error_completion_wakes_solicited_only", error_completion_event, NULL);
	t_case("two_cqs_one_channel", two_cqs_one_channel, NULL);
	t_case("cq_event_wait_survives_registration", cq_event_wait_survives_registration, NULL);
	t_case("cancelled_in_get_cq_event", cancel_in_get_cq_event, NULL);
	t_pair("event_driven_pingpong_loses_no_wakeup", storm_starter, storm_responder, NULL);
	t_pair_and_tcp("armed_behind_unpolled_completions_fires", held_sender, held_poller, NULL);
	/* (over TCP the receiving process's progress thread reads the
	 * stream: no peer fires its CQ) */
	if (!getenv("URDMA_TRANSPORT") || strcmp(getenv("URDMA_TRANSPORT"), "tcp"))
		t_pair("peer_wakes_the_sleeper_itself", sender, woken_receiver,
		       (void *)(uintptr_t)3);
	return t_finish();
}
