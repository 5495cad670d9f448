/* SPDX-License-Identifier: MIT */
/*
 * Conformance: shared receive queues.  The parent owns an SRQ and NQP RC QPs
 * on it; the child connects a QP to each, from two device contexts (two
 * peers, as the SRQ sees them) driven by two threads at once.
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NQP 4
#define MSG 256
#define NRECV 64

/* ---- Creation rules and what is refused ---- */

static void srq_rules(void *arg)
{
	struct t_opts o = t_opts_default();
	o.create_qp = false;
	struct t_res r;
	t_res_open(&r, &o);
	CHECK(r.dev_attr.max_srq > 0 && r.dev_attr.max_srq_wr >= 1024 &&
	      r.dev_attr.max_srq_sge >= 1, "max_srq %d, max_srq_wr %d, max_srq_sge %d",
	      r.dev_attr.max_srq, r.dev_attr.max_srq_wr, r.dev_attr.max_srq_sge);

	struct ibv_srq_init_attr bad[] = {
		{ .attr = { .max_wr = 0, .max_sge = 1 } },
		{ .attr = { .max_wr = (uint32_t)r.dev_attr.max_srq_wr + 1, .max_sge = 1 } },
		{ .attr = { .max_wr = 16, .max_sge = (uint32_t)r.dev_attr.max_srq_sge + 1 } },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		errno = 0;
		CHECK(!ibv_create_srq(r.pd, &bad[i]) && errno == EINVAL,
		      "bad attributes %zu: errno %d, expected EINVAL", i, errno);
	}
	/* srq_limit is not used by ibv_create_srq: not armed, not checked. */
	struct ibv_srq_init_attr ia = { .srq_context = &r,
					.attr = { .max_wr = 10, .max_sge = 2, .srq_limit = 99 } };
	struct ibv_srq *srq = ibv_create_srq(r.pd, &ia);
	REQUIRE(srq, "ibv_create_srq: %s", strerror(errno));
	CHECK(ia.attr.max_wr >= 10 && ia.attr.max_sge >= 2, "reported max_wr %u max_sge %u",
	      ia.attr.max_wr, ia.attr.max_sge);
	CHECK(srq->srq_context == &r && srq->pd == r.pd && srq->context == r.ctx,
	      "srq fields not filled");
	struct ibv_srq_attr qa;
	CHECK(ibv_query_srq(srq, &qa) == 0 && qa.max_wr == ia.attr.max_wr && qa.srq_limit == 0,
	      "query: max_wr %u limit %u", qa.max_wr, qa.srq_limit);
	struct ibv_srq_attr ma = { .max_wr = 64 };
	CHECK(ibv_modify_srq(srq, &ma, 0) == 0, "ibv_modify_srq with no attribute");
	CHECK(ibv_modify_srq(srq, &ma, IBV_SRQ_MAX_WR) == EINVAL,
	      "resizing (no IBV_DEVICE_SRQ_RESIZE) is EINVAL");
	ma.srq_limit = ia.attr.max_wr + 1;
	CHECK(ibv_modify_srq(srq, &ma, IBV_SRQ_LIMIT) == EINVAL, "a limit past max_wr");
	ma.srq_limit = 4;
	CHECK(ibv_modify_srq(srq, &ma, IBV_SRQ_LIMIT) == 0, "arm the limit");
	CHECK(ibv_query_srq(srq, &qa) == 0 && qa.srq_limit == 4, "limit %u after arming",
	      qa.srq_limit);

	/* Posting: too many SGEs, then full. */
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sge[3] = { { (uintptr_t)buf, 8, mr->lkey }, { (uintptr_t)buf, 8, mr->lkey },
				  { (uintptr_t)buf, 8, mr->lkey } };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = sge, .num_sge = 3 }, *badwr = NULL;
	CHECK(ibv_post_srq_recv(srq, &wr, &badwr) == EINVAL && badwr == &wr,
	      "three SGEs on an SRQ of %u", ia.attr.max_sge);
	wr.num_sge = 1;
	uint32_t posted = 0;
	int ret = 0;
	while (posted <= ia.attr.max_wr && !(ret = ibv_post_srq_recv(srq, &wr, &badwr)))
		posted++;
	CHECK(ret == ENOMEM && posted == ia.attr.max_wr, "posted %u of %u, then %d", posted,
	      ia.attr.max_wr, ret);

	/* A QP on it reports no receive queue of its own, and refuses one. */
	struct ibv_qp_init_attr qi = {
		.send_cq = r.send_cq, .recv_cq = r.recv_cq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 100, .max_send_sge = 1, .max_recv_sge = 5 },
	};
	struct ibv_qp *qp = ibv_create_qp(r.pd, &qi);
	REQUIRE(qp, "ibv_create_qp on an SRQ: %s", strerror(errno));
	CHECK(qp->srq == srq && qi.cap.max_recv_wr == 0 && qi.cap.max_recv_sge == 0,
	      "qp->srq %p, cap.max_recv_wr %u max_recv_sge %u", (void *)qp->srq,
	      qi.cap.max_recv_wr, qi.cap.max_recv_sge);
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	CHECK(ibv_query_qp(qp, &qattr, IBV_QP_CAP, &qinit) == 0 && qinit.srq == srq &&
	      qinit.cap.max_recv_wr == 0, "ibv_query_qp: srq %p, max_recv_wr %u",
	      (void *)qinit.srq, qinit.cap.max_recv_wr);
	r.qp = qp;
	CHECK(t_modify_init(&r) == 0, "to INIT");
	CHECK(ibv_post_recv(qp, &wr, &badwr) == EINVAL, "ibv_post_recv on a QP with an SRQ");
	CHECK(ibv_destroy_srq(srq) == EBUSY, "destroying an SRQ a QP uses");
	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	r.qp = NULL;
	CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");

	struct ibv_srq_init_attr_ex x = { .attr = { .max_wr = 8, .max_sge = 1 },
					  .comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
					  .srq_type = IBV_SRQT_BASIC, .pd = r.pd };
	srq = ibv_create_srq_ex(r.ctx, &x);
	CHECK(srq, "ibv_create_srq_ex, basic: %s", strerror(errno));
	if (srq)
		CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
	x.srq_type = IBV_SRQT_TM;
	errno = 0;
	CHECK(!ibv_create_srq_ex(r.ctx, &x) && errno == EOPNOTSUPP, "tag-matching SRQ: errno %d",
	      errno);
	t_res_close(&r);
	free(buf);
}

