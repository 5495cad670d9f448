// SPDX-License-Identifier: MIT
/*
 * The TCP transport's receive path and placement: reading the stream,
 * parsing FPDUs (iwarp_parse.c), checking STags and bounds, placing Writes
 * and Read Responses into registered memory (Sends into receive WRs:
 * tcp_recv.c), answering Reads and atomics; and the QP side of an error (unconfirmed
 * WRs settled, a Terminate framed).  Received FPDUs are processed by
 * whoever gets conn->rx_lock first: ibv_poll_cq (so a polling application
 * needs no thread switch) or the progress thread (epoll on the socket, so
 * one-sided operations need nothing from the target application).  The
 * receive path never waits for sq_lock.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transport/tcp/crc32c.h"
#include "transport/tcp/iwarp_parse.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/log.h"
#include "transport/tcp/tcp.h"

/* ---- the QP side of an error ---- */

/* Ask the progress thread to put the QP in error (never wait for sq_lock
 * on the receive path). */
static void qp_error_async(struct tcp_conn *c)
{
	if (c->qp)
		atomic_store(&c->qp->shm->error_req, 1);
	urdma_progress_kick();
}

/* Unconfirmed messages, under ord_lock. */
bool unc_alloc(struct tcp_conn *c, struct urdma_qp *qp)
{
	/* a message and its flush per WR; overdue probes use what is left */
	c->unc_size = roundup_pow2(2 * qp->sq_size + 16);
	c->unc = urdma_zalloc_array(c->unc_size, sizeof(*c->unc));
	return c->unc != NULL;
}

struct tcp_unc *unc_push(struct tcp_conn *c, uint32_t wr_idx,
				uint8_t kind, uint32_t msn)
{
	struct tcp_unc *u = &c->unc[c->unc_tail++ & (c->unc_size - 1)];

	*u = (struct tcp_unc){ .wr_idx = wr_idx, .kind = kind, .msn = msn };
	return u;
}

/* Report the unconfirmed messages up to position f: those before it done,
 * f itself with st.  If st is an error, those after f are flushed and the
 * outstanding Reads forgotten.  Takes ord_lock. */
void unc_settle(struct tcp_conn *c, uint32_t f, enum ibv_wc_status st)
{
	struct urdma_qp *qp = c->qp;
	bool any = false;

	uint32_t fwr = 0;

	pthread_mutex_lock(&c->ord_lock);
	for (uint32_t i = c->unc_head; i != c->unc_tail && i != f + 1; i++) {
		struct tcp_unc *u = &c->unc[i & (c->unc_size - 1)];

		urdma_qp_wr_mark(qp, u->wr_idx, i == f ? st : IBV_WC_SUCCESS);
		fwr = u->wr_idx;
		c->unc_head = i + 1;
		any = true;
	}
	if (st != IBV_WC_SUCCESS) {
		for (uint32_t i = c->unc_head; i != c->unc_tail; i++) {
			struct tcp_unc *u = &c->unc[i & (c->unc_size - 1)];

			if (u->wr_idx != fwr) /* not f's own flush Read */
				urdma_qp_wr_mark(qp, u->wr_idx,
						 IBV_WC_WR_FLUSH_ERR);
			any = true;
		}
		c->unc_head = c->unc_tail;
		for (int i = 0; i < URDMA_MAX_RD_ATOM; i++)
			c->ord[i].used = false;
	}
	pthread_mutex_unlock(&c->ord_lock);
	if (any)
		urdma_qp_wr_kick(qp);
}

/* The position of the response-bearing message with this tag, or tail. */
static uint32_t unc_find_tag(struct tcp_conn *c, uint32_t tag)
{
	uint32_t i;

	pthread_mutex_lock(&c->ord_lock);
	for (i = c->unc_head; i != c->unc_tail; i++) {
		struct tcp_unc *u = &c->unc[i & (c->unc_size - 1)];

		if (u->kind >= K_READ && u->tag == tag)
			break;
	}
	pthread_mutex_unlock(&c->ord_lock);
	return i;
}

