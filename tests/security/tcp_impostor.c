/* SPDX-License-Identifier: MIT */
/*
 * tcp_impostor: a process that tries to join someone else's TCP QP.
 *
 *   tcp_impostor victim DGID SECONDS
 *       (over URDMA_TRANSPORT=tcp) create two RC QPs, A and B (B only owns
 *       a number of this process's listener).  Move A to RTR towards QP B
 *       at DGID (an IPv6 or IPv4 address; "lid" for LID addressing, the
 *       peer then on this host), post a receive, print
 *       "A_QPN B_QPN" and wait SECONDS for anything to arrive.
 *       Exit 0 if nothing did, 3 if a receive completed (injected data).
 *   tcp_impostor join A_QPN CLAIM_QPN
 *       connect to 127.0.0.1 at A's listening port, send an MPA Request
 *       that claims to be QP CLAIM_QPN, then (if accepted) a Send with
 *       "injected" in it.  Exit 0 if refused, 3 if accepted.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "iwarp_frames.h"

static int victim(const char *dgid, int seconds)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *c = l && l[0] ? ibv_open_device(l[0]) : NULL;
	struct ibv_pd *pd = c ? ibv_alloc_pd(c) : NULL;
	struct ibv_cq *cq = pd ? ibv_create_cq(c, 8, NULL, NULL, 0) : NULL;
	struct ibv_qp_init_attr ia = { .qp_type = IBV_QPT_RC,
				       .cap = { 4, 4, 1, 1, 0 } };
	struct ibv_qp *a, *b;
	struct ibv_port_attr pa;
	static char buf[4096];
	struct ibv_mr *mr;
	struct ibv_qp_attr at;
	struct ibv_sge sge;
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	struct ibv_wc wc;
	time_t end;

	if (!cq)
		return 2;
	ia.send_cq = ia.recv_cq = cq;
	/* B first: its number is the lower, so A waits for B to connect. */
	b = ibv_create_qp(pd, &ia);
	a = ibv_create_qp(pd, &ia);
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!a || !b || !mr || ibv_query_port(c, 1, &pa))
		return 2;
	at = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .port_num = 1,
				   .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	if (ibv_modify_qp(a, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				     IBV_QP_ACCESS_FLAGS))
		return 2;
	at = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
				   .dest_qp_num = b->qp_num, .max_dest_rd_atomic = 1,
				   .min_rnr_timer = 12,
				   .ah_attr = { .dlid = pa.lid, .port_num = 1 } };
	if (strcmp(dgid, "lid")) {
		struct in6_addr g6;
		struct in_addr g4;

		at.ah_attr.is_global = 1;
		at.ah_attr.grh.sgid_index = 1;
		if (inet_pton(AF_INET, dgid, &g4) == 1) {
			at.ah_attr.grh.dgid.raw[10] = at.ah_attr.grh.dgid.raw[11] = 0xff;
			memcpy(&at.ah_attr.grh.dgid.raw[12], &g4, 4);
		} else if (inet_pton(AF_INET6, dgid, &g6) == 1) {
			memcpy(at.ah_attr.grh.dgid.raw, &g6, 16);
		} else {
			return 2;
		}
	}
	if (ibv_modify_qp(a, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return 2;
	sge = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = sizeof(buf),
				.lkey = mr->lkey };
	if (ibv_post_recv(a, &rw, &bad))
		return 2;
	printf("%u %u\n", a->qp_num, b->qp_num);
	fflush(stdout);
	end = time(NULL) + seconds;
	while (time(NULL) < end) {
		if (ibv_poll_cq(cq, 1, &wc) == 1) {
			printf("received: status %d, %u bytes: %.20s\n", wc.status,
			       wc.byte_len, buf);
			return wc.status == IBV_WC_SUCCESS ? 3 : 0;
		}
		usleep(1000);
	}
	return 0;
}

static int join(uint32_t a_qpn, uint32_t claim)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(a_qpn >> 8),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct {
		struct mpa_frame f;
		struct urdma_mpa_pd pd;
	} __attribute__((packed)) req = { 0 }, rep;
	uint8_t hdr[64], frame[128];
	const char pl[] = "injected-by-impostor";
	struct pollfd pf;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	size_t got = 0;

	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		return 2;
	memcpy(req.f.key, MPA_KEY_REQ, MPA_KEY_LEN);
	req.f.rev = MPA_REVISION;
	req.f.pd_len = htons(sizeof(req.pd));
	req.pd.magic = htonl(URDMA_MPA_MAGIC);
	req.pd.version = htonl(URDMA_MPA_VERSION);
	req.pd.src_qpn = htonl(claim);
	req.pd.dst_qpn = htonl(a_qpn);
	req.pd.ird = req.pd.ord = htonl(1);
	if (write(fd, &req, sizeof(req)) != sizeof(req))
		return 2;
	pf = (struct pollfd){ .fd = fd, .events = POLLIN };
	while (got < sizeof(rep) && poll(&pf, 1, 5000) == 1) {
		ssize_t n = read(fd, (char *)&rep + got, sizeof(rep) - got);

		if (n <= 0)
			break;
		got += n;
	}
	if (got < sizeof(rep) || (rep.f.flags & MPA_FLAG_R)) {
		printf("refused\n");
		return 0;
	}
	/* Accepted: inject a Send (no CRC was asked for). */
	uint32_t hl = iwf_untagged(hdr, RDMAP_SEND, true, DDP_QN_SEND, 0, 0);
	uint32_t fl = iwf_fpdu(frame, hl + sizeof(pl), rep.f.flags & MPA_FLAG_C,
			       false, hdr, hl, (const uint8_t *)pl, sizeof(pl));
	if (write(fd, frame, fl) != (ssize_t)fl)
		return 2;
	sleep(1);
	printf("accepted\n");
	return 3;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "victim"))
		return victim(argv[2], atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "join"))
		return join(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0));
	fprintf(stderr, "usage: tcp_impostor victim DGID|lid SECONDS | join A_QPN CLAIM_QPN\n");
	return 2;
}
