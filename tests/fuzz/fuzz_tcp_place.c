// SPDX-License-Identifier: MIT
/*
 * Fuzz target for the TCP transport's placement (issue 17): what a hostile
 * peer's well-framed messages make the receive path do with STags, offsets
 * and lengths.  The iWARP parser has its own target (fuzz_iwarp_parse.c);
 * here the frames are built right (lengths, CRC) from fuzzed records, so
 * the input reaches the STag lookup, the receive-WR spans, Read Response
 * placement, Read and atomic requests and immediate data.
 *
 * Each input runs against a real urdma QP over TCP (URDMA_TRANSPORT=tcp):
 * the target plays the peer on a plain socket (MPA by hand), the real QP
 * has two receives posted and one RDMA Read outstanding, and four regions
 * registered in one backed area: A (remote write, read, atomic), B (remote
 * read only), S (the Read's sink, 256 bytes used) and R (the receives, 128
 * bytes each); the pages between them are backed too, registered without
 * remote access.  Afterwards, whatever the records were:
 *  - nothing changed outside A, the first 256 bytes of S and the two
 *    receive buffers (guard pages, B, the rest of S and R keep their
 *    pattern), as the library writes through the same memory;
 *  - the QP is in RTS or ERR, and the process is alive (ASan: no access
 *    outside any buffer).
 *
 * Input: records of 16 bytes {kind, flags, region, plen, to, extra, stag},
 * each followed by plen payload bytes.  Built two ways: with libFuzzer
 * (`make fuzz`), or with -DURDMA_FUZZ_MAIN (ctest fuzz_tcp_place_replay):
 * a main() that runs a bounded number of inputs made from a fixed seed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "iwarp_frames.h"
#include "fuzz.h"

#define PG 4096
#define NPAGE 9 /* guard A guard B guard S guard R guard */
#define PAT 0x5a
#define SINK_LEN 256
#define RECV_LEN 128

enum { REG_A = 1, REG_B = 3, REG_S = 5, REG_R = 7 }; /* page numbers */

static struct {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	uint8_t *mem;
	struct ibv_mr *all, *mr[NPAGE];
	bool up;
} G;

static uint8_t *page(int i)
{
	return G.mem + (size_t)i * PG;
}

static void setup(void)
{
	struct ibv_device **l;
	const unsigned rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

	if (G.up)
		return;
	setenv("URDMA_TRANSPORT", "tcp", 1);
	if (!getenv("URDMA_LOG_LEVEL"))
		setenv("URDMA_LOG_FILE", "/dev/null", 1);
	l = ibv_get_device_list(NULL);
	FUZZ_ASSERT(l && l[0], "no device");
	G.ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	G.pd = G.ctx ? ibv_alloc_pd(G.ctx) : NULL;
	G.cq = G.pd ? ibv_create_cq(G.ctx, 64, NULL, NULL, 0) : NULL;
	FUZZ_ASSERT(G.cq, "device, PD, CQ");
	G.mem = mmap(NULL, NPAGE * PG, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	FUZZ_ASSERT(G.mem != MAP_FAILED, "mmap");
	/* Every page backed, so that a stray write would show. */
	G.all = ibv_reg_mr(G.pd, G.mem, NPAGE * PG, IBV_ACCESS_LOCAL_WRITE);
	G.mr[REG_A] = ibv_reg_mr(G.pd, page(REG_A), PG, rw);
	G.mr[REG_B] = ibv_reg_mr(G.pd, page(REG_B), PG, IBV_ACCESS_REMOTE_READ);
	G.mr[REG_S] = ibv_reg_mr(G.pd, page(REG_S), PG, IBV_ACCESS_LOCAL_WRITE);
	G.mr[REG_R] = ibv_reg_mr(G.pd, page(REG_R), PG, IBV_ACCESS_LOCAL_WRITE);
	FUZZ_ASSERT(G.all && G.mr[REG_A] && G.mr[REG_B] && G.mr[REG_S] && G.mr[REG_R],
		    "ibv_reg_mr: %m");
	G.up = true;
}

/* A listening socket on a loopback port below `below`: the fake QP's
 * number names it (and a real QP accepts only its owner). */
static int fake_listener(uint16_t below, uint16_t *port)
{
	for (unsigned p = below - 1; p > 1024 && p + 4000 > below; p--) {
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(p),
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (fd >= 0 && !bind(fd, (struct sockaddr *)&sa, sizeof(sa)) &&
		    !listen(fd, 1)) {
			*port = p;
			return fd;
		}
		if (fd >= 0)
			close(fd);
	}
	return -1;
}

static bool read_all(int fd, void *buf, size_t len, int ms)
{
	size_t got = 0;

	while (got < len) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (poll(&pf, 1, ms) != 1)
			return false;
		n = read(fd, (uint8_t *)buf + got, len - got);
		if (n <= 0)
			return false;
		got += n;
	}
	return true;
}

