// SPDX-License-Identifier: MIT
/*
 * The TCP transport's framing: FPDUs (MPA length, DDP/RDMAP headers with
 * their offsets, pad, CRC32c) around a message's data, the headers of
 * each kind, control messages framed whole (to ride with a message, or
 * the Terminate).  No system call: tcp_tx.c writes what is framed here.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <string.h>

#include "transport/tcp/crc32c.h"
#include "transport/tcp/iwarp_parse.h"
#include "transport/transport.h"
#include "transport/tcp/tcp.h"

/* Frame one segment around hdr (the DDP/RDMAP header and any opcode
 * header) and plen payload bytes at offset off of the message: ULPDU
 * length, L flag, TO (tagged) or MO (untagged).  Returns the CRC so far;
 * the caller adds the payload's, then seg_close(). */
uint32_t seg_open(struct tcp_conn *c, struct tx_seg *s,
			 const uint8_t *hdr, uint32_t hlen, uint32_t plen,
			 uint64_t off, bool last)
{
	uint32_t ulpdu = hlen + plen;

	s->hdr[0] = ulpdu >> 8;
	s->hdr[1] = ulpdu & 0xff;
	memcpy(s->hdr + 2, hdr, hlen);
	if (last)
		s->hdr[2] |= DDP_FLAG_L;
	else
		s->hdr[2] &= ~DDP_FLAG_L;
	if (hdr[0] & DDP_FLAG_T) {
		uint64_t to;

		memcpy(&to, hdr + 6, 8);
		to = htobe64(be64toh(to) + off);
		memcpy(s->hdr + 2 + 6, &to, 8);
	} else {
		uint32_t mo = htonl((uint32_t)off);

		memcpy(s->hdr + 2 + 14, &mo, 4);
	}
	s->hlen = 2 + hlen;
	s->tlen = ((4 - ((2 + ulpdu) & 3)) & 3) + 4; /* pad, CRC */
	return c->crc ? urdma_crc32c_update(~0u, s->hdr, s->hlen) : 0;
}

void seg_close(struct tcp_conn *c, struct tx_seg *s, uint32_t crc)
{
	uint32_t pad = s->tlen - 4, v;

	memset(s->trailer, 0, pad);
	if (c->crc)
		crc = urdma_crc32c_update(crc, s->trailer, pad);
	v = c->crc ? MPA_CRC_WIRE(~crc) : 0;
	memcpy(s->trailer + pad, &v, 4);
}

/*
 * Frame the next FPDUs of a message into seg and iov: hdr (DDP+RDMAP
 * header and any opcode header, hlen bytes, ULPDU length not included)
 * then len bytes from spans, cut into segments, starting at offset *off.
 * At most maxseg segments, within TX_IOV iovecs (*niov used so far);
 * fiov[k] is the first iovec of segment k, and fiov[nseg] the end.
 * Returns the segments framed (*off advanced past them; *end when the
 * message's last is among them) or -EFAULT (spans shorter than len).
 */
int tcp_frame(struct tcp_conn *c, const uint8_t *hdr, uint32_t hlen,
		 const struct urdma_span *sp, int nsp, uint64_t len,
		 uint64_t *off, bool *end, struct tx_seg *seg, int maxseg,
		 struct iovec *iov, int *niov, int *fiov)
{
	int nseg = 0;

	*end = false;
	while (nseg < maxseg && !*end) {
		uint32_t plen = len - *off > IWARP_SEG_PAYLOAD ?
					IWARP_SEG_PAYLOAD :
					(uint32_t)(len - *off);
		struct tx_seg *s = &seg[nseg];
		uint32_t crc = seg_open(c, s, hdr, hlen, plen, *off,
					*off + plen == len);
		uint64_t pos = *off, soff = pos;
		int si = 0, n = *niov;

		/* The span and offset where this segment starts. */
		while (si < nsp && soff >= sp[si].len)
			soff -= sp[si++].len;
		iov[n++] = (struct iovec){ s->hdr, s->hlen };
		for (uint32_t left = plen; left;) {
			uint64_t avail, k;
			uint8_t *p;

			while (si < nsp && soff == sp[si].len)
				si++, soff = 0;
			if (si == nsp)
				return -EFAULT;
			p = urdma_span_ptr(&sp[si], soff, &avail);
			if (!p)
				return -EFAULT;
			k = left;
			if (k > sp[si].len - soff)
				k = sp[si].len - soff;
			if (k > avail)
				k = avail;
			/* Room for this piece, the trailer and the tails
			 * (two iovecs each). */
			if (n >= TX_IOV - 1 - 2 * TX_TAILS) {
				if (nseg)
					return nseg; /* the rest next time */
				return -EFAULT;	     /* too fragmented */
			}
			iov[n++] = (struct iovec){ p, k };
			if (c->crc)
				crc = urdma_crc32c_update(crc, p, k);
			soff += k;
			left -= k;
		}
		seg_close(c, s, crc);
		iov[n++] = (struct iovec){ s->trailer, s->tlen };
		fiov[nseg++] = *niov;
		fiov[nseg] = n;
		*niov = n;
		*off = pos + plen;
		*end = *off == len;
		if (n >= TX_IOV - 3 - 2 * TX_TAILS)
			break;
	}
	return nseg;
}

