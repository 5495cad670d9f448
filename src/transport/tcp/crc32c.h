/* SPDX-License-Identifier: MIT */
/* CRC32c (Castagnoli), as MPA (RFC 5044) and iSCSI use it. */
#ifndef URDMA_CRC32C_H
#define URDMA_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Start with crc = ~0u, feed pieces, finish with ~crc. */
uint32_t urdma_crc32c_update(uint32_t crc, const void *buf, size_t len);

/* The implementations this CPU can run, the one in use first (tests). */
struct urdma_crc32c_impl {
	const char *name;
	uint32_t (*update)(uint32_t crc, const uint8_t *p, size_t len);
};
int urdma_crc32c_impls(const struct urdma_crc32c_impl **list);

static inline uint32_t urdma_crc32c(const void *buf, size_t len)
{
	return ~urdma_crc32c_update(~0u, buf, len);
}

#endif
