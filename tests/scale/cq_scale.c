// SPDX-License-Identifier: MIT
/*
 * cq_scale: one receive CQ shared by N connected RC QPs, as UCX and MPI
 * use one per worker or process.  A NIC's poll costs the same whatever the
 * QPs behind its CQ; so must ours.  In one process, N pairs of QPs
 * (a[i] receives on the shared CQ, b[i] sends to it), either each a[i]
 * with receives of its own or all of them on one SRQ.  It measures:
 *   empty    ibv_poll_cq of the shared CQ with nothing there (ns), with
 *            1 pair, then with N;
 *   messages a Send over every pair, each taken from the shared CQ and
 *            checked (QP, wr_id, length, data);
 *   through  post a Send on one pair, poll until it is there (ns), 1
 *            pair and N;
 *   arm      ibv_req_notify_cq of the shared CQ (ns), 1 pair and N;
 * and fails if a poll or an arm with N pairs costs more than CQS_RATIO
 * (32) times one with 1, or if a message is lost, doubled or wrong.  The
 * ratio is of two figures of the same run (the lower of 5 rounds each).
 * 4,096 pairs, before and after the CQ kept its SRQs apart and got its
 * bell, and its notify word moved from every QP's block to the CQ's:
 *   SRQ        empty poll 7,500 times dearer -> 1; a message 950 -> 3-4
 *   own rings  empty poll 4,900 -> 1; a message 480 -> 9-10
 *   both       an arm 7,500 times dearer (250 us) -> 1
 * (A message's cost left is the cache, and with rings of their own the
 * QPs that received lately, which the bell keeps looking at: core/bell.c.)
 *
 *   cq_scale N ring|srq [EVENTS]
 * EVENTS: then that many Sends, one at a time, to a receiver thread that
 * takes each as rdma_get_recv_comp does (poll, arm, poll, sleep in
 * ibv_get_cq_event); each must wake it within 5 s.  Their mean time,
 * post to taken, is printed, not judged.
 * Prints "cq_scale: ..." lines; exits 0 when every check held.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DIE(...)                                                              \
	do {                                                                  \
		fprintf(stderr, "cq_scale: " __VA_ARGS__);                    \
		fprintf(stderr, "\n");                                        \
		exit(1);                                                      \
	} while (0)

#define MSG 16 /* bytes per message; a receive buffer per pair */

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static struct ibv_cq *rcq, *pcq;
static struct ibv_srq *srq;
static struct ibv_mr *mr;
static uint8_t *rbuf, *sbuf; /* MSG bytes per pair each */
static struct ibv_qp **a, **b;
static int npairs;

static double now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static void to_rts(struct ibv_qp *q, uint32_t dqpn)
{
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				  .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };

	if (ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				   IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		DIE("INIT failed");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTR;
	at.path_mtu = IBV_MTU_1024;
	at.dest_qp_num = dqpn;
	at.max_dest_rd_atomic = 1;
	at.min_rnr_timer = 1;
	at.ah_attr.is_global = 1;
	at.ah_attr.grh.dgid = gid;
	at.ah_attr.grh.sgid_index = 1; /* (0 is link-local: not over TCP) */
	at.ah_attr.grh.hop_limit = 1;
	at.ah_attr.port_num = 1;
	if (ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC |
				   IBV_QP_MIN_RNR_TIMER))
		DIE("RTR failed");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTS;
	at.timeout = 14;
	at.retry_cnt = 7;
	at.rnr_retry = 7;
	at.max_rd_atomic = 1;
	if (ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_TIMEOUT |
				   IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		DIE("RTS failed");
}

/* A receive into buffer i (pair i's own without an SRQ), wr_id i. */
static void post_recv(int i)
{
	struct ibv_sge s = { (uintptr_t)(rbuf + (size_t)i * MSG), MSG, mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = &s,
				  .num_sge = 1 },
			   *bad;

	if (srq ? ibv_post_srq_recv(srq, &wr, &bad) :
		  ibv_post_recv(a[i], &wr, &bad))
		DIE("post_recv %d failed", i);
}

