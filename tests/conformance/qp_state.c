/* SPDX-License-Identifier: MIT */
/*
 * Conformance: the RC QP state machine (ibv_modify_qp / ibv_query_qp) and the
 * rules for posting work requests in each state.
 *
 * Required attribute masks (ibv_modify_qp(3), IB spec table "QP state
 * transition properties"):
 *   RESET->INIT  STATE | PKEY_INDEX | PORT | ACCESS_FLAGS
 *   INIT->RTR    STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN |
 *                MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
 *   RTR->RTS     STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN |
 *                MAX_QP_RD_ATOMIC
 *   any->RESET, any->ERR: STATE only
 * Anything else (a skipped state, a missing required attribute, an attribute
 * the transition does not accept) fails with EINVAL and leaves the QP as it
 * was.
 */
#include "harness.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INIT_MASK (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
#define RTR_MASK                                                                         \
	(IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |   \
	 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
#define RTS_MASK                                                                     \
	(IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |       \
	 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)

/* Full attribute sets for each transition; the QP is connected to a second
 * QP of the same process (loopback) so that no peer process is needed. */
struct fixture {
	struct t_res r;
	struct ibv_qp *other; /* the loopback peer QP */
	struct t_conn remote; /* describes `other` */
};

static void fixture_open(struct fixture *f, struct t_opts *o)
{
	t_res_open(&f->r, o);
	struct ibv_qp_init_attr ia = {.send_cq = f->r.send_cq, .recv_cq = f->r.recv_cq,
				      .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 8, .max_recv_wr = 8,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	f->other = ibv_create_qp(f->r.pd, &ia);
	REQUIRE(f->other, "ibv_create_qp(loopback peer): %s", strerror(errno));
	CHECK(f->other->qp_num != f->r.qp->qp_num, "two QPs share qp_num %u", f->other->qp_num);
	CHECK(f->r.qp->qp_num != 0 && f->other->qp_num != 0, "qp_num 0 is reserved (QP0)");
	t_conn_local(&f->r, NULL, &f->remote);
	f->remote.qpn = f->other->qp_num;
	f->remote.psn = 0x123456;
}

static void fixture_close(struct fixture *f)
{
	CHECK(ibv_destroy_qp(f->other) == 0, "ibv_destroy_qp(other)");
	t_res_close(&f->r);
}

static struct ibv_qp_attr init_attr(struct fixture *f)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
	return a;
}

static struct ibv_qp_attr rtr_attr(struct fixture *f)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_2048,
		.dest_qp_num = f->remote.qpn,
		.rq_psn = f->remote.psn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = {.is_global = 1, .dlid = f->remote.lid, .port_num = 1,
			    .grh = {.dgid = f->remote.gid, .sgid_index = 1, .hop_limit = 64}},
	};
	return a;
}

static struct ibv_qp_attr rts_attr(struct fixture *f)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				.rnr_retry = 7, .sq_psn = 0x654321, .max_rd_atomic = 1};
	return a;
}

/* Moves f->r.qp from RESET to `target` along the legal path (fatal on error). */
static void bring_to(struct fixture *f, enum ibv_qp_state target)
{
	struct ibv_qp_attr a;
	int ret;
	if (target == IBV_QPS_RESET)
		return;
	if (target == IBV_QPS_ERR) {
		ret = t_modify_state(f->r.qp, IBV_QPS_ERR);
		REQUIRE(ret == 0, "RESET->ERR: %d", ret);
		return;
	}
	a = init_attr(f);
	ret = ibv_modify_qp(f->r.qp, &a, INIT_MASK);
	REQUIRE(ret == 0, "RESET->INIT: %d (%s)", ret, strerror(ret));
	if (target == IBV_QPS_INIT)
		return;
	a = rtr_attr(f);
	ret = ibv_modify_qp(f->r.qp, &a, RTR_MASK);
	REQUIRE(ret == 0, "INIT->RTR: %d (%s)", ret, strerror(ret));
	if (target == IBV_QPS_RTR)
		return;
	a = rts_attr(f);
	ret = ibv_modify_qp(f->r.qp, &a, RTS_MASK);
	REQUIRE(ret == 0, "RTR->RTS: %d (%s)", ret, strerror(ret));
}

static void expect_state(struct ibv_qp *qp, enum ibv_qp_state want, const char *when)
{
	int s = t_qp_state(qp);
	CHECK(s == (int)want, "%s: ibv_query_qp says %s, expected %s", when, t_qp_state_str(s),
	      t_qp_state_str(want));
}

