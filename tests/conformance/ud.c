/* SPDX-License-Identifier: MIT */
/*
 * Conformance: UD queue pairs and address handles.  The kernel's rules for
 * a UD QP's attributes (a Q_Key, no path or peer; a controlled Q_Key is
 * privileged), Sends only, one MTU at most; address handles (what is
 * refused, and EOPNOTSUPP for where datagrams can't go yet); datagrams
 * between two processes: the 40-byte GRH area, filled when the address is
 * global, the sender's QP, LID and SL, immediate data, an answer through
 * ibv_create_ah_from_wc; and what UD drops (another Q_Key, no receive, too
 * long, no such QP) while the sender's WR completes and both QPs go on.
 */
#include "harness.h"
#include "roce_frames.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#define QKEY 0x11111111u
#define BUF 16384
#define GRH 40

/* Datagrams over UDP (URDMA_TRANSPORT=tcp, or across hosts) carry a GRH
 * each, and no LID or SL. */
static bool over_udp(void)
{
	const char *e = getenv("URDMA_TRANSPORT");

	return e && !strcmp(e, "tcp");
}

static void open_res(struct t_res *r)
{
	struct t_opts o = t_opts_default();

	o.create_qp = false;
	o.separate_cqs = true;
	t_res_open(r, &o);
}

static struct ibv_qp *ud_qp(struct t_res *r, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr a = {
		.send_cq = r->send_cq,
		.recv_cq = r->recv_cq,
		.srq = srq,
		.cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
	};
	struct ibv_qp *qp = ibv_create_qp(r->pd, &a);

	REQUIRE(qp, "UD QP: %s", strerror(errno));
	return qp;
}

static int ud_init(struct ibv_qp *qp, uint32_t qkey, int extra)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = qkey };

	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_QKEY | extra);
}

/* INIT, RTR, RTS (rtr_only: stop at RTR, which receives). */
static void ud_up(struct ibv_qp *qp, uint32_t qkey, bool rtr_only)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };

	REQUIRE(ud_init(qp, qkey, 0) == 0, "INIT");
	REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "RTR");
	if (rtr_only)
		return;
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .sq_psn = 1 };
	REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");
}

static struct ibv_ah *ah_lid(struct t_res *r, uint16_t lid, uint8_t sl)
{
	struct ibv_ah_attr a = { .dlid = lid, .sl = sl, .port_num = 1 };

	return ibv_create_ah(r->pd, &a);
}

static struct ibv_ah *ah_gid(struct t_res *r, const union ibv_gid *gid, uint8_t sgid_index)
{
	struct ibv_ah_attr a = { .is_global = 1,
				 .port_num = 1,
				 .sl = 2,
				 .grh = { .dgid = *gid, .sgid_index = sgid_index,
					  .hop_limit = 64, .flow_label = 0x12345,
					  .traffic_class = 0x20 } };

	return ibv_create_ah(r->pd, &a);
}

static int ud_send(struct ibv_qp *qp, uint64_t id, void *buf, uint32_t len, uint32_t lkey,
		   struct ibv_ah *ah, uint32_t qpn, uint32_t qkey, bool imm)
{
	struct ibv_sge sge = { (uintptr_t)buf, len, lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = len ? 1 : 0,
				  .opcode = imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED,
				  .imm_data = htonl(0xabcd0000u | (uint32_t)id) },
			   *bad;

	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = qkey;
	return ibv_post_send(qp, &wr, &bad);
}

/* ---- What a UD QP and an address handle have and have not ---- */