static void write_all(int fd, const uint8_t *p, size_t len)
{
	while (len) {
		struct pollfd pf = { .fd = fd, .events = POLLOUT };
		ssize_t n;

		if (poll(&pf, 1, 200) != 1)
			return; /* the QP stopped reading: fine */
		n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0 && errno == EAGAIN)
			continue;
		if (n <= 0)
			return;
		p += n;
		len -= n;
	}
}

static int qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	return ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) ? -1 : (int)a.qp_state;
}

/* Connect a fresh QP (RC, or UC: what it can't take it drops) to a fake
 * peer; the fake's socket, or -1. */
static int connect_qp(struct ibv_qp **qpp, int *lfd, bool *crc, bool uc,
		      uint32_t *sink_stag, uint32_t *msn)
{
	struct ibv_qp_init_attr ia = { .send_cq = G.cq, .recv_cq = G.cq,
				       .qp_type = uc ? IBV_QPT_UC : IBV_QPT_RC,
				       .cap = { 8, 8, 1, 1, 0 } };
	int rc_only = uc ? 0 : IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	struct ibv_qp *qp = ibv_create_qp(G.pd, &ia);
	struct ibv_qp_attr at;
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct {
		struct mpa_frame f;
		struct urdma_mpa_pd pd;
	} __attribute__((packed)) req = { 0 }, rep;
	uint8_t rr[2 + sizeof(struct ddp_untagged_hdr) + sizeof(struct rdmap_read_req) + 4];
	uint16_t port;
	uint32_t fake_qpn;
	int fd;

	FUZZ_ASSERT(qp, "ibv_create_qp: %m");
	*qpp = qp;
	*lfd = fake_listener(qp->qp_num >> 8, &port);
	FUZZ_ASSERT(*lfd >= 0, "no port below %u", qp->qp_num >> 8);
	fake_qpn = (uint32_t)port << 8 | 1;
	at = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .port_num = 1,
				   .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						      IBV_ACCESS_REMOTE_READ |
						      IBV_ACCESS_REMOTE_ATOMIC };
	FUZZ_ASSERT(!ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						    IBV_QP_ACCESS_FLAGS), "INIT");
	for (int i = 0; i < 2; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)page(REG_R) + i * 1024,
				       .length = RECV_LEN, .lkey = G.mr[REG_R]->lkey };
		struct ibv_recv_wr w = { .wr_id = 10 + i, .sg_list = &sge, .num_sge = 1 }, *bad;

		FUZZ_ASSERT(!ibv_post_recv(qp, &w, &bad), "post_recv");
	}
	at = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
				   .dest_qp_num = fake_qpn,
				   .max_dest_rd_atomic = 4, .min_rnr_timer = 12,
				   .ah_attr = { .is_global = 1, .port_num = 1,
						.grh.sgid_index = 1 } };
	memcpy(at.ah_attr.grh.dgid.raw, (uint8_t[16]){ [10] = 0xff, [11] = 0xff, 127, 0, 0, 1 },
	       16);
	FUZZ_ASSERT(!ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
						    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | rc_only),
		    "RTR");
	at = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				   .rnr_retry = 7, .max_rd_atomic = 4 };
	FUZZ_ASSERT(!ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN |
						    (uc ? 0 : IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
							   IBV_QP_RNR_RETRY |
							   IBV_QP_MAX_QP_RD_ATOMIC)),
		    "RTS");
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	sa.sin_port = htons(qp->qp_num >> 8);
	FUZZ_ASSERT(fd >= 0 && !connect(fd, (struct sockaddr *)&sa, sizeof(sa)), "connect");
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){ 1 }, sizeof(int));
	memcpy(req.f.key, MPA_KEY_REQ, MPA_KEY_LEN);
	req.f.flags = *crc ? MPA_FLAG_C : 0;
	req.f.rev = MPA_REVISION;
	req.f.pd_len = htons(sizeof(req.pd));
	req.pd.magic = htonl(URDMA_MPA_MAGIC);
	req.pd.version = htonl(URDMA_MPA_VERSION);
	req.pd.src_qpn = htonl(fake_qpn);
	req.pd.dst_qpn = htonl(qp->qp_num);
	req.pd.ird = req.pd.ord = htonl(4);
	write_all(fd, (uint8_t *)&req, sizeof(req));
	FUZZ_ASSERT(read_all(fd, &rep, sizeof(rep), 5000) && !(rep.f.flags & MPA_FLAG_R),
		    "the MPA Reply");
	*crc = *crc || (rep.f.flags & MPA_FLAG_C); /* either side's wish */
	/* One RDMA Read outstanding: its Request tells us the sink STag (UC
	 * has no Reads: no sink). */
	memset(msn, 0, sizeof(uint32_t) * DDP_NUM_QN);
	*sink_stag = 0;
	if (uc)
		return fd;
	{
		struct ibv_sge sge = { .addr = (uintptr_t)page(REG_S), .length = SINK_LEN,
				       .lkey = G.mr[REG_S]->lkey };
		struct ibv_send_wr w = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_READ,
					 .send_flags = IBV_SEND_SIGNALED,
					 .wr.rdma = { .remote_addr = 0x1000, .rkey = 0x1234 } },
				   *bad;

		FUZZ_ASSERT(!ibv_post_send(qp, &w, &bad), "post the Read");
	}
	FUZZ_ASSERT(read_all(fd, rr, sizeof(rr), 5000), "the Read Request");
	*sink_stag = iwarp_get32(rr + 2 + sizeof(struct ddp_untagged_hdr));
	return fd;
}