/* Which message a Terminate names, from the DDP header it carries. */
static uint32_t unc_find_hdr(struct tcp_conn *c, const uint8_t *h, size_t len)
{
	uint32_t i, stag, qn, msn;
	uint64_t to;

	if (len < sizeof(struct ddp_tagged_hdr))
		return c->unc_head;
	stag = iwarp_get32(h + 2); /* tagged: STag, TO */
	to = iwarp_get64(h + 6);
	qn = iwarp_get32(h + 6); /* untagged: QN, MSN */
	msn = iwarp_get32(h + 10);
	pthread_mutex_lock(&c->ord_lock);
	for (i = c->unc_head; i != c->unc_tail; i++) {
		struct tcp_unc *u = &c->unc[i & (c->unc_size - 1)];

		if (h[0] & DDP_FLAG_T) {
			if (u->kind == K_WRITE && u->stag == stag &&
			    to - u->to <= u->len)
				break;
		} else if (len >= sizeof(struct ddp_untagged_hdr) &&
			   u->msn == msn &&
			   ((qn == DDP_QN_SEND &&
			     (u->kind == K_SEND || u->kind == K_WRITE)) ||
			    (qn == DDP_QN_READ &&
			     (u->kind == K_READ || u->kind == K_FLUSH)) ||
			    (qn == DDP_QN_ATOMIC_REQ && u->kind == K_ATOMIC))) {
			break;
		}
	}
	if (i == c->unc_tail)
		i = c->unc_head;
	pthread_mutex_unlock(&c->ord_lock);
	return i;
}

/* Drop what has arrived (a stream we gave up on). */
static void rx_discard(struct tcp_conn *c)
{
	while (recv(c->fd, NULL, 1u << 30, MSG_DONTWAIT | MSG_TRUNC) > 0)
		;
}

/*
 * End a stream we give up on: a FIN after what we queued (a Terminate, the
 * answers the peer earned), once no FPDU is half sent (tx_fin: a sender in
 * the middle of one finishes it first, tx_all), and from now on whatever
 * arrives is dropped (rx_pass), the stream unparked so that the progress
 * thread sees it.  A peer that keeps sending is not left waiting for room
 * until our QP is destroyed, and it still reads our Terminate before the
 * end of the stream (a reset could overtake it).  Under rx_lock.
 */
void conn_shut(struct tcp_conn *c)
{
	c->shut = true;
	atomic_store(&c->fin_want, true);
	tx_fin(c);
	conn_park(c, false);
	rx_discard(c);
}

/* Terminate the stream for an error in what we received. */
static void rx_fail(struct tcp_conn *c, uint32_t ctrl, const uint8_t *hdr,
		    uint32_t hdr_len)
{
	/* The Terminate and the stream's end first: a sender that gives up
	 * from now on (dead, or the QP in error) ends its FPDU for them
	 * (tx_all).  Then the QP's error: the WRs flushed below do not put
	 * it in ERR without its event (sq_run).  Then dead. */
	term_frame(c, ctrl, hdr, hdr_len);
	atomic_store(&c->fin_want, true);
	qp_error_async(c);
	c->dead_handled = true;
	atomic_store(&c->dead_reported, true);
	conn_set_dead(c, "protocol error in received data");
	conn_shut(c);
	unc_settle(c, c->unc_head, IBV_WC_WR_FLUSH_ERR);
}

/* ---- receiving ---- */

/*
 * A receive completed: noted here, and its armed CQ notified at the end
 * of the pass (rx_locked: rq_notify), once what came with it is handled.
 * The flush Read behind a Send is then queued as a response before the
 * application learns of the Send, so its answer carries the response
 * first (tcp_tx) and the peer completes its Send before it sees the
 * answer, as with a NIC's acknowledgement (perftest -e waits for the two
 * on one channel).
 */
void rq_note(struct tcp_conn *c, bool solicited)
{
	c->note = true;
	c->note_solicited |= solicited;
}