static void ud_rules(void *arg)
{
	(void)arg;
	struct t_res r;
	open_res(&r);
	struct ibv_qp *qp = ud_qp(&r, NULL);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	struct ibv_qp_init_attr ia;
	char *buf = t_alloc(BUF);
	struct ibv_mr *mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	union ibv_gid gid;

	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT) == EINVAL,
	      "INIT without a Q_Key");
	CHECK(ud_init(qp, QKEY, IBV_QP_ACCESS_FLAGS) == EINVAL, "INIT with access flags: UD has none");
	CHECK(ud_init(qp, 0x80000001u, 0) == EPERM, "a controlled Q_Key is privileged");
	REQUIRE(ud_init(qp, QKEY, 0) == 0, "INIT");
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .dest_qp_num = 5 };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN) == EINVAL,
	      "RTR with a destination: UD has none");
	REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "RTR with the state alone");
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL, "RTS without an SQ PSN");
	a.qkey = 0x2222;
	a.sq_psn = 7;
	REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_QKEY) == 0,
		"RTS, a new Q_Key");
	memset(&a, 0, sizeof(a));
	CHECK(ibv_query_qp(qp, &a, IBV_QP_QKEY | IBV_QP_STATE, &ia) == 0 && a.qkey == 0x2222 &&
		      a.qp_state == IBV_QPS_RTS && ia.qp_type == IBV_QPT_UD,
	      "query: Q_Key %#x, state %d", a.qkey, a.qp_state);

	/* Address handles. */
	struct ibv_ah_attr aa = { .dlid = r.port_attr.lid, .port_num = 2 };
	errno = 0;
	CHECK(!ibv_create_ah(r.pd, &aa) && errno == EINVAL, "an AH on port 2: %d", errno);
	aa.port_num = 1;
	aa.dlid = 0;
	errno = 0;
	CHECK(!ibv_create_ah(r.pd, &aa) && errno == EINVAL, "an AH to LID 0: %d", errno);
	aa.dlid = r.port_attr.lid + 1;
	errno = 0;
	CHECK(!ibv_create_ah(r.pd, &aa) && errno == EOPNOTSUPP,
	      "an AH to another host's LID: %d", errno);
	aa.dlid = 0xc001;
	errno = 0;
	CHECK(!ibv_create_ah(r.pd, &aa) && errno == EOPNOTSUPP,
	      "a multicast LID (groups are addressed by GID): %d", errno);
	REQUIRE(ibv_query_gid(r.ctx, 1, 0, &gid) == 0, "gid 0");
	errno = 0;
	CHECK(!ah_gid(&r, &gid, 200) && errno == EINVAL, "a source GID index past the table: %d",
	      errno);
	union ibv_gid far = { .raw = { [10] = 0xff, [11] = 0xff, 10, 99, 99, 99 } };
	struct ibv_ah *ah3 = ah_gid(&r, &far, 0);
	CHECK(ah3 && ibv_destroy_ah(ah3) == 0, "an AH to another host's GID: %s",
	      strerror(errno));
	union ibv_gid mc = { .raw = { 0xff, 0x0e, [15] = 1 } };
	struct ibv_ah *ah4 = ah_gid(&r, &mc, 0);
	CHECK(ah4 && ibv_destroy_ah(ah4) == 0, "an AH to a multicast GID: %s", strerror(errno));
	struct ibv_ah *ah = ah_lid(&r, r.port_attr.lid, 0), *ah2 = ah_gid(&r, &gid, 0);
	CHECK(ah && ah->pd == r.pd && ah->context == r.ctx, "an AH to this host's LID");
	CHECK(ah2, "an AH to this host's GID: %s", strerror(errno));
	CHECK(ibv_dealloc_pd(r.pd) == EBUSY, "the PD is held by its AHs");

	/* Posting. */
	CHECK(t_post_send(qp, 1, IBV_WR_RDMA_WRITE, buf, 8, mr->lkey, IBV_SEND_SIGNALED,
			  (uintptr_t)buf, mr->rkey) == EINVAL, "a Write on UD");
	CHECK(ud_send(qp, 2, buf, 8, mr->lkey, NULL, qp->qp_num, 0x2222, false) == EINVAL,
	      "a Send without an AH");
	CHECK(ud_send(qp, 3, buf, 4097, mr->lkey, ah, qp->qp_num, 0x2222, false) == EINVAL,
	      "a datagram longer than the MTU");
	CHECK(ud_send(qp, 4, buf, 8, mr->lkey, ah, 1u << 24, 0x2222, false) == EINVAL,
	      "a QPN of more than 24 bits");

	/* Extended QP: Sends only. */
	struct ibv_qp_init_attr_ex x = {
		.send_cq = r.send_cq, .recv_cq = r.recv_cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = r.pd, .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE,
	};
	errno = 0;
	CHECK(!ibv_create_qp_ex(r.ctx, &x) && errno == EOPNOTSUPP, "a UD QP that writes: %d", errno);

	CHECK(ibv_destroy_ah(ah) == 0 && ibv_destroy_ah(ah2) == 0, "destroy the AHs");
	CHECK(ibv_destroy_qp(qp) == 0, "destroy");
	t_res_close(&r);
	free(buf);
}

/* ---- In one process: an SRQ, RTR receives, the extended API, a gone QP ---- */