/* ---- Traffic ---- */

/* The parent: one CQ, an SRQ with NRECV receives of MSG bytes, NQP QPs. */
struct owner {
	struct t_res r;
	struct ibv_srq *srq;
	struct ibv_qp *qp[NQP];
	char *buf;
	struct ibv_mr *mr;
};

static void owner_post(struct owner *o, uint64_t id)
{
	struct ibv_sge sge = { (uintptr_t)o->buf + (id % NRECV) * MSG, MSG, o->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	REQUIRE(ibv_post_srq_recv(o->srq, &wr, &bad) == 0, "ibv_post_srq_recv");
}

static void owner_open(struct t_peer *p, struct owner *o, int nrecv, bool channel)
{
	struct t_opts opt = t_opts_default();
	opt.create_qp = false;
	opt.use_channel = channel;
	opt.cq_size = 1024;
	t_res_open(&o->r, &opt);
	struct ibv_srq_init_attr ia = { .attr = { .max_wr = NRECV, .max_sge = 1 } };
	o->srq = ibv_create_srq(o->r.pd, &ia);
	REQUIRE(o->srq, "ibv_create_srq: %s", strerror(errno));
	o->buf = t_alloc(NRECV * MSG);
	o->mr = t_reg(&o->r, o->buf, NRECV * MSG, IBV_ACCESS_LOCAL_WRITE);
	for (int i = 0; i < nrecv; i++)
		owner_post(o, (uint64_t)i);
	for (int i = 0; i < NQP; i++) {
		struct ibv_qp_init_attr qi = {
			.send_cq = o->r.send_cq, .recv_cq = o->r.recv_cq, .srq = o->srq,
			.qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 16, .max_send_sge = 1 },
		};
		o->qp[i] = ibv_create_qp(o->r.pd, &qi);
		REQUIRE(o->qp[i], "ibv_create_qp %d: %s", i, strerror(errno));
	}
	for (int i = 0; i < NQP; i++) {
		struct t_conn local, remote;
		o->r.qp = o->qp[i];
		t_conn_local(&o->r, NULL, &local);
		t_exchange(p, &local, &remote);
		t_connect(&o->r, &remote);
	}
	o->r.qp = NULL;
	t_barrier(p);
}

static void owner_close(struct owner *o)
{
	for (int i = 0; i < NQP; i++)
		CHECK(ibv_destroy_qp(o->qp[i]) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_srq(o->srq) == 0, "ibv_destroy_srq");
	t_res_close(&o->r);
	free(o->buf);
}

