/* SPDX-License-Identifier: MIT */
/*
 * iWARP wire formats, all in network byte order: MPA (RFC 5044), DDP
 * (RFC 5041), RDMAP (RFC 5040) and the RDMAP extensions of RFC 7306
 * (atomics, immediate data).  docs/wire-protocol.md describes how urdma
 * uses them.  Nothing else in the tree defines a wire byte.
 *
 * A connection starts with an MPA Request / Reply (markers off, CRC32c
 * negotiated, revision 1, urdma private data).  After it, the stream is a
 * sequence of FPDUs:
 *
 *   be16 ULPDU_Length | DDP/RDMAP header | payload | pad to 4 | be32 CRC
 *
 * where ULPDU_Length counts the DDP/RDMAP header and the payload, and the
 * CRC32c covers everything before it (zero when CRC is off).
 */
#ifndef URDMA_IWARP_H
#define URDMA_IWARP_H

#include <assert.h>
#include <endian.h>
#include <stdint.h>
#include <string.h>

/* Big-endian fields at any alignment. */
static inline uint32_t iwarp_get32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return be32toh(v);
}

static inline uint64_t iwarp_get64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return be64toh(v);
}

/* ---- MPA (RFC 5044 section 7) ---- */

#define MPA_KEY_REQ "MPA ID Req Frame"
#define MPA_KEY_REP "MPA ID Rep Frame"
#define MPA_KEY_LEN 16
#define MPA_FLAG_M 0x80 /* markers */
#define MPA_FLAG_C 0x40 /* CRC */
#define MPA_FLAG_R 0x20 /* reject (in a Reply) */
#define MPA_REVISION 1
#define MPA_MAX_PD 512

struct mpa_frame {
	char key[MPA_KEY_LEN];
	uint8_t flags;
	uint8_t rev;
	uint16_t pd_len; /* private data bytes that follow */
} __attribute__((packed));
static_assert(sizeof(struct mpa_frame) == 20, "MPA frame");

/* urdma's MPA private data: which QP pair the connection carries. */
#define URDMA_MPA_MAGIC 0x5552444d /* "URDM" */
#define URDMA_MPA_VERSION 1
struct urdma_mpa_pd {
	uint32_t magic;
	uint32_t version;
	uint32_t src_qpn; /* the sender's QP */
	uint32_t dst_qpn; /* the QP it wants at the other end */
	uint32_t ird;	  /* READs/atomics it will serve at once */
	uint32_t ord;	  /* READs/atomics it will issue at once */
	uint32_t reject;  /* in a Reply with R set: why (an errno value) */
} __attribute__((packed));
static_assert(sizeof(struct urdma_mpa_pd) == 28, "MPA private data");

/* ---- DDP (RFC 5041 section 4) and RDMAP (RFC 5040 section 4) ---- */

#define DDP_FLAG_T 0x80	 /* tagged buffer */
#define DDP_FLAG_L 0x40	 /* last segment of the message */
#define DDP_DV_MASK 0x03 /* DDP version */
#define DDP_VERSION 1
#define RDMAP_RV_SHIFT 6 /* RDMAP version in the top two bits */
#define RDMAP_VERSION 1
#define RDMAP_OPCODE_MASK 0x0f

enum rdmap_opcode {
	RDMAP_WRITE = 0x0,
	RDMAP_READ_REQ = 0x1,
	RDMAP_READ_RESP = 0x2,
	RDMAP_SEND = 0x3,
	RDMAP_SEND_INV = 0x4,
	RDMAP_SEND_SE = 0x5,
	RDMAP_SEND_SE_INV = 0x6,
	RDMAP_TERMINATE = 0x7,
	RDMAP_IMM = 0x8,    /* RFC 7306 Immediate Data */
	RDMAP_IMM_SE = 0x9, /* RFC 7306 Immediate Data with Solicited Event */
	RDMAP_ATOMIC_REQ = 0xa,
	RDMAP_ATOMIC_RESP = 0xb,
};

/* Untagged queues (RFC 5040 section 5.1, RFC 7306 section 8). */
enum {
	DDP_QN_SEND = 0, /* Send, Immediate Data */
	DDP_QN_READ = 1, /* RDMA Read Request */
	DDP_QN_TERM = 2, /* Terminate */
	DDP_QN_ATOMIC_REQ = 3,
	DDP_QN_ATOMIC_RESP = 4,
	DDP_NUM_QN = 5,
};

struct ddp_tagged_hdr {
	uint8_t ddp_ctrl;
	uint8_t rdmap_ctrl;
	uint32_t stag;
	uint64_t to;
} __attribute__((packed));
static_assert(sizeof(struct ddp_tagged_hdr) == 14, "tagged header");

struct ddp_untagged_hdr {
	uint8_t ddp_ctrl;
	uint8_t rdmap_ctrl;
	uint32_t inval_stag; /* RDMAP's use of DDP's reserved ULP field */
	uint32_t qn;
	uint32_t msn;
	uint32_t mo;
} __attribute__((packed));
static_assert(sizeof(struct ddp_untagged_hdr) == 18, "untagged header");

/* RDMA Read Request payload (RFC 5040 section 4.4). */
struct rdmap_read_req {
	uint32_t sink_stag;
	uint64_t sink_to;
	uint32_t size;
	uint32_t src_stag;
	uint64_t src_to;
} __attribute__((packed));
static_assert(sizeof(struct rdmap_read_req) == 28, "read request");

