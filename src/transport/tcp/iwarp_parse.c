// SPDX-License-Identifier: MIT
#include "transport/tcp/iwarp_parse.h"

#include <string.h>

#include "transport/tcp/crc32c.h"

/* Bytes of opcode-specific header after the DDP header; -1: any length
 * (data), -2: at least 4 (Terminate). */
static int op_hdr_len(unsigned op)
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
		return -3; /* reserved */
	}
}

static int op_qn(unsigned op)
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

long iwarp_parse_fpdu(const uint8_t *buf, size_t avail, bool crc,
		      struct iwarp_msg *m, uint32_t *term)
{
	uint32_t ulpdu, hlen, wire, extra;
	uint8_t dctl, rctl;
	int oh;

	if (avail < 4)
		return 0;
	ulpdu = (uint32_t)buf[0] << 8 | buf[1];
	dctl = buf[2];
	rctl = buf[3];
	m->tagged = dctl & DDP_FLAG_T;
	m->last = dctl & DDP_FLAG_L;
	m->opcode = rctl & RDMAP_OPCODE_MASK;
	hlen = m->tagged ? sizeof(struct ddp_tagged_hdr) :
			   sizeof(struct ddp_untagged_hdr);
	if ((dctl & DDP_DV_MASK) != DDP_VERSION) {
		*term = term_ctrl(TERM_LAYER_DDP,
				  m->tagged ? TERM_DDP_ET_TAGGED :
					      TERM_DDP_ET_UNTAGGED,
				  m->tagged ? TERM_DDP_EC_T_VERSION :
					      TERM_DDP_EC_U_VERSION,
				  0);
		return -1;
	}
	if (rctl >> RDMAP_RV_SHIFT != RDMAP_VERSION) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_VERSION, 0);
		return -1;
	}
	if (ulpdu < hlen) {
		*term = term_ctrl(TERM_LAYER_MPA, TERM_MPA_ET_ERR,
				  TERM_MPA_EC_LEN, 0);
		return -1;
	}
	wire = iwarp_fpdu_len(ulpdu);
	if (avail < wire)
		return 0;
	if (crc) {
		uint32_t want;

		memcpy(&want, buf + wire - 4, 4);
		want = MPA_CRC_HOST(want);

		if (urdma_crc32c(buf, wire - 4) != want) {
			*term = term_ctrl(TERM_LAYER_MPA, TERM_MPA_ET_ERR,
					  TERM_MPA_EC_CRC, 0);
			return -1;
		}
	}
	m->hdr = buf + 2;
	m->hdr_len = hlen;
	if (m->tagged) {
		m->stag = iwarp_get32(buf + 4);
		m->to = iwarp_get64(buf + 8);
		m->qn = m->msn = m->mo = 0;
	} else {
		/* RDMAP's Invalidate STag (Send with Invalidate), in DDP's
		 * field reserved for the ULP */
		m->stag = iwarp_get32(buf + 4);
		m->to = 0;
		m->qn = iwarp_get32(buf + 8);
		m->msn = iwarp_get32(buf + 12);
		m->mo = iwarp_get32(buf + 16);
	}
	oh = op_hdr_len(m->opcode);
	/* Tagged: Write and Read Response only; untagged: all others. */
	if (oh == -3 ||
	    m->tagged != (m->opcode == RDMAP_WRITE ||
			  m->opcode == RDMAP_READ_RESP)) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_OPCODE, TERM_HDRCT_D);
		return -1;
	}
	if (!m->tagged && m->qn != (uint32_t)op_qn(m->opcode)) {
		*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED,
				  TERM_DDP_EC_U_INV_QN, TERM_HDRCT_D);
		return -1;
	}
	extra = ulpdu - hlen;
	m->payload = buf + 2 + hlen;
	m->len = extra;
	if (oh >= 0 || oh == -2) {
		/* Control messages: one segment, exact length, MO 0. */
		if ((oh >= 0 && extra != (uint32_t)oh) || (oh == -2 && extra < 4) ||
		    !m->last || m->mo) {
			*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED,
					  TERM_DDP_EC_U_INV_MO, TERM_HDRCT_D);
			return -1;
		}
		m->len = m->opcode == RDMAP_TERMINATE ? extra : 0;
	}
	switch (m->opcode) {
	case RDMAP_READ_REQ: {
		const uint8_t *p = m->payload;

		m->u.rr.sink_stag = iwarp_get32(p);
		m->u.rr.sink_to = iwarp_get64(p + 4);
		m->u.rr.size = iwarp_get32(p + 12);
		m->u.rr.src_stag = iwarp_get32(p + 16);
		m->u.rr.src_to = iwarp_get64(p + 20);
		break;
	}
	case RDMAP_ATOMIC_REQ: {
		const uint8_t *p = m->payload;

		m->u.areq.opcode = iwarp_get32(p) & 0xf;
		m->u.areq.req_id = iwarp_get32(p + 4);
		m->u.areq.stag = iwarp_get32(p + 8);
		m->u.areq.to = iwarp_get64(p + 12);
		m->u.areq.add_swap = iwarp_get64(p + 20);
		m->u.areq.add_swap_mask = iwarp_get64(p + 28);
		m->u.areq.compare = iwarp_get64(p + 36);
		m->u.areq.compare_mask = iwarp_get64(p + 44);
		break;
	}
	case RDMAP_ATOMIC_RESP:
		m->u.aresp.req_id = iwarp_get32(m->payload);
		m->u.aresp.orig = iwarp_get64(m->payload + 4);
		break;
	case RDMAP_IMM:
	case RDMAP_IMM_SE:
		memcpy(&m->u.imm.imm, m->payload, 4); /* stays in wire order */
		m->u.imm.flags = iwarp_get32(m->payload + 4);
		break;
	case RDMAP_TERMINATE:
		m->u.term_ctrl = iwarp_get32(m->payload);
		break;
	default:
		break;
	}
	return wire;
}