static int qp_index(struct owner *o, uint32_t qpn)
{
	for (int i = 0; i < NQP; i++)
		if (o->qp[i]->qp_num == qpn)
			return i;
	return -1;
}

/* The child: NQP QPs from two contexts (QP i in context i % 2). */
struct sender {
	struct t_res r[2];
	struct ibv_qp *qp[NQP];
	char *buf[2];
	struct ibv_mr *mr[2];
	int count; /* messages per QP */
	int len;
};

static void sender_open(struct t_peer *p, struct sender *s)
{
	struct t_opts opt = t_opts_default();
	opt.create_qp = false;
	opt.cq_size = 1024;
	for (int c = 0; c < 2; c++) {
		t_res_open(&s->r[c], &opt);
		s->buf[c] = t_alloc(4096);
		s->mr[c] = t_reg(&s->r[c], s->buf[c], 4096, IBV_ACCESS_LOCAL_WRITE);
	}
	for (int i = 0; i < NQP; i++) {
		struct t_res *r = &s->r[i % 2];
		struct ibv_qp_init_attr qi = {
			.send_cq = r->send_cq, .recv_cq = r->recv_cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 64, .max_recv_wr = 1, .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};
		s->qp[i] = ibv_create_qp(r->pd, &qi);
		REQUIRE(s->qp[i], "ibv_create_qp: %s", strerror(errno));
		struct t_conn local, remote;
		r->qp = s->qp[i];
		t_conn_local(r, NULL, &local);
		t_exchange(p, &local, &remote);
		t_connect(r, &remote);
		r->qp = NULL;
	}
	t_barrier(p);
}

static void sender_close(struct sender *s)
{
	for (int i = 0; i < NQP; i++)
		CHECK(ibv_destroy_qp(s->qp[i]) == 0, "ibv_destroy_qp");
	for (int c = 0; c < 2; c++) {
		t_res_close(&s->r[c]);
		free(s->buf[c]);
	}
}

struct send_arg {
	struct sender *s;
	int ctx; /* sends on the QPs of this context */
};

/* Sends s->count messages on each QP of one context, alternating QPs: the
 * first 4 bytes say (qp index << 16 | sequence). */
static void *send_thread(void *arg)
{
	struct send_arg *a = arg;
	struct sender *s = a->s;
	struct t_res *r = &s->r[a->ctx];
	int sent = 0, done = 0, total = s->count * (NQP / 2);

	while (done < total) {
		while (sent < total) {
			int i = a->ctx + 2 * (sent % 2), k = sent / 2;
			uint32_t tag = (uint32_t)i << 16 | (uint32_t)k;
			char *b = s->buf[a->ctx] + (i / 2) * 64;
			memcpy(b, &tag, 4);
			int ret = t_post_send(s->qp[i], tag, IBV_WR_SEND, b, (uint32_t)s->len,
					      s->mr[a->ctx]->lkey, IBV_SEND_SIGNALED | IBV_SEND_INLINE,
					      0, 0);
			if (ret == ENOMEM)
				break;
			REQUIRE(ret == 0, "post_send: %d", ret);
			sent++;
		}
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(r->send_cq, 16, wc);
		for (int j = 0; j < n; j++)
			REQUIRE(wc[j].status == IBV_WC_SUCCESS, "send completion: %s",
				ibv_wc_status_str(wc[j].status));
		done += n;
	}
	return NULL;
}

/* Every message from every QP, each QP's in order, to the right QP; the
 * receives taken are posted again. */
#define PER_QP 2000

static void many_parent(struct t_peer *p, void *arg)
{
	struct owner o;
	owner_open(p, &o, NRECV, false);
	int next[NQP] = { 0 }, got = 0, bad = 0;
	uint64_t end = t_now_ms() + 20000, id = NRECV;

	while (got < NQP * PER_QP && t_now_ms() < end) {
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(o.r.recv_cq, 16, wc);
		REQUIRE(n >= 0, "ibv_poll_cq");
		for (int j = 0; j < n; j++) {
			uint32_t tag;
			int q = qp_index(&o, wc[j].qp_num);
			memcpy(&tag, o.buf + (wc[j].wr_id % NRECV) * MSG, 4);
			if (wc[j].status != IBV_WC_SUCCESS || wc[j].opcode != IBV_WC_RECV ||
			    wc[j].byte_len != 8 || q < 0 || (int)(tag >> 16) != q ||
			    (int)(tag & 0xffff) != next[q] % 0x10000) {
				if (bad++ < 5)
					CHECK(false, "receive %d: status %s opcode %d len %u qp %d "
					      "tag %#x (expected qp %d seq %d)", got,
					      ibv_wc_status_str(wc[j].status), wc[j].opcode,
					      wc[j].byte_len, q, tag, q, q >= 0 ? next[q] : -1);
			} else {
				next[q]++;
			}
			got++;
			owner_post(&o, id++);
		}
	}
	CHECK(got == NQP * PER_QP && !bad, "%d of %d received, %d wrong", got, NQP * PER_QP, bad);
	t_barrier(p);
	owner_close(&o);
}

