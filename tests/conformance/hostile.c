/* SPDX-License-Identifier: MIT */
/*
 * Conformance: a hostile iWARP peer over the TCP transport.
 *
 * Each case creates a real urdma QP (URDMA_TRANSPORT=tcp, set here) whose
 * destination is a fake QP played by this test over a plain TCP socket.
 * The test speaks MPA by hand, then sends one malformed or hostile stream
 * per case.  What must follow:
 *
 *  - a TERMINATE (RDMAP opcode 7 on untagged queue 2) comes back, with a
 *    layer / error type / error code that names the fault, and the DDP
 *    header it echoes is the offending one;
 *  - the real QP reaches IBV_QPS_ERR (bounded wait) and an
 *    IBV_EVENT_QP_ACCESS_ERR or IBV_EVENT_QP_FATAL async event is raised;
 *  - the registered region, and the guard pages around it, are byte for
 *    byte what they were (nothing is placed for a rejected message), and a
 *    rejected Read Request returns no data.
 *
 * Control cases (a valid Write, a valid Read Request) show the fake peer is
 * understood, so that a rejection means what it says.
 *
 * Addressing: the real QP's number is (port << 8 | index) of its process's
 * listener; the fake QP's is (P << 8 | 1) for a port P this test binds.  The
 * side with the lower QPN connects.  Most cases bind P above the real port,
 * so the real QP connects to the test (the test is the passive side); the
 * *_fake_active cases bind P below it and connect to the real QP's
 * listener instead.
 *
 * Over 1,000 lines on purpose: a catalogue of independent hostile streams
 * sharing one fake peer; each is a row of cases[] (expected Terminate).
 */
#include "harness.h"

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "iwarp_frames.h"

#define REGION 4096
#define GUARD 4096
#define CANARY 0xC5
#define WAIT_MS 5000

/* ------------------------------------------------------------------ */
/* Wire helpers                                                       */
/* ------------------------------------------------------------------ */

/* An outgoing byte stream. */
struct out {
	uint8_t b[8192];
	size_t len;
};

/* Append one FPDU whose ULPDU_Length field says ulpdu_field (normally
 * hlen + plen); the CRC is right unless bad_crc. */
static void fpdu_raw(struct out *o, bool crc, uint32_t ulpdu_field,
		     const uint8_t *hdr, uint32_t hlen, const uint8_t *pl,
		     uint32_t plen, bool bad_crc)
{
	REQUIRE(o->len + iwarp_fpdu_len(hlen + plen) <= sizeof(o->b),
		"test stream too long");
	o->len += iwf_fpdu(o->b + o->len, ulpdu_field, crc, bad_crc, hdr, hlen,
			   pl, plen);
}

static void fpdu(struct out *o, bool crc, const uint8_t *hdr, uint32_t hlen,
		 const uint8_t *pl, uint32_t plen)
{
	fpdu_raw(o, crc, hlen + plen, hdr, hlen, pl, plen, false);
}

static uint32_t read_req(uint8_t *h, uint32_t msn, uint32_t sink_stag,
			 uint64_t sink_to, uint32_t size, uint32_t src_stag,
			 uint64_t src_to)
{
	uint32_t n = iwf_untagged(h, RDMAP_READ_REQ, true, DDP_QN_READ, msn, 0);

	iwf_put32(h + n, sink_stag);
	iwf_put64(h + n + 4, sink_to);
	iwf_put32(h + n + 12, size);
	iwf_put32(h + n + 16, src_stag);
	iwf_put64(h + n + 20, src_to);
	return n + sizeof(struct rdmap_read_req);
}

static uint32_t atomic_req(uint8_t *h, uint32_t op, uint32_t stag, uint64_t to,
			   uint64_t add_swap, uint64_t compare)
{
	uint32_t n = iwf_untagged(h, RDMAP_ATOMIC_REQ, true, DDP_QN_ATOMIC_REQ,
				  0, 0);
	bool cas = op == ATOMIC_CMP_SWAP;

	iwf_put32(h + n, op);
	iwf_put32(h + n + 4, 0x42);
	iwf_put32(h + n + 8, stag);
	iwf_put64(h + n + 12, to);
	iwf_put64(h + n + 20, add_swap);
	iwf_put64(h + n + 28, cas ? ~0ull : 0);
	iwf_put64(h + n + 36, compare);
	iwf_put64(h + n + 44, cas ? ~0ull : 0);
	return n + sizeof(struct rdmap_atomic_req);
}

/* ------------------------------------------------------------------ */
/* Socket helpers (every wait bounded)                                */
/* ------------------------------------------------------------------ */

static bool send_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t k = send(fd, p, len, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN) {
			struct pollfd pf = {.fd = fd, .events = POLLOUT};
			if (poll(&pf, 1, WAIT_MS) <= 0)
				return false;
			continue;
		}
		if (k <= 0)
			return false;
		p += k;
		len -= k;
	}
	return true;
}

/* Read exactly len bytes; false on EOF, error or timeout. */
static bool recv_exact(int fd, void *buf, size_t len, int ms)
{
	uint8_t *p = buf;
	uint64_t end = t_now_ms() + ms;

	while (len) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		int left = (int)(end - t_now_ms());

		if (left <= 0 || poll(&pf, 1, left) <= 0)
			return false;
		ssize_t k = recv(fd, p, len, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return false;
		p += k;
		len -= k;
	}
	return true;
}

/* An incoming stream from the real QP. */
struct in {
	uint8_t b[70000];
	size_t len;
	bool eof;
};

enum { GOT_FPDU = 1, GOT_EOF = 0, GOT_TIMEOUT = -1, GOT_BAD = -2 };

/*
 * The next FPDU from the real QP into *f (its bytes, *flen of them), with
 * its CRC checked when crc.  GOT_EOF when the stream ends first.
 */
