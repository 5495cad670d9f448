/* SPDX-License-Identifier: MIT */
/*
 * Datagram rsockets: how an address is reached.  Socket addresses as
 * GIDs, the bounded table of destinations (address -> QPN and address
 * handle), and the UDP socket that carries what is not resolved yet and
 * the HELLO/REPLY exchange that resolves it (rs_dgram.c has the
 * overview).  The table learns only from what the kernel vouches for:
 * the source address of a DATA or HELLO on the UDP socket, or a REPLY
 * from the address asked that echoes the asker's nonce.
 */

#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rdmacm/cma_priv.h"
#include "rdmacm/rs_dgram.h"

/* ------------------------------------------------------------------ */
/* Addresses                                                          */
/* ------------------------------------------------------------------ */

static const uint8_t v4map[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

/* A socket address as ours (its GID form, the CM's); false for another
 * family. */
bool dg_addr_from(struct rs_dg_addr *a, const struct sockaddr *sa)
{
	union ibv_gid g;

	if (sa->sa_family != AF_INET && sa->sa_family != AF_INET6)
		return false;
	sa_to_gid(sa, &g);
	memcpy(a->ip, g.raw, 16);
	a->port = sa_port(sa);
	return true;
}

/* a as a socket address of family (AF_INET: a must be IPv4-mapped). */
static void dg_sockaddr(const struct rs_dg_addr *a, int family,
			struct sockaddr_storage *ss, socklen_t *len)
{
	memset(ss, 0, sizeof(*ss));
	if (family == AF_INET) {
		struct sockaddr_in *s = (void *)ss;

		s->sin_family = AF_INET;
		s->sin_port = a->port;
		memcpy(&s->sin_addr, a->ip + 12, 4);
		*len = sizeof(*s);
	} else {
		struct sockaddr_in6 *s = (void *)ss;

		s->sin6_family = AF_INET6;
		s->sin6_port = a->port;
		memcpy(&s->sin6_addr, a->ip, 16);
		*len = sizeof(*s);
	}
}

/* Ours as a socket address of the rsocket's family: false if the socket
 * can't name it (an IPv6 address for AF_INET, an IPv4 one for a v6only
 * socket). */
bool dg_addr_to(const struct rsocket *rs, const struct rs_dg_addr *a,
		struct sockaddr_storage *ss, socklen_t *len)
{
	bool v4 = !memcmp(a->ip, v4map, 12);

	if (rs->domain == AF_INET ? !v4 : v4 && rs->v6only)
		return false;
	dg_sockaddr(a, rs->domain, ss, len);
	return true;
}

bool dg_addr_eq(const struct rs_dg_addr *x, const struct rs_dg_addr *y)
{
	return x->port == y->port && !memcmp(x->ip, y->ip, 16);
}

/* The index of our GID that is IP address ip, or -1 (the CM's lookup). */
static int dg_gid_index(const uint8_t ip[16])
{
	union ibv_gid g;

	memcpy(g.raw, ip, 16);
	return cma_gid_find(&g);
}

/* The source GID index for datagrams to a: the socket's own address when
 * it is bound to one, else the address the kernel routes from (asked of
 * a socket of a's own family, so that bindv6only can't refuse it). */
static int dg_src_gid(struct rsocket *rs, const struct rs_dg_addr *a)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	struct rs_dg_addr me;
	int family = memcmp(a->ip, v4map, 12) ? AF_INET6 : AF_INET, s, ret = -1;

	if (!getsockname(rs->fd, (struct sockaddr *)&ss, &len) &&
	    !sa_is_any((struct sockaddr *)&ss) &&
	    dg_addr_from(&me, (struct sockaddr *)&ss))
		return dg_gid_index(me.ip);
	dg_sockaddr(a, family, &ss, &len);
	s = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	if (!connect(s, (struct sockaddr *)&ss, len)) {
		len = sizeof(ss);
		if (!getsockname(s, (struct sockaddr *)&ss, &len) &&
		    dg_addr_from(&me, (struct sockaddr *)&ss))
			ret = dg_gid_index(me.ip);
	}
	close(s);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Destinations                                                       */
/* ------------------------------------------------------------------ */

/* A random word, never 0 (a nonce, a hash seed). */
uint32_t dg_random(void)
{
	uint32_t v = 0;

	while (!v)
		if (getrandom(&v, sizeof(v), 0) != sizeof(v))
			v = (uint32_t)urdma_now_ns() * 2654435761u;
	return v;
}

static unsigned dg_hash(const struct rs_dgram *dg, const struct rs_dg_addr *a)
{
	uint32_t h = 2166136261u ^ dg->seed;

	for (int i = 0; i < 16; i++)
		h = (h ^ a->ip[i]) * 16777619u;
	h = (h ^ (a->port & 0xff)) * 16777619u;
	h = (h ^ (a->port >> 8)) * 16777619u;
	return (h ^ h >> 15) % RS_DG_BUCKETS;
}

struct rs_dest *dg_find(struct rs_dgram *dg, const struct rs_dg_addr *a)
{
	for (int i = dg->bucket[dg_hash(dg, a)]; i >= 0; i = dg->dest[i].next)
		if (dg_addr_eq(&dg->dest[i].a, a))
			return &dg->dest[i];
	return NULL;
}

static void dg_unlink(struct rs_dgram *dg, int idx)
{
	int *p = &dg->bucket[dg_hash(dg, &dg->dest[idx].a)];

	while (*p >= 0 && *p != idx)
		p = &dg->dest[*p].next;
	if (*p == idx)
		*p = dg->dest[idx].next;
}

/* Back to UDP for d: no QPN, no address handle. */
void dg_forget(struct rs_dest *d)
{
	if (d->ah)
		ibv_destroy_ah(d->ah);
	d->ah = NULL;
	d->qpn = 0;
}

/* The entry of a, made if need be (reusing the oldest when the table is
 * full); NULL without memory. */
struct rs_dest *dg_dest(struct rs_dgram *dg, const struct rs_dg_addr *a)
{
	struct rs_dest *d = dg_find(dg, a);
	unsigned h;
	int idx;

	if (d)
		return d;
	if (dg->ndest == dg->cap && dg->cap < RS_DG_MAX_DEST) {
		int cap = dg->cap ? dg->cap * 2 : 16;
		struct rs_dest *n = realloc(dg->dest, (size_t)cap * sizeof(*n));

		if (n) {
			dg->dest = n;
			dg->cap = cap;
		}
	}
	if (dg->ndest < dg->cap) {
		idx = dg->ndest++;
	} else {
		if (!dg->cap)
			return NULL;
		idx = dg->evict;
		dg->evict = (dg->evict + 1) % dg->cap;
		dg_unlink(dg, idx);
		dg_forget(&dg->dest[idx]);
	}
	d = &dg->dest[idx];
	memset(d, 0, sizeof(*d));
	d->a = *a;
	d->nonce = dg_random();
	h = dg_hash(dg, a);
	d->next = dg->bucket[h];
	dg->bucket[h] = idx;
	return d;
}

/* The kernel vouches that a is at QPN qpn: make (or keep) its address
 * handle, from the GID of ours that reaches it. */
void dg_learn(struct rsocket *rs, const struct rs_dg_addr *a, uint32_t qpn)
{
	struct rs_dest *d;
	struct ibv_ah_attr attr;
	int sgid;

	if (!qpn || qpn >= 0xffffff)
		return;
	d = dg_dest(rs->dg, a);
	if (!d)
		return;
	d->heard_ns = urdma_now_ns();
	d->unanswered = 0;
	if (d->ah && d->qpn == qpn)
		return;
	dg_forget(d);
	sgid = dg_src_gid(rs, a);
	if (sgid < 0)
		return;		/* no GID to send from: UDP it stays */
	memset(&attr, 0, sizeof(attr));
	attr.is_global = 1;
	attr.port_num = 1;
	attr.grh.sgid_index = (uint8_t)sgid;
	attr.grh.hop_limit = 64;
	memcpy(attr.grh.dgid.raw, a->ip, 16);
	d->ah = ibv_create_ah(rs->pd, &attr);
	if (d->ah)
		d->qpn = qpn;
}

/* ------------------------------------------------------------------ */
/* The UDP socket                                                     */
/* ------------------------------------------------------------------ */

/* One datagram on the UDP socket: header (op, our QPN, nonce), then iov.
 * Returns 0 or an errno. */
int dg_udp_send(struct rsocket *rs, const struct rs_dg_addr *to, uint8_t op,
		uint32_t nonce, struct rs_iter *it, size_t len, bool nonblock)
{
	struct rs_dg_udp_hdr h = {
		.magic = htobe32(RS_DG_MAGIC),
		.version = RS_DG_VERSION,
		.op = op,
		.qpn = htobe32(rs->qp ? rs->qp->qp_num : 0),
		.nonce = htobe32(nonce),
	};
	struct iovec iov[2] = { { &h, sizeof(h) } };
	struct sockaddr_storage ss;
	struct msghdr m = { 0 };
	uint8_t *data = NULL;
	ssize_t r;

	if (!dg_addr_to(rs, to, &ss, &m.msg_namelen))
		return EAFNOSUPPORT;
	m.msg_name = &ss;
	m.msg_iov = iov;
	m.msg_iovlen = 1;
	if (len) {
		data = malloc(len);
		if (!data)
			return ENOMEM;
		rs_iter_copy(it, data, len, true);
		iov[1].iov_base = data;
		iov[1].iov_len = len;
		m.msg_iovlen = 2;
	}
	for (;;) {
		r = sendmsg(rs->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (r >= 0 || (errno != EAGAIN && errno != EINTR) || nonblock)
			break;
		struct pollfd p = { .fd = rs->fd, .events = POLLOUT };

		pthread_mutex_unlock(&rs->lock);
		poll(&p, 1, RS_WAKE_MS);
		pthread_mutex_lock(&rs->lock);
	}
	free(data);
	return r < 0 ? errno : 0;
}

/* Ask d for its QPN (again).  After RS_DG_HELLO_MAX unanswered, what we
 * knew is forgotten: datagrams go over UDP, where a new socket at the
 * address answers and a dead one is refused. */
void dg_hello(struct rsocket *rs, struct rs_dest *d, uint64_t now)
{
	d->hello_ns = now;
	if (++d->unanswered > RS_DG_HELLO_MAX && d->qpn)
		dg_forget(d);
	dg_udp_send(rs, &d->a, RS_DG_OP_HELLO, d->nonce, NULL, 0, true);
}

/* Read what the UDP socket holds: REPLYs teach QPNs, DATA is queued for
 * rrecvfrom; DATA and HELLO teach the sender's QPN and are answered with a
 * REPLY.  Lock held. */
void dg_udp_input(struct rsocket *rs)
{
	struct rs_dgram *dg = rs->dg;

	for (int k = 0; k < 64; k++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		struct rs_dg_udp_hdr h;
		struct rs_dg_addr from;
		struct rs_dest *d;
		ssize_t r;

		r = recvfrom(rs->fd, dg->udp_buf, dg->udp_cap,
			     MSG_DONTWAIT | MSG_TRUNC, (struct sockaddr *)&ss, &sl);
		if (r < 0) {
			/* a connected socket's ICMP "port unreachable" */
			if (errno == ECONNREFUSED && dg->connected)
				rs->err = ECONNREFUSED;
			if (errno == EINTR || errno == ECONNREFUSED)
				continue;
			return;
		}
		if ((size_t)r < sizeof(h) || (size_t)r > dg->udp_cap ||
		    !dg_addr_from(&from, (struct sockaddr *)&ss)) {
			dg->udp_drops++;
			continue;
		}
		memcpy(&h, dg->udp_buf, sizeof(h));
		if (be32toh(h.magic) != RS_DG_MAGIC || h.version != RS_DG_VERSION ||
		    h.op < RS_DG_OP_DATA || h.op > RS_DG_OP_HELLO ||
		    (dg->connected && !dg_addr_eq(&from, &dg->peer))) {
			dg->udp_drops++;
			continue;
		}
		if (h.op == RS_DG_OP_REPLY) {
			/* only from an address asked, with its nonce */
			d = dg_find(dg, &from);
			if (d && be32toh(h.nonce) == d->nonce)
				dg_learn(rs, &from, be32toh(h.qpn));
			else
				dg->udp_drops++;
			continue;
		}
		dg_learn(rs, &from, be32toh(h.qpn));
		dg_udp_send(rs, &from, RS_DG_OP_REPLY, be32toh(h.nonce), NULL, 0,
			    true);
		if (h.op == RS_DG_OP_HELLO)
			continue;
		if (dg->udq_tail - dg->udq_head == RS_DG_UDQ || rs->rd_shut) {
			dg->overflow++;
			continue;
		}
		struct rs_dg_udp_msg *q = &dg->udq[dg->udq_tail % RS_DG_UDQ];

		q->len = (size_t)r - sizeof(h);
		q->buf = malloc(q->len ? q->len : 1);
		if (!q->buf) {
			dg->overflow++;
			continue;
		}
		memcpy(q->buf, dg->udp_buf + sizeof(h), q->len);
		q->from = from;
		dg->udq_tail++;
	}
}
