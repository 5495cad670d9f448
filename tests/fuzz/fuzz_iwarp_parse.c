// SPDX-License-Identifier: MIT
/*
 * Fuzz target for the iWARP receive parser (src/transport/tcp/iwarp_parse.c).
 *
 * Input: byte 0 selects the mode (bit 0 set: the connection negotiated
 * CRC32c), the rest is a TCP byte stream as the receiver would see it.  The
 * target parses it the way rx_locked does: FPDU after FPDU, until the parser
 * wants more bytes (0) or rejects one (-1).  Every answer is checked against
 * the contract of iwarp_parse_fpdu:
 *
 *  - a length is never more than the bytes given, is a multiple of 4 and is
 *    exactly what the ULPDU_Length field says the FPDU takes on the wire;
 *  - hdr, payload and len stay inside that FPDU (before its CRC);
 *  - the header kind matches the opcode (tagged: Write / Read Response),
 *    an untagged message names its opcode's queue, control messages have
 *    the exact length of their body and MO 0;
 *  - with CRC, the FPDU's CRC is right (checked with an independent
 *    bitwise CRC32c); a rejection sets a Terminate control word of a known
 *    layer and the bits that must be zero are zero;
 *  - the answer does not depend on the bytes after the FPDU: a prefix one
 *    byte short asks for more, an exact-size copy gives the same result.
 *
 * Every parse gets its own exact-size heap copy, so ASan catches a read one
 * byte past what the parser was given.
 *
 * Built two ways:
 *  - with libFuzzer (`make fuzz`: clang -fsanitize=fuzzer,address,undefined);
 *  - with -DURDMA_FUZZ_MAIN (the ctest fuzz_iwarp_parse_replay, any
 *    compiler): a main() that replays files and directories of inputs, runs
 *    a bounded number of deterministic mutations of each, and with --gen DIR
 *    writes the seed corpus (tests/fuzz/corpus/), --check-seeds DIR checks
 *    that the committed seeds are what --gen writes.
 */
#include "transport/tcp/iwarp_parse.h"

#include <arpa/inet.h>
#include <endian.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iwarp_frames.h"
#include "fuzz.h"

static uint32_t get_crc(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return MPA_CRC_HOST(v);
}

static bool is_tagged_op(unsigned op)
{
	return op == RDMAP_WRITE || op == RDMAP_READ_RESP;
}

static int expect_qn(unsigned op)
{
	switch (op) {
	case RDMAP_READ_REQ:
		return DDP_QN_READ;
	case RDMAP_TERMINATE:
		return DDP_QN_TERM;
	case RDMAP_ATOMIC_REQ:
		return DDP_QN_ATOMIC_REQ;
	case RDMAP_ATOMIC_RESP:
		return DDP_QN_ATOMIC_RESP;
	default:
		return DDP_QN_SEND;
	}
}

/* Body bytes after the DDP header: -1 any, -2 at least 4, -3 not accepted. */
static int expect_body(unsigned op)
{
	switch (op) {
	case RDMAP_WRITE:
	case RDMAP_READ_RESP:
	case RDMAP_SEND:
	case RDMAP_SEND_SE:
	case RDMAP_SEND_INV:
	case RDMAP_SEND_SE_INV:
		return -1;
	case RDMAP_READ_REQ:
		return sizeof(struct rdmap_read_req);
	case RDMAP_TERMINATE:
		return -2;
	case RDMAP_IMM:
	case RDMAP_IMM_SE:
		return sizeof(struct rdmap_imm);
	case RDMAP_ATOMIC_REQ:
		return sizeof(struct rdmap_atomic_req);
	case RDMAP_ATOMIC_RESP:
		return sizeof(struct rdmap_atomic_resp);
	default:
		return -3;
	}
}

static volatile uint8_t sink;
/* How the parses ended (the replay main reports them). */
static unsigned long n_fpdu, n_more, n_reject;

/* One parse of an exact-size copy of buf[0, avail). */
static long parse_copy(const uint8_t *buf, size_t avail, bool crc,
		       struct iwarp_msg *m, uint32_t *term, uint8_t **copyp)
{
	uint8_t *copy = malloc(avail ? avail : 1);
	long n;