static int next_fpdu(int fd, struct in *in, bool crc, uint8_t *f,
		     uint32_t *flen, int ms)
{
	uint64_t end = t_now_ms() + ms;

	for (;;) {
		if (in->len >= 2) {
			uint32_t ulpdu = (uint32_t)in->b[0] << 8 | in->b[1];
			uint32_t wire = iwarp_fpdu_len(ulpdu);

			if (in->len >= wire) {
				memcpy(f, in->b, wire);
				*flen = wire;
				memmove(in->b, in->b + wire, in->len - wire);
				in->len -= wire;
				uint32_t v;
				memcpy(&v, f + wire - 4, 4);
				if (crc && iwf_crc32c(f, wire - 4) != MPA_CRC_HOST(v)) {
					CHECK(false, "an FPDU from the real QP has a bad CRC");
					return GOT_BAD;
				}
				return GOT_FPDU;
			}
		}
		if (in->eof)
			return GOT_EOF;
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		int left = (int)(end - t_now_ms());
		if (left <= 0 || poll(&pf, 1, left) <= 0)
			return GOT_TIMEOUT;
		ssize_t k = recv(fd, in->b + in->len, sizeof(in->b) - in->len, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			in->eof = true;
		else
			in->len += k;
	}
}

/* ------------------------------------------------------------------ */
/* The cases                                                          */
/* ------------------------------------------------------------------ */

enum kind {
	K_VALID_WRITE,
	K_VALID_READ,
	K_VALID_ATOMIC,
	K_SHORT_ULPDU,
	K_SHORT_ULPDU_TAGGED,
	K_WRITE_BAD_STAG,
	K_WRITE_PAST_END,
	K_WRITE_BEFORE_START,
	K_WRITE_WRAP,
	K_WRITE_NO_ACCESS,
	K_TRUNCATED_CLOSE,
	K_TRUNCATED_HDR_CLOSE,
	K_BAD_CRC,
	K_READ_PAST_END,
	K_READ_BEFORE_START,
	K_READ_HUGE,
	K_READ_BAD_STAG,
	K_BAD_OPCODE,
	K_SEND_INV,
	K_SEND_TAGGED,
	K_WRITE_UNTAGGED,
	K_DDP_VERSION,
	K_DDP_VERSION_TAGGED,
	K_RDMAP_VERSION,
	K_BAD_QN,
	K_BAD_MSN,
	K_READ_REQ_BAD_LEN,
	K_CTRL_NOT_LAST,
	K_SEND_TOO_LONG,
	K_ATOMIC_PAST_END,
	K_ATOMIC_MISALIGNED,
	K_ATOMIC_BAD_OP,
	K_READ_RESP_UNSOLICITED,
	K_ATOMIC_RESP_UNSOLICITED,
	K_PEER_TERMINATE,
	K_GARBAGE_AFTER_VALID,
	K_READ_FLOOD,
	K_READ_FLOOD_T0,
	K_FLUSH_FLOOD_T0,
	K_STRAY_SEGMENT,
	K_TERM_THEN_FLOOD,
	K_BAD_THEN_FLOOD,
	K_STALL_FLOOD_QP_ERR,
	K_BAD_WHILE_SENDING,
	/* hostile MPA on the real QP's listener, then a proper connection */
	K_MPA_GARBAGE,
	K_MPA_HUGE_PD,
	K_MPA_MARKERS,
	K_MPA_BAD_MAGIC,
	K_MPA_UNKNOWN_QP,
	K_MPA_WRONG_SRC,
};
#define IS_MPA_CASE(k) ((k) >= K_MPA_GARBAGE)

struct hcase {
	const char *name;
	enum kind kind;
	/* The TERMINATE expected back: layer < 0 means none. */
	int layer, etype, ecode;
	bool qp_err;	  /* the real QP must reach ERR */
	bool fake_active; /* the test connects (its QPN is the lower) */
};

#define TERM(l, t, c) (l), (t), (c)
#define NO_TERM -1, 0, 0

static const struct hcase cases[] = {
	{"valid_write", K_VALID_WRITE, NO_TERM, false, false},
	{"valid_read", K_VALID_READ, NO_TERM, false, false},
	{"valid_atomic", K_VALID_ATOMIC, NO_TERM, false, false},
	{"valid_write_fake_active", K_VALID_WRITE, NO_TERM, false, true},
	/* (a) ULPDU_Length shorter than the DDP header */
	{"ulpdu_shorter_than_ddp_header", K_SHORT_ULPDU,
	 TERM(TERM_LAYER_MPA, TERM_MPA_ET_ERR, TERM_MPA_EC_LEN), true, false},
	{"ulpdu_shorter_than_tagged_header", K_SHORT_ULPDU_TAGGED,
	 TERM(TERM_LAYER_MPA, TERM_MPA_ET_ERR, TERM_MPA_EC_LEN), true, false},
	{"ulpdu_shorter_fake_active", K_SHORT_ULPDU,
	 TERM(TERM_LAYER_MPA, TERM_MPA_ET_ERR, TERM_MPA_EC_LEN), true, true},
	/* (b) Write with an unknown STag */
	{"write_unknown_stag", K_WRITE_BAD_STAG,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED, TERM_DDP_EC_T_INV_STAG), true, false},
	/* (c) Write with a valid STag outside the region */
	{"write_past_end", K_WRITE_PAST_END,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED, TERM_DDP_EC_T_BOUNDS), true, false},
	{"write_before_start", K_WRITE_BEFORE_START,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED, TERM_DDP_EC_T_BOUNDS), true, false},
	{"write_to_wraps", K_WRITE_WRAP,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED, TERM_DDP_EC_T_BOUNDS), true, false},
	{"write_mr_without_remote_write", K_WRITE_NO_ACCESS,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT, TERM_RDMAP_EC_ACCESS), true, false},
	/* (d) a truncated frame, then the peer closes: with a WR of the real
	 * QP unconfirmed, the QP enters ERR at once; an idle QP stays RTS
	 * (docs/wire-protocol.md, as on InfiniBand) and its next WR fails */
	{"truncated_then_close_busy", K_TRUNCATED_CLOSE, NO_TERM, true, false},
	{"truncated_header_then_close_idle", K_TRUNCATED_HDR_CLOSE, NO_TERM, true, false},
	/* (e) bad CRC */
	{"bad_crc", K_BAD_CRC, TERM(TERM_LAYER_MPA, TERM_MPA_ET_ERR, TERM_MPA_EC_CRC),
	 true, false},
	/* (f) Read Request outside the region */
	{"read_req_past_end", K_READ_PAST_END,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT, TERM_RDMAP_EC_BOUNDS), true, false},
	{"read_req_before_start", K_READ_BEFORE_START,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT, TERM_RDMAP_EC_BOUNDS), true, false},
	{"read_req_4gib", K_READ_HUGE,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT, TERM_RDMAP_EC_BOUNDS), true, false},
	{"read_req_unknown_stag", K_READ_BAD_STAG,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT, TERM_RDMAP_EC_INV_STAG), true, false},
	/* (g) unknown / unsupported opcodes */
	{"unknown_opcode", K_BAD_OPCODE,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP, TERM_RDMAP_EC_OPCODE), true, false},
	{"send_with_invalidate_no_window", K_SEND_INV,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT, TERM_RDMAP_EC_INV_STAG), true, false},
	{"send_tagged", K_SEND_TAGGED,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP, TERM_RDMAP_EC_OPCODE), true, false},
	{"write_untagged", K_WRITE_UNTAGGED,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP, TERM_RDMAP_EC_OPCODE), true, false},
	/* (h) wrong versions */
	{"ddp_version_0", K_DDP_VERSION,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED, TERM_DDP_EC_U_VERSION), true, false},
	{"ddp_version_2_tagged", K_DDP_VERSION_TAGGED,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED, TERM_DDP_EC_T_VERSION), true, false},
	{"rdmap_version_2", K_RDMAP_VERSION,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP, TERM_RDMAP_EC_VERSION), true, false},
	/* more */
	{"send_bad_queue_number", K_BAD_QN,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED, TERM_DDP_EC_U_INV_QN), true, false},
	{"send_bad_msn", K_BAD_MSN,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED, TERM_DDP_EC_U_INV_MSN), true, false},
	{"read_req_wrong_length", K_READ_REQ_BAD_LEN,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED, TERM_DDP_EC_U_INV_MO), true, false},
	{"read_req_not_last", K_CTRL_NOT_LAST,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED, TERM_DDP_EC_U_INV_MO), true, false},
	{"send_longer_than_receive", K_SEND_TOO_LONG,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED, TERM_DDP_EC_U_TOO_LONG), true, false},
	{"atomic_past_end", K_ATOMIC_PAST_END,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT, TERM_RDMAP_EC_BOUNDS), true, false},
	{"atomic_misaligned", K_ATOMIC_MISALIGNED,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP, TERM_RDMAP_EC_ATOMIC_ALIGN), true, false},
	{"atomic_masked_op", K_ATOMIC_BAD_OP,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP, TERM_RDMAP_EC_OPCODE), true, false},
	{"read_resp_unsolicited", K_READ_RESP_UNSOLICITED,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED, TERM_DDP_EC_T_INV_STAG), true, false},
	{"atomic_resp_unsolicited", K_ATOMIC_RESP_UNSOLICITED,
	 TERM(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP, TERM_RDMAP_EC_UNSPEC), true, false},
	{"peer_sends_terminate", K_PEER_TERMINATE, NO_TERM, true, false},
	{"valid_write_then_garbage", K_GARBAGE_AFTER_VALID,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED, TERM_DDP_EC_U_VERSION), true, false},
	/* Read Requests for far more than the socket buffers hold, and the
	 * peer never reads a response: nothing may hang (ibv_destroy_qp). */
	{"read_req_flood_unread", K_READ_FLOOD, NO_TERM, false, false},
	{"read_req_flood_unread_timeout_0", K_READ_FLOOD_T0, NO_TERM, false, false},
	/* Zero-length Read Requests (flushes) without end, answers never
	 * read, no TCP user timeout: the queue of answers has a bound, and
	 * past it the QP goes to error; the receive path never waits for the
	 * stream to take a Terminate. */
	{"flush_flood_unread_timeout_0", K_FLUSH_FLOOD_T0, NO_TERM, false, false},
	/* a Send segment with MO 100 that continues no message, then a
	 * proper Send: an invalid-MO TERMINATE, and nothing lands */
	{"send_stray_continuation_segment", K_STRAY_SEGMENT, NO_TERM, false, false},
	/* a Write with an unknown STag, then the peer ignores the TERMINATE
	 * and keeps sending while the real QP lives: its sends must go
	 * through (dropped) or fail, not block on a stream nobody reads */
	{"write_unknown_stag_then_peer_keeps_sending", K_TERM_THEN_FLOOD,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED, TERM_DDP_EC_T_INV_STAG), true, false},
	/* the same, the peer sending on right after the bad Write, reading
	 * nothing: what it sent before the TERMINATE fills no window */
	{"write_unknown_stag_then_flood_unread", K_BAD_THEN_FLOOD,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED, TERM_DDP_EC_T_INV_STAG), true, false},
	/* a Send with no receive posted (the reader waits), then the peer
	 * fills the stream until it blocks; the application moves the QP to
	 * ERR: the blocked peer's sends must fail, not wait for the QP's
	 * destruction */
	{"send_unreceived_flood_then_qp_error", K_STALL_FLOOD_QP_ERR, NO_TERM, false, false},
	/* a Write with an unknown STag while the real QP is inside a long
	 * Write of its own that the peer does not read yet: when the peer
	 * reads, whole Write FPDUs, then the TERMINATE, then the end */
	{"write_unknown_stag_while_sending", K_BAD_WHILE_SENDING,
	 TERM(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED, TERM_DDP_EC_T_INV_STAG), true, false},
	/* Hostile connections to the real QP's listener before the good one:
	 * each is closed (or rejected), the good one then works. */
	{"mpa_garbage_request", K_MPA_GARBAGE, NO_TERM, false, true},
	{"mpa_private_data_too_long", K_MPA_HUGE_PD, NO_TERM, false, true},
	{"mpa_markers_requested", K_MPA_MARKERS, NO_TERM, false, true},
	{"mpa_not_urdma_private_data", K_MPA_BAD_MAGIC, NO_TERM, false, true},
	{"mpa_unknown_qp", K_MPA_UNKNOWN_QP, NO_TERM, false, true},
	{"mpa_wrong_source_qp", K_MPA_WRONG_SRC, NO_TERM, false, true},
};

/* ------------------------------------------------------------------ */
/* Setting up the real QP and the fake peer                           */
/* ------------------------------------------------------------------ */

struct ctx {
	const struct hcase *hc;
	struct t_res r;
	uint8_t *mem;	/* GUARD | REGION | GUARD; REGION registered */
	uint8_t *shadow; /* what mem must hold */
	uint8_t *region;
	struct ibv_mr *mr;
	uint8_t *ro;	 /* a region without REMOTE_WRITE */
	struct ibv_mr *ro_mr;
	uint32_t real_qpn, fake_qpn;
	int own_fd; /* the socket that holds port P */
	int fd;	    /* the connection */
	int extra_fd; /* a hostile connection kept open */
	uint8_t *big;  /* the source of a long Write (K_BAD_WHILE_SENDING) */
	bool crc;
	uint32_t msn[DDP_NUM_QN]; /* next MSN we send on each queue */
};

static int find_loopback_gid(struct t_res *r)
{
	union ibv_gid want = {0}, g;

	want.raw[10] = want.raw[11] = 0xff;
	want.raw[12] = 127;
	want.raw[15] = 1;
	for (int i = 0; i < r->port_attr.gid_tbl_len; i++)
		if (!ibv_query_gid(r->ctx, 1, i, &g) && !memcmp(&g, &want, 16))
			return i;
	return -1;
}