/* One record: 16 bytes, then plen payload bytes. */
struct rec {
	uint8_t kind, flags, region, plen;
	uint32_t to, extra, stag;
} __attribute__((packed));

static uint32_t stag_of(const struct rec *r, uint32_t sink)
{
	switch (r->region % 5) {
	case 0: return G.mr[REG_A]->rkey;
	case 1: return G.mr[REG_B]->rkey;
	case 2: return sink;
	case 3: return G.all->rkey;
	default: return r->stag;
	}
}

static uint64_t to_of(const struct rec *r)
{
	uint64_t base = (uintptr_t)page(r->region % 5 == 1 ? REG_B : REG_A);

	/* In the region; or near it, over its ends; or anything. */
	if (r->flags & 0x40)
		return (uint64_t)r->to << 12 | r->extra;
	if (r->flags & 0x20)
		return base + (int32_t)(r->to % 12288) - 4096;
	return base + r->to % (PG - 64);
}

/* The FPDUs of one record, appended at out; returns the bytes. */
static size_t build(uint8_t *out, const struct rec *r, const uint8_t *pl, bool crc,
		    uint32_t sink, uint32_t *msn, uint32_t *send_mo)
{
	uint8_t h[sizeof(struct ddp_untagged_hdr) + sizeof(struct rdmap_atomic_req)];
	uint8_t body[64];
	bool last = !(r->flags & 1);
	uint32_t hl, blen = r->plen;
	unsigned op;
	int qn;

	switch (r->kind % 8) {
	case 0:
		hl = iwf_tagged(h, RDMAP_WRITE, last, stag_of(r, sink), to_of(r));
		break;
	case 1:
		hl = iwf_tagged(h, RDMAP_READ_RESP, last, r->region % 5 == 4 ? r->stag : sink,
				r->flags & 0x20 ? r->to % 512 : 0);
		break;
	default:
		switch (r->kind % 8) {
		case 2: op = r->flags & 0x10 ? RDMAP_SEND_SE : RDMAP_SEND; qn = DDP_QN_SEND; break;
		case 3: op = RDMAP_IMM; qn = DDP_QN_SEND; break;
		case 4: op = RDMAP_READ_REQ; qn = DDP_QN_READ; break;
		case 5: op = RDMAP_ATOMIC_REQ; qn = DDP_QN_ATOMIC_REQ; break;
		case 6: op = RDMAP_ATOMIC_RESP; qn = DDP_QN_ATOMIC_RESP; break;
		default: op = RDMAP_TERMINATE; qn = DDP_QN_TERM; break;
		}
		/* A Send's segments follow on (MO), unless flags say not. */
		hl = iwf_untagged(h, op, last || qn != DDP_QN_SEND, qn,
				  msn[qn] + (r->flags & 4 ? r->extra % 3 : 0),
				  r->flags & 8 ? r->extra % 4096 :
				  qn == DDP_QN_SEND ? *send_mo : 0);
		if (last || qn != DDP_QN_SEND)
			msn[qn]++;
		if (qn == DDP_QN_SEND)
			*send_mo = last ? 0 : *send_mo + blen;
		if (op == RDMAP_READ_REQ) {
			iwf_put32(body, sink ^ (r->flags & 0x80));
			iwf_put64(body + 4, 0);
			iwf_put32(body + 12, r->extra % 9000);
			iwf_put32(body + 16, stag_of(r, sink));
			iwf_put64(body + 20, to_of(r));
			pl = body;
			blen = sizeof(struct rdmap_read_req);
		} else if (op == RDMAP_ATOMIC_REQ) {
			memset(body, 0, sizeof(struct rdmap_atomic_req));
			iwf_put32(body, r->extra & 1);
			iwf_put32(body + 4, r->to);
			iwf_put32(body + 8, stag_of(r, sink));
			iwf_put64(body + 12, to_of(r) & ~(uint64_t)(r->flags & 0x20 ? 0 : 7));
			iwf_put64(body + 20, r->extra);
			pl = body;
			blen = sizeof(struct rdmap_atomic_req);
		} else if (op == RDMAP_IMM) {
			memset(body, 0, 8);
			iwf_put32(body + 4, r->extra & 1);
			pl = body;
			blen = 8;
		}
		break;
	}
	return iwf_fpdu(out, hl + blen, crc, r->flags & 2, h, hl, pl, blen);
}