static void ud_local(void *arg)
{
	(void)arg;
	struct t_res r;
	open_res(&r);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(r.pd, &sa);
	REQUIRE(srq, "SRQ");
	struct ibv_qp *rx = ud_qp(&r, srq), *gone = ud_qp(&r, NULL);
	struct ibv_qp_init_attr_ex x = {
		.send_cq = r.send_cq, .recv_cq = r.recv_cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 16, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = r.pd, .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM,
	};
	struct ibv_qp *tx = ibv_create_qp_ex(r.ctx, &x);
	REQUIRE(tx, "extended UD QP: %s", strerror(errno));
	struct ibv_qp_ex *tq = ibv_qp_to_qp_ex(tx);
	uint8_t *buf = t_alloc(BUF);
	struct ibv_mr *mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_wc wc;

	ud_up(rx, QKEY, true); /* RTR receives */
	ud_up(tx, QKEY, false);
	ud_up(gone, QKEY, false);
	struct ibv_ah *ah = ah_lid(&r, r.port_attr.lid, 5);
	REQUIRE(ah, "AH");
	struct ibv_sge rs = { (uintptr_t)(buf + 4096), GRH + 64, mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 100, .sg_list = &rs, .num_sge = 1 }, *bad;
	REQUIRE(ibv_post_srq_recv(srq, &rw, &bad) == 0, "SRQ receive");

	/* ibv_wr_send + ibv_wr_set_ud_addr into the SRQ of a QP in RTR. */
	t_pattern_fill(buf, 64, 3);
	ibv_wr_start(tq);
	tq->wr_id = 1;
	tq->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(tq, htonl(77));
	ibv_wr_set_ud_addr(tq, ah, rx->qp_num, QKEY);
	ibv_wr_set_sge(tq, mr->lkey, (uintptr_t)buf, 64);
	REQUIRE(ibv_wr_complete(tq) == 0, "wr_complete");
	CHECK(t_expect_wc(r.send_cq, &wc, 1, IBV_WC_SUCCESS, IBV_WC_SEND, "send"), "sent");
	if (t_expect_wc(r.recv_cq, &wc, 100, IBV_WC_SUCCESS, IBV_WC_RECV, "recv")) {
		bool udp = over_udp();

		CHECK(wc.qp_num == rx->qp_num && wc.src_qp == tx->qp_num &&
			      wc.byte_len == GRH + 64 && wc.slid == (udp ? 0 : r.port_attr.lid) &&
			      wc.sl == (udp ? 0 : 5) &&
			      (wc.wc_flags & (IBV_WC_WITH_IMM | IBV_WC_GRH)) ==
				      (udp ? IBV_WC_WITH_IMM | IBV_WC_GRH : IBV_WC_WITH_IMM) &&
			      ntohl(wc.imm_data) == 77,
		      "wc: qp %#x src %#x len %u slid %u sl %u flags %#x", wc.qp_num, wc.src_qp,
		      wc.byte_len, wc.slid, wc.sl, wc.wc_flags);
		CHECK(t_pattern_check(buf + 4096 + GRH, 64, 3) < 0, "data after the GRH area");
	}

	/* Too long for the SRQ's receive: it completes in error, the
	 * sender's WR successfully. */
	REQUIRE(ibv_post_srq_recv(srq, &rw, &bad) == 0, "SRQ receive");
	REQUIRE(ud_send(tx, 2, buf, 100, mr->lkey, ah, rx->qp_num, QKEY, false) == 0, "post");
	CHECK(t_expect_wc(r.send_cq, &wc, 2, IBV_WC_SUCCESS, IBV_WC_SEND, "send"),
	      "a datagram too long completes at the sender");
	CHECK(t_expect_wc(r.recv_cq, &wc, 100, IBV_WC_LOC_LEN_ERR, -1, "recv"),
	      "the SRQ's receive completes with a length error");
	CHECK(t_qp_state(rx) == IBV_QPS_RTR, "the receiver goes on: %d", t_qp_state(rx));

	/* A destroyed QP: the datagram is dropped, the sender completes. */
	uint32_t gone_qpn = gone->qp_num;
	REQUIRE(ibv_destroy_qp(gone) == 0, "destroy");
	REQUIRE(ud_send(tx, 3, buf, 8, mr->lkey, ah, gone_qpn, QKEY, false) == 0, "post");
	CHECK(t_expect_wc(r.send_cq, &wc, 3, IBV_WC_SUCCESS, IBV_WC_SEND, "send"),
	      "a datagram to a QP gone completes");
	REQUIRE(ud_send(tx, 4, buf, 8, mr->lkey, ah, 0xfffffe, QKEY, false) == 0, "post");
	CHECK(t_expect_wc(r.send_cq, &wc, 4, IBV_WC_SUCCESS, IBV_WC_SEND, "send"),
	      "a datagram to no QP completes");
	CHECK(t_qp_state(tx) == IBV_QPS_RTS, "the sender goes on");

	/* A send error puts a UD QP in SQE: its sends are flushed, its
	 * receives go on; RTS again, it sends. */
	REQUIRE(ud_send(tx, 6, buf, 8, 0xbad, ah, rx->qp_num, QKEY, false) == 0, "post");
	CHECK(t_expect_wc(r.send_cq, &wc, 6, IBV_WC_LOC_PROT_ERR, -1, "send"),
	      "a bad lkey: a local protection error");
	CHECK(t_qp_state(tx) == IBV_QPS_SQE, "SQE: %s", t_qp_state_str(t_qp_state(tx)));
	REQUIRE(ud_send(tx, 7, buf, 8, mr->lkey, ah, rx->qp_num, QKEY, false) == 0,
		"post in SQE");
	CHECK(t_expect_wc(r.send_cq, &wc, 7, IBV_WC_WR_FLUSH_ERR, -1, "send"), "flushed in SQE");
	{
		struct ibv_qp *other = ud_qp(&r, NULL);
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .cur_qp_state = IBV_QPS_SQE };

		ud_up(other, QKEY, false);
		REQUIRE(t_post_recv(tx, 200, buf + 8192, 256, mr->lkey) == 0, "post recv");
		REQUIRE(ud_send(other, 8, buf, 8, mr->lkey, ah, tx->qp_num, QKEY, false) == 0,
			"post to the QP in SQE");
		CHECK(t_expect_wc(r.send_cq, &wc, 8, IBV_WC_SUCCESS, IBV_WC_SEND, "send"), "sent");
		CHECK(t_expect_wc(r.recv_cq, &wc, 200, IBV_WC_SUCCESS, IBV_WC_RECV, "recv"),
		      "the QP in SQE receives");
		CHECK(ibv_destroy_qp(other) == 0, "destroy");
		CHECK(ibv_modify_qp(tx, &a, IBV_QP_STATE | IBV_QP_CUR_STATE) == 0, "SQE -> RTS");
	}
	REQUIRE(ibv_post_srq_recv(srq, &rw, &bad) == 0, "SRQ receive");
	REQUIRE(ud_send(tx, 9, buf, 8, mr->lkey, ah, rx->qp_num, QKEY, false) == 0, "post");
	CHECK(t_expect_wc(r.send_cq, &wc, 9, IBV_WC_SUCCESS, IBV_WC_SEND, "send"), "sends again");
	CHECK(t_expect_wc(r.recv_cq, &wc, 100, IBV_WC_SUCCESS, IBV_WC_RECV, "recv"),
	      "received after SQE");

	/* The receiver in RESET takes nothing. */
	REQUIRE(t_modify_state(rx, IBV_QPS_RESET) == 0, "reset");
	REQUIRE(ibv_post_srq_recv(srq, &rw, &bad) == 0, "SRQ receive");
	REQUIRE(ud_send(tx, 5, buf, 8, mr->lkey, ah, rx->qp_num, QKEY, false) == 0, "post");
	CHECK(t_expect_wc(r.send_cq, &wc, 5, IBV_WC_SUCCESS, IBV_WC_SEND, "send"), "sent");
	CHECK(t_cq_drain(r.recv_cq, &wc, 1, 100) == 0, "nothing received in RESET");

	CHECK(ibv_destroy_ah(ah) == 0, "destroy AH");
	CHECK(ibv_destroy_qp(tx) == 0 && ibv_destroy_qp(rx) == 0, "destroy");
	CHECK(ibv_destroy_srq(srq) == 0, "destroy SRQ");
	t_res_close(&r);
	free(buf);
}

/* ---- What senders remember of a receiver that changed ---- */

/* Two senders and a receiver: the receiver resets and is destroyed, a new
 * QP (its number and block likely the old one's) takes its place; what a
 * sender knew of the old ring must not make it write the new one wrong. */
