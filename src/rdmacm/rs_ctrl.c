/* SPDX-License-Identifier: MIT */
/*
 * rsockets: what arrives.  Completions (data, credit updates, shutdown,
 * iomap updates), CM events that advance or end a connection, and waiting
 * for either (spinning a while, then asleep on the channels).
 */

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "rdmacm/cma.h"
#include "rdmacm/rsocket_priv.h"
#include "util/alloc.h"

/* ------------------------------------------------------------------ */
/* Completions and CM events                                          */
/* ------------------------------------------------------------------ */

static void rs_handle_ctl(struct rsocket *rs, const struct rs_msg *m,
			  uint32_t len)
{
	uint64_t freed, granted;

	if (len < sizeof(*m) || m->version != RS_PROTO_VERSION)
		return;
	freed = be64toh(m->freed);
	granted = be64toh(m->granted);
	/* counters only grow; a stale value never lowers them */
	if ((int64_t)(freed - rs->tx_freed) > 0 && (int64_t)(rs->tx_sent - freed) >= 0)
		rs->tx_freed = freed;
	if ((int64_t)(granted - rs->tx_granted) > 0)
		rs->tx_granted = granted;

	switch (m->type) {
	case RS_MSG_SHUTDOWN:
		rs->peer_shut = true;
		break;
	case RS_MSG_IOMAP: {
		uint16_t idx = be16toh(m->index);
		struct rs_iomap_peer *p;

		if (!rs->peer_iomap || idx >= rs->iomap_size)
			break;
		p = &rs->peer_iomap[idx];
		p->offset = be64toh(m->offset);
		p->addr = be64toh(m->addr);
		p->rkey = be32toh(m->rkey);
		p->len = be64toh(m->len);
		break;
	}
	default:
		break;
	}
}

/* Poll the CQ dry: data arrivals, control messages, send completions;
 * re-post the receives.  Lock held. */
void rs_poll_cq(struct rsocket *rs)
{
	struct ibv_wc wc[32];
	uint32_t repost[64];
	int n, i, nrep = 0;

	if (!rs->cq)
		return;
	while ((n = ibv_poll_cq(rs->cq, 32, wc)) > 0) {
		for (i = 0; i < n; i++) {
			struct ibv_wc *w = &wc[i];

			if (w->wr_id & RS_WR_RECV) {
				uint32_t slot = (uint32_t)(w->wr_id & 0xffffffffu);

				rs->rx_msgs++;
				if (w->status != IBV_WC_SUCCESS) {
					rs_conn_fail(rs, ECONNRESET);
					continue;
				}
				if (w->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
					uint32_t len = be32toh(w->imm_data);

					if (len <= RS_MAX_CHUNK &&
					    rs->rx_tail + len - rs->rx_head <= rs->rbuf_size)
						rs->rx_tail += len;
					else
						rs_conn_fail(rs, EPROTO);
				} else if (w->opcode == IBV_WC_RECV) {
					rs_handle_ctl(rs, (const struct rs_msg *)
						      (rs->rslots + (size_t)slot * RS_SLOT),
						      w->byte_len);
				}
				if (!rs->conn_dead && slot < (uint32_t)rs->rq_size) {
					repost[nrep++] = slot;
					if (nrep == 64) {
						if (rs_post_recv_slots(rs, repost, nrep))
							rs_conn_fail(rs, ECONNRESET);
						nrep = 0;
					}
				}
			} else if (w->status != IBV_WC_SUCCESS) {
				/* the first failure; the rest flush after it */
				rs_conn_fail(rs, ECONNRESET);
			} else {
				rs->sq_used -= (int)RS_WR_COUNT(w->wr_id);
				rs->sb_tail += RS_WR_BYTES(w->wr_id);
			}
		}
		if (n < 32)
			break;
	}
	if (n < 0)
		rs_conn_fail(rs, EIO);
	if (nrep && !rs->conn_dead && rs_post_recv_slots(rs, repost, nrep))
		rs_conn_fail(rs, ECONNRESET);
}

/* Map a failed connect event to an errno. */
static int rs_cm_errno(const struct rdma_cm_event *ev)
{
	switch (ev->event) {
	case RDMA_CM_EVENT_REJECTED:
		return ECONNREFUSED;
	case RDMA_CM_EVENT_UNREACHABLE:
		if (ev->status == -ETIMEDOUT || ev->status == ETIMEDOUT)
			return ETIMEDOUT;
		if (ev->status == -EHOSTUNREACH || ev->status == EHOSTUNREACH ||
		    ev->status == -ENETUNREACH || ev->status == ENETUNREACH)
			return EHOSTUNREACH;
		return ECONNREFUSED;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		if (ev->status < 0 && ev->status != -ETIMEDOUT)
			return -ev->status;
		return EHOSTUNREACH;
	case RDMA_CM_EVENT_CONNECT_ERROR:
		return ECONNREFUSED;
	default:
		return ECONNRESET;
	}
}

