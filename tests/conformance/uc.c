/* SPDX-License-Identifier: MIT */
/*
 * Conformance: UC queue pairs.  The kernel's rules for their attributes
 * (no timeouts, retries, RNR timer or responder resources), no Reads or
 * atomics; Sends and Writes, with and without immediate data, between two
 * processes; and what UC does with what the responder cannot take: the
 * message is dropped, the sender (which no acknowledgement tells) sees it
 * complete, and the QP goes on.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MSG 256
#define BUF 65536

static struct ibv_qp *uc_qp(struct t_res *r)
{
	struct ibv_qp_init_attr a = {
		.send_cq = r->send_cq,
		.recv_cq = r->recv_cq,
		.cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UC,
	};
	struct ibv_qp *qp = ibv_create_qp(r->pd, &a);

	REQUIRE(qp, "UC QP: %s", strerror(errno));
	return qp;
}

static int uc_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };

	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_ACCESS_FLAGS);
}

static int uc_rtr(struct t_res *r, struct ibv_qp *qp, const struct t_conn *remote, int extra)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = remote->qpn,
		.rq_psn = remote->psn,
		.min_rnr_timer = 12,
		.max_dest_rd_atomic = 1,
		.ah_attr = { .dlid = remote->lid, .port_num = 1, .is_global = 1,
			     .grh = { .dgid = remote->gid,
				      .sgid_index = r->opts.sgid_index,
				      .hop_limit = 64 } },
	};

	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | extra);
}

static int uc_rts(struct ibv_qp *qp, uint32_t psn, int extra)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .sq_psn = psn, .timeout = 14,
				 .retry_cnt = 7, .rnr_retry = 7 };

	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | extra);
}

/* Both sides: a UC QP and a buffer, connected; *remote is the peer's. */
static struct ibv_qp *uc_connect(struct t_peer *p, struct t_res *r, struct ibv_mr *mr,
				 struct t_conn *remote)
{
	struct t_conn local;
	struct ibv_qp *qp = uc_qp(r);

	r->qp = qp;
	t_conn_local(r, mr, &local);
	t_exchange(p, &local, remote);
	REQUIRE(uc_init(qp) == 0, "INIT");
	REQUIRE(uc_rtr(r, qp, remote, 0) == 0, "RTR");
	REQUIRE(uc_rts(qp, r->psn, 0) == 0, "RTS");
	t_barrier(p);
	return qp;
}

static void open_res(struct t_res *r)
{
	struct t_opts o = t_opts_default();

	o.create_qp = false;
	o.separate_cqs = true;
	t_res_open(r, &o);
}

/* ---- What a UC QP has and has not ---- */

static void uc_rules(void *arg)
{
	(void)arg;
	struct t_res r;
	open_res(&r);
	struct ibv_qp *qp = uc_qp(&r);
	struct t_conn self;

	r.qp = qp;
	t_conn_local(&r, NULL, &self);
	CHECK(qp->qp_type == IBV_QPT_UC && qp->recv_cq == r.recv_cq, "fields");
	REQUIRE(uc_init(qp) == 0, "INIT");
	CHECK(uc_rtr(&r, qp, &self, IBV_QP_MIN_RNR_TIMER) == EINVAL,
	      "an RNR timer at RTR: UC has none");
	CHECK(uc_rtr(&r, qp, &self, IBV_QP_MAX_DEST_RD_ATOMIC) == EINVAL,
	      "responder resources at RTR: UC has none");
	REQUIRE(uc_rtr(&r, qp, &self, 0) == 0, "RTR with UC's attributes");
	CHECK(uc_rts(qp, 1, IBV_QP_TIMEOUT) == EINVAL, "a timeout: UC has none");
	CHECK(uc_rts(qp, 1, IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY) == EINVAL,
	      "retries: UC has none");
	REQUIRE(uc_rts(qp, 1, 0) == 0, "RTS with only the SQ PSN");
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	uint64_t res;
	CHECK(t_post_send(qp, 1, IBV_WR_RDMA_READ, buf, 8, mr->lkey, IBV_SEND_SIGNALED,
			  (uintptr_t)buf, mr->rkey) == EINVAL, "a Read on UC");
	CHECK(t_post_atomic(qp, 2, IBV_WR_ATOMIC_FETCH_AND_ADD, &res, mr->lkey,
			    (uintptr_t)buf, mr->rkey, 1, 0) == EINVAL, "an atomic on UC");
	CHECK(t_post_send(qp, 3, IBV_WR_SEND_WITH_INV, buf, 8, mr->lkey, IBV_SEND_SIGNALED, 0,
			  0) == EINVAL, "a Send with Invalidate on UC");
	CHECK(ibv_destroy_qp(qp) == 0, "destroy");
	r.qp = NULL;
	t_res_close(&r);
	free(buf);
}