	FUZZ_ASSERT(copy, "out of memory");
	if (avail)
		memcpy(copy, buf, avail);
	memset(m, 0xa5, sizeof(*m));
	*term = 0xffffffffu;
	n = iwarp_parse_fpdu(copy, avail, crc, m, term);
	*copyp = copy;
	return n;
}

/* Check one successful parse of n bytes at b (a buffer of avail bytes). */
static void check_ok(const uint8_t *b, size_t avail, long n, bool crc,
		     const struct iwarp_msg *m)
{
	uint32_t ulpdu = (uint32_t)b[0] << 8 | b[1];
	uint32_t hlen, body;
	unsigned op = b[3] & RDMAP_OPCODE_MASK;
	int eb;

	FUZZ_ASSERT(n >= 4 && (size_t)n <= avail, "n %ld avail %zu", n, avail);
	FUZZ_ASSERT(n % 4 == 0, "n %ld not a multiple of 4", n);
	FUZZ_ASSERT((uint32_t)n == iwarp_fpdu_len(ulpdu), "n %ld ulpdu %u", n,
		    ulpdu);
	FUZZ_ASSERT((b[2] & DDP_DV_MASK) == DDP_VERSION, "DDP version %u",
		    b[2] & DDP_DV_MASK);
	FUZZ_ASSERT(b[3] >> RDMAP_RV_SHIFT == RDMAP_VERSION, "RDMAP version");
	FUZZ_ASSERT(m->opcode == op, "opcode %u vs %u", m->opcode, op);
	FUZZ_ASSERT(m->tagged == !!(b[2] & DDP_FLAG_T), "tagged");
	FUZZ_ASSERT(m->last == !!(b[2] & DDP_FLAG_L), "last");
	FUZZ_ASSERT(m->tagged == is_tagged_op(op), "op %u tagged %d", op,
		    m->tagged);
	hlen = m->tagged ? sizeof(struct ddp_tagged_hdr) :
			   sizeof(struct ddp_untagged_hdr);
	FUZZ_ASSERT(ulpdu >= hlen, "ulpdu %u < header %u", ulpdu, hlen);
	/* the header: inside the FPDU, right where it is */
	FUZZ_ASSERT(m->hdr == b + 2, "hdr at %+td", m->hdr - b);
	FUZZ_ASSERT(m->hdr_len == hlen, "hdr_len %u", m->hdr_len);
	FUZZ_ASSERT(2 + m->hdr_len <= (uint32_t)n - 4, "hdr past the CRC");
	/* the payload: inside the ULPDU */
	FUZZ_ASSERT(m->payload == b + 2 + hlen, "payload at %+td",
		    m->payload - b);
	FUZZ_ASSERT(m->len <= ulpdu - hlen, "len %u ulpdu %u", m->len, ulpdu);
	FUZZ_ASSERT(m->payload + m->len <= b + 2 + ulpdu, "payload end");
	FUZZ_ASSERT(m->payload + m->len <= b + n - 4, "payload into the CRC");
	body = ulpdu - hlen;
	eb = expect_body(op);
	FUZZ_ASSERT(eb != -3, "accepted opcode %u", op);
	if (eb >= 0) {
		FUZZ_ASSERT(body == (uint32_t)eb, "op %u body %u", op, body);
		FUZZ_ASSERT(m->len == 0, "control op %u len %u", op, m->len);
	} else if (eb == -2) {
		FUZZ_ASSERT(body >= 4 && m->len == body, "terminate body %u len %u",
			    body, m->len);
		FUZZ_ASSERT(m->u.term_ctrl == iwarp_get32(m->payload), "term ctrl");
	} else {
		FUZZ_ASSERT(m->len == body, "op %u len %u body %u", op, m->len,
			    body);
	}
	if (eb >= 0 || eb == -2)
		FUZZ_ASSERT(m->last && m->mo == 0, "control op %u: L %d MO %u",
			    op, m->last, m->mo);
	if (m->tagged) {
		FUZZ_ASSERT(m->stag == iwarp_get32(b + 4), "stag");
		FUZZ_ASSERT(m->to == ((uint64_t)iwarp_get32(b + 8) << 32 | iwarp_get32(b + 12)),
			    "to");
	} else {
		FUZZ_ASSERT(m->qn == iwarp_get32(b + 8), "qn");
		FUZZ_ASSERT(m->stag == iwarp_get32(b + 4), "invalidate stag");
		FUZZ_ASSERT(m->qn == (uint32_t)expect_qn(op), "op %u qn %u", op,
			    m->qn);
		FUZZ_ASSERT(m->msn == iwarp_get32(b + 12) && m->mo == iwarp_get32(b + 16),
			    "msn/mo");
	}
	if (op == RDMAP_READ_REQ) {
		FUZZ_ASSERT(m->u.rr.size == iwarp_get32(m->hdr + hlen + 12), "rr size");
		FUZZ_ASSERT(m->u.rr.src_stag == iwarp_get32(m->hdr + hlen + 16),
			    "rr src_stag");
	}
	if (op == RDMAP_ATOMIC_REQ)
		FUZZ_ASSERT(m->u.areq.opcode <= 0xf, "atomic opcode");
	if (crc)
		FUZZ_ASSERT(iwf_crc32c(b, n - 4) == get_crc(b + n - 4),
			    "accepted a bad CRC");
	/* Touch every byte the parser points at: ASan checks them. */
	for (uint32_t i = 0; i < m->hdr_len; i++)
		sink ^= m->hdr[i];
	for (uint32_t i = 0; i < m->len; i++)
		sink ^= m->payload[i];
}