static void many_child(struct t_peer *p, void *arg)
{
	struct sender s = { .count = PER_QP, .len = 8 };
	sender_open(p, &s);
	struct send_arg a[2] = { { &s, 0 }, { &s, 1 } };
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		REQUIRE(pthread_create(&th[i], NULL, send_thread, &a[i]) == 0, "pthread_create");
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	t_barrier(p);
	sender_close(&s);
}

/* ---- No receive posted: the sender waits (RNR), the post wakes it ---- */

static void rnr_parent(struct t_peer *p, void *arg)
{
	struct owner o;
	owner_open(p, &o, 0, false);
	struct ibv_wc wc;
	t_barrier(p); /* the child has sent */
	CHECK(t_cq_drain(o.r.recv_cq, &wc, 1, 200) == 0, "a receive with none posted");
	owner_post(&o, 7);
	CHECK(t_poll_one(o.r.recv_cq, &wc, T_WAIT_MS, "the message after the post") &&
	      wc.status == IBV_WC_SUCCESS && wc.wr_id == 7 && wc.qp_num == o.qp[2]->qp_num,
	      "status %s wr_id %llu qp %#x", ibv_wc_status_str(wc.status),
	      (unsigned long long)wc.wr_id, wc.qp_num);
	t_barrier(p);
	owner_close(&o);
}

static void rnr_child(struct t_peer *p, void *arg)
{
	struct sender s = { 0 };
	sender_open(p, &s);
	REQUIRE(t_post_send(s.qp[2], 1, IBV_WR_SEND, s.buf[0], 8, s.mr[0]->lkey,
			    IBV_SEND_SIGNALED, 0, 0) == 0, "post_send");
	t_barrier(p);
	t_expect_wc(s.r[0].send_cq, NULL, 1, IBV_WC_SUCCESS, IBV_WC_SEND, "the send, once posted");
	t_barrier(p);
	sender_close(&s);
}

/* ---- The limit event, a QP's error (LAST_WQE_REACHED, nothing of the SRQ
 * flushed), a receive too short ---- */

static enum ibv_event_type next_event(struct ibv_context *ctx, void **elem, int ms)
{
	struct ibv_async_event ev;
	if (!t_fd_readable(ctx->async_fd, ms))
		return (enum ibv_event_type)-1;
	REQUIRE(ibv_get_async_event(ctx, &ev) == 0, "ibv_get_async_event");
	*elem = ev.element.srq; /* a union of pointers */
	enum ibv_event_type t = ev.event_type;
	ibv_ack_async_event(&ev);
	return t;
}