static void rq_notify(struct tcp_conn *c)
{
	bool solicited = c->note_solicited;

	if (!c->note)
		return;
	c->note = c->note_solicited = false;
	if (c->qp && urdma_rq_notify_claim(&c->qp->rcq->shm->notify,
					   solicited))
		urdma_qp_notify_recv(c->qp);
}

/* Enter our own receive ring as its deliverer, as the shm requester enters
 * a peer's.  false: the QP no longer receives. */
bool rq_enter(struct urdma_qp *qp)
{
	urdma_rq_busy(qp->shm);
	if (atomic_load(&qp->shm->state) == URDMA_SQPS_RTR)
		return true;
	urdma_rq_idle(qp->shm);
	return false;
}

/* Copy len bytes into spans (of peer's memory; NULL: ours) at byte
 * offset off. */
int spans_put(struct urdma_peer *peer, const struct urdma_span *sp, int n,
	      uint64_t off, const uint8_t *src, uint64_t len)
{
	struct urdma_span d[URDMA_MAX_SGE];
	struct urdma_span s = { .len = len, .ptr = (uint8_t *)src };
	int k = 0;

	for (int i = 0; i < n; i++) {
		if (off >= sp[i].len) {
			off -= sp[i].len;
			continue;
		}
		d[k] = sp[i];
		d[k].va += off;
		d[k].len -= off;
		if (d[k].ptr)
			d[k].ptr += off;
		off = 0;
		k++;
	}
	return urdma_copy_spans(peer, d, k, NULL, &s, 1, len);
}

static uint32_t lookup_term(int err, bool tagged)
{
	switch (err) {
	case -EINVAL:
		return tagged ? term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED,
					  TERM_DDP_EC_T_INV_STAG, TERM_HDRCT_D) :
				term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT,
					  TERM_RDMAP_EC_INV_STAG, TERM_HDRCT_D);
	case -ERANGE:
		return tagged ? term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED,
					  TERM_DDP_EC_T_BOUNDS, TERM_HDRCT_D) :
				term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT,
					  TERM_RDMAP_EC_BOUNDS, TERM_HDRCT_D);
	case -EACCES:
		return term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT,
				 TERM_RDMAP_EC_ACCESS, TERM_HDRCT_D);
	default:
		return term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_CATASTROPHIC,
				 TERM_RDMAP_EC_UNSPEC, TERM_HDRCT_D);
	}
}

/* Resolve [to, to+len) of one of our MRs for a remote access. */
static int remote_access(struct tcp_conn *c, uint32_t stag, uint64_t to,
			 uint64_t len, uint32_t access, struct urdma_span *sp)
{
	struct urdma_qp *qp = c->qp;
	int ret = -EACCES;
	uint32_t gen;

	if (!qp->xrcd || !len) /* (nothing touched: nothing checked) */
		return urdma_remote_lookup(qp->uctx->shm,
					   READ_ONCE(qp->attr.qp_access_flags),
					   qp->pd ? qp->pd->id : 0,
					   qp->ibqp.qp_num, stag, to, len, access,
					   sp);
	/* An XRC target: iWARP's headers have no room for the SRQ whose PD
	 * the key must be of; any XRC SRQ of its domain in its context
	 * will do (docs/wire-protocol.md).  Those PDs are kept on the
	 * connection until an XRC SRQ comes or goes (the generation). */
	gen = urdma_xsrq_gen();
	if (c->xpds_gen != gen) {
		c->nxpds = urdma_xsrq_pds(qp->xrcd->id, qp->uctx, c->xpds,
					  URDMA_XRC_PDS);
		c->xpds_gen = gen;
	}
	for (int i = 0; i < c->nxpds && ret == -EACCES; i++)
		ret = urdma_remote_lookup(qp->uctx->shm,
					  READ_ONCE(qp->attr.qp_access_flags),
					  c->xpds[i], qp->ibqp.qp_num, stag, to,
					  len, access, sp);
	return ret;
}