static void check_err(const uint8_t *b, size_t avail, uint32_t term)
{
	FUZZ_ASSERT(avail >= 4, "rejected %zu bytes: cannot see a header", avail);
	FUZZ_ASSERT(term != 0xffffffffu, "-1 without a Terminate code");
	FUZZ_ASSERT(TERM_LAYER(term) <= TERM_LAYER_MPA, "layer %u",
		    TERM_LAYER(term));
	FUZZ_ASSERT((term & 0x1fff) == 0, "reserved bits %#x", term);
	if (TERM_LAYER(term) == TERM_LAYER_MPA)
		FUZZ_ASSERT(TERM_ETYPE(term) == TERM_MPA_ET_ERR &&
				    (TERM_ECODE(term) == TERM_MPA_EC_CRC ||
				     TERM_ECODE(term) == TERM_MPA_EC_LEN),
			    "MPA term %#x", term);
	(void)b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *s;
	size_t len, off = 0;
	bool crc;

	if (size < 1)
		return 0;
	crc = data[0] & 1;
	s = data + 1;
	len = size - 1;
	for (int rounds = 0; rounds < 4096; rounds++) {
		struct iwarp_msg m, m2;
		uint32_t term, term2;
		uint8_t *copy, *copy2;
		long n, n2;

		n = parse_copy(s + off, len - off, crc, &m, &term, &copy);
		if (n == 0) {
			/* Only "incomplete": fewer than 4 bytes, or fewer
			 * than the FPDU its length field announces. */
			if (len - off >= 4) {
				uint32_t ulpdu = (uint32_t)copy[0] << 8 | copy[1];

				FUZZ_ASSERT(len - off < iwarp_fpdu_len(ulpdu),
					    "0 with %zu of %u bytes", len - off,
					    iwarp_fpdu_len(ulpdu));
			}
			n_more++;
			free(copy);
			break;
		}
		if (n < 0) {
			FUZZ_ASSERT(n == -1, "returned %ld", n);
			check_err(copy, len - off, term);
			n_reject++;
			free(copy);
			break;
		}
		check_ok(copy, len - off, n, crc, &m);
		/* The same FPDU alone: the same answer, nothing read past it. */
		n2 = parse_copy(copy, n, crc, &m2, &term2, &copy2);
		FUZZ_ASSERT(n2 == n, "alone: %ld vs %ld", n2, n);
		check_ok(copy2, n, n2, crc, &m2);
		FUZZ_ASSERT(m2.len == m.len && m2.stag == m.stag && m2.to == m.to &&
				    m2.msn == m.msn && m2.mo == m.mo,
			    "alone: different fields");
		free(copy2);
		/* One byte short: the parser wants more. */
		n2 = parse_copy(copy, n - 1, crc, &m2, &term2, &copy2);
		FUZZ_ASSERT(n2 == 0, "one byte short: %ld", n2);
		free(copy2);
		free(copy);
		n_fpdu++;
		off += n;
	}
	return 0;
}

