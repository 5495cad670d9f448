/* SPDX-License-Identifier: MIT */
/*
 * Conformance: a CQ fed by several sources gives each its turn.  The verbs
 * define no order between the completions of different queues, but none
 * may wait for ever while another keeps the CQ full: not the receives of
 * a QP behind the send completions of a sender that posts as it polls
 * (qperf's uc_bi_bw and ud_bi_bw got no receive at all), and not one
 * receive QP behind another whose sender is faster than the poller.
 *
 * The parent polls; the child sends to it.
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#define BUF 4096
#define POLL_N 16   /* completions asked for per poll */
#define IN_FLIGHT 64 /* Writes kept posted by the sender that polls */
#define TURNS 4     /* polls within which the waiting source must be served */
#define RECV_ID 1000

static struct t_opts opts(void)
{
	struct t_opts o = t_opts_default();

	o.cq_size = 1024;
	o.max_send_wr = 256;
	o.max_recv_wr = 128;
	return o;
}

/* ---- Receives among a flood of send completions ---- */

static void flood_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = opts();
	struct t_res r;
	struct t_conn remote;
	struct ibv_wc wc[POLL_N];
	uint64_t next = 0, done = 0;
	int found = -1;

	t_res_open(&r, &o);
	char *buf = t_alloc(BUF);
	struct ibv_mr *mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(t_modify_init(&r) == 0, "INIT");
	REQUIRE(t_post_recv(r.qp, RECV_ID, buf, 64, mr->lkey) == 0, "post_recv");
	t_connect_pair(p, &r, mr, &remote);
	/* Writes whose completions fill every poll (over shared memory a
	 * Write completes as it is posted). */
	for (; next < IN_FLIGHT; next++)
		REQUIRE(t_post_send(r.qp, next, IBV_WR_RDMA_WRITE, buf + 64, 8, mr->lkey,
				    IBV_SEND_SIGNALED, remote.addr, remote.rkey) == 0,
			"Write %llu", (unsigned long long)next);
	t_barrier(p); /* the child sends its message now */
	t_barrier(p); /* and it has completed there: it is in our ring */
	for (int turn = 0; turn < TURNS && found < 0; turn++) {
		uint64_t t0 = t_now_ms();
		int n = 0;

		/* (over TCP the Writes complete as their answers come) */
		while (!n && t_now_ms() - t0 < T_WAIT_MS)
			n = ibv_poll_cq(r.send_cq, POLL_N, wc);
		REQUIRE(n > 0, "poll %d: %d", turn, n);
		for (int i = 0; i < n; i++) {
			if (wc[i].wr_id == RECV_ID) {
				CHECK(wc[i].status == IBV_WC_SUCCESS &&
					      wc[i].opcode == IBV_WC_RECV && wc[i].byte_len == 8,
				      "the receive: %s opcode %d byte_len %u",
				      t_wc_status_str(wc[i].status), wc[i].opcode,
				      wc[i].byte_len);
				found = turn;
				continue;
			}
			CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RDMA_WRITE,
			      "Write %llu: %s", (unsigned long long)wc[i].wr_id,
			      t_wc_status_str(wc[i].status));
			done++;
			/* one more for each taken: the ring stays as full */
			REQUIRE(t_post_send(r.qp, next, IBV_WR_RDMA_WRITE, buf + 64, 8,
					    mr->lkey, IBV_SEND_SIGNALED, remote.addr,
					    remote.rkey) == 0,
				"Write %llu", (unsigned long long)next);
			next++;
		}
	}
	CHECK(found >= 0,
	      "the receive did not come out of %d polls of %d, each filled by "
	      "Writes' completions", TURNS, POLL_N);
	/* the Writes still posted */
	while (done < next) {
		int n = t_poll(r.send_cq, wc, (int)(next - done < POLL_N ? next - done : POLL_N),
			       T_WAIT_MS);

		REQUIRE(n > 0, "%llu Writes did not complete",
			(unsigned long long)(next - done));
		for (int i = 0; i < n; i++)
			CHECK(wc[i].wr_id != RECV_ID || found < 0, "a second receive");
		done += (uint64_t)n;
	}
	t_barrier(p);
	t_res_close(&r);
	free(buf);
}

