// SPDX-License-Identifier: MIT
/*
 * UD datagrams between hosts: RoCEv2's framing over UDP (roce.h).
 *
 * An unprivileged process can't own UDP port 4791, so each process
 * receives on ports of its own, as the TCP transport listens: a UD QP's
 * number is port << 8 | index, the port that of one of the process's UDP
 * sockets (each serves 256 QPs; a socket is opened for the first and
 * closed with the last).  A sender sends to the destination GID's address
 * (an IPv4-mapped GID is an IPv4 address; an address handle by LID, or a
 * link-local GID: loopback) at the port the destination QPN names.
 *
 * Receiving: the progress thread watches each socket; ibv_poll_cq on a
 * UD QP's CQ also reads its socket when datagrams came in the last
 * second, so a polling program needs no thread switch, and while it polls
 * the progress thread stops watching (parking, as the TCP transport's):
 * its wake-up per datagram would only take a CPU from the program.  Polls
 * UDP_PARK_IDLE_NS apart, or an armed CQ, give the socket back (the progress
 * thread looks every UDP_PARK_CHECK_NS, not sooner).  A datagram is
 * parsed and checked (roce.c), then delivered into the QP's own receive
 * queue as a sender over shared memory would (../ud.c), with a GRH made
 * of its IP addresses, as RoCEv2's receivers report one.  Malformed
 * datagrams, and those for no QP, are dropped and counted.
 */
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/ud.h"
#include "transport/udp/roce.h"
#include "util/alloc.h"
#include "util/fdpoll.h"
#include "util/log.h"

#define UDP_SOCKS 256
#define UDP_QPS 256
#define UDP_ACTIVE_NS 1000000000ull /* polls read a socket this long after a datagram */
#define UDP_SEND_WAIT_MS 100	     /* for room in a full socket */
#define UDP_RX_BATCH 64		     /* datagrams per read pass */
#define UDP_RCVBUF (8 << 20)
#define UDP_PARK_IDLE_NS 200000ull   /* no poll for this long: watch again */
#define UDP_PARK_CHECK_NS 2000000ull /* how soon the progress thread looks */

struct udp_sock {
	struct urdma_watcher w;
	int fd;
	uint16_t port;
	int nqps;
	bool taken[UDP_QPS];
	/* The QPs datagrams go to: set and cleared under both U.lock and
	 * qp_lock; a delivery holds qp_lock, so the QP outlives it. */
	struct urdma_qp *qp[UDP_QPS];
	pthread_mutex_t qp_lock;
	pthread_mutex_t rx_lock;      /* one reader; buf */
	_Atomic uint64_t last_rx_ns;
	/* Parked: a program's polls read it, the progress thread does not
	 * watch it (park_lock orders the changes and their epoll_ctl). */
	pthread_mutex_t park_lock;
	_Atomic bool parked;
	_Atomic uint64_t last_poll_ns;
	/* Multicasts sent: the interface (+1) and TTL set last, under
	 * mc_lock with the sendmsg they are for. */
	pthread_mutex_t mc_lock;
	int mc_ifindex, mc_ttl;
	_Atomic uint64_t drops[ROCE_NERR + 1]; /* [ROCE_NERR]: no such QP */
	uint8_t buf[ROCE_HDR_MAX + URDMA_UD_MTU + ROCE_ICRC + 64];
};

static struct {
	pthread_mutex_t lock;
	struct udp_sock *s[UDP_SOCKS];
} U = { .lock = PTHREAD_MUTEX_INITIALIZER };

static const char *const drop_names[ROCE_NERR + 1] = {
	[ROCE_SHORT] = "too short", [ROCE_OPCODE] = "not a UD Send",
	[ROCE_VERSION] = "an unknown header version",
	[ROCE_PKEY] = "another partition", [ROCE_PAD] = "a bad pad count",
	[ROCE_LONG] = "longer than the MTU", [ROCE_CRC] = "a bad CRC",
	[ROCE_SRCQP] = "a SrcQP not of the port it came from",
	[ROCE_NERR] = "for no QP of ours",
};

static void sock_drop(struct udp_sock *s, int why)
{
	atomic_fetch_add_explicit(&s->drops[why], 1, memory_order_relaxed);
	urdma_dbg("udp: port %u: a datagram dropped: %s", s->port,
		  drop_names[why]);
}