#ifdef URDMA_FUZZ_MAIN
/* ------------------------------------------------------------------ */
/* Replay, deterministic mutation, seed corpus                        */
/* ------------------------------------------------------------------ */
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

struct fpdu_buf {
	uint8_t b[70000];
	size_t len;
};

/* Append one FPDU: hdr (DDP/RDMAP header + opcode header) then payload. */
static void add_fpdu(struct fpdu_buf *f, bool crc, const uint8_t *hdr,
		     uint32_t hlen, const uint8_t *pl, uint32_t plen)
{
	if (f->len + iwarp_fpdu_len(hlen + plen) > sizeof(f->b)) {
		fprintf(stderr, "seed too long\n");
		exit(2);
	}
	f->len += iwf_fpdu(f->b + f->len, hlen + plen, crc, false, hdr, hlen,
			   pl, plen);
}

struct seed {
	const char *name;
	bool crc;
	struct fpdu_buf f;
};

static uint8_t pattern[4096];

/* The seed corpus: valid streams of each kind of message. */
static int make_seeds(struct seed *sd, int max)
{
	uint8_t h[128];
	uint32_t n;
	int k = 0;

	for (size_t i = 0; i < sizeof(pattern); i++)
		pattern[i] = (uint8_t)(i * 7 + 3);
#define NEW(nm, c)                                  \
	do {                                        \
		if (k == max)                       \
			return k;                   \
		sd[k].name = nm;                    \
		sd[k].crc = c;                      \
		sd[k].f.len = 0;                    \
	} while (0)
#define DONE() k++

	NEW("send_crc", true);
	n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 0, 0);
	add_fpdu(&sd[k].f, true, h, n, pattern, 61);
	DONE();

	NEW("send_nocrc", false);
	n = iwf_untagged(h, RDMAP_SEND_SE, true, DDP_QN_SEND, 0, 0);
	add_fpdu(&sd[k].f, false, h, n, pattern, 64);
	DONE();

	NEW("send_two_segments", true);
	n = iwf_untagged(h, RDMAP_SEND, false, DDP_QN_SEND, 0, 0);
	add_fpdu(&sd[k].f, true, h, n, pattern, 1000);
	n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 0, 1000);
	add_fpdu(&sd[k].f, true, h, n, pattern + 1000, 3);
	DONE();

	NEW("send_with_invalidate", true);
	n = iwf_untagged(h, RDMAP_SEND_SE_INV, true, DDP_QN_SEND, 0, 0);
	add_fpdu(&sd[k].f, true, h, n, pattern, 40);
	DONE();

	NEW("send_empty", true);
	n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 7, 0);
	add_fpdu(&sd[k].f, true, h, n, NULL, 0);
	DONE();

	NEW("write_crc", true);
	n = iwf_tagged(h, RDMAP_WRITE, true, 0x12345601, 0x7f0000001000ull);
	add_fpdu(&sd[k].f, true, h, n, pattern, 128);
	DONE();

	NEW("write_nocrc", false);
	n = iwf_tagged(h, RDMAP_WRITE, true, 0x12345601, 0x7f0000001000ull);
	add_fpdu(&sd[k].f, false, h, n, pattern, 5);
	DONE();

	NEW("read_req", true);
	n = iwf_untagged(h, RDMAP_READ_REQ, true, DDP_QN_READ, 0, 0);
	iwf_put32(h + n, 0x00000007);		 /* sink STag */
	iwf_put64(h + n + 4, 0);			 /* sink TO */
	iwf_put32(h + n + 12, 4096);		 /* size */
	iwf_put32(h + n + 16, 0x12345601);		 /* source STag */
	iwf_put64(h + n + 20, 0x7f0000001000ull); /* source TO */
	n += sizeof(struct rdmap_read_req);
	add_fpdu(&sd[k].f, true, h, n, NULL, 0);
	DONE();

	NEW("read_resp", true);
	n = iwf_tagged(h, RDMAP_READ_RESP, true, 7, 0);
	add_fpdu(&sd[k].f, true, h, n, pattern, 200);
	DONE();

	NEW("terminate", true);
	n = iwf_untagged(h, RDMAP_TERMINATE, true, DDP_QN_TERM, 0, 0);
	iwf_put32(h + n, term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED,
			       TERM_DDP_EC_T_INV_STAG,
			       TERM_HDRCT_D | TERM_HDRCT_M));
	h[n + 4] = 0;
	h[n + 5] = sizeof(struct ddp_tagged_hdr);
	iwf_tagged(h + n + 6, RDMAP_WRITE, true, 0xdead00, 0x1000);
	n += 6 + sizeof(struct ddp_tagged_hdr);
	add_fpdu(&sd[k].f, true, h, n, NULL, 0);
	DONE();

	NEW("terminate_short", false);
	n = iwf_untagged(h, RDMAP_TERMINATE, true, DDP_QN_TERM, 0, 0);
	iwf_put32(h + n, term_ctrl(TERM_LAYER_MPA, TERM_MPA_ET_ERR,
			       TERM_MPA_EC_CRC, 0));
	n += 4;
	add_fpdu(&sd[k].f, false, h, n, NULL, 0);
	DONE();

	NEW("atomic_fetch_add", true);
	n = iwf_untagged(h, RDMAP_ATOMIC_REQ, true, DDP_QN_ATOMIC_REQ, 0, 0);
	iwf_put32(h + n, ATOMIC_FETCH_ADD);
	iwf_put32(h + n + 4, 1);		    /* request id */
	iwf_put32(h + n + 8, 0x12345601);	    /* STag */
	iwf_put64(h + n + 12, 0x7f0000001008ull); /* TO */
	iwf_put64(h + n + 20, 5);		    /* add */
	iwf_put64(h + n + 28, 0);
	iwf_put64(h + n + 36, 0);
	iwf_put64(h + n + 44, 0);
	n += sizeof(struct rdmap_atomic_req);
	add_fpdu(&sd[k].f, true, h, n, NULL, 0);
	DONE();

	NEW("atomic_cmp_swap", true);
	n = iwf_untagged(h, RDMAP_ATOMIC_REQ, true, DDP_QN_ATOMIC_REQ, 1, 0);
	iwf_put32(h + n, ATOMIC_CMP_SWAP);
	iwf_put32(h + n + 4, 2);
	iwf_put32(h + n + 8, 0x12345601);
	iwf_put64(h + n + 12, 0x7f0000001010ull);
	iwf_put64(h + n + 20, 0x1111);
	iwf_put64(h + n + 28, ~0ull);
	iwf_put64(h + n + 36, 0x2222);
	iwf_put64(h + n + 44, ~0ull);
	n += sizeof(struct rdmap_atomic_req);
	add_fpdu(&sd[k].f, true, h, n, NULL, 0);
	DONE();

	NEW("atomic_resp", true);
	n = iwf_untagged(h, RDMAP_ATOMIC_RESP, true, DDP_QN_ATOMIC_RESP, 0, 0);
	iwf_put32(h + n, 1);
	iwf_put64(h + n + 4, 0x0102030405060708ull);
	n += sizeof(struct rdmap_atomic_resp);
	add_fpdu(&sd[k].f, true, h, n, NULL, 0);
	DONE();

	NEW("imm_then_send", true);
	n = iwf_untagged(h, RDMAP_IMM, true, DDP_QN_SEND, 0, 0);
	iwf_put32(h + n, 0xcafef00d);
	iwf_put32(h + n + 4, URDMA_IMM_FOR_SEND);
	n += sizeof(struct rdmap_imm);
	add_fpdu(&sd[k].f, true, h, n, NULL, 0);
	n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 1, 0);
	add_fpdu(&sd[k].f, true, h, n, pattern, 16);
	DONE();

	NEW("write_with_imm", true);
	n = iwf_tagged(h, RDMAP_WRITE, true, 0x12345601, 0x7f0000001000ull);
	add_fpdu(&sd[k].f, true, h, n, pattern, 32);
	n = iwf_untagged(h, RDMAP_IMM_SE, true, DDP_QN_SEND, 0, 0);
	iwf_put32(h + n, 0x01020304);
	iwf_put32(h + n + 4, 0);
	n += sizeof(struct rdmap_imm);
	add_fpdu(&sd[k].f, true, h, n, NULL, 0);
	DONE();

	/* A signaled Send as urdma sends it: the Send, then a zero-length
	 * Read (the flush), then what the peer answers it with. */
	NEW("send_flush_stream", true);
	n = iwf_untagged(h, RDMAP_SEND, true, DDP_QN_SEND, 0, 0);
	add_fpdu(&sd[k].f, true, h, n, pattern, 100);
	n = iwf_untagged(h, RDMAP_READ_REQ, true, DDP_QN_READ, 0, 0);
	memset(h + n, 0, sizeof(struct rdmap_read_req));
	iwf_put32(h + n, 1);
	n += sizeof(struct rdmap_read_req);
	add_fpdu(&sd[k].f, true, h, n, NULL, 0);
	n = iwf_tagged(h, RDMAP_READ_RESP, true, 1, 0);
	add_fpdu(&sd[k].f, true, h, n, NULL, 0);
	DONE();

	NEW("write_large", true);
	n = iwf_tagged(h, RDMAP_WRITE, false, 0x12345601, 0);
	add_fpdu(&sd[k].f, true, h, n, pattern, sizeof(pattern));
	n = iwf_tagged(h, RDMAP_WRITE, true, 0x12345601, sizeof(pattern));
	add_fpdu(&sd[k].f, true, h, n, pattern, 1);
	DONE();