/* ---- Two processes: what arrives, and what is dropped ---- */

enum { STEP_DATA = 1, STEP_DROPS, STEP_AFTER };

static void pair_sender(struct t_peer *p, void *arg)
{
	(void)arg;
	struct t_res r;
	open_res(&r);
	uint8_t *buf = t_alloc(BUF);
	struct ibv_mr *mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	struct t_conn rem;
	struct ibv_qp *qp = uc_connect(p, &r, mr, &rem);
	struct ibv_wc wc;

	/* Sends and Writes, with and without immediate data. */
	t_barrier(p); /* the receiver posted its receives */
	for (int i = 0; i < 4; i++)
		t_pattern_fill(buf + i * MSG, MSG, 1 + i);
	static const enum ibv_wr_opcode ops[] = { IBV_WR_SEND, IBV_WR_SEND_WITH_IMM,
						  IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM };
	for (int i = 0; i < 4; i++) {
		struct ibv_sge sge = { (uintptr_t)buf + i * MSG, MSG, mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 10 + i, .sg_list = &sge, .num_sge = 1,
					  .opcode = ops[i], .send_flags = IBV_SEND_SIGNALED,
					  .imm_data = htonl(0x100 + i) }, *bad;

		wr.wr.rdma.remote_addr = rem.addr + 8192 + i * MSG;
		wr.wr.rdma.rkey = rem.rkey;
		REQUIRE(ibv_post_send(qp, &wr, &bad) == 0, "post %d", i);
		CHECK(t_expect_wc(r.send_cq, &wc, 10 + i, IBV_WC_SUCCESS, -1, "send"), "wr %d",
		      i);
	}
	t_barrier(p); /* the receiver checked */

	/* What the receiver can't take: no receive posted, a bad rkey (with
	 * and without immediate data), too long.  Each completes here. */
	REQUIRE(t_post_send(qp, 20, IBV_WR_SEND, buf, MSG, mr->lkey, IBV_SEND_SIGNALED, 0,
			    0) == 0, "send, no receive");
	CHECK(t_expect_wc(r.send_cq, &wc, 20, IBV_WC_SUCCESS, IBV_WC_SEND, "dropped send"),
	      "a send nobody receives completes");
	/* A Write behind it tells the receiver it has been dealt with
	 * (in order: over TCP the Send may still be on its way). */
	uint64_t *mark = (uint64_t *)(buf + 32768);
	*mark = 0x5eed;
	REQUIRE(t_post_send(qp, 25, IBV_WR_RDMA_WRITE, mark, 8, mr->lkey, IBV_SEND_SIGNALED,
			    rem.addr + 32768, rem.rkey) == 0, "marker");
	CHECK(t_expect_wc(r.send_cq, &wc, 25, IBV_WC_SUCCESS, -1, "marker"), "marker");
	t_barrier(p); /* the receiver posted one receive of MSG bytes */
	REQUIRE(t_post_send(qp, 21, IBV_WR_RDMA_WRITE, buf, MSG, mr->lkey, IBV_SEND_SIGNALED,
			    rem.addr + 16384, rem.rkey ^ 0x100) == 0, "write, bad rkey");
	REQUIRE(t_post_send(qp, 22, IBV_WR_RDMA_WRITE_WITH_IMM, buf, MSG, mr->lkey,
			    IBV_SEND_SIGNALED, rem.addr + 16384, rem.rkey ^ 0x100) == 0,
		"write with imm, bad rkey");
	REQUIRE(t_post_send(qp, 23, IBV_WR_SEND, buf, 2 * MSG, mr->lkey, IBV_SEND_SIGNALED, 0,
			    0) == 0, "send, too long");
	for (int i = 21; i <= 23; i++)
		CHECK(t_expect_wc(r.send_cq, &wc, i, IBV_WC_SUCCESS, -1, "dropped"),
		      "dropped wr %d completes", i);
	/* Then one that fits takes that receive: the QP goes on. */
	t_pattern_fill(buf, MSG, 77);
	REQUIRE(t_post_send(qp, 24, IBV_WR_SEND, buf, MSG, mr->lkey, IBV_SEND_SIGNALED, 0, 0) ==
			0,
		"send");
	CHECK(t_expect_wc(r.send_cq, &wc, 24, IBV_WC_SUCCESS, IBV_WC_SEND, "send"), "send");
	CHECK(t_qp_state(qp) == IBV_QPS_RTS, "sender still RTS");
	t_barrier(p);
	t_res_close(&r);
	free(buf);
}