static int rx_write(struct tcp_conn *c, const struct iwarp_msg *m,
		    uint32_t *term)
{
	struct urdma_span d;
	int err = remote_access(c, m->stag, m->to, m->len,
				IBV_ACCESS_REMOTE_WRITE, &d);

	if (err && c->qp->ibqp.qp_type != IBV_QPT_UC) {
		*term = lookup_term(err, true);
		return RX_ERR;
	}
	if (err) { /* UC: the Write is dropped, its immediate data too */
		c->write_dropped = true;
	} else if (m->len) {
		struct urdma_span s = { .len = m->len, .ptr = (uint8_t *)m->payload };

		if (urdma_copy_spans(NULL, &d, 1, NULL, &s, 1, m->len)) {
			*term = lookup_term(-EFAULT, true);
			return RX_ERR;
		}
	}
	c->write_len += m->len;
	if (m->last) {
		c->last_write_len = c->write_len;
		c->last_write_dropped = c->write_dropped;
		c->write_len = 0;
		c->write_dropped = false;
		c->rx_writes += !c->last_write_dropped;
	}
	return RX_OK;
}

static struct tcp_ord *ord_find(struct tcp_conn *c, uint32_t tag, bool atomic)
{
	for (int i = 0; i < URDMA_MAX_RD_ATOM; i++)
		if (c->ord[i].used && c->ord[i].tag == tag &&
		    c->ord[i].atomic == atomic)
			return &c->ord[i];
	return NULL;
}

static int rx_read_resp(struct tcp_conn *c, const struct iwarp_msg *m,
			uint32_t *term)
{
	struct tcp_ord *o;
	bool done = false;
	int r = RX_OK;

	pthread_mutex_lock(&c->ord_lock);
	o = ord_find(c, m->stag, false);
	if (!o) {
		/* The response to a flush: zero-length, one segment. */
		pthread_mutex_unlock(&c->ord_lock);
		if (m->len || !m->last)
			goto bad_stag;
		goto confirm;
	}
	if (m->to != o->got || o->got + m->len > o->len) {
		*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED,
				  TERM_DDP_EC_T_BOUNDS, TERM_HDRCT_D);
		r = RX_ERR;
	} else {
		if (m->len && spans_put(NULL, o->sp, o->n, o->got, m->payload, m->len))
			r = RX_ERR, *term = lookup_term(-EFAULT, true);
		o->got += m->len;
		if (m->last && r == RX_OK) {
			if (o->got != o->len) {
				*term = term_ctrl(TERM_LAYER_DDP,
						  TERM_DDP_ET_TAGGED,
						  TERM_DDP_EC_T_BOUNDS,
						  TERM_HDRCT_D);
				r = RX_ERR;
			} else {
				o->used = false;
				done = true;
			}
		}
	}
	pthread_mutex_unlock(&c->ord_lock);
	if (!done)
		return r;
confirm: {
	uint32_t f = unc_find_tag(c, m->stag);

	if (f == c->unc_tail)
		goto bad_stag;
	unc_settle(c, f, IBV_WC_SUCCESS);
	return RX_OK;
}
bad_stag:
	*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED,
			  TERM_DDP_EC_T_INV_STAG, TERM_HDRCT_D);
	return RX_ERR;
}