/* Terminate (RFC 5040 section 4.8): control word, then optionally the
 * DDP segment length and the headers of the message that caused it. */
#define TERM_LAYER_RDMAP 0x0
#define TERM_LAYER_DDP 0x1
#define TERM_LAYER_MPA 0x2
#define TERM_HDRCT_M 0x4 /* DDP segment length present */
#define TERM_HDRCT_D 0x2 /* DDP header present */
#define TERM_HDRCT_R 0x1 /* RDMAP header present */

/* layer:4 etype:4 ecode:8 hdrct:3 reserved:13 */
static inline uint32_t term_ctrl(unsigned layer, unsigned etype,
				 unsigned ecode, unsigned hdrct)
{
	return (layer & 0xf) << 28 | (etype & 0xf) << 24 |
	       (ecode & 0xff) << 16 | (hdrct & 0x7) << 13;
}
#define TERM_LAYER(c) ((c) >> 28 & 0xf)
#define TERM_ETYPE(c) ((c) >> 24 & 0xf)
#define TERM_ECODE(c) ((c) >> 16 & 0xff)

/* Error types and codes we send (RFC 5040 section 7, RFC 5041 section 7). */
enum {
	/* RDMAP layer */
	TERM_RDMAP_ET_CATASTROPHIC = 0x0,
	TERM_RDMAP_ET_PROT = 0x1, /* remote protection error */
	TERM_RDMAP_ET_OP = 0x2,	  /* remote operation error */
	TERM_RDMAP_EC_INV_STAG = 0x00,
	TERM_RDMAP_EC_BOUNDS = 0x01,
	TERM_RDMAP_EC_ACCESS = 0x02,
	TERM_RDMAP_EC_VERSION = 0x05,
	TERM_RDMAP_EC_OPCODE = 0x06,
	TERM_RDMAP_EC_UNSPEC = 0xff,
	TERM_RDMAP_EC_ATOMIC_ALIGN = 0x0a, /* ours: atomic not 8-byte aligned */
	/* DDP layer */
	TERM_DDP_ET_TAGGED = 0x1,
	TERM_DDP_ET_UNTAGGED = 0x2,
	TERM_DDP_EC_T_INV_STAG = 0x00,
	TERM_DDP_EC_T_BOUNDS = 0x01,
	TERM_DDP_EC_T_VERSION = 0x04,
	TERM_DDP_EC_U_INV_QN = 0x01,
	TERM_DDP_EC_U_NO_BUF = 0x02,
	TERM_DDP_EC_U_INV_MSN = 0x03,
	TERM_DDP_EC_U_INV_MO = 0x04,
	TERM_DDP_EC_U_TOO_LONG = 0x05,
	TERM_DDP_EC_U_VERSION = 0x06,
	/* MPA layer (LLP) */
	TERM_MPA_ET_ERR = 0x0,
	TERM_MPA_EC_CRC = 0x02,
	TERM_MPA_EC_MARKER = 0x03,
	TERM_MPA_EC_LEN = 0x04, /* invalid ULPDU length (ours) */
};

struct rdmap_terminate {
	uint32_t ctrl;
	uint16_t ddp_seg_len;
	uint8_t hdr[sizeof(struct ddp_untagged_hdr) +
		    sizeof(struct rdmap_read_req)];
} __attribute__((packed));

/* RFC 7306 section 4: Atomic Request and Response. */
enum { ATOMIC_FETCH_ADD = 0, ATOMIC_CMP_SWAP = 1 };
struct rdmap_atomic_req {
	uint32_t opcode; /* low four bits */
	uint32_t req_id;
	uint32_t stag;
	uint64_t to;
	uint64_t add_swap;
	uint64_t add_swap_mask;
	uint64_t compare;
	uint64_t compare_mask;
} __attribute__((packed));
static_assert(sizeof(struct rdmap_atomic_req) == 52, "atomic request");

struct rdmap_atomic_resp {
	uint32_t req_id;
	uint64_t orig;
} __attribute__((packed));
static_assert(sizeof(struct rdmap_atomic_resp) == 12, "atomic response");

/* RFC 7306 section 5: Immediate Data, 8 bytes.  urdma puts the 32-bit
 * verbs immediate first; the flags word says what it belongs to. */
#define URDMA_IMM_FOR_SEND 0x1 /* completes with the next Send, which
				  consumes the receive */
struct rdmap_imm {
	uint32_t imm; /* as ibv_wc.imm_data carries it */
	uint32_t flags;
} __attribute__((packed));
static_assert(sizeof(struct rdmap_imm) == 8, "immediate data");

/* The largest FPDU we send: 64 KiB of DDP payload at most per segment. */
#define IWARP_MAX_ULPDU 65535u
#define IWARP_SEG_PAYLOAD 65488u /* 65535 - 18 header, rounded to 16 */

/* The MPA CRC field carries the CRC32c value least significant byte
 * first, as iSCSI's digests do (what Wireshark's MPA dissector checks). */
#define MPA_CRC_WIRE(v) htole32(v)
#define MPA_CRC_HOST(v) le32toh(v)

static inline uint32_t iwarp_fpdu_len(uint32_t ulpdu_len)
{
	return ((2 + ulpdu_len + 3) & ~3u) + 4;
}

#endif
