/* SPDX-License-Identifier: MIT */
/*
 * Building UD datagrams by hand (RoCEv2's framing over UDP,
 * docs/wire-protocol.md), for the tests that send them from a plain
 * socket (conformance/ud.c, fuzz/fuzz_ud.c).  Constants come from
 * src/transport/udp/roce.h; the CRC32c is the tests' own bitwise one.
 */
#ifndef URDMA_TEST_ROCE_FRAMES_H
#define URDMA_TEST_ROCE_FRAMES_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "iwarp_frames.h"
#include "transport/udp/roce.h"

/* Point a datagram of n bytes (its headers there) at qpn with qkey, and
 * make its trailer right (good_crc) or wrong. */
static inline void rf_fix(uint8_t *b, size_t n, uint32_t qpn, uint32_t qkey, bool good_crc)
{
	uint32_t v;

	if (n < ROCE_BTH + ROCE_DETH + ROCE_ICRC)
		return;
	v = htobe32(qpn);
	memcpy(b + 4, &v, 4);
	v = htobe32(qkey);
	memcpy(b + 12, &v, 4);
	v = htobe32(iwf_crc32c(b, n - ROCE_ICRC) ^ !good_crc);
	memcpy(b + n - ROCE_ICRC, &v, 4);
}

/* A UD Send of len bytes of data from QP src_qp to qpn: its length. */
static inline size_t rf_ud_send(uint8_t *b, uint32_t qpn, uint32_t qkey, uint32_t src_qp,
				const void *data, uint32_t len, bool good_crc)
{
	uint32_t v, pad = (4 - (len & 3)) & 3;
	size_t n = ROCE_BTH + ROCE_DETH;

	memset(b, 0, n + len + pad + ROCE_ICRC);
	b[0] = ROCE_UD_SEND_ONLY;
	b[1] = (uint8_t)(pad << 4);
	b[2] = b[3] = 0xff;
	v = htobe32(src_qp);
	memcpy(b + 16, &v, 4);
	memcpy(b + n, data, len);
	n += len + pad + ROCE_ICRC;
	rf_fix(b, n, qpn, qkey, good_crc);
	return n;
}

/* A UDP socket bound to 127.0.0.1 (*port: its port): datagrams from it
 * may name QPs port << 8 | i as their source, as urdma's own do. */
static inline int rf_socket(uint16_t *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	int fd = socket(AF_INET, SOCK_DGRAM, 0);

	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    getsockname(fd, (struct sockaddr *)&a, &l)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	*port = ntohs(a.sin_port);
	return fd;
}

#endif