static void events_parent(struct t_peer *p, void *arg)
{
	struct owner o;
	owner_open(p, &o, 8, false);
	void *elem;
	struct ibv_srq_attr a = { .srq_limit = 3 };
	REQUIRE(ibv_modify_srq(o.srq, &a, IBV_SRQ_LIMIT) == 0, "arm the limit");
	t_barrier(p); /* child: 4 sends on QP 0 (8 -> 4 left: no event) */
	struct ibv_wc wc[8];
	CHECK(t_poll(o.r.recv_cq, wc, 4, T_WAIT_MS) == 4, "the first four");
	CHECK(next_event(o.r.ctx, &elem, 200) == (enum ibv_event_type)-1, "an event at 4 left");
	t_barrier(p); /* child: 2 more (2 left: below 3) */
	CHECK(t_poll(o.r.recv_cq, wc, 2, T_WAIT_MS) == 2, "two more");
	CHECK(next_event(o.r.ctx, &elem, T_WAIT_MS) == IBV_EVENT_SRQ_LIMIT_REACHED &&
	      elem == o.srq, "no SRQ_LIMIT_REACHED at 2 left of a limit of 3");
	struct ibv_srq_attr q;
	CHECK(ibv_query_srq(o.srq, &q) == 0 && q.srq_limit == 0, "the limit after firing: %u",
	      q.srq_limit);

	/* QP 1 to error: LAST_WQE_REACHED for it; the 2 receives left stay
	 * on the SRQ (not flushed) and QP 3 takes them. */
	struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };
	REQUIRE(ibv_modify_qp(o.qp[1], &e, IBV_QP_STATE) == 0, "QP 1 to ERR");
	CHECK(next_event(o.r.ctx, &elem, T_WAIT_MS) == IBV_EVENT_QP_LAST_WQE_REACHED &&
	      elem == o.qp[1], "no LAST_WQE_REACHED for QP 1");
	CHECK(t_cq_drain(o.r.recv_cq, wc, 8, 100) == 0, "SRQ receives flushed by a QP's error");
	t_barrier(p); /* child: 2 sends on QP 3 */
	CHECK(t_poll(o.r.recv_cq, wc, 2, T_WAIT_MS) == 2 && wc[0].qp_num == o.qp[3]->qp_num &&
	      wc[0].status == IBV_WC_SUCCESS, "QP 3 did not get the SRQ's last two");

	/* Too long for the receive: LOC_LEN_ERR on QP 2. */
	owner_post(&o, 100);
	t_barrier(p); /* child: a message of 2 x MSG on QP 2 */
	CHECK(t_poll(o.r.recv_cq, wc, 1, T_WAIT_MS) == 1 && wc[0].status == IBV_WC_LOC_LEN_ERR &&
	      wc[0].qp_num == o.qp[2]->qp_num && wc[0].wr_id == 100,
	      "a message too long: %s on qp %#x", ibv_wc_status_str(wc[0].status), wc[0].qp_num);
	t_barrier(p);
	owner_close(&o);
}

static void events_child(struct t_peer *p, void *arg)
{
	struct sender s = { 0 };
	sender_open(p, &s);
	char *big = t_alloc(2 * MSG);
	struct ibv_mr *bmr = ibv_reg_mr(s.r[0].pd, big, 2 * MSG, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(bmr, "ibv_reg_mr");
	for (int i = 0; i < 4; i++)
		REQUIRE(t_post_send(s.qp[0], 1, IBV_WR_SEND, s.buf[0], 8, s.mr[0]->lkey, 0, 0,
				    0) == 0, "post_send");
	t_barrier(p);
	t_barrier(p); /* the parent saw no event at 4 left */
	for (int i = 0; i < 2; i++)
		REQUIRE(t_post_send(s.qp[0], 1, IBV_WR_SEND, s.buf[0], 8, s.mr[0]->lkey, 0, 0,
				    0) == 0, "post_send");
	t_barrier(p);
	for (int i = 0; i < 2; i++)
		REQUIRE(t_post_send(s.qp[3], 1, IBV_WR_SEND, s.buf[1], 8, s.mr[1]->lkey, 0, 0,
				    0) == 0, "post_send");
	t_barrier(p);
	REQUIRE(t_post_send(s.qp[2], 9, IBV_WR_SEND, big, 2 * MSG, bmr->lkey, IBV_SEND_SIGNALED,
			    0, 0) == 0, "post_send");
	struct ibv_wc wc;
	CHECK(t_poll_one(s.r[0].send_cq, &wc, T_WAIT_MS, "the long send") &&
	      wc.status == IBV_WC_REM_INV_REQ_ERR, "the long send: %s",
	      ibv_wc_status_str(wc.status));
	t_barrier(p);
	ibv_dereg_mr(bmr);
	free(big);
	sender_close(&s);
}

/* A receive of the SRQ that completes in error (too long) wakes a program
 * asleep on its CQ, as an error completion always does. */
static void error_event_parent(struct t_peer *p, void *arg)
{
	struct owner o;
	struct ibv_wc wc;

	owner_open(p, &o, 1, true);
	REQUIRE(ibv_req_notify_cq(o.r.recv_cq, 0) == 0, "arm the CQ");
	t_barrier(p); /* child: a message of 2 x MSG on QP 0 */
	CHECK(t_wait_cq_event(o.r.channel, o.r.recv_cq, T_WAIT_MS),
	      "no CQ event for the receive that completed in error");
	CHECK(t_poll(o.r.recv_cq, &wc, 1, T_WAIT_MS) == 1 && wc.status == IBV_WC_LOC_LEN_ERR,
	      "the receive: %s", ibv_wc_status_str(wc.status));
	t_barrier(p);
	owner_close(&o);
}

static void error_event_child(struct t_peer *p, void *arg)
{
	struct sender s = { 0 };
	struct ibv_wc wc;

	sender_open(p, &s);
	t_barrier(p);
	REQUIRE(t_post_send(s.qp[0], 9, IBV_WR_SEND, s.buf[0], 2 * MSG, s.mr[0]->lkey,
			    IBV_SEND_SIGNALED, 0, 0) == 0, "post_send");
	CHECK(t_poll_one(s.r[0].send_cq, &wc, T_WAIT_MS, "the long send"), "its completion");
	t_barrier(p);
	sender_close(&s);
}

/* ---- Async events of a QP destroyed: those nobody read are never read;
 * destroying waits until those read are acknowledged (ibv_destroy_qp(3),
 * ibv_ack_async_event(3)).  UCX's async thread read a QP event after the
 * QP's destroy and died reading it (compat_ucx). ---- */

static struct ibv_qp *srq_qp_to_err(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .srq = srq,
				       .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 1, .max_send_sge = 1 } };
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);

	REQUIRE(qp, "create_qp");
	REQUIRE(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			       IBV_QP_ACCESS_FLAGS), "INIT");
	a.qp_state = IBV_QPS_ERR;
	REQUIRE(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "ERR");
	return qp;
}

