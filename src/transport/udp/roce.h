/* SPDX-License-Identifier: MIT */
/*
 * The datagram wire between hosts: RoCEv2's framing of a UD Send (IBA
 * 9.2 BTH, 9.3.3 DETH, ImmDt; Annex A17) as a UDP payload, which
 * Wireshark's InfiniBand dissector decodes.  docs/wire-protocol.md has the
 * bytes, and why the last 4 are not IBA's ICRC.
 */
#ifndef URDMA_ROCE_H
#define URDMA_ROCE_H

#include <stddef.h>
#include <stdint.h>

#define ROCE_BTH 12
#define ROCE_DETH 8
#define ROCE_IMM 4
#define ROCE_ICRC 4
#define ROCE_HDR_MAX (ROCE_BTH + ROCE_DETH + ROCE_IMM)
#define ROCE_PKEY_DEFAULT 0xffff
#define ROCE_QPN_MCAST 0xffffff /* a multicast datagram's DestQP */

enum {
	ROCE_UD_SEND_ONLY = 0x64,
	ROCE_UD_SEND_ONLY_IMM = 0x65,
};

/* A UD Send as it is on the wire, or as it is to be. */
struct roce_ud {
	uint8_t opcode;
	bool solicited;
	uint32_t dest_qp, psn, qkey, src_qp;
	uint32_t imm; /* network order, as in the WR */
	const uint8_t *payload;
	uint32_t len;
};

/* Why a datagram was refused (counted per reason). */
enum roce_err {
	ROCE_OK = 0,
	ROCE_SHORT,   /* shorter than its headers */
	ROCE_OPCODE,  /* not a UD Send */
	ROCE_VERSION, /* a transport header version we don't know */
	ROCE_PKEY,    /* another partition */
	ROCE_PAD,     /* a pad count longer than the payload */
	ROCE_LONG,    /* a payload longer than the MTU */
	ROCE_CRC,     /* the trailer's CRC is wrong */
	ROCE_SRCQP,   /* a SrcQP that does not name the port it came from */
	ROCE_NERR,
};

/* Parse a UDP payload of n bytes: ROCE_OK and *m (payload points into p),
 * or why not. */
enum roce_err roce_parse(const uint8_t *p, size_t n, struct roce_ud *m);
/* The headers of m into h (ROCE_HDR_MAX bytes): their length.  pad: the
 * bytes of zeros after the payload, to a multiple of 4. */
size_t roce_build(const struct roce_ud *m, uint8_t *h, uint32_t *pad);
/* The trailer over headers, payload and pad. */
uint32_t roce_crc(const uint8_t *h, size_t hlen, const uint8_t *payload,
		  uint32_t len, uint32_t pad);

#endif