#undef NEW
#undef DONE
	return k;
}

static uint8_t *seed_bytes(const struct seed *s, size_t *len)
{
	uint8_t *b = malloc(s->f.len + 1);

	if (!b)
		exit(2);
	b[0] = s->crc ? 1 : 0;
	memcpy(b + 1, s->f.b, s->f.len);
	*len = s->f.len + 1;
	return b;
}

/* A seed must parse to its end without a rejection. */
static int check_seed_parses(const struct seed *s)
{
	size_t off = 0;

	while (off < s->f.len) {
		struct iwarp_msg m;
		uint32_t term = 0;
		long n = iwarp_parse_fpdu(s->f.b + off, s->f.len - off, s->crc,
					  &m, &term);

		if (n <= 0) {
			fprintf(stderr, "seed %s: parse at %zu: %ld (term %#x)\n",
				s->name, off, n, term);
			return 1;
		}
		off += n;
	}
	return 0;
}

static struct seed seeds[32];

static int gen(const char *dir, bool check)
{
	int ns = make_seeds(seeds, 32), bad = 0;

	if (!check && mkdir(dir, 0755) && errno != EEXIST) {
		perror(dir);
		return 2;
	}
	for (int i = 0; i < ns; i++) {
		char path[4096];
		size_t len;
		uint8_t *b = seed_bytes(&seeds[i], &len);
		FILE *f;

		bad |= check_seed_parses(&seeds[i]);
		snprintf(path, sizeof(path), "%s/%s", dir, seeds[i].name);
		if (check) {
			uint8_t *have = malloc(len + 1);
			size_t got = 0;

			f = fopen(path, "rb");
			if (f) {
				got = fread(have, 1, len + 1, f);
				fclose(f);
			}
			if (!f || got != len || memcmp(have, b, len)) {
				fprintf(stderr,
					"seed %s: %s is missing or stale (run --gen %s)\n",
					seeds[i].name, path, dir);
				bad = 1;
			}
			free(have);
		} else {
			f = fopen(path, "wb");
			if (!f || fwrite(b, 1, len, f) != len || fclose(f)) {
				perror(path);
				bad = 1;
			}
		}
		free(b);
	}
	printf("%s %d seeds in %s\n", check ? "checked" : "wrote", ns, dir);
	return bad;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_rand(void)
{
	return fuzz_xorshift(&rng);
}

/* Deterministic mutations: byte flips, length-field edits, truncation,
 * fixing the CRC of the first FPDU after a change (so the checks behind
 * the CRC are reached too). */
static unsigned long mutate_run(const uint8_t *in, size_t len, int rounds)
{
	uint8_t *b = malloc(len + 64);
	unsigned long execs = 0;

	if (!b)
		exit(2);
	for (int r = 0; r < rounds; r++) {
		size_t l = len;
		int edits = 1 + next_rand() % 4;

		memcpy(b, in, len);
		for (int e = 0; e < edits && l > 1; e++) {
			size_t at = 1 + next_rand() % (l - 1);

			switch (next_rand() % 6) {
			case 0:
				b[at] ^= 1u << (next_rand() % 8);
				break;
			case 1:
				b[at] = (uint8_t)next_rand();
				break;
			case 2: /* the first FPDU's header bytes */
				b[1 + next_rand() % (l - 1 < 20 ? l - 1 : 20)] =
					(uint8_t)next_rand();
				break;
			case 3:
				l = 1 + next_rand() % (l - 1);
				break;
			case 4: /* append junk */
				for (int i = 0; i < 8; i++)
					b[l++] = (uint8_t)next_rand();
				break;
			case 5:
				b[0] ^= 1;
				break;
			}
		}
		if ((next_rand() & 1) && l >= 5) { /* re-seal the first FPDU */
			uint32_t ulpdu = (uint32_t)b[1] << 8 | b[2];
			uint32_t wire = iwarp_fpdu_len(ulpdu);

			if (1 + wire <= l) {
				uint32_t v = MPA_CRC_WIRE(iwf_crc32c(b + 1, wire - 4));

				memcpy(b + 1 + wire - 4, &v, 4);
			}
		}
		LLVMFuzzerTestOneInput(b, l);
		execs++;
	}
	free(b);
	return execs;
}

static int read_file(const char *path, uint8_t **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	size_t cap = 4096, n = 0;
	uint8_t *b;

	if (!f)
		return -1;
	b = malloc(cap);
	if (!b)
		exit(2);
	for (;;) {
		size_t k;

		if (n == cap) {
			b = realloc(b, cap *= 2);
			if (!b)
				exit(2);
		}
		k = fread(b + n, 1, cap - n, f);
		if (!k)
			break;
		n += k;
	}
	fclose(f);
	*buf = b;
	*len = n;
	return 0;
}

static unsigned long replay_one(const char *path, int rounds, int *nfiles)
{
	uint8_t *b;
	size_t len;
	unsigned long execs = 1;

	if (read_file(path, &b, &len)) {
		perror(path);
		exit(1);
	}
	LLVMFuzzerTestOneInput(b, len);
	if (rounds)
		execs += mutate_run(b, len, rounds);
	free(b);
	(*nfiles)++;
	return execs;
}

static unsigned long replay(const char *path, int rounds, int *nfiles)
{
	struct stat st;
	unsigned long execs = 0;

	if (stat(path, &st)) {
		perror(path);
		exit(1);
	}
	if (S_ISDIR(st.st_mode)) {
		struct dirent **ents;
		int n = scandir(path, &ents, NULL, alphasort);

		for (int i = 0; i < n; i++) {
			char p[4096];

			if (ents[i]->d_name[0] != '.') {
				snprintf(p, sizeof(p), "%s/%s", path,
					 ents[i]->d_name);
				execs += replay(p, rounds, nfiles);
			}
			free(ents[i]);
		}
		free(ents);
		return execs;
	}
	return replay_one(path, rounds, nfiles);
}

int main(int argc, char **argv)
{
	int rounds = 0, nfiles = 0, rc = 0;
	unsigned long execs = 0;

	if (argc < 2) {
		fprintf(stderr,
			"usage: %s [--gen DIR] [--check-seeds DIR] [--mutate N] FILE|DIR...\n",
			argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--gen") && i + 1 < argc) {
			rc |= gen(argv[++i], false);
		} else if (!strcmp(argv[i], "--check-seeds") && i + 1 < argc) {
			rc |= gen(argv[++i], true);
		} else if (!strcmp(argv[i], "--mutate") && i + 1 < argc) {
			rounds = atoi(argv[++i]);
		} else {
			execs += replay(argv[i], rounds, &nfiles);
		}
	}
	/* The in-memory seeds too, so the check does not depend on files. */
	{
		int ns = make_seeds(seeds, 32);

		for (int i = 0; i < ns; i++) {
			size_t len;
			uint8_t *b = seed_bytes(&seeds[i], &len);

			rc |= check_seed_parses(&seeds[i]);
			LLVMFuzzerTestOneInput(b, len);
			execs += 1 + mutate_run(b, len, rounds);
			free(b);
		}
	}
	printf("fuzz_iwarp_parse: %d files, %lu executions (%lu FPDUs accepted, "
	       "%lu rejected, %lu incomplete): %s\n",
	       nfiles, execs, n_fpdu, n_reject, n_more,
	       rc ? "FAILED" : "all invariants held");
	return rc;
}
#endif