uint32_t tcp_put_untagged(uint8_t *h, unsigned op, uint32_t qn,
			     uint32_t msn)
{
	return tcp_put_untagged_inv(h, op, qn, msn, 0);
}

uint32_t tcp_put_untagged_inv(uint8_t *h, unsigned op, uint32_t qn,
			      uint32_t msn, uint32_t inval_stag)
{
	struct ddp_untagged_hdr u = {
		.ddp_ctrl = DDP_VERSION,
		.rdmap_ctrl = RDMAP_VERSION << RDMAP_RV_SHIFT | op,
		.inval_stag = htonl(inval_stag),
		.qn = htonl(qn),
		.msn = htonl(msn),
	};

	memcpy(h, &u, sizeof(u));
	return sizeof(u);
}

uint32_t tcp_put_tagged(uint8_t *h, unsigned op, uint32_t stag,
			   uint64_t to)
{
	struct ddp_tagged_hdr t = {
		.ddp_ctrl = DDP_FLAG_T | DDP_VERSION,
		.rdmap_ctrl = RDMAP_VERSION << RDMAP_RV_SHIFT | op,
		.stag = htonl(stag),
		.to = htobe64(to),
	};

	memcpy(h, &t, sizeof(t));
	return sizeof(t);
}

static_assert(sizeof(struct rdmap_atomic_req) <= CTRL_BODY, "ctrl body");
uint32_t tcp_ctrl_put(struct tcp_conn *c, uint8_t *h, unsigned op,
		      uint32_t qn, const void *body, uint32_t blen, uint32_t ulp)
{
	uint32_t n = tcp_put_untagged_inv(h, op, qn, c->tx_msn[qn]++, ulp);

	memcpy(h + n, body, blen);
	return n + blen;
}

/* Frame one whole into s, for tx_msg to send with the next message
 * (tx_head, tx_tail); ulp: DDP's field reserved for the ULP (an XRC SRQ
 * number).  Under tx_lock. */
void tx_frame_ctrl(struct tcp_conn *c, struct tx_seg *s, unsigned op,
		   uint32_t qn, const void *body, uint32_t blen, uint32_t ulp)
{
	uint8_t h[sizeof(struct ddp_untagged_hdr) + CTRL_BODY];

	seg_close(c, s, seg_open(c, s, h, tcp_ctrl_put(c, h, op, qn, body, blen, ulp),
				 0, 0, true));
}

/* Frame the Terminate for the segment whose DDP header is at hdr, in the
 * receive buffer right after its ULPDU length: with D, that header
 * (hdr_len bytes, and the Read Request body after it when R is set too)
 * and, with M, the segment's length.  It goes before the FIN (tx_fin).
 * Under rx_lock, before conn_shut. */
void term_frame(struct tcp_conn *c, uint32_t ctrl, const uint8_t *hdr,
		       uint32_t hdr_len)
{
	struct rdmap_terminate t = { .ctrl = htonl(ctrl) };
	uint8_t h[sizeof(struct ddp_untagged_hdr) + sizeof(t)];
	uint32_t blen = 4, n;
	struct tx_seg s;

	if (hdr_len && (ctrl >> 13 & TERM_HDRCT_D)) {
		if (ctrl >> 13 & TERM_HDRCT_R)
			hdr_len += sizeof(struct rdmap_read_req);
		t.ctrl = htonl(ctrl | TERM_HDRCT_M << 13);
		memcpy(&t.ddp_seg_len, hdr - 2, 2);
		memcpy(t.hdr, hdr, hdr_len);
		blen = 4 + 2 + hdr_len;
	}
	n = tcp_put_untagged(h, RDMAP_TERMINATE, DDP_QN_TERM,
			 c->tx_msn[DDP_QN_TERM]++);
	memcpy(h + n, &t, blen);
	seg_close(c, &s, seg_open(c, &s, h, n + blen, 0, 0, true));
	memcpy(c->term, s.hdr, s.hlen);
	memcpy(c->term + s.hlen, s.trailer, s.tlen);
	c->term_len = s.hlen + s.tlen;
	c->term_off = 0;
	c->term_ctrl = ctrl;
}
