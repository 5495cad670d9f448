/* SPDX-License-Identifier: MIT */
/*
 * Building iWARP bytes by hand, for the tests that play a peer or feed the
 * parser (conformance/hostile.c, fuzz/fuzz_iwarp_parse.c).  The formats
 * come from src/transport/tcp/iwarp.h; the CRC32c here is a bitwise one,
 * independent of the transport's, so that a test checks it rather than
 * repeats it.  Reading fields: iwarp_get32/iwarp_get64 (iwarp.h).
 */
#ifndef URDMA_TEST_IWARP_FRAMES_H
#define URDMA_TEST_IWARP_FRAMES_H

#include <endian.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "transport/tcp/iwarp.h"

static inline uint32_t iwf_crc32c(const uint8_t *p, size_t len)
{
	uint32_t c = ~0u;

	while (len--) {
		c ^= *p++;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
	}
	return ~c;
}

static inline void iwf_put32(uint8_t *p, uint32_t v)
{
	v = htobe32(v);
	memcpy(p, &v, 4);
}

static inline void iwf_put64(uint8_t *p, uint64_t v)
{
	v = htobe64(v);
	memcpy(p, &v, 8);
}

/* A DDP/RDMAP header at h; returns its length. */
static inline uint32_t iwf_untagged(uint8_t *h, unsigned op, bool last,
				    uint32_t qn, uint32_t msn, uint32_t mo)
{
	h[0] = DDP_VERSION | (last ? DDP_FLAG_L : 0);
	h[1] = RDMAP_VERSION << RDMAP_RV_SHIFT | op;
	iwf_put32(h + 2, 0);
	iwf_put32(h + 6, qn);
	iwf_put32(h + 10, msn);
	iwf_put32(h + 14, mo);
	return sizeof(struct ddp_untagged_hdr);
}

static inline uint32_t iwf_tagged(uint8_t *h, unsigned op, bool last,
				  uint32_t stag, uint64_t to)
{
	h[0] = DDP_FLAG_T | DDP_VERSION | (last ? DDP_FLAG_L : 0);
	h[1] = RDMAP_VERSION << RDMAP_RV_SHIFT | op;
	iwf_put32(h + 2, stag);
	iwf_put64(h + 6, to);
	return sizeof(struct ddp_tagged_hdr);
}

/* One FPDU at p: hdr then plen bytes of pl, padded, with its CRC (zero
 * without crc; off by one with bad_crc).  The ULPDU_Length field says
 * ulpdu_field (normally hlen + plen).  Returns the bytes written:
 * iwarp_fpdu_len(hlen + plen). */
static inline uint32_t iwf_fpdu(uint8_t *p, uint32_t ulpdu_field, bool crc,
				bool bad_crc, const uint8_t *hdr,
				uint32_t hlen, const uint8_t *pl, uint32_t plen)
{
	uint32_t wire = iwarp_fpdu_len(hlen + plen), v;

	memset(p, 0, wire);
	p[0] = ulpdu_field >> 8;
	p[1] = ulpdu_field & 0xff;
	memcpy(p + 2, hdr, hlen);
	if (plen)
		memcpy(p + 2 + hlen, pl, plen);
	v = crc ? iwf_crc32c(p, wire - 4) ^ (bad_crc ? 1 : 0) : 0;
	v = MPA_CRC_WIRE(v);
	memcpy(p + wire - 4, &v, 4);
	return wire;
}

#endif