/* Pairs [from, to): created and connected, a receive posted for each. */
static void add_pairs(int from, int to)
{
	for (int i = from; i < to; i++) {
		struct ibv_qp_init_attr ia = {
			.send_cq = pcq, .recv_cq = rcq, .srq = srq,
			.qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 2, .max_recv_wr = 2,
				 .max_send_sge = 1, .max_recv_sge = 1 },
		};

		a[i] = ibv_create_qp(pd, &ia);
		ia.recv_cq = pcq;
		ia.srq = NULL;
		b[i] = ibv_create_qp(pd, &ia);
		if (!a[i] || !b[i])
			DIE("ibv_create_qp of pair %d failed", i);
		to_rts(a[i], b[i]->qp_num);
		to_rts(b[i], a[i]->qp_num);
		post_recv(i);
	}
	npairs = to;
}

static void post_send(int i)
{
	struct ibv_sge s = { (uintptr_t)(sbuf + (size_t)i * MSG), MSG, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = (uint64_t)i, .sg_list = &s,
				  .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED },
			   *bad;

	memset(sbuf + (size_t)i * MSG, (int)(i * 7 + 1), MSG);
	if (ibv_post_send(b[i], &wr, &bad))
		DIE("post_send %d failed", i);
}

/* Take one completion from cq (10 s at most). */
static void take(struct ibv_cq *cq, struct ibv_wc *wc)
{
	double until = now_ns() + 10e9;
	int n;

	while (!(n = ibv_poll_cq(cq, 1, wc)))
		if (now_ns() > until)
			DIE("no completion in 10 s (%d pairs)", npairs);
	if (n < 0)
		DIE("ibv_poll_cq failed");
	if (wc->status != IBV_WC_SUCCESS)
		DIE("completion %llu: %s", (unsigned long long)wc->wr_id,
		    ibv_wc_status_str(wc->status));
}

/* The pair whose a-side QP is qpn, or -1 (a QP per pair: a linear look
 * is cheap next to what is measured, and only done to check). */
static int pair_of(uint32_t qpn)
{
	for (int i = 0; i < npairs; i++)
		if (a[i]->qp_num == qpn)
			return i;
	return -1;
}

/* A receive completion, checked: it came over a pair (seen[pair] counts),
 * into the buffer its wr_id names (on an SRQ any buffer; else the pair's
 * own), holding what that pair sent.  The buffer's receive is posted
 * again. */
static void check_recv(const struct ibv_wc *wc, uint8_t *seen)
{
	int j = (int)wc->wr_id, i = pair_of(wc->qp_num);

	if (i < 0 || wc->wr_id >= (uint64_t)npairs || (!srq && j != i) ||
	    wc->opcode != IBV_WC_RECV || wc->byte_len != MSG)
		DIE("a receive completion that can't be: wr_id %llu, qp %#x, "
		    "%u bytes", (unsigned long long)wc->wr_id, wc->qp_num,
		    wc->byte_len);
	for (int k = 0; k < MSG; k++)
		if (rbuf[(size_t)j * MSG + k] != (uint8_t)(i * 7 + 1))
			DIE("pair %d: byte %d is %u", i, k,
			    rbuf[(size_t)j * MSG + k]);
	if (seen[i]++)
		DIE("pair %d: a second receive completion", i);
	post_recv(j);
}

/* The lower of 5 rounds of m calls of fn: ns per call. */
static double per_call_ns(void (*fn)(void), int m)
{
	double best = 1e18;

	for (int r = 0; r < 5; r++) {
		double t = now_ns();

		for (int i = 0; i < m; i++)
			fn();
		t = (now_ns() - t) / m;
		if (t < best)
			best = t;
	}
	return best;
}

static void poll_empty(void)
{
	struct ibv_wc wc[16];

	if (ibv_poll_cq(rcq, 16, wc))
		DIE("a completion from nowhere");
}

static void arm(void)
{
	if (ibv_req_notify_cq(rcq, 0))
		DIE("ibv_req_notify_cq failed");
}

