// SPDX-License-Identifier: MIT
/*
 * Fuzz target for UD datagrams from the network (issue 21): what hostile
 * UDP datagrams make the UD receive path (transport/udp/) do.
 *
 * Each input runs against a real urdma UD QP: the target sends the input's
 * datagrams to the QP's UDP port from a plain socket, then a well-formed
 * datagram to a second QP of the same process (the same socket, read in
 * order), whose completion says every datagram before it was dealt with.
 * The QP has four receives of 40 + 64 bytes posted in a registered page
 * between guard pages, one of them with an SGE of a key that does not
 * exist.  Afterwards, whatever the datagrams were:
 *  - nothing changed outside the receive buffers (the guards and the rest
 *    of the page keep their pattern);
 *  - every completion is believable: a successful receive is at most its
 *    buffer long, from the QP it says;
 *  - the QP is in RTS or ERR (a receive with a bad key), the process alive
 *    (ASan: no access outside any buffer).
 *
 * Input: records {len (2 bytes), flags (1)} each followed by len bytes,
 * a datagram each.  Flag bit 0: the target fixes the datagram up first
 * (its destination QPN, the Q_Key, the CRC), so the input reaches past the
 * checks it would otherwise fail); bit 1: its SrcQP names a QP of the
 * port it is sent from (else it is dropped as a forged source).  Built two ways: with libFuzzer
 * (`make fuzz`), or with -DURDMA_FUZZ_MAIN (ctest fuzz_ud_replay): a main()
 * that runs a bounded number of inputs made from a fixed seed.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "fuzz.h"
#include "roce_frames.h"

#define PG 4096
#define PAT 0x5a
#define QKEY 0x11111111u
#define RECV_LEN (40 + 64)
#define NRECV 4

static struct {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	uint8_t *mem; /* guard, receives, guard */
	struct ibv_mr *mr;
	struct ibv_qp *qp, *marker;
	struct ibv_ah *ah;
	int fd;
	uint16_t port; /* of fd: our datagrams name QPs port << 8 | i */
	bool up;
} G;

static long n_ok, n_err_wc, n_qp_err;

static struct ibv_qp *ud_qp(void)
{
	struct ibv_qp_init_attr a = {
		.send_cq = G.cq, .recv_cq = G.cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 4, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 2 },
	};
	struct ibv_qp *qp = ibv_create_qp(G.pd, &a);
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };

	FUZZ_ASSERT(qp, "create_qp");
	FUZZ_ASSERT(!ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					       IBV_QP_QKEY), "INIT");
	m.qp_state = IBV_QPS_RTR;
	FUZZ_ASSERT(!ibv_modify_qp(qp, &m, IBV_QP_STATE), "RTR");
	m.qp_state = IBV_QPS_RTS;
	m.sq_psn = 1;
	FUZZ_ASSERT(!ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_SQ_PSN), "RTS");
	return qp;
}

static void setup(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_port_attr pa;
	struct ibv_ah_attr aa = { .port_num = 1 };

	FUZZ_ASSERT(l && l[0], "no device");
	G.ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	FUZZ_ASSERT(G.ctx, "open");
	G.pd = ibv_alloc_pd(G.ctx);
	G.cq = ibv_create_cq(G.ctx, 256, NULL, NULL, 0);
	G.mem = mmap(NULL, 3 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	FUZZ_ASSERT(G.pd && G.cq && G.mem != MAP_FAILED, "resources");
	G.mr = ibv_reg_mr(G.pd, G.mem, 3 * PG, IBV_ACCESS_LOCAL_WRITE);
	FUZZ_ASSERT(G.mr, "reg_mr");
	G.marker = ud_qp();
	FUZZ_ASSERT(!ibv_query_port(G.ctx, 1, &pa), "port");
	aa.dlid = pa.lid;
	G.ah = ibv_create_ah(G.pd, &aa);
	G.fd = rf_socket(&G.port);
	FUZZ_ASSERT(G.ah && G.fd >= 0, "ah, socket");
	G.up = true;
}

static void post_recv(struct ibv_qp *qp, uint64_t id, uint8_t *buf, uint32_t lkey)
{
	struct ibv_sge sge[2] = { { (uintptr_t)buf, RECV_LEN / 2, G.mr->lkey },
				  { (uintptr_t)buf + RECV_LEN / 2, RECV_LEN / 2, lkey } };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = sge, .num_sge = 2 }, *bad;

	FUZZ_ASSERT(!ibv_post_recv(qp, &wr, &bad), "post_recv");
}

static void send_to(uint32_t qpn, const uint8_t *p, size_t n)
{
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons((uint16_t)(qpn >> 8)),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

	(void)sendto(G.fd, p, n, 0, (struct sockaddr *)&to, sizeof(to));
}