static void ud_reuse(void *arg)
{
	(void)arg;
	struct t_res r;
	open_res(&r);
	struct ibv_qp *s1 = ud_qp(&r, NULL), *s2 = ud_qp(&r, NULL), *rx = ud_qp(&r, NULL);
	uint8_t *buf = t_alloc(BUF);
	struct ibv_mr *mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_ah *ah = ah_lid(&r, r.port_attr.lid, 0);
	struct ibv_wc wc;
	uint8_t *rxb = buf + 8192; /* receives: 4 of 256 bytes */

	REQUIRE(ah, "AH");
	memset(rxb, 0xee, 4096);
	t_pattern_fill(buf, 256, 5);
	ud_up(s1, QKEY, false);
	ud_up(s2, QKEY, false);
	ud_up(rx, QKEY, false);
#define SEND(q, id, off) \
	REQUIRE(ud_send(q, id, buf + (off), 16, mr->lkey, ah, rx->qp_num, QKEY, false) == 0, \
		"post"); \
	CHECK(t_expect_wc(r.send_cq, &wc, id, IBV_WC_SUCCESS, IBV_WC_SEND, "send"), "sent")
	REQUIRE(t_post_recv(rx, 1, rxb, 256, mr->lkey) == 0, "post recv");
	SEND(s1, 1, 0);
	CHECK(t_expect_wc(r.recv_cq, &wc, 1, IBV_WC_SUCCESS, IBV_WC_RECV, "recv"), "received");

	/* The receiver resets; the other sender fills its one new receive;
	 * the first, which last saw the ring before the reset, finds none. */
	REQUIRE(t_modify_state(rx, IBV_QPS_RESET) == 0, "reset");
	ud_up(rx, QKEY, false);
	REQUIRE(t_post_recv(rx, 2, rxb + 256, 256, mr->lkey) == 0, "post recv");
	SEND(s2, 2, 16);
	CHECK(t_expect_wc(r.recv_cq, &wc, 2, IBV_WC_SUCCESS, IBV_WC_RECV, "recv"), "received");
	SEND(s1, 3, 32);
	CHECK(t_cq_drain(r.recv_cq, &wc, 1, 100) == 0, "no receive was posted: dropped");
	CHECK(t_qp_state(rx) == IBV_QPS_RTS, "the receiver goes on: %d", t_qp_state(rx));
	REQUIRE(t_post_recv(rx, 4, rxb + 512, 256, mr->lkey) == 0, "post recv");
	SEND(s1, 4, 48);
	if (t_expect_wc(r.recv_cq, &wc, 4, IBV_WC_SUCCESS, IBV_WC_RECV, "recv"))
		CHECK(wc.byte_len == GRH + 16 && !memcmp(rxb + 512 + GRH, buf + 48, 16),
		      "the datagram, in the receive posted after the reset");

	/* A new QP in the old one's place: another ring, on an SRQ. */
	uint32_t old = rx->qp_num;
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(r.pd, &sa);
	REQUIRE(srq && ibv_destroy_qp(rx) == 0, "SRQ, destroy");
	struct ibv_qp_init_attr a = {
		.send_cq = r.send_cq, .recv_cq = r.recv_cq, .srq = srq,
		.cap = { .max_send_wr = 4, .max_send_sge = 1 }, .qp_type = IBV_QPT_UD,
	};
	rx = ibv_create_qp(r.pd, &a);
	REQUIRE(rx, "new QP");
	ud_up(rx, QKEY, false);
	struct ibv_sge sg = { (uintptr_t)(rxb + 768), 256, mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 5, .sg_list = &sg, .num_sge = 1 }, *bad;
	REQUIRE(ibv_post_srq_recv(srq, &rw, &bad) == 0, "post SRQ recv");
	t_note("old QPN %#x, new %#x", old, rx->qp_num);
	SEND(s1, 5, 64);
	if (t_expect_wc(r.recv_cq, &wc, 5, IBV_WC_SUCCESS, IBV_WC_RECV, "recv"))
		CHECK(wc.qp_num == rx->qp_num && !memcmp(rxb + 768 + GRH, buf + 64, 16),
		      "the new QP's receive has it");
#undef SEND
	/* Nothing was written but the receives that completed. */
	bool intact = true;
	for (int i = 0; i < 4096; i++) {
		int k = i % 256;

		if (i < 1024 && k < GRH + 16)
			continue; /* (a receive's GRH area, written or not, and data) */
		intact &= rxb[i] == 0xee;
	}
	CHECK(intact, "nothing written outside the receives");
	CHECK(ibv_destroy_ah(ah) == 0, "destroy AH");
	CHECK(ibv_destroy_qp(rx) == 0 && ibv_destroy_qp(s1) == 0 && ibv_destroy_qp(s2) == 0,
	      "destroy");
	CHECK(ibv_destroy_srq(srq) == 0, "destroy SRQ");
	t_res_close(&r);
	free(buf);
}