static int rx_read_req(struct tcp_conn *c, const struct iwarp_msg *m,
		       uint32_t *term)
{
	const struct rdmap_read_req *rr = &m->u.rr;
	struct tcp_rsp rsp = { 0 };
	struct urdma_span src;
	int err;

	if (c->qp->ibqp.qp_type == IBV_QPT_UC) { /* UC has no Reads */
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_OPCODE, TERM_HDRCT_D);
		return RX_ERR;
	}
	err = remote_access(c, rr->src_stag, rr->src_to, rr->size,
			    IBV_ACCESS_REMOTE_READ, &src);
	if (err) {
		*term = lookup_term(err, false);
		*term |= TERM_HDRCT_R << 13;
		return RX_ERR;
	}
	c->rx_msn[DDP_QN_READ]++;
	rsp.hlen = tcp_put_tagged(rsp.hdr, RDMAP_READ_RESP, rr->sink_stag,
			      rr->sink_to);
	rsp.read = true;
	rsp.va = src.va;
	rsp.direct = src.direct;
	rsp.len = rr->size;
	/* A flush's answer waits for our next message, two quiet polls, a
	 * call to the connection manager (tcp_release) or its time (the
	 * receive pass's hold, rx_locked), so that the application sees the
	 * message before we make a system call for it.  Data goes now. */
	/* (An XRC target sends nothing of its own: the answer goes now.) */
	bool now = rr->size || c->qp->xrcd;

	if (rsp_push(c, &rsp, now ? 0 : c->rx_hold_ns)) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_UNSPEC,
				  TERM_HDRCT_D | TERM_HDRCT_R);
		return RX_ERR;
	}
	c->rx_answer |= now;
	return RX_OK;
}

static int rx_atomic_req(struct tcp_conn *c, const struct iwarp_msg *m,
			 uint32_t *term)
{
	const struct rdmap_atomic_req *a = &m->u.areq;
	struct rdmap_atomic_resp resp;
	struct tcp_rsp r = { 0 };
	struct urdma_span t;
	uint64_t orig;
	int err;

	/* We implement the verbs atomics: no masks.  UC has none. */
	if (c->qp->ibqp.qp_type == IBV_QPT_UC || a->opcode > ATOMIC_CMP_SWAP ||
	    (a->opcode == ATOMIC_FETCH_ADD && a->add_swap_mask) ||
	    (a->opcode == ATOMIC_CMP_SWAP &&
	     (~a->add_swap_mask || ~a->compare_mask))) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_OPCODE, TERM_HDRCT_D);
		return RX_ERR;
	}
	err = remote_access(c, a->stag, a->to, 8, IBV_ACCESS_REMOTE_ATOMIC,
			    &t);
	if (!err && (a->to & 7)) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_ATOMIC_ALIGN, TERM_HDRCT_D);
		return RX_ERR;
	}
	if (err) {
		*term = lookup_term(err, false);
		return RX_ERR;
	}
	if (urdma_atomic_span(NULL, c->qp->uctx->shm, &t,
			      a->opcode == ATOMIC_CMP_SWAP,
			      a->opcode == ATOMIC_CMP_SWAP ? a->compare :
							     a->add_swap,
			      a->add_swap, &orig)) {
		*term = lookup_term(-EFAULT, false);
		return RX_ERR;
	}
	c->rx_msn[DDP_QN_ATOMIC_REQ]++;
	resp.req_id = htonl(a->req_id);
	resp.orig = htobe64(orig);
	/* The atomic-response queue is ours alone: its MSN needs no
	 * tx_lock. */
	r.hlen = tcp_put_untagged(r.hdr, RDMAP_ATOMIC_RESP, DDP_QN_ATOMIC_RESP,
			      c->tx_msn[DDP_QN_ATOMIC_RESP]++);
	memcpy(r.hdr + r.hlen, &resp, sizeof(resp));
	r.hlen += sizeof(resp);
	if (rsp_push(c, &r, 0)) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_UNSPEC, TERM_HDRCT_D);
		return RX_ERR;
	}
	c->rx_answer = true;
	return RX_OK;
}

static int rx_atomic_resp(struct tcp_conn *c, const struct iwarp_msg *m,
			  uint32_t *term)
{
	struct tcp_ord *o;
	uint64_t v = m->u.aresp.orig;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	uint32_t f;

	c->rx_msn[DDP_QN_ATOMIC_RESP]++;
	pthread_mutex_lock(&c->ord_lock);
	o = ord_find(c, m->u.aresp.req_id, true);
	if (o) {
		if (spans_put(NULL, o->sp, o->n, 0, (uint8_t *)&v, 8))
			st = IBV_WC_LOC_PROT_ERR;
		o->used = false;
	}
	pthread_mutex_unlock(&c->ord_lock);
	f = o ? unc_find_tag(c, m->u.aresp.req_id) : c->unc_tail;
	if (f == c->unc_tail) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_UNSPEC, TERM_HDRCT_D);
		return RX_ERR;
	}
	unc_settle(c, f, st);
	return RX_OK;
}