static void pair_receiver(struct t_peer *p, void *arg)
{
	(void)arg;
	struct t_res r;
	open_res(&r);
	uint8_t *buf = t_alloc(BUF);
	struct ibv_mr *mr = t_reg(&r, buf, BUF,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct t_conn rem;
	struct ibv_qp *qp = uc_connect(p, &r, mr, &rem);
	struct ibv_wc wc;

	for (int i = 0; i < 2; i++)
		REQUIRE(t_post_recv(qp, 100 + i, buf + i * MSG, MSG, mr->lkey) == 0, "recv");
	REQUIRE(t_post_recv(qp, 102, buf + 4096, MSG, mr->lkey) == 0, "recv");
	t_barrier(p);
	for (int i = 0; i < 3; i++) {
		if (!t_poll_one(r.recv_cq, &wc, T_WAIT_MS, "receive"))
			break;
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 100u + i && wc.byte_len == MSG,
		      "receive %d: %s wr_id %llu len %u", i, ibv_wc_status_str(wc.status),
		      (unsigned long long)wc.wr_id, wc.byte_len);
		if (i == 0)
			CHECK(wc.opcode == IBV_WC_RECV && !(wc.wc_flags & IBV_WC_WITH_IMM), "send");
		if (i == 1)
			CHECK(wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_WITH_IMM) &&
			      ntohl(wc.imm_data) == 0x101, "send with imm");
		if (i == 2)
			CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
			      ntohl(wc.imm_data) == 0x103, "write with imm: opcode %d",
			      wc.opcode);
	}
	CHECK(t_pattern_check(buf, MSG, 1) < 0 && t_pattern_check(buf + MSG, MSG, 2) < 0,
	      "sent data");
	CHECK(t_pattern_check(buf + 8192 + 2 * MSG, MSG, 3) < 0 &&
	      t_pattern_check(buf + 8192 + 3 * MSG, MSG, 4) < 0, "written data");
	t_barrier(p);

	/* The Send that found no receive is gone, not waiting: the next
	 * receive is the one that fits, after those that can't be taken. */
	volatile uint64_t *mark = (volatile uint64_t *)(buf + 32768);
	uint64_t t0 = t_now_ms();
	while (*mark != 0x5eed && t_now_ms() - t0 < T_WAIT_MS)
		t_sleep_ms(1);
	CHECK(*mark == 0x5eed, "the marker behind the dropped Send came");
	memset(buf, 0, MSG);
	REQUIRE(t_post_recv(qp, 200, buf, MSG, mr->lkey) == 0, "recv");
	t_barrier(p);
	CHECK(t_poll_one(r.recv_cq, &wc, T_WAIT_MS, "the send that fits") &&
	      wc.status == IBV_WC_SUCCESS && wc.wr_id == 200 && wc.byte_len == MSG &&
	      wc.opcode == IBV_WC_RECV, "the receive: %s wr_id %llu len %u",
	      ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id, wc.byte_len);
	CHECK(t_pattern_check(buf, MSG, 77) < 0, "it is the last send's data");
	for (int i = 0; i < MSG; i++)
		if (buf[16384 + i]) {
			CHECK(0, "the Writes with a bad rkey wrote at byte %d", i);
			break;
		}
	CHECK(t_cq_drain(r.recv_cq, NULL, 4, 50) == 0, "nothing else completed");
	CHECK(t_qp_state(qp) == IBV_QPS_RTS, "receiver still RTS: %d", t_qp_state(qp));
	t_barrier(p);
	t_res_close(&r);
	free(buf);
}


/* ---- Where no responder is ---- */

/* UC QPs aimed at a QP that does not exist: the first WR waits a while
 * for a way to it, then it and those behind it go into the void and
 * complete (not one per second).  An RC QP aimed at a UC QP gets nowhere:
 * its WR fails. */