void rs_fail_connect(struct rsocket *rs, int err)
{
	rs->state = RS_FAILED;
	rs->err = err;
	rs->conn_dead = true;
}

/* A listener's event. */
void rs_listener_event(struct rsocket *rs, struct rdma_cm_event *ev)
{
	struct rdma_cm_id *id = ev->id;
	struct rs_req *r;

	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && id != rs->id) {
		bool ok = rs_conn_data_ok(ev->param.conn.private_data,
					  ev->param.conn.private_data_len);
		struct rs_conn_data cd;

		if (ok)
			memcpy(&cd, ev->param.conn.private_data, sizeof(cd));
		rdma_ack_cm_event(ev);
		r = ok && rs->req_count < (rs->backlog > 0 ? rs->backlog : 1) + 8 ?
		    urdma_zalloc(sizeof(*r)) : NULL;
		if (!r) {
			rdma_reject(id, NULL, 0);
			rdma_destroy_id(id);
			return;
		}
		r->id = id;
		r->cd = cd;
		if (rs->req_tail)
			rs->req_tail->next = r;
		else
			rs->req_head = r;
		rs->req_tail = r;
		rs->req_count++;
		return;
	}
	/* an event of a request not accepted yet: it may have died */
	for (r = rs->req_head; r; r = r->next) {
		if (r->id == id &&
		    (ev->event == RDMA_CM_EVENT_DISCONNECTED ||
		     ev->event == RDMA_CM_EVENT_REJECTED ||
		     ev->event == RDMA_CM_EVENT_CONNECT_ERROR ||
		     ev->event == RDMA_CM_EVENT_UNREACHABLE ||
		     ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL ||
		     ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT))
			r->dead = true;
	}
	rdma_ack_cm_event(ev);
}

/* An event of a connecting or connected socket. */
static void rs_conn_event(struct rsocket *rs, struct rdma_cm_event *ev)
{
	enum rdma_cm_event_type type = ev->event;
	int ret;

	switch (type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		rdma_ack_cm_event(ev);
		if (rs->state != RS_ADDR_QUERY)
			return;
		if (rdma_resolve_route(rs->id, RS_RESOLVE_MS)) {
			rs_fail_connect(rs, errno ? errno : EHOSTUNREACH);
			return;
		}
		rs->state = RS_ROUTE_QUERY;
		return;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		rdma_ack_cm_event(ev);
		if (rs->state != RS_ROUTE_QUERY)
			return;
		rs_start_connect(rs);
		return;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (rs->state == RS_CONNECTING) {
			if (!rs_conn_data_ok(ev->param.conn.private_data,
					     ev->param.conn.private_data_len)) {
				rdma_ack_cm_event(ev);
				rdma_disconnect(rs->id);
				rs->disconnected = true;
				rs_fail_connect(rs, ECONNREFUSED);
				return;
			}
			rs_save_conn_data(rs, ev->param.conn.private_data);
			rdma_ack_cm_event(ev);
			rs->state = RS_CONNECTED;
			rs->cm_next_check = urdma_now_ns() + RS_CM_CHECK_NS;
			return;
		}
		rdma_ack_cm_event(ev);
		return;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_REJECTED:
		ret = rs_cm_errno(ev);
		rdma_ack_cm_event(ev);
		if (rs->state == RS_ADDR_QUERY || rs->state == RS_ROUTE_QUERY ||
		    rs->state == RS_CONNECTING)
			rs_fail_connect(rs, ret);
		else if (rs->state == RS_CONNECTED)
			rs_conn_fail(rs, ECONNRESET);
		return;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		rdma_ack_cm_event(ev);
		if (rs->state == RS_CONNECTED) {
			/* data that arrived before the disconnect counts */
			rs_poll_cq(rs);
			rs_conn_fail(rs, ECONNRESET);
		} else if (rs->state != RS_IDLE && rs->state != RS_FAILED) {
			rs_fail_connect(rs, ECONNRESET);
		}
		return;
	default:
		rdma_ack_cm_event(ev);
		return;
	}
}

/* Drain the socket's CM channel (non-blocking).  Lock held. */
static void rs_cm_events(struct rsocket *rs)
{
	struct rdma_cm_event *ev;

	rs->cm_due = false;
	if (!rs->chan)
		return;
	while (!rdma_get_cm_event(rs->chan, &ev)) {
		if (rs->state == RS_LISTENING)
			rs_listener_event(rs, ev);
		else
			rs_conn_event(rs, ev);
	}
}