static void legal_path_and_query(void *arg)
{
	struct fixture f;
	struct t_opts o = t_opts_default();
	o.max_send_wr = 32;
	o.max_recv_wr = 16;
	o.max_send_sge = 2;
	o.max_recv_sge = 3;
	o.max_inline_data = 64;
	fixture_open(&f, &o);
	struct ibv_qp *qp = f.r.qp;
	/* Create reports at least what was asked. */
	CHECK(f.r.cap.max_send_wr >= 32 && f.r.cap.max_recv_wr >= 16,
	      "create_qp caps: send_wr %u recv_wr %u", f.r.cap.max_send_wr, f.r.cap.max_recv_wr);
	CHECK(f.r.cap.max_send_sge >= 2 && f.r.cap.max_recv_sge >= 3,
	      "create_qp caps: send_sge %u recv_sge %u", f.r.cap.max_send_sge, f.r.cap.max_recv_sge);
	CHECK(f.r.cap.max_inline_data >= 64, "create_qp caps: max_inline_data %u < 64",
	      f.r.cap.max_inline_data);
	CHECK(qp->qp_type == IBV_QPT_RC, "qp->qp_type %d", qp->qp_type);

	expect_state(qp, IBV_QPS_RESET, "after create");
	struct ibv_qp_attr a = init_attr(&f);
	int ret = ibv_modify_qp(qp, &a, INIT_MASK);
	CHECK(ret == 0, "RESET->INIT: %d", ret);
	expect_state(qp, IBV_QPS_INIT, "after RESET->INIT");
	a = rtr_attr(&f);
	ret = ibv_modify_qp(qp, &a, RTR_MASK);
	CHECK(ret == 0, "INIT->RTR: %d", ret);
	expect_state(qp, IBV_QPS_RTR, "after INIT->RTR");
	a = rts_attr(&f);
	ret = ibv_modify_qp(qp, &a, RTS_MASK);
	REQUIRE(ret == 0, "RTR->RTS: %d", ret);
	expect_state(qp, IBV_QPS_RTS, "after RTR->RTS");
	/* rdma-core's ibv_modify_qp keeps qp->state in step. */
	CHECK(qp->state == IBV_QPS_RTS, "qp->state is %s after modify to RTS",
	      t_qp_state_str(qp->state));

	/* ibv_query_qp returns what was set. */
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	memset(&q, 0, sizeof(q));
	memset(&qi, 0, sizeof(qi));
	ret = ibv_query_qp(qp, &q,
			   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS |
				   IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER |
				   IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_CAP,
			   &qi);
	REQUIRE(ret == 0, "ibv_query_qp: %d", ret);
	CHECK(q.qp_state == IBV_QPS_RTS, "qp_state %s", t_qp_state_str(q.qp_state));
	CHECK(q.path_mtu == IBV_MTU_2048, "path_mtu %d, set IBV_MTU_2048", q.path_mtu);
	CHECK(q.dest_qp_num == f.remote.qpn, "dest_qp_num %u, set %u", q.dest_qp_num, f.remote.qpn);
	CHECK(q.rq_psn == f.remote.psn, "rq_psn 0x%x, set 0x%x", q.rq_psn, f.remote.psn);
	CHECK(q.sq_psn == 0x654321, "sq_psn 0x%x, set 0x654321", q.sq_psn);
	CHECK(q.timeout == 14, "timeout %u, set 14", q.timeout);
	CHECK(q.retry_cnt == 7, "retry_cnt %u, set 7", q.retry_cnt);
	CHECK(q.rnr_retry == 7, "rnr_retry %u, set 7", q.rnr_retry);
	CHECK(q.min_rnr_timer == 12, "min_rnr_timer %u, set 12", q.min_rnr_timer);
	CHECK(q.max_rd_atomic == 1, "max_rd_atomic %u, set 1", q.max_rd_atomic);
	CHECK(q.max_dest_rd_atomic == 1, "max_dest_rd_atomic %u, set 1", q.max_dest_rd_atomic);
	CHECK(q.qp_access_flags == (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
	      "qp_access_flags 0x%x, set 0x%x", q.qp_access_flags,
	      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(q.port_num == 1, "port_num %u", q.port_num);
	CHECK(q.ah_attr.is_global == 1, "ah_attr.is_global %u", q.ah_attr.is_global);
	CHECK(memcmp(&q.ah_attr.grh.dgid, &f.remote.gid, sizeof(f.remote.gid)) == 0,
	      "ah_attr.grh.dgid differs from what was set");
	CHECK(q.ah_attr.grh.sgid_index == 1, "ah_attr.grh.sgid_index %u", q.ah_attr.grh.sgid_index);
	/* The capabilities are the ones create reported. */
	const struct ibv_qp_cap *c = &f.r.cap;
	CHECK(qi.cap.max_send_wr == c->max_send_wr && qi.cap.max_recv_wr == c->max_recv_wr &&
		      qi.cap.max_send_sge == c->max_send_sge &&
		      qi.cap.max_recv_sge == c->max_recv_sge &&
		      qi.cap.max_inline_data == c->max_inline_data,
	      "query init_attr.cap {%u %u %u %u inline %u} != create's {%u %u %u %u inline %u}",
	      qi.cap.max_send_wr, qi.cap.max_recv_wr, qi.cap.max_send_sge, qi.cap.max_recv_sge,
	      qi.cap.max_inline_data, c->max_send_wr, c->max_recv_wr, c->max_send_sge,
	      c->max_recv_sge, c->max_inline_data);
	CHECK(q.cap.max_send_wr == c->max_send_wr && q.cap.max_inline_data == c->max_inline_data,
	      "query attr.cap {send_wr %u inline %u} != create's {%u %u}", q.cap.max_send_wr,
	      q.cap.max_inline_data, c->max_send_wr, c->max_inline_data);
	CHECK(qi.qp_type == IBV_QPT_RC, "query init_attr.qp_type %d", qi.qp_type);

	/* RTS->RTS may change the optional attributes of that transition
	 * (for RC: ACCESS_FLAGS, ALT_PATH, PATH_MIG_STATE, MIN_RNR_TIMER). */
	struct ibv_qp_attr m = {.qp_state = IBV_QPS_RTS, .min_rnr_timer = 14};
	ret = ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER);
	CHECK(ret == 0, "RTS->RTS changing min_rnr_timer: %d", ret);
	memset(&q, 0, sizeof(q));
	if (ibv_query_qp(qp, &q, IBV_QP_MIN_RNR_TIMER | IBV_QP_STATE, &qi) == 0)
		CHECK(q.min_rnr_timer == 14 && q.qp_state == IBV_QPS_RTS,
		      "after RTS->RTS min_rnr_timer %u state %s", q.min_rnr_timer,
		      t_qp_state_str(q.qp_state));
	fixture_close(&f);
}

/* Transitions that skip a state or go backwards: EINVAL, state unchanged. */
static void illegal_transitions(void *arg)
{
	static const struct {
		enum ibv_qp_state from, to;
	} cases[] = {
		{IBV_QPS_RESET, IBV_QPS_RTR}, {IBV_QPS_RESET, IBV_QPS_RTS},
		{IBV_QPS_INIT, IBV_QPS_RTS},  {IBV_QPS_RTR, IBV_QPS_INIT},
		{IBV_QPS_RTS, IBV_QPS_INIT},  {IBV_QPS_RTS, IBV_QPS_RTR},
		{IBV_QPS_ERR, IBV_QPS_RTS},   {IBV_QPS_ERR, IBV_QPS_INIT},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct fixture f;
		fixture_open(&f, NULL);
		bring_to(&f, cases[i].from);
		/* Give every attribute the target state could want, so that
		 * only the transition itself is wrong. */
		struct ibv_qp_attr a;
		int mask;
		switch (cases[i].to) {
		case IBV_QPS_INIT: a = init_attr(&f); mask = INIT_MASK; break;
		case IBV_QPS_RTR: a = rtr_attr(&f); mask = RTR_MASK; break;
		default: a = rts_attr(&f); mask = RTS_MASK; break;
		}
		int ret = ibv_modify_qp(f.r.qp, &a, mask);
		CHECK(ret == EINVAL, "%s->%s: ibv_modify_qp returned %d, expected EINVAL (%d)",
		      t_qp_state_str(cases[i].from), t_qp_state_str(cases[i].to), ret, EINVAL);
		char when[64];
		snprintf(when, sizeof(when), "after the refused %s->%s", t_qp_state_str(cases[i].from),
			 t_qp_state_str(cases[i].to));
		expect_state(f.r.qp, cases[i].from, when);
		fixture_close(&f);
	}
}

/* A required attribute left out of the mask: EINVAL, state unchanged. */
static void missing_attributes(void *arg)
{
	static const struct {
		enum ibv_qp_state from;
		int drop;
		const char *name;
	} cases[] = {
		{IBV_QPS_RESET, IBV_QP_PORT, "PORT"},
		{IBV_QPS_RESET, IBV_QP_PKEY_INDEX, "PKEY_INDEX"},
		{IBV_QPS_RESET, IBV_QP_ACCESS_FLAGS, "ACCESS_FLAGS"},
		{IBV_QPS_INIT, IBV_QP_AV, "AV"},
		{IBV_QPS_INIT, IBV_QP_PATH_MTU, "PATH_MTU"},
		{IBV_QPS_INIT, IBV_QP_DEST_QPN, "DEST_QPN"},
		{IBV_QPS_INIT, IBV_QP_RQ_PSN, "RQ_PSN"},
		{IBV_QPS_INIT, IBV_QP_MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"},
		{IBV_QPS_INIT, IBV_QP_MIN_RNR_TIMER, "MIN_RNR_TIMER"},
		{IBV_QPS_RTR, IBV_QP_TIMEOUT, "TIMEOUT"},
		{IBV_QPS_RTR, IBV_QP_RETRY_CNT, "RETRY_CNT"},
		{IBV_QPS_RTR, IBV_QP_RNR_RETRY, "RNR_RETRY"},
		{IBV_QPS_RTR, IBV_QP_SQ_PSN, "SQ_PSN"},
		{IBV_QPS_RTR, IBV_QP_MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct fixture f;
		fixture_open(&f, NULL);
		bring_to(&f, cases[i].from);
		struct ibv_qp_attr a;
		int mask;
		const char *to;
		switch (cases[i].from) {
		case IBV_QPS_RESET: a = init_attr(&f); mask = INIT_MASK; to = "INIT"; break;
		case IBV_QPS_INIT: a = rtr_attr(&f); mask = RTR_MASK; to = "RTR"; break;
		default: a = rts_attr(&f); mask = RTS_MASK; to = "RTS"; break;
		}
		int ret = ibv_modify_qp(f.r.qp, &a, mask & ~cases[i].drop);
		CHECK(ret == EINVAL, "%s->%s without IBV_QP_%s: returned %d, expected EINVAL",
		      t_qp_state_str(cases[i].from), to, cases[i].name, ret);
		char when[96];
		snprintf(when, sizeof(when), "after %s->%s without IBV_QP_%s",
			 t_qp_state_str(cases[i].from), to, cases[i].name);
		expect_state(f.r.qp, cases[i].from, when);
		fixture_close(&f);
	}
}

/* An address by LID alone reaches this host only (a LID names a host;
 * nothing routes to another's by LID): RTR to another LID is refused and
 * the QP stays in INIT; to this host's LID it is taken. */
static void rtr_by_lid(void *arg)
{
	struct fixture f;
	fixture_open(&f, NULL);
	bring_to(&f, IBV_QPS_INIT);
	struct ibv_qp_attr a = rtr_attr(&f);
	a.ah_attr.is_global = 0;
	a.ah_attr.dlid = (uint16_t)(f.r.port_attr.lid == 1 ? 2 : f.r.port_attr.lid - 1);
	int ret = ibv_modify_qp(f.r.qp, &a, RTR_MASK);
	CHECK(ret != 0, "RTR to LID %u, not this host's (%u): accepted", a.ah_attr.dlid,
	      f.r.port_attr.lid);
	expect_state(f.r.qp, IBV_QPS_INIT, "after RTR to another host's LID");
	a.ah_attr.dlid = f.r.port_attr.lid;
	ret = ibv_modify_qp(f.r.qp, &a, RTR_MASK);
	CHECK(ret == 0, "RTR to this host's LID %u: %d", a.ah_attr.dlid, ret);
	expect_state(f.r.qp, IBV_QPS_RTR, "after RTR to this host's LID");
	fixture_close(&f);

	/* On InfiniBand (URDMA_LINK_LAYER=ib), an address handle with both
	 * another host's LID and its GID (as Open MPI's udcm makes before
	 * it connects by LID): an address by that LID alone then goes to
	 * that GID.  (Address handles only: they send nothing, and a QP's
	 * RTR would connect to that host; net_middleware's openib case
	 * covers QPs, between namespaces.) */
	setenv("URDMA_LINK_LAYER", "ib", 1);
	fixture_open(&f, NULL);
	unsetenv("URDMA_LINK_LAYER");
	CHECK(f.r.port_attr.link_layer == IBV_LINK_LAYER_INFINIBAND,
	      "URDMA_LINK_LAYER=ib: link layer %d", f.r.port_attr.link_layer);
	uint16_t other = (uint16_t)(f.r.port_attr.lid == 2 ? 3 : 2);
	struct ibv_ah_attr by_lid = { .dlid = other, .port_num = 1 };
	errno = 0;
	struct ibv_ah *ah = ibv_create_ah(f.r.pd, &by_lid);
	CHECK(!ah && errno == EOPNOTSUPP, "an address by LID %u alone, before any GID: %s",
	      other, ah ? "made" : strerror(errno));
	if (ah)
		ibv_destroy_ah(ah);
	struct ibv_ah_attr teach = {
		.is_global = 1, .dlid = other, .port_num = 1,
		.grh = {.sgid_index = 0, .hop_limit = 64}, /* (IB: this host's IPv4) */
	};
	teach.grh.dgid.raw[10] = teach.grh.dgid.raw[11] = 0xff;
	teach.grh.dgid.raw[12] = 198; /* 198.18.0.7: a benchmarking address */
	teach.grh.dgid.raw[13] = 18;
	teach.grh.dgid.raw[15] = 7;
	ah = ibv_create_ah(f.r.pd, &teach);
	CHECK(ah, "an address handle with LID %u and a GID: %s", other, strerror(errno));
	if (ah)
		ibv_destroy_ah(ah);
	/* ... and many more after it (a job starts many connections before
	 * one reaches RTR): none is forgotten. */
	for (int i = 0; i < 100; i++) {
		struct ibv_ah_attr more = teach;

		more.dlid = (uint16_t)(0x100 + i);
		if (more.dlid == f.r.port_attr.lid)
			continue;
		more.grh.dgid.raw[14] = 1;
		more.grh.dgid.raw[15] = (uint8_t)i;
		struct ibv_ah *m = ibv_create_ah(f.r.pd, &more);
		CHECK(m, "address handle %d: %s", i, strerror(errno));
		if (m)
			ibv_destroy_ah(m);
	}
	ah = ibv_create_ah(f.r.pd, &by_lid);
	CHECK(ah, "an address by LID %u alone, whose GID an address told: %s", other,
	      strerror(errno));
	if (ah)
		ibv_destroy_ah(ah);
	fixture_close(&f);
}

/* An attribute the transition does not accept: the kernel's
 * ib_modify_qp_is_ok() rejects it with EINVAL, so real devices do too. */
static void disallowed_attributes(void *arg)
{
	struct fixture f;
	fixture_open(&f, NULL);
	struct ibv_qp_attr a = init_attr(&f);
	a.sq_psn = 5;
	int ret = ibv_modify_qp(f.r.qp, &a, INIT_MASK | IBV_QP_SQ_PSN);
	CHECK(ret == EINVAL, "RESET->INIT with IBV_QP_SQ_PSN: %d, expected EINVAL", ret);
	expect_state(f.r.qp, IBV_QPS_RESET, "after RESET->INIT with IBV_QP_SQ_PSN");
	bring_to(&f, IBV_QPS_INIT);
	a = rtr_attr(&f);
	a.retry_cnt = 7;
	ret = ibv_modify_qp(f.r.qp, &a, RTR_MASK | IBV_QP_RETRY_CNT);
	CHECK(ret == EINVAL, "INIT->RTR with IBV_QP_RETRY_CNT: %d, expected EINVAL", ret);
	expect_state(f.r.qp, IBV_QPS_INIT, "after INIT->RTR with IBV_QP_RETRY_CNT");
	/* The local ACK timeout is set at RTR->RTS only: the kernel's
	 * qp_state_table has no IB_QP_TIMEOUT among the RC RTS->RTS optional
	 * attributes, so real devices refuse it with EINVAL. */
	REQUIRE(t_modify_state(f.r.qp, IBV_QPS_RESET) == 0, "INIT->RESET");
	bring_to(&f, IBV_QPS_RTR);
	a = rts_attr(&f);
	ret = ibv_modify_qp(f.r.qp, &a, RTS_MASK);
	REQUIRE(ret == 0, "RTR->RTS: %d", ret);
	struct ibv_qp_attr m = {.qp_state = IBV_QPS_RTS, .timeout = 20};
	ret = ibv_modify_qp(f.r.qp, &m, IBV_QP_STATE | IBV_QP_TIMEOUT);
	CHECK(ret == EINVAL, "RTS->RTS with IBV_QP_TIMEOUT: %d, expected EINVAL", ret);
	expect_state(f.r.qp, IBV_QPS_RTS, "after RTS->RTS with IBV_QP_TIMEOUT");
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	memset(&q, 0, sizeof(q));
	if (ibv_query_qp(f.r.qp, &q, IBV_QP_TIMEOUT, &qi) == 0)
		CHECK(q.timeout == 14, "timeout is %u after the refused RTS->RTS, expected 14 (as set "
		      "at RTR->RTS)", q.timeout);
	fixture_close(&f);
}

/* Any state -> RESET and any state -> ERR are always allowed; a QP moved to
 * RESET can be brought up again. */
static void to_reset_and_err(void *arg)
{
	static const enum ibv_qp_state from[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR,
						 IBV_QPS_RTS, IBV_QPS_ERR};
	struct fixture f;
	fixture_open(&f, NULL);
	for (size_t i = 0; i < sizeof(from) / sizeof(from[0]); i++) {
		char when[64];
		bring_to(&f, from[i]);
		int ret = t_modify_state(f.r.qp, IBV_QPS_RESET);
		CHECK(ret == 0, "%s->RESET: %d", t_qp_state_str(from[i]), ret);
		snprintf(when, sizeof(when), "after %s->RESET", t_qp_state_str(from[i]));
		expect_state(f.r.qp, IBV_QPS_RESET, when);
		if (ret)
			REQUIRE(false, "cannot continue without a QP in RESET");

		bring_to(&f, from[i]);
		ret = t_modify_state(f.r.qp, IBV_QPS_ERR);
		CHECK(ret == 0, "%s->ERR: %d", t_qp_state_str(from[i]), ret);
		snprintf(when, sizeof(when), "after %s->ERR", t_qp_state_str(from[i]));
		expect_state(f.r.qp, IBV_QPS_ERR, when);
		ret = t_modify_state(f.r.qp, IBV_QPS_RESET);
		REQUIRE(ret == 0, "ERR->RESET: %d", ret);
	}
	/* Back up the whole path after all that. */
	bring_to(&f, IBV_QPS_RTS);
	expect_state(f.r.qp, IBV_QPS_RTS, "after RESET->...->RTS again");
	fixture_close(&f);
}

/* Send WRs may only be posted in RTS (and SQD/SQE); earlier states give an
 * immediate error, and *bad_wr points at the WR that failed (the first). */
static void post_send_bad_state(void *arg)
{
	static const enum ibv_qp_state states[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR};
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
		struct fixture f;
		fixture_open(&f, NULL);
		char *buf = t_alloc(64);
		struct ibv_mr *mr = t_reg(&f.r, buf, 64, IBV_ACCESS_LOCAL_WRITE);
		bring_to(&f, states[i]);
		struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 16, .lkey = mr->lkey};
		struct ibv_send_wr w2 = {.wr_id = 2, .sg_list = &sge, .num_sge = 1,
					 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
		struct ibv_send_wr w1 = w2;
		w1.wr_id = 1;
		w1.next = &w2;
		struct ibv_send_wr *bad = NULL;
		int ret = ibv_post_send(f.r.qp, &w1, &bad);
		CHECK(ret == EINVAL, "ibv_post_send in %s returned %d, expected EINVAL",
		      t_qp_state_str(states[i]), ret);
		CHECK(bad == &w1, "ibv_post_send in %s: bad_wr %p, expected the first WR %p",
		      t_qp_state_str(states[i]), (void *)bad, (void *)&w1);
		/* Nothing was posted, so nothing completes. */
		CHECK(t_cq_drain(f.r.send_cq, NULL, 0, 50) == 0,
		      "a completion appeared after a refused post in %s", t_qp_state_str(states[i]));
		fixture_close(&f);
		free(buf);
	}
}

/* Receive WRs may be posted from INIT on; in RESET they are refused. */
static void post_recv_states(void *arg)
{
	struct fixture f;
	fixture_open(&f, NULL);
	char *buf = t_alloc(64);
	struct ibv_mr *mr = t_reg(&f.r, buf, 64, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey};
	struct ibv_recv_wr r2 = {.wr_id = 2, .sg_list = &sge, .num_sge = 1};
	struct ibv_recv_wr r1 = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .next = &r2};
	struct ibv_recv_wr *bad = NULL;
	int ret = ibv_post_recv(f.r.qp, &r1, &bad);
	CHECK(ret != 0, "ibv_post_recv in RESET succeeded");
	CHECK(ret == 0 || bad == &r1, "ibv_post_recv in RESET: bad_wr %p, expected the first WR %p",
	      (void *)bad, (void *)&r1);
	bring_to(&f, IBV_QPS_INIT);
	bad = NULL;
	ret = ibv_post_recv(f.r.qp, &r1, &bad);
	CHECK(ret == 0, "ibv_post_recv in INIT: %d (bad_wr %p)", ret, (void *)bad);
	/* Nothing completes while the QP just sits in INIT. */
	CHECK(t_cq_drain(f.r.recv_cq, NULL, 0, 50) == 0, "a receive completed in INIT");
	fixture_close(&f);
	free(buf);
}

/* Posting more receives than max_recv_wr without any completing: ENOMEM. */
static void rq_overflow(void *arg)
{
	struct t_opts o = t_opts_default();
	o.max_recv_wr = 16;
	struct fixture f;
	fixture_open(&f, &o);
	char *buf = t_alloc(64);
	struct ibv_mr *mr = t_reg(&f.r, buf, 64, IBV_ACCESS_LOCAL_WRITE);
	bring_to(&f, IBV_QPS_INIT);
	uint32_t n = f.r.cap.max_recv_wr;
	for (uint32_t i = 0; i < n; i++) {
		int ret = t_post_recv(f.r.qp, i, buf, 64, mr->lkey);
		REQUIRE(ret == 0, "ibv_post_recv #%u of max_recv_wr %u: %d", i, n, ret);
	}
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = 999, .sg_list = &sge, .num_sge = 1};
	struct ibv_recv_wr *bad = NULL;
	int ret = ibv_post_recv(f.r.qp, &wr, &bad);
	CHECK(ret == ENOMEM, "ibv_post_recv past max_recv_wr (%u): %d, expected ENOMEM", n, ret);
	CHECK(bad == &wr, "bad_wr %p, expected %p", (void *)bad, (void *)&wr);
	fixture_close(&f);
	free(buf);
}