static void uc_no_responder(void *arg)
{
	(void)arg;
	struct t_res r;
	open_res(&r);
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp *qp = uc_qp(&r), *other = uc_qp(&r);
	struct t_conn nowhere;
	struct ibv_wc wc;

	r.qp = qp;
	t_conn_local(&r, NULL, &nowhere);
	nowhere.qpn = other->qp_num;
	CHECK(ibv_destroy_qp(other) == 0, "destroy the target");
	REQUIRE(uc_init(qp) == 0 && uc_rtr(&r, qp, &nowhere, 0) == 0 && uc_rts(qp, 1, 0) == 0,
		"connect to nothing");
	uint64_t t0 = t_now_ms();
	for (int i = 0; i < 8; i++)
		REQUIRE(t_post_send(qp, i, IBV_WR_SEND, buf, 64, mr->lkey, IBV_SEND_SIGNALED, 0,
				    0) == 0, "post %d", i);
	for (int i = 0; i < 8; i++)
		CHECK(t_expect_wc(r.send_cq, &wc, i, IBV_WC_SUCCESS, IBV_WC_SEND, "into the void"),
		      "wr %d", i);
	uint64_t ms = t_now_ms() - t0;
	CHECK(ms < 4000, "8 WRs to nowhere took %llu ms", (unsigned long long)ms);
	CHECK(t_qp_state(qp) == IBV_QPS_RTS, "still RTS");
	CHECK(ibv_destroy_qp(qp) == 0, "destroy");

	/* RC to UC: not a pair. */
	struct ibv_qp *uc = uc_qp(&r);
	struct ibv_qp_init_attr ra = { .send_cq = r.send_cq, .recv_cq = r.recv_cq,
				       .cap = { 4, 4, 1, 1, 0 }, .qp_type = IBV_QPT_RC };
	struct ibv_qp *rc = ibv_create_qp(r.pd, &ra);
	REQUIRE(rc, "RC QP");
	struct t_conn to_uc, to_rc;
	r.qp = uc;
	t_conn_local(&r, NULL, &to_uc);
	to_rc = to_uc;
	to_rc.qpn = rc->qp_num;
	REQUIRE(uc_init(uc) == 0 && uc_rtr(&r, uc, &to_rc, 0) == 0 && uc_rts(uc, 1, 0) == 0,
		"UC side");
	REQUIRE(t_post_recv(uc, 50, buf + 1024, 256, mr->lkey) == 0, "UC receive");
	r.qp = rc;
	r.opts.timeout = 8; /* about 1 ms a try */
	r.opts.retry_cnt = 1;
	to_uc.qpn = uc->qp_num;
	REQUIRE(t_modify_init(&r) == 0 && t_modify_rtr(&r, &to_uc) == 0 && t_modify_rts(&r) == 0,
		"RC side");
	REQUIRE(t_post_send(rc, 60, IBV_WR_SEND, buf, 64, mr->lkey, IBV_SEND_SIGNALED, 0, 0) == 0,
		"RC send");
	CHECK(t_poll_one(r.send_cq, &wc, T_WAIT_MS, "the RC send") && wc.wr_id == 60 &&
	      wc.status != IBV_WC_SUCCESS, "an RC send to a UC QP: %s",
	      ibv_wc_status_str(wc.status));
	r.qp = NULL;
	CHECK(ibv_destroy_qp(rc) == 0 && ibv_destroy_qp(uc) == 0, "destroy");
	t_res_close(&r);
	free(buf);
}

/* The receiver's process dies: the sender's UC QP does not learn of it;
 * its WRs complete (into the void) and it stays RTS. */
/* Either side of uc_peer_dies: a connected UC QP and a 4 KiB buffer. */
static struct ibv_qp *dies_side(struct t_peer *p, struct t_res *r, uint8_t **buf,
				struct ibv_mr **mr)
{
	struct t_conn rem;

	open_res(r);
	*buf = t_alloc(4096);
	*mr = t_reg(r, *buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	return uc_connect(p, r, *mr, &rem);
}

static void dead_sender(struct t_peer *p, void *arg)
{
	(void)arg;
	struct t_res r;
	uint8_t *buf;
	struct ibv_mr *mr;
	struct ibv_qp *qp = dies_side(p, &r, &buf, &mr);
	struct ibv_wc wc;

	t_barrier(p);
	t_peer_kill(p);
	for (int i = 0; i < 4; i++) {
		REQUIRE(t_post_send(qp, i, IBV_WR_SEND, buf, 64, mr->lkey, IBV_SEND_SIGNALED, 0,
				    0) == 0, "post %d", i);
		CHECK(t_expect_wc(r.send_cq, &wc, i, IBV_WC_SUCCESS, IBV_WC_SEND, "send"),
		      "wr %d after the peer died", i);
	}
	t_sleep_ms(1500); /* past any loss grace */
	CHECK(t_qp_state(qp) == IBV_QPS_RTS, "still RTS: %d", t_qp_state(qp));
	struct ibv_async_event ev;
	CHECK(!t_fd_readable(r.ctx->async_fd, 0) ||
	      (ibv_get_async_event(r.ctx, &ev) == 0 &&
	       (ibv_ack_async_event(&ev), ev.event_type != IBV_EVENT_QP_FATAL)),
	      "no QP_FATAL");
	t_res_close(&r);
	free(buf);
}

static void dead_receiver(struct t_peer *p, void *arg)
{
	(void)arg;
	struct t_res r;
	uint8_t *buf;
	struct ibv_mr *mr;

	dies_side(p, &r, &buf, &mr);
	t_barrier(p);
	t_sleep_ms(T_WAIT_MS); /* killed */
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_case("uc_rules", uc_rules, NULL);
	t_pair("uc_data_and_drops", pair_sender, pair_receiver, NULL);
	t_case("uc_no_responder", uc_no_responder, NULL);
	t_pair("uc_peer_dies", dead_sender, dead_receiver, NULL);
	return t_finish();
}
