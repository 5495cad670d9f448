// SPDX-License-Identifier: MIT
/*
 * CRC32c.  Three implementations, the fastest the CPU has chosen once:
 *
 *  - AVX-512 with VPCLMULQDQ: carry-less multiplication folds the data
 *    256 bytes per round into four 512-bit accumulators (16 independent
 *    128-bit lanes); the crc32 instruction finishes the folded 16 bytes
 *    and the tail (under 256 bytes).
 *  - SSE4.2: the crc32 instruction on three interleaved streams (its
 *    latency is three cycles, its throughput one per cycle), the three
 *    partial CRCs joined with precomputed "shift by n zero bytes" operators.
 *  - otherwise a byte table.
 *
 * Both fast paths rest on the same algebra.  With reflected bit order and
 * no final inversion, update(0, M) = M(x) x^32 mod P: linear in M, and it
 * only depends on M(x) mod P.  update(r, M) is update(0, M) with r xored
 * into M's first four bytes.
 *
 * Joining (SSE4.2): for blocks A, B, C of which B and C are BLOCK bytes,
 *   update(r, A B C) = Z(2 BLOCK) update(r, A)  ^  Z(BLOCK) update(0, B)
 *                      ^ update(0, C)
 * where Z(n) x = update(x, n zero bytes) is linear in x: a 32x32 bit
 * matrix, applied as four byte-indexed tables.
 *
 * Folding (VPCLMULQDQ): a 16-byte lane X = H x^64 + L (H its first eight
 * bytes) followed by S more bytes contributes X x^(8S) to M(x), and
 *   X x^(8S) == H (x^(64+8S) mod P) + L (x^(8S) mod P)   (mod P),
 * a polynomial of degree below 96: it can be xored into the lane S bytes
 * further on instead.  In reflected order a carry-less product of two
 * 64-bit operands comes out multiplied by x, so the constants are
 * x^(64+8S-1) mod P and x^(8S-1) mod P, computed at start-up.
 */
#include "transport/tcp/crc32c.h"

#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define BLOCK 1024 /* bytes per stream per round (SSE4.2) */
#define POLY 0x1edc6f41u /* P(x) - x^32, normal bit order */

static uint32_t table[256];

static uint32_t crc32c_sw(uint32_t crc, const uint8_t *p, size_t len)
{
	while (len--)
		crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return crc;
}

#if defined(__x86_64__)
static uint32_t zeros[2][4][256]; /* Z(BLOCK), Z(2 BLOCK) by byte */
/* Folding constants for S = 256, 64 and 16 bytes: x^(64+8S-1) mod P for
 * a lane's first eight bytes, x^(8S-1) mod P for its last eight, each
 * reflected into 64 bits. */
static uint64_t fold_k[3][2];
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
/* Fold a (lanes X) forward by the distance of k, onto next. */
__attribute__((target("avx512f,vpclmulqdq"))) static inline __m512i
fold512(__m512i a, __m512i k, __m512i next)
{
	return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00),
					 _mm512_clmulepi64_epi128(a, k, 0x11),
					 next, 0x96);
}

__attribute__((target("pclmul"))) static inline __m128i
fold128(__m128i a, __m128i k, __m128i next)
{
	return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00),
					   _mm_clmulepi64_si128(a, k, 0x11)),
			     next);
}

__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2"))) static uint32_t
crc32c_fold(uint32_t crc, const uint8_t *p, size_t len)
{
	__m512i a0, a1, a2, a3, k;
	__m128i x, k16;

	if (len < 256)
		return crc32c_hw1(crc, p, len);
	a0 = _mm512_loadu_si512(p);
	a1 = _mm512_loadu_si512(p + 64);
	a2 = _mm512_loadu_si512(p + 128);
	a3 = _mm512_loadu_si512(p + 192);
	a0 = _mm512_mask_xor_epi32(a0, 1, a0, _mm512_set1_epi32((int)crc));
	k = _mm512_broadcast_i32x4(_mm_loadu_si128((const void *)fold_k[0]));
	for (p += 256, len -= 256; len >= 256; p += 256, len -= 256) {
		a0 = fold512(a0, k, _mm512_loadu_si512(p));
		a1 = fold512(a1, k, _mm512_loadu_si512(p + 64));
		a2 = fold512(a2, k, _mm512_loadu_si512(p + 128));
		a3 = fold512(a3, k, _mm512_loadu_si512(p + 192));
	}
	k = _mm512_broadcast_i32x4(_mm_loadu_si128((const void *)fold_k[1]));
	a1 = fold512(a0, k, a1);
	a2 = fold512(a1, k, a2);
	a3 = fold512(a2, k, a3);
	k16 = _mm_loadu_si128((const void *)fold_k[2]);
	x = _mm512_extracti32x4_epi32(a3, 0);
	x = fold128(x, k16, _mm512_extracti32x4_epi32(a3, 1));
	x = fold128(x, k16, _mm512_extracti32x4_epi32(a3, 2));
	x = fold128(x, k16, _mm512_extracti32x4_epi32(a3, 3));
	crc = (uint32_t)_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x));
	crc = (uint32_t)_mm_crc32_u64(crc, (uint64_t)_mm_extract_epi64(x, 1));
	return crc32c_hw1(crc, p, len);
}

/* x^n mod P, reflected into 64 bits (x^i at bit 63 - i). */
static uint64_t xpow_reflected(unsigned n)
{
	uint64_t r = 1, out = 0;

	while (n--)
		r = r & 0x80000000u ? (r << 1 ^ POLY) & 0xffffffffu : r << 1;
	for (int i = 0; i < 32; i++)
		if (r >> i & 1)
			out |= 1ull << (63 - i);
	return out;
}
#endif

static const struct urdma_crc32c_impl impls[] = {
#if defined(__x86_64__)
	{ "avx512-vpclmulqdq", crc32c_fold },
	{ "sse4.2", crc32c_hw },
#endif
	{ "table", crc32c_sw },
};
static int first; /* impls[first ..] run here, the first in use */

__attribute__((constructor)) static void crc32c_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		table[i] = c;
	}
	first = (int)(sizeof(impls) / sizeof(impls[0])) - 1;
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("sse4.2")) {
		static const uint8_t zero[2 * BLOCK];
		static const unsigned dist[3] = { 256, 64, 16 };
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
		for (int i = 0; i < 3; i++) {
			fold_k[i][0] = xpow_reflected(64 + 8 * dist[i] - 1);
			fold_k[i][1] = xpow_reflected(8 * dist[i] - 1);
		}
		first = 1;
		if (__builtin_cpu_supports("avx512f") &&
		    __builtin_cpu_supports("vpclmulqdq") &&
		    __builtin_cpu_supports("pclmul"))
			first = 0;
	}
#endif
}

uint32_t urdma_crc32c_update(uint32_t crc, const void *buf, size_t len)
{
	return impls[first].update(crc, buf, len);
}

int urdma_crc32c_impls(const struct urdma_crc32c_impl **list)
{
	*list = impls + first;
	return (int)(sizeof(impls) / sizeof(impls[0])) - first;
}