struct late_ack {
	struct ibv_async_event ev;
	uint64_t acked_ms;
};

static void *ack_later(void *arg)
{
	struct late_ack *l = arg;

	usleep(200000);
	l->acked_ms = t_now_ms();
	ibv_ack_async_event(&l->ev);
	return NULL;
}

static void destroyed_qp_events(void *arg)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	struct ibv_qp *qp;
	struct ibv_async_event ev;
	struct late_ack la = { 0 };
	pthread_t th;
	uint64_t t0;

	(void)arg;
	REQUIRE(l && l[0] && (ctx = ibv_open_device(l[0])), "open");
	ibv_free_device_list(l);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	srq = pd ? ibv_create_srq(pd, &sa) : NULL;
	REQUIRE(pd && cq && srq, "pd, cq, srq");
	REQUIRE(!fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK),
		"O_NONBLOCK");

	/* an event queued, its QP destroyed before anyone reads it */
	qp = srq_qp_to_err(pd, cq, srq);
	REQUIRE(t_fd_readable(ctx->async_fd, 2000), "no LAST_WQE_REACHED event");
	REQUIRE(!ibv_destroy_qp(qp), "destroy_qp");
	CHECK(!t_fd_readable(ctx->async_fd, 0),
	      "the async fd stays readable for a destroyed QP's event");
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN,
	      "an event of a destroyed QP was read: %s", ibv_event_type_str(ev.event_type));

	/* an event read and not acknowledged: the destroy waits for the ack */
	qp = srq_qp_to_err(pd, cq, srq);
	REQUIRE(t_fd_readable(ctx->async_fd, 2000), "no LAST_WQE_REACHED event");
	REQUIRE(!ibv_get_async_event(ctx, &la.ev), "get_async_event");
	CHECK(!t_fd_readable(ctx->async_fd, 0), "the async fd readable with nothing queued");
	CHECK(la.ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && la.ev.element.qp == qp,
	      "event %s", ibv_event_type_str(la.ev.event_type));
	REQUIRE(!pthread_create(&th, NULL, ack_later, &la), "thread");
	t0 = t_now_ms();
	REQUIRE(!ibv_destroy_qp(qp), "destroy_qp");
	CHECK(la.acked_ms && t_now_ms() >= la.acked_ms,
	      "ibv_destroy_qp returned after %llu ms, before the event was acknowledged",
	      (unsigned long long)(t_now_ms() - t0));
	pthread_join(th, NULL);

	ibv_destroy_srq(srq);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_case("srq_rules", srq_rules, NULL);
	t_pair("srq_four_qps_two_contexts", many_parent, many_child, NULL);
	t_pair("srq_rnr_until_posted", rnr_parent, rnr_child, NULL);
	t_pair("srq_limit_last_wqe_len_err", events_parent, events_child, NULL);
	t_pair("srq_error_fires_armed_cq", error_event_parent, error_event_child, NULL);
	t_case("destroyed_qp_async_events", destroyed_qp_events, NULL);
	return t_finish();
}
