/* SPDX-License-Identifier: MIT */
/*
 * The receive parser: one FPDU from a byte buffer, checked against the
 * wire rules (lengths, versions, opcodes, queue numbers, CRC) before any
 * of it is used.  Pure: no I/O and no memory outside the buffer, so the
 * fuzzer (tests/fuzz) drives it directly.
 */
#ifndef URDMA_IWARP_PARSE_H
#define URDMA_IWARP_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/tcp/iwarp.h"

struct iwarp_msg {
	uint8_t opcode; /* enum rdmap_opcode */
	bool tagged;
	bool last; /* DDP L flag */
	/* tagged; untagged: the Invalidate STag of a Send with Invalidate */
	uint32_t stag;
	uint64_t to;
	/* untagged */
	uint32_t qn, msn, mo;
	/* the DDP+RDMAP header as received, for a Terminate */
	const uint8_t *hdr;
	uint32_t hdr_len;
	/* the data after the headers (Send, Write, Read Response; for a
	 * Terminate, its whole body) */
	const uint8_t *payload;
	uint32_t len;
	/* opcode-specific header fields, in host order */
	union {
		struct rdmap_read_req rr;
		struct rdmap_atomic_req areq;
		struct rdmap_atomic_resp aresp;
		struct rdmap_imm imm;
		uint32_t term_ctrl;
	} u;
};

/*
 * Parse the FPDU at the start of buf.  Returns its length on the wire when
 * it is complete and valid; 0 when more bytes are needed; -1 when it is
 * malformed, with *term set to the Terminate control word to send.
 */
long iwarp_parse_fpdu(const uint8_t *buf, size_t avail, bool crc,
		      struct iwarp_msg *m, uint32_t *term);

#endif
