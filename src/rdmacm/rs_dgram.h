/* SPDX-License-Identifier: MIT */
/*
 * What the datagram rsocket files share (rs_dgram.c has the overview):
 * the wire headers, struct rs_dgram, and rs_dg_resolve.c's calls.
 */
#ifndef URDMA_RS_DGRAM_H
#define URDMA_RS_DGRAM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "rdmacm/rsocket_priv.h"

#define RS_DG_MAGIC	0x75726467u	/* "urdg" */
#define RS_DG_VERSION	1
#define RS_DG_QKEY	0x0b5d6467u	/* not a controlled Q_Key */
#define RS_DG_GRH	40
#define RS_DG_MAX_DEST	4096
#define RS_DG_BUCKETS	256
#define RS_DG_UDQ	64		/* datagrams from the UDP socket, held */
#define RS_DG_UDP_CHECK_NS 100000ull
#define RS_DG_REFRESH_NS   5000000000ull	/* silent this long: HELLO */
#define RS_DG_HELLO_GAP_NS 1000000000ull	/* HELLOs to one address */
#define RS_DG_HELLO_MAX	3		/* unanswered: back to UDP */
#define RS_DG_ASK_GAP_NS 10000000ull	/* HELLOs for unknown sources */

enum rs_dg_op {
	RS_DG_OP_DATA = 1,	/* payload follows; the sender's QPN */
	RS_DG_OP_REPLY = 2,	/* the answer: the replier's QPN */
	RS_DG_OP_HELLO = 3,	/* a question only: the sender's QPN */
};

/* In front of every datagram on the UDP socket; big-endian. */
struct rs_dg_udp_hdr {
	uint32_t magic;		/* RS_DG_MAGIC */
	uint8_t version;	/* RS_DG_VERSION */
	uint8_t op;		/* enum rs_dg_op */
	uint16_t reserved;	/* 0 */
	uint32_t qpn;		/* the sender's UD QP (0: none yet) */
	uint32_t nonce;		/* DATA, HELLO: the asker's; REPLY: echoed */
} __attribute__((packed));
_Static_assert(sizeof(struct rs_dg_udp_hdr) == 16, "UDP header is 16 bytes");

/* In front of every UD payload; ports in network order. */
struct rs_dg_hdr {
	uint8_t version;	/* RS_DG_VERSION */
	uint8_t reserved;	/* 0 */
	uint16_t sport;		/* the sender's UDP port */
	uint16_t dport;		/* the receiver's UDP port */
	uint16_t reserved2;	/* 0 */
} __attribute__((packed));
_Static_assert(sizeof(struct rs_dg_hdr) == 8, "UD header is 8 bytes");

/* An address: IPv6 form (IPv4 mapped) and port, network order. */
struct rs_dg_addr {
	uint8_t ip[16];
	uint16_t port;
};

struct rs_dest {
	struct rs_dg_addr a;
	uint32_t qpn;		/* 0: not known, datagrams go over UDP */
	uint32_t nonce;		/* what a REPLY from it must echo */
	struct ibv_ah *ah;
	uint64_t heard_ns;	/* the last word from it, verified */
	uint64_t hello_ns;	/* the last HELLO we sent it */
	int unanswered;		/* HELLOs since its last REPLY */
	int next;		/* in its bucket, -1: last */
};

/* A datagram that came over UD, checked: its data and its source. */
struct rs_dg_rx {
	uint32_t slot, len;	/* len: of the data, after the headers */
	struct rs_dg_addr from;
};

struct rs_dg_udp_msg {
	uint8_t *buf;
	size_t len;
	struct rs_dg_addr from;
};

struct rs_dgram {
	struct ibv_context **devs;
	int ep_err;		/* the endpoint could not be made: why */
	uint32_t mtu;		/* UD payload limit, header included */
	uint16_t port;		/* ours, network order, 0: not bound yet */
	bool connected;
	struct rs_dg_addr peer;

	struct rs_dest *dest;
	int ndest, cap, evict;
	uint32_t seed;		/* of the hash: sources can't aim at a bucket */
	int bucket[RS_DG_BUCKETS];
	uint64_t ask_ns;	/* the last HELLO for an unknown source */

	struct rs_dg_rx *rx;	/* rx_cap: checked datagrams, not read */
	uint32_t rx_cap;
	uint64_t rx_head, rx_tail;
	struct rs_dg_udp_msg udq[RS_DG_UDQ];
	uint64_t udq_head, udq_tail;
	uint64_t sq_head;	/* send WRs posted: the next slot */
	uint64_t udp_next_ns;
	uint8_t *udp_buf;	/* one UDP datagram in */
	size_t udp_cap;

	uint64_t drops, unverified, udp_drops, overflow;
};

/* rs_dg_resolve.c: addresses, destinations, the UDP socket.  Lock held. */
bool dg_addr_from(struct rs_dg_addr *a, const struct sockaddr *sa);
bool dg_addr_to(const struct rsocket *rs, const struct rs_dg_addr *a,
		struct sockaddr_storage *ss, socklen_t *len);
bool dg_addr_eq(const struct rs_dg_addr *x, const struct rs_dg_addr *y);
uint32_t dg_random(void);
struct rs_dest *dg_find(struct rs_dgram *dg, const struct rs_dg_addr *a);
struct rs_dest *dg_dest(struct rs_dgram *dg, const struct rs_dg_addr *a);
void dg_learn(struct rsocket *rs, const struct rs_dg_addr *a, uint32_t qpn);
void dg_forget(struct rs_dest *d);
int dg_udp_send(struct rsocket *rs, const struct rs_dg_addr *to, uint8_t op,
		uint32_t nonce, struct rs_iter *it, size_t len, bool nonblock);
void dg_hello(struct rsocket *rs, struct rs_dest *d, uint64_t now);
void dg_udp_input(struct rsocket *rs);

#endif