/* Everything that can be done without waiting.  Lock held. */
void rs_progress(struct rsocket *rs)
{
	if (rs->dg) {
		rs_dg_progress(rs);
	} else if (rs->state == RS_CONNECTED) {
		rs_poll_cq(rs);
		if (!rs->conn_dead) {
			rs_flush_ctl(rs);
			rs_update_credits(rs);
		}
		if (rs->cm_due || urdma_now_ns() >= rs->cm_next_check) {
			rs_cm_events(rs);
			rs->cm_next_check = urdma_now_ns() + RS_CM_CHECK_NS;
		}
	} else if (rs->state != RS_IDLE && rs->state != RS_FAILED) {
		rs_cm_events(rs);
	}
}

/* ------------------------------------------------------------------ */
/* Waiting                                                            */
/* ------------------------------------------------------------------ */

/* Consume completion events and arm the CQ.  Lock held. */
void rs_arm(struct rsocket *rs)
{
	struct ibv_cq *cq;
	void *ctx;

	if (!rs->cq)
		return;
	while (!ibv_get_cq_event(rs->cq_chan, &cq, &ctx))
		rs->cq_events++;
	if (rs->cq_events >= 16) {
		ibv_ack_cq_events(rs->cq, (unsigned)rs->cq_events);
		rs->cq_events = 0;
	}
	ibv_req_notify_cq(rs->cq, 0);
}

/* The fds a sleeper on rs waits for.  Lock held.  Returns how many. */
int rs_sleep_fds(struct rsocket *rs, struct pollfd *p)
{
	int n = 0;

	if (rs->dg)
		return rs_dg_sleep_fds(rs, p);
	if (rs->state == RS_CONNECTED && rs->cq_chan && !rs->conn_dead) {
		p[n].fd = rs->cq_chan->fd;
		p[n].events = POLLIN;
		p[n].revents = 0;
		n++;
	}
	if (rs->chan && rs->state != RS_IDLE && rs->state != RS_FAILED) {
		p[n].fd = rs->chan->fd;
		p[n].events = POLLIN;
		p[n].revents = 0;
		n++;
	}
	return n;
}

static uint64_t rs_spin_budget_ns(const struct rsocket *rs)
{
	if (rs_spin_us <= 0)
		return 0;
	if (rs->spin_miss >= 8)
		return 1000;	/* the peer is slow: a quick look only */
	return (uint64_t)rs_spin_us * 1000ull;
}

/* Wait (lock held, released while sleeping) until cond(rs).  Returns 0, or
 * -EAGAIN if nonblock and not ready, or -ETIMEDOUT after timeout_ms (<0:
 * none). */
int rs_wait(struct rsocket *rs, rs_cond_fn cond, bool nonblock,
	    int timeout_ms)
{
	uint64_t start = urdma_now_ns(), spin_end, deadline = 0;
	bool slept = false;

	if (timeout_ms >= 0)
		deadline = start + (uint64_t)timeout_ms * 1000000ull;
	spin_end = start + rs_spin_budget_ns(rs);
	for (;;) {
		struct pollfd pfd[2];
		uint64_t t;
		int n, ms;

		rs_progress(rs);
		if (cond(rs))
			break;
		if (nonblock)
			return -EAGAIN;
		t = urdma_now_ns();
		if (deadline && t >= deadline)
			return -ETIMEDOUT;
		if (t < spin_end) {
			/* let another thread of the socket in; a pause is
			 * ~140 cycles on recent x86: keep the check fine */
			pthread_mutex_unlock(&rs->lock);
			cpu_relax();
			pthread_mutex_lock(&rs->lock);
			continue;
		}
		rs_arm(rs);
		rs_progress(rs);
		if (cond(rs))
			break;
		n = rs_sleep_fds(rs, pfd);
		ms = RS_WAKE_MS;
		if (deadline) {
			uint64_t left = (deadline - t + 999999) / 1000000;

			if (left < (uint64_t)ms)
				ms = (int)left;
		}
		pthread_mutex_unlock(&rs->lock);
		if (n)
			poll(pfd, (nfds_t)n, ms);
		else
			usleep(1000);
		pthread_mutex_lock(&rs->lock);
		slept = true;
		for (int i = 0; i < n; i++)
			if (pfd[i].revents && pfd[i].fd == rs->fd)
				rs->cm_due = true; /* the CM's, or UDP socket's */
	}
	if (!slept)
		rs->spin_miss = 0;
	else if (urdma_now_ns() - start > 1000000ull)
		rs->spin_miss++;
	else
		rs->spin_miss = 0;
	return 0;
}