/* ns per empty poll of the shared CQ. */
static double empty_poll_ns(void)
{
	return per_call_ns(poll_empty, npairs > 1000 ? 2000 : 20000);
}

static struct ibv_comp_channel *chan;

/* ns per arm of the shared CQ; then a Send fires the event the arms left,
 * taken here, and the CQ is unarmed again. */
static double arm_ns(void)
{
	double ns = per_call_ns(arm, npairs > 1000 ? 200 : 2000);
	uint8_t *seen = calloc((size_t)npairs, 1);
	struct ibv_cq *cq;
	struct ibv_wc wc;
	void *c;

	if (!seen)
		DIE("out of memory");
	post_send(0);
	take(rcq, &wc);
	check_recv(&wc, seen);
	take(pcq, &wc);
	if (ibv_get_cq_event(chan, &cq, &c))
		DIE("ibv_get_cq_event failed");
	ibv_ack_cq_events(cq, 1);
	free(seen);
	return ns;
}

/* The lower of 5 rounds of 200: ns from a Send's post to its receive's
 * completion on the shared CQ, over pairs spread across all of them. */
static double through_ns(void)
{
	uint8_t *seen = calloc((size_t)npairs, 1);
	double best = 1e18;
	struct ibv_wc wc;

	if (!seen)
		DIE("out of memory");
	for (int r = 0; r < 5; r++) {
		double sum = 0;

		for (int k = 0; k < 200; k++) {
			int i = (int)(((uint64_t)(r * 200 + k) * 7919) % (uint64_t)npairs);
			double t = now_ns();

			post_send(i);
			take(rcq, &wc);
			sum += now_ns() - t;
			seen[i] = 0;
			check_recv(&wc, seen);
			take(pcq, &wc);
		}
		if (sum / 200 < best)
			best = sum / 200;
	}
	free(seen);
	return best;
}

/* ---- events: a receiver asleep on its channel, as the urdma API is ---- */

static _Atomic int got; /* messages the receiver took */

/* Take one completion from rcq as rdma_get_recv_comp does: poll, arm,
 * poll, then sleep in ibv_get_cq_event. */
static void *receiver(void *arg)
{
	int m = *(int *)arg;
	uint8_t *seen = calloc((size_t)npairs, 1);
	struct ibv_wc wc;

	if (!seen)
		DIE("out of memory");
	for (int k = 0; k < m; k++) {
		struct ibv_cq *cq;
		void *ctx;
		int r;

		while (!(r = ibv_poll_cq(rcq, 1, &wc))) {
			/* A pause of 0 to a few us: the arm falls at every
			 * point of the sender's delivery in turn (a lost
			 * wake-up hides in a window of some ns). */
			for (volatile int j = (k * 37) % 1500; j > 0; j--)
				;
			if (ibv_req_notify_cq(rcq, 0))
				DIE("ibv_req_notify_cq failed");
			if ((r = ibv_poll_cq(rcq, 1, &wc)))
				break;
			if (ibv_get_cq_event(chan, &cq, &ctx))
				DIE("ibv_get_cq_event failed");
			ibv_ack_cq_events(cq, 1);
		}
		if (r < 0 || wc.status != IBV_WC_SUCCESS)
			DIE("receive %d failed", k);
		seen[pair_of(wc.qp_num)] = 0;
		check_recv(&wc, seen);
		atomic_store(&got, k + 1);
	}
	free(seen);
	return NULL;
}

/* m Sends over pairs spread across all, each waited for (5 s): a
 * receiver that sleeps on a completion already there is a lost wake-up. */
static void events_run(int m)
{
	pthread_t t;
	struct ibv_wc wc;

	if (pthread_create(&t, NULL, receiver, &m))
		DIE("pthread_create failed");
	for (int k = 0; k < m; k++) {
		int i = (int)(((uint64_t)k * 7919) % (uint64_t)npairs);
		double until;

		post_send(i);
		take(pcq, &wc);
		until = now_ns() + 5e9;
		while (atomic_load(&got) <= k) {
			if (now_ns() > until)
				DIE("message %d (pair %d): the receiver asleep on "
				    "its channel was not woken in 5 s", k, i);
			sched_yield();
		}
	}
	pthread_join(t, NULL);
}