/* Bind a socket to a port above (fake passive) or below (fake active) the
 * real QP's, and listen on it: the fake QPN names it, and a real QP accepts
 * a connection only from the owner of the listener its peer's QPN names. */
static uint16_t own_port(struct ctx *c, uint16_t real_port, bool above)
{
	unsigned lo = above ? real_port + 1u : 1024, hi = above ? 65535 : real_port - 1u;

	REQUIRE(lo <= hi, "no port %s %u to bind", above ? "above" : "below", real_port);
	unsigned span = hi - lo + 1, start = (unsigned)getpid() % span;
	for (unsigned i = 0; i < span && i < 20000; i++) {
		unsigned port = lo + (start + i) % span;
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_in sa = {.sin_family = AF_INET,
					 .sin_port = htons(port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

		REQUIRE(fd >= 0, "socket: %s", strerror(errno));
		if (!bind(fd, (struct sockaddr *)&sa, sizeof(sa)) && !listen(fd, 4)) {
			c->own_fd = fd;
			return (uint16_t)port;
		}
		close(fd);
	}
	REQUIRE(false, "could not bind a loopback port %s %u", above ? "above" : "below",
		real_port);
	return 0;
}

static void fill_pd(struct urdma_mpa_pd *pd, uint32_t src, uint32_t dst)
{
	memset(pd, 0, sizeof(*pd));
	pd->magic = htonl(URDMA_MPA_MAGIC);
	pd->version = htonl(URDMA_MPA_VERSION);
	pd->src_qpn = htonl(src);
	pd->dst_qpn = htonl(dst);
	pd->ird = htonl(1);
	pd->ord = htonl(1);
}

/* Read an MPA frame with urdma private data; checks the key. */
static void read_mpa(int fd, const char *key, struct mpa_frame *f,
		     struct urdma_mpa_pd *pd)
{
	uint8_t rest[MPA_MAX_PD];

	REQUIRE(recv_exact(fd, f, sizeof(*f), WAIT_MS), "no MPA frame from the real QP");
	REQUIRE(!memcmp(f->key, key, MPA_KEY_LEN), "MPA key is not \"%s\"", key);
	REQUIRE(f->rev == MPA_REVISION, "MPA revision %u", f->rev);
	uint16_t n = ntohs(f->pd_len);
	REQUIRE(n >= sizeof(*pd) && n <= MPA_MAX_PD, "MPA private data of %u bytes", n);
	REQUIRE(recv_exact(fd, rest, n, WAIT_MS), "MPA private data cut short");
	memcpy(pd, rest, sizeof(*pd));
	REQUIRE(ntohl(pd->magic) == URDMA_MPA_MAGIC && ntohl(pd->version) == URDMA_MPA_VERSION,
		"MPA private data is not urdma's");
}

static void send_mpa(int fd, const char *key, uint8_t flags,
		     const struct urdma_mpa_pd *pd)
{
	struct {
		struct mpa_frame f;
		struct urdma_mpa_pd pd;
	} __attribute__((packed)) m;

	memcpy(m.f.key, key, MPA_KEY_LEN);
	m.f.flags = flags;
	m.f.rev = MPA_REVISION;
	m.f.pd_len = htons(sizeof(m.pd));
	m.pd = *pd;
	REQUIRE(send_all(fd, &m, sizeof(m)), "sending the MPA frame: %s", strerror(errno));
}

/* What the listener must do with a hostile connection: close it, or
 * reject it (a Reply with R), never accept it. */
static void mpa_hostile(struct ctx *c, uint16_t real_port, int *keep_fd)
{
	const struct hcase *hc = c->hc;
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons(real_port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct urdma_mpa_pd pd;
	struct {
		struct mpa_frame f;
		uint8_t pd[MPA_MAX_PD + 64];
	} __attribute__((packed)) m;
	size_t len = sizeof(m.f) + sizeof(pd);

	REQUIRE(fd >= 0, "socket: %s", strerror(errno));
	REQUIRE(!connect(fd, (struct sockaddr *)&sa, sizeof(sa)), "connect to %u: %s",
		real_port, strerror(errno));
	memcpy(m.f.key, MPA_KEY_REQ, MPA_KEY_LEN);
	m.f.flags = MPA_FLAG_C;
	m.f.rev = MPA_REVISION;
	m.f.pd_len = htons(sizeof(pd));
	fill_pd(&pd, c->fake_qpn, c->real_qpn);
	switch (hc->kind) {
	case K_MPA_GARBAGE:
		memcpy(&m, "GET / HTTP/1.1\r\nHost: x\r\n\r\n......................", 48);
		break;
	case K_MPA_HUGE_PD:
		m.f.pd_len = htons(0xffff);
		break;
	case K_MPA_MARKERS:
		m.f.flags |= MPA_FLAG_M;
		break;
	case K_MPA_BAD_MAGIC:
		pd.magic = htonl(0x12345678);
		break;
	case K_MPA_UNKNOWN_QP:
		pd.dst_qpn = htonl(c->real_qpn ^ 0x80);
		break;
	case K_MPA_WRONG_SRC:
		pd.src_qpn = htonl(c->fake_qpn + 1);
		break;
	default:
		break;
	}
	if (hc->kind != K_MPA_GARBAGE)
		memcpy(m.pd, &pd, sizeof(pd));
	REQUIRE(send_all(fd, &m, len), "send");

	/* The answer: EOF, a reject, or (wrong source) nothing yet. */
	uint8_t buf[sizeof(struct mpa_frame) + MPA_MAX_PD];
	size_t got = 0;
	bool eof = false;
	uint64_t end = t_now_ms() + (hc->kind == K_MPA_WRONG_SRC ? 300 : WAIT_MS);
	while (!eof && t_now_ms() < end) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		if (poll(&pf, 1, (int)(end - t_now_ms())) <= 0)
			break;
		ssize_t k = recv(fd, buf + got, sizeof(buf) - got, 0);
		if (k <= 0)
			eof = true;
		else
			got += k;
	}
	if (got >= sizeof(struct mpa_frame)) {
		struct mpa_frame f;
		memcpy(&f, buf, sizeof(f));
		t_note("%s: the listener answered %.16s, flags %#x", hc->name, f.key, f.flags);
		CHECK(!memcmp(f.key, MPA_KEY_REP, MPA_KEY_LEN) && (f.flags & MPA_FLAG_R),
		      "%s: the listener accepted a hostile MPA Request", hc->name);
	} else {
		t_note("%s: the listener %s", hc->name,
		       eof ? "closed the connection" : "keeps the connection, silent");
	}
	if (hc->kind == K_MPA_WRONG_SRC) {
		*keep_fd = fd; /* still open while the good one connects */
		return;
	}
	CHECK(eof, "%s: the listener did not close the connection within %d ms", hc->name,
	      WAIT_MS);
	close(fd);
}

static void setup(struct ctx *c, const struct hcase *hc)
{
	memset(c, 0, sizeof(*c));
	c->hc = hc;
	c->own_fd = c->fd = c->extra_fd = -1;

	struct t_opts o = t_opts_default();
	o.sgid_index = 0;
	if (hc->kind == K_READ_FLOOD_T0 || hc->kind == K_FLUSH_FLOOD_T0)
		o.timeout = 0; /* no TCP_USER_TIMEOUT: TCP's own */
	o.create_qp = true;
	t_res_open(&c->r, &o);
	int gi = find_loopback_gid(&c->r);
	if (gi < 0)
		t_skip("no GID for ::ffff:127.0.0.1 in the table");
	c->r.opts.sgid_index = (uint8_t)gi;

	c->mem = t_alloc(GUARD + REGION + GUARD);
	c->shadow = malloc(GUARD + REGION + GUARD);
	REQUIRE(c->shadow, "out of memory");
	memset(c->mem, CANARY, GUARD + REGION + GUARD);
	c->region = c->mem + GUARD;
	t_pattern_fill(c->region, REGION, 7);
	memcpy(c->shadow, c->mem, GUARD + REGION + GUARD);
	c->mr = t_reg(&c->r, c->region, REGION,
		      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	c->ro = t_alloc(REGION);
	memset(c->ro, 0x3c, REGION);
	c->ro_mr = t_reg(&c->r, c->ro, REGION, IBV_ACCESS_REMOTE_READ);

	c->real_qpn = c->r.qp->qp_num;
	uint16_t real_port = c->real_qpn >> 8;
	/* No port above 65535: then the test connects instead. */
	bool fake_active = hc->fake_active || real_port == 65535;
	uint16_t p = own_port(c, real_port, !fake_active);
	c->fake_qpn = (uint32_t)p << 8 | 1;
	REQUIRE(fake_active ? c->fake_qpn < c->real_qpn : c->fake_qpn > c->real_qpn,
		"QPN order: real %#x fake %#x", c->real_qpn, c->fake_qpn);

	struct t_conn remote = {.qpn = c->fake_qpn, .psn = 0};
	memcpy(remote.gid.raw, (uint8_t[16]){[10] = 0xff, [11] = 0xff, [12] = 127, [15] = 1},
	       16);
	t_connect(&c->r, &remote); /* INIT, RTR (the real QP connects), RTS */

	struct mpa_frame f;
	struct urdma_mpa_pd pd;
	if (IS_MPA_CASE(hc->kind))
		mpa_hostile(c, real_port, &c->extra_fd);
	if (!fake_active) {
		struct pollfd pf = {.fd = c->own_fd, .events = POLLIN};
		REQUIRE(poll(&pf, 1, WAIT_MS) == 1,
			"the real QP %#x did not connect to port %u (is it on TCP?)",
			c->real_qpn, p);
		c->fd = accept4(c->own_fd, NULL, NULL, SOCK_CLOEXEC);
		REQUIRE(c->fd >= 0, "accept: %s", strerror(errno));
		read_mpa(c->fd, MPA_KEY_REQ, &f, &pd);
		REQUIRE(ntohl(pd.src_qpn) == c->real_qpn && ntohl(pd.dst_qpn) == c->fake_qpn,
			"MPA Request names qp %#x -> %#x, expected %#x -> %#x",
			ntohl(pd.src_qpn), ntohl(pd.dst_qpn), c->real_qpn, c->fake_qpn);
		REQUIRE(!(f.flags & MPA_FLAG_M), "the real QP asks for markers");
		c->crc = f.flags & MPA_FLAG_C;
		fill_pd(&pd, c->fake_qpn, c->real_qpn);
		send_mpa(c->fd, MPA_KEY_REP, c->crc ? MPA_FLAG_C : 0, &pd);
	} else {
		struct sockaddr_in sa = {.sin_family = AF_INET,
					 .sin_port = htons(real_port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		REQUIRE(c->fd >= 0, "socket: %s", strerror(errno));
		REQUIRE(!connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)),
			"connect to the real QP's port %u: %s", real_port, strerror(errno));
		fill_pd(&pd, c->fake_qpn, c->real_qpn);
		send_mpa(c->fd, MPA_KEY_REQ, MPA_FLAG_C, &pd);
		read_mpa(c->fd, MPA_KEY_REP, &f, &pd);
		REQUIRE(!(f.flags & MPA_FLAG_R), "the real QP rejected us (reason %u)",
			ntohl(pd.reject));
		REQUIRE(ntohl(pd.src_qpn) == c->real_qpn && ntohl(pd.dst_qpn) == c->fake_qpn,
			"MPA Reply names qp %#x -> %#x", ntohl(pd.src_qpn), ntohl(pd.dst_qpn));
		c->crc = f.flags & MPA_FLAG_C;
	}
	int one = 1;
	setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	CHECK(t_qp_state(c->r.qp) == IBV_QPS_RTS, "the real QP is %s, not RTS",
	      t_qp_state_str(t_qp_state(c->r.qp)));
}

static void teardown(struct ctx *c)
{
	if (c->fd >= 0)
		close(c->fd);
	if (c->own_fd >= 0)
		close(c->own_fd);
	if (c->extra_fd >= 0)
		close(c->extra_fd);
	t_res_close(&c->r);
	free(c->mem);
	free(c->big);
	free(c->shadow);
	free(c->ro);
}

/* ------------------------------------------------------------------ */
/* What came back                                                     */
/* ------------------------------------------------------------------ */

static const char *layer_str(unsigned l)
{
	return l == TERM_LAYER_RDMAP ? "RDMAP" : l == TERM_LAYER_DDP ? "DDP" :
	       l == TERM_LAYER_MPA ? "MPA" : "?";
}

/* Check a TERMINATE FPDU f (wire bytes) against the case; sent is the
 * offending FPDU as the test sent it (its DDP header at +2), or NULL. */
static void check_terminate(struct ctx *c, const uint8_t *f, uint32_t flen,
			    const uint8_t *sent, uint32_t sent_len)
{
	const struct hcase *hc = c->hc;
	uint32_t ulpdu = (uint32_t)f[0] << 8 | f[1];
	const uint8_t *h = f + 2;

	REQUIRE(ulpdu >= sizeof(struct ddp_untagged_hdr) + 4,
		"TERMINATE ULPDU of %u bytes", ulpdu);
	CHECK(!(h[0] & DDP_FLAG_T) && (h[0] & DDP_FLAG_L) &&
		      (h[0] & DDP_DV_MASK) == DDP_VERSION,
	      "TERMINATE DDP control %#x: want untagged, last, version 1", h[0]);
	CHECK(h[1] >> RDMAP_RV_SHIFT == RDMAP_VERSION, "TERMINATE RDMAP version %u",
	      h[1] >> RDMAP_RV_SHIFT);
	CHECK(iwarp_get32(h + 6) == DDP_QN_TERM, "TERMINATE on queue %u, not 2", iwarp_get32(h + 6));
	CHECK(iwarp_get32(h + 10) == 0, "TERMINATE MSN %u: the first on queue 2 is 0",
	      iwarp_get32(h + 10));
	CHECK(iwarp_get32(h + 14) == 0, "TERMINATE MO %u", iwarp_get32(h + 14));

	const uint8_t *body = h + sizeof(struct ddp_untagged_hdr);
	uint32_t blen = ulpdu - sizeof(struct ddp_untagged_hdr);
	uint32_t ctrl = iwarp_get32(body);
	unsigned hdrct = ctrl >> 13 & 7;

	t_note("%s: TERMINATE layer %s(%u) etype %u ecode %#x hdrct %c%c%c, %u body bytes",
	       hc->name, layer_str(TERM_LAYER(ctrl)), TERM_LAYER(ctrl), TERM_ETYPE(ctrl),
	       TERM_ECODE(ctrl), hdrct & TERM_HDRCT_M ? 'M' : '-',
	       hdrct & TERM_HDRCT_D ? 'D' : '-', hdrct & TERM_HDRCT_R ? 'R' : '-', blen);
	CHECK((int)TERM_LAYER(ctrl) == hc->layer && (int)TERM_ETYPE(ctrl) == hc->etype &&
		      (int)TERM_ECODE(ctrl) == hc->ecode,
	      "%s: TERMINATE says %s/%u/%#x, expected %s/%d/%#x", hc->name,
	      layer_str(TERM_LAYER(ctrl)), TERM_ETYPE(ctrl), TERM_ECODE(ctrl),
	      layer_str(hc->layer), hc->etype, hc->ecode);
	CHECK((ctrl & 0x1fff) == 0, "TERMINATE reserved bits %#x", ctrl & 0x1fff);
	if (hdrct & TERM_HDRCT_M) {
		REQUIRE(blen >= 6, "TERMINATE with M but %u body bytes", blen);
		uint16_t seg = (uint16_t)(body[4] << 8 | body[5]);
		uint32_t hl = blen - 6;
		CHECK(hdrct & TERM_HDRCT_D, "TERMINATE with M but without D");
		if (sent && sent_len >= 3) {
			/* RFC 5040 4.8: the length of the offending segment,
			 * then its DDP header (14 bytes tagged, 18 untagged),
			 * and with R the RDMA Read Request header (28 bytes). */
			uint32_t ddp_hl = sent[2] & DDP_FLAG_T ?
						  sizeof(struct ddp_tagged_hdr) :
						  sizeof(struct ddp_untagged_hdr);
			uint32_t want = ddp_hl + (hdrct & TERM_HDRCT_R ?
							  sizeof(struct rdmap_read_req) :
							  0);

			CHECK(seg == (uint32_t)(sent[0] << 8 | sent[1]),
			      "%s: TERMINATE DDP segment length %u, the segment's "
			      "ULPDU length is %u", hc->name, seg,
			      (uint32_t)(sent[0] << 8 | sent[1]));
			CHECK(hl == want, "%s: TERMINATE carries %u header bytes, "
			      "expected %u", hc->name, hl, want);
			if (hl <= want && want <= sent_len - 2)
				CHECK(!memcmp(body + 6, sent + 2, hl),
				      "%s: the TERMINATE echoes a header that is not "
				      "the offending one", hc->name);
		}
	}
	(void)flen;
}

/* After the hostile bytes: the TERMINATE (or none), then the end of the
 * stream.  Anything else (a Read Response to a rejected Read Request, say)
 * is a failure. */
static void expect_reply(struct ctx *c, struct in *in, const uint8_t *sent,
			 uint32_t sent_len)
{
	const struct hcase *hc = c->hc;
	static uint8_t f[70000];
	uint32_t flen;
	bool got_term = false;

	for (;;) {
		/* No TERMINATE expected: a short look that nothing comes. */
		int ms = hc->layer < 0 ? 300 : WAIT_MS;
		int r = next_fpdu(c->fd, in, c->crc, f, &flen, ms);

		if (r != GOT_FPDU) {
			CHECK(r != GOT_TIMEOUT || hc->layer < 0,
			      "%s: %s within %d ms", hc->name,
			      got_term ? "the stream did not end after the TERMINATE" :
					 "no TERMINATE and no end of stream",
			      ms);
			break;
		}
		unsigned op = f[3] & RDMAP_OPCODE_MASK;
		if (op == RDMAP_TERMINATE) {
			CHECK(!got_term, "%s: a second TERMINATE", hc->name);
			CHECK(hc->layer >= 0, "%s: an unexpected TERMINATE", hc->name);
			if (hc->layer >= 0)
				check_terminate(c, f, flen, sent, sent_len);
			got_term = true;
			continue; /* then the stream must end */
		}
		CHECK(false, "%s: the real QP sent opcode %u (%u bytes)%s", hc->name, op, flen,
		      op == RDMAP_READ_RESP ? ": a Read Response to a rejected request" : "");
		if (got_term)
			break;
	}
	CHECK(got_term || hc->layer < 0, "%s: no TERMINATE came back", hc->name);
}

/* The real QP's send WR wr_id (what) completes with status st. */
static void expect_wr_status(struct ctx *c, uint64_t wr_id, enum ibv_wc_status st,
			     const char *what)
{
	struct ibv_wc wc;

	if (t_poll_one(c->r.send_cq, &wc, WAIT_MS, what)) {
		t_note("%s: %s completed %s", c->hc->name, what, t_wc_status_str(wc.status));
		CHECK(wc.wr_id == wr_id && wc.status == st, "%s: %s completed %s (wr %llu)",
		      c->hc->name, what, t_wc_status_str(wc.status),
		      (unsigned long long)wc.wr_id);
	}
}

/* The QP reaches ERR; with need_event, an async event says so (a QP that
 * enters ERR through an error completion of its own WR needs none: the
 * completion reports it, as on InfiniBand). */
static void expect_qp_err(struct ctx *c, bool need_event)
{
	uint64_t end = t_now_ms() + WAIT_MS;
	int st;

	while ((st = t_qp_state(c->r.qp)) != IBV_QPS_ERR && t_now_ms() < end)
		t_sleep_ms(5);
	CHECK(st == IBV_QPS_ERR, "%s: the real QP is %s, not ERR, %d ms after the fault",
	      c->hc->name, t_qp_state_str(st), WAIT_MS);

	struct pollfd pf = {.fd = c->r.ctx->async_fd, .events = POLLIN};
	int ready = poll(&pf, 1, need_event ? 2000 : 100);
	if (!need_event && ready != 1)
		t_note("%s: no async event (the error completion reported it)", c->hc->name);
	if ((!need_event && ready == 1) ||
	    (need_event && CHECK(ready == 1, "%s: no async event", c->hc->name))) {
		struct ibv_async_event ev;
		if (CHECK(ibv_get_async_event(c->r.ctx, &ev) == 0, "ibv_get_async_event")) {
			t_note("%s: async event %s", c->hc->name, ibv_event_type_str(ev.event_type));
			CHECK((ev.event_type == IBV_EVENT_QP_ACCESS_ERR ||
			       ev.event_type == IBV_EVENT_QP_FATAL) &&
				      ev.element.qp == c->r.qp,
			      "%s: async event %s", c->hc->name,
			      ibv_event_type_str(ev.event_type));
			ibv_ack_async_event(&ev);
		}
	}
}

static void expect_qp_rts(struct ctx *c)
{
	int st = t_qp_state(c->r.qp);
	struct pollfd pf = {.fd = c->r.ctx->async_fd, .events = POLLIN};

	CHECK(st == IBV_QPS_RTS, "%s: the real QP is %s after valid traffic", c->hc->name,
	      t_qp_state_str(st));
	CHECK(poll(&pf, 1, 0) == 0, "%s: an async event after valid traffic", c->hc->name);
}

/* mem must equal shadow: the guards and everything not meant to change. */
static void expect_memory(struct ctx *c)
{
	for (size_t i = 0; i < GUARD + REGION + GUARD; i++) {
		if (c->mem[i] != c->shadow[i]) {
			long off = (long)i - GUARD;
			CHECK(false,
			      "%s: byte %ld %s the region changed: %#x, expected %#x",
			      c->hc->name, off < 0 ? -off : off >= REGION ? off - REGION : off,
			      off < 0 ? "before" : off >= REGION ? "after" : "into",
			      c->mem[i], c->shadow[i]);
			break;
		}
	}
	for (size_t i = 0; i < REGION; i++)
		if (!CHECK(c->ro[i] == 0x3c, "%s: the read-only MR changed at %zu",
			   c->hc->name, i))
			break;
}

/* A Read Request for [addr, +len) of the region and its response; checks
 * the data against what mem holds.  The confirmation that everything sent
 * before it was processed. */
static void read_back(struct ctx *c, struct in *in, uint64_t off, uint32_t len)
{
	uint8_t h[64];
	struct out o = {.len = 0};
	static uint8_t f[70000];
	uint32_t flen, got = 0;

	uint32_t n = read_req(h, c->msn[DDP_QN_READ]++, 0x5151, 0x1000, len, c->mr->rkey,
			      (uintptr_t)c->region + off);
	fpdu(&o, c->crc, h, n, NULL, 0);
	REQUIRE(send_all(c->fd, o.b, o.len), "send");
	while (got < len || len == 0) {
		int r = next_fpdu(c->fd, in, c->crc, f, &flen, WAIT_MS);
		REQUIRE(r == GOT_FPDU, "%s: no Read Response (%d)", c->hc->name, r);
		uint32_t ulpdu = (uint32_t)f[0] << 8 | f[1];
		const uint8_t *rh = f + 2;
		REQUIRE((rh[1] & RDMAP_OPCODE_MASK) == RDMAP_READ_RESP && (rh[0] & DDP_FLAG_T),
			"%s: opcode %u instead of a Read Response", c->hc->name,
			rh[1] & RDMAP_OPCODE_MASK);
		CHECK(iwarp_get32(rh + 2) == 0x5151, "Read Response to STag %#x", iwarp_get32(rh + 2));
		CHECK(iwarp_get64(rh + 6) == 0x1000 + got, "Read Response TO %#llx",
		      (unsigned long long)iwarp_get64(rh + 6));
		uint32_t plen = ulpdu - sizeof(struct ddp_tagged_hdr);
		REQUIRE(got + plen <= len, "Read Response too long");
		CHECK(!memcmp(rh + sizeof(struct ddp_tagged_hdr), c->region + off + got, plen),
		      "%s: Read Response data differs from the region", c->hc->name);
		got += plen;
		if (rh[0] & DDP_FLAG_L)
			break;
	}
	CHECK(got == len, "Read Response of %u bytes, asked %u", got, len);
}

/* Junk sent without waiting, up to limit bytes; a send that finds no room
 * waits up to wait_ms for it.  Returns 0 once limit bytes went, EAGAIN if
 * the stream took nothing for wait_ms, else the error that ended it.
 * *sent: the bytes that went. */
static int send_junk(int fd, size_t limit, int wait_ms, size_t *sent)
{
	static uint8_t junk[65536];

	for (*sent = 0; *sent < limit;) {
		ssize_t k = send(fd, junk, sizeof(junk), MSG_NOSIGNAL | MSG_DONTWAIT);
		struct pollfd pf = {.fd = fd, .events = POLLOUT};

		if (k > 0)
			*sent += (size_t)k;
		else if (k < 0 && errno == EAGAIN && poll(&pf, 1, wait_ms) == 0)
			return EAGAIN;
		else if (!(k < 0 && (errno == EINTR || errno == EAGAIN)))
			return k < 0 ? errno : EPIPE;
	}
	return 0;
}

/* The peer keeps sending (up to 64 MiB) while the real QP exists: a send
 * must fail or go through, never wait 2 s for room. */
static void expect_sends_not_blocked(struct ctx *c)
{
	size_t sent;
	int err = send_junk(c->fd, 64u << 20, 2000, &sent);

	if (CHECK(err != EAGAIN, "%s: the peer's send blocked for 2 s after %zu bytes: "
		  "the real QP neither reads nor resets the stream", c->hc->name, sent))
		t_note("%s: the peer sent %zu more bytes, then: %s", c->hc->name, sent,
		       err ? strerror(err) : "no error");
}

/* ------------------------------------------------------------------ */
/* The case body                                                      */
/* ------------------------------------------------------------------ */

struct destroyer {
	struct ibv_qp *qp;
	int ret;
	uint64_t end_ms;
	atomic_bool done;
};

/* A long signaled Write by the real QP, posted from its own thread (the
 * post waits for room in the stream). */
#define BIG_LEN (32u << 20)
#define BIG_STAG 0x99u
#define BIG_TO 0x10000u

struct big_post {
	struct ibv_qp *qp;
	uint8_t *buf;
	uint32_t lkey;
	int ret;
	atomic_bool done;
};

static void *big_post_thread(void *arg)
{
	struct big_post *b = arg;

	b->ret = t_post_send(b->qp, 11, IBV_WR_RDMA_WRITE, b->buf, BIG_LEN, b->lkey,
			     IBV_SEND_SIGNALED, BIG_TO, BIG_STAG);
	atomic_store(&b->done, true);
	return NULL;
}

/* Read what the real QP sent while we did not read: Write FPDUs of the
 * long Write, in order, each whole (CRC checked), then the TERMINATE,
 * then the end of the stream, not inside an FPDU. */
static void expect_writes_then_terminate(struct ctx *c, struct in *in, const uint8_t *sent,
					 uint32_t sent_len)
{
	static uint8_t f[70000];
	uint32_t flen, writes = 0;
	uint64_t to = BIG_TO;
	bool got_term = false;
	int r;

	while ((r = next_fpdu(c->fd, in, c->crc, f, &flen, WAIT_MS)) == GOT_FPDU) {
		unsigned op = f[3] & RDMAP_OPCODE_MASK;

		if (op == RDMAP_TERMINATE && !got_term) {
			check_terminate(c, f, flen, sent, sent_len);
			got_term = true;
		} else if (op == RDMAP_WRITE && !got_term && iwarp_get32(f + 4) == BIG_STAG &&
			   iwarp_get64(f + 8) == to) {
			to += ((uint32_t)f[0] << 8 | f[1]) - sizeof(struct ddp_tagged_hdr);
			writes++;
		} else {
			CHECK(false, "%s: after %u Write FPDUs%s: opcode %u, %u bytes",
			      c->hc->name, writes, got_term ? " and the TERMINATE" : "", op,
			      flen);
			return;
		}
	}
	t_note("%s: %u Write FPDUs (%llu of %u bytes), then %s", c->hc->name, writes,
	       (unsigned long long)(to - BIG_TO), BIG_LEN,
	       got_term ? "the TERMINATE" : "no TERMINATE");
	CHECK(r == GOT_EOF, "%s: the stream did not end (%d)", c->hc->name, r);
	CHECK(in->len == 0, "%s: the stream ended %zu bytes into an FPDU", c->hc->name,
	      in->len);
	CHECK(got_term, "%s: no TERMINATE after the Write FPDUs", c->hc->name);
	CHECK(to - BIG_TO < BIG_LEN, "%s: the whole Write went out", c->hc->name);
}

static void *destroy_thread(void *arg)
{
	struct destroyer *d = arg;

	d->ret = ibv_destroy_qp(d->qp);
	d->end_ms = t_now_ms();
	atomic_store(&d->done, true);
	return NULL;
}

static void hostile_case(void *arg)
{
	const struct hcase *hc = arg;
	struct ctx c;
	static struct in in;
	struct out o = {.len = 0};
	uint8_t h[128], pl[512];
	uint32_t n, first_at = 0;
	uint64_t base;
	bool closed = false;

	setup(&c, hc);
	base = (uintptr_t)c.region;
	in.len = 0;
	in.eof = false;
	for (size_t i = 0; i < sizeof(pl); i++)
		pl[i] = (uint8_t)(0xa0 + i);

	switch (hc->kind) {
	case K_VALID_WRITE:
	case K_MPA_GARBAGE:
	case K_MPA_HUGE_PD:
	case K_MPA_MARKERS:
	case K_MPA_BAD_MAGIC:
	case K_MPA_UNKNOWN_QP:
	case K_MPA_WRONG_SRC:
	case K_GARBAGE_AFTER_VALID:
		n = iwf_tagged(h, RDMAP_WRITE, true, c.mr->rkey, base + 100);
		fpdu(&o, c.crc, h, n, pl, 50);
		memcpy(c.shadow + GUARD + 100, pl, 50);
		if (hc->kind == K_GARBAGE_AFTER_VALID) {
			/* a Send whose DDP version is 0, after the Write */
			first_at = o.len;
			n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 0, 0);
			h[0] &= ~DDP_DV_MASK;
			fpdu(&o, c.crc, h, n, pl, 8);
		}
		break;
	case K_VALID_READ:
		n = read_req(h, c.msn[DDP_QN_READ]++, 0x77, 0, 256, c.mr->rkey, base + 128);
		fpdu(&o, c.crc, h, n, NULL, 0);
		break;
	case K_VALID_ATOMIC: {
		uint64_t v;
		n = atomic_req(h, ATOMIC_FETCH_ADD, c.mr->rkey, base + 256, 5, 0);
		fpdu(&o, c.crc, h, n, NULL, 0);
		memcpy(&v, c.shadow + GUARD + 256, 8);
		v += 5;
		memcpy(c.shadow + GUARD + 256, &v, 8);
		break;
	}
	case K_SHORT_ULPDU:
		/* ULPDU_Length 10: less than an untagged header's 18 */
		n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 0, 0);
		fpdu_raw(&o, c.crc, 10, h, n, pl, 8, false);
		break;
	case K_SHORT_ULPDU_TAGGED:
		/* ULPDU_Length 13 with a tagged Write into the region */
		n = iwf_tagged(h, RDMAP_WRITE, true, c.mr->rkey, base);
		fpdu_raw(&o, c.crc, 13, h, n, pl, 18, false);
		break;
	case K_WRITE_BAD_STAG:
	case K_TERM_THEN_FLOOD:
	case K_BAD_THEN_FLOOD:
	case K_BAD_WHILE_SENDING:
		n = iwf_tagged(h, RDMAP_WRITE, true, c.mr->rkey ^ 0x00abcd00u, base);
		fpdu(&o, c.crc, h, n, pl, 64);
		break;
	case K_WRITE_PAST_END:
		/* starts inside, ends 56 bytes into the guard */
		n = iwf_tagged(h, RDMAP_WRITE, true, c.mr->rkey, base + REGION - 8);
		fpdu(&o, c.crc, h, n, pl, 64);
		break;
	case K_WRITE_BEFORE_START:
		n = iwf_tagged(h, RDMAP_WRITE, true, c.mr->rkey, base - 16);
		fpdu(&o, c.crc, h, n, pl, 64);
		break;
	case K_WRITE_WRAP:
		/* TO + length wraps around 2^64 and lands at the region */
		n = iwf_tagged(h, RDMAP_WRITE, true, c.mr->rkey, (uint64_t)0 - 32);
		fpdu(&o, c.crc, h, n, pl, 64);
		break;
	case K_WRITE_NO_ACCESS:
		n = iwf_tagged(h, RDMAP_WRITE, true, c.ro_mr->rkey, (uintptr_t)c.ro);
		fpdu(&o, c.crc, h, n, pl, 64);
		break;
	case K_TRUNCATED_CLOSE:
		/* a Write of 200 bytes; 60 of them sent */
		n = iwf_tagged(h, RDMAP_WRITE, true, c.mr->rkey, base);
		fpdu(&o, c.crc, h, n, pl, 200);
		o.len = 60;
		break;
	case K_TRUNCATED_HDR_CLOSE:
		n = iwf_tagged(h, RDMAP_WRITE, true, c.mr->rkey, base);
		fpdu(&o, c.crc, h, n, pl, 200);
		o.len = 3;
		break;
	case K_BAD_CRC:
		if (!c.crc) {
			teardown(&c);
			t_skip("the connection has no CRC (URDMA_MPA_CRC=0?)");
		}
		/* a valid Write into the region, one CRC bit off */
		n = iwf_tagged(h, RDMAP_WRITE, true, c.mr->rkey, base);
		fpdu_raw(&o, c.crc, n + 64, h, n, pl, 64, true);
		break;
	case K_READ_PAST_END:
		n = read_req(h, 0, 0x77, 0, 64, c.mr->rkey, base + REGION - 32);
		fpdu(&o, c.crc, h, n, NULL, 0);
		break;
	case K_READ_BEFORE_START:
		n = read_req(h, 0, 0x77, 0, 64, c.mr->rkey, base - 32);
		fpdu(&o, c.crc, h, n, NULL, 0);
		break;
	case K_READ_HUGE:
		n = read_req(h, 0, 0x77, 0, 0xffffffffu, c.mr->rkey, base);
		fpdu(&o, c.crc, h, n, NULL, 0);
		break;
	case K_READ_BAD_STAG:
		n = read_req(h, 0, 0x77, 0, 64, c.mr->rkey ^ 0x00abcd00u, base);
		fpdu(&o, c.crc, h, n, NULL, 0);
		break;
	case K_BAD_OPCODE:
		n = iwf_untagged(h, 0xc, true, DDP_QN_SEND, 0, 0);
		fpdu(&o, c.crc, h, n, pl, 16);
		break;
	case K_SEND_INV:
		n = iwf_untagged(h, RDMAP_SEND_INV, true, DDP_QN_SEND, 0, 0);
		iwf_put32(h + 2, c.mr->rkey); /* the STag to invalidate */
		fpdu(&o, c.crc, h, n, pl, 16);
		break;
	case K_SEND_TAGGED:
		n = iwf_tagged(h, RDMAP_SEND, true, c.mr->rkey, base);
		fpdu(&o, c.crc, h, n, pl, 16);
		break;
	case K_WRITE_UNTAGGED:
		n = iwf_untagged(h, RDMAP_WRITE, true, DDP_QN_SEND, 0, 0);
		fpdu(&o, c.crc, h, n, pl, 16);
		break;
	case K_DDP_VERSION:
		n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 0, 0);
		h[0] &= ~DDP_DV_MASK;
		fpdu(&o, c.crc, h, n, pl, 16);
		break;
	case K_DDP_VERSION_TAGGED:
		n = iwf_tagged(h, RDMAP_WRITE, true, c.mr->rkey, base);
		h[0] = (h[0] & ~DDP_DV_MASK) | 2;
		fpdu(&o, c.crc, h, n, pl, 16);
		break;
	case K_RDMAP_VERSION:
		n = iwf_tagged(h, RDMAP_WRITE, true, c.mr->rkey, base);
		h[1] = 2 << RDMAP_RV_SHIFT | RDMAP_WRITE;
		fpdu(&o, c.crc, h, n, pl, 16);
		break;
	case K_BAD_QN:
		n = iwf_untagged(h, RDMAP_SEND, true, 3, 0, 0);
		fpdu(&o, c.crc, h, n, pl, 16);
		break;
	case K_BAD_MSN:
		REQUIRE(t_post_recv(c.r.qp, 1, c.region, 64, c.mr->lkey) == 0, "post_recv");
		n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 5, 0);
		fpdu(&o, c.crc, h, n, pl, 16);
		break;
	case K_READ_REQ_BAD_LEN:
		n = read_req(h, 0, 0x77, 0, 64, c.mr->rkey, base);
		fpdu(&o, c.crc, h, n, pl, 4); /* 4 bytes too many */
		break;
	case K_CTRL_NOT_LAST:
		n = read_req(h, 0, 0x77, 0, 64, c.mr->rkey, base);
		h[0] &= ~DDP_FLAG_L;
		fpdu(&o, c.crc, h, n, NULL, 0);
		break;
	case K_SEND_TOO_LONG:
		/* a 64-byte receive at the start of the region; a Send of
		 * 48 + 48 bytes in two segments */
		REQUIRE(t_post_recv(c.r.qp, 1, c.region, 64, c.mr->lkey) == 0, "post_recv");
		n = iwf_untagged(h, RDMAP_SEND, false, DDP_QN_SEND, 0, 0);
		fpdu(&o, c.crc, h, n, pl, 48);
		memcpy(c.shadow + GUARD, pl, 48); /* the first segment fits */
		first_at = o.len;
		n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 0, 48);
		fpdu(&o, c.crc, h, n, pl + 48, 48);
		break;
	case K_ATOMIC_PAST_END:
		n = atomic_req(h, ATOMIC_FETCH_ADD, c.mr->rkey, base + REGION, 1, 0);
		fpdu(&o, c.crc, h, n, NULL, 0);
		break;
	case K_ATOMIC_MISALIGNED:
		n = atomic_req(h, ATOMIC_CMP_SWAP, c.mr->rkey, base + 4, 1, 0);
		fpdu(&o, c.crc, h, n, NULL, 0);
		break;
	case K_ATOMIC_BAD_OP:
		/* fetch-add with a mask (RFC 7306 masked fetch-add) */
		n = atomic_req(h, ATOMIC_FETCH_ADD, c.mr->rkey, base + 8, 1, 0);
		iwf_put64(h + 18 + 28, 0xff);
		fpdu(&o, c.crc, h, n, NULL, 0);
		break;
	case K_READ_RESP_UNSOLICITED:
		n = iwf_tagged(h, RDMAP_READ_RESP, true, 0x1234, 0);
		fpdu(&o, c.crc, h, n, pl, 32);
		break;
	case K_ATOMIC_RESP_UNSOLICITED:
		n = iwf_untagged(h, RDMAP_ATOMIC_RESP, true, DDP_QN_ATOMIC_RESP, 0, 0);
		iwf_put32(h + n, 0x99);
		iwf_put64(h + n + 4, 0);
		n += sizeof(struct rdmap_atomic_resp);
		fpdu(&o, c.crc, h, n, NULL, 0);
		break;
	case K_READ_FLOOD:
	case K_READ_FLOOD_T0:
	case K_FLUSH_FLOOD_T0:
		break; /* below */
	case K_STALL_FLOOD_QP_ERR:
		n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 0, 0);
		fpdu(&o, c.crc, h, n, pl, 8);
		break;
	case K_STRAY_SEGMENT:
		REQUIRE(t_post_recv(c.r.qp, 1, c.region + 256, 64, c.mr->lkey) == 0,
			"post_recv");
		n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 0, 100);
		fpdu(&o, c.crc, h, n, pl, 16);
		n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 0, 0);
		fpdu(&o, c.crc, h, n, pl + 100, 32);
		memcpy(c.shadow + GUARD + 256, pl + 100, 32);
		break;
	case K_PEER_TERMINATE:
		n = iwf_untagged(h, RDMAP_TERMINATE, true, DDP_QN_TERM, 0, 0);
		iwf_put32(h + n, term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_CATASTROPHIC,
				       TERM_RDMAP_EC_UNSPEC, TERM_HDRCT_M | TERM_HDRCT_D));
		/* a DDP segment length that lies: 0xffff */
		h[n + 4] = 0xff;
		h[n + 5] = 0xff;
		iwf_tagged(h + n + 6, RDMAP_WRITE, true, 0x1, 0);
		n += 6 + sizeof(struct ddp_tagged_hdr);
		fpdu(&o, c.crc, h, n, NULL, 0);
		break;
	}

	if (hc->kind == K_TRUNCATED_CLOSE) {
		/* A signaled Write from the real QP first: it stays unconfirmed
		 * (its flush Read gets no answer from us). */
		static uint8_t f[70000];
		uint32_t flen;
		REQUIRE(t_post_send(c.r.qp, 9, IBV_WR_RDMA_WRITE, c.region, 16, c.mr->lkey,
				    IBV_SEND_SIGNALED, 0x1000, 0x99) == 0,
			"post_send");
		REQUIRE(next_fpdu(c.fd, &in, c.crc, f, &flen, WAIT_MS) == GOT_FPDU,
			"no Write from the real QP");
		CHECK((f[3] & RDMAP_OPCODE_MASK) == RDMAP_WRITE && iwarp_get32(f + 4) == 0x99,
		      "the real QP sent opcode %u, STag %#x", f[3] & RDMAP_OPCODE_MASK,
		      iwarp_get32(f + 4));
		REQUIRE(next_fpdu(c.fd, &in, c.crc, f, &flen, WAIT_MS) == GOT_FPDU,
			"no flush Read Request from the real QP");
		CHECK((f[3] & RDMAP_OPCODE_MASK) == RDMAP_READ_REQ, "opcode %u",
		      f[3] & RDMAP_OPCODE_MASK);
	}
	struct big_post big = {.qp = c.r.qp};
	pthread_t big_th;
	if (hc->kind == K_BAD_WHILE_SENDING) {
		/* The real QP's Write fills the stream (we do not read) and its
		 * sender waits for room, inside an FPDU. */
		c.big = t_alloc(BIG_LEN);
		t_pattern_fill(c.big, BIG_LEN, 3);
		big.buf = c.big;
		big.lkey = t_reg(&c.r, c.big, BIG_LEN, IBV_ACCESS_LOCAL_WRITE)->lkey;
		REQUIRE(pthread_create(&big_th, NULL, big_post_thread, &big) == 0,
			"pthread_create");
		t_sleep_ms(300);
		CHECK(!atomic_load(&big.done), "%s: a %u-byte Write went into a stream "
		      "nobody reads", hc->name, BIG_LEN);
	}
	REQUIRE(send_all(c.fd, o.b, o.len), "%s: sending the stream: %s", hc->name,
		strerror(errno));
	if (hc->kind == K_TRUNCATED_CLOSE || hc->kind == K_TRUNCATED_HDR_CLOSE) {
		/* Nothing unread on our side: close() sends a FIN, not a RST. */
		uint8_t junk[4096];
		t_sleep_ms(50);
		while (t_fd_readable(c.fd, 20) && recv(c.fd, junk, sizeof(junk), 0) > 0)
			;
		close(c.fd);
		c.fd = -1;
		closed = true;
	}

	struct ibv_wc wc;
	switch (hc->kind) {
	case K_VALID_WRITE:
	case K_MPA_GARBAGE:
	case K_MPA_HUGE_PD:
	case K_MPA_MARKERS:
	case K_MPA_BAD_MAGIC:
	case K_MPA_UNKNOWN_QP:
	case K_MPA_WRONG_SRC:
		read_back(&c, &in, 100, 50);
		expect_memory(&c);
		expect_qp_rts(&c);
		break;
	case K_VALID_READ: {
		static uint8_t f[70000];
		uint32_t flen;
		REQUIRE(next_fpdu(c.fd, &in, c.crc, f, &flen, WAIT_MS) == GOT_FPDU,
			"no Read Response");
		CHECK((f[3] & RDMAP_OPCODE_MASK) == RDMAP_READ_RESP && (f[2] & DDP_FLAG_T) &&
			      (f[2] & DDP_FLAG_L),
		      "opcode %u, DDP control %#x", f[3] & RDMAP_OPCODE_MASK, f[2]);
		CHECK(((uint32_t)f[0] << 8 | f[1]) == 14 + 256, "Read Response ULPDU %u",
		      (uint32_t)f[0] << 8 | f[1]);
		CHECK(iwarp_get32(f + 4) == 0x77 && iwarp_get64(f + 8) == 0, "sink STag/TO");
		CHECK(!memcmp(f + 16, c.region + 128, 256), "Read Response data");
		expect_memory(&c);
		expect_qp_rts(&c);
		break;
	}
	case K_VALID_ATOMIC: {
		static uint8_t f[70000];
		uint32_t flen;
		uint64_t orig;
		REQUIRE(next_fpdu(c.fd, &in, c.crc, f, &flen, WAIT_MS) == GOT_FPDU,
			"no Atomic Response");
		CHECK((f[3] & RDMAP_OPCODE_MASK) == RDMAP_ATOMIC_RESP, "opcode %u",
		      f[3] & RDMAP_OPCODE_MASK);
		CHECK(iwarp_get32(f + 8) == DDP_QN_ATOMIC_RESP, "queue %u", iwarp_get32(f + 8));
		CHECK(iwarp_get32(f + 20) == 0x42, "request id %#x", iwarp_get32(f + 20));
		memcpy(&orig, c.shadow + GUARD + 256, 8);
		CHECK(iwarp_get64(f + 24) == orig - 5, "original value");
		expect_memory(&c);
		expect_qp_rts(&c);
		break;
	}
	case K_STRAY_SEGMENT: {
		/* RFC 5041: an MO that continues no message is invalid: a
		 * TERMINATE before the proper Send, so nothing lands and the
		 * posted receive is flushed. */
		static uint8_t f[70000];
		uint32_t flen;
		int r = next_fpdu(c.fd, &in, c.crc, f, &flen, WAIT_MS);
		uint32_t ctrl = r == GOT_FPDU ? iwarp_get32(f + 2 + 18) : 0;

		CHECK(r == GOT_FPDU && (f[3] & RDMAP_OPCODE_MASK) == RDMAP_TERMINATE &&
			      TERM_LAYER(ctrl) == TERM_LAYER_DDP &&
			      TERM_ETYPE(ctrl) == TERM_DDP_ET_UNTAGGED &&
			      TERM_ECODE(ctrl) == TERM_DDP_EC_U_INV_MO,
		      "%s: no invalid-MO TERMINATE (%d, %s/%u/%#x)", hc->name, r,
		      layer_str(TERM_LAYER(ctrl)), TERM_ETYPE(ctrl), TERM_ECODE(ctrl));
		expect_qp_err(&c, true);
		if (t_poll_one(c.r.recv_cq, &wc, WAIT_MS, "the flushed receive"))
			CHECK(wc.wr_id == 1 && wc.status == IBV_WC_WR_FLUSH_ERR,
			      "%s: receive %s", hc->name, t_wc_status_str(wc.status));
		for (int i = 0; i < 32; i++) /* the proper Send did not land */
			c.shadow[GUARD + 256 + i] = t_pattern_byte(256 + i, 7);
		expect_memory(&c);
		break;
	}
	case K_FLUSH_FLOOD_T0: {
		/* Up to 1.5 million flushes (78 MB), until the QP gives up */
		int sent = 0, st = t_qp_state(c.r.qp);

		o.len = 0;
		for (int i = 0; i < 1500000 && st != IBV_QPS_ERR; i++) {
			if (o.len + 64 > sizeof(o.b)) {
				if (!send_all(c.fd, o.b, o.len))
					break;
				o.len = 0;
				st = t_qp_state(c.r.qp);
			}
			n = read_req(h, (uint32_t)i, 0x77, 0, 0, 0, 0);
			fpdu(&o, c.crc, h, n, NULL, 0);
			sent++;
		}
		t_note("%s: %d flushes sent, answers not read; the real QP is %s", hc->name,
		       sent, t_qp_state_str(st));
		expect_qp_err(&c, false);
		break;
	}
	case K_READ_FLOOD:
	case K_READ_FLOOD_T0: {
		/* 2000 Read Requests of the whole region: 8 MiB of responses */
		int sent = 0;
		uint64_t t0;
		o.len = 0;
		for (int i = 0; i < 2000; i++) {
			if (o.len + 64 > sizeof(o.b)) {
				if (!send_all(c.fd, o.b, o.len))
					break;
				o.len = 0;
			}
			n = read_req(h, i, 0x77, 0, REGION, c.mr->rkey, base);
			fpdu(&o, c.crc, h, n, NULL, 0);
			sent++;
		}
		if (o.len && !send_all(c.fd, o.b, o.len))
			sent -= (int)(o.len / 52);
		t_note("%s: %d Read Requests sent; not reading the responses", hc->name, sent);
		t_sleep_ms(1500);
		t_note("%s: the real QP is %s", hc->name, t_qp_state_str(t_qp_state(c.r.qp)));
		/* The QP's owner gives up on it: this must not wait for the
		 * peer to read.  In a thread, so that a hang is measured: if it
		 * does not return in 3 s, the test closes its socket (which
		 * breaks any wait on the stream) and reports the hang. */
		struct destroyer d = {.qp = c.r.qp};
		pthread_t th;
		t0 = t_now_ms();
		REQUIRE(pthread_create(&th, NULL, destroy_thread, &d) == 0, "pthread_create");
		while (!atomic_load(&d.done) && t_now_ms() - t0 < 3000)
			t_sleep_ms(5);
		bool hung = !atomic_load(&d.done);
		if (hung) {
			close(c.fd);
			c.fd = -1;
			while (!atomic_load(&d.done) && t_now_ms() - t0 < 10000)
				t_sleep_ms(5);
		}
		REQUIRE(atomic_load(&d.done), "%s: ibv_destroy_qp still blocked %llu ms after "
			"the peer closed", hc->name, (unsigned long long)(t_now_ms() - t0));
		pthread_join(th, NULL);
		c.r.qp = NULL;
		CHECK(d.ret == 0, "ibv_destroy_qp: %d", d.ret);
		t_note("%s: ibv_destroy_qp took %llu ms", hc->name,
		       (unsigned long long)(d.end_ms - t0));
		CHECK(!hung, "%s: ibv_destroy_qp blocked while the peer did not read the Read "
		      "Responses (returned only after the peer closed, %llu ms)", hc->name,
		      (unsigned long long)(d.end_ms - t0));
		break;
	}
	case K_BAD_WHILE_SENDING:
		/* The real QP finds the bad Write while its sender waits for
		 * room; we read only later. */
		t_sleep_ms(200);
		expect_writes_then_terminate(&c, &in, o.b, o.len);
		pthread_join(big_th, NULL);
		CHECK(big.ret == 0, "%s: post_send: %d", hc->name, big.ret);
		expect_wr_status(&c, 11, IBV_WC_WR_FLUSH_ERR, "the cut Write");
		expect_qp_err(&c, true);
		expect_memory(&c);
		break;
	case K_STALL_FLOOD_QP_ERR: {
		/* Fill the stream until a send waits 300 ms for room. */
		size_t filled;
		bool full = send_junk(c.fd, 64u << 20, 300, &filled) == EAGAIN;

		t_note("%s: the stream took %zu bytes and is %s", hc->name, filled,
		       full ? "full" : "not full");
		CHECK(full, "%s: the stream never filled: the real QP read past a Send "
		      "with no receive posted", hc->name);
		REQUIRE(t_modify_state(c.r.qp, IBV_QPS_ERR) == 0, "modify to ERR");
		expect_sends_not_blocked(&c);
		expect_memory(&c);
		break;
	}
	case K_TRUNCATED_CLOSE:
		/* The unconfirmed Write fails with RETRY_EXC_ERR, the QP enters
		 * ERR. */
		expect_wr_status(&c, 9, IBV_WC_RETRY_EXC_ERR, "the unconfirmed Write");
		expect_qp_err(&c, false);
		expect_memory(&c);
		break;
	case K_TRUNCATED_HDR_CLOSE: {
		/* Idle: the QP keeps its state; its next WR fails. */
		t_sleep_ms(300);
		int st = t_qp_state(c.r.qp);
		t_note("%s: idle QP is %s 300 ms after the peer closed", hc->name,
		       t_qp_state_str(st));
		CHECK(st == IBV_QPS_RTS, "%s: the idle QP is %s, wanted RTS", hc->name,
		      t_qp_state_str(st));
		REQUIRE(t_post_send(c.r.qp, 9, IBV_WR_RDMA_WRITE, c.region, 16, c.mr->lkey,
				    IBV_SEND_SIGNALED, 0x1000, 0x99) == 0 ||
				st == IBV_QPS_ERR,
			"post_send");
		if (t_poll_one(c.r.send_cq, &wc, WAIT_MS, "a Write after the peer closed")) {
			t_note("%s: the Write completed %s", hc->name, t_wc_status_str(wc.status));
			CHECK(wc.wr_id == 9 && (wc.status == IBV_WC_RETRY_EXC_ERR ||
						wc.status == IBV_WC_WR_FLUSH_ERR),
			      "%s: the Write completed %s", hc->name, t_wc_status_str(wc.status));
		}
		expect_qp_err(&c, false);
		expect_memory(&c);
		break;
	}
	default:
		if (hc->kind == K_BAD_THEN_FLOOD)
			expect_sends_not_blocked(&c);
		if (!closed)
			expect_reply(&c, &in, o.b + first_at, o.len - first_at);
		if (hc->qp_err)
			expect_qp_err(&c, true);
		expect_memory(&c);
		if (hc->kind == K_TERM_THEN_FLOOD)
			expect_sends_not_blocked(&c);
		if (hc->kind == K_SEND_TOO_LONG || hc->kind == K_BAD_MSN) {
			if (t_poll_one(c.r.recv_cq, &wc, WAIT_MS, "the receive")) {
				t_note("%s: receive completed %s, %u bytes", hc->name,
				       t_wc_status_str(wc.status), wc.byte_len);
				CHECK(wc.status == (hc->kind == K_SEND_TOO_LONG ?
							    IBV_WC_LOC_LEN_ERR :
							    IBV_WC_WR_FLUSH_ERR),
				      "%s: receive status %s", hc->name,
				      t_wc_status_str(wc.status));
			}
		}
		break;
	}
	if (c.r.qp)
		CHECK(t_cq_drain(c.r.send_cq, NULL, 0, 20) == 0, "%s: unexpected completions",
		      hc->name);
	teardown(&c);
}