static long n_a, n_s, n_r, n_err; /* inputs that placed data there */

static void check_memory(void)
{
	bool a = false, s = false, r = false;

	for (int p = 0; p < NPAGE; p++) {
		const uint8_t *b = page(p);

		for (int i = 0; i < PG; i++) {
			bool may = p == REG_A || (p == REG_S && i < SINK_LEN) ||
				   (p == REG_R && (i % 1024) < RECV_LEN && i < 2048);

			FUZZ_ASSERT(may || b[i] == PAT, "page %d byte %d changed to %#x", p, i,
				    b[i]);
			if (b[i] != PAT) {
				a |= p == REG_A;
				s |= p == REG_S;
				r |= p == REG_R;
			}
		}
	}
	n_a += a;
	n_s += s;
	n_r += r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t stream[1 << 20];
	uint32_t sink, msn[DDP_NUM_QN], send_mo = 0;
	struct ibv_qp *qp;
	bool crc = size && data[0] & 1;
	bool uc = size && data[0] & 2; /* a UC QP: drops instead of errors */
	size_t off = 1, len = 0;
	int fd, lfd, st;
	struct ibv_wc wc[16];
	uint8_t junk[4096];
	struct timespec t0, t1;

	setup();
	memset(G.mem, PAT, NPAGE * PG);
	fd = connect_qp(&qp, &lfd, &crc, uc, &sink, msn);
	while (off + sizeof(struct rec) <= size && len < sizeof(stream) - 70000) {
		struct rec r;

		memcpy(&r, data + off, sizeof(r));
		off += sizeof(r);
		if (off + r.plen > size)
			break;
		len += build(stream + len, &r, data + off, crc, sink, msn, &send_mo);
		off += r.plen;
	}
	write_all(fd, stream, len);
	/* Let the QP take it all: poll until it is in ERR, or quiet. */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(G.cq, 16, wc);

		while (recv(fd, junk, sizeof(junk), MSG_DONTWAIT) > 0)
			; /* its responses */
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 > 20 ||
		    qp_state(qp) == IBV_QPS_ERR)
			break;
		if (n <= 0)
			usleep(200);
	}
	st = qp_state(qp);
	FUZZ_ASSERT(st == IBV_QPS_RTS || st == IBV_QPS_ERR, "QP state %d", st);
	n_err += st == IBV_QPS_ERR;
	check_memory();
	close(fd);
	close(lfd);
	FUZZ_ASSERT(!ibv_destroy_qp(qp), "destroy_qp");
	while (ibv_poll_cq(G.cq, 16, wc) > 0)
		;
	return 0;
}

#ifdef URDMA_FUZZ_MAIN
static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t next(void)
{
	return (uint32_t)fuzz_xorshift(&rng);
}

int main(int argc, char **argv)
{
	static uint8_t in[8192];
	long iters = argc > 1 ? strtol(argv[1], NULL, 0) : 200;

	for (long i = 0; i < iters; i++) {
		size_t len = 1;

		in[0] = next();
		for (int k = next() % 6 + 1; k > 0 && len + 16 + 255 < sizeof(in); k--) {
			struct rec r = { .kind = next(), .flags = next() % 4 ? next() & 0x11 : next(),
					 .region = next(), .plen = next() % 4 ? next() % 64 : next(),
					 .to = next(), .extra = next(), .stag = next() };

			memcpy(in + len, &r, sizeof(r));
			len += sizeof(r);
			for (int b = 0; b < r.plen; b++)
				in[len++] = next();
		}
		LLVMFuzzerTestOneInput(in, len);
	}
	printf("fuzz_tcp_place: %ld inputs: data placed in A %ld, in the Read sink %ld, in "
	       "receives %ld times; %ld ended in ERR\n", iters, n_a, n_s, n_r, n_err);
	return 0;
}
#endif