/* ---- receiving ---- */

/* The 16-byte GID of address sa (IPv6, or IPv4 mapped). */
static void addr_gid(const struct sockaddr_storage *sa, union ibv_gid *gid)
{
	memset(gid, 0, sizeof(*gid));
	if (sa->ss_family == AF_INET) {
		gid->raw[10] = gid->raw[11] = 0xff;
		memcpy(&gid->raw[12],
		       &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else {
		memcpy(gid->raw, &((const struct sockaddr_in6 *)sa)->sin6_addr,
		       16);
	}
}

/* Our own address a datagram came to, from its control messages. */
static void pkt_dest(struct msghdr *mh, union ibv_gid *gid)
{
	memset(gid, 0, sizeof(*gid));
	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		if (c->cmsg_level == IPPROTO_IPV6 &&
		    c->cmsg_type == IPV6_PKTINFO) {
			struct in6_pktinfo pi;

			memcpy(&pi, CMSG_DATA(c), sizeof(pi));
			memcpy(gid->raw, &pi.ipi6_addr, 16);
		} else if (c->cmsg_level == IPPROTO_IP &&
			   c->cmsg_type == IP_PKTINFO) {
			struct in_pktinfo pi;

			memcpy(&pi, CMSG_DATA(c), sizeof(pi));
			gid->raw[10] = gid->raw[11] = 0xff;
			memcpy(&gid->raw[12], &pi.ipi_addr, 4);
		}
	}
}

/* A UD QP of ours as a destination: its own block, ring and SRQ. */
static void own_dest(struct urdma_qp *qp, struct urdma_shm_dest *d)
{
	*d = (struct urdma_shm_dest){
		.qp = qp->shm,
		.ring = (uint8_t *)qp->shm + sizeof(*qp->shm),
		.rq = qp->rq,
		.gen = qp->shm->gen,
		.bell = qp->rcq->shm,
		.bell_va = qp->rcq->shm_va,
		.bell_slot = qp->bell_slot,
	};
	/* (qp->srq stays while the QP is bound: qpn_unbind comes first) */
	if (qp->srq) {
		d->srq = qp->srq->shm;
		d->srq_ring = qp->srq->ring;
		d->srq_rq = qp->srq->rq;
		d->srq_pd = to_upd(qp->srq->ibsrq.pd)->id;
	}
}

/* A datagram went into qp's ring (urdma_ud_deliver rang its CQ's bell
 * and told tell): its event or the progress thread. */
static void own_told(struct urdma_qp *qp, int tell)
{
	if (tell == URDMA_UD_NOTIFY)
		urdma_qp_notify_recv(qp);
	else if (tell == URDMA_UD_ERROR)
		urdma_progress_kick();
}

/* ---- multicast ---- */

static struct udp_sock *sock_new(uint16_t port);

/* Every process receives multicasts on RoCEv2's port, shared by all
 * (SO_REUSEADDR): each gets a copy of a datagram to a group the host has
 * joined on the interface it came in on (IP_MULTICAST_ALL).  Joining the
 * IP group is the connection manager's part, on the interface of the
 * address its id is bound to, as on RoCE (librdmacm: rdma_join_multicast);
 * ibv_attach_mcast only says which of our QPs receive a group's. */
#define UDP_MCAST_PORT 4791
#define UDP_MCGS 64

static struct {
	pthread_mutex_t lock; /* also held across a delivery */
	struct udp_sock *s;
	struct mcg {
		union ibv_gid gid;
		int n;
		struct urdma_qp *qps[16];
	} g[UDP_MCGS];
} M = { .lock = PTHREAD_MUTEX_INITIALIZER };

static bool gid_v4(const union ibv_gid *g)
{
	static const uint8_t prefix[12] = { [10] = 0xff, [11] = 0xff };

	return !memcmp(g->raw, prefix, 12);
}

static struct mcg *mcg_of(const union ibv_gid *g)
{
	for (int i = 0; i < UDP_MCGS; i++)
		if (M.g[i].n && !memcmp(M.g[i].gid.raw, g->raw, 16))
			return &M.g[i];
	return NULL;
}

int urdma_udp_mcast_join(struct urdma_qp *qp, const union ibv_gid *gid)
{
	struct mcg *g;
	int ret = 0;

	pthread_mutex_lock(&M.lock);
	if (!M.s)
		M.s = sock_new(UDP_MCAST_PORT);
	g = mcg_of(gid);
	for (int i = 0; !g && i < UDP_MCGS; i++)
		if (!M.g[i].n)
			g = &M.g[i];
	if (!g || g->n == (int)(sizeof(g->qps) / sizeof(g->qps[0]))) {
		ret = -ENOMEM;
	} else {
		/* (without a socket, this host's QPs only) */
		g->gid = *gid;
		g->qps[g->n++] = qp;
	}
	pthread_mutex_unlock(&M.lock);
	return ret;
}

void urdma_udp_mcast_leave(struct urdma_qp *qp, const union ibv_gid *gid)
{
	struct mcg *g;

	pthread_mutex_lock(&M.lock);
	g = mcg_of(gid);
	for (int i = 0; g && i < g->n; i++) {
		if (g->qps[i] != qp)
			continue;
		g->qps[i] = g->qps[--g->n];
		break;
	}
	/* The port goes with the last member (the progress thread frees
	 * the socket between its passes). */
	for (int i = 0; i < UDP_MCGS && M.s; i++)
		if (M.g[i].n)
			goto out;
	if (M.s) {
		urdma_progress_retire(M.s->fd, &M.s->w);
		M.s = NULL;
	}
out:
	pthread_mutex_unlock(&M.lock);
}

/* A datagram to group msg's GRH's destination: into each QP of ours
 * attached to it (the one that sent it too, unless it blocks that). */
static void mcast_deliver(struct udp_sock *s, struct urdma_ud_msg *msg)
{
	struct mcg *g;

	pthread_mutex_lock(&M.lock);
	g = mcg_of(&msg->grh->dgid);
	if (!g)
		sock_drop(s, ROCE_NERR);
	for (int i = 0; g && i < g->n; i++) {
		struct urdma_qp *qp = g->qps[i];
		struct urdma_shm_dest d;
		const char *why = NULL;
		int tell = 0;

		if (qp->block_self_mcast && qp->ibqp.qp_num == msg->src_qp &&
		    urdma_gid_is_local(qp->uctx, msg->grh->sgid.raw))
			continue; /* (its own, looped back) */
		own_dest(qp, &d);
		msg->qpn = qp->ibqp.qp_num;
		if (urdma_ud_deliver(&d, NULL, qp->uctx->shm, msg, &tell,
				     &why) != URDMA_UD_DONE)
			urdma_dbg("udp: qp %#x: a multicast datagram dropped: "
				  "%s", qp->ibqp.qp_num, why);
		else
			own_told(qp, tell);
	}
	pthread_mutex_unlock(&M.lock);
}

/* Datagram m, from `from` to our address `to`, into its QP. */
static void sock_deliver(struct udp_sock *s, const struct roce_ud *m,
			 const struct sockaddr_storage *from,
			 const union ibv_gid *to)
{
	struct urdma_shm_dest d;
	struct urdma_qp *qp;
	const char *why = NULL;
	struct ibv_grh grh = {
		.version_tclass_flow = htobe32(6u << 28),
		.paylen = htobe16((uint16_t)(m->len + ROCE_BTH + ROCE_DETH +
					     ROCE_ICRC)),
		.next_hdr = 0x1b,
		.hop_limit = 64,
		.dgid = *to,
	};
	struct urdma_ud_msg msg = {
		.data = m->payload,
		.len = m->len,
		.grh = &grh,
		.qpn = m->dest_qp,
		.qkey = m->qkey,
		.src_qp = m->src_qp,
		.ud_src = URDMA_RQE_UD_GRH, /* (no LID, SL 0) */
		.imm = m->imm,
		.with_imm = m->opcode == ROCE_UD_SEND_ONLY_IMM,
		.solicited = m->solicited,
	};
	int tell = 0;

	addr_gid(from, &grh.sgid);
	if (m->dest_qp == ROCE_QPN_MCAST) {
		mcast_deliver(s, &msg);
		return;
	}
	pthread_mutex_lock(&s->qp_lock);
	qp = s->qp[m->dest_qp & (UDP_QPS - 1)];
	if (!qp || qp->ibqp.qp_num != m->dest_qp) {
		pthread_mutex_unlock(&s->qp_lock);
		sock_drop(s, ROCE_NERR);
		return;
	}
	own_dest(qp, &d);
	if (urdma_ud_deliver(&d, NULL, qp->uctx->shm, &msg, &tell, &why) !=
	    URDMA_UD_DONE)
		urdma_dbg("udp: qp %#x: a datagram from QP %#x dropped: %s",
			  m->dest_qp, m->src_qp, why);
	else
		own_told(qp, tell);
	pthread_mutex_unlock(&s->qp_lock);
}

/* The port of address sa (IPv4 or IPv6), host order. */
static uint32_t sa_port(const struct sockaddr_storage *sa)
{
	return sa->ss_family == AF_INET ?
		       ntohs(((const struct sockaddr_in *)sa)->sin_port) :
		       ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
}

/* Read what the socket has, up to a batch.  One reader at a time. */
static void sock_rx(struct udp_sock *s)
{
	if (pthread_mutex_trylock(&s->rx_lock))
		return;
	for (int k = 0; k < UDP_RX_BATCH; k++) {
		union {
			char buf[CMSG_SPACE(sizeof(struct in6_pktinfo)) +
				 CMSG_SPACE(sizeof(struct in_pktinfo))];
			struct cmsghdr align;
		} cm;
		struct sockaddr_storage from;
		struct iovec iov = { s->buf, sizeof(s->buf) };
		struct msghdr mh = { .msg_name = &from,
				     .msg_namelen = sizeof(from),
				     .msg_iov = &iov,
				     .msg_iovlen = 1,
				     .msg_control = cm.buf,
				     .msg_controllen = sizeof(cm.buf) };
		struct roce_ud m;
		union ibv_gid to;
		enum roce_err err;
		ssize_t n = recvmsg(s->fd, &mh, MSG_DONTWAIT);

		if (n < 0)
			break;
		atomic_store_explicit(&s->last_rx_ns, urdma_now_ns(),
				      memory_order_relaxed);
		if (mh.msg_flags & MSG_TRUNC) {
			sock_drop(s, ROCE_LONG);
			continue;
		}
		err = roce_parse(s->buf, (size_t)n, &m);
		/* A QPN names its process's port (port << 8 | index), and the
		 * kernel vouches for the port a datagram came from: a sender
		 * can't claim another process's QP as its source. */
		if (!err && m.src_qp >> 8 != sa_port(&from))
			err = ROCE_SRCQP;
		if (err) {
			sock_drop(s, err);
			continue;
		}
		pkt_dest(&mh, &to);
		sock_deliver(s, &m, &from, &to);
	}
	pthread_mutex_unlock(&s->rx_lock);
}

static void sock_cb(struct urdma_watcher *w, uint32_t events)
{
	(void)events;
	sock_rx(container_of(w, struct udp_sock, w));
}

/* Watch s (the progress thread reads it) or not (parked). */
static void sock_park(struct udp_sock *s, bool park)
{
	pthread_mutex_lock(&s->park_lock);
	if (atomic_load(&s->parked) != park) {
		atomic_store(&s->parked, park);
		urdma_progress_watch_events(s->fd, park ? 0 : EPOLLIN,
					    URDMA_WATCH_FN, &s->w, true);
	}
	pthread_mutex_unlock(&s->park_lock);
}

/* The CQ of a QP of s is armed: its program may sleep. */
static void udp_armed_sock(struct udp_sock *s)
{
	if (atomic_load_explicit(&s->parked, memory_order_relaxed))
		sock_park(s, false);
}

void urdma_udp_poll(struct urdma_qp *qp, enum urdma_poll_hint hint)
{
	struct udp_sock *s = qp->tr_priv;
	uint64_t now;

	(void)hint; /* (UDP's sockets are in no CQ's readiness set) */
	if (!s)
		return;
	now = urdma_now_ns();
	if (now - atomic_load_explicit(&s->last_rx_ns, memory_order_relaxed) >=
	    UDP_ACTIVE_NS)
		return;
	atomic_store_explicit(&s->last_poll_ns, now, memory_order_relaxed);
	/* (a program whose CQ is armed is about to sleep: it keeps the
	 * progress thread watching) */
	if (__atomic_load_n(&qp->rcq->armed, __ATOMIC_RELAXED))
		udp_armed_sock(s);
	else if (!atomic_load_explicit(&s->parked, memory_order_relaxed)) {
		sock_park(s, true);
		urdma_progress_by(now + UDP_PARK_CHECK_NS);
	}
	sock_rx(s);
}

void urdma_udp_armed(struct urdma_qp *qp)
{
	if (qp->tr_priv)
		udp_armed_sock(qp->tr_priv);
}

/* Progress thread, each pass: a parked socket nobody polls any more is
 * watched again. */
void urdma_udp_tick(void)
{
	uint64_t now = urdma_now_ns();

	pthread_mutex_lock(&U.lock);
	for (int i = 0; i < UDP_SOCKS; i++) {
		struct udp_sock *s = U.s[i];
		uint64_t last;

		if (!s || !atomic_load_explicit(&s->parked, memory_order_relaxed))
			continue;
		last = atomic_load_explicit(&s->last_poll_ns,
					    memory_order_relaxed);
		if (now - last >= UDP_PARK_IDLE_NS)
			sock_park(s, false);
		else	/* (not sooner: each look takes a CPU from the poller) */
			urdma_progress_by(now + UDP_PARK_CHECK_NS);
	}
	pthread_mutex_unlock(&U.lock);
}

/* ---- sockets and QP numbers ---- */

static void sock_release(struct urdma_watcher *w)
{
	struct udp_sock *s = container_of(w, struct udp_sock, w);
	uint64_t total = 0;

	for (int i = 0; i <= ROCE_NERR; i++)
		total += atomic_load(&s->drops[i]);
	if (total)
		urdma_info("udp: port %u: %llu malformed or unknown datagrams "
			   "dropped", s->port, (unsigned long long)total);
	close(s->fd);
	pthread_mutex_destroy(&s->rx_lock);
	pthread_mutex_destroy(&s->qp_lock);
	pthread_mutex_destroy(&s->mc_lock);
	pthread_mutex_destroy(&s->park_lock);
	urdma_free(s);
}

/* A socket on port (0: one the kernel picks, dual stack; else IPv4 only,
 * shared, SO_REUSEADDR, with every process that binds it: the multicast
 * port). */
static struct udp_sock *sock_new(uint16_t port)
{
	union {
		struct sockaddr_in6 v6;
		struct sockaddr_in v4;
	} sa = { .v6 = { .sin6_family = AF_INET6,
			 .sin6_addr = IN6ADDR_ANY_INIT } };
	socklen_t len = sizeof(sa);
	struct udp_sock *s = urdma_zalloc(sizeof(*s));
	int zero = 0, one = 1, rcvbuf = UDP_RCVBUF;

	if (!s)
		return NULL;
	s->w.fn = sock_cb;
	s->w.release = sock_release;
	pthread_mutex_init(&s->rx_lock, NULL);
	pthread_mutex_init(&s->qp_lock, NULL);
	pthread_mutex_init(&s->mc_lock, NULL);
	pthread_mutex_init(&s->park_lock, NULL);
	if (port)
		sa.v4 = (struct sockaddr_in){ .sin_family = AF_INET,
					      .sin_port = htons(port) };
	s->fd = socket(port ? AF_INET : AF_INET6,
		       SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->fd < 0)
		goto err;
	if (!port)
		setsockopt(s->fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	/* Room for a burst: UD has no flow control, and what the socket
	 * can't hold is lost.  Beyond net.core.rmem_max only with
	 * CAP_NET_ADMIN. */
	if (setsockopt(s->fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf,
		       sizeof(rcvbuf)))
		setsockopt(s->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	if (!port)
		setsockopt(s->fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one,
			   sizeof(one));
	setsockopt(s->fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one));
	if (port)
		setsockopt(s->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s->fd, (struct sockaddr *)&sa,
		 port ? sizeof(sa.v4) : sizeof(sa.v6)) ||
	    getsockname(s->fd, (struct sockaddr *)&sa, &len))
		goto err_close;
	s->port = ntohs(port ? sa.v4.sin_port : sa.v6.sin6_port);
	if (urdma_progress_watch_events(s->fd, EPOLLIN, URDMA_WATCH_FN, &s->w,
					false))
		goto err_close;
	urdma_dbg("udp: datagrams on port %u", s->port);
	return s;
err_close:
	close(s->fd);
err:
	urdma_warn("udp: no socket: %m; UD QPs of this process are not "
		   "reachable from other hosts");
	pthread_mutex_destroy(&s->rx_lock);
	pthread_mutex_destroy(&s->qp_lock);
	pthread_mutex_destroy(&s->mc_lock);
	pthread_mutex_destroy(&s->park_lock);
	urdma_free(s);
	return NULL;
}

static struct udp_sock *sock_of(uint32_t qpn)
{
	for (int i = 0; i < UDP_SOCKS; i++)
		if (U.s[i] && U.s[i]->port == qpn >> 8)
			return U.s[i];
	return NULL;
}

int urdma_udp_qpn_reserve(uint32_t *qpn)
{
	int ret = -ENOSPC;

	pthread_mutex_lock(&U.lock);
	for (int i = 0; i < UDP_SOCKS && ret; i++) {
		struct udp_sock *s = U.s[i];

		if (!s) {
			s = U.s[i] = sock_new(0);
			if (!s) {
				ret = -EADDRNOTAVAIL;
				break;
			}
		}
		for (int k = 0; k < UDP_QPS; k++) {
			if (s->taken[k])
				continue;
			s->taken[k] = true;
			s->nqps++;
			*qpn = (uint32_t)s->port << 8 | k;
			ret = 0;
			break;
		}
	}
	pthread_mutex_unlock(&U.lock);
	return ret;
}

/* The socket of QPN qpn, its slot set to qp (under U.lock; a delivery
 * holds qp_lock while it uses the QP it found there), or NULL. */
static struct udp_sock *sock_slot(uint32_t qpn, struct urdma_qp *qp)
{
	struct udp_sock *s = sock_of(qpn);

	if (s) {
		pthread_mutex_lock(&s->qp_lock);
		s->qp[qpn & (UDP_QPS - 1)] = qp;
		pthread_mutex_unlock(&s->qp_lock);
	}
	return s;
}

void urdma_udp_qpn_bind(struct urdma_qp *qp)
{
	pthread_mutex_lock(&U.lock);
	qp->tr_priv = sock_slot(qp->ibqp.qp_num, qp);
	pthread_mutex_unlock(&U.lock);
}

void urdma_udp_qpn_unbind(struct urdma_qp *qp)
{
	pthread_mutex_lock(&U.lock);
	sock_slot(qp->ibqp.qp_num, NULL);
	pthread_mutex_unlock(&U.lock);
}

/* The QP is gone: its number is free; the last one closes the socket. */
void urdma_udp_qpn_release(uint32_t qpn)
{
	struct udp_sock *s;

	pthread_mutex_lock(&U.lock);
	s = sock_slot(qpn, NULL);
	if (s) {
		s->taken[qpn & (UDP_QPS - 1)] = false;
		if (--s->nqps == 0) {
			for (int i = 0; i < UDP_SOCKS; i++)
				if (U.s[i] == s)
					U.s[i] = NULL;
			urdma_progress_retire(s->fd, &s->w);
		}
	}
	pthread_mutex_unlock(&U.lock);
}

/* ---- sending ---- */

/* Socket s is to send a multicast to av's group (under s->mc_lock until
 * it is sent): out of the interface of its source GID, TTL its hop limit,
 * not looped back to this host, whose QPs got theirs over shared memory
 * (ud.c).  -1 if the group has no IPv4 address. */
static int mcast_prepare(struct urdma_qp *qp, struct udp_sock *s,
			 const struct urdma_av *av)
{
	union ibv_gid g;
	int ifindex = qp->uctx->gids[av->sgid_index].ifindex;
	int ttl = av->hop_limit ? av->hop_limit : 1, loop = 0;

	memcpy(g.raw, av->dgid, 16);
	if (!gid_v4(&g))
		return -1;
	if (s->mc_ifindex != ifindex + 1 || s->mc_ttl != ttl) {
		struct ip_mreqn mr = { .imr_ifindex = ifindex };

		setsockopt(s->fd, IPPROTO_IP, IP_MULTICAST_IF, &mr, sizeof(mr));
		setsockopt(s->fd, IPPROTO_IP, IP_MULTICAST_LOOP, &loop,
			   sizeof(loop));
		setsockopt(s->fd, IPPROTO_IP, IP_MULTICAST_TTL, &ttl,
			   sizeof(ttl));
		s->mc_ifindex = ifindex + 1;
		s->mc_ttl = ttl;
	}
	return 0;
}

/* Where a datagram to av goes: the GID's address (ours too: the
 * receiver's GRH then names the source the sender's GID names), loopback
 * for an address by LID (this host, ud.c) or a link-local GID (we have no
 * scope for it); the port QPN qpn names, or a group's (multicast). */
static void dest_addr(struct urdma_qp *qp, const struct urdma_av *av,
		      uint32_t qpn, struct sockaddr_in6 *sa)
{
	*sa = (struct sockaddr_in6){ .sin6_family = AF_INET6,
				     .sin6_port = htons((uint16_t)(qpn >> 8)) };
	if (av->is_global && urdma_gid_is_mcast(av->dgid)) {
		memcpy(&sa->sin6_addr, av->dgid, 16);
		sa->sin6_port = htons(UDP_MCAST_PORT);
	} else if (av->is_global && !urdma_gid_is_linklocal(av->dgid)) {
		/* another host's address, or ours (then the receiver's GRH
		 * names it as the source, as the sender's GID says) */
		memcpy(&sa->sin6_addr, av->dgid, 16);
	} else {
		/* by LID, or link-local (no scope here): this host */
		sa->sin6_addr.s6_addr[10] = sa->sin6_addr.s6_addr[11] = 0xff;
		sa->sin6_addr.s6_addr[12] = 127;
		sa->sin6_addr.s6_addr[15] = 1;
	}
}

void urdma_udp_send(struct urdma_qp *qp, const struct urdma_swqe *w,
		    const struct urdma_ud_msg *um)
{
	static const uint8_t zeros[4];
	uint8_t h[ROCE_HDR_MAX], trailer[4];
	struct udp_sock *s = qp->tr_priv;
	struct roce_ud m = {
		.opcode = um->with_imm ? ROCE_UD_SEND_ONLY_IMM :
					 ROCE_UD_SEND_ONLY,
		.solicited = um->solicited,
		.dest_qp = w->ud_qpn,
		.psn = qp->attr.sq_psn++ & 0xffffff,
		.qkey = um->qkey,
		.src_qp = um->src_qp,
		.imm = um->imm,
		.len = um->len,
	};
	struct sockaddr_in6 sa;
	struct iovec iov[4];
	struct msghdr mh = { .msg_name = &sa, .msg_namelen = sizeof(sa),
			     .msg_iov = iov, .msg_iovlen = 4 };
	uint32_t pad, crc;
	size_t hlen;
	bool mcast;
	ssize_t n;

	if (!s || !(w->ud_qpn >> 8)) {
		qp->ud_drops++;
		return;
	}
	mcast = w->av.is_global && urdma_gid_is_mcast(w->av.dgid);
	if (mcast) {
		pthread_mutex_lock(&s->mc_lock);
		if (mcast_prepare(qp, s, &w->av)) { /* (IPv6: this host only) */
			pthread_mutex_unlock(&s->mc_lock);
			return;
		}
	}
	dest_addr(qp, &w->av, w->ud_qpn, &sa);
	hlen = roce_build(&m, h, &pad);
	crc = htobe32(roce_crc(h, hlen, um->data, um->len, pad));
	memcpy(trailer, &crc, 4);
	iov[0] = (struct iovec){ h, hlen };
	iov[1] = (struct iovec){ (void *)um->data, um->len };
	iov[2] = (struct iovec){ (void *)zeros, pad };
	iov[3] = (struct iovec){ trailer, 4 };
	n = sendmsg(s->fd, &mh, MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == ENOBUFS)) {
		/* The socket is full: wait a little for room, as a NIC's
		 * queue would hold the packet. */
		if (urdma_poll_fd(s->fd, POLLOUT, UDP_SEND_WAIT_MS) > 0)
			n = sendmsg(s->fd, &mh, MSG_DONTWAIT);
	}
	if (mcast)
		pthread_mutex_unlock(&s->mc_lock);
	if (n < 0) {
		qp->ud_drops++;
		urdma_dbg("udp: qp %#x: datagram %#llx to QP %#x not sent: %m",
			  qp->ibqp.qp_num, (unsigned long long)w->wr_id,
			  w->ud_qpn);
	}
}
