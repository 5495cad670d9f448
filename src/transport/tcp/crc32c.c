// SPDX-License-Identifier: MIT
/*
 * CRC32c.  With SSE4.2, the crc32 instruction on three interleaved streams
 * (its latency is three cycles, its throughput one per cycle), the three
 * partial CRCs joined with precomputed "shift by n zero bytes" operators;
 * otherwise a byte table.
 *
 * Joining: the CRC register is affine in the data, so for blocks A, B, C
 * of which B and C are BLOCK bytes long,
 *   update(r, A B C) = Z(2 BLOCK) update(r, A)  ^  Z(BLOCK) update(0, B)
 *                      ^ update(0, C)
 * where Z(n) x = update(x, n zero bytes) is linear in x: a 32x32 bit
 * matrix, applied as four byte-indexed tables.
 */
#include "transport/tcp/crc32c.h"

#include <string.h>

#define BLOCK 1024 /* bytes per stream per round */

static uint32_t table[256];

static uint32_t crc32c_sw(uint32_t crc, const uint8_t *p, size_t len)
{
	while (len--)
		crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return crc;
}

#if defined(__x86_64__)
static uint32_t zeros[2][4][256]; /* Z(BLOCK), Z(2 BLOCK) by byte */
static int hw;

__attribute__((target("sse4.2"))) static uint32_t
crc32c_hw1(uint32_t crc, const uint8_t *p, size_t len)
{
	uint64_t c = crc;

	while (len && ((uintptr_t)p & 7)) {
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
		len--;
	}
	for (; len >= 8; p += 8, len -= 8) {
		uint64_t v;

		memcpy(&v, p, 8);
		c = __builtin_ia32_crc32di(c, v);
	}
	while (len--)
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
	return (uint32_t)c;
}

static uint32_t shift(int k, uint32_t x)
{
	return zeros[k][0][x & 0xff] ^ zeros[k][1][x >> 8 & 0xff] ^
	       zeros[k][2][x >> 16 & 0xff] ^ zeros[k][3][x >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t
crc32c_hw(uint32_t crc, const uint8_t *p, size_t len)
{
	while (len >= 3 * BLOCK) {
		uint64_t c0 = crc, c1 = 0, c2 = 0;

		for (size_t i = 0; i < BLOCK; i += 8) {
			uint64_t v0, v1, v2;

			memcpy(&v0, p + i, 8);
			memcpy(&v1, p + BLOCK + i, 8);
			memcpy(&v2, p + 2 * BLOCK + i, 8);
			c0 = __builtin_ia32_crc32di(c0, v0);
			c1 = __builtin_ia32_crc32di(c1, v1);
			c2 = __builtin_ia32_crc32di(c2, v2);
		}
		crc = shift(1, (uint32_t)c0) ^ shift(0, (uint32_t)c1) ^
		      (uint32_t)c2;
		p += 3 * BLOCK;
		len -= 3 * BLOCK;
	}
	return crc32c_hw1(crc, p, len);
}
#endif

__attribute__((constructor)) static void crc32c_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		table[i] = c;
	}
#if defined(__x86_64__)
	hw = __builtin_cpu_supports("sse4.2");
	if (hw) {
		static const uint8_t zero[2 * BLOCK];
		uint32_t col[2][32];

		for (int k = 0; k < 2; k++)
			for (int b = 0; b < 32; b++)
				col[k][b] = crc32c_hw1(1u << b, zero,
						       (k + 1) * BLOCK);
		for (int k = 0; k < 2; k++)
			for (int byte = 0; byte < 4; byte++)
				for (uint32_t v = 0; v < 256; v++) {
					uint32_t x = 0;

					for (int b = 0; b < 8; b++)
						if (v >> b & 1)
							x ^= col[k][byte * 8 + b];
					zeros[k][byte][v] = x;
				}
	}
#endif
}

uint32_t urdma_crc32c_update(uint32_t crc, const void *buf, size_t len)
{
#if defined(__x86_64__)
	if (hw)
		return crc32c_hw(crc, buf, len);
#endif
	return crc32c_sw(crc, buf, len);
}