/* Over UDP into a QP on an SRQ whose limit is armed: the limit event. */
static void ud_srq_limit_udp(void *arg)
{
	(void)arg;
	setenv("URDMA_TRANSPORT", "tcp", 1);
	struct t_res r;
	open_res(&r);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(r.pd, &sa);
	REQUIRE(srq, "SRQ");
	struct ibv_qp *rx = ud_qp(&r, srq), *tx = ud_qp(&r, NULL);
	uint8_t *buf = t_alloc(BUF);
	struct ibv_mr *mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_ah *ah = ah_lid(&r, r.port_attr.lid, 0);
	struct ibv_srq_attr lim = { .srq_limit = 3 };
	struct ibv_async_event ev;
	struct ibv_wc wc[4];

	REQUIRE(ah, "AH");
	ud_up(rx, QKEY, false);
	ud_up(tx, QKEY, false);
	for (int i = 0; i < 4; i++) {
		struct ibv_sge sg = { (uintptr_t)(buf + 4096 + i * 256), 256, mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 10 + i, .sg_list = &sg, .num_sge = 1 }, *bad;

		REQUIRE(ibv_post_srq_recv(srq, &rw, &bad) == 0, "post");
	}
	REQUIRE(ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT) == 0, "arm the limit");
	for (int i = 0; i < 2; i++) {
		REQUIRE(ud_send(tx, i, buf, 8, mr->lkey, ah, rx->qp_num, QKEY, false) == 0, "post");
		CHECK(t_expect_wc(r.send_cq, wc, i, IBV_WC_SUCCESS, IBV_WC_SEND, "send"), "sent");
	}
	CHECK(t_poll(r.recv_cq, wc, 2, T_WAIT_MS) == 2, "both received");
	CHECK(t_fd_readable(r.ctx->async_fd, 2000) && ibv_get_async_event(r.ctx, &ev) == 0 &&
		      (ibv_ack_async_event(&ev), ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED),
	      "the SRQ limit event");
	CHECK(ibv_destroy_ah(ah) == 0, "destroy AH");
	CHECK(ibv_destroy_qp(rx) == 0 && ibv_destroy_qp(tx) == 0, "destroy");
	CHECK(ibv_destroy_srq(srq) == 0, "destroy SRQ");
	t_res_close(&r);
	free(buf);
}

/* ---- Multicast ---- */

/* The index of a GID of ours that is an IPv4 address, not loopback: what
 * a multicast goes out of over UDP. */
static int v4_gid_index(struct t_res *r)
{
	for (int i = 1; i < r->port_attr.gid_tbl_len; i++) {
		union ibv_gid g;

		if (!ibv_query_gid(r->ctx, 1, i, &g) && g.raw[10] == 0xff && g.raw[11] == 0xff &&
		    g.raw[12] != 127)
			return i;
	}
	return 1;
}

static void ud_multicast(void *arg)
{
	(void)arg;
	struct t_res r;
	open_res(&r);
	struct ibv_qp_init_attr_ex x = {
		.send_cq = r.send_cq, .recv_cq = r.recv_cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 16, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
		.pd = r.pd, .create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB,
	};
	struct ibv_qp *tx = ibv_create_qp_ex(r.ctx, &x), *rx1 = ud_qp(&r, NULL),
		      *rx2 = ud_qp(&r, NULL);
	union ibv_gid grp = { .raw = { [10] = 0xff, [11] = 0xff, 239, 1, 2, 3 } },
		      plain = { .raw = { [10] = 0xff, [11] = 0xff, 10, 1, 2, 3 } };
	uint8_t *buf = t_alloc(BUF);
	struct ibv_mr *mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_wc wc[4];
	struct ibv_ah *ah;

	REQUIRE(tx, "a UD QP that blocks its own multicasts: %s", strerror(errno));
	ud_up(tx, QKEY, false);
	ud_up(rx1, QKEY, false);
	ud_up(rx2, QKEY, false);
	ah = ah_gid(&r, &grp, (uint8_t)v4_gid_index(&r));
	REQUIRE(ah, "an AH to the group: %s", strerror(errno));
	CHECK(ibv_attach_mcast(rx1, &plain, 0) == EINVAL, "attach to a unicast GID");
	CHECK(ibv_detach_mcast(rx1, &grp, 0) == EINVAL, "detach what is not attached");
	CHECK(ibv_attach_mcast(rx1, &grp, 0) == 0 && ibv_attach_mcast(rx1, &grp, 0) == 0,
	      "attach (twice)");
	CHECK(ibv_attach_mcast(rx2, &grp, 0) == 0 && ibv_attach_mcast(tx, &grp, 0) == 0,
	      "attach the others");
	REQUIRE(t_post_recv(rx1, 1, buf + 4096, 256, mr->lkey) == 0 &&
			t_post_recv(rx2, 2, buf + 4352, 256, mr->lkey) == 0 &&
			t_post_recv(tx, 3, buf + 4608, 256, mr->lkey) == 0,
		"post recvs");
	strcpy((char *)buf, "to the group");
	REQUIRE(ud_send(tx, 10, buf, 13, mr->lkey, ah, 0xffffff, QKEY, false) == 0, "post");
	CHECK(t_expect_wc(r.send_cq, wc, 10, IBV_WC_SUCCESS, IBV_WC_SEND, "send"), "sent");
	int n = t_poll(r.recv_cq, wc, 2, T_WAIT_MS);
	CHECK(n == 2, "both members received: %d", n);
	for (int i = 0; i < n; i++) {
		uint8_t *b = buf + 4096 + (wc[i].wr_id - 1) * 256;
		const struct ibv_grh *h = (const void *)b;

		CHECK((wc[i].wr_id == 1 || wc[i].wr_id == 2) && wc[i].status == IBV_WC_SUCCESS &&
			      wc[i].byte_len == GRH + 13 && (wc[i].wc_flags & IBV_WC_GRH) &&
			      wc[i].src_qp == tx->qp_num && !memcmp(h->dgid.raw, grp.raw, 16) &&
			      !strcmp((char *)b + GRH, "to the group"),
		      "member %llu: len %u src %#x", (unsigned long long)wc[i].wr_id,
		      wc[i].byte_len, wc[i].src_qp);
	}
	CHECK(t_cq_drain(r.recv_cq, wc, 1, 100) == 0, "not to the sender, which blocks it");
	REQUIRE(t_post_recv(rx1, 1, buf + 4096, 256, mr->lkey) == 0, "post recv");
	REQUIRE(ud_send(tx, 12, buf, 13, mr->lkey, ah, rx1->qp_num, QKEY, false) == 0, "post");
	CHECK(t_expect_wc(r.send_cq, wc, 12, IBV_WC_SUCCESS, IBV_WC_SEND, "send"), "sent");
	CHECK(t_cq_drain(r.recv_cq, wc, 1, 100) == 0,
	      "a multicast to a QPN but 0xffffff reaches nobody");

	/* One leaves; one is destroyed: the next reaches the last. */
	CHECK(ibv_detach_mcast(rx2, &grp, 0) == 0, "detach");
	REQUIRE(ibv_destroy_qp(tx) == 0, "destroy the sender");
	tx = ud_qp(&r, NULL);
	ud_up(tx, QKEY, false);
	REQUIRE(t_post_recv(rx2, 5, buf + 4352, 256, mr->lkey) == 0, "post recv");
	REQUIRE(ud_send(tx, 11, buf, 13, mr->lkey, ah, 0xffffff, QKEY, false) == 0, "post");
	CHECK(t_expect_wc(r.send_cq, wc, 11, IBV_WC_SUCCESS, IBV_WC_SEND, "send"), "sent");
	CHECK(t_expect_wc(r.recv_cq, wc, 1, IBV_WC_SUCCESS, IBV_WC_RECV, "recv"),
	      "the member left");
	CHECK(t_cq_drain(r.recv_cq, wc, 1, 100) == 0, "not the one that left");
	CHECK(ibv_destroy_ah(ah) == 0, "destroy AH");
	CHECK(ibv_destroy_qp(rx1) == 0 && ibv_destroy_qp(rx2) == 0 && ibv_destroy_qp(tx) == 0,
	      "destroy (rx1 still attached)");
	t_res_close(&r);
	free(buf);
}