/* Asking for more than the device has fails; asking for less gets >= it. */
static void create_qp_limits(void *arg)
{
	struct t_opts o = t_opts_default();
	o.create_qp = false;
	struct t_res r;
	t_res_open(&r, &o);
	struct ibv_qp_init_attr ia = {.send_cq = r.send_cq, .recv_cq = r.recv_cq,
				      .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = (uint32_t)r.dev_attr.max_qp_wr + 1,
					      .max_recv_wr = 4, .max_send_sge = 1,
					      .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(r.pd, &ia);
	CHECK(qp == NULL, "ibv_create_qp(max_send_wr = max_qp_wr + 1 = %d) succeeded",
	      r.dev_attr.max_qp_wr + 1);
	if (qp)
		ibv_destroy_qp(qp);
	ia.cap.max_send_wr = 4;
	ia.cap.max_send_sge = (uint32_t)r.dev_attr.max_sge + 1;
	qp = ibv_create_qp(r.pd, &ia);
	CHECK(qp == NULL, "ibv_create_qp(max_send_sge = max_sge + 1 = %d) succeeded",
	      r.dev_attr.max_sge + 1);
	if (qp)
		ibv_destroy_qp(qp);
	ia.cap.max_send_sge = (uint32_t)r.dev_attr.max_sge;
	ia.cap.max_recv_sge = (uint32_t)r.dev_attr.max_sge;
	ia.cap.max_send_wr = (uint32_t)r.dev_attr.max_qp_wr;
	qp = ibv_create_qp(r.pd, &ia);
	CHECK(qp != NULL, "ibv_create_qp at the device limits (wr %d, sge %d): %s",
	      r.dev_attr.max_qp_wr, r.dev_attr.max_sge, strerror(errno));
	if (qp) {
		CHECK(ia.cap.max_send_wr >= (uint32_t)r.dev_attr.max_qp_wr &&
			      ia.cap.max_send_sge >= (uint32_t)r.dev_attr.max_sge,
		      "caps reported below the request: send_wr %u send_sge %u", ia.cap.max_send_wr,
		      ia.cap.max_send_sge);
		CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	}
	t_res_close(&r);
}

/* ---- Send queue overflow: needs a live connection, hence two processes. */

#define SQ_DEPTH 16

static void sq_overflow_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.max_send_wr = SQ_DEPTH;
	o.cq_size = 1024;
	struct t_res r;
	t_res_open(&r, &o);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct t_conn remote;
	t_connect_pair(p, &r, mr, &remote);
	const uint32_t n = r.cap.max_send_wr;
	CHECK(n >= SQ_DEPTH, "max_send_wr %u < %u", n, SQ_DEPTH);
	REQUIRE(n < 1000, "max_send_wr %u too large for this test's CQ", n);

	/* n WRs one at a time, none polled: all accepted. */
	for (uint32_t i = 0; i < n; i++) {
		int ret = t_post_send(r.qp, i, IBV_WR_RDMA_WRITE, buf, 8, mr->lkey,
				      IBV_SEND_SIGNALED, remote.addr, remote.rkey);
		REQUIRE(ret == 0, "ibv_post_send #%u (of max_send_wr %u): %d", i, n, ret);
	}
	/* One more: the send queue is full until completions are polled. */
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1000, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = remote.addr;
	wr.wr.rdma.rkey = remote.rkey;
	struct ibv_send_wr *bad = NULL;
	int ret = ibv_post_send(r.qp, &wr, &bad);
	CHECK(ret == ENOMEM, "ibv_post_send past max_send_wr (%u) without polling: %d, expected "
	      "ENOMEM", n, ret);
	CHECK(bad == &wr, "bad_wr %p, expected the WR %p", (void *)bad, (void *)&wr);
	int extra = ret == 0 ? 1 : 0;

	/* Polling frees the slots. */
	struct ibv_wc *wc = calloc(n + 2, sizeof(*wc));
	struct ibv_send_wr *chain = calloc(n + 1, sizeof(*chain));
	REQUIRE(wc && chain, "out of memory");
	int got = t_poll(r.send_cq, wc, (int)n + extra, T_WAIT_MS);
	CHECK(got == (int)n + extra, "%d completions, expected %u", got, n + extra);
	for (int i = 0; i < got; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS, "completion %d: %s", i,
		      t_wc_status_str(wc[i].status));

	/* A chain one longer than the queue: the first n go, the rest is
	 * refused with bad_wr at the first WR that did not fit. */
	for (uint32_t i = 0; i <= n; i++) {
		chain[i] = wr;
		chain[i].wr_id = 2000 + i;
		chain[i].next = i < n ? &chain[i + 1] : NULL;
	}
	bad = NULL;
	ret = ibv_post_send(r.qp, &chain[0], &bad);
	CHECK(ret == ENOMEM, "chain of max_send_wr + 1 WRs: %d, expected ENOMEM", ret);
	CHECK(bad == &chain[n], "chain: bad_wr is element %ld, expected element %u (the first that "
	      "did not fit)", bad ? (long)(bad - chain) : -1L, n);
	int posted = bad ? (int)(bad - chain) : (int)n + 1;
	got = t_poll(r.send_cq, wc, posted, T_WAIT_MS);
	CHECK(got == posted, "%d completions for %d posted WRs of the chain", got, posted);
	for (int i = 0; i < got; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == 2000u + (unsigned)i,
		      "chain completion %d: %s wr_id %llu", i, t_wc_status_str(wc[i].status),
		      (unsigned long long)wc[i].wr_id);
	t_barrier(p);
	t_res_close(&r);
	free(buf);
	free(wc);
	free(chain);
}

static void sq_overflow_child(struct t_peer *p, void *arg)
{
	/* sleeps while the parent writes */
	t_passive_target(p, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, T_WAIT_MS);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_case("legal_path_and_query", legal_path_and_query, NULL);
	t_case("illegal_transitions", illegal_transitions, NULL);
	t_case("missing_attributes", missing_attributes, NULL);
	t_case("disallowed_attributes", disallowed_attributes, NULL);
	t_case("to_reset_and_err", to_reset_and_err, NULL);
	t_case("post_send_bad_state", post_send_bad_state, NULL);
	t_case("post_recv_states", post_recv_states, NULL);
	t_case("rq_overflow", rq_overflow, NULL);
	t_case("create_qp_limits", create_qp_limits, NULL);
	t_case("rtr_by_lid", rtr_by_lid, NULL);
	t_pair("sq_overflow", sq_overflow_parent, sq_overflow_child, NULL);
	return t_finish();
}