/* ------------------------------------------------------------------ */
/* A crowd at the listener                                            */
/* ------------------------------------------------------------------ */

#define CROWD_SILENT 100
#define CROWD_TALKING 200

static int connect_port(uint16_t port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons(port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	REQUIRE(fd >= 0, "socket: %s", strerror(errno));
	REQUIRE(!connect(fd, (struct sockaddr *)&sa, sizeof(sa)), "connect to %u: %s",
		port, strerror(errno));
	return fd;
}

/* Hundreds of connections at a QP's listener at once, as when hundreds of
 * QPs connect together: first CROWD_SILENT that never send a byte, then
 * CROWD_TALKING that all connect before any sends its MPA Request (naming
 * no QP).  Every talking one gets its answer (a reject), none a bare
 * close: connections past the listener's bound wait in the kernel's
 * backlog rather than push out those accepted, and silent ones make way
 * once they have had their time.  Before, each arrival closed the oldest
 * past 64, and 1,000 QPs connecting at once could do so forever. */
static void mpa_crowd_case(void *arg)
{
	static int silent[CROWD_SILENT], talking[CROWD_TALKING];
	struct t_opts o = t_opts_default();
	struct urdma_mpa_pd pd;
	struct mpa_frame f;
	struct t_res r;
	int answered = 0, cut = 0, silent_closed = 0;
	(void)arg;

	o.create_qp = true;
	t_res_open(&r, &o);
	uint32_t qpn = r.qp->qp_num;
	uint16_t port = (uint16_t)(qpn >> 8);

	for (int i = 0; i < CROWD_SILENT; i++)
		silent[i] = connect_port(port);
	for (int i = 0; i < CROWD_TALKING; i++)
		talking[i] = connect_port(port);
	for (int i = 0; i < CROWD_TALKING; i++) {
		fill_pd(&pd, 0x100 | (uint32_t)i, qpn ^ 0x80);
		/* a send to a connection already closed: EPIPE, counted below */
		struct {
			struct mpa_frame f;
			struct urdma_mpa_pd pd;
		} __attribute__((packed)) m = {.pd = pd};
		memcpy(m.f.key, MPA_KEY_REQ, MPA_KEY_LEN);
		m.f.rev = MPA_REVISION;
		m.f.pd_len = htons(sizeof(pd));
		send(talking[i], &m, sizeof(m), MSG_NOSIGNAL);
	}
	for (int i = 0; i < CROWD_TALKING; i++) {
		if (recv_exact(talking[i], &f, sizeof(f), WAIT_MS) &&
		    !memcmp(f.key, MPA_KEY_REP, MPA_KEY_LEN) && (f.flags & MPA_FLAG_R))
			answered++;
		else
			cut++;
		close(talking[i]);
	}
	for (int i = 0; i < CROWD_SILENT; i++) {
		struct pollfd pf = {.fd = silent[i], .events = POLLIN};
		char b;

		if (poll(&pf, 1, 0) == 1 && recv(silent[i], &b, 1, MSG_DONTWAIT) <= 0)
			silent_closed++;
		close(silent[i]);
	}
	t_note("%d talking connections answered, %d cut; %d of %d silent ones closed",
	       answered, cut, silent_closed, CROWD_SILENT);
	CHECK(answered == CROWD_TALKING, "%d of %d connections got no answer", cut,
	      CROWD_TALKING);
	CHECK(silent_closed >= CROWD_SILENT - 64,
	      "only %d silent connections were closed: the rest hold the listener",
	      silent_closed);
	t_res_close(&r);
}

int main(int argc, char **argv)
{
	/* Before any device is opened, in this process and the case processes. */
	setenv("URDMA_TRANSPORT", "tcp", 1);
	t_init(argc, argv);
	t_set_case_timeout(20);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		t_case(cases[i].name, hostile_case, (void *)&cases[i]);
	t_case("mpa_crowd", mpa_crowd_case, NULL);
	return t_finish();
}