/* ---- Two processes ---- */

struct side {
	struct t_res r;
	struct ibv_qp *qp;
	uint8_t *buf;
	struct ibv_mr *mr;
	struct t_conn remote;
};

/* arg non-NULL: datagrams over UDP (on loopback), not shared memory. */
static void side_up(struct t_peer *p, struct side *s, uint32_t qkey, void *udp)
{
	struct t_conn local;

	if (udp)
		setenv("URDMA_TRANSPORT", "tcp", 1);

	open_res(&s->r);
	s->qp = ud_qp(&s->r, NULL);
	s->r.qp = s->qp;
	s->buf = t_alloc(BUF);
	s->mr = t_reg(&s->r, s->buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	ud_up(s->qp, qkey, false);
	t_conn_local(&s->r, s->mr, &local);
	REQUIRE(ibv_query_gid(s->r.ctx, 1, 1, &local.gid) == 0, "gid 1");
	t_exchange(p, &local, &s->remote);
}

static void side_down(struct side *s)
{
	s->r.qp = NULL;
	CHECK(ibv_destroy_qp(s->qp) == 0, "destroy");
	t_res_close(&s->r);
	free(s->buf);
}

enum { N_GRH = 1, N_PLAIN, N_QKEY, N_CONTROLLED, N_LONG, N_AFTER_LONG, N_NONE,
       N_AFTER_NONE };

/* The sender: datagrams of each kind, each completing at once. */
static void pair_sender(struct t_peer *p, void *arg)
{
	struct side s;
	struct ibv_wc wc;

	side_up(p, &s, QKEY, arg);
	struct ibv_ah *g = ah_gid(&s.r, &s.remote.gid, 1), *l = ah_lid(&s.r, s.remote.lid, 3);
	REQUIRE(g && l, "AHs: %s", strerror(errno));
	t_pattern_fill(s.buf, 2048, 9);
	t_barrier(p); /* A: the receiver posted 4 receives */
	static const struct { int id; int len; uint32_t qkey; bool global; } m[] = {
		{ N_GRH, 1000, QKEY, true },   { N_PLAIN, 500, QKEY, false },
		{ N_QKEY, 8, 0x999, false },   { N_CONTROLLED, 16, 0x80000000u, false },
		{ N_LONG, 2000, QKEY, false }, { N_AFTER_LONG, 1000, QKEY, false },
	};
	for (unsigned i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
		REQUIRE(ud_send(s.qp, m[i].id, s.buf, m[i].len, s.mr->lkey, m[i].global ? g : l,
				s.remote.qpn, m[i].qkey, m[i].id == N_GRH) == 0,
			"post %d", m[i].id);
		CHECK(t_expect_wc(s.r.send_cq, &wc, m[i].id, IBV_WC_SUCCESS, IBV_WC_SEND, "send"),
		      "datagram %d completes at the sender", m[i].id);
	}
	t_barrier(p); /* B: the receiver took its 4 */
	REQUIRE(ud_send(s.qp, N_NONE, s.buf, 8, s.mr->lkey, l, s.remote.qpn, QKEY, false) == 0,
		"post");
	CHECK(t_expect_wc(s.r.send_cq, &wc, N_NONE, IBV_WC_SUCCESS, IBV_WC_SEND, "send"),
	      "a datagram no receive takes completes at the sender");
	t_barrier(p); /* C */
	t_barrier(p); /* D: the receiver posted one more */
	REQUIRE(ud_send(s.qp, N_AFTER_NONE, s.buf + 100, 8, s.mr->lkey, l, s.remote.qpn, QKEY,
			false) == 0, "post");
	CHECK(t_expect_wc(s.r.send_cq, &wc, N_AFTER_NONE, IBV_WC_SUCCESS, IBV_WC_SEND, "send"),
	      "sent");
	REQUIRE(t_post_recv(s.qp, 50, s.buf + 8192, 4096, s.mr->lkey) == 0, "post recv");
	t_barrier(p); /* E */
	/* The answer, through an AH the receiver made from our datagram's
	 * completion. */
	if (t_expect_wc(s.r.recv_cq, &wc, 50, IBV_WC_SUCCESS, IBV_WC_RECV, "answer")) {
		const struct ibv_grh *h = (const void *)(s.buf + 8192);
		union ibv_gid mine;

		REQUIRE(ibv_query_gid(s.r.ctx, 1, 1, &mine) == 0, "gid");
		CHECK((wc.wc_flags & IBV_WC_GRH) && wc.byte_len == GRH + 32 &&
			      wc.src_qp == s.remote.qpn &&
			      (arg || over_udp() || (!memcmp(h->dgid.raw, mine.raw, 16) &&
				       !memcmp(h->sgid.raw, s.remote.gid.raw, 16))),
		      "the answer came back to us, with a GRH: flags %#x len %u", wc.wc_flags,
		      wc.byte_len);
	}
	CHECK(t_qp_state(s.qp) == IBV_QPS_RTS, "the sender goes on");
	t_barrier(p); /* F */
	CHECK(ibv_destroy_ah(g) == 0 && ibv_destroy_ah(l) == 0, "destroy AHs");
	side_down(&s);
}

static void pair_receiver(struct t_peer *p, void *arg)
{
	/* Over UDP every datagram has a GRH (its IP header, as RoCEv2's), and
	 * no LID or SL. */
	bool udp = arg || over_udp();
	struct side s;
	struct ibv_wc wc[8];
	/* Each receive is 40 + 1000 bytes: the 2000-byte datagram fits none
	 * (its receive completes with a length error). */
	const uint32_t slot = 2048, room = GRH + 1000;
	struct ibv_ah *back = NULL;

	side_up(p, &s, QKEY, arg);
	memset(s.buf, 0xee, BUF);
	for (int i = 0; i < 5; i++)
		REQUIRE(t_post_recv(s.qp, 10 + i, s.buf + i * slot, room, s.mr->lkey) == 0, "post");
	t_barrier(p); /* A */
	/* GRH, plain, (Q_Key: dropped), controlled, too long, the one after
	 * it. */
	int n = t_poll(s.r.recv_cq, wc, 5, T_WAIT_MS);
	CHECK(n == 5, "5 of 6 datagrams received: %d", n);
	if (n >= 1) {
		const struct ibv_grh *h = (const void *)s.buf;
		union ibv_gid mine;

		REQUIRE(ibv_query_gid(s.r.ctx, 1, 1, &mine) == 0, "gid");
		CHECK(wc[0].wr_id == 10 && wc[0].status == IBV_WC_SUCCESS &&
			      wc[0].byte_len == GRH + 1000 && (wc[0].wc_flags & IBV_WC_GRH) &&
			      (wc[0].wc_flags & IBV_WC_WITH_IMM) &&
			      ntohl(wc[0].imm_data) == (0xabcd0000u | N_GRH) &&
			      wc[0].src_qp == s.remote.qpn && wc[0].sl == (udp ? 0 : 2) &&
			      wc[0].slid == (udp ? 0 : s.remote.lid),
		      "GRH datagram: id %llu len %u flags %#x src %#x sl %u",
		      (unsigned long long)wc[0].wr_id, wc[0].byte_len, wc[0].wc_flags,
		      wc[0].src_qp, wc[0].sl);
		/* (over UDP the GRH is made of the IP addresses: both ours, the
		 * one of GID 1 the sender sent to) */
		CHECK(udp ? be32toh(h->version_tclass_flow) >> 28 == 6 && h->next_hdr == 0x1b &&
				    !memcmp(h->sgid.raw, h->dgid.raw, 16) &&
				    !memcmp(h->dgid.raw, mine.raw, 16) :
			    be32toh(h->version_tclass_flow) ==
					    (6u << 28 | 0x20u << 20 | 0x12345) &&
				    h->next_hdr == 0x1b && h->hop_limit == 64 &&
				    !memcmp(h->sgid.raw, s.remote.gid.raw, 16) &&
				    !memcmp(h->dgid.raw, mine.raw, 16),
		      "the GRH: %#x next %#x hops %u", be32toh(h->version_tclass_flow),
		      h->next_hdr, h->hop_limit);
		CHECK(t_pattern_check(s.buf + GRH, 1000, 9) < 0, "its data");
		back = ibv_create_ah_from_wc(s.r.pd, &wc[0], (struct ibv_grh *)h, 1);
		CHECK(back, "an AH from the completion: %s", strerror(errno));
	}
	if (n >= 2) {
		CHECK(wc[1].wr_id == 11 && wc[1].byte_len == GRH + 500 &&
			      !(wc[1].wc_flags & IBV_WC_WITH_IMM) &&
			      !(wc[1].wc_flags & IBV_WC_GRH) == !udp && wc[1].sl == (udp ? 0 : 3),
		      "plain datagram: id %llu len %u flags %#x sl %u",
		      (unsigned long long)wc[1].wr_id, wc[1].byte_len, wc[1].wc_flags, wc[1].sl);
		CHECK(udp || (s.buf[slot] == 0xee && s.buf[slot + GRH - 1] == 0xee),
		      "without a GRH its 40 bytes are left alone");
		CHECK(t_pattern_check(s.buf + slot + GRH, 500, 9) < 0, "its data");
	}
	if (n >= 3)
		CHECK(wc[2].wr_id == 12 && wc[2].byte_len == GRH + 16,
		      "a controlled Q_Key in the WR is the sender QP's: id %llu len %u",
		      (unsigned long long)wc[2].wr_id, wc[2].byte_len);
	if (n >= 4)
		CHECK(wc[3].wr_id == 13 && wc[3].status == IBV_WC_LOC_LEN_ERR,
		      "a datagram too long for the receive: id %llu %s",
		      (unsigned long long)wc[3].wr_id, t_wc_status_str(wc[3].status));
	if (n >= 5)
		CHECK(wc[4].wr_id == 14 && wc[4].status == IBV_WC_SUCCESS &&
			      wc[4].byte_len == GRH + 1000,
		      "the next datagram after it: id %llu len %u",
		      (unsigned long long)wc[4].wr_id, wc[4].byte_len);
	t_barrier(p); /* B */
	t_barrier(p); /* C: the datagram with no receive came and went */
	if (udp) /* (it came: the progress thread reads it at once) */
		t_sleep_ms(100);
	REQUIRE(t_post_recv(s.qp, 15, s.buf + 5 * slot, room, s.mr->lkey) == 0, "post");
	t_barrier(p); /* D */
	t_barrier(p); /* E */
	if (t_expect_wc(s.r.recv_cq, &wc[0], 15, IBV_WC_SUCCESS, IBV_WC_RECV, "recv")) {
		bool next = wc[0].byte_len == GRH + 8;

		for (int i = 0; i < 8; i++) /* it sent its bytes 100.. */
			next &= s.buf[5 * slot + GRH + i] == t_pattern_byte(100 + i, 9);
		CHECK(next, "the next datagram, not the dropped one: len %u", wc[0].byte_len);
	}
	if (back) {
		REQUIRE(ud_send(s.qp, 60, s.buf + 6 * slot, 32, s.mr->lkey, back, wc[0].src_qp,
				QKEY, false) == 0, "answer");
		CHECK(t_expect_wc(s.r.send_cq, &wc[7], 60, IBV_WC_SUCCESS, IBV_WC_SEND, "answer"),
		      "answered");
		CHECK(ibv_destroy_ah(back) == 0, "destroy AH");
	}
	CHECK(t_cq_drain(s.r.recv_cq, wc, 8, 50) == 0, "nothing else");
	CHECK(t_qp_state(s.qp) == IBV_QPS_RTS, "the receiver goes on");
	t_barrier(p); /* F */
	side_down(&s);
}

/* ---- Datagrams from the network that are not what they should be ---- */

static void ud_hostile(void *arg)
{
	(void)arg;
	struct t_res r;
	open_res(&r);
	struct ibv_qp *qp = ud_qp(&r, NULL);
	uint8_t *buf = t_alloc(BUF), pkt[8192];
	struct ibv_mr *mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	struct sockaddr_in to = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t)(qp->qp_num >> 8)),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	uint16_t port = 0;
	int fd = rf_socket(&port);
	uint32_t src; /* a QP of our socket's port, as urdma's are named */
	struct ibv_wc wc;
	size_t n;

	REQUIRE(fd >= 0, "socket");
	src = (uint32_t)port << 8 | 0x56;
	ud_up(qp, QKEY, false);
	for (int i = 0; i < 4; i++)
		REQUIRE(t_post_recv(qp, 20 + i, buf + i * 4096, 4096, mr->lkey) == 0, "post");
