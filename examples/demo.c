// SPDX-License-Identifier: MIT
/*
 * urdma demo: the verbs steps, between two processes on one host.
 *
 *   open the device -> PD -> MR -> CQ -> QP -> exchange QPN/rkey/address
 *   -> INIT/RTR/RTS -> SEND/RECV -> RDMA WRITE -> RDMA READ -> atomic
 *   -> teardown
 *
 * The parent is the "client" that drives every operation; the child is the
 * "server" that posts one receive and otherwise only sleeps: the one-sided
 * operations reach its memory without it doing anything.
 */
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define BUF 4096

struct peer_info {
	uint32_t qpn;
	uint16_t lid;
	uint32_t rkey;
	uint64_t addr;
};

struct side {
	const char *name;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char *buf;
};

#define die(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

static void setup(struct side *s)
{
	struct ibv_device **list = ibv_get_device_list(NULL);

	if (!list || !list[0])
		die("%s: no RDMA device", s->name);
	s->ctx = ibv_open_device(list[0]);
	if (!s->ctx)
		die("%s: ibv_open_device failed", s->name);
	printf("[%s] opened %s\n", s->name, ibv_get_device_name(list[0]));
	ibv_free_device_list(list);
	s->pd = ibv_alloc_pd(s->ctx);
	s->buf = aligned_alloc(4096, BUF);
	memset(s->buf, 0, BUF);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUF,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	s->qp = ibv_create_qp(s->pd, &ia);
	if (!s->pd || !s->mr || !s->cq || !s->qp)
		die("%s: creating PD/MR/CQ/QP failed", s->name);
	printf("[%s] PD, MR (lkey %#x rkey %#x), CQ and QP %#x created\n",
	       s->name, s->mr->lkey, s->mr->rkey, s->qp->qp_num);
}

static void connect_qp(struct side *s, const struct peer_info *r)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC };

	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				     IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("%s: INIT failed", s->name);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = r->qpn;
	a.ah_attr.dlid = r->lid;
	a.ah_attr.port_num = 1;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				     IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER))
		die("%s: RTR failed", s->name);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
				     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("%s: RTS failed", s->name);
	printf("[%s] QP %#x connected to QP %#x (RESET->INIT->RTR->RTS)\n",
	       s->name, s->qp->qp_num, r->qpn);
}

static struct ibv_wc wait_wc(struct side *s)
{
	struct ibv_wc wc;
	int n;

	while ((n = ibv_poll_cq(s->cq, 1, &wc)) == 0)
		;
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		die("%s: completion failed: %s", s->name,
		    ibv_wc_status_str(wc.status));
	return wc;
}

static void post(struct side *s, enum ibv_wr_opcode op, uint32_t off,
		 uint32_t len, const struct peer_info *r, uint64_t roff)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + off, .length = len,
			       .lkey = s->mr->lkey };
	struct ibv_send_wr wr = { .opcode = op, .sg_list = &sge, .num_sge = 1,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = r->addr + roff;
		wr.wr.atomic.rkey = r->rkey;
		wr.wr.atomic.compare_add = 5;
	} else if (r) {
		wr.wr.rdma.remote_addr = r->addr + roff;
		wr.wr.rdma.rkey = r->rkey;
	}
	if (ibv_post_send(s->qp, &wr, &bad))
		die("%s: ibv_post_send failed", s->name);
	wait_wc(s);
}

static void teardown(struct side *s)
{
	ibv_destroy_qp(s->qp);
	ibv_destroy_cq(s->cq);
	ibv_dereg_mr(s->mr);
	ibv_dealloc_pd(s->pd);
	ibv_close_device(s->ctx);
	free(s->buf);
	printf("[%s] torn down\n", s->name);
}

static void xfer(int fd, void *out, void *in, size_t len)
{
	if (write(fd, out, len) != (ssize_t)len || read(fd, in, len) != (ssize_t)len)
		die("exchange failed");
}

int main(void)
{
	int sv[2];
	struct side s = { 0 };
	struct peer_info me, peer;
	char go;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		die("socketpair");
	pid_t pid = fork();
	s.name = pid ? "client" : "server";
	int fd = pid ? sv[0] : sv[1];

	setup(&s);
	struct ibv_port_attr port;
	ibv_query_port(s.ctx, 1, &port);
	me = (struct peer_info){ s.qp->qp_num, port.lid, s.mr->rkey,
				 (uintptr_t)s.buf };
	xfer(fd, &me, &peer, sizeof(me)); /* out of band, like ibv_rc_pingpong */
	connect_qp(&s, &peer);

	if (!pid) { /* server */
		struct ibv_sge sge = { (uintptr_t)s.buf, 64, s.mr->lkey };
		struct ibv_recv_wr rwr = { .sg_list = &sge, .num_sge = 1 }, *bad;

		ibv_post_recv(s.qp, &rwr, &bad);
		xfer(fd, "r", &go, 1);
		struct ibv_wc wc = wait_wc(&s);
		printf("[server] received %u bytes: \"%s\"\n", wc.byte_len, s.buf);
		/* From here on the server does nothing while the client
		 * writes, reads and adds into its memory. */
		xfer(fd, "s", &go, 1);
		printf("[server] after the client's one-sided operations: "
		       "buf+256 = \"%s\", counter = %" PRIu64 "\n",
		       s.buf + 256, *(uint64_t *)(s.buf + 512));
		teardown(&s);
		return 0;
	}
	xfer(fd, "c", &go, 1); /* the server's receive is posted */
	strcpy(s.buf, "hello over SEND");
	post(&s, IBV_WR_SEND, 0, 16, NULL, 0);
	printf("[client] SEND completed\n");
	strcpy(s.buf + 1024, "written by RDMA WRITE");
	post(&s, IBV_WR_RDMA_WRITE, 1024, 22, &peer, 256);
	printf("[client] RDMA WRITE of 22 bytes to the server completed\n");
	post(&s, IBV_WR_RDMA_READ, 2048, 22, &peer, 256);
	printf("[client] RDMA READ brought back \"%s\"\n", s.buf + 2048);
	*(uint64_t *)(s.buf + 3072) = 0;
	post(&s, IBV_WR_ATOMIC_FETCH_AND_ADD, 3072, 8, &peer, 512);
	post(&s, IBV_WR_ATOMIC_FETCH_AND_ADD, 3072, 8, &peer, 512);
	printf("[client] two FETCH_AND_ADD(5): the second returned %" PRIu64 "\n",
	       *(uint64_t *)(s.buf + 3072));
	xfer(fd, "d", &go, 1);
	int status;
	bool read_ok = strcmp(s.buf + 2048, "written by RDMA WRITE") == 0;
	bool add_ok = *(uint64_t *)(s.buf + 3072) == 5;

	waitpid(pid, &status, 0);
	teardown(&s);
	if (!WIFEXITED(status) || WEXITSTATUS(status) || !read_ok || !add_ok) {
		printf("demo FAILED\n");
		return 1;
	}
	printf("demo OK\n");
	return 0;
}