static void flood_child(struct t_peer *p, void *arg)
{
	struct t_opts o = opts();
	struct t_res r;

	t_res_open(&r, &o);
	char *buf = t_alloc(BUF);
	struct ibv_mr *mr = t_reg(&r, buf, BUF,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	t_connect_pair(p, &r, mr, NULL);
	t_barrier(p);
	REQUIRE(t_post_send(r.qp, 1, IBV_WR_SEND, buf, 8, mr->lkey, IBV_SEND_SIGNALED, 0,
			    0) == 0, "post_send");
	t_expect_wc(r.send_cq, NULL, 1, IBV_WC_SUCCESS, IBV_WC_SEND, "the Send");
	t_barrier(p);
	t_barrier(p);
	t_res_close(&r);
	free(buf);
}

/* ---- One receive QP among another's many completions ---- */

/* A second RC QP of r, on its CQs, as a t_res of its own to connect
 * (closed by destroying its QP alone). */
static struct t_res second_qp(struct t_res *r)
{
	struct t_res b = *r;
	struct ibv_qp_init_attr ia = {
		.send_cq = r->send_cq,
		.recv_cq = r->recv_cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = r->opts.max_send_wr,
			 .max_recv_wr = r->opts.max_recv_wr,
			 .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};

	b.qp = ibv_create_qp(r->pd, &ia);
	REQUIRE(b.qp, "the second QP");
	memset(b.mrs, 0, sizeof(b.mrs));
	return b;
}

#define BUSY_MSGS 64

static void two_qps_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = opts();
	struct t_res r, b;
	struct ibv_wc wc[POLL_N];
	int found = -1, busy = 0;

	t_res_open(&r, &o);
	b = second_qp(&r);
	char *buf = t_alloc(BUF);
	struct ibv_mr *mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(t_modify_init(&r) == 0 && t_modify_init(&b) == 0, "INIT");
	/* The first QP on the CQ is the busy one: it is taken first. */
	for (int i = 0; i < BUSY_MSGS; i++)
		REQUIRE(t_post_recv(r.qp, (uint64_t)i, buf, 64, mr->lkey) == 0, "post_recv");
	REQUIRE(t_post_recv(b.qp, RECV_ID, buf + 64, 64, mr->lkey) == 0, "post_recv");
	t_connect_pair(p, &r, mr, NULL);
	t_connect_pair(p, &b, mr, NULL);
	t_barrier(p); /* every message is in our rings */
	for (int turn = 0; turn < TURNS && found < 0; turn++) {
		int n = t_poll(r.recv_cq, wc, POLL_N, T_WAIT_MS);

		REQUIRE(n > 0, "poll %d: %d", turn, n);
		for (int i = 0; i < n; i++) {
			CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RECV,
			      "receive %llu: %s", (unsigned long long)wc[i].wr_id,
			      t_wc_status_str(wc[i].status));
			if (wc[i].wr_id == RECV_ID) {
				CHECK(wc[i].qp_num == b.qp->qp_num, "the second QP's receive "
				      "on QP %#x", wc[i].qp_num);
				found = turn;
				continue;
			}
			CHECK(wc[i].wr_id == (uint64_t)busy && wc[i].qp_num == r.qp->qp_num,
			      "the first QP's receive %d: wr_id %llu on QP %#x", busy,
			      (unsigned long long)wc[i].wr_id, wc[i].qp_num);
			busy++;
		}
	}
	CHECK(found >= 0,
	      "the second QP's receive did not come out of %d polls of %d, each "
	      "filled by the first QP's", TURNS, POLL_N);
	while (busy < BUSY_MSGS) {
		int n = t_poll(r.recv_cq, wc, BUSY_MSGS - busy < POLL_N ? BUSY_MSGS - busy : POLL_N,
			       T_WAIT_MS);

		if (!CHECK(n > 0, "%d of the first QP's %d receives", busy, BUSY_MSGS))
			break;
		busy += n;
	}
	t_barrier(p);
	REQUIRE(ibv_destroy_qp(b.qp) == 0, "destroying the second QP");
	t_res_close(&r);
	free(buf);
}

static void two_qps_child(struct t_peer *p, void *arg)
{
	struct t_opts o = opts();
	struct t_res r, b;
	struct ibv_wc wc[POLL_N];

	t_res_open(&r, &o);
	b = second_qp(&r);
	char *buf = t_alloc(BUF);
	struct ibv_mr *mr = t_reg(&r, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	t_connect_pair(p, &r, mr, NULL);
	t_connect_pair(p, &b, mr, NULL);
	/* the busy QP's messages arrive first */
	for (int i = 0; i < BUSY_MSGS; i++)
		REQUIRE(t_post_send(r.qp, (uint64_t)i, IBV_WR_SEND, buf, 8, mr->lkey,
				    IBV_SEND_SIGNALED, 0, 0) == 0, "post_send %d", i);
	for (int sent = 0; sent < BUSY_MSGS;) {
		int n = t_poll(r.send_cq, wc, POLL_N, T_WAIT_MS);

		REQUIRE(n > 0, "%d of the first QP's Sends completed", sent);
		for (int i = 0; i < n; i++)
			CHECK(wc[i].status == IBV_WC_SUCCESS, "Send %llu: %s",
			      (unsigned long long)wc[i].wr_id, t_wc_status_str(wc[i].status));
		sent += n;
	}
	REQUIRE(t_post_send(b.qp, RECV_ID, IBV_WR_SEND, buf, 8, mr->lkey, IBV_SEND_SIGNALED,
			    0, 0) == 0, "post_send");
	t_expect_wc(r.send_cq, NULL, RECV_ID, IBV_WC_SUCCESS, IBV_WC_SEND, "the Send");
	t_barrier(p);
	t_barrier(p);
	REQUIRE(ibv_destroy_qp(b.qp) == 0, "destroying the second QP");
	t_res_close(&r);
	free(buf);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_pair_and_tcp("recv_among_send_flood", flood_parent, flood_child, NULL);
	t_pair_and_tcp("recv_qp_among_busy_qp", two_qps_parent, two_qps_child, NULL);
	return t_finish();
}