static void check_memory(void)
{
	uint8_t *rx = G.mem + PG;

	for (size_t i = 0; i < PG; i++)
		FUZZ_ASSERT(G.mem[i] == PAT && G.mem[2 * PG + i] == PAT, "guard byte %zu", i);
	for (size_t i = NRECV * RECV_LEN; i < PG; i++)
		FUZZ_ASSERT(rx[i] == PAT, "page byte %zu past the receives", i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t dg[8192];
	static const char mark[] = "marker..";
	uint8_t mpkt[40];
	struct ibv_wc wc[16];
	bool marked = false;
	size_t off = 0;

	if (!G.up)
		setup();
	memset(G.mem, PAT, 3 * PG);
	G.qp = ud_qp();
	for (int i = 0; i < NRECV; i++)
		post_recv(G.qp, i, G.mem + PG + i * RECV_LEN, i == 2 ? 0xdead : G.mr->lkey);
	post_recv(G.marker, 100, G.mem + PG + NRECV * RECV_LEN + 64, G.mr->lkey);
	/* (the marker's buffer is in the page: checked apart) */

	while (off + 3 <= size) {
		size_t len = (size_t)data[off] | (size_t)data[off + 1] << 8;
		uint8_t flags = data[off + 2];

		off += 3;
		if (len > size - off)
			len = size - off;
		if (len > sizeof(dg))
			len = sizeof(dg);
		memcpy(dg, data + off, len);
		off += len;
		if ((flags & 2) && len >= ROCE_BTH + ROCE_DETH) {
			/* a SrcQP of our port (else dropped at once) */
			dg[16] = 0;
			dg[17] = (uint8_t)(G.port >> 8);
			dg[18] = (uint8_t)G.port;
		}
		if (flags & 1)
			rf_fix(dg, len, G.qp->qp_num, QKEY, true);
		send_to(G.qp->qp_num, dg, len);
	}
	/* The marker: a good datagram to the other QP, read after them. */
	send_to(G.marker->qp_num, mpkt,
		rf_ud_send(mpkt, G.marker->qp_num, QKEY, (uint32_t)G.port << 8 | 1, mark, 8,
			   true));
	for (int spins = 0; spins < 200000 && !marked; spins++) {
		int n = ibv_poll_cq(G.cq, 16, wc);

		FUZZ_ASSERT(n >= 0, "poll_cq");
		for (int i = 0; i < n; i++) {
			if (wc[i].qp_num == G.marker->qp_num) {
				marked = true;
				continue;
			}
			FUZZ_ASSERT(wc[i].qp_num == G.qp->qp_num, "a completion for qp %#x",
				    wc[i].qp_num);
			if (wc[i].status == IBV_WC_SUCCESS) {
				FUZZ_ASSERT(wc[i].opcode == IBV_WC_RECV &&
						    wc[i].byte_len <= RECV_LEN &&
						    wc[i].byte_len >= 40 && wc[i].wr_id < NRECV,
					    "receive %llu: len %u", (unsigned long long)wc[i].wr_id,
					    wc[i].byte_len);
				n_ok++;
			} else {
				n_err_wc++;
			}
		}
		if (!marked && spins > 1000)
			usleep(10);
	}
	FUZZ_ASSERT(marked, "the marker never came");
	/* The marker's 40 + 8 bytes are where it was posted; the rest of
	 * the page stays as it was. */
	memset(G.mem + PG + NRECV * RECV_LEN + 64, PAT, 48);
	check_memory();
	{
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;

		FUZZ_ASSERT(!ibv_query_qp(G.qp, &a, IBV_QP_STATE, &ia), "query");
		FUZZ_ASSERT(a.qp_state == IBV_QPS_RTS || a.qp_state == IBV_QPS_ERR, "state %d",
			    a.qp_state);
		n_qp_err += a.qp_state == IBV_QPS_ERR;
	}
	FUZZ_ASSERT(!ibv_destroy_qp(G.qp), "destroy_qp");
	while (ibv_poll_cq(G.cq, 16, wc) > 0)
		;
	return 0;
}

#ifdef URDMA_FUZZ_MAIN
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next(void)
{
	return (uint32_t)fuzz_xorshift(&rng);
}

/* A datagram near a valid one: right headers, mutated a little, or not. */
static size_t make(uint8_t *p, size_t room)
{
	size_t plen = next() % 4 ? next() % 80 : next() % 4200, n;

	if (20 + plen + 8 > room)
		plen = room - 28;
	memset(p, 0, 24);
	p[0] = next() % 4 ? 0x64 + next() % 2 : (uint8_t)next();
	p[1] = next() % 4 ? (uint8_t)((next() % 4) << 4) : (uint8_t)next();
	p[2] = p[3] = 0xff;
	for (size_t i = 20; i < 20 + plen; i++)
		p[i] = (uint8_t)next();
	n = 20 + (p[0] == 0x65 ? 4 : 0) + plen + 4;
	for (int k = next() % 3; k > 0; k--)
		p[next() % n] ^= (uint8_t)(1u << (next() % 8));
	if (next() % 8 == 0)
		n = next() % n;
	return n;
}

int main(int argc, char **argv)
{
	static uint8_t in[16384];
	long iters = argc > 1 ? strtol(argv[1], NULL, 0) : 200;

	for (long i = 0; i < iters; i++) {
		size_t len = 0;

		for (int k = next() % 6 + 1; k > 0 && len + 3 + 4300 < sizeof(in); k--) {
			size_t n = make(in + len + 3, 4300);

			in[len] = (uint8_t)n;
			in[len + 1] = (uint8_t)(n >> 8);
			/* mostly a right CRC and a SrcQP of our port */
			in[len + 2] = next() % 4 ? 3 : (uint8_t)(next() % 4);
			len += 3 + n;
		}
		LLVMFuzzerTestOneInput(in, len);
	}
	printf("fuzz_ud: %ld inputs: %ld datagrams received, %ld receives in error; "
	       "%ld inputs ended in ERR\n", iters, n_ok, n_err_wc, n_qp_err);
	return 0;
}
#endif