/* What a Terminate from the peer means for our WR. */
static enum ibv_wc_status term_status(uint32_t ctrl)
{
	unsigned layer = TERM_LAYER(ctrl), et = TERM_ETYPE(ctrl),
		 ec = TERM_ECODE(ctrl);

	if (layer == TERM_LAYER_RDMAP && et == TERM_RDMAP_ET_PROT)
		return IBV_WC_REM_ACCESS_ERR;
	if (layer == TERM_LAYER_DDP && et == TERM_DDP_ET_TAGGED)
		return IBV_WC_REM_ACCESS_ERR;
	if (layer == TERM_LAYER_DDP && et == TERM_DDP_ET_UNTAGGED &&
	    (ec == TERM_DDP_EC_U_TOO_LONG || ec == TERM_DDP_EC_U_INV_QN))
		return IBV_WC_REM_INV_REQ_ERR;
	if (layer == TERM_LAYER_RDMAP && et == TERM_RDMAP_ET_OP &&
	    (ec == TERM_RDMAP_EC_OPCODE || ec == TERM_RDMAP_EC_VERSION ||
	     ec == TERM_RDMAP_EC_ATOMIC_ALIGN))
		return IBV_WC_REM_INV_REQ_ERR;
	return IBV_WC_REM_OP_ERR;
}

static void rx_terminate(struct tcp_conn *c, const struct iwarp_msg *m)
{
	uint32_t ctrl = m->u.term_ctrl;

	urdma_info("tcp: qp %#x: TERMINATE from the peer (layer %u type %u code %#x)",
		   c->local_qpn, TERM_LAYER(ctrl), TERM_ETYPE(ctrl),
		   TERM_ECODE(ctrl));
	c->dead_handled = true; /* before tcp_maintain can see 'dead' */
	atomic_store(&c->dead_reported, true);
	conn_set_dead(c, "terminated by the peer");
	/* ctrl, DDP segment length, then the DDP header if included */
	unc_settle(c,
		   (ctrl >> 13 & TERM_HDRCT_D) && m->len > 6 ?
			   unc_find_hdr(c, m->payload + 6, m->len - 6) :
			   c->unc_head,
		   term_status(ctrl));
	/* UC: the requester hears nothing of the responder's errors; what
	 * it sends from now on is dropped (tcp_execute). */
	if (c->qp && c->qp->ibqp.qp_type != IBV_QPT_UC)
		qp_error_async(c);
}

static int rx_msg(struct tcp_conn *c, const struct iwarp_msg *m,
		  uint32_t *term)
{
	/* Untagged messages come in order on their queue (a Terminate is
	 * taken whatever its MSN). */
	if (!m->tagged && m->opcode != RDMAP_TERMINATE &&
	    m->msn != c->rx_msn[m->qn]) {
		*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED,
				  TERM_DDP_EC_U_INV_MSN, TERM_HDRCT_D);
		return RX_ERR;
	}
	switch (m->opcode) {
	case RDMAP_SEND:
	case RDMAP_SEND_SE:
	case RDMAP_SEND_INV:
	case RDMAP_SEND_SE_INV:
		return rx_send(c, m, term);
	case RDMAP_IMM:
	case RDMAP_IMM_SE:
		return rx_imm(c, m, term);
	case RDMAP_WRITE:
		return rx_write(c, m, term);
	case RDMAP_READ_REQ:
		return rx_read_req(c, m, term);
	case RDMAP_READ_RESP:
		return rx_read_resp(c, m, term);
	case RDMAP_ATOMIC_REQ:
		return rx_atomic_req(c, m, term);
	case RDMAP_ATOMIC_RESP:
		return rx_atomic_resp(c, m, term);
	case RDMAP_TERMINATE:
		rx_terminate(c, m);
		return RX_OK;
	default:
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_OPCODE, TERM_HDRCT_D);
		return RX_ERR;
	}
}