#define SEND_PKT(len) sendto(fd, pkt, len, 0, (struct sockaddr *)&to, sizeof(to))
	n = rf_ud_send(pkt, qp->qp_num, QKEY, src, "bad crc!", 8, false);
	SEND_PKT(n);
	SEND_PKT(n - 8);				/* cut short */
	SEND_PKT(10);					/* no headers */
	n = rf_ud_send(pkt, qp->qp_num, QKEY, src, "opcode..", 8, true);
	pkt[0] = 0x04;					/* an RC Send */
	SEND_PKT(n);
	n = rf_ud_send(pkt, qp->qp_num, QKEY, src, "", 0, true);
	pkt[1] = 0x30;					/* pad 3 of nothing */
	rf_fix(pkt, n, qp->qp_num, QKEY, true);
	SEND_PKT(n);
	n = rf_ud_send(pkt, qp->qp_num ^ 0x1, QKEY, src, "noqp....", 8, true);
	SEND_PKT(n);					/* no such QP */
	n = rf_ud_send(pkt, qp->qp_num, QKEY + 1, src, "qkey....", 8, true);
	SEND_PKT(n);					/* another Q_Key */
	static const uint8_t big[4100];
	n = rf_ud_send(pkt, qp->qp_num, QKEY, src, big, sizeof(big), true);
	SEND_PKT(n);					/* longer than the MTU */
	n = rf_ud_send(pkt, qp->qp_num, QKEY, src ^ 0x100, "srcqp...", 8, true);
	SEND_PKT(n);					/* another port's QP */
	n = rf_ud_send(pkt, qp->qp_num, QKEY, src, "good one", 8, true);
	SEND_PKT(n);
