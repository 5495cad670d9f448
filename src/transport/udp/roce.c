// SPDX-License-Identifier: MIT
/*
 * RoCEv2 UD Sends: building and parsing (roce.h).  Every byte parsed here
 * comes from the network: lengths are checked before anything is read.
 */
#include <endian.h>
#include <stdbool.h>
#include <string.h>

#include "transport/tcp/crc32c.h"
#include "transport/udp/roce.h"
#include "core/urdma.h"

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return be32toh(v);
}

static void put32(uint8_t *p, uint32_t v)
{
	v = htobe32(v);
	memcpy(p, &v, 4);
}

size_t roce_build(const struct roce_ud *m, uint8_t *h, uint32_t *pad)
{
	size_t n = ROCE_BTH + ROCE_DETH;

	*pad = (4 - (m->len & 3)) & 3;
	/* BTH: opcode; SE, M, PadCnt, TVer; P_Key; reserved, DestQP; A,
	 * reserved, PSN.  DETH: Q_Key; reserved, SrcQP. */
	h[0] = m->opcode;
	h[1] = (uint8_t)((m->solicited ? 0x80 : 0) | *pad << 4);
	h[2] = ROCE_PKEY_DEFAULT >> 8;
	h[3] = ROCE_PKEY_DEFAULT & 0xff;
	put32(h + 4, m->dest_qp & 0xffffff);
	put32(h + 8, m->psn & 0xffffff);
	put32(h + 12, m->qkey);
	put32(h + 16, m->src_qp & 0xffffff);
	if (m->opcode == ROCE_UD_SEND_ONLY_IMM) {
		memcpy(h + n, &m->imm, 4);
		n += ROCE_IMM;
	}
	return n;
}

uint32_t roce_crc(const uint8_t *h, size_t hlen, const uint8_t *payload,
		  uint32_t len, uint32_t pad)
{
	static const uint8_t zeros[4];
	uint32_t c = urdma_crc32c_update(~0u, h, hlen);

	c = urdma_crc32c_update(c, payload, len);
	return ~urdma_crc32c_update(c, zeros, pad);
}

enum roce_err roce_parse(const uint8_t *p, size_t n, struct roce_ud *m)
{
	size_t hlen = ROCE_BTH + ROCE_DETH, body;
	uint32_t pad, crc;

	if (n < hlen + ROCE_ICRC)
		return ROCE_SHORT;
	m->opcode = p[0];
	if (m->opcode != ROCE_UD_SEND_ONLY && m->opcode != ROCE_UD_SEND_ONLY_IMM)
		return ROCE_OPCODE;
	if (p[1] & 0x0f)
		return ROCE_VERSION;
	/* The default partition, full or limited member. */
	if ((((uint32_t)p[2] << 8 | p[3]) & 0x7fff) != 0x7fff)
		return ROCE_PKEY;
	m->solicited = p[1] & 0x80;
	pad = (p[1] >> 4) & 3;
	m->dest_qp = get32(p + 4) & 0xffffff;
	m->psn = get32(p + 8) & 0xffffff;
	m->qkey = get32(p + 12);
	m->src_qp = get32(p + 16) & 0xffffff;
	m->imm = 0;
	if (m->opcode == ROCE_UD_SEND_ONLY_IMM) {
		if (n < hlen + ROCE_IMM + ROCE_ICRC)
			return ROCE_SHORT;
		memcpy(&m->imm, p + hlen, 4);
		hlen += ROCE_IMM;
	}
	body = n - hlen - ROCE_ICRC;
	if (pad > body)
		return ROCE_PAD;
	if (body - pad > URDMA_UD_MTU)
		return ROCE_LONG;
	crc = get32(p + n - ROCE_ICRC);
	if (crc != ~urdma_crc32c_update(~0u, p, n - ROCE_ICRC))
		return ROCE_CRC;
	m->payload = p + hlen;
	m->len = (uint32_t)(body - pad);
	return ROCE_OK;
}