/* The connection whose receive path this thread runs: a WR that a
 * completion lets the engine run from there must not send (tcp_execute),
 * as it could wait for room while nobody reads. */
__thread struct tcp_conn *rx_owner;


static void rx_pass(struct tcp_conn *c);

/* Send the answers due now that this pass queued (Read Responses with
 * data, atomic responses): the Requests that came in one read are
 * answered together, in as few writes as the socket takes (rsp_step),
 * not a system call each. */
static void rx_answers(struct tcp_conn *c)
{
	if (c->rx_answer) {
		c->rx_answer = false;
		rsp_send(c);
	}
}

/* Process what has arrived, holding answers for hold_ns.  Under rx_lock,
 * state C_UP. */
void rx_locked(struct tcp_conn *c, uint64_t hold_ns)
{
	struct tcp_conn *outer = rx_owner;

	rx_owner = c;
	c->rx_hold_ns = hold_ns;
	rx_pass(c);
	rx_answers(c);
	rq_notify(c);
	rx_owner = outer;
}

static void rx_pass(struct tcp_conn *c)
{
	uint32_t st;

	if (c->closing || !c->qp)
		return;
	if (c->shut) {
		rx_discard(c);
		return;
	}
	st = atomic_load(&c->qp->shm->state);
	if (st == URDMA_SQPS_INIT) {
		/* Connected before our modify to RTR finished: wait for it. */
		atomic_store(&c->stalled, true);
		return;
	}
	if (st != URDMA_SQPS_RTR)
		return; /* in error: tcp_maintain closes the stream */
	atomic_store(&c->stalled, false);
	for (bool more = true;;) {
		size_t off = 0, room;
		ssize_t k;

		while (off < c->rlen && !atomic_load(&c->dead)) {
			struct iwarp_msg m;
			uint32_t term = 0;
			long n = iwarp_parse_fpdu(c->rbuf + off, c->rlen - off,
						  c->crc, &m, &term);
			int r;

			if (n == 0)
				break;
			if (n < 0) {
				/* The parser has seen at least 4 bytes. */
				size_t hl = c->rbuf[off + 2] & DDP_FLAG_T ?
						    sizeof(struct ddp_tagged_hdr) :
						    sizeof(struct ddp_untagged_hdr);

				rx_answers(c); /* before the Terminate */
				rx_fail(c, term, c->rbuf + off + 2,
					c->rlen - off - 2 >= hl ? hl : 0);
				return;
			}
			r = rx_msg(c, &m, &term);
			if (r == RX_STALL) {
				atomic_store(&c->stalled, true);
				break;
			}
			if (r == RX_ERR) {
				rx_answers(c);
				rx_fail(c, term, m.hdr, m.hdr_len);
				return;
			}
			c->rx_msgs += m.last;
			off += n;
		}
		if (off) {
			memmove(c->rbuf, c->rbuf + off, c->rlen - off);
			c->rlen -= off;
		}
		/* A read that left room emptied the socket: what comes later
		 * raises a new edge for the watch, or the next poll reads it
		 * (or the unpark that follows: conn_watch). */
		if (atomic_load(&c->stalled) || atomic_load(&c->dead) || !more)
			return;
		room = RBUF_SIZE - c->rlen;
		k = recv(c->fd, c->rbuf + c->rlen, room, MSG_DONTWAIT);
		if (k > 0) {
			c->rlen += k;
			c->rx_bytes += k;
			more = (size_t)k == room;
			continue;
		}
		if (k == 0)
			conn_set_dead(c, "closed by the peer");
		else if (errno != EAGAIN && errno != EINTR)
			conn_set_dead_err(c, errno);
		return;
	}
}