#undef SEND_PKT
	if (t_expect_wc(r.recv_cq, &wc, 20, IBV_WC_SUCCESS, IBV_WC_RECV, "good datagram"))
		CHECK(wc.byte_len == GRH + 8 && !memcmp(buf + GRH, "good one", 8) &&
			      wc.src_qp == src && (wc.wc_flags & IBV_WC_GRH),
		      "only the good datagram: len %u src %#x", wc.byte_len, wc.src_qp);
	CHECK(t_cq_drain(r.recv_cq, &wc, 1, 100) == 0, "nothing else");
	CHECK(t_qp_state(qp) == IBV_QPS_RTS, "the QP goes on");
	close(fd);
	CHECK(ibv_destroy_qp(qp) == 0, "destroy");
	t_res_close(&r);
	free(buf);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_case("ud_rules", ud_rules, NULL);
	t_case("ud_local", ud_local, NULL);
	t_case("ud_reuse", ud_reuse, NULL);
	t_case("ud_srq_limit_udp", ud_srq_limit_udp, NULL);
	t_case("ud_multicast", ud_multicast, NULL);
	t_pair("ud_datagrams", pair_sender, pair_receiver, NULL);
	t_pair("ud_datagrams_udp", pair_sender, pair_receiver, "udp");
	t_case("ud_hostile_datagrams", ud_hostile, NULL);
	return t_finish();
}