int main(int argc, char **argv)
{
	const char *ratio_env = getenv("CQS_RATIO");
	double limit = ratio_env ? atof(ratio_env) : 32;
	struct ibv_device **list;
	double e1, t1, a1, en, tn, an;
	struct ibv_wc wc;
	uint8_t *seen;
	int n;

	if (argc < 3 || argc > 4 || (n = atoi(argv[1])) < 2 ||
	    (strcmp(argv[2], "ring") && strcmp(argv[2], "srq")) ||
	    (argc == 4 && atoi(argv[3]) < 1))
		DIE("usage: cq_scale N ring|srq [EVENTS]");
	list = ibv_get_device_list(NULL);
	if (!list || !list[0] || !(ctx = ibv_open_device(list[0])))
		DIE("no device");
	pd = ibv_alloc_pd(ctx);
	if (!pd || ibv_query_gid(ctx, 1, 1, &gid))
		DIE("no PD or GID");
	chan = ibv_create_comp_channel(ctx);
	rcq = ibv_create_cq(ctx, 2 * n + 16, NULL, chan, 0);
	pcq = ibv_create_cq(ctx, 4 * n + 16, NULL, NULL, 0);
	rbuf = calloc((size_t)n * 2, MSG); /* then the send buffers */
	a = calloc((size_t)n, sizeof(*a));
	b = calloc((size_t)n, sizeof(*b));
	if (!rcq || !pcq || !rbuf || !a || !b)
		DIE("out of memory");
	sbuf = rbuf + (size_t)n * MSG;
	mr = ibv_reg_mr(pd, rbuf, (size_t)n * 2 * MSG, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		DIE("ibv_reg_mr failed");
	if (!strcmp(argv[2], "srq")) {
		struct ibv_srq_init_attr sa = {
			.attr = { .max_wr = (uint32_t)n + 1, .max_sge = 1 }
		};

		srq = ibv_create_srq(pd, &sa);
		if (!srq)
			DIE("ibv_create_srq failed");
	}
	add_pairs(0, 1);
	e1 = empty_poll_ns();
	t1 = through_ns();
	a1 = arm_ns();
	add_pairs(1, n);
	en = empty_poll_ns();
	tn = through_ns();
	an = arm_ns();
	/* A Send over every pair, all posted first: each comes out once. */
	seen = calloc((size_t)n, 1);
	if (!seen)
		DIE("out of memory");
	for (int i = 0; i < n; i++)
		post_send(i);
	for (int i = 0; i < n; i++) {
		take(rcq, &wc);
		check_recv(&wc, seen);
	}
	for (int i = 0; i < n; i++)
		take(pcq, &wc);
	printf("cq_scale: %s, %d pairs: empty poll %.0f ns (1 pair: %.0f, "
	       "ratio %.1f), send to completion %.0f ns (1 pair: %.0f, ratio "
	       "%.1f); %d messages, each taken once\n",
	       argv[2], n, en, e1, en / e1, tn, t1, tn / t1, n);
	if (argc == 4) {
		int m = atoi(argv[3]);
		double t0 = now_ns();

		const char *max_env = getenv("CQS_EVENT_US");
		double us;

		events_run(m);
		us = (now_ns() - t0) / m / 1e3;
		printf("cq_scale: %s, %d pairs: %d Sends to a receiver asleep "
		       "on its channel, %.1f us each\n", argv[2], n, m, us);
		if (max_env && us > atof(max_env))
			DIE("a Send to a receiver asleep on its channel took "
			    "%.0f us on average, more than %s", us, max_env);
	}
	printf("cq_scale: %s, %d pairs: ibv_req_notify_cq %.0f ns (1 pair: "
	       "%.0f, ratio %.1f)\n", argv[2], n, an, a1, an / a1);
	if (en / e1 > limit || tn / t1 > limit || an / a1 > limit)
		DIE("a poll or an arm with %d pairs costs more than %.0f times "
		    "one with 1", n, limit);
	return 0;
}
